"""Exact rewind of ``ArraysCache`` (recurrent and convolution state).

A journal opened at a mark keeps a snapshot of the cache's arrays (references
only: mixers rebind ``cache[i]`` to new arrays, they never write into them)
and every captured mixer call since, with its inputs. To rewind to ``k``
tokens after the mark it restores the snapshot and replays the first ``k``
tokens of those calls through the mixers alone. Their inputs are exact (the
layers are causal), and the replay's outputs are never used, so MLX only
computes what the new state depends on (no output projection, no MLP, no
attention). When every token is kept nothing runs; rewinding to the mark
itself only restores the snapshot.
"""

from typing import Any, Dict, List, Tuple

import mlx.core as mx

from .capture import Replay, replaying


def sequence_length(args: Tuple, kwargs: Dict) -> int:
    """Tokens in a mixer call: axis 1 of its first ``(B, L, D)`` array argument."""
    arrays = [v for v in (*args, *kwargs.values()) if isinstance(v, mx.array)]
    for value in arrays:
        if value.ndim == 3:
            return int(value.shape[1])
    for value in arrays:
        if value.ndim >= 2:
            return int(value.shape[1])
    raise ValueError("a recurrent mixer was called without a (B, L, D) input.")


def _prefix(value: Any, length: int, keep: int) -> Any:
    """``value[:, :keep]`` for a per-token array of ``length`` tokens, else ``value``."""
    if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[1] == length:
        return value[:, :keep]
    return value


class _Call:
    """One captured mixer call: the module, its original class and its arguments."""

    __slots__ = ("module", "original", "args", "kwargs", "length", "memo", "source")

    def __init__(self, module, original, args, kwargs, length, memo, source=None):
        self.module = module
        self.original = original
        self.args = args
        self.kwargs = kwargs
        self.length = length
        self.memo = memo  # outputs of the mixer's projections, in call order
        self.source = length if source is None else source  # memo's token count

    def prefix(self, keep: int) -> "_Call":
        """The same call on its first ``keep`` tokens."""
        if keep == self.length:
            return self
        args = tuple(_prefix(a, self.length, keep) for a in self.args)
        kwargs = {k: _prefix(v, self.length, keep) for k, v in self.kwargs.items()}
        return _Call(
            self.module, self.original, args, kwargs, keep, self.memo, self.source
        )

    def run(self) -> None:
        """Run the call again, its projections served from the memo."""
        outer = replaying(Replay(self.memo, self.source, self.length))
        try:
            self.original.__call__(self.module, *self.args, **self.kwargs)
        finally:
            replaying(outer)


class ArraysJournal:
    """Snapshot at the mark plus the mixer calls since, for one ``ArraysCache``.

    Args:
        cache: The ``ArraysCache`` (its state is read now, as the snapshot).
    """

    def __init__(self, cache: Any):
        self.cache = cache
        self.snapshot = (list(cache.cache), cache.left_padding, cache.lengths)
        self.calls: List[_Call] = []

    def before_call(self, module, original, args: Tuple, kwargs: Dict) -> List:
        """Journal a mixer call; returns the list its projections record into."""
        memo: List[mx.array] = []
        length = sequence_length(args, kwargs)
        self.calls.append(_Call(module, original, args, kwargs, length, memo))
        return memo

    @property
    def tokens(self) -> int:
        """Tokens fed since the mark (every module that updates the cache sees all)."""
        seen: Dict[int, int] = {}
        for call in self.calls:
            seen[id(call.module)] = seen.get(id(call.module), 0) + call.length
        return max(seen.values(), default=0)

    def _restore(self) -> None:
        arrays, left_padding, lengths = self.snapshot
        self.cache.cache = list(arrays)
        self.cache.left_padding = left_padding
        self.cache.lengths = lengths

    def rewind(self, keep: int) -> None:
        """Make the cache hold the mark's state followed by exactly ``keep`` tokens."""
        total = self.tokens
        if not 0 <= keep <= total:
            raise ValueError(
                f"cannot rewind a recurrent cache to {keep} tokens after its mark; "
                f"it holds {total}."
            )
        if keep == total:
            return
        self._restore()
        used: Dict[int, int] = {}
        kept: List[_Call] = []
        for call in self.calls:
            done = used.get(id(call.module), 0)
            take = min(call.length, keep - done)
            if take <= 0:
                continue
            call = call.prefix(take)
            call.run()
            used[id(call.module)] = done + take
            kept.append(call)
        self.calls = kept
