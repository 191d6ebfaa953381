"""Tests for the prompt-lookup n-gram index and the token-tree merge."""

import random

import pytest

from mlx_spec.drafters.ngram import NGramIndex, build_token_tree


def brute_force_propose(seq, ngram_min, ngram_max, max_occ, max_len, max_cand):
    """Reference: rescan the whole context, following the documented rule."""
    out, seen_starts, seen = [], set(), set()
    length = len(seq)
    for n in range(ngram_max, ngram_min - 1, -1):
        if length <= n:
            continue
        suffix = seq[length - n :]
        matches = [p for p in range(length - n - 1, -1, -1) if seq[p : p + n] == suffix]
        for p in matches[:max_occ]:
            start = p + n
            if start in seen_starts:
                continue
            seen_starts.add(start)
            cont = tuple(seq[start : start + max_len])
            if cont in seen:
                continue
            seen.add(cont)
            out.append(list(cont))
            if len(out) == max_cand:
                return out
    return out


def test_no_match_proposes_nothing():
    index = NGramIndex([1, 2, 3, 4, 5], ngram_min=1, ngram_max=3)
    assert index.propose(max_len=4, max_candidates=3) == []
    assert index.last_match_len == 0
    assert NGramIndex().propose() == []
    assert NGramIndex([7]).propose() == []


def test_longest_match_wins_and_most_recent_first():
    # "1 2 3" occurs with continuation 9, "2 3" also with 8 (more recent).
    index = NGramIndex([1, 2, 3, 9, 9, 5, 2, 3, 8, 1, 2, 3], ngram_max=3)
    assert index.propose(max_len=2, max_candidates=1) == [[9, 9]]
    assert index.last_match_len == 3
    props = index.propose(max_len=2, max_candidates=3)
    assert props == [[9, 9], [8, 1]]


def test_continuation_truncated_at_end_of_context():
    index = NGramIndex([5, 6, 5], ngram_min=1, ngram_max=2)
    assert index.propose(max_len=10) == [[6, 5]]


def test_extend_matches_construction():
    rng = random.Random(1)
    seq = [rng.randrange(4) for _ in range(300)]
    a = NGramIndex(seq, ngram_min=2, ngram_max=4)
    b = NGramIndex(seq[:7], ngram_min=2, ngram_max=4)
    i = 7
    while i < len(seq):
        k = rng.randrange(1, 6)
        b.extend(seq[i : i + k])
        i += k
    assert len(a) == len(b) == len(seq)
    assert a.propose(6, 4) == b.propose(6, 4)


@pytest.mark.parametrize("seed", range(40))
def test_same_proposals_as_brute_force(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 12])
    ngram_max = rng.randint(1, 5)
    ngram_min = rng.randint(1, ngram_max)
    max_occ = rng.choice([1, 2, 8])
    index = NGramIndex(
        [rng.randrange(alphabet) for _ in range(rng.randrange(0, 20))],
        ngram_min=ngram_min,
        ngram_max=ngram_max,
        max_occurrences=max_occ,
    )
    seq = index.tokens
    for _ in range(60):
        max_len = rng.randint(1, 6)
        max_cand = rng.randint(1, 5)
        expect = brute_force_propose(
            seq, ngram_min, ngram_max, max_occ, max_len, max_cand
        )
        assert index.propose(max_len, max_cand) == expect
        # Accept a prefix of the first proposal plus one fresh token, as a
        # real round would, or random tokens.
        if expect and rng.random() < 0.5:
            new = expect[0][: rng.randint(0, len(expect[0]))]
        else:
            new = []
        new = new + [rng.randrange(alphabet)]
        index.extend(new)
        seq = seq + new
    assert index.tokens == seq


def _ops_per_round(context_len, rounds=50, **knobs):
    rng = random.Random(0)
    index = NGramIndex([rng.randrange(3) for _ in range(context_len)], **knobs)
    worst = 0
    for _ in range(rounds):
        start = index.ops
        index.propose(max_len=8, max_candidates=4)
        index.extend([rng.randrange(3) for _ in range(9)])
        worst = max(worst, index.ops - start)
    return worst


def test_ops_per_round_independent_of_context_length():
    knobs = dict(ngram_min=1, ngram_max=4, max_occurrences=8)
    small = _ops_per_round(100, **knobs)
    large = _ops_per_round(100_000, **knobs)
    # Analytic bound: extend 9 tokens + propose, no term in the context length.
    n_range = range(1, 5)
    extend_bound = 9 * sum(n + 3 for n in n_range)
    propose_bound = sum(n + 1 + 8 * (1 + 2 * 8 + 2) for n in n_range)
    assert 0 < small <= extend_bound + propose_bound
    assert 0 < large <= extend_bound + propose_bound
    assert large <= 1.1 * small


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(ngram_min=0), "ngram_min"),
        (dict(ngram_min=4, ngram_max=3), "ngram_min"),
        (dict(ngram_max=0), "ngram_max"),
        (dict(ngram_max=17), "ngram_max"),
        (dict(ngram_max=2.0), "ngram_max"),
        (dict(max_occurrences=0), "max_occurrences"),
    ],
)
def test_knob_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field + r".*\["):
        NGramIndex([1, 2], **kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_len=0), "max_len"),
        (dict(max_len=10_000), "max_len"),
        (dict(max_candidates=0), "max_candidates"),
    ],
)
def test_propose_knob_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field + r".*\["):
        NGramIndex([1, 2, 1]).propose(**kwargs)


def _paths(tokens, parents):
    """Token path from the root to every node."""
    paths = []
    for i, p in enumerate(parents):
        paths.append((paths[p] if p >= 0 else ()) + (tokens[i],))
    return paths


def test_tree_merges_shared_prefixes():
    tokens, parents = build_token_tree([[1, 2, 3], [1, 2, 4], [1, 5], [6]])
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert parents == [-1, 0, 1, 1, 0, -1]


def test_tree_single_candidate_is_a_chain():
    assert build_token_tree([[4, 4, 4]]) == ([4, 4, 4], [-1, 0, 1])
    assert build_token_tree([]) == ([], [])


def test_tree_budget_truncates_later_candidates():
    tokens, parents = build_token_tree([[1, 2, 3], [1, 7, 8], [9]], max_nodes=4)
    assert tokens == [1, 2, 3, 7]
    assert parents == [-1, 0, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_tree_random_candidates(seed):
    rng = random.Random(seed)
    cands = [
        [rng.randrange(3) for _ in range(rng.randint(1, 6))]
        for _ in range(rng.randint(1, 8))
    ]
    tokens, parents = build_token_tree(cands)
    assert len(tokens) == len(parents)
    assert all(-1 <= p < i for i, p in enumerate(parents))
    paths = _paths(tokens, parents)
    # Every node is a distinct path (shared prefixes merged) ...
    assert len(set(paths)) == len(paths)
    # ... and the nodes are exactly the prefixes of the candidates.
    prefixes = {tuple(c[:k]) for c in cands for k in range(1, len(c) + 1)}
    assert set(paths) == prefixes
