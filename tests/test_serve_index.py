"""The cross-request index (mlx_spec.serve.index): matches, documents, memory cap."""

import tracemalloc

import numpy as np
import pytest

from mlx_spec.serve.index import CrossRequestIndex


def test_proposes_what_followed_the_tail_in_an_earlier_request():
    index = CrossRequestIndex(1024)
    index.add([1, 2, 3, 4, 5, 6, 7, 8])
    tokens, match = index.propose([9, 9, 3, 4, 5], max_len=3)
    assert tokens == [6, 7, 8] and match == 3


def test_the_longest_match_wins_then_the_newest():
    index = CrossRequestIndex(1024)
    index.add([7, 1, 2, 3, 40, 41])  # matches 4 tokens of the context below
    index.add([1, 2, 3, 50, 51])  # newer, matches only 3
    assert index.propose([7, 1, 2, 3], max_len=2) == ([40, 41], 4)
    assert index.propose([8, 1, 2, 3], max_len=2) == ([50, 51], 3)


def test_proposals_stop_at_the_end_of_their_document():
    index = CrossRequestIndex(1024)
    index.add([1, 2, 3, 4])
    index.add([5, 6, 7])
    assert index.propose([1, 2, 3], max_len=8) == ([4], 3)
    # Document ends are no n-grams: 3, 4 | 5 never matches.
    assert index.propose([3, 4, 5], max_len=8) == ([], 0)


def test_no_match_shorter_than_the_ngram():
    index = CrossRequestIndex(1024, ngram=3)
    index.add([1, 2, 3, 4])
    assert index.propose([2, 3], max_len=4) == ([], 0)
    assert index.propose([9, 2, 3], max_len=4) == ([], 0)


def test_memory_cap_evicts_the_oldest_documents():
    index = CrossRequestIndex(256)
    rng = np.random.default_rng(0)
    first = rng.integers(0, 50_000, size=60).tolist()
    index.add(first)
    assert index.propose(first[:10], max_len=4)[0] == first[10:14]
    for _ in range(40):
        index.add(rng.integers(0, 50_000, size=60).tolist())
        assert len(index) <= 256
    assert index.evicted_tokens > 0 and index.documents == 41
    assert index.propose(first[:10], max_len=4) == ([], 0)  # evicted
    # Every hash entry points at a token still held.
    assert len(index._head) <= len(index)


def test_memory_stays_flat_however_many_requests_are_added():
    """Allocated bytes after 40x the cap in documents equal those after 2x."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 50_000, size=200).tolist() for _ in range(400)]
    tracemalloc.start()
    try:
        index = CrossRequestIndex(2000)
        for doc in docs[:20]:
            index.add(doc)
        early, _ = tracemalloc.get_traced_memory()
        for doc in docs[20:]:
            index.add(doc)
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) <= 2000
    assert late < 1.5 * early, (early, late)
    assert index.nbytes < 2000 * 200


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(max_tokens=10), "max_tokens"),
        (dict(max_tokens=1024, ngram=0), "ngram"),
        (dict(max_tokens=1024, max_match=1), "max_match"),
        (dict(max_tokens=1024, max_occurrences=0), "max_occurrences"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CrossRequestIndex(**kwargs)


def test_token_ids_out_of_range_are_refused():
    with pytest.raises(ValueError, match="token ids"):
        CrossRequestIndex(1024).add([1, -5])
