"""Exact rewind of ``RotatingKVCache`` (sliding-window attention), also after the window fills.

mlx-lm's ``RotatingKVCache.trim`` only moves ``offset`` and ``_idx``: once the
window is full the slots it gives back hold overwritten entries, and a buffer
left by a multi-token update is read in the wrong order afterwards. Here a
journal opened at a mark keeps every entry an update evicts that a rewind to
the mark or later could need (at most the tokens fed since the mark, γ + 1
per round), gathered just before the update from the slots it will
overwrite or drop. A rewind to ``t`` tokens rebuilds the buffer in temporal
order: the ``keep`` sink entries, then the last ``max_size - keep`` positions
before ``t`` (fewer before the window fills), taken from the saved entries
and the live buffer, with ``_idx`` at its end. That is a layout mlx-lm's own
updates produce and continue from exactly.

Layouts of a cache at ``offset`` P (``keep`` sinks, window ``W = max_size``):

- filling: slots ``0..P-1`` hold positions ``0..P-1`` (the buffer may be longer);
- temporal (after a multi-token update): sinks, then the latest positions in order;
- circular (after single-token updates once full): sinks, then a ring whose
  oldest entry sits at ``_idx``.
"""

from typing import Any, Dict, List, Tuple

import mlx.core as mx

from .recurrent import sequence_length


def temporal_length(c: Any) -> int:
    """Entries the cache holds (sinks included), as ``_temporal_order`` counts them."""
    if c.keys is None:
        return 0
    size = c.keys.shape[2]
    if c._idx == size or c._idx < c.offset:
        return size
    return c._idx


def _is_circular(c: Any) -> bool:
    return c.keys is not None and c._idx != c.keys.shape[2] and c._idx < c.offset


def held(c: Any) -> Tuple[int, int]:
    """``(sinks, oldest)``: the cache holds positions ``0..sinks-1`` and ``oldest..offset-1``."""
    length = temporal_length(c)
    sinks = min(c.keep, length)
    return sinks, c.offset - (length - sinks)


def length_after(c: Any, num: int) -> int:
    """:func:`temporal_length` after mlx-lm's update of ``num`` tokens (simulated)."""
    if c.keys is None:
        return num
    if num == 1:
        return min(c.offset + 1, c.max_size)
    return min(temporal_length(c), c.max_size - 1) + num


def slots_of(c: Any, start: int, stop: int) -> List[int]:
    """Buffer slots of the held recent positions ``start..stop-1``, in order."""
    sinks, oldest = held(c)
    if start < oldest or stop > c.offset:
        raise ValueError(
            f"positions {start}..{stop - 1} are not all held (held: {oldest}.."
            f"{c.offset - 1})."
        )
    order = [sinks + p - oldest for p in range(start, stop)]  # temporal indices
    if not _is_circular(c):
        return order
    tail = c.keys.shape[2] - c._idx  # ring entries from _idx to the end come first
    return [
        c._idx + (j - c.keep) if j - c.keep < tail else c.keep + (j - c.keep - tail)
        for j in order
    ]


def _take(c: Any, start: int, stop: int) -> Tuple[mx.array, mx.array]:
    """Keys and values of the held recent positions ``start..stop-1``, ``(B, H, n, D)``."""
    slots = slots_of(c, start, stop)
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return (
            c.keys[..., slots[0] : slots[-1] + 1, :],
            c.values[..., slots[0] : slots[-1] + 1, :],
        )
    index = mx.array(slots, dtype=mx.int32)
    return mx.take(c.keys, index, axis=2), mx.take(c.values, index, axis=2)


class RotatingJournal:
    """Evicted entries since the mark, for one ``RotatingKVCache``.

    Invariant: the saved entries cover positions ``floor..saved_stop-1`` and,
    with what the buffer holds, every position from ``floor`` to ``offset - 1``,
    where ``floor`` is the oldest position a rewind to the mark needs.

    Args:
        cache: The ``RotatingKVCache``; the mark is its current ``offset``.
    """

    def __init__(self, cache: Any):
        self.cache = cache
        self.mark = cache.offset
        self.window = cache.max_size - cache.keep  # ring size
        self.floor = max(cache.keep, self.mark - self.window)
        self.saved: List[Tuple[mx.array, mx.array]] = []
        self.saved_stop = self.floor
        self.empty_at_mark = cache.keys is None

    @property
    def tokens(self) -> int:
        return self.cache.offset - self.mark

    def _save_until(self, stop: int) -> None:
        """Save the held positions ``saved_stop..stop-1`` before they are dropped."""
        if stop > self.saved_stop:
            self.saved.append(_take(self.cache, self.saved_stop, stop))
            self.saved_stop = stop

    def before_call(self, module, original, args: Tuple, kwargs: Dict) -> None:
        c = self.cache
        if c.keys is None:
            return
        num = sequence_length(args, kwargs)
        after = length_after(c, num)
        oldest_after = c.offset + num - (after - min(c.keep, after))
        self._save_until(min(oldest_after, c.offset))

    def _saved_range(self, start: int, stop: int) -> List[Tuple[mx.array, mx.array]]:
        """Saved keys and values of positions ``start..stop-1`` (possibly several pieces)."""
        pieces, position = [], self.floor
        for keys, values in self.saved:
            size = keys.shape[2]
            lo, hi = max(start, position), min(stop, position + size)
            if lo < hi:
                a, b = lo - position, hi - position
                pieces.append((keys[..., a:b, :], values[..., a:b, :]))
            position += size
        return pieces

    def rewind(self, keep: int) -> None:
        """Make the cache hold the mark's state followed by exactly ``keep`` tokens."""
        c = self.cache
        target = self.mark + keep
        if not self.mark <= target <= c.offset:
            raise ValueError(
                f"cannot rewind a sliding-window cache to {keep} tokens after its "
                f"mark; it holds {c.offset - self.mark}."
            )
        if target == c.offset:
            return
        if target == 0 or (self.empty_at_mark and keep == 0):
            c.keys = c.values = None
            c.offset = c._idx = 0
            self.saved, self.saved_stop = [], self.floor
            return
        sinks = min(c.keep, target)
        start = max(sinks, target - self.window)  # oldest recent position to hold
        self._save_until(start)
        _, oldest = held(c)
        pieces = []
        if sinks:
            pieces.append((c.keys[..., :sinks, :], c.values[..., :sinks, :]))
        pieces += self._saved_range(start, min(target, oldest))
        if max(start, oldest) < target:
            pieces.append(_take(c, max(start, oldest), target))
        if len(pieces) == 1:
            keys, values = pieces[0]
        else:
            keys = mx.concatenate([k for k, _ in pieces], axis=2)
            values = mx.concatenate([v for _, v in pieces], axis=2)
        c.keys, c.values = keys, values
        c.offset = target
        c._idx = keys.shape[2]
        # The buffer now holds ``start..target-1``; later saved entries may be stale.
        self.saved = self._saved_range(self.floor, start)
        self.saved_stop = max(start, self.floor)
