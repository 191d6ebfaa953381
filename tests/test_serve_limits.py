"""The server is a good citizen: it loads only what it was started with, says
the same thing about a path that exists and one that does not, refuses work
beyond the model's context before any prefill, bounds request bodies, stops
the work of a client that hung up (streamed or not, in its prefill too),
serves token-id prompts, and runs --adapter-path."""

import json

import mlx_lm
import pytest
from serving import (
    hang_up,
    hooked_forwards,
    idle,
    post,
    request_running,
    send_raw,
    slow_forwards,
    start_server,
)
from test_server import _free_port, adapters, request_root  # noqa: F401  (fixtures)

from mlx_spec.limits import context_window
from mlx_spec.serve import server as server_module
from mlx_spec.serve.cli import host_warning, setup_arg_parser
from mlx_spec.serve.server import SpecServer, check_sharded_flags, main
from mlx_spec.testing import PROMPTS

MAX_TOKENS = 16
PREFILL_STEP = 8


@pytest.fixture(scope="module")
def server(checkpoints):
    server = start_server(
        *("--model", str(checkpoints["llama"])),
        *("--prefill-step-size", str(PREFILL_STEP)),
        *("--max-request-bytes", "200000"),
        max_tokens=MAX_TOKENS,
    )
    yield server
    server.stop()


def _greedy_ids(model, tokenizer, ids, n=MAX_TOKENS):
    return mlx_lm.generate(model, tokenizer, ids, max_tokens=n)


# --------------------------------------------------------------------------- #
# Only what it was started with
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("field", ["model", "draft_model", "adapters"])
def test_a_path_it_was_not_started_with_is_refused_alike_whether_it_exists(
    server, checkpoints, tmp_path, field
):
    real = str(checkpoints["qwen2"])
    missing = str(tmp_path / "no-such-model")
    answers = []
    for value in (real, missing):
        status, body = post(server, {"prompt": "hi", field: value})
        assert status == 400, body
        answers.append(body["error"].replace(value, "PATH"))
    assert answers[0] == answers[1]
    assert "not served here" in answers[0] and "--allow-request-models" in answers[0]


def test_the_served_model_may_be_named_and_is_echoed(server, checkpoints, load_model):
    model, tokenizer = load_model("llama")
    expected = _greedy_ids(model, tokenizer, tokenizer.encode(PROMPTS[0]))
    for name in (str(checkpoints["llama"]), "default_model"):
        status, body = post(server, {"prompt": PROMPTS[0], "model": name})
        assert status == 200, body
        assert body["choices"][0]["text"] == expected and body["model"] == name


# --------------------------------------------------------------------------- #
# Sizes
# --------------------------------------------------------------------------- #


def test_a_prompt_beyond_the_context_is_refused_before_any_prefill(server, load_model):
    model, tokenizer = load_model("llama")
    limit = context_window(model)
    words = "word " * (limit + 50)
    ids = len(tokenizer.encode(words))
    forwards = []  # the server's target forwards (see serving.hooked_forwards)
    with hooked_forwards(server.generator.model_provider.model, forwards.append):
        status, body = post(server, {"prompt": words, "max_tokens": 4})
        refused = len(forwards)
        assert post(server, {"prompt": "hi", "max_tokens": 1})[0] == 200
    assert status == 400, body
    assert f"the prompt is {ids} tokens" in body["error"]
    assert f"context of {limit} tokens" in body["error"]
    assert refused == 0 and forwards  # the hook sees the served request's
    assert server.generator.model_provider.model is not None


@pytest.mark.parametrize("max_tokens", [2**63, 10**6])
def test_max_tokens_beyond_the_limit_is_refused_by_count(
    server, load_model, max_tokens
):
    limit = context_window(load_model("llama")[0])
    status, body = post(server, {"prompt": "hi", "max_tokens": max_tokens})
    assert status == 400, body
    assert f"max_tokens={max_tokens} is out of range: at most {limit}" in body["error"]
    status, body = post(server, {"prompt": "hi"})
    assert status == 200


def test_a_body_over_the_limit_gets_413_unread(server):
    big = json.dumps({"prompt": "x" * 300000}).encode()
    status, body = post(server, big)
    assert status == 413 and "--max-request-bytes" in body["error"], body
    status, body = post(server, {"prompt": "hi"})
    assert status == 200


# --------------------------------------------------------------------------- #
# Token-id prompts
# --------------------------------------------------------------------------- #


def test_a_token_id_prompt_is_served_as_those_ids(server, load_model):
    model, tokenizer = load_model("llama")
    ids = tokenizer.encode(PROMPTS[1])
    expected = _greedy_ids(model, tokenizer, ids)
    for prompt in (ids, [ids]):
        status, body = post(server, {"prompt": prompt})
        assert status == 200, body
        assert body["choices"][0]["text"] == expected


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, 2, 10**9], "prompt[2]=1000000000 is out of range: ids go from 0 to"),
        ([1, -1], "prompt[1]=-1 is out of range"),
        ([1, "a"], "prompt[1]='a' is not a token id"),
        ([[1, 2], [3]], "prompt holds 2 token lists; send one prompt per request"),
        ([], "prompt is an empty list"),
    ],
)
def test_bad_token_id_prompts_get_400_naming_the_id(server, prompt, message):
    status, body = post(server, {"prompt": prompt})
    assert status == 400 and message in body["error"], body


# --------------------------------------------------------------------------- #
# A client that hangs up
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_stops_its_generation(server, load_model, stream):
    """Not streamed, nothing is written until the end: the hang-up was missed.

    The slowed model (see serving.slow_forwards) keeps the reply going while
    the test hangs up; once the hang-up shows, at most the token in hand is sent."""
    with slow_forwards(server.generator.model_provider.model):
        sock = send_raw(
            server,
            {"prompt": PROMPTS[2], "max_tokens": 3000, "stream": stream},
        )
        run = request_running(server, lambda run: run.sent > 0)  # decoding
        hang_up(server, sock, run)
        sent = run.sent
        assert idle(server), "still generating after the client left"
        assert run.sent <= sent + 1, (sent, run.sent)
    model, tokenizer = load_model("llama")
    status, body = post(server, {"prompt": PROMPTS[0]})
    assert status == 200
    expected = _greedy_ids(model, tokenizer, tokenizer.encode(PROMPTS[0]))
    assert body["choices"][0]["text"] == expected


def test_a_client_that_hangs_up_during_its_prompt_stops_the_prefill(server, load_model):
    model, tokenizer = load_model("llama")
    long_prompt = "one two three four five six " * 160
    total = len(tokenizer.encode(long_prompt))
    assert 1500 < total < context_window(model) - 8  # hundreds of chunks of 8
    # Isolated, it runs alone (not in the batch), with its prefill progress.
    body = {"prompt": long_prompt, "max_tokens": 4, "speculative_isolation": True}
    # The slowed model reads it for over 6 s (unslowed, under 1 s).
    with slow_forwards(server.generator.model_provider.model):
        sock = send_raw(server, body)
        run = request_running(server)
        hang_up(server, sock, run)
        processed = run.keepalive.processed
        assert idle(server), "the prefill went on after the client left"
    assert run.sent == 0
    # Stopped part-way: at most the chunk in hand was read after the hang-up showed.
    assert run.keepalive.processed <= processed + PREFILL_STEP
    assert run.keepalive.processed < run.keepalive.total
    status, body = post(server, {"prompt": long_prompt, "max_tokens": 4})
    assert status == 200
    assert body["choices"][0]["text"] == _greedy_ids(
        model, tokenizer, tokenizer.encode(long_prompt), 4
    )


# --------------------------------------------------------------------------- #
# Start-up
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prefill-step-size", "0"], "--prefill-step-size=0 is out of range"),
        (["--prompt-cache-size", "-1"], "--prompt-cache-size=-1 is out of range"),
        (
            ["--kv-bits", "4", "--kv-group-size", "0"],
            "--kv-group-size=0 is out of range",
        ),
        (["--max-tokens-limit", "0"], "--max-tokens-limit=0 is out of range"),
        (["--allow-request-models", "/no/such/root"], "no such folder"),
    ],
)
def test_bad_server_flags_stop_it_at_start_in_one_line(checkpoints, flags, message):
    """Checked before the port is bound or a model loads (each request got 400)."""
    argv = ["--model", str(checkpoints["llama"]), "--port", "0", *flags]
    with pytest.raises(ValueError) as e:
        SpecServer(setup_arg_parser().parse_args(argv))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_non_loopback_host_is_warned_about():
    assert host_warning("127.0.0.1") is None and host_warning("::1") is None
    assert "no authentication" in host_warning("0.0.0.0")


def test_adapter_path_serves_the_adapted_model_greedy(checkpoints, adapters):
    """It failed every request: "There is no Stream(cpu, 0) in current thread"."""
    lora = adapters["lora"]
    adapted, tokenizer = mlx_lm.load(str(checkpoints["llama"]), adapter_path=lora)
    base, _ = mlx_lm.load(str(checkpoints["llama"]))
    ids = tokenizer.encode(PROMPTS[0])
    expected = _greedy_ids(adapted, tokenizer, ids)
    assert expected != _greedy_ids(base, tokenizer, ids)
    served = start_server(
        "--model",
        str(checkpoints["llama"]),
        "--adapter-path",
        lora,
        max_tokens=MAX_TOKENS,
    )
    try:
        for method in ("none", "lookup"):
            status, body = post(served, {"prompt": PROMPTS[0], "speculative": method})
            assert status == 200, body
            assert body["choices"][0]["text"] == expected
    finally:
        served.stop()


def test_a_sharded_server_refuses_models_named_by_requests(
    checkpoints, monkeypatch, tmp_path
):
    """Each rank would load a request's model from its own disk, and one that
    lacks it would leave the others waiting in the sharded load. Flags that
    stop batching stay: those requests run alone on every rank."""
    monkeypatch.setattr(server_module, "sharded_group", lambda: object())
    argv = ["--model", str(checkpoints["llama"]), "--port", "0"]
    flags = ["--allow-request-models", str(tmp_path)]
    for pipeline in ([], ["--pipeline"]):
        with pytest.raises(ValueError) as e:
            SpecServer(setup_arg_parser().parse_args(argv + pipeline + flags))
        message = str(e.value)
        assert "drop --allow-request-models" in message and "\n" not in message
    check_sharded_flags(
        setup_arg_parser().parse_args(["--no-batching", "--kv-bits", "4"])
    )


def test_a_pipeline_server_refuses_a_prompt_cache_byte_limit(monkeypatch):
    """Each stage holds its own layers' caches: a byte limit could evict
    different prompts on each. Flags that stop batching stay (those requests
    run alone on every stage)."""
    monkeypatch.setattr(server_module, "sharded_group", lambda: object())
    parse = setup_arg_parser().parse_args
    with pytest.raises(ValueError) as e:
        check_sharded_flags(parse(["--pipeline", "--prompt-cache-bytes", "1G"]))
    assert "drop --prompt-cache-bytes" in str(e.value), str(e.value)
    check_sharded_flags(parse(["--pipeline", "--no-batching", "--kv-bits", "4"]))


def test_a_sharded_server_refuses_adapters_in_one_line(monkeypatch):
    """The rule ``mlx_spec.generate`` follows: adapters are not sharded."""
    monkeypatch.setattr(server_module, "sharded_group", lambda: object())
    with pytest.raises(ValueError) as e:
        check_sharded_flags(setup_arg_parser().parse_args(["--adapter-path", "a"]))
    said = "--adapter-path is not supported on a sharded target; drop it, or run "
    assert str(e.value) == said + "one process."


def test_pipeline_without_mlx_launch_is_refused_in_one_line(
    checkpoints, monkeypatch, capsys
):
    # Else the server ran unsharded, as if --pipeline were not given.
    monkeypatch.setattr(SpecServer, "serve_forever", lambda self: self.stop())
    argv = ["--model", str(checkpoints["llama"]), "--port", str(_free_port())]
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--pipeline"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mlx_spec.server: error: --pipeline shards the target over several "
        "processes; start them with mlx.launch (for example mlx.launch --backend "
        "ring -n 2 -- mlx_spec.server --pipeline ...)."
    ], err
