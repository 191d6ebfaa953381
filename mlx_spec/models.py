"""Thin wrappers around unmodified mlx_lm models and their KV caches."""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache, trim_prompt_cache


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


def check_trimmable(cache: List[Any], who: str):
    """Refuse caches that cannot be rewound exactly after a round."""
    bad = sorted(
        {
            type(c).__name__
            for c in cache
            if isinstance(c, RotatingKVCache) or not c.is_trimmable()
        }
    )
    if bad:
        raise ValueError(
            f"speculative decoding needs a KV cache that can be rewound, but the "
            f"{who} uses {', '.join(bad)} (sliding-window, max_kv_size or state-space "
            "layers); use plain decoding (--speculative none) for this model."
        )


def cache_offset(cache: List[Any]) -> int:
    """Number of tokens a prompt cache holds."""
    for c in cache:
        if hasattr(c, "offset"):
            return int(c.offset)
    return 0


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
    """An mlx_lm model with its own list of caches.

    ``self.cache`` is the list the model is called with; mlx_lm's KV
    quantisation may replace its entries in place.
    """

    def __init__(
        self, model: nn.Module, cache: Optional[List[Any]], kv: KVSettings, who: str
    ):
        self.model = model
        self.cache = list(cache) if cache is not None else make_prompt_cache(model)
        self.kv = kv
        check_trimmable(self.cache, who)

    @property
    def offset(self) -> int:
        return cache_offset(self.cache)

    def __call__(self, tokens: mx.array) -> mx.array:
        """Feed ``tokens`` (shape ``(L,)``); returns logits ``(L, V)``."""
        logits = self.model(tokens[None], cache=self.cache)[0]
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
        extra = self.offset - num_tokens
        if extra > 0:
            trim_prompt_cache(self.cache, extra)
