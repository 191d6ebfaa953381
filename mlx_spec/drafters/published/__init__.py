"""Drafters the community publishes, loaded from their checkpoint folders.

Formats (detected from ``config.json``, see :func:`published_format`):

- ``speculators-eagle3``: vLLM's speculators (``speculators_model_type:
  eagle3``, the layer in ``transformer_layer_config``);
- ``eagle3``: SpecForge and the EAGLE authors (``LlamaForCausalLMEagle3``,
  the layer in the top-level config, weights under ``midlayer.``);
- ``speculators-dflash``: speculators' DFlash (``speculators_model_type:
  dflash``);
- ``dflash``: the DFlash authors' (``DFlashDraftModel`` with ``dflash_config``);
- ``eagle``: the EAGLE authors' original EAGLE-1/2 heads (a llama config, and
  weights with a ``2 H``-wide ``fc`` and no ``model.`` prefix).

EAGLE-3 and EAGLE-1/2 heads load as ``eagle`` heads (the EAGLE drafter's chains and
trees), DFlash drafters as ``dflash``. Target layer ids are read in each
format's convention and turned into the target blocks whose outputs are
captured (:mod:`mlx_spec.features`). A head whose target does not match
(hidden size, vocabulary, layer count) is refused in one line. Weights take
the dtype of the target's hidden states and, next to a quantized target,
its quantization (:mod:`mlx_spec.drafters.storage`).
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn

from ...features import FINAL, feature_owner
from ..heads import DraftVocab, LoadedHead
from ..storage import activation_dtype, hidden_width, quantize_like_target
from .dflash import DFlashDraft, DFlashHead
from .eagle1 import Eagle1Head
from .eagle3 import Eagle3Head, OwnVocab
from .layers import layer_shape

FORMATS = ("speculators-eagle3", "eagle3", "speculators-dflash", "dflash", "eagle")
KIND_OF_FORMAT = {
    "speculators-eagle3": "eagle",
    "eagle3": "eagle",
    "speculators-dflash": "dflash",
    "dflash": "dflash",
    "eagle": "eagle",
}


def _read_config(path) -> Optional[Dict]:
    file = Path(path).expanduser() / "config.json"
    if not file.is_file():
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # bad JSON or bad UTF-8: not a published drafter
        return None
    return config if isinstance(config, dict) else None


def format_of_config(config: Dict) -> Optional[str]:
    """The published format a ``config.json`` dict describes, or ``None``."""
    kind = config.get("speculators_model_type")
    if kind == "eagle3":
        return "speculators-eagle3"
    if kind == "dflash":
        return "speculators-dflash"
    archs = [str(a) for a in config.get("architectures") or []]
    if any("Eagle3" in a for a in archs):
        return "eagle3"
    if any("DFlash" in a for a in archs):  # DFlash2 is refused when loaded
        return "dflash"
    return None


def tensor_names(path) -> List[str]:
    """Names of the tensors in a folder's safetensors files, from their headers only."""
    names: List[str] = []
    for file in sorted(Path(path).expanduser().glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size < 1 << 26 else {}
        except (OSError, ValueError):
            continue
        names.extend(k for k in header if k != "__metadata__")
    return names


def _is_eagle1(config: Dict, path) -> bool:
    """A llama config over an EAGLE-1/2 head's weights (``fc``, bare ``layers.``)."""
    if config.get("model_type") != "llama":
        return False
    names = set(tensor_names(path))
    foreign = ("model.", "midlayer.")
    return (
        "fc.weight" in names
        and any(n.startswith("layers.0.") for n in names)
        and not any(n.startswith(foreign) or "hidden_norm" in n for n in names)
    )


def published_format(path) -> Optional[str]:
    """The published format of the folder ``path`` (one of :data:`FORMATS`), or ``None``."""
    config = _read_config(path) if path else None
    if config is None:
        return None
    fmt = format_of_config(config)
    if fmt is None and _is_eagle1(config, path):
        fmt = "eagle"
    return fmt


def published_kind(path) -> Optional[str]:
    """``"eagle"`` or ``"dflash"`` for a published drafter folder, else ``None``."""
    fmt = published_format(path)
    return None if fmt is None else KIND_OF_FORMAT[fmt]


# --------------------------------------------------------------------------- #
# Reading each format into one description
# --------------------------------------------------------------------------- #


def _blocks_from_ids(ids: List[int], convention: str) -> List[int]:
    """Target layer ids -> the target blocks whose outputs are the features.

    ``input``: id ``i`` is the input of layer ``i`` (vLLM and speculators),
    i.e. the output of block ``i - 1``. ``output``: id ``i`` is block ``i``'s
    output (SGLang's and SpecForge's ``eagle_config``, the DFlash authors'
    ``hidden_states[i + 1]``).
    """
    return [int(i) - 1 if convention == "input" else int(i) for i in ids]


def _default_ids(num_target_layers: int) -> List[int]:
    """speculators' and vLLM's default EAGLE-3 layers: low, middle, high."""
    return [2, num_target_layers // 2, num_target_layers - 3]


def describe(config: Dict, fmt: str, num_target_layers: int, where: str):
    """``(kind, args)``: the module arguments a checkpoint's config describes.

    ``num_target_layers`` resolves default layer ids (a config may leave them
    to the target, as speculators does).
    """
    if fmt == "eagle":
        shape = layer_shape(config, where)
        args = SimpleNamespace(
            shape=shape,
            target_hidden_size=shape.hidden_size,
            num_aux=1,
            layer_ids=["final"],
            feature_layers=[FINAL],
            fc_bias=True,
            qkv_bias=bool(config.get("qkv_bias", False)),
            own_embedding=False,
        )
        return "eagle1", args
    if fmt in ("speculators-eagle3", "speculators-dflash"):
        layer_config = config.get("transformer_layer_config")
        if not isinstance(layer_config, dict):
            raise ValueError(f"{where}: the config has no transformer_layer_config.")
    else:
        layer_config = config
    shape = layer_shape(layer_config, where)
    target_hidden = int(config.get("target_hidden_size") or shape.hidden_size)
    if fmt in ("speculators-eagle3", "eagle3"):
        # speculators' top-level ids name layer inputs (vLLM's convention);
        # SpecForge's eagle_config ids name layer outputs (SGLang adds one).
        ids, convention = config.get("eagle_aux_hidden_state_layer_ids"), "input"
        if ids is None:
            nested = config.get("eagle_config") or {}
            ids, convention = nested.get("eagle_aux_hidden_state_layer_ids"), "output"
        if not ids:
            ids, convention = _default_ids(num_target_layers), "input"
        ids = list(ids)
        draft_vocab = int(config.get("draft_vocab_size") or shape.vocab_size)
        args = SimpleNamespace(
            shape=shape,
            target_hidden_size=target_hidden,
            num_aux=len(ids),
            layer_ids=ids,
            feature_layers=_blocks_from_ids(ids, convention),
            draft_vocab_size=draft_vocab,
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            norm_before_fc=bool(config.get("norm_before_fc", False)),
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", False)),
            own_embedding=False,
        )
        return "eagle", args
    if fmt == "speculators-dflash":
        ids = config.get("aux_hidden_state_layer_ids") or _default_ids(
            num_target_layers
        )
        blocks = _blocks_from_ids(ids, "input")
        block_size = int(config.get("block_size", 8))
        mask_id = config.get("mask_token_id")
        draft_vocab = config.get("draft_vocab_size")
        extra = {}
        if config.get("sample_from_anchor"):
            raise ValueError(
                f"{where}: DFlash drafters that sample from the anchor "
                "(sample_from_anchor) are not supported."
            )
    else:
        extra = config.get("dflash_config") or {}
        arch = (config.get("architectures") or [None])[0]
        if arch != "DFlashDraftModel":
            raise ValueError(
                f"{where}: {arch} drafters are not supported (DFlashDraftModel is)."
            )
        ids = extra.get("target_layer_ids", config.get("target_layer_ids"))
        if not ids:
            raise ValueError(f"{where}: dflash_config.target_layer_ids is missing.")
        blocks = _blocks_from_ids(ids, "output")
        block_size = int(extra.get("block_size", config.get("block_size", 16)))
        mask_id = extra.get("mask_token_id", config.get("mask_token_id"))
        draft_vocab = None
    if mask_id is None:
        raise ValueError(f"{where}: the config names no mask_token_id.")
    if shape.sliding or config.get("is_causal"):
        raise ValueError(
            f"{where}: DFlash drafters with sliding-window or causal layers are "
            "not supported."
        )
    if draft_vocab is not None and int(draft_vocab) == shape.vocab_size:
        draft_vocab = None  # the target's own output layer
    args = SimpleNamespace(
        shape=shape,
        target_hidden_size=target_hidden,
        num_aux=len(ids),
        layer_ids=list(ids),
        feature_layers=blocks,
        block_size=block_size,
        mask_token_id=int(mask_id),
        draft_vocab_size=None if draft_vocab is None else int(draft_vocab),
        logit_scale=float(extra.get("output_multiplier", 1.0)),
        softcap=float(extra.get("final_logit_softcapping") or 0.0),
        own_embedding=False,
    )
    return "dflash", args


# --------------------------------------------------------------------------- #
# Weights
# --------------------------------------------------------------------------- #


def _weight_files(path: Path) -> List[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        bins = sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))
        hint = (
            f" (it has {bins[0].name}: save it as safetensors first, e.g. with "
            "safetensors.torch.save_file)"
            if bins
            else ""
        )
        raise ValueError(f"'{path}' holds no .safetensors weights{hint}.")
    return files


def read_weights(path: Path) -> Dict[str, mx.array]:
    """Every tensor of the folder's safetensors files, SpecForge names as speculators'."""
    weights: Dict[str, mx.array] = {}
    for file in _weight_files(path):
        weights.update(mx.load(str(file)))
    renamed = {}
    for name, value in weights.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        renamed[name] = value
    return renamed


def draft_ids(
    weights: Dict[str, mx.array], size: int, where: str
) -> Optional[mx.array]:
    """Target id of each draft column from ``d2t`` (offsets), ``None`` when it is
    absent or maps every column to itself."""
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)
    if d2t is None:
        return None
    if d2t.shape[0] != size:
        raise ValueError(
            f"{where}: d2t has {d2t.shape[0]} entries for a draft vocabulary of {size}."
        )
    ids = mx.arange(size) + d2t.astype(mx.int64)
    if not bool(mx.any(d2t != 0)):
        return None
    return ids.astype(mx.int32)


# --------------------------------------------------------------------------- #
# Checking against the target and loading
# --------------------------------------------------------------------------- #


def target_mismatch(
    args: SimpleNamespace, target: nn.Module, vocab: int
) -> Optional[str]:
    """Why a head described by ``args`` cannot draft for ``target``, or ``None``."""
    count = len(feature_owner(target).layers)
    width = hidden_width(target)
    if args.target_hidden_size != width:
        return f"it reads hidden states of width {args.target_hidden_size}, the target's are {width}"
    if args.shape.vocab_size != vocab:
        return (
            f"its vocabulary has {args.shape.vocab_size} tokens, the target's {vocab}"
        )
    bad = [i for i in args.feature_layers if not (0 <= i < count or i == FINAL)]
    if bad:
        return (
            f"it reads target layers {args.layer_ids}, beyond the target's {count} "
            "blocks (or the embeddings)"
        )
    return None


def load_published(path, target: nn.Module, vocab_size: Optional[int] = None):
    """Load a published drafter folder for ``target``.

    Returns:
        A :class:`~mlx_spec.drafters.heads.LoadedHead` of kind ``eagle``
        (EAGLE-3 formats) or a :class:`~.dflash.DFlashDraft`.

    Raises:
        ValueError: One line naming the folder and what is wrong.
    """
    from ...models import output_size

    path = Path(path).expanduser()
    where = str(path)
    config = _read_config(path)
    fmt = published_format(path)
    if fmt is None:
        raise ValueError(
            f"'{where}' holds no published drafter ({', '.join(FORMATS)})."
        )
    count = len(feature_owner(target).layers)
    kind, args = describe(config, fmt, count, where)
    vocab = vocab_size or output_size(target)
    reason = target_mismatch(args, target, vocab)
    if reason is not None:
        raise ValueError(
            f"the {fmt} drafter in '{where}' does not fit this target: {reason}."
        )
    weights = read_weights(path)
    size = getattr(args, "draft_vocab_size", None) or args.shape.vocab_size
    ids = draft_ids(weights, size, where)
    args.own_embedding = "embed_tokens.weight" in weights
    for unused in ("verifier_lm_head.weight", "verifier_norm.weight"):
        weights.pop(unused, None)
    if kind == "eagle" and "lm_head.weight" not in weights:
        raise ValueError(f"'{where}': the EAGLE-3 head has no lm_head weights.")
    if kind == "eagle1":
        args.fc_bias = "fc.bias" in weights  # the weights tell whether fc has one
    modules = {"eagle": Eagle3Head, "eagle1": Eagle1Head, "dflash": DFlashHead}
    module = modules[kind](args)
    dtype = activation_dtype(target)
    try:
        module.load_weights([(k, v.astype(dtype)) for k, v in weights.items()])
    except ValueError as e:
        first = str(e).splitlines()[0]
        raise ValueError(
            f"'{where}': weights do not match its config ({first})."
        ) from None
    quantize_like_target(module, target)
    module.eval()
    mx.eval(module.parameters())
    if kind == "dflash":
        return DFlashDraft(module, ids, vocab, target, config, where)
    if kind == "eagle1":  # scored by the target's own output layer
        own = DraftVocab(target, None, vocab)
        return PublishedHead(module, config, own, target, where, fmt)
    return PublishedHead(
        module, config, OwnVocab(module, ids, vocab), target, where, fmt
    )


class PublishedHead(LoadedHead):
    """An EAGLE-3 head bound to its target; drafts as an ``eagle`` head.

    Attributes:
        format: The checkpoint's format (one of :data:`FORMATS`).
    """

    def __init__(self, module, config, vocab, target, path, fmt: str):
        super().__init__("eagle", module, config, vocab, target, path)
        self.format = fmt

    def embed(self, tokens: mx.array) -> mx.array:
        if "embed_tokens" in self.module:
            return self.module.embed_tokens(tokens)
        return super().embed(tokens)


__all__ = [
    "FORMATS",
    "PublishedHead",
    "describe",
    "format_of_config",
    "load_published",
    "published_format",
    "published_kind",
]
