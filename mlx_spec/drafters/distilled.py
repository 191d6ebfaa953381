"""Distilled draft models: a drafter directory of kind ``"draft"``.

A distilled draft is a few decoder layers of the target's own architecture
with two changes that make a draft step cheap:

- it reads the target's input embedding (shared at load time, not stored),
  since an embedding lookup costs nothing but its table is large;
- its output layer covers only the ``k`` most frequent target tokens, as in
  EAGLE-3 (a 49152 x 576 output layer alone would cost 20% of a SmolLM2-135M
  step). Its logits are scattered back to the target's full vocabulary with
  ``-inf`` elsewhere, so every drafter and acceptance rule sees an ordinary
  full-width draft whose law is zero outside the subset, which keeps
  rejection sampling exact.

The result behaves like an mlx-lm model (``model(inputs, cache)``, ``layers``,
``make_cache``, ``args.vocab_size``), so ``--speculative draft|tree|auto``
and mlx-lm's own speculative decoding run it unchanged.

Directory layout (the one draft heads use, :mod:`mlx_spec.drafters.heads`)::

    config.json          {"mlx_spec_head": {"kind": "draft", "format": 1},
                          "draft": {...shape...}, "target": {...fingerprint...}, ...}
    draft.safetensors    layers.*, norm.weight, lm_head.weight, lm_head.token_ids
    README.md            the model card

Weights are stored in float16. On load they take the dtype of the target's
hidden states (float32 for a float32 target on a CPU), and next to a
quantized target the layers take its quantization
(:mod:`mlx_spec.drafters.storage`).
"""

import copy
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..features import feature_owner, output_layer
from ..fingerprint import fingerprint_mismatch, model_fingerprint
from .heads import CONFIG_FILE, HEAD_KEY, read_head_config
from .storage import (
    Quantization,
    activation_dtype,
    block_quantization,
    matmul_rows,
    output_quantization,
    quantize_linears,
)

WEIGHTS_FILE = "draft.safetensors"
FORMAT_VERSION = 1
KIND = "draft"


class VocabHead(nn.Module):
    """An output layer over a subset of the vocabulary, scattered to full width.

    Args:
        hidden_size: Input width ``H``.
        token_ids: The target ids the head predicts, ``(k,)``.
        vocab_size: The target's output width ``V``.
    """

    def __init__(self, hidden_size: int, token_ids: Sequence[int], vocab_size: int):
        super().__init__()
        ids = mx.array(list(token_ids), dtype=mx.int32)
        self.weight = mx.zeros((len(token_ids), hidden_size))
        self._token_ids = ids
        # Target id -> row of the head; rows past k point at a -inf column.
        inverse = mx.full((vocab_size,), len(token_ids), dtype=mx.int32)
        inverse[ids] = mx.arange(len(token_ids), dtype=mx.int32)
        self._inverse = inverse
        self._vocab_size = vocab_size
        self._quantization: Optional[Quantization] = None
        # Evaluated now: a lazy array is tied to the stream of the thread that
        # built it, and a server decodes on a thread of its own.
        mx.eval(self._token_ids, self._inverse)

    @property
    def quantization(self) -> Optional[Quantization]:
        """``(group_size, bits, mode)`` of the rows, or ``None`` when they are float."""
        return self._quantization

    @property
    def token_ids(self) -> mx.array:
        """``(k,)``: the target id of each column of :meth:`subset_logits`."""
        return self._token_ids

    def to_target(self, columns: mx.array) -> mx.array:
        """Columns of :meth:`subset_logits` -> target token ids (``uint32``)."""
        return self._token_ids[columns].astype(mx.uint32)

    def subset_logits(self, h: mx.array) -> mx.array:
        """Logits over the subset: ``(..., H) -> (..., k)``."""
        return matmul_rows(h, self, self._quantization)

    def quantize(self, quantization: Optional[Quantization]):
        """Hold the rows quantized, as ``(group_size, bits, mode)`` (``None``: as they are)."""
        if quantization is None:
            return
        group_size, bits, mode = quantization
        self.weight, self.scales, *biases = mx.quantize(
            self.weight, group_size, bits, mode=mode
        )
        if biases:
            self.biases = biases[0]
        self._quantization = quantization

    def subset(self, rows: Sequence[int]) -> "VocabHead":
        """A head over some of these rows only (same weights, quantized or not).

        Args:
            rows: ``(k',)`` rows of this head, increasing.
        """
        rows = mx.array([int(r) for r in rows], dtype=mx.int32)
        ids = self._token_ids[rows].tolist()
        head = VocabHead(int(self.weight.shape[1]), ids, self._vocab_size)
        for name in ("weight", "scales", "biases"):
            if name in self:
                setattr(head, name, self[name][rows])
        head._quantization = self._quantization
        mx.eval(head.parameters())
        return head

    def widen(self, small: mx.array) -> mx.array:
        """Columns of the subset ``(..., k)`` -> the full vocabulary ``(..., V)``,
        ``-inf`` elsewhere."""
        pad = mx.full((*small.shape[:-1], 1), -mx.inf, small.dtype)
        return mx.take(mx.concatenate([small, pad], axis=-1), self._inverse, axis=-1)

    def __call__(self, h: mx.array) -> mx.array:
        """Full-vocabulary logits ``(..., V)``, ``-inf`` outside the subset."""
        return self.widen(self.subset_logits(h))


class _CastOutput:
    """A module whose outputs are cast to ``dtype``; everything else delegates."""

    def __init__(self, module, dtype):
        self.module, self.dtype = module, dtype

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs).astype(self.dtype)

    def __getattr__(self, name):
        return getattr(self.module, name)


class DistilledDraft(nn.Module):
    """A few target-architecture layers on the target's embedding, with a :class:`VocabHead`.

    Args:
        body: An mlx-lm ``Model`` of the target's architecture with the
          draft's layers (its embedding is replaced by the target's).
        head: The subset output layer.
        embedding: The target's input embedding module (shared, frozen).
    """

    def __init__(self, body: nn.Module, head: VocabHead, embedding: nn.Module):
        super().__init__()
        self.model = body.model
        self.model.embed_tokens = embedding
        self.lm_head = head
        self.args = body.args
        self.model_type = getattr(body, "model_type", body.args.model_type)
        self._make_cache = getattr(body, "make_cache", None)

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self):
        from mlx_lm.models.cache import KVCache

        if self._make_cache is not None:
            return self._make_cache()
        return [KVCache() for _ in self.layers]

    def hidden(self, inputs: mx.array, cache=None, dtype=None) -> mx.array:
        """Final normalised hidden states ``(B, L, H)``.

        ``dtype``: cast the embeddings read to it (training in lower precision).
        """
        if dtype is None:
            return self.model(inputs, cache)
        embedding = self.model.embed_tokens
        self.model.embed_tokens = _CastOutput(embedding, dtype)
        try:
            return self.model(inputs, cache)
        finally:
            self.model.embed_tokens = embedding

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return self.lm_head(self.hidden(inputs, cache))

    def trainable_state(self) -> Dict[str, mx.array]:
        """The draft's own weights (no shared embedding), flat names."""
        flat = dict(tree_flatten(self.trainable_parameters()))
        return {k: v for k, v in flat.items() if not k.startswith("model.embed_tokens")}

    def freeze_embedding(self):
        self.model.embed_tokens.freeze()

    def read_bytes(self) -> int:
        """Bytes one single-token forward reads (the embedding table is not read)."""
        flat = tree_flatten(self.parameters())
        return sum(v.nbytes for k, v in flat if not k.startswith("model.embed_tokens"))


# --------------------------------------------------------------------------- #
# The target's pieces
# --------------------------------------------------------------------------- #


def input_embedding(model: nn.Module) -> nn.Module:
    """The target's input embedding module (``model.model.embed_tokens``)."""
    return feature_owner(model).embed_tokens


def _dense(module: nn.Module) -> Dict[str, mx.array]:
    """A module's parameters in float32, quantized linears dequantized."""
    flat = dict(tree_flatten(module.parameters()))
    for name, child in module.named_modules():
        if isinstance(child, nn.QuantizedLinear):
            prefix = f"{name}." if name else ""
            flat[prefix + "weight"] = mx.dequantize(
                child.weight,
                child.scales,
                child.get("biases"),
                group_size=child.group_size,
                bits=child.bits,
                mode=getattr(child, "mode", "affine"),
            )
            flat.pop(prefix + "scales", None)
            flat.pop(prefix + "biases", None)
    return {k: v.astype(mx.float32) for k, v in flat.items()}


def _body_args(target: nn.Module, num_layers: int, vocab_size: int):
    args = copy.deepcopy(target.args)
    args.num_hidden_layers = num_layers
    if getattr(args, "layer_types", None) is not None:
        args.layer_types = list(args.layer_types)[:num_layers]
    args.vocab_size = vocab_size
    return args


def _body(target: nn.Module, args) -> nn.Module:
    """An mlx-lm ``Model`` of the target's class with ``args``."""
    return type(target)(args)


# --------------------------------------------------------------------------- #
# Building, saving and loading
# --------------------------------------------------------------------------- #


def target_layer_indices(target: nn.Module, layers: Sequence[int]) -> List[int]:
    """``layers`` as indices of ``target``'s blocks (negative counts from the end)."""
    count = len(target.layers)
    indices = [i + count if i < 0 else i for i in layers]
    if not indices or any(not 0 <= i < count for i in indices):
        raise ValueError(
            f"draft layers {list(layers)} must be indices of the target's "
            f"{count} layers."
        )
    return indices


def build_draft(
    target: nn.Module,
    token_ids: Sequence[int],
    init_layers: Sequence[int],
) -> DistilledDraft:
    """A draft initialised from the target.

    Args:
        target: The target model (any mlx-lm model with the usual layout).
        token_ids: Target ids of the draft vocabulary, ``(k,)``.
        init_layers: Target layers copied into the draft, in order (negative
          counts from the end).

    Returns:
        A float32 :class:`DistilledDraft` whose head rows are the target's
        output rows for ``token_ids`` and whose final norm is the target's.
    """
    embedding = input_embedding(target)
    vocab_size = int(target.args.vocab_size)
    layers = target_layer_indices(target, init_layers)
    body = _body(target, _body_args(target, len(layers), vocab_size))
    for j, i in enumerate(layers):
        body.model.layers[j].update(
            tree_unflatten(list(_dense(target.layers[i]).items()))
        )
    body.model.norm.update(tree_unflatten(list(_dense(target.model.norm).items())))
    head = VocabHead(int(target.args.hidden_size), token_ids, vocab_size)
    head.weight = _output_rows(target, mx.array(list(token_ids)))
    draft = DistilledDraft(body, head, embedding)
    draft.freeze_embedding()
    mx.eval(draft.trainable_state())
    return draft


def _output_rows(target: nn.Module, ids: mx.array) -> mx.array:
    """The target's output-layer rows for ``ids`` (tied or not), ``(k, H)`` float32."""
    layer = output_layer(target)
    if isinstance(layer, nn.Embedding) or getattr(layer, "as_linear", None):
        return layer(ids).astype(mx.float32)  # a (quantized) embedding: its rows
    return _dense(layer)["weight"][ids]


def save_draft(draft: DistilledDraft, out_dir, config: dict):
    """Write ``draft.safetensors`` (float16) and ``config.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {
        (name[len("model.") :] if name.startswith("model.") else name): v.astype(
            mx.float16
        )
        for name, v in draft.trainable_state().items()
    }
    weights["lm_head.token_ids"] = draft.lm_head.token_ids
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    text = json.dumps(config, indent=2) + "\n"
    (out / CONFIG_FILE).write_text(text, encoding="utf-8")


def save_as_mlx_lm(draft: DistilledDraft, target_dir, out_dir) -> Path:
    """Write ``draft`` as an ordinary mlx-lm checkpoint, for tools that load only those.

    mlx-lm's own speculative decoding (``mlx_lm.server --draft-model``) needs
    a full-vocabulary draft: the output layer is widened to the target's
    vocabulary with zero rows outside the draft's tokens (logit 0 there, not
    ``-inf``), and the shared embedding is stored. That step reads the whole
    ``V x H`` output layer, which is what the subset head avoids.
    """
    import shutil

    target_dir, out = Path(target_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((target_dir / "config.json").read_text())
    config.update(
        num_hidden_layers=len(draft.layers),
        tie_word_embeddings=False,
        model_type=draft.model_type,
    )
    if getattr(draft.args, "layer_types", None) is not None:
        config["layer_types"] = list(draft.args.layer_types)
    weights = {"model." + k: v for k, v in tree_flatten(draft.model.parameters())}
    head = draft.lm_head
    # A quantized head widens too: zero rows of codes, scales and biases.
    for name in ("weight", "scales", "biases"):
        rows = head.get(name)
        if rows is not None:
            full = mx.zeros((draft.args.vocab_size, rows.shape[1]), rows.dtype)
            full[head.token_ids] = rows
            weights[f"lm_head.{name}"] = full
    mx.save_safetensors(str(out / "model.safetensors"), weights, {"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, out / name)
    return out


def drafter_config(
    draft: DistilledDraft, target: nn.Module, init_layers: Sequence[int], **extra
) -> dict:
    """The ``config.json`` contents of ``draft`` trained for ``target``."""
    return {
        HEAD_KEY: {"kind": KIND, "format": FORMAT_VERSION},
        "draft": {
            "num_layers": len(draft.layers),
            "draft_vocab_size": int(draft.lm_head.token_ids.size),
            "init_layers": list(init_layers),
            "dtype": "float16",
        },
        "target": model_fingerprint(target),
        **extra,
    }


def is_draft_dir(path) -> bool:
    """Whether ``path`` holds a distilled draft (a drafter directory of kind "draft")."""
    config = read_head_config(path)
    return config is not None and config[HEAD_KEY].get("kind") == KIND


def load_draft(path, target: nn.Module, *, like_target: bool = True) -> DistilledDraft:
    """Load a distilled draft for ``target``, checking it was trained for it.

    Args:
        path: The drafter directory.
        target: The loaded target model (its embedding is shared).
        like_target: Quantize the draft's layers as the target's blocks and
          its output layer as the target's, when those are quantized
          (:mod:`mlx_spec.drafters.storage`); ``False`` keeps float weights
          (to train on). Default: ``True``.

    Returns:
        The draft, in the dtype of the target's hidden states (float32 for a
        float32 target; weights are stored as float16).

    Raises:
        ValueError: One line: not a draft directory, unreadable weights, or
          a target that does not match (shape, vocabulary, weights).
    """
    config = read_head_config(path)
    if config is None or config[HEAD_KEY].get("kind") != KIND:
        raise ValueError(
            f"'{path}' holds no distilled draft ({CONFIG_FILE} of kind 'draft')."
        )
    if config[HEAD_KEY].get("format", 0) > FORMAT_VERSION:
        raise ValueError(
            f"the draft in '{path}' has format {config[HEAD_KEY]['format']}; this "
            f"mlx-spec reads up to {FORMAT_VERSION}. Upgrade mlx-spec."
        )
    reason = fingerprint_mismatch(config.get("target", {}), target)
    if reason is not None:
        raise ValueError(
            f"the draft in '{path}' was trained for another target ({reason}); "
            "train one for this model with mlx_spec train-draft."
        )
    try:
        weights = mx.load(str(Path(path).expanduser() / WEIGHTS_FILE))
    except Exception as e:  # a missing or truncated file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot read the weights of '{path}': {first}") from None
    token_ids = weights.pop("lm_head.token_ids", None)
    if token_ids is None:
        raise ValueError(f"the weights of '{path}' have no lm_head.token_ids.")
    vocab_size = int(target.args.vocab_size)
    args = _body_args(target, int(config["draft"]["num_layers"]), vocab_size)
    head = VocabHead(int(target.args.hidden_size), token_ids.tolist(), vocab_size)
    embedding = input_embedding(target)
    draft = DistilledDraft(_body(target, args), head, embedding)
    dtype = activation_dtype(target)
    named = {
        (k if k.startswith("lm_head.") else "model." + k): v.astype(dtype)
        for k, v in weights.items()
    }
    expected = set(draft.trainable_state())
    if set(named) != expected:
        missing = sorted(expected - set(named))[:2]
        unexpected = sorted(set(named) - expected)[:2]
        raise ValueError(
            f"the weights in '{path}' do not fit its {CONFIG_FILE} "
            f"(missing {missing}, unexpected {unexpected})."
        )
    draft.load_weights(list(named.items()), strict=False)
    if like_target:
        quantize_linears(draft.model, block_quantization(target))
        head.quantize(output_quantization(target))
    draft.eval()
    mx.eval(draft.parameters())
    return draft


def draft_vocabulary(
    counts: Dict[int, int], size: int, always: Sequence[int] = ()
) -> List[int]:
    """The ``size`` most frequent ids (ties by id), always including ``always``, sorted."""
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    chosen = list(dict.fromkeys([*always, *ranked]))[:size]
    return sorted(chosen)
