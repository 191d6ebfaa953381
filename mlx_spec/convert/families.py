"""What llama.cpp changed on the way into GGUF, per architecture, undone.

Each :class:`Family` maps a ``general.architecture`` to the mlx-lm model that
computes the same function: its ``config.json`` fields from the metadata, its
parameter names from the GGUF's, and the two changes llama.cpp's
``convert_hf_to_gguf.py`` makes to some families' weights:

- ``llama`` (Llama 1-3, Mistral 7B, SmolLM, TinyLlama: llama.cpp writes them
  all as ``llama``): the rows of ``attn_q``/``attn_k`` are permuted for its
  interleaved RoPE (:func:`unpermute_rows` undoes it). The other families use
  llama.cpp's NeoX RoPE and are written unpermuted.
- ``gemma3``: every ``*norm.weight`` is stored as ``1 + w``; mlx-lm's Gemma
  norms compute with ``1 + w``, so 1 is subtracted.

``qwen2`` (attention biases), ``qwen3`` (query/key norms), ``gemma3`` (text;
sliding-window pattern, query/key norms) and ``phi3`` (fused ``qkv_proj`` and
``gate_up_proj``, as llama.cpp and mlx-lm both keep them) need names only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


class UnsupportedModel(ValueError):
    """The metadata describes a model this converter does not handle."""


_COMMON = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_TENSOR_NAME = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|bias)$")


def _scalar(md: dict, key: str, default=None):
    value = md.get(key, default)
    if value is None:
        raise UnsupportedModel(f"the GGUF has no {key!r} metadata")
    if isinstance(value, list):
        raise UnsupportedModel(
            f"{key!r} varies per layer; only uniform models are converted"
        )
    return value


def float32(value) -> float:
    """The shortest decimal that reads back as the same float32."""
    return float(str(np.float32(value)))


def _rope_scaling(md: dict, arch: str) -> dict | None:
    kind = md.get(f"{arch}.rope.scaling.type", "none")
    factor = md.get(f"{arch}.rope.scaling.factor", 1.0)
    if kind == "none" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float32(factor)}
    if kind == "yarn":
        original = md.get(f"{arch}.rope.scaling.original_context_length")
        if original is None:
            raise UnsupportedModel(
                f"the GGUF's YaRN rope scaling has no "
                f"{arch}.rope.scaling.original_context_length"
            )
        return {
            "type": "yarn",
            "factor": float32(factor),
            "original_max_position_embeddings": int(original),
        }
    raise UnsupportedModel(
        f"unsupported GGUF rope scaling {kind!r} ({arch}.rope.scaling.type); "
        "supported: linear, yarn"
    )


def base_config(md: dict, arch: str, tensor_shapes: dict) -> dict:
    """The fields every family shares: sizes, heads, RoPE, norms, vocabulary.

    Args:
        md: GGUF metadata.
        arch: ``general.architecture``.
        tensor_shapes: GGUF tensor name -> shape (rows first).
    """
    hidden = int(_scalar(md, f"{arch}.embedding_length"))
    heads = int(_scalar(md, f"{arch}.attention.head_count"))
    head_dim = int(_scalar(md, f"{arch}.attention.key_length", hidden // heads))
    value_dim = int(_scalar(md, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise UnsupportedModel(
            f"key length {head_dim} and value length {value_dim} differ"
        )
    if "token_embd.weight" not in tensor_shapes:
        raise UnsupportedModel("the GGUF has no token_embd.weight tensor")
    config = {
        "hidden_size": hidden,
        "num_hidden_layers": int(_scalar(md, f"{arch}.block_count")),
        "intermediate_size": int(_scalar(md, f"{arch}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(
            _scalar(md, f"{arch}.attention.head_count_kv", heads)
        ),
        "head_dim": head_dim,
        "rms_norm_eps": float32(
            _scalar(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
        ),
        "vocab_size": int(tensor_shapes["token_embd.weight"][0]),
        "max_position_embeddings": int(md.get(f"{arch}.context_length", 4096)),
        "rope_theta": float32(md.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_shapes,
    }
    scaling = _rope_scaling(md, arch)
    if scaling is not None:
        config["rope_scaling"] = scaling
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in md:
            config[key] = int(md[f"tokenizer.ggml.{key}"])
    return config


def _full_rotary(md: dict, arch: str, config: dict) -> None:
    dims = int(_scalar(md, f"{arch}.rope.dimension_count", config["head_dim"]))
    if dims != config["head_dim"]:
        raise UnsupportedModel(
            f"rope dimensions {dims} differ from the head size "
            f"{config['head_dim']}; this family needs them equal"
        )


def _llama(md: dict, shapes: dict) -> dict:
    config = base_config(md, "llama", shapes)
    _full_rotary(md, "llama", config)
    if md.get("llama.expert_count", 0):
        raise UnsupportedModel(
            f"a mixture of experts (llama.expert_count = "
            f"{md['llama.expert_count']}); only dense llama models are converted"
        )
    config.update(
        attention_bias="blk.0.attn_q.bias" in shapes,
        mlp_bias="blk.0.ffn_up.bias" in shapes,
        hidden_act="silu",
    )
    return config


def _qwen2(md: dict, shapes: dict) -> dict:
    config = base_config(md, "qwen2", shapes)
    _full_rotary(md, "qwen2", config)
    return config


def _qwen3(md: dict, shapes: dict) -> dict:
    config = base_config(md, "qwen3", shapes)
    _full_rotary(md, "qwen3", config)
    return config


def _gemma3(md: dict, shapes: dict) -> dict:
    config = base_config(md, "gemma3", shapes)
    _full_rotary(md, "gemma3", config)
    config["sliding_window"] = int(_scalar(md, "gemma3.attention.sliding_window"))
    config["sliding_window_pattern"] = sliding_window_pattern(
        md.get("gemma3.attention.sliding_window_pattern", 6),
        config["num_hidden_layers"],
    )
    # llama.cpp: the local layers' RoPE base is 10000 unless the file says.
    config["rope_local_base_freq"] = float32(
        md.get("gemma3.rope.freq_base_swa", 10000.0)
    )
    # llama.cpp scales queries by 1/sqrt(head_dim), by hidden/heads for 27B.
    scalar = config["head_dim"]
    if config["num_hidden_layers"] == 62:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    config["query_pre_attn_scalar"] = scalar
    return config


def sliding_window_pattern(value, num_layers: int) -> int:
    """mlx-lm's period (every n-th layer global) of a GGUF's window pattern.

    Args:
        value: An int period, or llama.cpp's per-layer list (``True`` for a
            sliding-window layer).
        num_layers: Blocks of the model.

    Raises:
        UnsupportedModel: A per-layer pattern that is not periodic with the
            last layer of each period global.
    """
    if not isinstance(value, list):
        return int(value)
    period = next((i + 1 for i, s in enumerate(value) if not s), len(value) + 1)
    expected = [(i + 1) % period != 0 for i in range(num_layers)]
    if list(map(bool, value)) != expected:
        raise UnsupportedModel(
            "gemma3.attention.sliding_window_pattern is not one global layer "
            "every n layers"
        )
    return period


def _phi3(md: dict, shapes: dict) -> dict:
    if "rope_factors_long.weight" in shapes:
        raise UnsupportedModel(
            "Phi-3 LongRoPE (rope_factors_long, the 128k models) is not "
            "converted; the 4k models are"
        )
    config = base_config(md, "phi3", shapes)
    dims = int(_scalar(md, "phi3.rope.dimension_count", config["head_dim"]))
    config["partial_rotary_factor"] = dims / config["head_dim"]
    config["original_max_position_embeddings"] = config["max_position_embeddings"]
    return config


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture becomes one mlx-lm model.

    Attributes:
        arch: ``general.architecture``.
        model_type: mlx-lm's ``model_type``.
        hf_class: The Hugging Face class (``config["architectures"]``).
        config: ``(metadata, tensor shapes) -> config.json`` fields.
        layer_names: GGUF block tensor base name -> mlx-lm name in a layer.
        unpermute_qk: Undo llama.cpp's Q/K row permutation.
        norms_plus_one: Norm weights are stored as ``1 + w``.
    """

    arch: str
    model_type: str
    hf_class: str
    config: Callable[[dict, dict], dict]
    layer_names: dict = field(default_factory=lambda: dict(_COMMON))
    unpermute_qk: bool = False
    norms_plus_one: bool = False

    def mlx_name(self, gguf_name: str) -> str | None:
        """mlx-lm parameter name of a GGUF tensor, or ``None`` if unknown."""
        match = _TENSOR_NAME.match(gguf_name)
        if not match:
            return None
        layer, base, suffix = match.groups()
        if layer is not None and base in self.layer_names:
            return f"model.layers.{layer}.{self.layer_names[base]}.{suffix}"
        if layer is None and base in _GLOBAL:
            return f"{_GLOBAL[base]}.{suffix}"
        return None

    def is_norm(self, gguf_name: str) -> bool:
        """Whether a tensor is an RMSNorm weight."""
        return gguf_name.endswith("norm.weight")


_PHI3_NAMES = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_NAMES = {
    **{k: v for k, v in _COMMON.items() if k != "ffn_norm"},
    **_QK_NORMS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

FAMILIES = {
    f.arch: f
    for f in (
        Family("llama", "llama", "LlamaForCausalLM", _llama, unpermute_qk=True),
        Family("qwen2", "qwen2", "Qwen2ForCausalLM", _qwen2),
        Family("qwen3", "qwen3", "Qwen3ForCausalLM", _qwen3, {**_COMMON, **_QK_NORMS}),
        Family(
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            _gemma3,
            _GEMMA3_NAMES,
            norms_plus_one=True,
        ),
        Family("phi3", "phi3", "Phi3ForCausalLM", _phi3, _PHI3_NAMES),
    )
}


def family_of(arch: str) -> Family:
    """The :class:`Family` of ``general.architecture``.

    Raises:
        UnsupportedModel: Any other architecture (named, with the list).
    """
    if arch not in FAMILIES:
        raise UnsupportedModel(
            f"unsupported GGUF architecture {arch!r}; supported: "
            f"{', '.join(FAMILIES)} (Mistral 7B files say 'llama')"
        )
    return FAMILIES[arch]


def unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation of a Q or K projection.

    llama.cpp stores each head's rows as interleaved pairs: the rows of one
    head, seen as ``(2, head_dim/2)`` in Hugging Face order, are written as
    ``(head_dim/2, 2)``. Row-wise quantization commutes with this, so it
    applies equally to a quantized tensor's rows of blocks and to a bias.

    Args:
        rows: ``(num_heads * head_dim, ...)`` array (any trailing shape).
        num_heads: Heads of this projection (the KV head count for K).

    Returns:
        The same rows in Hugging Face / mlx-lm order.
    """
    n = rows.shape[0]
    order = np.arange(n).reshape(num_heads, n // num_heads // 2, 2)
    return rows[order.transpose(0, 2, 1).reshape(-1)]
