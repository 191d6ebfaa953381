"""Rewind a model's whole cache list exactly to any length since a mark."""

from typing import Any, Callable, Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .capture import JOURNALED, activate, deactivate, leaf_caches, prepare_capture
from .recurrent import ArraysJournal
from .rotating import RotatingJournal

# Caches whose ``trim`` is exact for any rewind since a mark.
TRIMMED = (KVCache, QuantizedKVCache, ChunkedKVCache)


def model_type(model: nn.Module) -> str:
    """The ``model_type`` of an mlx-lm model, as in its ``config.json``."""
    name = getattr(model, "model_type", None)
    if name is None and hasattr(model, "args"):
        name = getattr(model.args, "model_type", None)
    return str(name if name is not None else type(model).__module__.split(".")[-1])


def unsupported(cache: List[Any]) -> List[str]:
    """Names of the cache classes in ``cache`` that cannot be rewound exactly."""
    bad = set()
    for c in leaf_caches(cache):
        name = type(c).__name__
        if name.startswith("Batch"):  # batched generation: one sequence per call here
            bad.add(name)
        elif not isinstance(c, (*TRIMMED, *JOURNALED, ConcatenateKVCache)):
            if not (hasattr(c, "is_trimmable") and c.is_trimmable()):
                bad.add(name)
    return sorted(bad)


def check_rewindable(model: nn.Module, cache: List[Any], who: str) -> None:
    """Refuse, in one line naming the model type, caches that cannot be rewound.

    Also refused: a ``RotatingKVCache`` that keeps sink tokens (``keep > 0``,
    what ``max_kv_size`` builds). Once its window is full, mlx-lm masks those
    tokens differently in multi-token and one-token forwards, so verifying
    several tokens at once cannot match plain decoding, whatever the rewind.
    """
    bad = unsupported(cache)
    if bad:
        raise ValueError(
            f"speculative decoding cannot rewind the {who}'s {', '.join(bad)} "
            f"(model type '{model_type(model)}'); use plain decoding "
            "(--speculative none) for this model."
        )
    if any(isinstance(c, RotatingKVCache) and c.keep > 0 for c in leaf_caches(cache)):
        raise ValueError(
            f"the {who}'s cache is bounded by max_kv_size (a RotatingKVCache keeping "
            f"sink tokens, model type '{model_type(model)}'), which mlx-lm attends to "
            "differently in multi-token forwards, so speculation cannot match plain "
            "decoding; drop max_kv_size or use --speculative none."
        )


def needs_journal(cache: List[Any]) -> bool:
    """Whether any layer's cache needs a journal (recurrent or sliding-window)."""
    return any(isinstance(c, JOURNALED) for c in leaf_caches(cache))


def _trim(c: Any, length: int) -> None:
    excess = c.offset - length
    if excess <= 0:
        return
    if isinstance(c, ConcatenateKVCache):  # its trim does not shorten the arrays
        c.keys, c.values = c.keys[..., :length, :], c.values[..., :length, :]
        c.offset = length
    else:
        c.trim(excess)


class CacheRollback:
    """Exact rewind of one model's cache list, for every mlx-lm cache type.

    ``KVCache``, ``QuantizedKVCache`` and ``ChunkedKVCache`` are trimmed.
    ``ArraysCache`` and ``RotatingKVCache`` get a journal at each :meth:`mark`
    (see :mod:`.recurrent` and :mod:`.rotating`), fed by the modules that
    update them, so :meth:`trim_to` may go back to any length since the mark.
    A model without such caches keeps no journal and costs nothing.

    Args:
        model: The mlx-lm model the caches belong to.
        cache: Its per-layer cache list (entries may later be replaced in
            place, e.g. by KV quantisation; they are read at each call).
        who: Names the model in errors ("target model", "draft model").
        make_cache: Fresh caches for the one-off probe forward. Default:
            ``make_prompt_cache(model)``.
    """

    def __init__(
        self,
        model: nn.Module,
        cache: List[Any],
        who: str = "model",
        make_cache: Optional[Callable[[], List[Any]]] = None,
    ):
        check_rewindable(model, cache, who)
        self.model = model
        self.cache = cache
        self.journaled = needs_journal(cache)
        self.mark_length: Optional[int] = None
        self._journals: Dict[int, Any] = {}
        if self.journaled:
            prepare_capture(model, make_cache or (lambda: make_prompt_cache(model)))

    def check_quantizable(self, who: str) -> None:
        """Refuse KV quantisation of sliding-window layers (mlx-lm cannot either)."""
        if any(isinstance(c, RotatingKVCache) for c in leaf_caches(self.cache)):
            raise ValueError(
                f"kv_bits cannot quantize the {who}'s sliding-window layers "
                f"(RotatingKVCache, model type '{model_type(self.model)}'; mlx-lm "
                "cannot either); drop kv_bits."
            )

    def mark(self, length: int) -> None:
        """Allow rewinds back to ``length`` tokens (what the caches hold now)."""
        self.mark_length = length
        if not self.journaled:
            return
        self.release()
        for c in leaf_caches(self.cache):
            if isinstance(c, ArraysCache):
                journal = ArraysJournal(c)
            elif isinstance(c, RotatingKVCache):
                journal = RotatingJournal(c)
            else:
                continue
            self._journals[id(c)] = journal
            activate(c, journal)

    def trim_to(self, length: int) -> None:
        """Make every cache hold exactly the first ``length`` tokens.

        Recurrent and sliding-window caches may only go back to the last
        :meth:`mark`; the others may go back anywhere.
        """
        for c in leaf_caches(self.cache):
            journal = self._journals.get(id(c))
            if journal is not None:
                journal.rewind(length - self.mark_length)
            elif isinstance(c, JOURNALED):
                if length != self.mark_length:
                    raise ValueError(
                        f"cannot rewind a {type(c).__name__} without a mark at "
                        f"{length} tokens."
                    )
            elif hasattr(c, "offset"):
                _trim(c, length)

    def release(self) -> None:
        """Close the journals (the caches keep their state)."""
        for c in leaf_caches(self.cache):
            journal = self._journals.pop(id(c), None)
            if journal is not None:
                deactivate(c)
        self._journals.clear()


def _fresh(value: Any) -> Any:
    """``value`` with every array a new object (same data, no copy).

    Caches update arrays in place by slice assignment, which changes every
    holder of that array object; a new object keeps the old value.
    """
    if isinstance(value, mx.array):
        return value[...]
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v) for v in value)
    return value


def copy_states(cache: List[Any]) -> List[Any]:
    """The state of every layer cache (``CacheList`` expanded), as new array objects."""
    return [_fresh(c.state) for c in leaf_caches(cache)]


def set_states(cache: List[Any], states: List[Any]) -> None:
    """Put back states from :func:`copy_states` (reusable: they are copied again)."""
    for c, state in zip(leaf_caches(cache), states):
        c.state = _fresh(state)
