"""The context window is checked before any prefill, and ``should_stop`` stops
a generation between prefill chunks or tokens, leaving its cache exact."""

import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec import stream_generate
from mlx_spec.limits import (
    ContextTooLong,
    GenerationCancelled,
    check_context,
    context_window,
)
from mlx_spec.models import cache_offset
from mlx_spec.testing import PROMPTS

LONG = (PROMPTS[0] + "\n") * 4


def test_the_context_window_is_read_from_the_config(load_model, checkpoints):
    import json

    model, _ = load_model("llama")
    config = json.loads((checkpoints["llama"] / "config.json").read_text())
    assert context_window(model) == config["max_position_embeddings"]


def test_a_prompt_and_max_tokens_beyond_the_context_are_refused_by_count(load_model):
    model, _ = load_model("llama")
    limit = context_window(model)
    check_context(model, limit - 10, 10)
    with pytest.raises(ContextTooLong) as e:
        check_context(model, limit - 10, 11)
    message = str(e.value)
    assert f"{limit - 10} tokens" in message and f"context of {limit} tokens" in message
    assert "\n" not in message


class StopAfter:
    """``should_stop`` that turns true after ``n`` polls; counts the polls."""

    def __init__(self, n: int):
        self.n, self.polls = n, 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.polls > self.n


def _plain(model, tokenizer, ids, max_tokens):
    return [
        r.token
        for r in mlx_lm.stream_generate(model, tokenizer, ids, max_tokens=max_tokens)
    ]


def _spec_stream(model, tokenizer, ids, draft, method, **options):
    """``stream_generate`` of ``ids`` by ``method`` with ``draft`` (``None``: none)."""
    return stream_generate(
        model, tokenizer, ids, draft_model=draft, speculative=method, **options
    )


@pytest.mark.parametrize("method", ["none", "lookup", "draft"])
def test_a_stop_during_the_prompt_ends_within_one_chunk_and_rewinds(load_model, method):
    model, tokenizer = load_model("llama")
    draft = load_model("llama-near")[0] if method == "draft" else None
    cache = make_prompt_cache(model) + (make_prompt_cache(draft) if draft else [])
    ids = tokenizer.encode(LONG)
    assert len(ids) > 40
    chunks = []
    stop = StopAfter(2)
    stream = _spec_stream(
        model,
        tokenizer,
        ids,
        draft,
        method,
        prompt_cache=cache,
        prefill_step_size=4,
        prompt_progress_callback=lambda done, total: chunks.append(done),
        should_stop=stop,
    )
    with pytest.raises(GenerationCancelled, match="during the prompt"):
        next(stream)
    # Stopped at the first poll that said so: three chunks of 4 at most, of 40+.
    assert stop.polls == 3 and max(chunks) <= 12
    assert cache_offset(cache) == 0
    # The same cache serves the next request exactly.
    got = [
        r.token
        for r in _spec_stream(
            model,
            tokenizer,
            ids,
            draft,
            method,
            max_tokens=6,
            prompt_cache=cache,
        )
    ]
    assert got == _plain(model, tokenizer, ids, 6)


@pytest.mark.parametrize("method", ["none", "lookup", "draft", "tree"])
def test_a_stop_during_generation_keeps_the_tokens_sent(load_model, method):
    model, tokenizer = load_model("llama")
    draft = load_model("llama-near")[0] if method in ("draft", "tree") else None
    cache = make_prompt_cache(model) + (make_prompt_cache(draft) if draft else [])
    ids = tokenizer.encode(PROMPTS[0])
    got = []
    with pytest.raises(GenerationCancelled, match="after 3 tokens"):
        for r in _spec_stream(
            model,
            tokenizer,
            ids,
            draft,
            method,
            max_tokens=20,
            prompt_cache=cache,
            should_stop=lambda: len(got) >= 3,  # the client left after 3 tokens
        ):
            got.append(r.token)
    expected = _plain(model, tokenizer, ids, 10)
    assert got == expected[:3]
    nxt = tokenizer.encode("\n")
    tail = [
        r.token
        for r in _spec_stream(
            model,
            tokenizer,
            nxt,
            draft,
            method,
            max_tokens=5,
            prompt_cache=cache,
        )
    ]
    assert tail == _plain(model, tokenizer, ids + got + nxt, 5)


def test_a_recurrent_cache_stopped_mid_prompt_is_refused_not_reused(load_model):
    model, tokenizer = load_model("qwen3_next")
    cache = make_prompt_cache(model)
    ids = tokenizer.encode(LONG)
    stream = stream_generate(
        model,
        tokenizer,
        ids,
        speculative="lookup",
        prompt_cache=cache,
        prefill_step_size=4,
        should_stop=StopAfter(2),
    )
    with pytest.raises(GenerationCancelled):
        next(stream)
    with pytest.raises(ValueError, match="cancelled generation.*make_prompt_cache"):
        stream_generate(model, tokenizer, ids, speculative="lookup", prompt_cache=cache)


# --------------------------------------------------------------------------- #
# Numbers and text checked before use (one path: mlx_spec.config)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(kv_bits=4, kv_group_size=0), "kv_group_size=0 is out of range: one of"),
        (dict(kv_bits=4, kv_group_size=7), "kv_group_size=7 is out of range"),
        (dict(kv_bits=4, kv_group_size=-64), "kv_group_size=-64 is out of range"),
        (dict(kv_bits=9), "kv_bits=9 is out of range"),
        (dict(kv_bits=4, quantized_kv_start=-1), "quantized_kv_start=-1"),
        (dict(seed=-1), "seed=-1 is out of range: an integer from 0 to 2**64 - 1"),
        (dict(seed=2**70), "seed=1180591620717411303424 is out of range"),
        (dict(prefill_step_size=0), "prefill_step_size=0 is out of range"),
        (dict(max_kv_size=0), "max_kv_size=0 is out of range"),
        # mlx slices with 32-bit indices: 2**70 was a std::bad_cast mid-prefill.
        (dict(prefill_step_size=2**70), "prefill_step_size=1180591620717411303424"),
        (dict(max_kv_size=2**31), "max_kv_size=2147483648 is out of range"),
    ],
)
def test_run_options_out_of_range_are_refused_by_name(options, message):
    from mlx_spec.config import check_generation_options

    with pytest.raises(ValueError) as e:
        check_generation_options(**options)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_kv_quantization_accepts_what_mx_quantize_supports():
    import mlx.core as mx

    from mlx_spec.config import check_generation_options, quantize_support

    for bits, group_size in quantize_support():
        check_generation_options(kv_bits=bits, kv_group_size=group_size)
        w = mx.zeros((1, 256))
        mx.eval(mx.quantize(w, group_size=group_size, bits=bits))
    assert (4, 64) in quantize_support() and (8, 32) in quantize_support()


def test_kv_group_size_0_exits_2_in_one_line_not_sigfpe(checkpoints):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    argv = [
        sys.executable,
        "-m",
        "mlx_spec.generate",
        "--model",
        str(checkpoints["llama"]),
        "--prompt",
        "hello",
        "--max-tokens",
        "3",
        "--kv-bits",
        "4",
        "--kv-group-size",
        "0",
        "--quantized-kv-start",
        "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    line = done.stderr.strip()
    assert "--kv-group-size=0 is out of range" in line and "\n" not in line, line


@pytest.mark.parametrize("seed", ["-1", str(2**70)])
def test_a_seed_out_of_range_exits_2_in_one_line(checkpoints, capsys, seed):
    from test_generate_cli import model_args, run_cli

    argv = model_args(checkpoints) + ["--prompt", "x", "--max-tokens", "2"]
    code, _, err = run_cli([*argv, f"--seed={seed}"], capsys)
    assert code == 2 and f"--seed={seed} is out of range" in err, err
    assert "\n" not in err.strip() and "Traceback" not in err


def test_a_prompt_of_invalid_utf8_is_generated_with_replacement(checkpoints, capsys):
    from test_generate_cli import model_args, run_cli

    bad = b"def f(\xff\xfe):".decode("utf-8", "surrogateescape")  # as argv gives it
    argv = model_args(checkpoints) + ["--max-tokens", "3", "--prompt", bad]
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and out.strip() and "Traceback" not in err, err


@pytest.mark.parametrize("method", ["none", "draft", "lookup"])
def test_a_temperature_too_small_to_represent_is_greedy(load_model, method):
    model, tokenizer = load_model("llama")
    draft = load_model("llama-near")[0] if method == "draft" else None
    ids = tokenizer.encode(PROMPTS[0])

    def run(temp):
        stream = _spec_stream(
            model,
            tokenizer,
            ids,
            draft,
            method,
            temp=temp,
            max_tokens=12,
        )
        return [r.token for r in stream]

    assert run(1e-300) == run(0.0) == _plain(model, tokenizer, ids, 12)


@pytest.mark.parametrize("options", [dict(seed=-1), dict(prefill_step_size=0)])
def test_batch_generate_checks_the_same_run_options(load_model, options):
    from mlx_spec import batch_generate

    model, tokenizer = load_model("llama")
    with pytest.raises(ValueError, match="is out of range"):
        batch_generate(model, tokenizer, ["hi", "ho"], max_tokens=2, **options)


def test_stop_during_the_prompt_comes_before_a_draft_model_reads_it(
    load_model, monkeypatch
):
    """The target reads the prompt first, stoppable chunk by chunk; the draft after."""
    from mlx_spec.limits import GenerationCancelled

    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    draft_calls, chunks = [], []
    original = type(draft).__call__

    def counting(self, *args, **kwargs):
        if self is draft:
            draft_calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(draft), "__call__", counting)
    stream = stream_generate(
        model,
        tokenizer,
        list(range(5, 69)),
        draft_model=draft,
        speculative="draft",
        max_tokens=4,
        prefill_step_size=16,
        should_stop=lambda: True,
        prompt_progress_callback=lambda done, total: chunks.append(done),
    )
    with pytest.raises(GenerationCancelled):
        list(stream)
    assert chunks == [16]  # stopped after the target's first chunk
    assert draft_calls == []  # the draft never read the prompt
