"""Adaptive draft length and ``auto`` in the engine: identity, law, bounds."""

import mlx.core as mx
import numpy as np
import pytest
from law_checks import assert_counts_follow_law
from mlx_lm.generate import generate_step

from mlx_spec import stream_generate

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]


def plain(model, ids, n):
    return [t for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def run(model, tokenizer, ids, draft, n, **kw):
    stream = stream_generate(model, tokenizer, ids, draft, max_tokens=n, **kw)
    tokens = [r.token for r in stream]
    return tokens, stream.stats


@pytest.mark.parametrize("arch", ARCHS)
def test_adaptive_and_auto_greedy_identity(load_model, arch):
    model, tokenizer = load_model(arch)
    draft, _ = load_model(f"{arch}-near")
    ids = tokenizer.encode("import os\nimport sys\n")
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        expected = plain(model, ids, 40)
        for kw in (
            dict(speculative="draft", adaptive=True),
            dict(speculative="tree", adaptive=True),
            dict(speculative="auto"),
        ):
            got, stats = run(model, tokenizer, ids, draft, 40, **kw)
            assert got == expected, kw
        got, stats = run(model, tokenizer, ids, None, 40, speculative="auto")
        assert got == expected
        assert set(stats.auto_rounds) <= {"lookup", "self"}
    finally:
        tokenizer.eos_token_ids = saved


def test_adaptive_stays_within_bounds(load_model):
    model, tokenizer = load_model("qwen2")
    draft, _ = load_model("qwen2-near")
    ids = tokenizer.encode("def fibonacci(n):")
    _, stats = run(
        model,
        tokenizer,
        ids,
        draft,
        80,
        speculative="draft",
        adaptive=True,
        num_draft_tokens=6,
    )
    assert stats.drafted_per_round
    assert all(1 <= g <= 12 for g in stats.drafted_per_round)


def test_auto_uses_every_arm_and_reports_it(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    _, stats = run(model, tokenizer, ids, draft, 60, speculative="auto")
    assert set(stats.auto_rounds) == {"draft", "tree", "lookup"}
    assert all(count >= 2 for count in stats.auto_rounds.values())
    assert sum(stats.auto_rounds.values()) == stats.rounds


@pytest.mark.parametrize(
    "kw",
    [dict(speculative="draft", adaptive=True), dict(speculative="auto")],
    ids=["adaptive", "auto"],
)
def test_sampled_first_tokens_follow_target_law(load_model, kw):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("The quick brown fox")
    logits = model(mx.array([ids]))[0, -1]
    p = np.array(mx.softmax(logits / 1.5), dtype=np.float64)
    mx.random.seed(1)
    runs = 300
    counts = np.zeros(p.size)
    for _ in range(runs):
        stream = stream_generate(
            model, tokenizer, ids, draft, max_tokens=3, temp=1.5, **kw
        )
        counts[next(stream).token] += 1
        stream.close()
    assert_counts_follow_law(counts, p)
