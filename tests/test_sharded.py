"""A target sharded over two processes on localhost (mlx.launch's ring backend,
and MPI through Open MPI's mpirun where it is installed).

Every rank decodes with every method on the sharded target; each rank's
greedy tokens must equal unsharded plain mlx-lm's, tensor-parallel (the MLP
alone when the heads do not divide by 2) and in pipeline stages, and a seeded
sampled run must draw what the unsharded engine draws with the same seed.

Every rank must also decide alike (draft lengths, cost model): a rank that
drafts another length runs other collectives, and the group stalls.
"""

import contextlib
import io
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from law_checks import CHI2_9_999, stream_statistics
from mlx_lm.generate import generate_step

from mlx_spec import stream_generate
from mlx_spec.costs import weight_bytes
from mlx_spec.distributed import POLL_TOKENS
from mlx_spec.drafters.heads import random_head, save_head
from mlx_spec.drafters.published.export import random_dflash
from mlx_spec.fingerprint import model_fingerprint

LAUNCH = Path(sys.executable).with_name("mlx.launch")
WORKER = Path(__file__).with_name("sharded_worker.py")
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7]
MAX_TOKENS = 24
TIMEOUT = 400

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed"),
]
# MLX's MPI backend calls Open MPI's symbols: MPICH's mpirun would not do.
BACKENDS = [
    "ring",
    pytest.param(
        "mpi",
        marks=pytest.mark.skipif(
            shutil.which("ompi_info") is None, reason="Open MPI is not installed"
        ),
    ),
]


def _launcher(backend: str, python: str = sys.executable) -> list:
    """The argv prefix that starts 2 ranks of ``python`` with ``backend`` (ring or mpi).

    MPI goes through Open MPI's mpirun: mlx.launch's MPI path passes it an
    option that Open MPI 4 (Debian 12's) rejects.
    """
    if backend == "ring":
        ring = [str(LAUNCH), "--backend", "ring", "-n", "2"]
        return ring + ["--starting-port", str(_ring_port()), "--python", python]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-q", "-np", "2", *root, python]


def _ring_port() -> int:
    """A port free with the next (one per rank) for a ring group: groups that
    run at once (parallel test files) would all listen on mlx.launch's default."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port


@contextlib.contextmanager
def open_stdin():
    """A pipe's read end to give mlx.launch as its stdin, kept open meanwhile.

    mlx.launch passes its stdin on to the ranks, waiting for it up to 0.1 s a
    turn; at its end (/dev/null) the wait returns at once, and the loop keeps
    a core busy that the two ranks need.
    """
    read, write = os.pipe()
    try:
        yield read
    finally:
        os.close(read)
        os.close(write)


def _launch(command, timeout=TIMEOUT, backend="ring", python=sys.executable, cwd=None):
    """Run ``command`` on 2 ranks; kill the whole group if it overruns."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with open_stdin() as stdin:
        proc = subprocess.Popen(
            _launcher(backend, python) + command,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            message = f"the sharded run did not finish in {timeout} s:\n{out[-3000:]}"
            pytest.fail(message)
    return proc.returncode, out


def _ranks(jobs: dict, out: Path) -> dict:
    """``{name: [rank 0's, rank 1's {method: results}]}`` of ``jobs`` (see
    tests/sharded_worker.py), all run in one process group."""
    (out / "jobs.json").write_text(json.dumps(jobs))
    command = [str(WORKER), "--jobs", str(out / "jobs.json")]
    command += ["--prompt", *map(str, PROMPT)]
    command += ["--max-tokens", str(MAX_TOKENS), "--out", str(out)]
    code, output = _launch(command)
    assert code == 0, output[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {name: [rank[name] for rank in ranks] for name in jobs}


def _assert_ranks_decided_alike(ranks, methods):
    """Every rank drafted the same lengths from the same cost model."""
    for method in methods:
        for key in ("drafted_per_round", "cost_model"):
            assert ranks[0][method][key] == ranks[1][method][key], (method, key)


def _plain(model) -> list:
    steps = generate_step(mx.array(PROMPT), model, max_tokens=MAX_TOKENS)
    return [int(token) for token, _ in steps]


EVERY_METHOD = [
    "none",
    "draft",
    "tree",
    "lookup",
    "self",
    "auto",
    "eagle",
    "eagle-chain",
]
# Several generations in one process group. The stages hold different layers;
# a draft step priced against each rank's own share made the ranks draft
# different lengths and stall.
PIPELINE_METHODS = ["none", "draft", "tree", "lookup", "auto", "draft", "none", "draft"]
# Without a draft: auto drafts by lookup alone on pipeline stages, and self,
# which chooses among all the target's blocks, is refused on every rank (and
# the group goes on in step).
PIPELINE_DRAFTLESS = ["auto", "self", "auto"]
# qwen3_next's recurrent layers verify trees as chains; qwen2's stages attend
# through the tree mask, and a tree of fixed size branches on this prompt.
FIXED_TREE = dict(options=dict(adaptive=False))
TREE_METHODS = ["tree", "eagle"]
SAMPLED_METHODS = ["draft", "tree", "eagle-chain"]
SAMPLED = dict(temp=1.0, seed=3)
# Long sampled streams whose every token is checked against the target's law.
LAW = dict(temp=1.0, seed=5, max_tokens=160)
# An EAGLE-3 head reads blocks 0 and 1 of qwen2, one on each stage.
EAGLE3_METHODS = ["eagle", "eagle-chain"]
EAGLE3 = dict(pipeline=True, head="eagle3")
# Loaded as the front ends load (load_pair): refused in one line when sharded.
REFUSED_LOADS = {
    "mtp": {"method": "mtp"},
    "adapters": {"method": "none", "adapter_path": "adapters"},
    "quantized-activations": {
        "method": "none",
        "model_config": {"quantize_activations": True},
    },
}


def _heads(model, out: Path) -> dict:
    """``{method: path}`` of a random Medusa head and DFlash drafter for ``model``."""
    module = random_head("medusa", model, seed=1).module
    fingerprint = model_fingerprint(model)
    save_head(out / "medusa", "medusa", module, target_fingerprint=fingerprint)
    return {"medusa": out / "medusa", "dflash": random_dflash(model, out / "dflash")}


@pytest.fixture(scope="module")
def sharded(checkpoints, load_model, tmp_path_factory):
    """The decodes of the tests below, by name, from one launch: a launch's
    start-up (imports on two ranks, the ring) is most of its time."""

    def job(target, methods, draft=True, **options):
        if draft is True:
            draft = checkpoints[f"{target}-near"]
        return dict(
            model=str(checkpoints[target]),
            draft_model=str(draft) if draft else None,
            methods=methods,
            **options,
        )

    out = tmp_path_factory.mktemp("sharded")
    heads = _heads(load_model("llama")[0], out)
    refused = {
        f"refused-{name}": job("llama", ["none"], draft=False, load=load)
        for name, load in REFUSED_LOADS.items()
    }
    mtp = dict(model=str(checkpoints["qwen3_next-mtp"]), pipeline=True)
    refused["refused-mtp"].update(mtp)
    jobs = {
        "llama": job("llama", EVERY_METHOD),
        "llama-3heads": job("llama-3heads", EVERY_METHOD),
        "llama-tree": job("llama", TREE_METHODS, **FIXED_TREE),
        "pipeline": job("qwen3_next", PIPELINE_METHODS, pipeline=True),
        "pipeline-draftless": job(
            "qwen3_next", PIPELINE_DRAFTLESS, draft=False, pipeline=True
        ),
        "pipeline-tree": job("qwen2", TREE_METHODS, pipeline=True, **FIXED_TREE),
        "sampled": job("llama", SAMPLED_METHODS, **SAMPLED),
        "pipeline-eagle3": job("qwen2", EAGLE3_METHODS, **EAGLE3),
        "pipeline-eagle3-sampled": job("qwen2", ["eagle-chain"], **EAGLE3, **SAMPLED),
        "law": job("llama", SAMPLED_METHODS, **LAW),
        "pipeline-law": job("qwen2", SAMPLED_METHODS, pipeline=True, **LAW),
        "llama-heads-medusa": job("llama", ["medusa"], draft=heads["medusa"]),
        "llama-heads-dflash": job("llama", ["dflash"], draft=heads["dflash"]),
        # auto on a checkpoint with an MTP layer, which a sharded target refuses.
        "mtp-auto": dict(mtp, methods=["auto"], load={"method": "auto"}),
        **refused,
    }
    return _ranks(jobs, out)


@pytest.mark.parametrize(
    "target, split",
    [
        ("llama", {"attention": "AllToShardedLinear", "mlp": "ShardedToAllLinear"}),
        # 3 heads, 1 key/value head: attention stays whole, the MLP is split.
        ("llama-3heads", {"attention": "Linear", "mlp": "ShardedToAllLinear"}),
    ],
)
def test_tensor_parallel_greedy_equals_plain_mlx_lm_for_every_method(
    sharded, load_model, target, split
):
    ranks = sharded[target]
    expected = _plain(load_model(target)[0])
    for results in ranks:
        assert results["split"] == split
        for method in EVERY_METHOD:
            assert results[method]["tokens"] == expected, method
    # Ranks read their shares at once: a forward costs rank 0's share.
    assert ranks[0]["target_bytes"] == ranks[1]["target_bytes"]
    assert ranks[0]["target_bytes"] == pytest.approx(ranks[0]["own_bytes"])
    assert ranks[0]["own_bytes"] < weight_bytes(load_model(target)[0])
    _assert_ranks_decided_alike(ranks, EVERY_METHOD)
    # Speculation ran: the draft took fewer target forwards than tokens.
    assert ranks[0]["draft"]["rounds"] < MAX_TOKENS


def test_tensor_parallel_greedy_equals_plain_with_a_medusa_or_dflash_drafter(
    sharded, load_model
):
    expected = _plain(load_model("llama")[0])
    for method in ("medusa", "dflash"):
        ranks = sharded[f"llama-heads-{method}"]
        assert [r[method]["tokens"] for r in ranks] == [expected, expected], method
        _assert_ranks_decided_alike(ranks, [method])


def test_sharded_auto_drafts_without_the_mtp_layer_and_mtp_is_refused(
    sharded, load_model
):
    # The MTP layer is not sharded with the target: auto leaves it, as the
    # server does, and --speculative mtp is refused on every rank.
    from mlx_spec.loading import SHARDED_MTP

    expected = _plain(load_model("qwen3_next-mtp")[0])
    for results in sharded["mtp-auto"]:
        assert results["drafter"] is None
        assert results["auto"]["tokens"] == expected
    assert sharded["refused-mtp"] == [{"error": SHARDED_MTP}] * 2


@pytest.mark.parametrize(
    "name, flag",
    [
        ("adapters", "--adapter-path"),
        ("quantized-activations", "--quantize-activations"),
    ],
)
def test_a_sharded_target_refuses_adapters_and_quantized_activations(
    sharded, name, flag
):
    said = f"{flag} is not supported on a sharded target; drop it, or run one process."
    assert sharded[f"refused-{name}"] == [{"error": said}] * 2


def test_pipeline_stages_greedy_equal_plain_mlx_lm(sharded, load_model):
    ranks = sharded["pipeline"]
    expected = _plain(load_model("qwen3_next")[0])
    for results in ranks:
        for method in PIPELINE_METHODS:
            assert results[method]["tokens"] == expected, method
    _assert_ranks_decided_alike(ranks, PIPELINE_METHODS)


def test_pipeline_stages_run_auto_without_a_draft_and_refuse_self(sharded, load_model):
    # qwen3_next's 3 blocks: rank 0 holds 2, rank 1 one. Rank 0 alone built a
    # self arm for auto, on its own blocks, and the group stalled.
    from mlx_spec.drafters.self_spec import ON_PIPELINE_STAGES

    ranks = sharded["pipeline-draftless"]
    expected = _plain(load_model("qwen3_next")[0])
    for results in ranks:
        assert results["auto"]["tokens"] == expected
        assert results["self"] == {"error": ON_PIPELINE_STAGES}
    _assert_ranks_decided_alike(ranks, ["auto"])


def _assert_trees_verified_through_their_mask(ranks, model):
    """Each rank's fixed trees gave plain greedy output. The trees have 16
    nodes, and attending causally instead changes the tree method's output
    (llama and qwen2 on PROMPT, unsharded)."""
    expected = _plain(model)
    for results in ranks:
        for method in TREE_METHODS:
            assert results[method]["tokens"] == expected, method
    _assert_ranks_decided_alike(ranks, TREE_METHODS)
    assert set(ranks[0]["tree"]["drafted_per_round"]) == {16}


def test_tensor_parallel_shards_verify_a_tree_through_its_mask(sharded, load_model):
    _assert_trees_verified_through_their_mask(
        sharded["llama-tree"], load_model("llama")[0]
    )


def test_pipeline_stages_verify_a_tree_through_its_mask_on_every_stage(
    sharded, load_model
):
    ranks = sharded["pipeline-tree"]
    # Stages run one after another: a forward reads the whole target once.
    whole = weight_bytes(load_model("qwen2")[0])
    assert [r["target_bytes"] for r in ranks] == pytest.approx([whole, whole])
    assert all(r["own_bytes"] < whole for r in ranks)
    _assert_trees_verified_through_their_mask(ranks, load_model("qwen2")[0])


def _unsharded_eagle3(model, tokenizer, method, **options) -> list:
    """Tokens of ``method`` with the workers' EAGLE-3 head on the unsharded target."""
    head = random_head("eagle3", model, seed=1)
    if "seed" in options:
        mx.random.seed(options.pop("seed"))
    stream = stream_generate(
        model,
        tokenizer,
        PROMPT,
        draft_model=head,
        speculative=method,
        max_tokens=MAX_TOKENS,
        **options,
    )
    return [r.token for r in stream]


def test_pipeline_stages_give_an_eagle3_head_every_stage_s_blocks(sharded, load_model):
    # Each stage holds one of the head's blocks; reading only its own, the
    # ranks drafted apart and the group stalled.
    model, tokenizer = load_model("qwen2")
    expected = _plain(model)
    ranks = sharded["pipeline-eagle3"]
    for results in ranks:
        for method in EAGLE3_METHODS:
            assert results[method]["tokens"] == expected, method
    _assert_ranks_decided_alike(ranks, EAGLE3_METHODS)
    # Sampled chains, whose draws change when either block's features do: the
    # stages' fused features are the unsharded target's.
    ranks = sharded["pipeline-eagle3-sampled"]
    drawn = _unsharded_eagle3(model, tokenizer, "eagle-chain", **SAMPLED)
    assert [r["eagle-chain"]["tokens"] for r in ranks] == [drawn, drawn]


def test_sampled_sharded_run_draws_what_the_unsharded_engine_draws(sharded, load_model):
    ranks = sharded["sampled"]
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    for method in SAMPLED_METHODS:
        eagle = method.startswith("eagle")
        drafter = random_head("eagle", model, seed=1) if eagle else draft
        mx.random.seed(SAMPLED["seed"])
        stream = stream_generate(
            model,
            tokenizer,
            PROMPT,
            draft_model=drafter,
            speculative=method,
            max_tokens=MAX_TOKENS,
            temp=SAMPLED["temp"],
        )
        expected = [r.token for r in stream]
        assert ranks[0][method]["tokens"] == expected, method
        assert ranks[1][method]["tokens"] == expected, method


@pytest.mark.parametrize("name, target", [("law", "llama"), ("pipeline-law", "qwen2")])
def test_sampled_sharded_streams_follow_the_target_law(
    sharded, load_model, name, target
):
    """The law tests, run sharded: every token of a long sampled stream follows
    the unsharded target's exact law given its prefix (randomized PIT,
    chi-square with 10 bins), tensor-parallel and in pipeline stages."""
    model, _ = load_model(target)
    ranks = sharded[name]
    laws, tokens, rounds = [], [], 0
    for method in SAMPLED_METHODS:
        out = ranks[0][method]["tokens"]
        assert ranks[1][method]["tokens"] == out, method
        rounds += ranks[0][method]["rounds"]
        logits = model(mx.array([PROMPT + out[:-1]]))[0, len(PROMPT) - 1 :]
        laws.append(np.array(mx.softmax(logits / LAW["temp"], axis=-1), np.float64))
        tokens += out
    # The streams end at an end-of-sequence token: they are pooled.
    assert len(tokens) > LAW["max_tokens"]
    assert rounds < len(tokens)  # drafts were accepted
    chi2, z = stream_statistics(np.concatenate(laws), np.array(tokens))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_generate_prints_once_and_refuses_in_one_line(
    checkpoints, load_model, tmp_path, backend
):
    common = ["-m", "mlx_spec.cli.generate", "--max-tokens", "8"]
    common += ["--ignore-chat-template"]
    # Rank 0 alone reads --prompt - (mpirun gives the others an empty stdin)
    # and writes --stats-json: rank 1 runs in another folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    python = _rank0_reads(tmp_path, CHAT_LINES[:1], others_in=elsewhere)
    code, out = _launch(
        common
        + ["--prompt", "-", "--stats-json", "stats.json"]
        + ["--model", str(checkpoints["llama"]), "--speculative", "draft"]
        + ["--draft-model", str(checkpoints["llama-near"])],
        backend=backend,
        python=str(python),
        cwd=tmp_path,
    )
    assert code == 0, out
    assert out.count("Speculation: draft") == 1  # rank 0 alone prints
    model, tokenizer = load_model("llama")
    prompt = tokenizer.encode(CHAT_LINES[0] + "\n")
    expected = mlx_lm.generate(model, tokenizer, prompt, max_tokens=8)
    assert f"==========\n{_newlines(expected)}\n==========" in out, out
    assert f"Prompt: {len(prompt)} tokens" in out
    assert json.loads((tmp_path / "stats.json").read_text())["method"] == "draft"
    assert not (elsewhere / "stats.json").exists()

    # mlx-lm has no pipeline stages for llama: one line from rank 0 and the
    # group stops (mlx.launch itself exits 0 whatever the ranks do).
    command = common + ["--prompt", "hello", "--pipeline"]
    command += ["--model", str(checkpoints["llama"])]
    code, out = _launch(command, backend=backend)
    if backend == "mpi":
        assert code == 2, out  # mpirun passes the ranks' exit code on
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and "has no pipeline stages" in errors[0], out
    assert "Traceback" not in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_on_one_rank_alone_is_said_by_it_and_stops_the_group(
    checkpoints, tmp_path, backend
):
    # Rank 1 starts in another folder, where the relative model path is
    # missing: as on a Mac that lacks the model. It says so, naming itself,
    # and the group stops (rank 0 was left waiting in the load's collective;
    # under the ring it may say that the group stopped). Each rank's python
    # writes its exit code: mlx.launch exits 0 whatever its ranks do.
    (tmp_path / "llama").symlink_to(checkpoints["llama"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    python = tmp_path / "python"
    codes = shlex.quote(str(tmp_path))
    python.write_text(
        "#!/bin/sh\n"
        'rank="${MLX_RANK:-$OMPI_COMM_WORLD_RANK}"\n'
        f'if [ "$rank" = 1 ]; then cd {shlex.quote(str(elsewhere))}; fi\n'
        f'{shlex.quote(sys.executable)} "$@"\n'
        f'code=$?; echo $code > {codes}/code"$rank"; exit $code\n'
    )
    python.chmod(0o755)
    command = ["-m", "mlx_spec.cli.generate", "--prompt", "hello", "--max-tokens", "4"]
    command += ["--model", "./llama", "--ignore-chat-template"]
    code, out = _launch(
        command, timeout=120, backend=backend, python=str(python), cwd=tmp_path
    )
    assert (tmp_path / "code1").read_text().strip() == "2", out
    if backend == "mpi":
        assert code != 0, out  # mpirun passes a rank's exit code on
    errors = [line for line in out.splitlines() if "error:" in line]
    said = "rank 1: mlx_spec.generate: error: model path './llama' does not exist."
    # And rank 0's line, unless mlx.launch stopped it first (in either order:
    # mlx.launch relays each rank's output on its own).
    stopped = "mlx_spec.generate: error: another process of the group stopped"
    assert said in errors, out
    assert all(e.startswith(stopped) for e in errors if e != said), out
    assert len(errors) <= 2 and "Traceback" not in out


class _Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size

    def rank(self):
        return 0


def test_a_hub_model_whose_heads_do_not_divide_gets_its_mlp_split(
    checkpoints, monkeypatch
):
    # mlx-lm's sharded_load would split 3 heads over 2 processes as if they
    # divided; a hub repo is fetched whole and sharded as a local folder is.
    import mlx_lm.utils

    from mlx_spec import distributed, mlx_lm_private

    def sharded_load(*args, **kwargs):
        raise AssertionError("mlx-lm would split the heads unevenly")

    monkeypatch.setattr(mlx_lm.utils, "sharded_load", sharded_load)
    fetch = lambda repo: checkpoints[repo.removeprefix("org/")]  # noqa: E731
    monkeypatch.setattr(mlx_lm_private, "download", fetch)
    monkeypatch.setattr(distributed, "sharded_group", lambda: _Group(2))
    monkeypatch.setattr(mx.distributed, "all_sum", lambda x, **kwargs: x)
    model, _ = distributed.load_sharded("org/llama-3heads")
    layer = model.layers[0]
    assert type(layer.mlp.down_proj).__name__ == "ShardedToAllLinear"
    assert type(layer.self_attn.q_proj).__name__ == "Linear"


def test_a_sharded_load_names_a_bad_path_in_one_line(checkpoints, monkeypatch):
    from mlx_spec import distributed, mlx_lm_private
    from mlx_spec.loading import load_sharded_model

    monkeypatch.setattr(distributed, "sharded_group", lambda: _Group(2))
    with pytest.raises(ValueError, match=r"^model path '/no/such' does not exist"):
        load_sharded_model("/no/such")
    with pytest.raises(ValueError, match="is a file"):
        load_sharded_model(str(checkpoints["llama"] / "config.json"))

    def download(repo):
        raise OSError("Got: ConnectError\nAn error happened while trying ...")

    monkeypatch.setattr(mlx_lm_private, "download", download)
    with pytest.raises(ValueError) as error:
        load_sharded_model("org/model")
    said = "could not load a sharded model 'org/model': Got: ConnectError"
    assert str(error.value) == said


def test_mlp_split_refuses_a_width_or_a_model_it_cannot_split(load_model):
    from mlx_spec.distributed import shard_mlp

    # llama's MLP width is 128: 3 processes cannot split it.
    with pytest.raises(ValueError, match=r"MLP width \(128\) divide by 3"):
        shard_mlp(load_model("llama")[0], _Group(3), "llama")
    # qwen3_next's layers hold experts, not one dense MLP.
    with pytest.raises(ValueError, match="no dense MLP in every layer"):
        shard_mlp(load_model("qwen3_next")[0], _Group(2), "qwen3_next")


def test_collective_delay_waits_before_each_collective_and_restores_them(monkeypatch):
    from mlx_spec import distributed

    waits = []
    monkeypatch.setattr(distributed.time, "sleep", waits.append)
    original = mx.distributed.all_sum
    with distributed.collective_delay(0.001):
        assert mx.distributed.all_sum is not original
        total = mx.distributed.all_sum(mx.array([1.0, 2.0]))
    assert waits == [0.001]
    assert total.tolist() == [1.0, 2.0]  # one process: the sum is the input
    assert mx.distributed.all_sum is original


def test_rank0_values_are_shared_on_the_stream_of_the_forwards(monkeypatch):
    # Plain decoding leaves its next step queued on mlx-lm's generation stream;
    # a collective on another stream could overtake it on one rank only.
    from mlx_lm.generate import generation_stream

    from mlx_spec import distributed

    streams = []

    def all_sum(x, group=None):
        streams.append(mx.default_stream(mx.default_device()))
        return x

    monkeypatch.setattr(mx.distributed, "all_sum", all_sum)
    assert distributed.from_rank0(2.5, _Group(2)) == 2.5
    with mx.stream(generation_stream):
        assert streams == [mx.default_stream(mx.default_device())]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_bench_measures_each_method_against_plain_at_each_delay(
    checkpoints, tmp_path, backend
):
    command = ["-m", "mlx_spec.bench.sharded", "--model", str(checkpoints["llama"])]
    command += ["--draft-model", str(checkpoints["llama-near"]), "--methods", "draft"]
    command += ["lookup", "--delays", "0", "1", "--prompts-per-set", "1"]
    command += ["--max-tokens", "8", "--out", str(tmp_path)]
    code, out = _launch(command, backend=backend)
    assert code == 0, out[-3000:]
    rows = json.loads((tmp_path / "sharded.json").read_text())
    # Plain decoding, the baseline, runs though not asked for.
    assert [(r["delay_ms"], r["method"]) for r in rows] == [
        (d, m) for d in (0.0, 1.0) for m in ("none", "draft", "lookup")
    ]
    assert all(r["identical"] for r in rows)
    table = (tmp_path / "sharded.md").read_text()
    assert "| `draft` |" in table
    assert "2 processes" in table  # one group, not 2 ranks alone


def test_sharded_table_gives_each_method_its_ratio_and_tokens_per_forward():
    from mlx_spec.bench.sharded import table

    rows = [
        {"delay_ms": d, "method": m, "tokens_per_forward": f, "x_plain": x}
        for d, m, f, x in [
            (0.0, "none", 1.0, 1.0),
            (0.0, "draft", 1.5, 0.9),
            (1.0, "none", 1.0, 1.0),
            (1.0, "draft", 1.5, 1.3),
        ]
    ]
    text = table(rows, 2, pipeline=False)
    assert "| `draft` | 0.90 (1.50) | 1.30 (1.50) |" in text
    assert "2 processes, tensor parallel" in text


def test_sharded_plot_draws_a_line_per_method_against_the_delay(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    from mlx_spec.bench.sharded import plot

    rows = [
        {"delay_ms": d, "method": m, "x_plain": x}
        for d, m, x in [(1.0, "none", 1.0), (0.0, "none", 1.0)]
        + [(0.0, "draft", 0.9), (1.0, "draft", 1.3)]
    ]
    figures, save = [], plt.Figure.savefig
    monkeypatch.setattr(
        plt.Figure,
        "savefig",
        lambda fig, *a, **k: figures.append(fig) or save(fig, *a, **k),
    )
    plot(rows, tmp_path / "sharded.png")
    assert (tmp_path / "sharded.png").stat().st_size > 0
    lines = {l.get_label(): l.get_xydata().tolist() for l in figures[0].axes[0].lines}
    assert lines == {"none": [[0, 1], [1, 1]], "draft": [[0, 0.9], [1, 1.3]]}


def test_a_method_with_no_drafter_to_find_stops_in_one_line(monkeypatch):
    from mlx_spec.bench import sharded

    monkeypatch.setattr(sharded, "_default_pair", lambda method: ("target", None))
    with pytest.raises(ValueError, match="no shipped drafter for --methods draft"):
        sharded._drafters(["lookup", "draft"], None, None, None)


@pytest.mark.skipif(
    shutil.which("ompi_info") is None, reason="Open MPI is not installed"
)
def test_mpirun_without_a_loadable_libmpi_stops_in_one_line(checkpoints, monkeypatch):
    # Each rank would otherwise decode the whole model alone, unsharded.
    monkeypatch.setenv("MLX_MPI_LIBNAME", "libmpi-that-is-not-there.so")
    command = ["-m", "mlx_spec.cli.generate", "--prompt", "hello", "--max-tokens", "4"]
    command += ["--model", str(checkpoints["llama"]), "--ignore-chat-template"]
    code, out = _launch(command, backend="mpi")
    assert code != 0, out
    said = [line for line in out.splitlines() if "could not open Open MPI" in line]
    assert len(said) == 1, out  # rank 0 alone says it
    assert "Traceback" not in out


CHAT_LINES = ["Write a parser.", "Now a lexer."]
CHAT_REPLY = re.compile(r">> (.*?)\n\[Speculation: draft", re.S)


def _rank0_reads(tmp_path, lines, others_in: Optional[Path] = None) -> Path:
    """A python for the launcher whose rank 0 alone reads ``lines`` (then the
    end of input); the other rank's stdin is empty, and it starts in the
    folder ``others_in`` if given."""
    text = tmp_path / "lines.txt"
    text.write_text("".join(line + "\n" for line in lines))
    python = tmp_path / "python"
    py = shlex.quote(sys.executable)
    cd = f"cd {shlex.quote(str(others_in))}\n" if others_in else ""
    python.write_text(
        "#!/bin/sh\n"
        'if [ "${MLX_RANK:-$OMPI_COMM_WORLD_RANK}" = 0 ]; then '
        f'exec {py} "$@" < {shlex.quote(str(text))}; fi\n'
        f'{cd}exec {py} "$@" < /dev/null\n'
    )
    python.chmod(0o755)
    return python


def _chat_replies(model, tokenizer, draft, flags) -> list:
    """The replies of an unsharded in-process chat to CHAT_LINES, checked
    against plain mlx-lm greedy over the same conversation."""
    from mlx_lm import stream_generate as mlx_lm_stream_generate

    from mlx_spec.cli.chat import Chat, setup_arg_parser

    args = setup_arg_parser().parse_args(flags)
    chat = Chat(model, tokenizer, draft, args, io.StringIO())
    replies, history = [], []
    for line in CHAT_LINES:
        history += chat._prompt(line)
        reply = chat.reply(line)
        steps = mlx_lm_stream_generate(model, tokenizer, history, max_tokens=8)
        assert reply.tokens == [r.token for r in steps]
        history += reply.tokens
        replies.append(reply.text)
    return replies


def _newlines(text: str) -> str:
    """``text`` as a pipe read in text mode gives it (universal newlines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "target, pipeline", [("llama", []), ("qwen3_next", ["--pipeline"])]
)
def test_sharded_chat_reads_on_rank_0_and_replies_once_as_unsharded(
    checkpoints, load_model, tmp_path, target, pipeline, backend
):
    flags = ["--model", str(checkpoints[target]), "--speculative", "draft"]
    flags += ["--draft-model", str(checkpoints[f"{target}-near"]), "--max-tokens", "8"]
    python = _rank0_reads(tmp_path, CHAT_LINES)
    command = ["-m", "mlx_spec.cli.chat", *flags, *pipeline]
    code, out = _launch(
        command, timeout=120, backend=backend, python=str(python), cwd=tmp_path
    )
    assert code == 0, out[-3000:]
    model, tokenizer = load_model(target)
    expected = _chat_replies(model, tokenizer, load_model(f"{target}-near")[0], flags)
    expected = [_newlines(reply) for reply in expected]
    assert CHAT_REPLY.findall(out) == expected, out[-3000:]  # once each, rank 0's
    assert out.count("[Speculation: ") == 2 and out.count("bye") == 1, out[-3000:]
    assert "Traceback" not in out


# Per target, a first line whose greedy reply runs beyond CTRL_C_MAX_TOKENS
# before any end of sequence, so that Ctrl-C lands in it; then a second line.
CTRL_C_LINES = {
    "llama": ["Write a compiler in C.", "Now a lexer."],
    "qwen3_next": ["a b c d", "Now a lexer."],
}
CTRL_C_MAX_TOKENS = 300
CTRL_C_FLAGS = ["--speculative", "draft", "--max-tokens", str(CTRL_C_MAX_TOKENS)]


class Session:
    """A launched group driven line by line through the launcher's pipes;
    rank 0's pid is read from ``pid0``, which the launcher's python writes."""

    def __init__(self, command, tmp_path, timeout=60):
        python = tmp_path / "python"
        pids = shlex.quote(str(tmp_path))
        python.write_text(
            "#!/bin/sh\n"
            f'echo $$ > {pids}/pid"${{MLX_RANK:-$OMPI_COMM_WORLD_RANK}}"\n'
            f'exec {shlex.quote(sys.executable)} "$@"\n'
        )
        python.chmod(0o755)
        self.process = subprocess.Popen(
            _launcher("ring", str(python)) + command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
            start_new_session=True,
        )
        self.pid0 = tmp_path / "pid0"
        self.timeout = timeout
        self.output = ""  # all read so far
        self.seen = 0  # where the next expect starts

    def expect(self, pattern: str) -> re.Match:
        """The first match of ``pattern`` after the last one, read as it comes."""
        deadline = time.monotonic() + self.timeout
        regex = re.compile(pattern, re.S)
        stdout = self.process.stdout.fileno()
        while True:
            match = regex.search(self.output, self.seen)
            if match:
                self.seen = match.end()
                return match
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([stdout], [], [], max(remaining, 0))
            data = os.read(stdout, 65536) if ready else b""
            if not data:
                self.kill()
                why = "timed out" if remaining <= 0 or not ready else "output ended"
                pytest.fail(f"{why} waiting for {pattern!r}:\n{self.output[-3000:]}")
            self.output += _newlines(data.decode(errors="replace"))

    def send(self, line: str):
        self.process.stdin.write((line + "\n").encode())
        self.process.stdin.flush()

    def ctrl_c_rank0(self):
        """SIGINT to rank 0 alone, as a Mac's terminal sends it to its own process."""
        os.kill(int(self.pid0.read_text()), signal.SIGINT)

    def wait(self) -> int:
        try:
            code = self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the group did not exit:\n{self.output[-3000:]}")
        self.output += _newlines(self.process.stdout.read().decode(errors="replace"))
        return code

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def _interrupted_chat(model, tokenizer, draft, lines, k: int) -> str:
    """The second reply of an unsharded in-process chat whose first reply
    Ctrl-C stopped after ``k`` tokens, checked against plain mlx-lm greedy
    over the same conversation (the ``k`` tokens kept)."""
    from mlx_lm import stream_generate as mlx_lm_stream_generate
    from test_chat import CtrlCAt

    from mlx_spec.cli.chat import Chat, setup_arg_parser

    args = setup_arg_parser().parse_args(CTRL_C_FLAGS)
    chat = Chat(model, tokenizer, draft, args, CtrlCAt(k))
    history = chat._prompt(lines[0])
    first = chat.reply(lines[0])
    assert len(first.tokens) == k
    history += first.tokens + chat._prompt(lines[1])
    second = chat.reply(lines[1])
    steps = mlx_lm_stream_generate(
        model, tokenizer, history, max_tokens=CTRL_C_MAX_TOKENS
    )
    assert second.tokens == [r.token for r in steps]
    return second.text


# The ring only: mpirun passes rank 0's output on in larger pieces, so a
# reply is seen under way only once it may be over.
@pytest.mark.parametrize(
    "target, pipeline", [("llama", []), ("qwen3_next", ["--pipeline"])]
)
def test_ctrl_c_on_rank_0_alone_stops_every_rank_at_one_token_and_chat_goes_on(
    checkpoints, load_model, tmp_path, target, pipeline
):
    # Only rank 0 gets SIGINT, as on Macs whose other ranks started over ssh.
    lines = CTRL_C_LINES[target]
    flags = ["--model", str(checkpoints[target]), *CTRL_C_FLAGS, *pipeline]
    flags += ["--draft-model", str(checkpoints[f"{target}-near"])]
    session = Session(["-m", "mlx_spec.cli.chat", *flags], tmp_path)
    try:
        session.expect(r"\[commands: .*?\]\n>> ")
        session.send(lines[0])
        session.expect(r".{40}")  # the reply is under way
        session.ctrl_c_rank0()
        k = int(session.expect(r"\n\[interrupted after (\d+) tokens\]\n").group(1))
        session.expect(r"\[Speculation: .*?\]\n>> ")
        session.send(lines[1])
        second = session.expect(r"(.*?)\n\[Speculation: .*?\]\n>> ").group(1)
        session.ctrl_c_rank0()  # at the prompt: the chat ends on every rank
        session.expect(r"\nbye\n")
        code = session.wait()
    finally:
        session.kill()
    out = session.output
    assert code == 0 and "Traceback" not in out, out[-3000:]
    assert 0 < k < CTRL_C_MAX_TOKENS and k % POLL_TOKENS == 0  # polled there
    assert out.count("[Speculation: ") == 2 and out.count("bye") == 1, out[-3000:]
    model, tokenizer = load_model(target)
    draft = load_model(f"{target}-near")[0]
    expected = _interrupted_chat(model, tokenizer, draft, lines, k)
    assert second == _newlines(expected)
