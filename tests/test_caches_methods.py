"""Every method on every model family: greedy identity, prompt caches, sampled law.

The families are the attention-only test checkpoints and the rollback
families (recurrent, hybrid and sliding-window layers, ``mlx_spec.caches``).
Each test records ``support = "<family>:<method>"``; ``tests/support_table.py``
runs these tests and writes the README's table of supported families and
methods from the cases that passed.
"""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import ArraysCache, RotatingKVCache, make_prompt_cache
from mlx_lm.utils import _get_classes

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.caches import copy_states, leaf_caches, set_states
from mlx_spec.drafters.registry import FACTORIES as DRAFTER_FACTORIES
from mlx_spec.drafters.self_spec import make_self_drafter
from mlx_spec.engine import speculative_events
from mlx_spec.models import num_caches
from mlx_spec.testing import ALL_ARCHITECTURES, PROMPTS, ROLLBACK_ARCHITECTURES
from mlx_spec.testing.checkpoints import init_param
from mlx_spec.testing.configs import model_config

FAMILIES = ALL_ARCHITECTURES
METHODS = ("draft", "tree", "lookup", "self", "auto")
WITH_DRAFT_MODEL = ("draft", "tree", "auto")
GAMMAS = (1, 2, 4)
# A prompt that repeats itself, so lookup finds n-grams to propose from the start.
PROMPT = PROMPTS[0] + "\n    return n\n" + PROMPTS[0] + "\n    return n\n" + PROMPTS[0]
TOLERANCE = 1e-4


@pytest.fixture
def always_draft(monkeypatch):
    """``--speculative self`` drafts even where its search says it does not pay
    (random test models accept little), so its rounds are exercised."""

    def factory(config, target, draft_model, cache, kv, vocab_size):
        drafter = make_self_drafter(config, target, draft_model, cache, kv, vocab_size)
        drafter.min_speedup = 0.0
        return drafter

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)


def _models(load_model, family, method):
    model, tokenizer = load_model(family)
    draft = load_model(f"{family}-near")[0] if method in WITH_DRAFT_MODEL else None
    return model, draft, tokenizer


def _run(model, draft, ids, method, gamma, max_tokens, stats=None, **kwargs):
    config = SpecConfig(
        method=method, num_draft_tokens=gamma, max_tokens=max_tokens, adaptive=False
    )
    return speculative_events(
        mx.array(ids), model, draft, config=config, stats=stats, **kwargs
    )


def _plain(model, ids, max_tokens):
    return [t for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens)]


def _tokens_until(events, stop):
    """The tokens of ``events``, the first ``stop`` of them (all for ``None``); closes it."""
    got = []
    for event in events:
        got.append(event.token)
        if len(got) == stop:
            break
    events.close()
    return got


@pytest.mark.parametrize("family, method", list(itertools.product(FAMILIES, METHODS)))
def test_greedy_output_equals_plain_decoding(
    load_model, always_draft, record_property, family, method
):
    """Token for token, at several γ, with drafts proposed (and some rejected)."""
    record_property("support", f"{family}:{method}")
    model, draft, tokenizer = _models(load_model, family, method)
    ids = tokenizer.encode(PROMPT)
    expected = _plain(model, ids, 24)
    drafted = 0
    for gamma in GAMMAS:
        stats = SpecStats()
        got = [e.token for e in _run(model, draft, ids, method, gamma, 24, stats)]
        assert got == expected, (gamma, stats.note)
        drafted += stats.draft_tokens
    assert drafted > 0
    if stats.note:  # e.g. a tree verified as chains
        record_property("note", stats.note)
    if method == "auto":  # without a draft model its arms are lookup and self
        got = [e.token for e in _run(model, None, ids, method, 2, 24)]
        assert got == expected


def _states_close(a, b):
    return all(
        x is None and y is None or mx.abs(x - y).max().item() < TOLERANCE
        for x, y in zip(a, b)
    )


def assert_cache_holds(model, cache, tokens):
    """``cache`` holds exactly ``tokens``: the same state as a fresh forward of
    them (recurrent states, the sliding window, the KV entries) and the same
    next-token logits."""
    fresh = make_prompt_cache(model)
    model(mx.array([tokens]), cache=fresh)
    for c, f in zip(leaf_caches(cache), leaf_caches(fresh)):
        assert type(c) is type(f)
        if isinstance(c, ArraysCache):
            assert _states_close(c.cache, f.cache)
            continue
        assert c.offset == f.offset == len(tokens)
        if isinstance(c, RotatingKVCache):
            size = min(c.max_size, len(tokens))
            keys = [x._temporal_order(x.keys)[..., -size:, :] for x in (c, f)]
            assert _states_close(*keys)
        else:
            assert _states_close(c.keys[..., : c.offset, :], f.keys[..., : f.offset, :])
    saved = copy_states(cache)  # the probe must leave the cache as it was
    probe = mx.array([[tokens[0]]])
    got, want = model(probe, cache=cache), model(probe, cache=fresh)
    assert mx.abs(got - want).max().item() < TOLERANCE
    set_states(cache, saved)


@pytest.mark.parametrize("family, method", list(itertools.product(FAMILIES, METHODS)))
def test_prompt_cache_after_a_call_and_an_early_close(
    load_model, always_draft, record_property, family, method
):
    """The prompt cache equals plain decoding's after a whole call and after a
    generator closed mid-round, and the next turn continues exactly."""
    record_property("support", f"{family}:{method}")
    model, draft, tokenizer = _models(load_model, family, method)
    cache = make_prompt_cache(model)
    if draft is not None:
        cache += make_prompt_cache(draft)
    split = num_caches(model)
    history = []
    for turn, (prompt, stop) in enumerate(
        [(PROMPTS[0], None), ("\n\nclass A:", 3), ("\n", None)]
    ):
        ids = tokenizer.encode(prompt)
        events = _run(model, draft, ids, method, 3, 8, prompt_cache=cache)
        got = _tokens_until(events, stop)
        assert got == _plain(model, history + ids, len(got)), turn
        history += ids + got
        assert_cache_holds(model, cache[:split], history)
        if draft is not None:
            assert_cache_holds(draft, cache[split:], history)


@pytest.mark.parametrize("method", ["tree", "auto"])
def test_a_call_whose_one_round_drafts_nothing_keeps_the_draft_cache(
    load_model, monkeypatch, method
):
    """A round with one token left drafts nothing; a tree arm must not rewind
    the draft cache to an earlier round's prefix then (one-token calls, where
    every round is such a round, over several turns of one prompt cache)."""
    from mlx_spec.drafters.auto import AutoDrafter

    monkeypatch.setattr(AutoDrafter, "_pick", lambda self: "tree")
    model, draft, tokenizer = _models(load_model, "llama", method)
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    split = num_caches(model)
    history = []
    for turn, (prompt, n) in enumerate([(PROMPTS[0], 6), ("\n", 1), ("\n", 1)]):
        ids = tokenizer.encode(prompt)
        got = [
            e.token for e in _run(model, draft, ids, method, 3, n, prompt_cache=cache)
        ]
        assert got == _plain(model, history + ids, n), turn
        history += ids + got
        assert_cache_holds(model, cache[:split], history)
        assert_cache_holds(draft, cache[split:], history)


def _exact_stream_check(model, ids, out, temp):
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    return stream_statistics(laws, np.array(out))


@pytest.mark.parametrize(
    "family, method",
    [(f, "draft") for f in ROLLBACK_ARCHITECTURES]
    + [("qwen3_next", "self"), ("mamba2", "self")],
)
def test_sampled_stream_follows_the_target_law(
    load_model, always_draft, record_property, family, method
):
    """A long sampled stream (many partial acceptances, so many rewinds):
    randomized PIT chi-square and standardised log-likelihood against the
    target's exact law at each prefix."""
    record_property("support", f"{family}:{method}")
    model, draft, tokenizer = _models(load_model, family, method)
    ids = tokenizer.encode(PROMPTS[0])
    temp, n = 1.0, 96
    mx.random.seed(11)
    stats = SpecStats()
    config = SpecConfig(
        method=method, num_draft_tokens=3, max_tokens=n, temp=temp, adaptive=False
    )
    out = [
        e.token
        for e in speculative_events(
            mx.array(ids), model, draft, config=config, stats=stats
        )
    ]
    assert len(out) == n and stats.accepted_tokens > 0
    assert any(a < d for a, d in zip(stats.accepted_per_round, stats.drafted_per_round))
    chi2, z = _exact_stream_check(model, ids, out, temp)
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


VOCAB = 8
TINY_PROMPT = [3, 1, 4, 1, 5]


def _tiny(arch, seed, head_noise=0.0):
    """A tiny ``arch`` model over 8 tokens whose logits spread over the vocabulary
    (sliding windows of 2, so the 5-token prompt already fills them)."""
    config = model_config(
        arch, hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1, vocab_size=8
    )
    for fields in (config, config.get("text_config", {})):
        if "sliding_window" in fields:
            fields["sliding_window"] = 2
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = []
    for name, value in tree_flatten(model.parameters()):
        w = init_param(name, value.shape, arch=arch, head_scale=1.5, seed=seed)
        if name.endswith("lm_head.weight") and head_noise:
            rng = np.random.default_rng(seed + 1)
            w = w + head_noise * rng.standard_normal(w.shape).astype(np.float32)
        weights.append((name, mx.array(w)))
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    return model


def _exact_law_of_three(model):
    """``(V, V, V)``: the target's probability of each first three tokens."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    batch = mx.array([TINY_PROMPT + list(p) for p in pairs])
    probs = np.array(mx.softmax(model(batch)[:, -3:], axis=-1), dtype=np.float64)
    law = np.empty((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        law[a, b, :] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return law


@pytest.mark.parametrize("arch", ["qwen3_next"])
def test_sampled_first_three_tokens_follow_the_exact_law(record_property, arch):
    """Chi-square of 200 sampled 3-token openings against the exact joint law;
    a round that rejects a draft is followed by one on the rewound caches."""
    record_property("support", f"{arch}:draft")
    target, draft = _tiny(arch, 0), _tiny(arch, 0, head_noise=0.3)
    law = _exact_law_of_three(target)
    assert law.max() < 0.2  # spread out: every choice matters
    mx.random.seed(5)
    runs, counts, rounds = 200, np.zeros(VOCAB**3), 0
    config = SpecConfig(method="draft", num_draft_tokens=2, max_tokens=3, temp=1.0)
    config = SpecConfig(**{**config.as_dict(), "adaptive": False})
    for _ in range(runs):
        stats = SpecStats()
        events = speculative_events(
            mx.array(TINY_PROMPT), target, draft, config=config, stats=stats
        )
        a, b, c = (e.token for e in events)
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        rounds += stats.rounds
    assert rounds > runs  # rejections happened: later rounds ran on rewound caches
    assert_counts_follow_law(counts, law.reshape(-1))


def test_queued_plain_rounds_stay_exact_and_keep_no_growing_journal(
    load_model, monkeypatch
):
    """Self-speculation that never drafts runs plain rounds whose target step is
    queued before the previous sync: still exact, and each round's mark drops
    the last round's journal (no history piles up)."""
    from mlx_spec.caches import capture

    def never_drafts(config, target, draft_model, cache, kv, vocab_size):
        drafter = make_self_drafter(config, target, draft_model, cache, kv, vocab_size)
        drafter.min_speedup = float("inf")
        return drafter

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", never_drafts)
    model, tokenizer = load_model("qwen3_next")
    ids = tokenizer.encode(PROMPTS[0])
    got, longest = [], 0
    for event in _run(model, None, ids, "self", 4, 32):
        got.append(event.token)
        journals = list(capture._ACTIVE.values())
        longest = max([longest] + [len(getattr(j, "calls", [])) for j in journals])
    assert got == _plain(model, ids, 32)
    assert longest <= 2


@pytest.mark.parametrize("family", ["llama", "qwen3_next", "gemma3"])
def test_an_adaptive_draft_pauses_for_plain_rounds_and_catches_up(
    load_model, monkeypatch, family
):
    """γ 0 rounds of ``--speculative draft`` are plain steps, queued before the
    last sync; the next drafting round first feeds the draft what it missed.
    The output equals plain decoding's and both caches hold exactly the text,
    after a whole call and after an early close."""
    from mlx_spec.adaptive import AdaptiveController
    from mlx_spec.planner import RoundPlanner

    model, draft, tokenizer = _models(load_model, family, "draft")
    gammas = itertools.cycle([0, 0, 3, 0, 2, 0, 0, 0, 1])
    monkeypatch.setattr(AdaptiveController, "choose", lambda self: next(gammas))
    queued = []
    queues = RoundPlanner.queues_plain_round
    monkeypatch.setattr(
        RoundPlanner,
        "queues_plain_round",
        lambda self, seq: queued.append(queues(self, seq)) or queued[-1],
    )
    split = num_caches(model)
    for stop in (None, 9):
        cache = make_prompt_cache(model) + make_prompt_cache(draft)
        ids = tokenizer.encode(PROMPTS[0])
        stats = SpecStats()
        config = SpecConfig(method="draft", num_draft_tokens=3, max_tokens=24)
        events = speculative_events(
            mx.array(ids), model, draft, config=config, stats=stats, prompt_cache=cache
        )
        got = _tokens_until(events, stop)
        assert got == _plain(model, ids, len(got))
        assert stats.rounds > len(stats.drafted_per_round) > 0  # plain rounds too
        assert_cache_holds(model, cache[:split], ids + got)
        assert_cache_holds(draft, cache[split:], ids + got)
    assert any(queued)


def test_under_auto_a_draft_arm_keeps_drafting_and_alone_it_may_pause():
    from types import SimpleNamespace

    from mlx_spec.drafters.model import ModelDrafter
    from mlx_spec.planner import make_controller

    config = SpecConfig(method="draft", num_draft_tokens=4)
    arm = ModelDrafter(SimpleNamespace(), vocab_size=8, step_cost=0.1)
    assert make_controller(config, arm).gamma_min == 0
    assert make_controller(config, arm, alone=False).gamma_min == 1
