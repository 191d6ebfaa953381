"""Which corpus shards a run trains on (``--corpus-select``): unseen shards first,
then a seeded replay of seen ones, within the budget; what a drafter has seen,
from new and old learning-curve points."""

import pytest

from mlx_spec.train.corpus_select import (
    parse_ranges,
    ranges_text,
    seen_shards,
    select_shards,
)

# Shard number -> training tokens: ten shards of 10 tokens, a held-out-only one (5).
TOKENS = {**{n: 10 for n in range(10)}, 5: 0}


def test_ranges_round_trip_and_read_compactly():
    numbers = [0, 1, 2, 5, 7, 8, 12]
    assert ranges_text(numbers) == "0-2,5,7-8,12"
    assert parse_ranges(ranges_text(numbers)) == set(numbers)
    assert ranges_text([]) == "" and parse_ranges("") == set()


def test_newest_takes_unseen_shards_first_then_replays_seen_ones_within_the_budget():
    seen = {0, 1, 2, 3, 4, 6}
    picked = select_shards(TOKENS, "newest", 50, seen=seen, seed=3)
    assert picked.new == [7, 8, 9]  # every unseen shard with training tokens
    assert set(picked.replay) <= seen and len(picked.replay) == 2
    assert picked.shards == sorted(picked.new + picked.replay)
    assert (picked.new_tokens, picked.replay_tokens) == (30, 20)
    record = picked.record(50, 3)
    assert record["seen_tokens"] == 60 + 30  # six seen shards of 10, then three new
    assert (record["new_shards"], record["replay_shards"], record["seed"]) == (3, 2, 3)
    # The replay sample is seeded: the same seed gives the same shards, others differ.
    again = select_shards(TOKENS, "newest", 50, seen=seen, seed=3)
    assert again.replay == picked.replay
    samples = {
        tuple(select_shards(TOKENS, "newest", 50, seen=seen, seed=s).replay)
        for s in range(8)
    }
    assert len(samples) > 1


def test_a_budget_below_the_unseen_shards_takes_the_oldest_of_them_and_no_replay():
    picked = select_shards(TOKENS, "newest", 15, seen={0, 1}, seed=0)
    assert picked.new == [2, 3] and picked.replay == []  # the last passes the budget


def test_first_takes_the_first_shards_and_counts_those_seen_as_replayed():
    picked = select_shards(TOKENS, "first", 25, seen={0, 1})
    assert picked.shards == [0, 1, 2] and picked.new == [2] and picked.replay == [0, 1]
    assert select_shards(TOKENS, "first", None).shards == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="first"):
        select_shards(TOKENS, "last", 10)


def test_seen_shards_read_named_points_and_the_first_shards_of_older_ones():
    old = {"corpus_tokens": 25, "steps": 100}  # before selections were recorded
    named = {"corpus_tokens": 20, "shards": "8-9"}
    assert seen_shards([old], TOKENS) == {0, 1, 2}
    assert seen_shards([{"corpus_tokens": 0}], TOKENS) == set()
    assert seen_shards([old, named], TOKENS) == {0, 1, 2, 8, 9}
