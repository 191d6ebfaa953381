"""Exact rewind of ``ArraysCache`` (recurrent and convolution state).

A journal opened at a mark keeps the cache's state at the mark and after
every captured mixer call since (references only: mixers rebind ``cache[i]``
to new arrays, they never write into them, and those states were computed
anyway), and each call's inputs and projection outputs. To rewind to ``k``
tokens after the mark it restores the last state at or before ``k``: when a
call ends there (a draft model's single-token steps, the mark itself) that
is all. Otherwise it replays the first tokens of the next calls through the
mixers alone: their inputs are exact (the layers are causal), their
projections are served from what the forward recorded, and the replay's
outputs are never used, so MLX only computes what the new state depends on
(the convolution and the recurrence; no MLP, no attention). When every token
is kept nothing runs.
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


class _Unmergeable(Exception):
    pass


def _join(values: List[Any], lengths: List[int]) -> Any:
    """Per-token arrays joined along the tokens; anything else must be shared."""
    if all(
        isinstance(v, mx.array) and v.ndim >= 2 and v.shape[1] == n
        for v, n in zip(values, lengths)
    ):
        return mx.concatenate(values, axis=1)
    if all(v is values[0] for v in values):
        return values[0]
    raise _Unmergeable


def merge_calls(calls: List[_Call]) -> List[_Call]:
    """One call of a module on the joined tokens of its consecutive calls.

    A draft model journals one call per draft step; replaying them as one
    call runs each mixer's operations once instead of once per token. Calls
    whose arguments do not line up are left as they are.
    """
    first = calls[0]
    if len(calls) == 1:
        return calls
    lengths = [c.length for c in calls]
    try:
        if any(len(c.args) != len(first.args) for c in calls) or any(
            c.kwargs.keys() != first.kwargs.keys() for c in calls
        ):
            raise _Unmergeable
        args = tuple(
            _join([c.args[i] for c in calls], lengths) for i in range(len(first.args))
        )
        kwargs = {k: _join([c.kwargs[k] for c in calls], lengths) for k in first.kwargs}
    except _Unmergeable:
        return calls
    memo: List[mx.array] = []
    sizes = {len(c.memo) for c in calls}
    if len(sizes) == 1:
        try:
            memo = [
                _join([c.memo[j][:, : c.length] for c in calls], lengths)
                for j in range(sizes.pop())
            ]
        except (_Unmergeable, IndexError, ValueError):
            memo = []  # the projections are computed again
        if any(
            c.memo[j].ndim < 2 or c.memo[j].shape[1] != c.source
            for c in calls
            for j in range(len(c.memo))
        ):
            memo = []
    total = sum(lengths)
    return [_Call(first.module, first.original, args, kwargs, total, memo)]


class ArraysJournal:
    """Snapshot at the mark plus the mixer calls since, for one ``ArraysCache``.

    The state after every call is kept too (references to arrays computed
    anyway): a rewind to the end of a call, such as a draft model's rewind to
    one of its single-token steps, just restores it. A rewind into a call
    restores the state before it and replays the call's first tokens.

    Args:
        cache: The ``ArraysCache`` (its state is read now, as the snapshot).
    """

    def __init__(self, cache: Any):
        self.cache = cache
        self.calls: List[_Call] = []
        # (tokens since the mark, state, calls before it), ascending.
        self.boundaries: List[Tuple[int, Tuple, int]] = [(0, self._state(), 0)]

    def _state(self) -> Tuple:
        c = self.cache
        return (list(c.cache), c.left_padding, c.lengths)

    def _restore(self, state: Tuple) -> None:
        arrays, left_padding, lengths = state
        self.cache.cache = list(arrays)
        self.cache.left_padding = left_padding
        self.cache.lengths = lengths

    def before_call(self, module, original, args: Tuple, kwargs: Dict) -> List:
        """Journal a mixer call; returns the list its projections record into."""
        memo: List[mx.array] = []
        length = sequence_length(args, kwargs)
        self.calls.append(_Call(module, original, args, kwargs, length, memo))
        return memo

    def _counts(self, calls: List[_Call]) -> Dict[int, int]:
        seen: Dict[int, int] = {}
        for call in calls:
            seen[id(call.module)] = seen.get(id(call.module), 0) + call.length
        return seen

    def after_call(self) -> None:
        """Keep the state if every module that updates the cache is at the same token."""
        counts = set(self._counts(self.calls).values())
        if len(counts) == 1:
            self.boundaries.append((counts.pop(), self._state(), len(self.calls)))

    @property
    def tokens(self) -> int:
        """Tokens fed since the mark (every module that updates the cache sees all)."""
        return max(self._counts(self.calls).values(), default=0)

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
        while self.boundaries[-1][0] > keep:
            self.boundaries.pop()
        start, state, done_calls = self.boundaries[-1]
        self._restore(state)
        head, tail = self.calls[:done_calls], self.calls[done_calls:]
        used: Dict[int, int] = {}
        kept: Dict[int, List[_Call]] = {}  # per module, in order of first call
        for call in tail:
            done = used.get(id(call.module), start)
            take = min(call.length, keep - done)
            if take > 0:
                kept.setdefault(id(call.module), []).append(call.prefix(take))
                used[id(call.module)] = done + take
        replayed = [c for calls in kept.values() for c in merge_calls(calls)]
        for call in replayed:
            call.run()
        self.calls = head + replayed
        if replayed:
            self.boundaries.append((keep, self._state(), len(self.calls)))
