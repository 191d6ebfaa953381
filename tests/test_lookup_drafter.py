"""Prompt lookup in the engine: greedy identity, exact law, no-match fallback."""

import math

import mlx.core as mx
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec import SpecConfig, SpecStats, make_sampler, speculative_generate_step
from mlx_spec.drafters.base import RoundState
from mlx_spec.drafters.lookup import (
    PROBE_EVERY,
    LookupDrafter,
    MatchRates,
    make_lookup_drafter,
)
from mlx_spec.drafters.ngram import extend_periodic
from mlx_spec.models import CachedModel
from mlx_spec.sampling import SamplingParams, processed_logprobs

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]
# Repeats a function with a change: n-grams of the first copy match.
EDIT_PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b, c):\n    return a + b"
)


def plain_tokens(model, ids, max_tokens, **kwargs):
    return [
        t
        for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens, **kwargs)
    ]


def lookup_tokens(model, ids, max_tokens, stats=None, **knobs):
    config = SpecConfig(method="lookup", max_tokens=max_tokens, **knobs)
    steps = speculative_generate_step(mx.array(ids), model, config=config, stats=stats)
    return [t for t, _, _ in steps]


def state_of(seq):
    return RoundState(list(seq), 0, None)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identity_across_architectures(load_model, arch):
    model, tokenizer = load_model(arch)
    ids = tokenizer.encode(EDIT_PROMPT)
    expected = plain_tokens(model, ids, 40)
    for gamma in (1, 4, 8):
        stats = SpecStats()
        assert lookup_tokens(model, ids, 40, stats, num_draft_tokens=gamma) == expected
        assert stats.draft_tokens > 0  # the prompt repeats itself: lookup drafts
        assert stats.draft_forwards == 0


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_mid_round(load_model, max_tokens):
    model, tokenizer = load_model("qwen3")
    ids = tokenizer.encode(EDIT_PROMPT)
    got = lookup_tokens(model, ids, max_tokens, num_draft_tokens=8)
    assert got == plain_tokens(model, ids, max_tokens)


def test_no_match_is_a_plain_step_with_no_wasted_verification(load_model, monkeypatch):
    model, tokenizer = load_model("llama")
    ids = tokenizer.encode("import os")
    widths = []
    call = CachedModel.__call__

    def spy(self, tokens):
        widths.append(int(tokens.shape[0]))
        return call(self, tokens)

    monkeypatch.setattr(CachedModel, "__call__", spy)
    stats = SpecStats()
    # 16-grams cannot repeat within len(ids) + 10 < 17 tokens.
    got = lookup_tokens(model, ids, 10, stats, ngram_min=16, ngram_max=16)
    assert got == plain_tokens(model, ids, 10)
    assert stats.draft_tokens == 0 and stats.accepted_tokens == 0
    assert stats.target_forwards == stats.generated_tokens == 10
    assert widths[-10:] == [1] * 10


def test_plain_rounds_without_a_match_are_queued_and_stay_exact(load_model):
    """Without a match a round's target step is queued before the previous
    sync (no proposal is made for it); the output and the cache after an
    early close are as in plain decoding."""
    model, tokenizer = load_model("llama")
    ids = tokenizer.encode("import os")
    calls = []
    propose = LookupDrafter.propose

    def counting(self, state, gamma):
        calls.append(len(state.seq))
        return propose(self, state, gamma)

    LookupDrafter.propose = counting
    try:
        stats = SpecStats()
        got = lookup_tokens(model, ids, 12, stats, ngram_min=16, ngram_max=16)
        cache = make_prompt_cache(model)
        config = SpecConfig(method="lookup", max_tokens=30, ngram_min=16, ngram_max=16)
        steps = speculative_generate_step(
            mx.array(ids), model, config=config, prompt_cache=cache
        )
        first = [t for _, (t, _, _) in zip(range(5), steps)]
        steps.close()  # a queued step is pending
    finally:
        LookupDrafter.propose = propose
    assert got == plain_tokens(model, ids, 12)
    assert stats.target_forwards == 12 and calls[:1] == [len(ids)]
    assert len(calls) < 12 / 2  # most rounds were queued, not proposed
    assert first == got[:5]
    assert all(c.offset == len(ids) + 5 for c in cache)


def test_proposes_nothing_without_a_match():
    drafter = LookupDrafter(ngram_min=1, ngram_max=3)
    assert drafter.propose(state_of([1, 2, 3, 4, 5]), 4).size == 0
    proposal = drafter.propose(state_of([1, 2, 3, 4, 5, 1, 2, 3]), 4)
    assert proposal.tokens.tolist() == [4, 5, 1, 2] and proposal.logprobs is None


def test_a_match_length_that_keeps_failing_is_kept_out_and_probed_again():
    drafter = LookupDrafter(ngram_min=1, ngram_max=3)
    seq = [1, 2, 3, 4, 5, 2]  # "2" matched once: a 1-token match
    sizes = []
    for _ in range(3 * PROBE_EVERY):
        proposal = drafter.propose(state_of(seq), 4)
        sizes.append(proposal.size)
        drafter.commit(state_of(seq), proposal, 0)  # every first token rejected
    # A fresh 1-token match seldom continues (its prior): it drafts at most 2
    # tokens, then, once rejected, only one round in PROBE_EVERY, one token.
    first_out = sizes.index(0)
    assert 0 < first_out <= 2 and 1 <= sizes[0] <= 2
    assert sizes[:first_out] == sorted(sizes[:first_out], reverse=True)
    later = sizes[first_out:]
    assert sum(later) == len(later) // PROBE_EVERY and set(later) == {0, 1}
    # A longer match has its own record and is still proposed.
    assert drafter.propose(state_of([1, 2, 3, 4, 5, 2, 3, 4]), 2).tokens.tolist() == [
        5,
        2,
    ]
    # Accepted first tokens bring the short match back.
    for _ in range(3 * PROBE_EVERY):
        proposal = drafter.propose(state_of(seq), 4)
        drafter.commit(state_of(seq), proposal, proposal.size)
    assert drafter.propose(state_of(seq), 4).size > 0


def trusted(drafter: LookupDrafter) -> LookupDrafter:
    """``drafter`` after every match length's drafts were all accepted: it
    proposes whole continuations."""
    for n in range(1, 4):
        for _ in range(20):
            drafter.rates.observe(n, 16, 16)
    return drafter


def test_continuation_reaching_the_end_repeats_periodically():
    # The newest "1 2" match continues with "1 2" up to the end of the
    # context: an overlapping copy keeps repeating it.
    drafter = trusted(LookupDrafter(ngram_min=1, ngram_max=2))
    assert drafter.propose(state_of([5, 1, 2, 1, 2]), 5).tokens.tolist() == [
        1,
        2,
        1,
        2,
        1,
    ]
    assert extend_periodic([7], 3) == [7, 7, 7] and extend_periodic([], 3) == []


def test_index_follows_state_without_rescanning():
    drafter = LookupDrafter(ngram_min=1, ngram_max=3)
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 50, 20_000).tolist()
    drafter.propose(state_of(seq), 8)
    costs = []
    for _ in range(20):
        seq = seq + rng.integers(0, 50, 5).tolist()
        start = drafter.index.ops
        drafter.propose(state_of(seq), 8)
        costs.append(drafter.index.ops - start)
    assert len(drafter.index) == len(seq)
    # Five new tokens and one proposal per round: bounded, whatever the length.
    assert max(costs) <= 5 * sum(n + 3 for n in (1, 2, 3)) + sum(
        n + 1 + 8 * (1 + 2 * 8 + 2) for n in (1, 2, 3)
    )


def test_candidates_merge_into_a_tree():
    drafter = trusted(
        LookupDrafter(ngram_min=1, ngram_max=1, max_candidates=3, max_len=3)
    )
    assert drafter.is_tree
    # "7" was followed by "1 2 3" and by "1 5 6": shared first node.
    proposal = drafter.propose(state_of([7, 1, 2, 3, 7, 1, 5, 6, 7]), 16)
    assert proposal.tokens.tolist() == [1, 5, 6, 2, 3]
    assert proposal.parents == [-1, 0, 1, 0, 3]
    # One candidate only: a plain chain.
    assert (
        drafter.propose(state_of([7, 1, 2, 3, 7, 1, 5, 6, 7]), 2).size == 2
    )  # node budget
    # One candidate only: a plain chain.
    drafter = trusted(
        LookupDrafter(ngram_min=1, ngram_max=1, max_candidates=3, max_len=3)
    )
    chain = drafter.propose(state_of([9, 4, 4, 8, 9]), 16)
    assert chain.tokens.tolist() == [4, 4, 8] and chain.parents is None


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_tree_greedy_identity(load_model, arch):
    model, tokenizer = load_model(arch)
    ids = tokenizer.encode(EDIT_PROMPT)
    stats = SpecStats()
    knobs = dict(lookup_candidates=4, num_draft_tokens=6, tree_budget=12)
    assert lookup_tokens(model, ids, 40, stats, **knobs) == plain_tokens(model, ids, 40)
    assert stats.tree_sizes and max(stats.tree_sizes) <= 12


def test_prompt_cache_is_kept_and_reused(load_model):
    model, tokenizer = load_model("phi3")
    first, second = tokenizer.encode(EDIT_PROMPT), tokenizer.encode("\n\ndef add(")
    cache = make_prompt_cache(model)
    config = SpecConfig(method="lookup", max_tokens=12)
    turn1 = [
        t
        for t, _, _ in speculative_generate_step(
            mx.array(first), model, config=config, prompt_cache=cache
        )
    ]
    turn2 = [
        t
        for t, _, _ in speculative_generate_step(
            mx.array(second), model, config=config, prompt_cache=cache
        )
    ]
    assert turn1 == plain_tokens(model, first, 12)
    assert turn2 == plain_tokens(model, first + turn1 + second, 12)
    assert len(cache) == len(model.layers)


def test_sampled_first_token_follows_target_law(load_model):
    """Point-mass proposals: the first token's law is the target's (chi-square),
    and the first draft is accepted with probability p(d)."""
    model, tokenizer = load_model("qwen2")
    ids = tokenizer.encode(EDIT_PROMPT)
    drafter = LookupDrafter()
    first_draft = drafter.propose(state_of(ids), 1).tokens.item()
    logits = model(mx.array([ids]))[0, -1:]
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    p = np.exp(
        np.array(processed_logprobs(lp, SamplingParams(temp=1.0))[0], np.float64)
    )
    mx.random.seed(0)
    runs, counts, accepted = 300, np.zeros(p.size), 0
    config = SpecConfig(method="lookup", max_tokens=2, num_draft_tokens=2)
    for _ in range(runs):
        stats = SpecStats()
        steps = speculative_generate_step(
            mx.array(ids), model, config=config, sampler=make_sampler(1.0), stats=stats
        )
        token, _, _ = next(steps)
        steps.close()
        counts[token] += 1
        accepted += stats.accepted_per_round[0] > 0
    assert_counts_follow_law(counts, p)
    rate, pd = accepted / runs, p[first_draft]
    assert abs(rate - pd) < 4 * math.sqrt(max(pd * (1 - pd), 1e-3) / runs) + 1e-9


@pytest.mark.parametrize(
    "knobs",
    [dict(), dict(adaptive=False), dict(lookup_candidates=4, tree_budget=12)],
    ids=["chain-adaptive", "chain-fixed", "tree"],
)
def test_sampled_stream_follows_target_law(load_model, knobs, monkeypatch):
    """Every sampled token follows the target's exact law given its prefix
    (randomized PIT of a long stream, chi-square with 10 bins)."""
    if "lookup_candidates" in knobs:  # every match proposed: trees get accepted
        monkeypatch.setattr(MatchRates, "worth_proposing", lambda self, n: True)
    model, tokenizer = load_model("gemma")
    ids = tokenizer.encode(EDIT_PROMPT)
    temp, n = 1.5, 200
    mx.random.seed(1)
    stats = SpecStats()
    config = SpecConfig(method="lookup", max_tokens=n, num_draft_tokens=6, **knobs)
    steps = speculative_generate_step(
        mx.array(ids), model, config=config, sampler=make_sampler(temp), stats=stats
    )
    out = [t for t, _, _ in steps]
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert bool(stats.tree_sizes) == ("lookup_candidates" in knobs)  # real trees
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_candidates=0), "max_candidates"),
        (dict(max_len=0), "max_len"),
        (dict(ngram_min=0), "ngram_min"),
        (dict(ngram_max=17), "ngram_max"),
    ],
)
def test_bad_knobs_get_one_line_errors(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        LookupDrafter(**kwargs)
    assert "\n" not in str(err.value)


def test_extra_prompt_cache_entries_are_refused(load_model):
    model, tokenizer = load_model("llama")
    config = SpecConfig(method="lookup")
    with pytest.raises(ValueError, match="keeps no draft cache") as err:
        make_lookup_drafter(config, None, None, make_prompt_cache(model), None, 0)
    assert "\n" not in str(err.value)


def test_logits_processors_applied_per_position(load_model):
    from mlx_lm.sample_utils import make_logits_processors

    model, tokenizer = load_model("llama")
    ids = tokenizer.encode("import os\nimport sys\n")
    processors = make_logits_processors(
        repetition_penalty=1.5, repetition_context_size=8
    )
    expected = plain_tokens(model, ids, 30, logits_processors=processors)
    assert expected != plain_tokens(model, ids, 30)
    for candidates in (1, 4):  # trees fall back to chains with processors
        config = SpecConfig(
            method="lookup", max_tokens=30, lookup_candidates=candidates
        )
        stats = SpecStats()
        steps = speculative_generate_step(
            mx.array(ids),
            model,
            config=config,
            logits_processors=processors,
            stats=stats,
        )
        assert [t for t, _, _ in steps] == expected
        assert stats.draft_tokens > 0
