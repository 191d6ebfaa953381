"""Acceptance rules: named hand-built cases and exact laws by enumeration."""

import itertools
import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_spec.acceptance import (
    acceptance_probability,
    draw_from_probs,
    greedy_accept,
    match_accept,
    one_hot_logprobs,
    recovered_law,
    rejection_accept,
)
from mlx_spec.sampling import SamplingParams, make_sampler, processed_logprobs
from mlx_spec.verify import Law

VOCAB = 5


def _logits_table(seed, depth, vocab=VOCAB, scale=2.0):
    """Random logits for every prefix of length < depth: prefix tuple -> (V,)."""
    rng = np.random.default_rng(seed)
    table = {}
    for n in range(depth + 1):
        for prefix in itertools.product(range(vocab), repeat=n):
            table[prefix] = rng.normal(size=vocab) * scale
    return table


def _law(logits, params):
    lp = mx.array(logits, mx.float32)[None]
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    return processed_logprobs(lp, params)[0]


def test_perfect_match_accepts_all_greedy():
    target = mx.array([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    n, token = greedy_accept(mx.array([1, 0]), target)
    assert (n.item(), token.item()) == (2, 2)


def test_early_mismatch_recovers_target_token():
    target = mx.array([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    n, token = greedy_accept(mx.array([2, 0]), target)
    assert (n.item(), token.item()) == (0, 1)


def test_match_accept_with_empty_draft_is_plain_step():
    n, token = match_accept(mx.array([], mx.uint32), mx.array([7]))
    assert (n.item(), token.item()) == (0, 7)


def test_uniforms_at_the_threshold_decide_acceptance():
    p = mx.log(mx.array([[0.2, 0.8], [0.5, 0.5]]))
    q = mx.log(mx.array([[0.4, 0.6]]))
    ratio = acceptance_probability(mx.array([0]), p, q).item()
    assert ratio == pytest.approx(0.5)
    below, _ = rejection_accept(mx.array([0]), p, q, uniforms=mx.array([0.49]))
    above, token = rejection_accept(mx.array([0]), p, q, uniforms=mx.array([0.51]))
    assert below.item() == 1 and above.item() == 0
    # After rejecting token 0 the residual max(0, p - q) is all on token 1.
    assert token.item() == 1


SETTINGS = [
    SamplingParams(temp=1.0),
    SamplingParams(temp=0.7),
    SamplingParams(temp=1.3, top_p=0.8),
    SamplingParams(temp=1.0, top_k=3),
    SamplingParams(temp=0.9, min_p=0.15),
    SamplingParams(temp=0.8, top_p=0.9, top_k=4, min_p=0.05),
]


# A draft whose law lives on these columns of the vocabulary (zero elsewhere).
COLUMNS = [0, 2, 3]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
@pytest.mark.parametrize("gamma", [1, 2])
@pytest.mark.parametrize("form", ["logprobs", "shifted-target-and-draft-columns"])
def test_round_law_equals_target_law(params, gamma, form):
    """Enumerate every draft and every acceptance outcome of one round.

    The law of the round's output sequence (first ``gamma + 1`` tokens,
    truncated where the round stops) must equal the target's own
    autoregressive law to 1e-6. In the second form the target's rows come
    unnormalised (each shifted by its own constant, as raw logits do) and
    the draft's law is given over its columns only (a vocabulary subset).
    """
    target = _logits_table(1, gamma + 1)
    draft = _logits_table(2, gamma)
    narrow = form != "logprobs"
    if narrow:  # the draft can only propose COLUMNS
        outside = np.setdiff1d(np.arange(VOCAB), COLUMNS)
        for logits in draft.values():
            logits[outside] = -np.inf
    p_law = {k: np.exp(np.array(_law(v, params))) for k, v in target.items()}
    shifts = mx.array(np.random.default_rng(3).normal(size=(gamma + 1, 1)) * 5)
    columns = mx.array(COLUMNS) if narrow else None

    emitted = {}  # output prefix -> probability
    for drafts in itertools.product(range(VOCAB), repeat=gamma):
        q_rows = [_law(draft[drafts[:i]], params) for i in range(gamma)]
        q_prob = math.prod(math.exp(q_rows[i][d].item()) for i, d in enumerate(drafts))
        if q_prob == 0:
            continue
        p_rows = mx.stack([_law(target[drafts[:i]], params) for i in range(gamma + 1)])
        q_stack = mx.stack(q_rows)
        if narrow:
            p_rows, q_stack = p_rows + shifts, q_stack[:, columns]
        ratios = acceptance_probability(
            mx.array(drafts), p_rows, q_stack, columns
        ).tolist()
        reach = 1.0
        for k in range(gamma + 1):
            stop = 1.0 - ratios[k] if k < gamma else 1.0
            law = recovered_law(p_rows, q_stack, mx.array(k), draft_columns=columns)
            law = np.array(law)
            for token in range(VOCAB):
                out = drafts[:k] + (token,)
                emitted[out] = (
                    emitted.get(out, 0.0) + q_prob * reach * stop * law[token]
                )
            if k < gamma:
                reach *= ratios[k]

    # Continue each round's output with the target itself up to gamma + 1
    # tokens: every full sequence must then have the target's probability.
    def target_prob(seq, start=0):
        return math.prod(p_law[seq[:i]][seq[i]] for i in range(start, len(seq)))

    first = np.zeros(VOCAB)
    for full in itertools.product(range(VOCAB), repeat=gamma + 1):
        prob = sum(
            emitted.get(full[:m], 0.0) * target_prob(full, m)
            for m in range(1, gamma + 2)
        )
        assert prob == pytest.approx(target_prob(full), abs=1e-6), full
        first[full[0]] += prob
    np.testing.assert_allclose(first, p_law[()], atol=1e-6)


@pytest.mark.parametrize("params", SETTINGS[:3], ids=str)
def test_point_mass_proposals_keep_target_law(params):
    """Lookup proposals are deterministic (q is a point mass): still exact."""
    p_row = _law(_logits_table(3, 0)[()], params)
    p_rows = mx.stack([p_row, p_row])
    for d in range(VOCAB):
        q = one_hot_logprobs(mx.array([d]), VOCAB)
        ratio = acceptance_probability(mx.array([d]), p_rows, q).item()
        law = np.array(recovered_law(p_rows, q, mx.array(0)))
        total = np.zeros(VOCAB)
        total[d] += ratio
        total += (1 - ratio) * law
        np.testing.assert_allclose(total, np.exp(np.array(p_row)), atol=1e-6)


def test_draw_from_probs_inverts_the_cdf_and_never_draws_zero_mass():
    """Inverse transform sampling: N evenly spread uniforms draw each token
    within one of N p times; tokens without mass (at either end too) are
    never drawn, not even by uniforms at 0 or just below 1."""
    probs = np.array([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    n = 1000
    uniforms = mx.array((np.arange(n) + 0.5) / n, mx.float32)
    rows = mx.broadcast_to(mx.array(probs * 3.0, mx.float32), (n, probs.size))
    counts = np.bincount(np.array(draw_from_probs(rows, uniforms)), minlength=6)
    assert np.abs(counts - n * probs).max() <= 1
    edges = mx.array([0.0, 1.0 - 2.0**-24, 0.9999], mx.float32)
    drawn = draw_from_probs(mx.broadcast_to(rows[0], (3, 6)), edges).tolist()
    assert drawn == [1, 4, 4]


def _spy(monkeypatch, owner, name):
    """Record the calls of ``owner.name`` (their first argument)."""
    calls, real = [], getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def test_a_sampled_round_draws_its_last_token_without_gumbel_noise(monkeypatch):
    """The recovered or bonus token comes from one uniform and a cumulative
    sum, not from ``categorical`` (V Gumbel variates over the log of the
    residual law)."""
    rng = np.random.default_rng(4)
    logits = mx.array(rng.normal(size=(3, 50)).astype(np.float32))
    q = processed_logprobs(mx.array(rng.normal(size=(2, 50)), mx.float32), SETTINGS[1])
    categorical = _spy(monkeypatch, mx.random, "categorical")
    for seed in range(5):
        mx.random.seed(seed)
        mx.eval(Law(SETTINGS[1]).accept_rows(mx.array([1, 2]), logits, q))
    assert categorical == []


def test_a_plain_sampled_step_draws_as_mlx_lm_without_normalising(monkeypatch):
    """A round without drafts draws what mlx_lm's sampler draws from the same
    random state, and normalises nothing on the way (the draw needs no
    normalised law)."""
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    logits = mx.array(np.random.default_rng(5).normal(size=(1, 64)) * 3, mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    empty = mx.zeros((0,), mx.uint32)
    for params in (SamplingParams(temp=0.7), SamplingParams(temp=0.9, top_k=5)):
        sampler = mlx_lm_sampler(params.temp, top_k=params.top_k)
        for seed in range(8):
            mx.random.seed(seed)
            want = sampler(logprobs).item()
            mx.random.seed(seed)
            normalised = _spy(monkeypatch, mx, "logsumexp")
            n, token = Law(params).accept_rows(empty, logprobs)
            assert (n.item(), token.item()) == (0, want)
            assert normalised == []
            monkeypatch.undo()


def test_processed_law_matches_mlx_lm_sampler_frequencies():
    """Chi-square: mlx_lm's make_sampler draws from our processed law."""
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    logits = mx.array([[2.0, 1.5, 0.3, -0.5, 1.0, 0.0, -2.0, 0.7]])
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    params = SamplingParams(temp=0.8, top_p=0.9, min_p=0.05, top_k=5)
    law = np.exp(np.array(processed_logprobs(logprobs, params)[0]))
    sampler = mlx_lm_sampler(0.8, 0.9, 0.05, 1, top_k=5)
    mx.random.seed(0)
    draws = 20000
    samples = sampler(mx.broadcast_to(logprobs, (draws, 8)))
    counts = np.bincount(np.array(samples), minlength=8)
    assert counts[law == 0].sum() == 0
    keep = law > 0
    expected = law[keep] * draws
    chi2 = ((counts[keep] - expected) ** 2 / expected).sum()
    # 99.9% quantile of chi-square with <= 4 degrees of freedom is 18.5.
    assert chi2 < 18.5, (counts, expected)


def test_our_make_sampler_carries_its_law():
    sampler = make_sampler(0.7, top_p=0.9)
    assert sampler.sampling_params == SamplingParams(0.7, 0.9, 0.0, 0, 1)
    assert make_sampler(0.0)(mx.array([[0.0, 3.0, 1.0]])).item() == 1


def test_rejection_sampling_first_token_frequencies():
    """End to end with real random draws: the first token follows p, and the
    first draft token is accepted with probability sum(min(p, q))."""
    mx.random.seed(1)
    p = mx.log(mx.array([0.5, 0.2, 0.2, 0.1]))
    q = mx.log(mx.array([0.1, 0.6, 0.2, 0.1]))
    draws = 5000
    first, accepted = np.zeros(4), 0
    drafts = mx.random.categorical(mx.broadcast_to(q, (draws, 4)))
    for start in range(0, draws, 1000):
        batch = []
        for d in drafts[start : start + 1000].tolist():
            n, t = rejection_accept(mx.array([d]), mx.stack([p, p]), q[None])
            batch.append((d, n, t))
        mx.eval([x[1:] for x in batch])
        for d, n, t in batch:
            n = n.item()
            accepted += n
            first[d if n else t.item()] += 1
    expected = np.exp(np.array(p)) * draws
    chi2 = ((first - expected) ** 2 / expected).sum()
    assert chi2 < 16.3  # 99.9% quantile, 3 degrees of freedom
    overlap = np.minimum(np.exp(np.array(p)), np.exp(np.array(q))).sum()
    rate = accepted / draws
    assert abs(rate - overlap) < 4 * math.sqrt(overlap * (1 - overlap) / draws)
