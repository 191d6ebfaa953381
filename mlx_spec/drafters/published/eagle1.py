"""The EAGLE authors' original heads (EAGLE-1, also used by EAGLE-2's dynamic trees).

The head reads the target's last hidden state (after its final norm) and
the next token: ``fc`` (with a bias) maps ``[embedding, feature]`` to width
``H``, and llama decoder layers follow, the first without its input norm.
Its output predicts the target's next feature, so the target's own output
layer scores it (no norm of its own). Fed its own output and the next
draft token, it drafts deeper.

:class:`Eagle1Head` has the call signature of our own
:class:`~mlx_spec.drafters.heads.EagleHead`, so the EAGLE drafter's chain,
tree and rollback paths run it unchanged.
"""

from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn

from .layers import MLP, Attention, LayerCaches, LayerShape


class Eagle1Layer(nn.Module):
    """A llama decoder layer; the head's first one has no input norm."""

    def __init__(self, shape: LayerShape, first: bool, qkv_bias: bool):
        super().__init__()
        H, eps = shape.hidden_size, shape.rms_norm_eps
        if not first:
            self.input_layernorm = nn.RMSNorm(H, eps=eps)
        self.self_attn = Attention(shape, H)
        if qkv_bias:  # biases on q, k and v only (the authors' qkv_bias)
            attn = self.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                old = getattr(attn, name)
                out, inp = old.weight.shape
                setattr(attn, name, nn.Linear(inp, out, bias=True))
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.mlp = MLP(shape)

    def __call__(self, x, positions, mask, cache=None) -> mx.array:
        normed = self.input_layernorm(x) if "input_layernorm" in self else x
        h = x + self.self_attn(normed, positions, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle1Head(nn.Module):
    """An original EAGLE head (see the module docstring).

    Args:
        args: ``shape`` (:class:`LayerShape`), ``fc_bias``, ``qkv_bias``,
          ``feature_layers`` (``[FINAL]``), ``own_embedding``.
    """

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        self.args = args
        shape = args.shape
        H = shape.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=args.fc_bias)
        self.layers = [
            Eagle1Layer(shape, i == 0, args.qkv_bias) for i in range(shape.num_layers)
        ]
        if args.own_embedding:
            self.embed_tokens = nn.Embedding(shape.vocab_size, H)

    def head_cache(self) -> LayerCaches:
        return LayerCaches(len(self.layers))

    def project(self, features: mx.array) -> mx.array:
        """The target's final normed states are the head's features as they are."""
        return features

    def __call__(self, features, embeddings, positions, mask, cache=None):
        """Head outputs ``(B, L, H)`` (predicted target features) for pairs
        ``(feature, next token)``; arguments as :meth:`Eagle3Head.__call__`."""
        caches = cache.layers if cache is not None else [None] * len(self.layers)
        h = self.fc(mx.concatenate([embeddings, features], axis=-1))
        for layer, layer_cache in zip(self.layers, caches):
            h = layer(h, positions, mask, layer_cache)
        return h, None
