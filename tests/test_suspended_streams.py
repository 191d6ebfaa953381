"""A stream left suspended (the caller breaks out of its loop and keeps it,
without ``close()``) never makes the next call on its prompt cache silently
different: that call continues exactly as plain mlx-lm does after the same
break, on every method and on hybrid (recurrent, sliding-window) caches."""

import threading

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec import stream_generate
from mlx_spec.drafters.heads import random_head
from mlx_spec.drafters.registry import FACTORIES as DRAFTER_FACTORIES
from mlx_spec.drafters.self_spec import make_self_drafter
from mlx_spec.testing import PROMPTS

METHODS = ("none", "draft", "tree", "lookup", "self", "auto")
HEAD_METHODS = ("eagle", "eagle-chain", "medusa")
WITH_DRAFT_MODEL = ("draft", "tree", "auto")
# Attention only, recurrent + attention (hybrid), sliding window + attention.
FAMILIES = ("llama", "qwen3_next", "gemma3")
BREAKS = (1, 2, 5)
PROMPT = PROMPTS[0] + "\n    return n\n" + PROMPTS[0]
NEXT_TURN = "\n\nclass A:"


@pytest.fixture
def always_draft(monkeypatch):
    """``self`` drafts even where its search says it does not pay."""

    def factory(config, target, draft_model, cache, kv, vocab_size):
        drafter = make_self_drafter(config, target, draft_model, cache, kv, vocab_size)
        drafter.min_speedup = 0.0
        return drafter

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)


def _tokens(stream, stop=None):
    got = []
    for response in stream:
        got.append(response.token)
        if len(got) == stop:
            break
    return got


def _plain_after_break(model, tokenizer, first, second, stop):
    """What mlx-lm's own ``stream_generate`` gives after the same break."""
    cache = make_prompt_cache(model)
    kept = mlx_lm.stream_generate(
        model, tokenizer, first, max_tokens=12, prompt_cache=cache
    )
    head = _tokens(kept, stop)
    tail = mlx_lm.stream_generate(
        model, tokenizer, second, max_tokens=8, prompt_cache=cache
    )
    return head, [r.token for r in tail]


def _spec_after_break(model, tokenizer, draft, method, first, second, stop):
    cache = make_prompt_cache(model)
    if draft is not None and method in WITH_DRAFT_MODEL:
        cache += make_prompt_cache(draft)
    options = dict(speculative=method, num_draft_tokens=3, adaptive=False)
    kept = stream_generate(
        model,
        tokenizer,
        first,
        draft_model=draft,
        max_tokens=12,
        prompt_cache=cache,
        **options,
    )
    head = _tokens(kept, stop)  # ``kept`` stays referenced: suspended mid-round
    tail = stream_generate(
        model,
        tokenizer,
        second,
        draft_model=draft,
        max_tokens=8,
        prompt_cache=cache,
        **options,
    )
    got = [r.token for r in tail]
    del kept
    return head, got


@pytest.mark.parametrize("stop", BREAKS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_after_a_suspended_stream_continues_as_plain_mlx_lm(
    load_model, always_draft, family, method, stop
):
    model, tokenizer = load_model(family)
    draft = load_model(f"{family}-near")[0] if method in WITH_DRAFT_MODEL else None
    first, second = tokenizer.encode(PROMPT), tokenizer.encode(NEXT_TURN)
    expected = _plain_after_break(model, tokenizer, first, second, stop)
    got = _spec_after_break(model, tokenizer, draft, method, first, second, stop)
    assert got == expected


@pytest.mark.parametrize("stop", BREAKS)
@pytest.mark.parametrize("method", HEAD_METHODS)
def test_heads_after_a_suspended_stream_continue_as_plain_mlx_lm(
    load_model, method, stop
):
    model, tokenizer = load_model("llama")
    head = random_head("medusa" if method == "medusa" else "eagle", model, seed=1)
    first, second = tokenizer.encode(PROMPT), tokenizer.encode(NEXT_TURN)
    expected = _plain_after_break(model, tokenizer, first, second, stop)
    got = _spec_after_break(model, tokenizer, head, method, first, second, stop)
    assert got == expected


def test_a_stream_left_open_in_another_thread_is_refused_naming_close(load_model):
    model, tokenizer = load_model("llama")
    cache = make_prompt_cache(model)
    ids, second = tokenizer.encode(PROMPT), tokenizer.encode(NEXT_TURN)
    opened, closing, streams = threading.Event(), threading.Event(), []

    def suspend_then_close():
        stream = stream_generate(
            model,
            tokenizer,
            ids,
            speculative="lookup",
            max_tokens=12,
            prompt_cache=cache,
        )
        streams.append(_tokens(stream, 3))
        opened.set()
        closing.wait(30)
        stream.close()

    worker = threading.Thread(target=suspend_then_close)
    worker.start()
    try:
        assert opened.wait(60)
        with pytest.raises(ValueError, match=r"call close\(\) on that generation"):
            stream_generate(
                model, tokenizer, second, speculative="lookup", prompt_cache=cache
            )
    finally:
        closing.set()
        worker.join(60)
    # Closed in its thread, the cache goes on exactly.
    tail = stream_generate(
        model, tokenizer, second, speculative="lookup", max_tokens=8, prompt_cache=cache
    )
    head, expected = _plain_after_break(model, tokenizer, ids, second, 3)
    assert streams == [head]
    assert [r.token for r in tail] == expected
