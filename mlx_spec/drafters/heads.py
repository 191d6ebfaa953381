"""Draft heads on a target's hidden states: EAGLE and Medusa, and their files.

Both read the target's features (see :mod:`mlx_spec.features`) and map
their own hidden states to tokens with the target's frozen output layer,
optionally restricted to a *draft vocabulary* (the ``k`` most frequent
tokens, as in EAGLE-3), which makes a head step a fraction of the cost of
the full ``V x H`` output layer.

- :class:`EagleHead`: one decoder layer over ``fc([embed(x_{t+1}), f_t])``
  that predicts the next feature ``f_{t+1}`` (EAGLE-1/2); fed its own
  outputs, it drafts several tokens ahead. It keeps a small KV cache.
- :class:`MedusaHeads`: ``K`` residual blocks on the last feature, head
  ``k`` predicting the token ``k + 1`` positions ahead (Medusa-1).
- ``eagle3``: an EAGLE head in EAGLE-3's architecture
  (:class:`~mlx_spec.drafters.published.eagle3.Eagle3Head`: ``fc`` fuses
  several target blocks, one decoder layer over ``[embedding; feature]``,
  its own final norm and output layer over the draft vocabulary). It
  drafts as an ``eagle`` head and exports to speculators' format
  (:mod:`mlx_spec.drafters.published.export`).

A head directory holds ``config.json`` (with the key :data:`HEAD_KEY`
naming the kind and the architecture, the head's shape, the draft
vocabulary size and the target's fingerprint) and ``head.safetensors``.
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..features import FINAL, embed, feature_logits, output_layer
from .storage import (
    activation_dtype,
    block_quantization,
    hidden_width,
    matmul_rows,
    quantization_of,
    quantize_like_target,
    quantize_linears,
)

HEAD_KEY = "mlx_spec_head"
KINDS = ("eagle", "medusa")  # what a head drafts as
# What a head is built as -> what it drafts as.
ARCHITECTURES = {"eagle": "eagle", "eagle3": "eagle", "medusa": "medusa"}
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 1


def _rope(x: mx.array, positions: mx.array, base: float) -> mx.array:
    """Rotate ``x`` ``(B, L, N, D)`` at per-token ``positions`` ``(B, L)`` -> ``(B, N, L, D)``."""
    B, L, N, D = x.shape
    rows = x.reshape(B * L, N, 1, D)
    rows = mx.fast.rope(
        rows,
        D,
        traditional=False,
        base=base,
        scale=1.0,
        offset=positions.reshape(-1).astype(mx.int32),
    )
    return rows.reshape(B, L, N, D).transpose(0, 2, 1, 3)


class HeadAttention(nn.Module):
    """Grouped-query attention with explicit positions and an explicit mask."""

    def __init__(self, dims: int, heads: int, kv_heads: int, rope_theta: float):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = dims // heads
        self.scale = self.head_dim**-0.5
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(dims, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dims, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dims, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dims, bias=False)

    def project(self, x: mx.array, positions: mx.array):
        """``x`` ``(B, L, H)`` -> queries ``(B, N, L, D)``, keys and values ``(B, Nkv, L, D)``."""
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(B, L, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(B, L, self.kv_heads, self.head_dim)
        q = _rope(q, positions, self.rope_theta)
        k = _rope(k, positions, self.rope_theta)
        return q, k, v.transpose(0, 2, 1, 3)

    def attend(self, q, keys, values, mask: mx.array) -> mx.array:
        """Attention of ``q`` over ``keys``/``values`` where ``mask`` ``(.., L, S)`` is True."""
        out = mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=self.scale, mask=mask
        )
        B, _, L, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class HeadBlock(nn.Module):
    """A pre-norm decoder layer (attention and SwiGLU MLP), llama-style."""

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        H = args.hidden_size
        self.input_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.attn = HeadAttention(
            H, args.num_attention_heads, args.num_key_value_heads, args.rope_theta
        )
        self.post_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.gate_proj = nn.Linear(H, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, H, bias=False)

    def __call__(self, x, positions, mask, cache=None):
        """One layer over ``x`` ``(B, L, H)``.

        Args:
            x: Inputs ``(B, L, H)``.
            positions: Rope positions ``(B, L)``.
            mask: Bool visibility ``(L, S)`` or ``(B, 1, L, S)`` over the keys.
            cache: A ``KVCache`` (or training's ``GrowingKeys``): the new
              keys are appended and all are read.

        Returns:
            ``(out (B, L, H), (keys, values))`` of the new positions.
        """
        q, k, v = self.attn.project(self.input_norm(x), positions)
        if cache is not None:
            keys, values = cache.update_and_fetch(k, v)
        else:
            keys, values = k, v
        h = x + self.attn.attend(q, keys, values, mask)
        y = self.post_norm(h)
        return h + self.down_proj(nn.silu(self.gate_proj(y)) * self.up_proj(y)), (k, v)


class EagleHead(nn.Module):
    """EAGLE-style head: ``g_{t+1} = layer(fc([norm(embed(x_{t+1})), norm(f_t)]))``.

    ``f_t`` is the target's feature at ``t`` (width ``H``; several feature
    layers are first projected to ``H``) or the head's own previous output
    when drafting deeper; ``g_{t+1}`` predicts ``f_{t+1}``, so the target's
    output layer maps it to the token after ``x_{t+1}``.
    """

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        self.args = args
        H = args.hidden_size
        width = H * len(args.feature_layers)
        if width != H:
            self.proj = nn.Linear(width, H, bias=False)
        # Both inputs are normed first: the target's features have outlier
        # dimensions far larger than its embeddings.
        self.embed_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.feature_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.block = HeadBlock(args)

    def project(self, features: mx.array) -> mx.array:
        """Target features ``(..., F)`` -> head inputs ``(..., H)``."""
        return self.proj(features) if "proj" in self else features

    def __call__(self, features, embeddings, positions, mask, cache=None):
        """Head outputs ``(B, L, H)`` (and new keys/values) for pairs ``(f_t, x_{t+1})``.

        Args:
            features: ``(B, L, H)`` projected features (or own outputs).
            embeddings: ``(B, L, H)`` target embeddings of the next tokens.
            positions, mask, cache: As in :class:`HeadBlock`.
        """
        x = mx.concatenate(
            [self.embed_norm(embeddings), self.feature_norm(features)], axis=-1
        )
        return self.block(self.fc(x), positions, mask, cache)

    def training_cache(self):
        """A cache that grows by concatenation, for unrolled training steps."""
        from .published.layers import GrowingKeys

        return GrowingKeys()


class ResBlock(nn.Module):
    """``x + silu(W x + b)``, zero-initialised so a new head starts as the identity."""

    def __init__(self, dims: int):
        super().__init__()
        self.linear = nn.Linear(dims, dims)
        self.linear.weight = mx.zeros_like(self.linear.weight)

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``K`` heads on the last feature; head ``k`` predicts the token ``k + 1`` ahead."""

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        self.args = args
        self.heads = [
            [ResBlock(args.hidden_size) for _ in range(args.num_layers)]
            for _ in range(args.num_heads)
        ]

    def __call__(self, features: mx.array) -> mx.array:
        """``(..., H)`` -> ``(..., K, H)``: each head's hidden state."""
        outs = []
        for blocks in self.heads:
            h = features
            for block in blocks:
                h = block(h)
            outs.append(h)
        return mx.stack(outs, axis=-2)


MODULES = {"eagle": EagleHead, "medusa": MedusaHeads}


def head_args(kind: str, target: nn.Module, **options) -> SimpleNamespace:
    """A head's shape for ``target``, mlx-lm style (defaults from the target).

    EAGLE: the target's attention heads, KV heads, MLP width, norm epsilon
    and rope base for its one layer; ``feature_layers`` (default
    ``[FINAL]``). Medusa: ``num_heads`` (default 4) of ``num_layers``
    residual blocks (default 1). EAGLE-3: ``feature_layers`` (target blocks,
    no final state) and ``draft_vocab_size`` (default: the target's
    vocabulary), the layer shaped as the target's.
    """
    if kind == "eagle3":
        return _eagle3_args(target, **options)
    targs = getattr(target, "args", SimpleNamespace())
    H = hidden_width(target)
    if kind == "eagle":
        heads = getattr(targs, "num_attention_heads", max(H // 64, 1))
        if H % heads:
            heads = max(H // 64, 1)
        kv = getattr(targs, "num_key_value_heads", None) or heads
        if heads % kv:
            kv = heads
        base = dict(
            hidden_size=H,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=getattr(targs, "intermediate_size", 4 * H),
            rms_norm_eps=getattr(targs, "rms_norm_eps", 1e-6),
            rope_theta=float(getattr(targs, "rope_theta", 10000.0)),
            feature_layers=[FINAL],
        )
    elif kind == "medusa":
        base = dict(hidden_size=H, num_heads=4, num_layers=1)
    else:
        raise ValueError(f"unknown head kind '{kind}'; use one of: {', '.join(KINDS)}.")
    base.update({k: v for k, v in options.items() if v is not None})
    if kind == "eagle":
        base["feature_layers"] = [int(i) for i in base["feature_layers"]]
    return SimpleNamespace(**base)


def _eagle3_args(
    target: nn.Module,
    *,
    feature_layers: Optional[Sequence[int]] = None,
    draft_vocab_size: Optional[int] = None,
) -> SimpleNamespace:
    """EAGLE-3 head arguments reading target blocks ``feature_layers``
    (default: :func:`~mlx_spec.features.eagle3_blocks`)."""
    from ..features import eagle3_blocks, feature_owner
    from .published.eagle3 import eagle3_args_for

    if feature_layers is None:
        feature_layers = eagle3_blocks(len(feature_owner(target).layers))
    layers = [int(i) for i in feature_layers]
    if not layers or FINAL in layers:
        raise ValueError(
            f"an eagle3 head fuses target blocks (got feature layers {layers}); "
            f"pass block indices 0.. without {FINAL}, the final normed state."
        )
    # speculators names the input of layer i, i.e. block i - 1's output.
    return eagle3_args_for(
        target,
        layer_ids=[i + 1 for i in layers],
        draft_vocab_size=draft_vocab_size,
    )


class DraftVocab:
    """The target's frozen output layer, optionally restricted to some tokens.

    Args:
        target: The target model.
        ids: ``(k,)`` target token ids the head may propose, or ``None`` for all.
        vocab_size: Width of the full logits rows (the target's output size).
    """

    def __init__(self, target: nn.Module, ids: Optional[mx.array], vocab_size: int):
        self.target = target
        self.vocab_size = vocab_size
        self.ids = None if ids is None else ids.astype(mx.int32)
        self.layer = None
        if self.ids is not None:
            self.layer = _output_rows(output_layer(target), self.ids)
        self.extra_ids: Optional[mx.array] = None  # see :meth:`with_tokens`
        self.extra_layer = None
        if self.ids is not None:  # not lazy: a server decodes on another thread
            mx.eval(self.ids, self.layer.parameters())

    @property
    def size(self) -> int:
        if self.ids is None:
            return self.vocab_size
        extra = 0 if self.extra_ids is None else int(self.extra_ids.shape[0])
        return int(self.ids.shape[0]) + extra

    def with_tokens(self, tokens: Sequence[int]) -> "DraftVocab":
        """This vocabulary plus ``tokens`` (e.g. a prompt's), as a new object.

        The output layer is the target's own, so any of its rows can score a
        head's features: a prompt's rare tokens (names, code it may copy)
        become proposable for that call. ``self`` is left unchanged.
        """
        if self.ids is None:
            return self
        have = set(self.ids.tolist())
        if self.extra_ids is not None:
            have.update(self.extra_ids.tolist())
        new = sorted({int(t) for t in tokens if 0 <= int(t) < self.vocab_size} - have)
        if not new:
            return self
        out = object.__new__(DraftVocab)
        out.__dict__.update(self.__dict__)
        old = [] if self.extra_ids is None else self.extra_ids.tolist()
        out.extra_ids = mx.array(old + new, mx.int32)
        out.extra_layer = _output_rows(output_layer(self.target), out.extra_ids)
        return out

    def small_logits(self, h: mx.array) -> mx.array:
        """``(..., H) -> (..., k)``: logits over the draft vocabulary only."""
        if self.layer is None:
            return feature_logits(self.target, h)
        if self.extra_layer is None:
            return self.layer(h)
        return mx.concatenate([self.layer(h), self.extra_layer(h)], axis=-1)

    @property
    def all_ids(self) -> Optional[mx.array]:
        """Target id of each column of :meth:`small_logits` (``None``: all)."""
        if self.ids is None or self.extra_ids is None:
            return self.ids
        return mx.concatenate([self.ids, self.extra_ids])

    def logits(self, h: mx.array) -> mx.array:
        """``(R, H) -> (R, V)``: target-width logits, ``-inf`` outside the draft vocabulary."""
        return self.widen(self.small_logits(h))

    def widen(self, small: mx.array) -> mx.array:
        """``(R, C) -> (R, V)``: columns of :meth:`small_logits` at their target
        ids, ``-inf`` elsewhere."""
        ids = self.all_ids
        if ids is None:
            return small
        full = mx.full((small.shape[0], self.vocab_size), -mx.inf, small.dtype)
        full[:, ids] = small
        return full

    def to_target(self, index: mx.array) -> mx.array:
        """Draft-vocabulary indices -> target token ids (``uint32``)."""
        ids = self.all_ids
        return (index if ids is None else ids[index]).astype(mx.uint32)


class _QuantizedRows(nn.Module):
    """Rows of a quantized output layer, applied as ``x @ W.T``."""

    def __init__(self, layer: nn.Module, ids: mx.array):
        super().__init__()
        self._quantization = quantization_of(layer)
        self.weight = layer.weight[ids]
        self.scales = layer.scales[ids]
        self.biases = None if layer.get("biases") is None else layer.biases[ids]

    def __call__(self, x: mx.array) -> mx.array:
        return matmul_rows(x, self, self._quantization)


def _output_rows(layer: nn.Module, ids: mx.array) -> nn.Module:
    """A linear layer holding only rows ``ids`` of an output layer (float or quantized)."""
    if getattr(layer, "scales", None) is not None:
        return _QuantizedRows(layer, ids)
    weight = layer.weight[ids]
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    out.weight = weight
    mx.eval(out.weight)
    return out


class LoadedHead:
    """A trained head bound to its target: what ``--draft-model DIR`` yields.

    Attributes:
        kind: ``"eagle"`` or ``"medusa"``.
        module: The :class:`EagleHead` or :class:`MedusaHeads`.
        config: The directory's ``config.json``.
        vocab: The :class:`DraftVocab` on the target.
        target: The target model.
    """

    is_head = True

    def __init__(self, kind, module, config, vocab: DraftVocab, target, path=None):
        self.kind = kind
        self.module = module
        self.config = config
        self.vocab = vocab
        self.target = target
        self.path = path

    @property
    def args(self) -> SimpleNamespace:
        return self.module.args

    def embed(self, tokens: mx.array) -> mx.array:
        return embed(self.target, tokens)

    def parameters(self):
        """The head's own weights (for cost estimates)."""
        return self.module.parameters()

    def make_cache(self) -> List:
        """No prompt-cache entries: ``make_prompt_cache(head)`` is ``[]``."""
        return []


def random_head(
    kind: str,
    target: nn.Module,
    *,
    seed: int = 0,
    draft_ids: Optional[mx.array] = None,
    vocab_size: Optional[int] = None,
    **options,
) -> LoadedHead:
    """A head of ``kind`` with random weights bound to ``target`` (tests, training start).

    Medusa's residual blocks get small random weights too (not the identity),
    so their heads disagree with the target.
    """
    mx.random.seed(seed)
    if kind == "eagle3" and draft_ids is not None:
        options["draft_vocab_size"] = int(draft_ids.shape[0])
    module = build_head(kind, head_args(kind, target, **options))
    if kind == "medusa":
        for blocks in module.heads:
            for block in blocks:
                block.linear.weight = 0.5 * mx.random.normal(block.linear.weight.shape)
    mx.eval(module.parameters())
    vocab = head_vocab(kind, module, target, draft_ids, vocab_size or _width(target))
    config = {HEAD_KEY: _head_key(kind)}
    return LoadedHead(ARCHITECTURES[kind], module, config, vocab, target)


def _head_key(architecture: str) -> Dict:
    return {
        "kind": ARCHITECTURES[architecture],
        "architecture": architecture,
        "format": FORMAT_VERSION,
    }


def head_vocab(architecture: str, module, target, ids, vocab_size: int):
    """The output side of a head: the target's output rows ``ids``
    (:class:`DraftVocab`), or an EAGLE-3 head's own output layer."""
    if architecture == "eagle3":
        from .published.eagle3 import OwnVocab

        return OwnVocab(module, ids, vocab_size)
    return DraftVocab(target, ids, vocab_size)


def head_architecture(config: Dict) -> str:
    """What a head directory's head is built as (``eagle``, ``eagle3``, ``medusa``)."""
    key = config[HEAD_KEY]
    return str(key.get("architecture") or key.get("kind"))


def head_record(architecture: str, args: SimpleNamespace) -> Dict:
    """A head's arguments as the JSON its ``config.json`` keeps."""
    if architecture == "eagle3":
        from .published.eagle3 import args_record

        return args_record(args)
    return vars(args)


def args_of_record(architecture: str, record: Dict) -> SimpleNamespace:
    """The arguments :func:`head_record` wrote."""
    if architecture == "eagle3":
        from .published.eagle3 import args_from_record

        return args_from_record(record)
    return SimpleNamespace(**record)


def save_head(
    path,
    kind: str,
    module: nn.Module,
    *,
    target_fingerprint: Dict,
    draft_ids: Optional[mx.array] = None,
    extra: Optional[Dict] = None,
    dtype=mx.float16,
):
    """Write a head directory (``config.json`` + ``head.safetensors``).

    Args:
        path: The directory (created if needed).
        kind: The architecture: ``"eagle"``, ``"eagle3"`` or ``"medusa"``.
        module: The head module.
        target_fingerprint: :func:`mlx_spec.fingerprint.model_fingerprint` of the target.
        draft_ids: ``(k,)`` draft vocabulary (target ids), or ``None`` for all.
        extra: More config entries (training record, tree choices, ...).
        dtype: Storage dtype of the float weights. Default: float16.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(module.parameters())}
    if draft_ids is not None:
        weights["draft_vocab"] = draft_ids.astype(mx.int32)
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights)
    config = {
        HEAD_KEY: _head_key(kind),
        "head": head_record(kind, module.args),
        "draft_vocab_size": None if draft_ids is None else int(draft_ids.shape[0]),
        "target": target_fingerprint,
    }
    config.update(extra or {})
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def read_head_config(path) -> Optional[Dict]:
    """The config of a head directory, or ``None`` if ``path`` holds no head."""
    file = Path(path).expanduser() / CONFIG_FILE
    if not file.is_file():
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # bad JSON or bad UTF-8: no head
        return None
    return config if isinstance(config, dict) and HEAD_KEY in config else None


def build_head(kind: str, args: SimpleNamespace) -> nn.Module:
    """The module of a head of architecture ``kind`` (see :data:`ARCHITECTURES`)."""
    if kind == "eagle3":
        from .published.eagle3 import Eagle3Head

        return Eagle3Head(args)
    if kind not in MODULES:
        raise ValueError(f"unknown head kind '{kind}'; use one of: {', '.join(KINDS)}.")
    return MODULES[kind](args)


def load_head(path, target: nn.Module, vocab_size: Optional[int] = None) -> LoadedHead:
    """Load a head directory for ``target``, checking that it was trained for it.

    The head takes the dtype of the target's hidden states and, next to a
    quantized target, the quantization of its blocks
    (:mod:`mlx_spec.drafters.storage`).

    Raises:
        ValueError: One line naming the problem: not a head, another kind of
          file, or a target that does not match (shape, vocabulary, weights).
    """
    from ..fingerprint import fingerprint_mismatch

    config = read_head_config(path)
    if config is None:
        raise ValueError(
            f"'{path}' holds no draft head (no {CONFIG_FILE} with {HEAD_KEY})."
        )
    kind = config[HEAD_KEY].get("kind")
    architecture = head_architecture(config)
    if kind not in KINDS or ARCHITECTURES.get(architecture) != kind:
        raise ValueError(
            f"'{path}' holds a head of unknown kind '{kind}' ({architecture}); "
            "this version of mlx-spec loads " + ", ".join(ARCHITECTURES) + " heads."
        )
    reason = fingerprint_mismatch(config.get("target", {}), target)
    if reason is not None:
        raise ValueError(
            f"the {kind} head in '{path}' was trained for another target ({reason}); "
            "train one for this model with mlx_spec train-draft."
        )
    weights = mx.load(str(Path(path).expanduser() / WEIGHTS_FILE))
    ids = weights.pop("draft_vocab", None)
    args = args_of_record(architecture, config["head"])
    module = build_head(architecture, args)
    dtype = activation_dtype(target)
    module.load_weights([(k, v.astype(dtype)) for k, v in weights.items()])
    if architecture == "eagle3":  # as the published loader quantizes it
        quantize_like_target(module, target)
    else:
        quantize_linears(module, block_quantization(target))
    module.eval()
    mx.eval(module.parameters())
    if vocab_size is None:
        vocab_size = int(config["target"].get("vocab_size", 0)) or None
    vocab = head_vocab(architecture, module, target, ids, vocab_size or _width(target))
    return LoadedHead(kind, module, config, vocab, target, str(path))


def _width(target: nn.Module) -> int:
    from ..models import output_size

    return output_size(target)


def static_choices(config: Dict) -> Optional[List[Tuple[int, ...]]]:
    """The static tree a Medusa head directory recommends, if any."""
    choices = config.get("tree_choices")
    return [tuple(c) for c in choices] if choices else None
