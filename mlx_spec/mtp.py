"""Native multi-token-prediction (MTP) layers that checkpoints ship, as drafters.

Several model families are trained with an MTP module that predicts the
token after next from the model's last hidden state ``h_t`` and the next
token ``x_{t+1}``. mlx-lm drops those weights (each model's ``sanitize``
filters them out), so this module reads them from the checkpoint's
safetensors directly and runs them on mlx-lm's own layer classes; no model
file is forked.

One MTP depth computes, for pairs ``(h_t, x_{t+1})`` at position ``t``::

    x = proj(concat(embed_norm(embed(x_{t+1})), hidden_norm(h_t)))
    g = norm(block(x))                  # a decoder layer of the family
    logits = output_layer(g)            # the target's own head

and ``g`` stands in for ``h_{t+1}`` to chain the next step. ``h_t`` is the
target's final normed hidden state (the output layer's input), which the
engine captures from the verification forward (:mod:`mlx_spec.features`).

Families (names as in the Hugging Face checkpoints):

- ``qwen`` (``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``): ``mtp.fc``,
  ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``,
  ``mtp.layers.0.*`` (a full-attention decoder layer) and ``mtp.norm``.
  Their norms are stored as ``scale - 1`` like the rest of these models.
- ``deepseek`` (``deepseek_v3``, ``glm4_moe``): block ``num_hidden_layers``
  of ``model.layers`` holding ``enorm``, ``hnorm``, ``eh_proj``,
  ``shared_head.norm`` and a decoder layer; the embedding at absolute
  position 0 is zeroed.

References (read, not copied): vLLM's ``vllm/model_executor/models/
qwen3_next_mtp.py``, ``qwen3_5_mtp.py``, ``deepseek_mtp.py`` and
``glm4_moe_mtp.py``; SGLang's ``python/sglang/srt/models/deepseek_nextn.py``.
Choices where they differ or leave room:

- The embedding and output head are the target's own, as SGLang does for
  DeepSeek (its checkpoints' ``embed_tokens`` / ``shared_head.head`` copies
  are not read) and as vLLM does for Qwen.
- Chained steps feed the *normed* output ``g`` back, as SGLang and vLLM's
  Qwen models do (and vLLM's DeepSeek MTP in its recent versions).
- Only the first MTP layer is used, for every step (the checkpoints named
  above ship one).

Sources, in order: ``mtp.safetensors`` (written by ``mlx_spec convert hf``,
already in mlx form and quantized like the model), else the original
``*.safetensors`` (through ``model.safetensors.index.json`` when present).
"""

import json
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

MTP_FILE = "mtp.safetensors"
METADATA_KEY = "mlx_spec_mtp"
FORMAT_VERSION = 1
# model_type -> family style.
FAMILIES = {
    "qwen3_next": "qwen",
    "qwen3_5": "qwen",
    "qwen3_5_moe": "qwen",
    "deepseek_v3": "deepseek",
    "glm4_moe": "deepseek",
}
# Renames of a family's own tensors to this module's names; the rest is the block.
_QWEN_NAMES = {
    "fc": "proj",
    "pre_fc_norm_embedding": "embed_norm",
    "pre_fc_norm_hidden": "hidden_norm",
    "norm": "norm",
}
_DEEPSEEK_NAMES = {
    "eh_proj": "proj",
    "enorm": "embed_norm",
    "hnorm": "hidden_norm",
    "shared_head.norm": "norm",
}
# DeepSeek-style copies of the shared embedding and head: the target's are used.
_DEEPSEEK_SHARED = ("embed_tokens.", "shared_head.head.")


class MTPMissing(ValueError):
    """A checkpoint without MTP weights (one-line message)."""


def missing_message(path) -> str:
    """The one line said when ``path`` holds no MTP weights."""
    return (
        f"'{path}' has no MTP weights (mlx-lm's converter drops them); convert "
        "the original checkpoint with `mlx_spec convert hf ORIGINAL --out DIR` "
        "to keep them, or pass the original as --draft-model."
    )


def model_type(model: nn.Module) -> str:
    return str(getattr(model, "model_type", type(model).__name__))


def text_model(model: nn.Module) -> nn.Module:
    """The language model inside ``model`` (vision-language wrappers hold one)."""
    return getattr(model, "language_model", model)


def family_of(model: nn.Module) -> str:
    """The MTP family of ``model``.

    Raises:
        ValueError: One line naming the model type when it has none.
    """
    kind = model_type(model)
    if kind not in FAMILIES:
        raise ValueError(
            f"model type '{kind}' has no native MTP layers in mlx-spec; "
            f"supported: {', '.join(FAMILIES)}."
        )
    return FAMILIES[kind]


# --------------------------------------------------------------------------- #
# The module
# --------------------------------------------------------------------------- #


class MTPModule(nn.Module):
    """One MTP depth on top of a family's decoder layer (see the module docstring).

    Args:
        block: The family's decoder layer, called as ``block(x, mask, cache)``.
        hidden_size: Model width ``H``.
        eps: The norms' epsilon.
        mask_first: Zero the embedding at absolute position 0 (DeepSeek style).
    """

    def __init__(
        self, block: nn.Module, hidden_size: int, eps: float, mask_first: bool
    ):
        super().__init__()
        self.embed_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.hidden_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.block = block
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.mask_first = mask_first

    def __call__(self, hidden: mx.array, embeddings: mx.array, cache=None) -> mx.array:
        """Outputs ``g`` ``(B, L, H)`` for pairs ``(hidden, embeddings)`` ``(B, L, H)``.

        With ``cache`` (an mlx-lm ``KVCache``) the pairs continue the cached
        ones, causally; rope positions count from the cache's offset.
        """
        from mlx_lm.models.base import create_attention_mask

        x = mx.concatenate(
            [self.embed_norm(embeddings), self.hidden_norm(hidden)], axis=-1
        )
        x = self.proj(x)
        mask = create_attention_mask(x, cache, return_array=True)
        return self.norm(self.block(x, mask, cache))


def _block(model: nn.Module, moe: bool) -> nn.Module:
    """A fresh decoder layer of ``model``'s family, shaped like its MTP block."""
    kind = model_type(model)
    args = text_model(model).args
    if moe and not getattr(args, "num_experts", 1):
        raise ValueError(f"MoE MTP weights for a dense '{kind}' model")
    if kind == "qwen3_next":
        from mlx_lm.models import qwen3_next as m

        # Layer index interval - 1 is a full-attention layer.
        layer = m.Qwen3NextDecoderLayer(args, args.full_attention_interval - 1)
        H = args.hidden_size
        layer.mlp = (
            m.Qwen3NextSparseMoeBlock(args)
            if moe
            else m.Qwen3NextMLP(H, args.intermediate_size)
        )
        return layer
    if kind in ("qwen3_5", "qwen3_5_moe"):
        from mlx_lm.models import qwen3_5 as m

        layer = m.DecoderLayer(args, args.full_attention_interval - 1)
        H = args.hidden_size
        layer.mlp = m.SparseMoeBlock(args) if moe else m.MLP(H, args.intermediate_size)
        return layer
    if kind == "deepseek_v3":
        from mlx_lm.models import deepseek_v3 as m

        return m.DeepseekV3DecoderLayer(args, args.num_hidden_layers)
    from mlx_lm.models import glm4_moe as m

    return m.DecoderLayer(args, args.num_hidden_layers)


def build_module(model: nn.Module, moe: bool) -> MTPModule:
    """An MTP module for ``model`` with fresh (random) weights."""
    style = family_of(model)
    args = text_model(model).args
    return MTPModule(
        _block(model, moe),
        args.hidden_size,
        args.rms_norm_eps,
        mask_first=style == "deepseek",
    )


def _is_moe(weights: Dict[str, mx.array]) -> bool:
    return any(".switch_mlp." in k for k in weights)


# --------------------------------------------------------------------------- #
# Reading the weights
# --------------------------------------------------------------------------- #


def _raw_prefix(style: str, num_layers: int) -> Callable[[str], Optional[str]]:
    """Maps a checkpoint key to its name inside the (first) MTP layer, else ``None``."""

    def qwen(key: str) -> Optional[str]:
        if "mtp." not in key:
            return None
        return key.split("mtp.", 1)[1]

    def deepseek(key: str) -> Optional[str]:
        prefix = f"model.layers.{num_layers}."
        return key[len(prefix) :] if key.startswith(prefix) else None

    return qwen if style == "qwen" else deepseek


def _weight_files(path: Path) -> List[Path]:
    return sorted(p for p in path.glob("*.safetensors") if p.name != MTP_FILE)


def read_raw(path, model: nn.Module) -> Dict[str, mx.array]:
    """The MTP tensors of an original checkpoint, by their names inside the layer.

    Only the files that hold them are opened (``mx.load`` reads lazily).
    Returns ``{}`` when the checkpoint has none.
    """
    path = Path(path)
    style = family_of(model)
    args = text_model(model).args
    name_of = _raw_prefix(style, args.num_hidden_layers)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({f for k, f in weight_map.items() if name_of(k) is not None})
        files = [path / f for f in files]
    else:
        files = _weight_files(path)
    raw: Dict[str, mx.array] = {}
    for file in files:
        for key, value in mx.load(str(file)).items():
            name = name_of(key)
            if name is not None:
                raw[name] = value
    return raw


def _stack_experts(weights: Dict[str, mx.array], prefix: str) -> Dict[str, mx.array]:
    """``{prefix}experts.{e}.{p}.weight`` (or fused ``experts.gate_up_proj``) ->
    ``{prefix}switch_mlp.{p}.weight`` ``(E, out, in)``."""
    out, experts = {}, {}
    for key, value in weights.items():
        rest = key[len(prefix) :] if key.startswith(prefix) else None
        if rest is not None and rest.startswith("experts."):
            experts[rest[len("experts.") :]] = value
        else:
            out[key] = value
    if "gate_up_proj" in experts:  # fused (E, 2I, H), as in Qwen3.5 MoE checkpoints
        gate_up = experts.pop("gate_up_proj")
        mid = gate_up.shape[-2] // 2
        out[f"{prefix}switch_mlp.gate_proj.weight"] = gate_up[..., :mid, :]
        out[f"{prefix}switch_mlp.up_proj.weight"] = gate_up[..., mid:, :]
        out[f"{prefix}switch_mlp.down_proj.weight"] = experts.pop("down_proj")
    count = len({k.split(".")[0] for k in experts})
    for proj in ("gate_proj", "up_proj", "down_proj"):
        rows = [experts.pop(f"{e}.{proj}.weight", None) for e in range(count)]
        if count and all(r is not None for r in rows):
            out[f"{prefix}switch_mlp.{proj}.weight"] = mx.stack(rows)
    if experts:
        raise ValueError(
            f"unexpected expert tensors {sorted(experts)[:3]} under {prefix}"
        )
    return out


def _qwen_from_raw(raw: Dict[str, mx.array]) -> Dict[str, mx.array]:
    """Qwen3-Next / Qwen3.5 MTP tensors -> this module's names, mlx layout."""
    weights = {}
    for key, value in raw.items():
        if key.startswith("layers."):
            index, rest = key[len("layers.") :].split(".", 1)
            if index != "0":
                continue  # only the first MTP layer is used
            name = f"block.{rest}"
        else:
            base = key.rsplit(".", 1)[0]
            if base not in _QWEN_NAMES:
                raise ValueError(f"unexpected MTP tensor 'mtp.{key}'")
            name = key.replace(base, _QWEN_NAMES[base], 1)
        # These models store each RMSNorm scale as (scale - 1).
        if name.endswith("norm.weight") and value.ndim == 1:
            value = value + 1.0
        weights[name] = value
    return _stack_experts(weights, "block.mlp.")


def _deepseek_from_raw(
    raw: Dict[str, mx.array], model: nn.Module
) -> Dict[str, mx.array]:
    """DeepSeek-V3 / GLM-4.5 MTP tensors -> this module's names, mlx layout.

    The tensors pass through the target's own ``sanitize`` as if they were
    block 0 (expert stacking, MLA's ``kv_b_proj`` split, fp8 dequantisation),
    then get this module's names.
    """
    kept = {k: v for k, v in raw.items() if not k.startswith(_DEEPSEEK_SHARED)}
    prefix = "model.layers.0."
    sanitized = text_model(model).sanitize({prefix + k: v for k, v in kept.items()})
    weights = {}
    for key, value in sanitized.items():
        name = key[len(prefix) :]
        base = next((b for b in _DEEPSEEK_NAMES if name.startswith(b + ".")), None)
        if base is None:
            weights[f"block.{name}"] = value
        else:
            weights[_DEEPSEEK_NAMES[base] + name[len(base) :]] = value
    return weights


def convert_raw(raw: Dict[str, mx.array], model: nn.Module) -> Dict[str, mx.array]:
    """An original checkpoint's MTP tensors (see :func:`read_raw`) in mlx form."""
    if family_of(model) == "qwen":
        return _qwen_from_raw(raw)
    return _deepseek_from_raw(raw, model)


# --------------------------------------------------------------------------- #
# The head object the engine receives as ``draft_model``
# --------------------------------------------------------------------------- #


class MTPHead:
    """A checkpoint's MTP module bound to its target (``--speculative mtp``).

    Attributes:
        module: The :class:`MTPModule`.
        target: The target model.
        path: Where the weights were read, or ``None``.
    """

    is_head = True
    kind = "mtp"

    def __init__(self, module: MTPModule, target: nn.Module, path=None):
        self.module = module
        self.target = target
        self.path = path

    def embed(self, tokens: mx.array) -> mx.array:
        """The target's embedding ``(...,) -> (..., H)``."""
        from .features import embed

        return embed(self.target, tokens)

    def logits(self, g: mx.array) -> mx.array:
        """The target's output layer on MTP outputs ``(..., H) -> (..., V)``."""
        from .features import feature_logits

        return feature_logits(self.target, g)

    def parameters(self):
        return self.module.parameters()

    def make_cache(self) -> List:
        """No prompt-cache entries: ``make_prompt_cache(head)`` is ``[]``."""
        return []


def _quantize_from(module: nn.Module, weights: Dict[str, mx.array], quantization: Dict):
    """Quantize the layers of ``module`` whose ``scales`` are in ``weights``."""

    def predicate(path, layer):
        if f"{path}.scales" not in weights or not hasattr(layer, "to_quantized"):
            return False
        return quantization.get(path, True)

    nn.quantize(
        module,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )


def bind_weights(
    weights: Dict[str, mx.array], model: nn.Module, path, quantization=None
) -> MTPHead:
    """Build the module for ``model`` and load ``weights`` (one-line errors)."""
    try:
        module = build_module(model, _is_moe(weights))
    except ValueError as e:
        raise ValueError(
            f"the MTP weights in '{path}' do not fit model type "
            f"'{model_type(model)}': {e}."
        ) from None
    if quantization:
        _quantize_from(module, weights, quantization)
    expected = {k for k, _ in tree_flatten(module.parameters())}
    missing = sorted(expected - set(weights))
    extra = sorted(set(weights) - expected)
    if missing or extra:
        raise ValueError(
            f"the MTP weights in '{path}' do not fit model type '{model_type(model)}' "
            f"(missing {missing[:3]}, unexpected {extra[:3]})."
        )
    try:
        module.load_weights(list(weights.items()))
    except ValueError as e:
        first = str(e).strip().splitlines()[0]
        raise ValueError(
            f"the MTP weights in '{path}' do not fit model type "
            f"'{model_type(model)}': {first}"
        ) from None
    module.eval()
    mx.eval(module.parameters())
    return MTPHead(module, model, None if path is None else str(path))


def local_dir(path) -> Path:
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    try:  # a hub id already in the local cache
        from mlx_lm.utils import hf_repo_to_path

        cached = Path(hf_repo_to_path(str(path)))
        if cached.is_dir():
            return cached
    except Exception:
        pass
    raise ValueError(f"MTP path '{path}' is not a local model directory.")


def read_mtp_file(path: Path) -> Tuple[Dict[str, mx.array], Optional[Dict]]:
    """Weights and quantization of an ``mtp.safetensors`` written by :func:`save_mtp`."""
    weights, metadata = mx.load(str(path), return_metadata=True)
    info = json.loads(metadata.get(METADATA_KEY, "{}"))
    if info.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"'{path}' is not an MTP file of this mlx-spec version "
            f"(format {info.get('format')!r}, expected {FORMAT_VERSION})."
        )
    return weights, info.get("quantization")


def has_mtp(path, model: nn.Module) -> bool:
    """Whether ``path`` holds MTP weights ``model`` can use (no error otherwise)."""
    if model_type(model) not in FAMILIES:
        return False
    try:
        local = local_dir(path)
        return (local / MTP_FILE).is_file() or bool(read_raw(local, model))
    except (OSError, ValueError, KeyError):
        return False


def load_mtp(path, model: nn.Module) -> MTPHead:
    """The MTP layer of the checkpoint at ``path``, bound to ``model``.

    ``path`` is usually the directory ``model`` was loaded from; it may also
    be another copy of the same model that kept its MTP weights (the
    original checkpoint, or a ``mlx_spec convert hf`` output).

    Raises:
        ValueError: One line: the family has no MTP layers, the checkpoint
          holds none (:class:`MTPMissing`), or they do not fit ``model``.
    """
    family_of(model)
    local = local_dir(path)
    if (local / MTP_FILE).is_file():
        weights, quantization = read_mtp_file(local / MTP_FILE)
        return bind_weights(weights, model, local, quantization)
    raw = read_raw(local, model)
    if not raw:
        raise MTPMissing(missing_message(path))
    return bind_weights(convert_raw(raw, model), model, local)


def save_mtp(path, head: MTPHead, quantization: Optional[Dict] = None):
    """Write ``head``'s weights as ``path/mtp.safetensors`` (mlx form).

    Args:
        path: The model directory.
        head: The loaded MTP head.
        quantization: How its layers were quantized (``{"group_size", "bits",
          "mode"}`` plus per-layer overrides), or ``None``.
    """
    weights = dict(tree_flatten(head.module.parameters()))
    info = {"format": FORMAT_VERSION, "model_type": model_type(head.target)}
    if quantization:
        info["quantization"] = quantization
    mx.save_safetensors(
        str(Path(path) / MTP_FILE),
        weights,
        metadata={"format": "mlx", METADATA_KEY: json.dumps(info)},
    )


def random_mtp(
    model: nn.Module, *, seed: int = 0, moe: bool = False, scale: float = 1.0
) -> MTPHead:
    """An MTP head with random weights for ``model`` (tests and demos).

    Norm scales are drawn around 1 so every norm matters; ``scale``
    multiplies the projection and block weights.
    """
    mx.random.seed(seed)
    module = build_module(model, moe)
    params = []
    for name, value in tree_flatten(module.parameters()):
        if name.endswith("norm.weight"):
            value = 1.0 + 0.3 * mx.random.normal(value.shape)
        elif value.ndim >= 2:
            fan_in = value.shape[-1]
            value = scale * mx.random.normal(value.shape) / fan_in**0.5
        params.append((name, value.astype(mx.float32)))
    module.load_weights(params)
    module.eval()
    mx.eval(module.parameters())
    return MTPHead(module, model)
