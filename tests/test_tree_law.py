"""Sampled token trees follow the target's exact law; tree drafting is deterministic.

The law tests run the whole engine (``method="tree"``, temperature > 0) and
compare what it emits with the target's law computed exactly: the joint law
of the first three tokens on an 8-token vocabulary (chi-square over all 512
sequences), and a long stream on a test checkpoint (randomized PIT).
"""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.drafters import tree as tree_drafter
from mlx_spec.drafters.base import RoundState
from mlx_spec.drafters.tree import TreeDrafter, select_budget, top_children
from mlx_spec.engine import speculative_events
from mlx_spec.models import CachedModel, KVSettings
from mlx_spec.testing import tiny_llama

VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]
TEMP = 1.0
SHAPES = {
    "dynamic": dict(tree_budget=6, tree_top_k=3, tree_depth=3),
    "static": dict(tree_choices=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
}


@pytest.fixture(scope="module")
def tiny_pair():
    target = tiny_llama(VOCAB)
    draft = tiny_llama(VOCAB)  # same body, perturbed head: close, not equal
    draft.lm_head.weight = target.lm_head.weight + 0.1 * mx.random.normal(
        target.lm_head.weight.shape, key=mx.random.key(1)
    )
    mx.eval(draft.parameters())
    return target, draft


def _exact_law_of_three(model) -> np.ndarray:
    """``(V, V, V)``: the target's probability of each first three tokens."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    batch = mx.array([PROMPT + list(p) for p in pairs])
    probs = mx.softmax(model(batch)[:, -3:] / TEMP, axis=-1)
    probs = np.array(probs, dtype=np.float64)  # (V*V, 3, V)
    law = np.empty((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        law[a, b, :] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return law


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_tree_sampled_first_three_tokens_follow_exact_law(tiny_pair, shape):
    """Chi-square of 200 sampled 3-token openings against the exact joint law.

    The first round of a tree can emit all three tokens, so this checks the
    choices made at non-root nodes too (a bug that replaced them by argmax
    fails it by a wide margin).
    """
    target, draft = tiny_pair
    law = _exact_law_of_three(target)
    assert law.max() < 0.1  # spread out: every node choice matters
    mx.random.seed(7)
    runs, counts, accepted = 200, np.zeros(VOCAB**3), 0
    config = SpecConfig(method="tree", max_tokens=3, temp=TEMP, adaptive=False)
    config = SpecConfig(**{**config.as_dict(), **SHAPES[shape]})
    for _ in range(runs):
        stats = SpecStats()
        events = speculative_events(
            mx.array(PROMPT), target, draft, config=config, stats=stats
        )
        a, b, c = (e.token for e in events)
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        accepted += stats.accepted_tokens
    assert accepted > runs // 2  # drafts were accepted, deeper nodes were used
    assert_counts_follow_law(counts, law.reshape(-1))


def test_tree_sampled_stream_follows_target_law(load_model):
    """A long sampled stream from the tree method: randomized PIT chi-square
    and the standardised log-likelihood, against the exact law at each prefix."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    temp, n = 1.0, 240
    mx.random.seed(3)
    stats = SpecStats()
    config = SpecConfig(method="tree", max_tokens=n, temp=temp, adaptive=False)
    out = [
        e.token
        for e in speculative_events(
            mx.array(ids), model, draft, config=config, stats=stats
        )
    ]
    assert len(out) == n and stats.accepted_tokens > n // 4
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


def test_select_budget_breaks_ties_by_index():
    scores = mx.array([0.0, -1.0, -1.0, -1.0, -mx.inf, -mx.inf])
    assert select_budget(scores, 3).tolist() == [0, 1, 2]
    assert select_budget(scores, 5).tolist() == [0, 1, 2, 3, 4]
    assert select_budget(mx.full((6,), -mx.inf), 2).tolist() == [0, 1]
    assert select_budget(scores, 10).tolist() == list(range(6))


def test_select_budget_ranks_invalid_nodes_last():
    scores = mx.array([-3.0, -1.0, -2.0, -0.5])
    valid = mx.array([True, False, True, False])
    assert select_budget(scores, 2, valid).tolist() == [0, 2]
    assert select_budget(scores, 3, valid).tolist() == [0, 2, 3]


def test_top_children_match_a_full_sort():
    logprobs = mx.random.normal((3, 50), key=mx.random.key(0))
    tokens, values = top_children(logprobs, 5)
    expected = mx.argsort(-logprobs, axis=-1)[:, :5]
    assert mx.array_equal(tokens, expected).item()
    assert mx.array_equal(values, mx.take_along_axis(logprobs, expected, -1)).item()
    assert top_children(logprobs[:, :4], 9)[0].shape == (3, 4)


def _proposal(draft, budget, **knobs):
    drafter = TreeDrafter(
        CachedModel(draft, None, KVSettings(), "draft"), VOCAB, **knobs
    )
    drafter.prefill(mx.array(PROMPT[:-1]), 64)
    proposal = drafter.propose(RoundState(PROMPT, 0, None), budget)
    mx.eval(proposal.tokens, proposal.sync_data)
    tree = proposal.tree
    return [
        x.tolist()
        for x in (proposal.tokens, proposal.sync_data, tree.parents, tree.depth)
    ]


@pytest.mark.parametrize("budget", [1, 3, 7, 20])
def test_cutting_the_candidate_pool_keeps_the_same_tree(tiny_pair, monkeypatch, budget):
    """Cutting the pool at every level or only at the end picks the same nodes."""
    _, draft = tiny_pair
    knobs = dict(top_k=3, depth=4)
    monkeypatch.setattr(tree_drafter, "POOL_CAP", 10**6)
    uncut = _proposal(draft, budget, **knobs)
    monkeypatch.setattr(tree_drafter, "POOL_CAP", 1)
    cut = _proposal(draft, budget, **knobs)
    assert cut == uncut
    tokens, _, parents, depth = cut
    assert len(tokens) == min(budget, 3 + 3 * 9)
    assert all(p < i for i, p in enumerate(parents))
