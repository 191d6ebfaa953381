"""Thin wrappers around unmodified mlx_lm models and their KV caches."""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import make_prompt_cache

from .caches import CacheRollback, leaf_caches


class KVSettings:
    """Optional KV-cache quantisation, as in ``mlx_lm.generate``."""

    def __init__(
        self,
        kv_bits: Optional[int] = None,
        kv_group_size: int = 64,
        quantized_kv_start: int = 0,
    ):
        self.kv_bits = kv_bits
        self.kv_group_size = kv_group_size
        self.quantized_kv_start = quantized_kv_start


def cache_offset(cache: List[Any]) -> Optional[int]:
    """Number of tokens a prompt cache holds; ``None`` if no layer counts them.

    Recurrent layers (``ArraysCache``) keep a state, not a length: a cache
    of such layers only is ``0`` when empty and of unknown length otherwise.
    """
    leaves = leaf_caches(cache)
    for c in leaves:
        if hasattr(c, "offset"):
            return int(c.offset)
    if all(c.empty() for c in leaves):
        return 0
    return None


def num_caches(model: nn.Module) -> int:
    """Entries of ``make_prompt_cache(model)`` (some layers, e.g. MLP-only ones, have none)."""
    if hasattr(model, "make_cache"):
        return len(model.make_cache())
    return len(model.layers)


def output_size(model: nn.Module) -> int:
    """Number of logits the model emits per position (may exceed the tokenizer).

    mlx_lm builds the output head from ``args.vocab_size``; models without
    it are asked with a one-token forward.
    """
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    return int(model(mx.array([[0]])).shape[-1])


class CachedModel:
    """An mlx_lm model with its own list of caches, rewound exactly.

    ``self.cache`` is the list the model is called with; mlx_lm's KV
    quantisation may replace its entries in place. :meth:`mark` and
    :meth:`trim_to` rewind every cache type (see :mod:`mlx_spec.caches`):
    recurrent and sliding-window caches back to the last mark, the others
    anywhere.
    """

    def __init__(
        self, model: nn.Module, cache: Optional[List[Any]], kv: KVSettings, who: str
    ):
        self.model = model
        self.cache = list(cache) if cache is not None else make_prompt_cache(model)
        self.kv = kv
        self.rollback = CacheRollback(model, self.cache, who)
        if kv.kv_bits is not None:
            self.rollback.check_quantizable(who)
        # Caches of recurrent layers only do not count tokens: count them here.
        self.counted = not any(hasattr(c, "offset") for c in leaf_caches(self.cache))
        self._length = cache_offset(self.cache)

    @property
    def offset(self) -> int:
        """Tokens the caches hold (relative to :meth:`assume_length` if unknown)."""
        if not self.counted:
            return cache_offset(self.cache)
        return self._length or 0

    @property
    def length_known(self) -> bool:
        return not self.counted or self._length is not None

    def assume_length(self, length: int):
        """Set the length of a non-empty recurrent-only cache, which it cannot tell."""
        if not self.length_known:
            self._length = length

    def mark(self):
        """Allow :meth:`trim_to` back to the current length (each round's start)."""
        self.rollback.mark(self.offset)

    def release(self):
        """Stop journaling (the caches keep their state)."""
        self.rollback.release()

    def __call__(self, tokens: mx.array, head=None) -> mx.array:
        """Feed ``tokens`` (shape ``(L,)``); returns logits ``(L, V)``.

        ``head``, if given, replaces the output layer: it maps the final hidden
        states ``(L, H)`` (to a distilled draft's vocabulary subset, say).
        """
        if head is None:
            logits = self.model(tokens[None], cache=self.cache)[0]
        else:
            logits = head(self.model.model(tokens[None], cache=self.cache)[0])
        if self.counted:
            self._length = self.offset + int(tokens.shape[0])
        if self.kv.kv_bits is not None:
            maybe_quantize_kv_cache(
                self.cache,
                self.kv.quantized_kv_start,
                self.kv.kv_group_size,
                self.kv.kv_bits,
            )
        return logits

    def prefill(self, tokens: mx.array, step_size: int, progress=None):
        """Feed ``tokens`` in chunks, evaluating the cache after each chunk.

        ``progress(done, total)``, if given, is called after each chunk.
        """
        total, done = int(tokens.size), 0
        while tokens.size > 0:
            chunk = tokens[:step_size]
            self(chunk)
            mx.eval([c.state for c in self.cache])
            tokens = tokens[step_size:]
            done += int(chunk.size)
            if progress is not None:
                progress(done, total)
            mx.clear_cache()

    def trim_to(self, num_tokens: int):
        """Rewind the cache so it holds exactly ``num_tokens`` tokens."""
        if self.offset > num_tokens:
            self.rollback.trim_to(num_tokens)
            if self.counted:
                self._length = num_tokens
