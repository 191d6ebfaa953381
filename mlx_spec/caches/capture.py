"""Run-time capture of the modules that update caches which cannot be trimmed.

No model file is forked. When a model is first prepared, one probe forward
(one token, fresh caches) finds, for every cache that needs a journal
(``ArraysCache``, ``RotatingKVCache``), the innermost modules that receive it
as an argument: the recurrent mixer (gated delta net, Mamba/Mamba2 SSM, short
convolution, RWKV time and channel mix) or the sliding-window attention.
Each such module's class is swapped for a subclass whose ``__call__`` first
tells the cache's active journal about the call, then runs the original.
With no journal active it forwards at once, so plain forwards are unchanged
bit for bit; parameters, names and ``isinstance`` checks are untouched.
"""

import inspect
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache

# Caches whose rewind needs a journal fed by the modules that update them.
JOURNALED = (ArraysCache, RotatingKVCache)

# id(cache) -> its active journal (the journal holds the cache, so ids are unique).
_ACTIVE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()

# id(model) -> True once its receivers are captured (cleared when the model dies).
_PREPARED: Dict[int, bool] = {}

_CAPTURED_CLASSES: Dict[type, type] = {}
_MEMO_CLASSES: Dict[type, type] = {}

# Position-wise projections inside a captured mixer: a replay reuses their outputs.
MEMOIZED = (nn.Linear, nn.QuantizedLinear)


class _Context(threading.local):
    """What the projections inside a captured mixer do: record, replay or nothing."""

    recording: Optional[List[mx.array]] = None
    replaying: Optional["Replay"] = None


_CONTEXT = _Context()


class Replay:
    """Outputs recorded during a call of ``length`` tokens, served for its first ``keep``."""

    def __init__(self, outputs: List[mx.array], length: int, keep: int):
        self.outputs = outputs
        self.length = length
        self.keep = keep
        self.next = 0

    def take(self, x: mx.array) -> Optional[mx.array]:
        """The recorded output for input ``x`` ``(B, keep, D)``, or ``None`` to compute it."""
        if self.next >= len(self.outputs):
            return None
        out = self.outputs[self.next]
        self.next += 1
        if x.ndim < 2 or x.shape[1] != self.keep or out.shape[1] != self.length:
            return None
        return out if self.keep == self.length else out[:, : self.keep]


def leaf_caches(cache: List[Any]) -> List[Any]:
    """The per-layer caches with every ``CacheList`` expanded, in order."""
    leaves = []
    for c in cache:
        if isinstance(c, CacheList):
            leaves.extend(leaf_caches(list(c.caches)))
        else:
            leaves.append(c)
    return leaves


def activate(cache: Any, journal: Any) -> None:
    """Route captured calls that receive ``cache`` to ``journal``."""
    _ACTIVE[id(cache)] = journal


def deactivate(cache: Any) -> None:
    _ACTIVE.pop(id(cache), None)


def _journal_of(args: Tuple, kwargs: Dict):
    for value in args:
        journal = _ACTIVE.get(id(value))
        if journal is not None:
            return journal
    for value in kwargs.values():
        journal = _ACTIVE.get(id(value))
        if journal is not None:
            return journal
    return None


def _captured_call(self, *args, **kwargs):
    original = type(self)._mlx_spec_original
    if _ACTIVE:
        journal = _journal_of(args, kwargs)
        if journal is not None:
            memo = journal.before_call(self, original, args, kwargs)
            if memo is None:
                return original.__call__(self, *args, **kwargs)
            outer, _CONTEXT.recording = _CONTEXT.recording, memo
            try:
                out = original.__call__(self, *args, **kwargs)
            finally:
                _CONTEXT.recording = outer
            journal.after_call()
            return out
    return original.__call__(self, *args, **kwargs)


def replaying(replay: Optional[Replay]):
    """Set the replay the memoized projections serve from (``None``: compute)."""
    outer, _CONTEXT.replaying = _CONTEXT.replaying, replay
    return outer


def _memo_call(self, x, *args, **kwargs):
    original = type(self)._mlx_spec_original
    replay = _CONTEXT.replaying
    if replay is not None and not args and not kwargs:
        out = replay.take(x)
        if out is not None:
            return out
    out = original.__call__(self, x, *args, **kwargs)
    if _CONTEXT.recording is not None:
        _CONTEXT.recording.append(out)
    return out


def _swapped_class(cls: type, call, registry: Dict[type, type]) -> type:
    """A subclass of ``cls`` named like it whose ``__call__`` is ``call``."""
    if cls not in registry:
        registry[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__call__": call,
                "_mlx_spec_original": cls,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
    return registry[cls]


def _takes_arguments(module: nn.Module) -> bool:
    """Whether the module's ``__call__`` takes more than one argument (a cache may be one)."""
    try:
        params = list(inspect.signature(type(module).__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    return variadic or len(params) >= 2


def _probe_receivers(model: nn.Module, cache: List[Any]) -> List[nn.Module]:
    """The innermost modules that receive a journaled cache in a one-token forward."""
    targets = {id(c) for c in leaf_caches(cache) if isinstance(c, JOURNALED)}
    if not targets:
        return []
    stack: List[List] = []  # frames: [module, received ids, ids seen deeper]
    found: Dict[int, nn.Module] = {}
    order: List[int] = []

    def probe_call(self, *args, **kwargs):
        original = type(self)._mlx_spec_probed
        got = {id(v) for v in (*args, *kwargs.values()) if id(v) in targets}
        frame = [self, got, set()]
        for outer in stack:
            outer[2] |= got
        stack.append(frame)
        try:
            return original.__call__(self, *args, **kwargs)
        finally:
            stack.pop()
            if got - frame[2]:  # received a cache that no inner module received
                if id(self) not in found:
                    found[id(self)] = self
                    order.append(id(self))

    swapped, seen = [], set()
    probe_classes: Dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        if module is model or id(module) in seen or not _takes_arguments(module):
            continue
        seen.add(id(module))
        if hasattr(cls, "_mlx_spec_original"):
            cls = cls._mlx_spec_original
        if cls not in probe_classes:
            probe_classes[cls] = type(
                cls.__name__, (cls,), {"__call__": probe_call, "_mlx_spec_probed": cls}
            )
        swapped.append((module, type(module)))
        module.__class__ = probe_classes[cls]
    try:
        out = model(mx.array([[0]], dtype=mx.uint32), cache=cache)
        mx.eval(out)
    finally:
        for module, cls in swapped:
            module.__class__ = cls
    return [found[i] for i in order]


def prepare_capture(model: nn.Module, make_cache) -> int:
    """Capture the modules that update ``model``'s journaled caches (once per model).

    Args:
        model: An mlx-lm model.
        make_cache: ``() -> list`` of fresh caches for the probe forward.

    Returns:
        The number of modules captured (``0`` when already prepared or none needed).
    """
    key = id(model)
    if _PREPARED.get(key):
        return 0
    receivers = _probe_receivers(model, make_cache())
    for module in receivers:
        cls = type(module)
        if not hasattr(cls, "_mlx_spec_original"):
            module.__class__ = _swapped_class(cls, _captured_call, _CAPTURED_CLASSES)
        for inner in module.modules():
            cls = type(inner)
            if isinstance(inner, MEMOIZED) and not hasattr(cls, "_mlx_spec_original"):
                inner.__class__ = _swapped_class(cls, _memo_call, _MEMO_CLASSES)
    _PREPARED[key] = True
    weakref.finalize(model, _PREPARED.pop, key, None)
    return len(receivers)
