"""EAGLE-3 heads as speculators, SpecForge and the EAGLE authors publish them.

An EAGLE-3 head reads the target's residual stream at three (or more)
layers, fuses them with ``fc`` to one width-``H`` feature, and runs its
decoder layers on pairs ``(feature of x_t, x_{t+1})``. Its first layer
takes both halves side by side: the token's embedding normed by
``input_layernorm`` and the feature normed by ``hidden_norm`` feed the
attention projections (``2 H`` wide), while the residual is the feature
itself (or the normed feature, ``norm_before_residual``). Its own final
``norm`` and ``lm_head`` score a draft vocabulary that ``d2t`` maps to
target ids (``target = draft + d2t[draft]``). Deeper drafts feed the last
layer's output back as the feature (normed first with ``norm_output``).

:class:`Eagle3Head` has the call signature of our own
:class:`~mlx_spec.drafters.heads.EagleHead`, so the EAGLE drafter's chain,
tree and rollback paths run it unchanged.
"""

from dataclasses import asdict
from types import SimpleNamespace
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

from ...features import feature_owner
from ...models import output_size
from ..storage import hidden_width
from .layers import (
    MLP,
    Attention,
    DecoderLayer,
    GrowingKeys,
    LayerCaches,
    LayerShape,
)


class FirstLayer(nn.Module):
    """EAGLE-3's first decoder layer over ``[norm(embedding), norm(feature)]``."""

    def __init__(self, shape: LayerShape, norm_before_residual: bool):
        super().__init__()
        H, eps = shape.hidden_size, shape.rms_norm_eps
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = nn.RMSNorm(H, eps=eps)
        self.hidden_norm = nn.RMSNorm(H, eps=eps)
        self.self_attn = Attention(shape, 2 * H)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.mlp = MLP(shape)

    def __call__(self, embeddings, features, positions, mask, cache=None):
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        x = mx.concatenate([self.input_layernorm(embeddings), normed], axis=-1)
        h = residual + self.self_attn(x, positions, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (see the module docstring).

    Args:
        args: ``shape`` (:class:`LayerShape`), ``target_hidden_size``,
          ``num_aux`` (fused target layers), ``feature_layers`` (the target
          blocks whose outputs are fused, in order), ``draft_vocab_size``,
          and the flags ``norm_before_residual``, ``norm_before_fc``,
          ``fc_norm``, ``norm_output``, ``own_embedding``.
    """

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        self.args = args
        shape = args.shape
        H, eps = shape.hidden_size, shape.rms_norm_eps
        width = args.num_aux * args.target_hidden_size
        if args.norm_before_fc:
            self.input_norm = nn.RMSNorm(width, eps=eps)
        if args.fc_norm:
            self.fc_norm = [
                nn.RMSNorm(args.target_hidden_size, eps=eps)
                for _ in range(args.num_aux)
            ]
        self.fc = nn.Linear(width, H, bias=False)
        self.layers = [FirstLayer(shape, args.norm_before_residual)] + [
            DecoderLayer(shape) for _ in range(shape.num_layers - 1)
        ]
        self.norm = nn.RMSNorm(H, eps=eps)
        self.lm_head = nn.Linear(H, args.draft_vocab_size, bias=False)
        if args.own_embedding:
            self.embed_tokens = nn.Embedding(shape.vocab_size, H)

    def head_cache(self) -> LayerCaches:
        """A fresh KV cache for the head's layers."""
        return LayerCaches(len(self.layers))

    def project(self, features: mx.array) -> mx.array:
        """Target features ``(..., A * Ht)`` -> the fused feature ``(..., H)``."""
        if "input_norm" in self:
            features = self.input_norm(features)
        if "fc_norm" in self:
            parts = mx.split(features, len(self.fc_norm), axis=-1)
            features = mx.concatenate(
                [norm(p) for norm, p in zip(self.fc_norm, parts)], axis=-1
            )
        return self.fc(features)

    def __call__(self, features, embeddings, positions, mask, cache=None):
        """Head outputs ``(B, L, H)`` for pairs ``(feature, next token)``.

        Args:
            features: ``(B, L, H)`` fused features (or the head's own outputs).
            embeddings: ``(B, L, H)`` embeddings of the next tokens.
            positions: Rope positions ``(B, L)``.
            mask: Bool visibility ``(L, S)`` over the cached and new entries, or ``None``.
            cache: A :class:`LayerCaches` the new entries are appended to
              (or any object whose ``layers`` hold one cache per layer).

        Returns:
            ``(out, None)``: the last layer's output (normed with ``norm_output``).
        """
        caches = cache.layers if cache is not None else [None] * len(self.layers)
        h = self.layers[0](embeddings, features, positions, mask, caches[0])
        for layer, layer_cache in zip(self.layers[1:], caches[1:]):
            h = layer(h, positions, mask, layer_cache)
        if self.args.norm_output:
            h = self.norm(h)
        return h, None

    def training_cache(self) -> SimpleNamespace:
        """Caches that grow by concatenation, one per layer, for unrolled training."""
        return SimpleNamespace(layers=[GrowingKeys() for _ in self.layers])

    def logits(self, h: mx.array) -> mx.array:
        """Head outputs ``(..., H)`` -> draft-vocabulary logits ``(..., C)``."""
        return self.lm_head(h if self.args.norm_output else self.norm(h))


class OwnVocab:
    """A head's own output layer over its draft vocabulary, mapped to target ids.

    The interface of :class:`~mlx_spec.drafters.heads.DraftVocab` the EAGLE
    drafter reads. Its columns are fixed: a prompt's tokens cannot be added,
    since the head has no rows for them.

    Args:
        module: The :class:`Eagle3Head` (its ``logits``).
        ids: ``(C,)`` target id of each draft column, or ``None`` when the draft
          vocabulary is the target's.
        vocab_size: Width of the target's logits.
    """

    def __init__(self, module: Eagle3Head, ids: Optional[mx.array], vocab_size: int):
        self.module = module
        self.ids = None if ids is None else ids.astype(mx.int32)
        self.vocab_size = vocab_size
        self.layer = module.lm_head  # for cost estimates

    @property
    def size(self) -> int:
        return self.vocab_size if self.ids is None else int(self.ids.shape[0])

    @property
    def all_ids(self) -> Optional[mx.array]:
        return self.ids

    def with_tokens(self, tokens) -> "OwnVocab":
        return self

    def small_logits(self, h: mx.array) -> mx.array:
        """``(..., H) -> (..., C)``: logits over the draft vocabulary."""
        return self.module.logits(h)

    def widen(self, small: mx.array) -> mx.array:
        """``(R, C) -> (R, V)``: draft columns at their target ids, ``-inf`` elsewhere."""
        if self.ids is None:
            return small
        full = mx.full((small.shape[0], self.vocab_size), -mx.inf, small.dtype)
        full[:, self.ids] = small
        return full

    def logits(self, h: mx.array) -> mx.array:
        return self.widen(self.small_logits(h))

    def to_target(self, index: mx.array) -> mx.array:
        return (index if self.ids is None else self.ids[index]).astype(mx.uint32)


def args_record(args: SimpleNamespace) -> dict:
    """An :class:`Eagle3Head`'s arguments as a JSON-ready dict (see :func:`args_from_record`)."""
    record = dict(vars(args))
    record["shape"] = asdict(args.shape)
    return record


def args_from_record(record: dict) -> SimpleNamespace:
    """The arguments :func:`args_record` wrote."""
    fields = dict(record)
    fields["shape"] = LayerShape(**fields["shape"])
    return SimpleNamespace(**fields)


def eagle3_args_for(
    target: nn.Module,
    *,
    layer_ids: Optional[Sequence[int]] = None,
    draft_vocab_size: Optional[int] = None,
    model_type: str = "llama",
    num_layers: int = 1,
    **flags,
) -> SimpleNamespace:
    """EAGLE-3 module arguments shaped after ``target`` (its width, heads, vocabulary).

    ``layer_ids`` are in speculators' convention (the input of layer ``i``);
    by default a low, a middle and a high layer of the target.
    """
    targs = getattr(target, "args", SimpleNamespace())
    H = hidden_width(target)
    count = len(feature_owner(target).layers)
    heads = getattr(targs, "num_attention_heads", max(H // 64, 1))
    ids = list(layer_ids) if layer_ids else sorted({1, max(count // 2, 1), count})
    vocab = output_size(target)
    shape = LayerShape(
        model_type=model_type,
        hidden_size=H,
        num_heads=heads,
        num_kv_heads=getattr(targs, "num_key_value_heads", None) or heads,
        head_dim=H // heads,
        intermediate_size=getattr(targs, "intermediate_size", 4 * H),
        rms_norm_eps=getattr(targs, "rms_norm_eps", 1e-6),
        attention_bias=False,
        rope_theta=float(getattr(targs, "rope_theta", 10000.0)),
        rope_scaling=None,
        rotary_dim=H // heads,
        max_position_embeddings=4096,
        num_layers=num_layers,
        vocab_size=vocab,
        sliding=False,
    )
    base = dict(
        norm_before_residual=False,
        norm_before_fc=False,
        fc_norm=False,
        norm_output=False,
    )
    base.update(flags)
    return SimpleNamespace(
        shape=shape,
        target_hidden_size=H,
        num_aux=len(ids),
        layer_ids=ids,
        feature_layers=[i - 1 for i in ids],
        draft_vocab_size=draft_vocab_size or vocab,
        own_embedding=False,
        **base,
    )
