"""mlx_spec.server with continuous batching: a real server on a free port.

Concurrent requests decode together; each must still equal plain mlx_lm
greedy decoding. Also: disconnects, the prompt cache across batched
requests, the cross-request index and its isolation field, and requests
or models that are served alone.
"""

import contextlib
import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Tuple

import mlx_lm
import pytest
from serving import (
    RawStream,
    hang_up,
    idle,
    open_stream,
    post,
    request_running,
    slow_forwards,
    start_server,
)

from mlx_spec import testing
from mlx_spec.serve.cli import setup_arg_parser
from mlx_spec.serve.requests import STATS_FIELD

MAX_TOKENS = 16
PROMPTS = (
    *testing.PROMPTS,
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n",
    "for line in open(path):\n    ",
)
METHODS = ("draft", "lookup", "none", "auto", "draft", "lookup")
LENGTHS = (16, 9, 13, 16, 5, 11)


def _greedy(model, tokenizer, prompt, max_tokens=MAX_TOKENS) -> str:
    return mlx_lm.generate(
        model, tokenizer, tokenizer.encode(prompt), max_tokens=max_tokens
    )


@pytest.fixture(scope="module")
def server(checkpoints, pair_flags):
    server = start_server(
        *pair_flags,
        "--allow-request-models",  # requests may switch to the other test models
        str(checkpoints["qwen2"].parent),
        max_tokens=MAX_TOKENS,
    )
    yield server
    server.stop()


def _concurrently(server, bodies):
    """POST every body at once (one thread each); return the answers in order."""
    results = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def ask(i):
        barrier.wait()
        results[i] = post(server, bodies[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return results


def _open_stream(server, prompt, max_tokens, method="draft") -> RawStream:
    body = {"prompt": prompt, "max_tokens": max_tokens, "speculative": method}
    return open_stream(server, body, events=2)


@contextlib.contextmanager
def _companion(server, max_tokens=4000):  # the model's context is 4096
    """A long streamed request decoding in the background, so that the
    requests sent meanwhile are batched (an idle server runs a request
    alone); it is dropped (the client hangs up) on exit. The model is slowed
    meanwhile (see serving.slow_forwards): unslowed, it ends in about 10 s."""
    with slow_forwards(server.generator.model_provider.model):
        stream = _open_stream(server, PROMPTS[5], max_tokens)
        try:
            yield stream
        finally:
            stream.close()


def _read_stream(stream: RawStream) -> Tuple[str, dict]:
    """The text and the last ``speculative_stats`` of an SSE completion stream."""
    data = stream.received
    while b"data: [DONE]" not in data:
        chunk = stream.sock.recv(65536)
        if not chunk:
            break
        data += chunk
    text, stats = "", {}
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                text += choice.get("text") or ""
            stats = event.get(STATS_FIELD) or stats
    return text, stats


def test_concurrent_requests_decode_together_and_each_equals_plain_greedy(
    server, load_model
):
    model, tokenizer = load_model("llama")
    bodies = [
        {"prompt": p, "max_tokens": n, "speculative": m}
        for p, m, n in zip(PROMPTS, METHODS, LENGTHS)
    ]
    with _companion(server):
        results = _concurrently(server, bodies)
    batch_sizes = []
    for (status, body), prompt, n in zip(results, PROMPTS, LENGTHS):
        assert status == 200, body
        assert body["choices"][0]["text"] == _greedy(model, tokenizer, prompt, n)
        stats = body[STATS_FIELD]
        assert stats["batched"] is True
        batch_sizes.append(stats["mean_batch_size"])
    assert max(batch_sizes) > 1.5  # they really shared rounds


def test_a_client_hanging_up_is_dropped_and_the_others_go_on(server, load_model):
    """Hung up once the others joined its batch (the slowed model keeps it
    decoding), its row ends at the token in hand; the others' answers hold."""
    model, tokenizer = load_model("llama")
    others = []
    with slow_forwards(server.generator.model_provider.model):
        stream = _open_stream(server, PROMPTS[2], 2000)
        thread = threading.Thread(
            target=lambda: others.extend(
                _concurrently(
                    server,
                    [
                        {"prompt": p, "max_tokens": 24, "speculative": "draft"}
                        for p in PROMPTS[:2]
                    ],
                )
            )
        )
        thread.start()
        row = request_running(  # in the batch: another request came
            server,
            lambda r: r.request.prompt == PROMPTS[2]
            and any(r is c for c in server.generator._clients.values()),
        )
        hang_up(server, stream, row)
        sent = row.sent
        thread.join(timeout=300)
    for (status, body), prompt in zip(others, PROMPTS[:2]):
        assert status == 200
        assert body["choices"][0]["text"] == _greedy(model, tokenizer, prompt, 24)
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        assert json.loads(response.read()) == {"status": "ok"}
    assert idle(server)  # the dropped row left the batch
    assert row.sent <= sent + 1, (sent, row.sent)


def test_prompt_cache_is_reused_across_batched_requests(server, load_model):
    model, tokenizer = load_model("llama")
    prompt = "def cache_probe(items):\n    total = 0\n    for item in items:\n"
    with _companion(server):
        first = post(server, {"prompt": prompt, "speculative": "draft"})[1]
        second = post(server, {"prompt": prompt, "speculative": "draft"})[1]
    text = _greedy(model, tokenizer, prompt)
    assert first["choices"][0]["text"] == second["choices"][0]["text"] == text
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(tokenizer.encode(prompt)) - 1
    assert second[STATS_FIELD]["batched"] is True


def test_lookup_drafts_from_an_earlier_request_unless_isolated(server, load_model):
    model, tokenizer = load_model("llama")
    prompt = "class Index:\n    def lookup(self, key):\n        return"
    text = _greedy(model, tokenizer, prompt)
    body = {"prompt": prompt, "speculative": "lookup"}
    assert post(server, body)[1]["choices"][0]["text"] == text
    held = len(server.index)
    alone = post(server, dict(body, speculative_isolation=True))[1]
    assert alone["choices"][0]["text"] == text
    assert len(server.index) == held  # an isolated request is not indexed
    with _companion(server):  # batched: the index is read in the batch
        again = post(server, dict(body, speculative_isolation=True))[1]
        shared = post(server, body)[1]
    assert again["choices"][0]["text"] == text
    assert again[STATS_FIELD]["cross_request_drafted"] == 0
    assert again[STATS_FIELD]["isolation"] is True
    assert shared["choices"][0]["text"] == text
    stats = shared[STATS_FIELD]
    assert stats["cross_request_accepted"] > 0
    # Verified in most rounds, beside the companion's draft-model row.
    assert stats["tokens_per_target_forward"] > 2
    assert (
        stats["tokens_per_target_forward"]
        > again[STATS_FIELD]["tokens_per_target_forward"]
    )


def test_bad_isolation_value_gets_400(server):
    status, body = post(server, {"prompt": "x", "speculative_isolation": "yes"})
    assert status == 400 and "speculative_isolation" in body["error"]


CHAT = "/v1/chat/completions"
BAD_FIELDS = [
    (CHAT, {"messages": "hi"}, "messages must be a list"),
    (
        CHAT,
        {"messages": [{"content": "hi"}]},
        "messages[0] must be an object with a string role",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content must be a string",
    ),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop must be a string or a list"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n=2 is not supported"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "is not a token id"),
    (
        "/v1/completions",
        {"prompt": 5},
        "prompt must be a string or a list of token ids",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        'a "text" part needs a string text',
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": ["hi"]}]},
        "content parts must be objects with a type",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "x", "tool_calls": "bad"}]},
        "tool_calls must be a list",
    ),
    # These crashed the process, broke sampling for good, or dropped the connection.
    (
        "/v1/completions",
        {"prompt": "x", "temperature": 0.7, "min_p": float("nan")},
        "min_p=nan must be a finite number",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "temperature": float("inf")},
        "temperature=inf",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "logit_bias": {"5": None}},
        "logit_bias[5]=None",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "logit_bias": [1]},
        "logit_bias must be an object",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "logit_bias": {"100000": 5}},
        "logit_bias token 100000 is out of range",
    ),
    ("/v1/completions", {"prompt": "x", "seed": -1}, "seed=-1 is out of range"),
    (
        "/v1/completions",
        {"prompt": "x", "stream": True, "stream_options": "x"},
        "stream_options must be an object",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "speculative": "tree", "tree_choices": [[0], [1000]]},
        "tree_choices entry [1000]",
    ),
    (  # mlx_lm checks the threshold at the first sampled token: the handler died
        "/v1/completions",
        {
            "prompt": "x",
            "temperature": 1.0,
            "xtc_probability": 0.5,
            "xtc_threshold": 0.9,
        },
        "xtc_threshold=0.9 is out of range",
    ),
]


@pytest.mark.parametrize(
    "fields", [{"n": None}, {"n": 1.0}, {"stop": None}, {"stop": ["\n\n"]}]
)
def test_well_formed_optional_fields_are_accepted(server, fields):
    status, answer = post(server, {"prompt": "x", "max_tokens": 4, **fields})
    assert status == 200, answer


@pytest.mark.parametrize("path, body, message", BAD_FIELDS)
def test_malformed_request_fields_get_400_naming_the_field(server, path, body, message):
    status, answer = post(server, path=path, body={"max_tokens": 4, **body})
    assert status == 400 and message in answer["error"], (status, answer)
    assert "\n" not in answer["error"]
    status, answer = post(
        server,
        path=path,
        body={
            "max_tokens": 4,
            "prompt": "x",
            "messages": [{"role": "user", "content": "x"}],
        },
    )
    assert status == 200, answer  # the server still serves
    status, answer = post(server, {"prompt": "x", "max_tokens": 4, "temperature": 0.7})
    assert status == 200, answer  # and still samples


@pytest.mark.parametrize(
    "fields, note",
    [
        ({"speculative": "tree"}, "method 'tree' is not batched"),
        ({"temperature": 0.7, "seed": 3}, "seeded sampled request"),
        ({"repetition_penalty": 1.2}, "logits processors"),
    ],
)
def test_requests_that_cannot_batch_run_alone_and_say_why(
    server, load_model, fields, note
):
    status, body = post(server, dict({"prompt": PROMPTS[0]}, **fields))
    assert status == 200, body
    stats = body[STATS_FIELD]
    assert stats["batched"] is False and note in stats["batch_note"]
    if "temperature" not in fields and "repetition_penalty" not in fields:
        model, tokenizer = load_model("llama")
        assert body["choices"][0]["text"] == _greedy(model, tokenizer, PROMPTS[0])


def test_switching_models_between_requests_keeps_each_models_answers(
    server, checkpoints, load_model
):
    """A request for another model, then one running alone, then the default
    model again: each answer is its own model's greedy text (the batch built for
    the other model was reused)."""
    model, tokenizer = load_model("llama")
    other = str(checkpoints["qwen2"])
    expected = _greedy(model, tokenizer, PROMPTS[1])
    for fields in ({}, {"model": other}, {"speculative": "none"}, {}):
        status, body = post(server, {"prompt": PROMPTS[1], **fields})
        assert status == 200, body
    assert body["choices"][0]["text"] == expected
    status, body = post(server, {"prompt": PROMPTS[2], "speculative": "draft"})
    assert body["choices"][0]["text"] == _greedy(model, tokenizer, PROMPTS[2])


def test_a_model_without_batched_rollback_is_served_alone(checkpoints, caplog):
    caplog.set_level(logging.INFO)
    server = start_server(
        "--model", str(checkpoints["gemma3"]), max_tokens=8, quiet=False
    )
    try:
        for _ in range(2):
            status, body = post(server, {"prompt": PROMPTS[0]})
            assert status == 200
            assert body[STATS_FIELD]["batched"] is False
            assert "cannot batch" in body[STATS_FIELD]["batch_note"]
    finally:
        server.stop()
    assert caplog.text.count("Serving one request at a time") == 1


def test_no_batching_flag_serves_one_request_at_a_time():
    assert setup_arg_parser().parse_args(["--no-batching"]).batching is False
    assert setup_arg_parser().parse_args([]).batching is True


@pytest.mark.parametrize(
    "fields",
    [
        {"stop": ["\n", "re"]},
        {"logprobs": True, "top_logprobs": 3},
    ],
    ids=["stop-words", "top-logprobs"],
)
def test_batched_stop_words_and_logprobs_equal_serving_alone(server, fields):
    """The same requests, batched together and served alone (``tree`` runs
    alone), give the same text, finish reason, usage and logprobs."""
    bodies = [
        dict({"prompt": p, "max_tokens": 24, "speculative": "draft"}, **fields)
        for p in PROMPTS[:4]
    ]
    with _companion(server):
        batched = _concurrently(server, bodies)
    reasons = [body["choices"][0]["finish_reason"] for _, body in batched]
    if "stop" in fields:
        assert "stop" in reasons  # a stop word ended some answer early
    for (status, body), request in zip(batched, bodies):
        assert status == 200 and body[STATS_FIELD]["batched"] is True
        status, alone = post(server, dict(request, speculative="tree"))
        assert status == 200 and alone[STATS_FIELD]["batched"] is False
        got, want = body["choices"][0], alone["choices"][0]
        assert got["text"] == want["text"]
        assert got["finish_reason"] == want["finish_reason"]
        assert body["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]
        if "logprobs" in fields:
            assert len(got["logprobs"]["content"]) == len(want["logprobs"]["content"])
            for a, b in zip(got["logprobs"]["content"], want["logprobs"]["content"]):
                assert a["id"] == b["id"]
                assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
                ids = [t["id"] for t in a["top_logprobs"]]
                assert ids == [t["id"] for t in b["top_logprobs"]]


def test_a_request_running_alone_moves_into_the_batch_when_another_arrives(
    server, load_model
):
    """An idle server runs a request on the single-sequence engine; when a
    second arrives, the first goes on in the batch from the tokens it sent,
    and both equal plain greedy decoding."""
    model, tokenizer = load_model("llama")
    # Slowed, the 300 tokens take over 6 s (unslowed, 0.7 s: the second request
    # could come after them on a loaded machine).
    with slow_forwards(server.generator.model_provider.model):
        stream = _open_stream(server, PROMPTS[0], 300)  # no EOS before 300 tokens
        status, other = post(server, {"prompt": PROMPTS[2], "speculative": "draft"})
        text, stats = _read_stream(stream)
        stream.close()
    assert status == 200
    assert other["choices"][0]["text"] == _greedy(model, tokenizer, PROMPTS[2])
    assert other[STATS_FIELD]["batched"] is True
    assert text == _greedy(model, tokenizer, PROMPTS[0], 300)
    assert stats["batched"] is True
    assert 0 < stats["tokens_before_batching"] < stats["generated_tokens"]


def test_a_request_alone_on_an_idle_server_runs_the_single_sequence_engine(server):
    status, body = post(server, {"prompt": PROMPTS[1], "speculative": "draft"})
    assert status == 200
    stats = body[STATS_FIELD]
    assert stats["batched"] is False and "no other request" in stats["batch_note"]


def test_lookup_alone_drafts_from_earlier_requests_in_the_batch_engine(server):
    """The single-sequence engine only looks up the request's own context,
    so with earlier requests indexed, lookup and auto run in the batch."""
    post(server, {"prompt": PROMPTS[4], "speculative": "draft"})  # indexed
    assert len(server.index) > 0
    for method in ("lookup", "auto"):
        status, body = post(server, {"prompt": PROMPTS[4], "speculative": method})
        assert status == 200 and body[STATS_FIELD]["batched"] is True
        assert body[STATS_FIELD]["cross_request_accepted"] > 0
