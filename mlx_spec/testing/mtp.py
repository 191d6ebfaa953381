"""Tiny checkpoints with multi-token-prediction (MTP) layers, in their original
(Hugging Face) layout, as the families that ship them store them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .checkpoints import (
    DEFAULT_HEAD_SCALE,
    DEFAULT_HIDDEN_SIZE,
    DEFAULT_NUM_HEADS,
    DEFAULT_NUM_KV_HEADS,
    init_param,
    parameter_shapes,
)
from .configs import MTP_ARCHITECTURES, ROLLBACK_LAYERS, model_config
from .tokenizer import EOS_TOKEN, SPECIAL_TOKENS, build_tokenizer, tokenizer_rows


def _mtp_config(arch: str, vocab_size: int) -> dict:
    """``config.json`` of a tiny ``arch`` model with one MTP layer."""
    if arch in ("qwen3_next", "qwen3_5"):
        config = model_config(
            arch,
            hidden_size=DEFAULT_HIDDEN_SIZE,
            num_layers=ROLLBACK_LAYERS,
            num_heads=DEFAULT_NUM_HEADS,
            num_kv_heads=DEFAULT_NUM_KV_HEADS,
            vocab_size=vocab_size,
        )
        if arch == "qwen3_5":
            config["text_config"]["mtp_num_hidden_layers"] = 1
        else:
            config["mtp_num_hidden_layers"] = 1
        return config
    hidden, heads = DEFAULT_HIDDEN_SIZE, DEFAULT_NUM_HEADS
    config = {
        "architectures": [
            "Glm4MoeForCausalLM" if arch == "glm4_moe" else "DeepseekV3ForCausalLM"
        ],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "intermediate_size": 2 * hidden,
        "moe_intermediate_size": hidden // 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": None,
        "pad_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "eos_token_id": [
            SPECIAL_TOKENS.index(EOS_TOKEN),
            SPECIAL_TOKENS.index("<|im_end|>"),
        ],
        "torch_dtype": "float32",
    }
    if arch == "glm4_moe":
        config.update(
            head_dim=hidden // heads, use_qk_norm=False, partial_rotary_factor=0.5
        )
    else:
        config.update(
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        )
    return config


def _mtp_block_shapes(arch: str, config: dict) -> dict[str, tuple]:
    """Parameter shapes of the MTP layer's decoder block (mlx-lm layout)."""
    from mlx.utils import tree_flatten

    from ..mlx_lm_private import model_classes

    _, args_class = model_classes(config)
    if arch == "qwen3_next":
        from mlx_lm.models import qwen3_next as m

        args = args_class.from_dict(config)
        block = m.Qwen3NextDecoderLayer(args, args.full_attention_interval - 1)
    elif arch == "qwen3_5":
        from mlx_lm.models import qwen3_5 as m

        args = m.TextModelArgs.from_dict(config["text_config"])
        block = m.DecoderLayer(args, args.full_attention_interval - 1)
    elif arch == "glm4_moe":
        from mlx_lm.models import glm4_moe as m

        args = args_class.from_dict(config)
        block = m.DecoderLayer(args, args.num_hidden_layers)
    else:
        from mlx_lm.models import deepseek_v3 as m

        args = args_class.from_dict(config)
        block = m.DeepseekV3DecoderLayer(args, args.num_hidden_layers)
    return {k: tuple(v.shape) for k, v in tree_flatten(block.parameters())}


_QWEN_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def _original_layout(arch: str, weights: dict, config: dict) -> dict:
    """mlx-lm-layout weights -> the original checkpoint's names and layout.

    The inverse of each model's ``sanitize``: experts unstacked, Qwen's
    RMSNorm scales stored as ``scale - 1`` and its convolutions as
    ``(C, 1, K)``, DeepSeek's MLA ``embed_q``/``unembed_out`` joined into
    ``kv_b_proj``, Qwen3.5's text weights under ``model.language_model``.
    """
    out = {}
    for name, w in weights.items():
        if arch in ("qwen3_next", "qwen3_5"):
            mtp_norm = name.startswith("mtp.") and name.endswith("norm.weight")
            if w.ndim == 1 and (mtp_norm or name.endswith(_QWEN_NORMS)):
                w = w - np.float32(1.0)
            if "conv1d.weight" in name:
                w = np.moveaxis(w, 1, 2)
        if ".switch_mlp." in name:
            prefix, proj = name.split(".switch_mlp.")
            for e in range(w.shape[0]):
                out[f"{prefix}.experts.{e}.{proj}"] = w[e]
            continue
        if name.endswith("self_attn.embed_q.weight"):
            up = weights[name.replace("embed_q", "unembed_out")]
            rows = np.concatenate([np.swapaxes(w, -1, -2), up], axis=1)
            out[name.replace("embed_q", "kv_b_proj")] = rows.reshape(-1, w.shape[1])
            continue
        if name.endswith("self_attn.unembed_out.weight"):
            continue
        if arch == "qwen3_5":
            name = name.replace("language_model.model.", "model.language_model.")
            name = name.replace("language_model.lm_head.", "lm_head.")
        out[name] = w
    return out


def _mtp_tensors(arch: str, config: dict, seed: int) -> dict:
    """The MTP layer's tensors, by the original checkpoint's names, mlx-lm layout.

    Norm scales are drawn around 1 so that each of them matters.
    """
    hidden = config["hidden_size"]
    if arch in ("qwen3_next", "qwen3_5"):
        prefix = block = "mtp."
        block += "layers.0."
        own = ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
    else:
        prefix = block = f"model.layers.{config['num_hidden_layers']}."
        own = ("eh_proj", "enorm", "hnorm", "shared_head.norm")
    shapes = {f"{prefix}{own[0]}.weight": (hidden, 2 * hidden)}
    shapes.update({f"{prefix}{n}.weight": (hidden,) for n in own[1:]})
    shapes.update({block + k: v for k, v in _mtp_block_shapes(arch, config).items()})
    rng = np.random.default_rng([seed, 0x3779])
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and name.endswith("norm.weight"):
            tensors[name] = (1 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            tensors[name] = np.zeros(shape, np.float32)  # router score bias
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            tensors[name] = w * np.float32(1.0 / np.sqrt(shape[-1]))
    return tensors


def make_mtp_checkpoint(
    out_dir: str | Path, arch: str, *, seed: int = 0, shards: int = 2
) -> Path:
    """A tiny ``arch`` checkpoint with one MTP layer, laid out like the original.

    Weights are written as the original Hugging Face checkpoints store
    them (see :func:`_original_layout`), split over ``shards`` files with a
    ``model.safetensors.index.json``; ``mlx_lm.load`` sanitizes them and
    drops the MTP tensors. MTP names: Qwen ``mtp.fc``,
    ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.norm``,
    ``mtp.layers.0.*``; DeepSeek/GLM ``model.layers.{N}.enorm``, ``.hnorm``,
    ``.eh_proj``, ``.shared_head.norm``, ``.shared_head.head``,
    ``.embed_tokens`` and the block, with ``N = num_hidden_layers``.

    deepseek_v3: mlx-lm's sanitize drops only block 61, so with ``N = 2``
    load the target with ``mlx_lm.utils.load_model(path, strict=False)``.

    Args:
        out_dir: Checkpoint directory (created if missing).
        arch: ``qwen3_next``, ``qwen3_5``, ``glm4_moe`` or ``deepseek_v3``.
        seed: Seed of the weights. Default: ``0``.
        shards: Number of safetensors files. Default: ``2``.

    Returns:
        ``out_dir`` as a ``Path``.
    """
    import mlx.core as mx

    if arch not in MTP_ARCHITECTURES + ("deepseek_v3",):
        raise ValueError(
            f"arch must be one of {MTP_ARCHITECTURES + ('deepseek_v3',)}, got {arch!r}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir)
    config = _mtp_config(arch, tokenizer_rows(out_dir))
    weights = {
        name: init_param(
            name, shape, arch=arch, head_scale=DEFAULT_HEAD_SCALE, seed=seed
        )
        for name, shape in parameter_shapes(config).items()
    }
    weights = _original_layout(arch, weights, config)
    weights.update(_original_layout(arch, _mtp_tensors(arch, config, seed), config))
    if arch in ("glm4_moe", "deepseek_v3"):  # copies of the shared embedding and head
        layer = f"model.layers.{config['num_hidden_layers']}."
        weights[layer + "embed_tokens.weight"] = weights["model.embed_tokens.weight"]
        weights[layer + "shared_head.head.weight"] = weights["lm_head.weight"]

    (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    names = sorted(weights)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {name: files[i * shards // len(names)] for i, name in enumerate(names)}
    for file in files:
        part = {k: mx.array(weights[k]) for k in names if weight_map[k] == file}
        mx.save_safetensors(str(out_dir / file), part, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2), encoding="utf-8"
    )
    return out_dir
