"""mlx_spec.server on a target sharded over two processes (mlx.launch, ring
backend, localhost): rank 0 serves HTTP, rank 1 follows its batch steps and
each request it serves alone.

Concurrent greedy requests of several methods must equal unsharded plain
mlx-lm, tensor-parallel and in pipeline stages; a request the batch cannot
take (a tree, a head) runs alone on every rank and the group goes on; every
rank sends the same tokens (sampled too); an error in a rank ends the whole
group.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import generate_step
from serving import open_stream, post
from test_server import _free_port
from test_sharded import _launch, _launcher, open_stdin

from mlx_spec.drafters.heads import random_head, save_head
from mlx_spec.fingerprint import model_fingerprint

LAUNCH = Path(sys.executable).with_name("mlx.launch")
SERVER = Path(sys.executable).with_name("mlx_spec.server")
PROMPTS = ("def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n")
METHODS = ("draft", "lookup", "none")
MAX_TOKENS = 16
# The server's DEBUG line for each request it finished, on every rank.
SENT = re.compile(r"rank (\d+) sent \d+ tokens: (\[[\d, ]*\])")
TIMEOUT = 400
# What mlx.launch says of a rank that exits with an error or is killed.
FAILED_RANK = re.compile(
    r"Node with rank (\d+) (?:was killed|exited with code -?[1-9])"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (LAUNCH.exists() and SERVER.exists()),
        reason="mlx.launch or the mlx_spec.server script is not installed",
    ),
]


class _Group:
    """Two ranks of ``mlx_spec.server``; killed as a group when done."""

    def __init__(self, tmp_path, stdin, *args):
        self.port = _free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        argv = _launcher("ring") + [str(SERVER), *args]
        argv += ["--port", str(self.port), "--max-tokens", str(MAX_TOKENS)]
        self.log = open(tmp_path / "group.log", "w+")
        self.proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def sent_tokens(self, count: int) -> list:
        """Each rank's ``[tokens of each request]``, in the order sent, once
        rank 0 has logged ``count`` requests and rank 1 as many (DEBUG)."""
        deadline = time.monotonic() + 60
        while True:
            self.log.flush()
            self.log.seek(0)
            ranks = [[], []]
            for rank, tokens in SENT.findall(self.log.read()):
                ranks[int(rank)].append(tokens)
            if len(ranks[0]) >= count and len(ranks[1]) == len(ranks[0]):
                return ranks
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks logged {ranks}:\n{self.output()}")
            time.sleep(0.5)

    def wait_ready(self):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the group exited early:\n{self.output()}")
            try:
                url = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"the group did not start in {TIMEOUT} s:\n{self.output()}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def _serving(pair_flags, log_dir, log_level="CRITICAL"):
    with open_stdin() as stdin:
        group = _Group(log_dir, stdin, *pair_flags, "--log-level", log_level)
        yield group
        group.kill()


@pytest.fixture
def group(pair_flags, tmp_path):
    """A group of its own, for a test that ends it."""
    yield from _serving(pair_flags, tmp_path)


@pytest.fixture(scope="module")
def shared_group(pair_flags, tmp_path_factory):
    """One group for the tests that only send it requests (its start-up, two
    ranks importing mlx-lm, is most of a test's time); it serves them in turn.
    An idle group keeps a core busy (mlx.launch polls), so they come last.
    Every rank logs each request's tokens (DEBUG)."""
    yield from _serving(pair_flags, tmp_path_factory.mktemp("group"), "DEBUG")


@pytest.fixture(scope="module")
def head_group(checkpoints, load_model, tmp_path_factory):
    """Two tensor-parallel ranks of llama drafting with a random EAGLE head
    (a head drafts for one request at a time: every request runs alone)."""
    model, _ = load_model("llama")
    head = tmp_path_factory.mktemp("head") / "eagle"
    module = random_head("eagle", model, seed=1).module
    save_head(head, "eagle", module, target_fingerprint=model_fingerprint(model))
    flags = ["--model", str(checkpoints["llama"]), "--draft-model", str(head)]
    yield from _serving(flags, tmp_path_factory.mktemp("heads"))


@pytest.fixture(scope="module")
def pipeline_group(checkpoints, tmp_path_factory):
    """Two pipeline stages of qwen2 (mlx-lm has none for llama) drafting with
    its near draft, shared as ``shared_group`` is."""
    flags = ["--model", str(checkpoints["qwen2"]), "--pipeline"]
    flags += ["--draft-model", str(checkpoints["qwen2-near"])]
    yield from _serving(flags, tmp_path_factory.mktemp("pipeline"))


def _together(group, bodies) -> list:
    """``(status, answer)`` of each of ``bodies``, posted at once."""
    results = [None] * len(bodies)

    def ask(i):
        results[i] = post(group, bodies[i], timeout=TIMEOUT)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
    return results


def test_a_rank_that_dies_ends_the_whole_group(group):
    group.wait_ready()
    ranks = subprocess.run(
        ["pgrep", "-s", str(group.proc.pid), "-f", str(SERVER)],
        capture_output=True,
        text=True,
    ).stdout.split()
    ranks = [int(pid) for pid in ranks if int(pid) != group.proc.pid]  # not mlx.launch
    assert len(ranks) == 2, group.output()
    os.kill(max(ranks), signal.SIGKILL)  # the later-started rank
    try:
        group.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the group went on with a rank gone:\n{group.output()}")
    deadline = time.monotonic() + 30
    while _alive(min(ranks)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(min(ranks)), "rank 0 outlived its group"
    # mlx.launch exits 0 whatever its ranks do, but names each that failed.
    failed = set(FAILED_RANK.findall(group.output()))
    assert failed == {"0", "1"}, group.output()


def test_a_sharded_server_refuses_models_named_by_requests_once(pair_flags, tmp_path):
    # Each rank would load a request's model from its own disk: one without
    # it would fail while the others wait in the sharded load.
    command = [str(SERVER), *pair_flags, "--allow-request-models", str(tmp_path)]
    _, out = _launch(command + ["--port", str(_free_port())], timeout=120)
    errors = [line for line in out.splitlines() if "error:" in line]
    assert errors == [
        "mlx_spec.server: error: a sharded server serves the models it was "
        "started with (a model missing on one machine would stall the group); "
        "drop --allow-request-models, or start another group for another model."
    ], out


def _plain_text(load_model, name, prompt) -> str:
    model, tokenizer = load_model(name)
    ids = tokenizer.encode(prompt)
    return mlx_lm.generate(model, tokenizer, ids, max_tokens=MAX_TOKENS)


def test_concurrent_sharded_requests_equal_plain_mlx_lm(shared_group, load_model):
    group = shared_group
    references = {p: _plain_text(load_model, "llama", p) for p in PROMPTS}
    group.wait_ready()
    # Requests the batch cannot take run alone on every rank, with the
    # adaptive control on rank 0's round costs (else the ranks drafted
    # different lengths and the group stalled).
    for prompt, method in [(PROMPTS[0], "tree"), (PROMPTS[2], "self")]:
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "speculative": method}
        status, answer = post(group, body, timeout=TIMEOUT)
        assert status == 200, (answer, group.output())
        assert answer["choices"][0]["text"] == references[prompt], method
        stats = answer["speculative_stats"]
        assert stats["method"] == method and stats["batched"] is False, stats
    # Requests that arrive while another decodes join its batch on every rank.
    long = {"prompt": PROMPTS[1], "max_tokens": 4000, "speculative": "draft"}
    staying = open_stream(group, long)
    bodies = [
        {"prompt": p, "max_tokens": MAX_TOKENS, "speculative": m}
        for p, m in zip(PROMPTS, METHODS)
    ]
    try:
        for _ in range(2):  # the second wave reuses the prompt cache on both ranks
            for prompt, (status, body) in zip(PROMPTS, _together(group, bodies)):
                assert status == 200, (body, group.output())
                assert body["choices"][0]["text"] == references[prompt]
                assert body["speculative_stats"]["batched"] is True
    finally:
        staying.close()
    status, body = post(
        group, {"prompt": PROMPTS[1], "max_tokens": MAX_TOKENS}, timeout=TIMEOUT
    )
    assert status == 200 and body["choices"][0]["text"] == references[PROMPTS[1]]
    assert group.proc.poll() is None


def test_sampled_sharded_rows_keep_the_ranks_in_step(shared_group, load_model):
    """Every rank sends the same tokens for sampled rows of several methods
    (each rank samples its own, from a shared seed), and the greedy answers
    after them are still plain mlx-lm's."""
    group = shared_group
    group.wait_ready()
    logged = len(group.sent_tokens(0)[0])  # by the tests before
    results = []
    for temperature in (1.0, 0.0):
        bodies = [
            {"prompt": p, "max_tokens": MAX_TOKENS, "speculative": m}
            | {"temperature": temperature}
            for p, m in zip(PROMPTS, METHODS)
        ]
        answers = _together(group, bodies)
        results += [(p, temperature, a) for p, a in zip(PROMPTS, answers)]
    assert [status for _, _, (status, _) in results] == [200] * 6, group.output()
    for prompt, temperature, (_, body) in results:
        if temperature == 0.0:
            assert body["choices"][0]["text"] == _plain_text(
                load_model, "llama", prompt
            )
    first, second = group.sent_tokens(logged + len(results))
    assert first == second
    # The lines are the answers' tokens: the last three, the greedy wave's.
    model, tokenizer = load_model("llama")
    plain = [_plain_ids(model, tokenizer, p) for p in PROMPTS]
    assert sorted(json.loads(tokens) for tokens in first[-3:]) == sorted(plain)


def _plain_ids(model, tokenizer, prompt, **kv) -> list:
    """Plain mlx-lm's greedy tokens, to its first end-of-sequence token
    (``kv``: its KV-cache quantisation)."""
    steps = generate_step(mx.array(tokenizer.encode(prompt)), model, **kv)
    ids = []
    for token, _ in steps:
        ids.append(int(token))
        if len(ids) == MAX_TOKENS or ids[-1] in tokenizer.eos_token_ids:
            return ids


def test_a_sharded_server_with_a_head_serves_its_methods(head_group, load_model):
    """A head drafts for one request at a time: requests that come together
    run one after another, alone on every rank, each plain mlx-lm's greedy text."""
    group = head_group
    group.wait_ready()
    bodies = [
        {"prompt": p, "max_tokens": MAX_TOKENS, "speculative": m}
        for p, m in zip(PROMPTS, ("eagle", "eagle-chain", "none"))
    ]
    for prompt, body, (status, answer) in zip(
        PROMPTS, bodies, _together(group, bodies)
    ):
        assert status == 200, (answer, group.output())
        assert answer["choices"][0]["text"] == _plain_text(load_model, "llama", prompt)
        stats = answer["speculative_stats"]
        assert stats["method"] == body["speculative"] and stats["batched"] is False
    assert group.proc.poll() is None


def _answers_as_plain_and_stays_up(group, model, tokenizer):
    """A request alone still gets plain mlx-lm's answer: the ranks are in step."""
    body = {"prompt": PROMPTS[1], "max_tokens": MAX_TOKENS}
    status, answer = post(group, body, timeout=TIMEOUT)
    plain = mlx_lm.generate(
        model, tokenizer, tokenizer.encode(PROMPTS[1]), max_tokens=MAX_TOKENS
    )
    assert status == 200 and answer["choices"][0]["text"] == plain
    assert group.proc.poll() is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_pipeline_server_speculates_and_equals_plain_mlx_lm(
    pipeline_group, load_model
):
    # A request to an idle server runs alone, on every stage in lockstep, as
    # mlx_spec.generate --pipeline runs it; so does one the batch cannot take.
    group = pipeline_group
    model, tokenizer = load_model("qwen2")
    group.wait_ready()
    # A sampled request first: the stages must draw alike to stay in step.
    for prompt, method, temperature in [
        (PROMPTS[0], "draft", 1.0),
        (PROMPTS[0], "draft", 0.0),
        (PROMPTS[1], "lookup", 0.0),
        (PROMPTS[2], "tree", 0.0),
    ]:
        # Drafts of a fixed length: the adaptive control may find that a
        # draft as large as the target does not pay here.
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "adaptive": False}
        body.update(speculative=method, temperature=temperature)
        status, answer = post(group, body, timeout=TIMEOUT)
        assert status == 200, (answer, group.output())
        if temperature > 0:
            continue
        ids = tokenizer.encode(prompt)
        plain = mlx_lm.generate(model, tokenizer, ids, max_tokens=MAX_TOKENS)
        assert answer["choices"][0]["text"] == plain, method
        stats = answer["speculative_stats"]
        assert stats["method"] == method
        if method != "lookup":  # lookup drafts from the index in the batch
            assert stats["batched"] is False, stats
            assert stats["tokens_per_target_forward"] > 1, stats
    # A client that hangs up mid-answer: every stage stops it, and the next
    # answer is still plain mlx-lm's.
    body = {"prompt": PROMPTS[2], "max_tokens": 4000, "speculative": "draft"}
    open_stream(group, body).close()
    _answers_as_plain_and_stays_up(group, model, tokenizer)


def test_concurrent_pipeline_requests_are_batched_and_equal_plain_mlx_lm(
    pipeline_group, load_model
):
    """Requests that arrive while others decode join their batch on every
    stage: a sampled wave, a client that hangs up mid-batch, then a greedy
    wave whose answers are still plain mlx-lm's (the stages stayed in step)."""
    group = pipeline_group
    model, tokenizer = load_model("qwen2")
    group.wait_ready()

    def bodies(temperature):
        # Fixed draft lengths, as above: the batch drafts every round.
        return [
            {"prompt": p, "max_tokens": MAX_TOKENS, "speculative": m}
            | {"temperature": temperature, "adaptive": False}
            for p, m in zip(PROMPTS, METHODS)
        ]

    long = {"max_tokens": 4000, "speculative": "draft"}
    leaving = open_stream(group, {"prompt": PROMPTS[2], **long})
    staying = open_stream(group, {"prompt": PROMPTS[0], **long})  # batched with it
    try:
        sampled = _together(group, bodies(1.0))
        assert [status for status, _ in sampled] == [200] * 3, group.output()
        assert all(a["speculative_stats"]["batched"] is True for _, a in sampled)
        leaving.close()  # the batch goes on with `staying` and the greedy wave
        greedy = _together(group, bodies(0.0))
    finally:
        leaving.close()
        staying.close()
    for prompt, method, (status, answer) in zip(PROMPTS, METHODS, greedy):
        assert status == 200, (answer, group.output())
        ids = tokenizer.encode(prompt)
        plain = mlx_lm.generate(model, tokenizer, ids, max_tokens=MAX_TOKENS)
        assert answer["choices"][0]["text"] == plain, method
        stats = answer["speculative_stats"]
        assert stats["batched"] is True and stats["mean_batch_size"] > 1, stats
        if method == "draft":
            assert stats["tokens_per_target_forward"] > 1, stats
    _answers_as_plain_and_stays_up(group, model, tokenizer)


# Flags under which every request runs alone, and the KV-cache quantisation of
# the plain mlx-lm decoding each greedy answer must equal.
ALONE = {
    "--no-batching": (["--no-batching"], {}),
    "--kv-bits": (
        ["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "0"],
        dict(kv_bits=4, kv_group_size=32, quantized_kv_start=0),
    ),
}


@pytest.fixture(scope="module")
def wide_pair(checkpoints, tmp_path_factory):
    """A llama whose heads quantise in groups of 32 (the test llama's are 16
    wide), with the test tokenizer, and its near draft."""
    from mlx_spec.testing import make_checkpoint

    root = tmp_path_factory.mktemp("wide")
    tokenizer = checkpoints["llama"]
    target = make_checkpoint(
        root / "llama", "llama", hidden_size=128, seed=5, tokenizer=tokenizer
    )
    draft = make_checkpoint(root / "near", "llama", base=target, noise=0.05)
    return target, draft


@pytest.fixture
def alone_group(option, wide_pair, tmp_path):
    target, draft = wide_pair
    flags = ["--model", str(target), "--draft-model", str(draft), *ALONE[option][0]]
    yield from _serving(flags, tmp_path, "DEBUG")


@pytest.mark.parametrize("option", list(ALONE))
def test_a_sharded_server_serves_alone_under_its_option_as_plain_mlx_lm(
    option, alone_group, wide_pair
):
    """Requests that come together run one after another, alone on every
    rank; each greedy answer is plain mlx-lm's with the same KV cache
    (quantised by --kv-bits, which changes the answers here), and every rank
    sends the same tokens."""
    group, kv = alone_group, ALONE[option][1]
    model, tokenizer = mlx_lm.load(str(wide_pair[0]))
    plain = [_plain_ids(model, tokenizer, p, **kv) for p in PROMPTS]
    if kv:
        assert plain != [_plain_ids(model, tokenizer, p) for p in PROMPTS]
    group.wait_ready()
    bodies = [
        {"prompt": p, "max_tokens": MAX_TOKENS, "speculative": m}
        for p, m in zip(PROMPTS, METHODS)
    ]
    for prompt, (status, answer) in zip(PROMPTS, _together(group, bodies)):
        assert status == 200, (answer, group.output())
        ids = tokenizer.encode(prompt)
        text = mlx_lm.generate(model, tokenizer, ids, max_tokens=MAX_TOKENS, **kv)
        assert answer["choices"][0]["text"] == text
        stats = answer["speculative_stats"]
        assert stats["batched"] is False and option in stats["batch_note"], stats
    first, second = group.sent_tokens(len(PROMPTS))
    assert first == second
    assert sorted(json.loads(tokens) for tokens in first) == sorted(plain)
    assert group.proc.poll() is None
