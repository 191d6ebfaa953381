"""Exact rewinds of every mlx-lm cache type (``mlx_spec.caches``).

Each rewind is checked against a fresh forward of the tokens it should keep:
the next token's logits agree to float rounding, after a verification-like
forward, single draft steps, mixed chunks, and rewinds that go back more
than once, past the sliding window (8) of the gemma3 and gpt_oss fixtures.
"""

import random

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    ConcatenateKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlx_spec.caches import CacheRollback, check_rewindable, copy_states, set_states
from mlx_spec.caches.capture import leaf_caches
from mlx_spec.caches.rotating import RotatingJournal
from mlx_spec.models import CachedModel, KVSettings
from mlx_spec.testing import ROLLBACK_ARCHITECTURES, SLIDING_WINDOW

PROMPT = list(range(10, 23))  # 13 tokens: longer than the sliding window
# (chunks fed after the mark, tokens kept): a verification, draft steps, mixed.
SCRIPTS = [((5,), (0, 1, 3)), ((1, 1, 1, 1), (0, 2, 3)), ((2, 1, 3), (1, 4, 5))]
TOLERANCE = 1e-4


def _logits(model, cache, tokens):
    return model(mx.array([tokens]), cache=cache)[0, -1]


def _fresh_logits(model, tokens):
    return _logits(model, make_prompt_cache(model), tokens)


@pytest.mark.parametrize("arch", ROLLBACK_ARCHITECTURES)
def test_rewind_equals_a_fresh_forward(load_model, arch):
    model, _ = load_model(arch)
    rng = random.Random(0)
    for chunks, kept in SCRIPTS:
        new = [rng.randrange(500) for _ in range(sum(chunks) + 2)]
        for keep in kept:
            cache = make_prompt_cache(model)
            rollback = CacheRollback(model, cache)
            _logits(model, cache, PROMPT)
            rollback.mark(len(PROMPT))
            fed = 0
            for size in chunks:
                _logits(model, cache, new[fed : fed + size])
                fed += size
            rollback.trim_to(len(PROMPT) + keep)
            # Then a draft step, and a rewind back into the first rewind's span.
            _logits(model, cache, [new[-1]])
            rollback.trim_to(len(PROMPT) + max(keep - 1, 0))
            kept_tokens = PROMPT + new[: max(keep - 1, 0)]
            got = _logits(model, cache, [new[-2]])
            want = _fresh_logits(model, kept_tokens + [new[-2]])
            assert mx.abs(got - want).max().item() < TOLERANCE, (chunks, keep)


def test_recurrent_state_after_a_rewind_equals_a_fresh_state(load_model):
    """The restored-and-replayed conv and SSM state itself, not just the logits."""
    model, _ = load_model("mamba2")
    cache = make_prompt_cache(model)
    rollback = CacheRollback(model, cache)
    _logits(model, cache, PROMPT)
    rollback.mark(len(PROMPT))
    _logits(model, cache, [1, 2, 3, 4, 5])
    rollback.trim_to(len(PROMPT) + 2)
    reference = make_prompt_cache(model)
    _logits(model, reference, PROMPT + [1, 2])
    for c, r in zip(cache, reference):
        assert isinstance(c, ArraysCache)
        for a, b in zip(c.cache, r.cache):
            assert mx.abs(a - b).max().item() < TOLERANCE


def _coded(positions, dims=2):
    """Keys/values ``(1, 1, n, dims)`` whose entries are their positions."""
    x = mx.array(list(positions), mx.float32)[None, None, :, None]
    return mx.broadcast_to(x, (1, 1, len(positions), dims))


def _window(c):
    """Positions a rotating cache attends to next: its sinks, then its window."""
    if c.keys is None:
        return []
    held = np.array(c._temporal_order(c.keys)[0, 0, :, 0]).astype(int).tolist()
    held = held[: c._idx] if c.offset < c.keys.shape[2] else held
    sinks = min(c.keep, len(held))
    return held[:sinks] + held[sinks:][-(c.max_size - c.keep) :]


@pytest.mark.parametrize("keep", [0, 2])
@pytest.mark.parametrize("seed", range(8))
def test_rotating_rewind_matches_plain_updates(keep, seed):
    """Random chunks and rewinds on a small window: the cache holds what a cache
    fed only the kept tokens one by one holds (sinks, then the window), and
    continues like it. Entries are coded by position and by which feed wrote
    them, so an entry left over from before a rewind cannot pass for new."""
    rng = random.Random(seed)
    max_size = 6
    cache = RotatingKVCache(max_size=max_size, keep=keep)
    codes = []  # codes[p]: the entry of position p the cache should hold

    def feed(c, values):
        c.update_and_fetch(_coded(values), _coded(values))

    def feed_new(size, journal):
        values = [len(codes) + i + 1000 * rng.randrange(1, 99) for i in range(size)]
        codes.extend(values)
        journal.before_call(None, None, (mx.zeros((1, size, 1)),), {})
        feed(cache, values)

    codes.extend(range(rng.randrange(1, 9)))
    feed(cache, codes)
    for _ in range(6):
        journal = RotatingJournal(cache)
        mark = cache.offset
        for _ in range(3):  # rewinds compose: feed again, rewind again
            for _ in range(rng.randrange(1, 5)):
                feed_new(rng.choice([1, 1, 3, 7]), journal)
            target = rng.randrange(mark, cache.offset + 1)
            journal.rewind(target - mark)
            del codes[target:]
            reference = RotatingKVCache(max_size=max_size, keep=keep)
            for value in codes:
                feed(reference, [value])
            assert cache.offset == reference.offset == target
            assert _window(cache) == _window(reference)
        # Both continue the same way with one more step.
        feed(cache, [-1])
        feed(reference, [-1])
        codes.append(-1)
        assert _window(cache) == _window(reference)


def test_plain_forwards_are_unchanged_by_the_capture(load_model):
    model, _ = load_model("qwen3_next")
    before = _fresh_logits(model, PROMPT)
    CacheRollback(model, make_prompt_cache(model))  # captures the mixers
    assert mx.array_equal(_fresh_logits(model, PROMPT), before).item()


def test_copied_states_restore_every_cache_type(load_model):
    for arch in ("falcon_h1", "gemma3"):
        model, _ = load_model(arch)
        cache = make_prompt_cache(model)
        _logits(model, cache, PROMPT)
        saved = copy_states(cache)
        want = _logits(model, cache, [5, 6])
        for _ in range(2):  # reusable
            set_states(cache, saved)
            assert mx.array_equal(_logits(model, cache, [5, 6]), want).item()


def test_concatenate_cache_rewind_shortens_its_arrays():
    cache = [ConcatenateKVCache()]
    rollback = CacheRollback(nn.Module(), cache)
    cache[0].update_and_fetch(_coded(range(5)), _coded(range(5)))
    rollback.trim_to(3)
    keys, _ = cache[0].update_and_fetch(_coded([3]), _coded([3]))
    assert np.array(keys[0, 0, :, 0]).astype(int).tolist() == [0, 1, 2, 3]


class _Opaque:
    """A model-file cache that cannot be trimmed."""

    def is_trimmable(self):
        return False


@pytest.mark.parametrize(
    "cache, name",
    [
        ([KVCache(), _Opaque()], "_Opaque"),
        ([BatchKVCache([0])], "BatchKVCache"),
        ([RotatingKVCache(max_size=16, keep=4)], "max_kv_size"),
    ],
)
def test_caches_that_cannot_be_rewound_are_refused_in_one_line(load_model, cache, name):
    model, _ = load_model("llama")
    with pytest.raises(ValueError) as err:
        check_rewindable(model, cache, "target model")
    message = str(err.value)
    assert name in message and "llama" in message and "\n" not in message


def test_kv_bits_on_sliding_window_layers_is_refused_in_one_line(load_model):
    model, _ = load_model("gemma3")
    with pytest.raises(ValueError) as err:
        CachedModel(model, None, KVSettings(kv_bits=4), "target model")
    assert "RotatingKVCache" in str(err.value) and "\n" not in str(err.value)


def test_rewinding_past_the_mark_is_an_error(load_model):
    model, _ = load_model("mamba2")
    cache = make_prompt_cache(model)
    rollback = CacheRollback(model, cache)
    _logits(model, cache, PROMPT)
    rollback.mark(len(PROMPT))
    _logits(model, cache, [1, 2])
    with pytest.raises(ValueError):
        rollback.trim_to(len(PROMPT) - 1)


def test_every_family_has_a_cache_needing_rollback(load_model):
    """The fixtures exercise what they are for: recurrent or full sliding windows."""
    for arch in ROLLBACK_ARCHITECTURES:
        model, _ = load_model(arch)
        kinds = {type(c).__name__ for c in leaf_caches(make_prompt_cache(model))}
        assert kinds & {"ArraysCache", "RotatingKVCache"}, arch
        for c in leaf_caches(make_prompt_cache(model)):
            if isinstance(c, RotatingKVCache):
                assert c.max_size == SLIDING_WINDOW < len(PROMPT)
