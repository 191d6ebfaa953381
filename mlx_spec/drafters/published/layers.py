"""Building blocks of published drafters: their decoder-layer shape and rope.

Published heads describe their layers with a Hugging Face ``config.json``
dict (llama or qwen3 fields). :func:`layer_shape` reads it once into a
:class:`LayerShape`; :class:`Attention` and :class:`MLP` are the llama /
qwen3 parts with explicit positions, an explicit mask and the head's own
KV cache, so trees and rollback work as for our own heads. Rope comes from
mlx-lm's ``initialize_rope`` (default, linear, llama3, yarn scaling).
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope


@dataclass
class LayerShape:
    """One decoder layer of a published head, read from its HF config.

    Attributes:
        model_type: ``"llama"`` or ``"qwen3"`` (qwen3 norms queries and keys per head).
        hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size: Widths.
        rms_norm_eps: Epsilon of every RMSNorm.
        attention_bias: Biases on the q/k/v/o projections.
        rope_theta, rope_scaling, rotary_dim, max_position_embeddings: Rope.
        num_layers: Decoder layers of the head.
        vocab_size: The vocabulary of the target it was trained for.
        sliding: Whether any layer uses sliding-window attention.
    """

    model_type: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    attention_bias: bool
    rope_theta: float
    rope_scaling: Optional[Dict]
    rotary_dim: int
    max_position_embeddings: Optional[int]
    num_layers: int
    vocab_size: int
    sliding: bool

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"


def _rope_settings(config: Dict):
    """``(theta, scaling or None)`` from ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (transformers 4)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind == "default":
        return float(theta), None
    return float(theta), {k: v for k, v in merged.items() if k != "rope_theta"}


def layer_shape(config: Dict, where: str) -> LayerShape:
    """Read a head's layer shape from its HF config dict.

    Raises:
        ValueError: One line naming ``where`` and the field that is missing or
          unsupported.
    """
    model_type = str(config.get("model_type", "llama"))
    if model_type not in ("llama", "qwen3"):
        raise ValueError(
            f"{where}: decoder layers of type {model_type!r} are not supported "
            "(llama and qwen3 are)."
        )
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        intermediate = int(config["intermediate_size"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: the config lacks a valid {e} field.") from None
    head_dim = int(config.get("head_dim") or hidden // heads)
    theta, scaling = _rope_settings(config)
    layer_types = config.get("layer_types") or []
    return LayerShape(
        model_type=model_type,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=intermediate,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        attention_bias=bool(config.get("attention_bias", False)),
        rope_theta=theta,
        rope_scaling=scaling,
        # transformers' llama and qwen3 layers rotate every channel, even
        # with a partial_rotary_factor in the config (the reference does too).
        rotary_dim=head_dim,
        max_position_embeddings=config.get("max_position_embeddings"),
        num_layers=int(config.get("num_hidden_layers", 1)),
        vocab_size=vocab,
        sliding="sliding_attention" in layer_types,
    )


def make_rope(shape: LayerShape) -> nn.Module:
    """mlx-lm's rope module for ``shape`` (non-traditional, as HF's llama/qwen3)."""
    return initialize_rope(
        shape.rotary_dim,
        shape.rope_theta,
        False,
        shape.rope_scaling,
        shape.max_position_embeddings,
    )


def apply_rope(rope: nn.Module, x: mx.array, positions: mx.array) -> mx.array:
    """Rotate ``x`` ``(B, L, N, D)`` at per-token ``positions`` ``(B, L)`` -> ``(B, N, L, D)``."""
    B, L, N, D = x.shape
    rows = rope(
        x.reshape(B * L, N, 1, D), offset=positions.reshape(-1).astype(mx.int32)
    )
    return rows.reshape(B, L, N, D).transpose(0, 2, 1, 3)


class Attention(nn.Module):
    """Grouped-query attention of a published head (llama, or qwen3 with q/k norms).

    Args:
        shape: The layer shape.
        input_width: Width of the projections' input (``2 H`` for EAGLE-3's first layer).
    """

    def __init__(self, shape: LayerShape, input_width: int):
        super().__init__()
        n, kv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
        bias = shape.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = n, kv, d
        self.scale = d**-0.5
        self.q_proj = nn.Linear(input_width, n * d, bias=bias)
        self.k_proj = nn.Linear(input_width, kv * d, bias=bias)
        self.v_proj = nn.Linear(input_width, kv * d, bias=bias)
        self.o_proj = nn.Linear(n * d, shape.hidden_size, bias=bias)
        if shape.qk_norm:
            self.q_norm = nn.RMSNorm(d, eps=shape.rms_norm_eps)
            self.k_norm = nn.RMSNorm(d, eps=shape.rms_norm_eps)
        self.rope = make_rope(shape)

    def queries(self, x: mx.array, positions: mx.array) -> mx.array:
        """``x`` ``(B, L, W)`` -> rotated queries ``(B, N, L, D)``."""
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.num_heads, self.head_dim)
        if "q_norm" in self:
            q = self.q_norm(q)
        return apply_rope(self.rope, q, positions)

    def keys_values(self, x: mx.array, positions: mx.array):
        """``x`` ``(B, L, W)`` -> rotated keys and values ``(B, Nkv, L, D)``."""
        B, L, _ = x.shape
        k = self.k_proj(x).reshape(B, L, self.num_kv_heads, self.head_dim)
        if "k_norm" in self:
            k = self.k_norm(k)
        v = self.v_proj(x).reshape(B, L, self.num_kv_heads, self.head_dim)
        return apply_rope(self.rope, k, positions), v.transpose(0, 2, 1, 3)

    def attend(self, q, keys, values, mask) -> mx.array:
        """Attention of ``q`` over ``keys``/``values`` where ``mask`` is True: ``(B, L, H)``."""
        out = mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=self.scale, mask=mask
        )
        B, _, L, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def __call__(self, x, positions, mask, cache: Optional[KVCache]) -> mx.array:
        """Self-attention over ``x`` and, with ``cache``, the entries before it."""
        q = self.queries(x, positions)
        k, v = self.keys_values(x, positions)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        return self.attend(q, k, v, mask)


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, shape: LayerShape):
        super().__init__()
        H, inner = shape.hidden_size, shape.intermediate_size
        self.gate_proj = nn.Linear(H, inner, bias=False)
        self.up_proj = nn.Linear(H, inner, bias=False)
        self.down_proj = nn.Linear(inner, H, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A pre-norm llama/qwen3 decoder layer over the head's own cache."""

    def __init__(self, shape: LayerShape):
        super().__init__()
        H, eps = shape.hidden_size, shape.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(H, eps=eps)
        self.self_attn = Attention(shape, H)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.mlp = MLP(shape)

    def __call__(self, x, positions, mask, cache=None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LayerCaches:
    """One ``KVCache`` per decoder layer of a head, trimmed together.

    Offers what the EAGLE drafter reads of a single cache: ``offset`` and ``trim``.
    """

    def __init__(self, count: int):
        self.layers: List[KVCache] = [KVCache() for _ in range(count)]

    @property
    def offset(self) -> int:
        return self.layers[0].offset

    def trim(self, n: int) -> int:
        for cache in self.layers:
            cache.trim(n)
        return n


class GrowingKeys:
    """Keys and values that grow by concatenation (differentiable, unlike ``KVCache``).

    Training unrolls a head's draft steps over whole windows: step ``s``
    attends to the entries of steps ``1..s``, in that order.
    """

    def __init__(self):
        self.keys = self.values = None

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Append ``(B, Nkv, L, D)`` keys and values; return all of them."""
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        return self.keys, self.values
