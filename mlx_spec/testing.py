"""Tiny random checkpoints of real mlx-lm architectures, for tests and demos.

Every checkpoint is a Hugging Face style directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``) that
plain ``mlx_lm.load(path)`` accepts. Weights are float32 and seeded, the
tokenizer is a byte-level BPE trained in about 0.2 s on Python's own standard
library sources, and the output head is scaled so that greedy decoding has no
near-ties (see :func:`min_top2_gap`).

Typical use::

    from mlx_spec.testing import test_checkpoints
    paths = test_checkpoints()          # built once, cached on disk
    model, tokenizer = mlx_lm.load(str(paths["llama"]))
    draft, _ = mlx_lm.load(str(paths["llama-near"]))

or from a shell: ``python -m mlx_spec.testing OUT_DIR``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# Bump when the checkpoints change in a way the source hash would not catch.
FACTORY_VERSION = 1

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
# Families whose caches need exact rollback (mlx_spec.caches): linear attention,
# SSM and short-convolution layers (ArraysCache), sliding windows shorter than a
# test's generation (RotatingKVCache, window SLIDING_WINDOW).
ROLLBACK_ARCHITECTURES = (
    "qwen3_next",
    "qwen3_5",
    "nemotron_h",
    "mamba2",
    "lfm2",
    "falcon_h1",
    "gemma3",
    "gpt_oss",
)
ALL_ARCHITECTURES = ARCHITECTURES + ROLLBACK_ARCHITECTURES
# Families whose original checkpoints ship multi-token-prediction (MTP) layers:
# "<arch>-mtp" is such a checkpoint in its original Hugging Face layout (the
# layout mlx_lm.load sanitizes, MTP tensors included). deepseek_v3 is left out
# of the named set: mlx-lm drops only block 61 as its MTP layer, so a tiny
# one loads with strict=False only (see make_mtp_checkpoint).
MTP_ARCHITECTURES = ("qwen3_next", "qwen3_5", "glm4_moe")
SLIDING_WINDOW = 8
# Blocks of the rollback families' test targets: recurrent (or sliding), attention
# (or global), recurrent (or sliding); nemotron_h adds an MLP block.
ROLLBACK_LAYERS = 3
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
TOKENIZER_VARIANTS = {"default": 512, "other": 384}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

DEFAULT_HIDDEN_SIZE = 64
DEFAULT_NUM_LAYERS = 2
DEFAULT_NUM_HEADS = 4
DEFAULT_NUM_KV_HEADS = 2
# Standard deviation of the logits at initialisation; large enough that the
# top-1/top-2 gap dwarfs float32 accumulation noise (~1e-6 here).
DEFAULT_HEAD_SCALE = 6.0
# Noise of the "<arch>-near" drafts: greedy acceptance ~0.6-0.7.
DEFAULT_NEAR_NOISE = 0.1
# Targets of the named set are re-seeded until min_top2_gap >= this.
GAP_FLOOR = 2.5e-3
PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "The quick brown fox",
    "class Parser:\n    def __init__(self",
)
_GEMMA_BLOCK_GAIN = 2.0
_CORPUS_CHARS = 400_000
_STAMP = "mlx_spec_testing.json"
_ARCHITECTURE_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "nemotron_h": "NemotronHForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gpt_oss": "GptOssForCausalLM",
}


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #


def _corpus(variant: str) -> list[str]:
    """Training text: stdlib ``*.py`` files, sorted (reversed for "other")."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"), reverse=variant == "other")
    texts, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= _CORPUS_CHARS:
            break
    return texts


@functools.lru_cache(maxsize=None)
def _tokenizer_json(vocab_size: int, variant: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(variant), trainer)
    return tokenizer.to_str()


def build_tokenizer(
    out_dir: str | Path, *, vocab_size: int | None = None, variant: str = "default"
) -> Path:
    """Train (memoised per process) and write a byte-level BPE tokenizer.

    Special tokens come first: ``<|endoftext|>`` = 0 (the EOS token),
    ``<|im_start|>`` = 1, ``<|im_end|>`` = 2. A ChatML chat template is
    included. Encoding adds no BOS/EOS.

    Args:
        out_dir: Directory to write ``tokenizer.json`` and
            ``tokenizer_config.json`` into (created if missing).
        vocab_size: Vocabulary size. Default: ``512`` for ``"default"``,
            ``384`` for ``"other"``.
        variant: ``"default"`` or ``"other"``; "other" is trained on different
            text and so has a different vocabulary. Default: ``"default"``.

    Returns:
        ``out_dir`` as a ``Path``.
    """
    if variant not in TOKENIZER_VARIANTS:
        raise ValueError(
            f"variant must be one of {sorted(TOKENIZER_VARIANTS)}, got {variant!r}"
        )
    vocab_size = vocab_size or TOKENIZER_VARIANTS[variant]
    if not 256 + len(SPECIAL_TOKENS) <= vocab_size <= 4096:
        raise ValueError(f"vocab_size must be in [259, 4096], got {vocab_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(
        _tokenizer_json(vocab_size, variant), encoding="utf-8"
    )
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2), encoding="utf-8"
    )
    return out_dir


def _tokenizer_size(tokenizer_dir: Path) -> int:
    content = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(content["model"]["vocab"].values())
    ids += [t["id"] for t in content.get("added_tokens", [])]
    return max(ids) + 1


# --------------------------------------------------------------------------- #
# Model
# --------------------------------------------------------------------------- #


def _model_config(
    arch: str,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
) -> dict:
    """An HF-style ``config.json`` dict for ``arch``."""
    if arch not in ALL_ARCHITECTURES:
        raise ValueError(f"arch must be one of {ALL_ARCHITECTURES}, got {arch!r}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads "
            f"({num_heads}), and num_heads by num_kv_heads ({num_kv_heads})"
        )
    eos_ids = [SPECIAL_TOKENS.index(EOS_TOKEN), SPECIAL_TOKENS.index("<|im_end|>")]
    config = {
        "architectures": [_ARCHITECTURE_CLASS[arch]],
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "intermediate_size": 2 * hidden_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "hidden_act": "gelu_pytorch_tanh" if arch == "gemma" else "silu",
        "tie_word_embeddings": arch == "gemma",
        "bos_token_id": None,
        "pad_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }
    if arch == "mistral":
        config["sliding_window"] = None
    if arch == "phi3":
        del config["head_dim"]  # phi3 derives it from hidden_size
    if arch in ROLLBACK_ARCHITECTURES:
        config.update(_rollback_config(arch, config, num_layers))
    return config


def _rollback_config(arch: str, base: dict, num_layers: int) -> dict:
    """Fields of the recurrent and sliding-window families (tiny, float32).

    Layer patterns put a recurrent (or sliding) layer first and an attention
    (or global) layer among the first few, so ``num_layers`` >= 2 has both.
    """
    hidden, heads = base["hidden_size"], base["num_attention_heads"]
    head_dim = hidden // heads
    kinds = [("linear" if i % 2 == 0 else "full") for i in range(num_layers)]
    if arch == "qwen3_next":
        return dict(
            linear_num_value_heads=heads,
            linear_num_key_heads=heads // 2,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=hidden,
            moe_intermediate_size=hidden // 2,
            mlp_only_layers=[],
            partial_rotary_factor=0.5,
            full_attention_interval=2,
        )
    if arch == "qwen3_5":
        text = {k: v for k, v in base.items() if k not in ("architectures",)}
        text.update(
            model_type="qwen3_5_text",
            linear_num_value_heads=heads,
            linear_num_key_heads=heads // 2,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=4,
            full_attention_interval=2,
            rope_parameters={
                "type": "default",
                "mrope_section": [2, 1, 1],
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
        )
        return dict(text_config=text)
    if arch in ("nemotron_h", "mamba2", "falcon_h1"):
        ssm = dict(
            conv_kernel=4,
            n_groups=1,
            use_bias=False,
            use_conv_bias=True,
            layer_norm_epsilon=1e-5,
        )
        if arch == "mamba2":
            return dict(
                ssm,
                num_heads=heads,
                head_dim=2 * head_dim,  # transformers checks expand (2) * hidden
                expand=2,
                state_size=16,
                time_step_limit=(0.0, float("inf")),
                time_step_rank="auto",
            )
        if arch == "nemotron_h":
            pattern = ["M" if k == "linear" else "*" for k in kinds] + ["-"]
            return dict(
                ssm,
                attention_bias=False,
                mamba_num_heads=heads,
                mamba_head_dim=head_dim,
                mamba_proj_bias=False,
                ssm_state_size=16,
                mlp_bias=False,
                hybrid_override_pattern=pattern,
                num_hidden_layers=len(pattern),
            )
        return dict(  # falcon_h1: every layer has a Mamba2 mixer and attention
            mamba_d_conv=4,
            mamba_d_head=head_dim,
            mamba_d_ssm=hidden,
            mamba_d_state=16,
            mamba_n_heads=heads,
            mamba_n_groups=1,
            mamba_chunk_size=16,
        )
    if arch == "lfm2":
        return dict(
            norm_eps=1e-5,
            conv_bias=False,
            conv_L_cache=3,
            block_dim=hidden,
            block_multiple_of=16,
            block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=False,
            block_ff_dim=2 * hidden,
            layer_types=["conv" if k == "linear" else "full_attention" for k in kinds],
        )
    if arch == "gemma3":
        text = {k: v for k, v in base.items() if k not in ("architectures",)}
        text.update(
            model_type="gemma3_text",
            sliding_window=SLIDING_WINDOW,
            sliding_window_pattern=2,
            query_pre_attn_scalar=head_dim,
        )
        return dict(text_config=text)
    # gpt_oss: alternating sliding-window and full attention, a tiny MoE.
    return dict(
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=SLIDING_WINDOW,
        layer_types=[
            "sliding_attention" if k == "linear" else "full_attention" for k in kinds
        ],
    )


def _init_param(name: str, shape: tuple, *, arch: str, head_scale: float, seed: int):
    """Seeded initial value of one parameter (independent of the others)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if len(shape) == 1:
        if name.endswith("bias"):
            return 0.02 * rng.standard_normal(shape, dtype=np.float32)
        if arch == "gemma" and name == "model.norm.weight":
            # Gemma stores (scale - 1) and ties its head to its input embedding:
            # a random-sign final scale stops "argmax = the input token".
            return rng.standard_normal(shape, dtype=np.float32) - 1.0
        if arch == "lfm2" and name == "model.embedding_norm.weight":
            # LFM2 ties its head too (and stores the scale itself).
            return rng.standard_normal(shape, dtype=np.float32)
        return np.full(shape, 0.0 if arch == "gemma" else 1.0, np.float32)
    noise = rng.standard_normal(shape, dtype=np.float32)
    hidden = shape[-1]
    is_head = name.endswith("lm_head.weight") or name == "lm_head.weight"
    if is_head or (arch == "gemma" and "embed_tokens" in name):
        # Logits = W @ rms_norm(h) with |rms_norm(h)| ~ sqrt(hidden).
        return noise * np.float32(head_scale / np.sqrt(hidden))
    if "embed_tokens" in name or name.endswith("embeddings.weight"):
        return noise
    # Fan-in: the last axis, except for convolutions (taps x channels per group).
    fan_in = shape[1] * shape[2] if len(shape) == 3 and "conv" in name else shape[-1]
    scale = 1.0 / np.sqrt(fan_in)
    if arch == "gemma" and name.endswith(("o_proj.weight", "down_proj.weight")):
        # Gemma's input is its (large) tied head row; let the blocks dominate
        # the residual so the argmax is not simply the input token again.
        scale *= _GEMMA_BLOCK_GAIN * head_scale
    return noise * np.float32(scale)


def _parameter_shapes(config: dict) -> dict[str, tuple]:
    """Parameter names and shapes, taken from mlx-lm's own model class."""
    from mlx.utils import tree_flatten

    from .mlx_lm_private import model_classes

    model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(config))
    return {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}


def _is_vocab_param(name: str) -> bool:
    """Whether a parameter has one row per vocabulary entry (embedding or head)."""
    return name.endswith(("embed_tokens.weight", "embeddings.weight", "lm_head.weight"))


def _resize_vocab(weights: dict, rows: int, tokenizer_size: int) -> dict:
    """Keep the first ``tokenizer_size`` vocab rows, zero-pad up to ``rows``."""
    out = {}
    for name, w in weights.items():
        if _is_vocab_param(name):
            w = w[:tokenizer_size]
            pad = np.zeros((rows - w.shape[0],) + w.shape[1:], np.float32)
            w = np.concatenate([w, pad])
        out[name] = w
    return out


def make_checkpoint(
    out_dir: str | Path,
    arch: str,
    *,
    seed: int = 0,
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    num_layers: int = DEFAULT_NUM_LAYERS,
    num_heads: int = DEFAULT_NUM_HEADS,
    num_kv_heads: int = DEFAULT_NUM_KV_HEADS,
    vocab_size: int | None = None,
    base: str | Path | None = None,
    noise: float = 0.0,
    head_scale: float = DEFAULT_HEAD_SCALE,
    padded_vocab: int = 0,
    tokenizer: str | Path = "default",
) -> Path:
    """Write a tiny random ``arch`` checkpoint that ``mlx_lm.load`` accepts.

    Args:
        out_dir: Checkpoint directory (created if missing).
        arch: One of :data:`ALL_ARCHITECTURES`; must match ``base`` if given.
        seed: Seed for the weights (and for the noise when ``base`` is given).
            Default: ``0``.
        hidden_size: Model width. Ignored with ``base``. Default: ``64``.
        num_layers: Number of transformer blocks. Ignored with ``base``.
            Default: ``2``.
        num_heads: Query heads. Ignored with ``base``. Default: ``4``.
        num_kv_heads: Key/value heads (GQA). Ignored with ``base``.
            Default: ``2``.
        vocab_size: Tokenizer vocabulary size to train. Ignored with ``base``
            or a tokenizer directory. Default: the variant's size.
        base: A checkpoint to copy (config, tokenizer, weights) and perturb.
            Default: ``None``.
        noise: With ``base``: each tensor gets Gaussian noise of standard
            deviation ``noise * std(tensor)``. Default: ``0.0``.
        head_scale: Target standard deviation of the initial logits (the
            ``lm_head``, or gemma's tied embedding, is scaled to it).
            Default: ``6.0``.
        padded_vocab: Extra all-zero vocabulary rows beyond the tokenizer's
            size in the embedding and head (``config.vocab_size`` grows by it),
            like Qwen2.5-7B's 152064 vs 151665 tokens. Default: ``0``.
        tokenizer: ``"default"``, ``"other"`` (a different vocabulary) or a
            directory holding ``tokenizer.json``/``tokenizer_config.json``.
            Ignored with ``base``. Default: ``"default"``.

    Returns:
        ``out_dir`` as a ``Path``.
    """
    import mlx.core as mx

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if padded_vocab < 0:
        raise ValueError(f"padded_vocab must be >= 0, got {padded_vocab}")

    if base is not None:
        base = Path(base)
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
        if config["model_type"] != arch:
            raise ValueError(
                f"arch {arch!r} does not match base model_type "
                f"{config['model_type']!r}"
            )
        _copy_tokenizer(base, out_dir)
    elif isinstance(tokenizer, str) and tokenizer in TOKENIZER_VARIANTS:
        build_tokenizer(out_dir, vocab_size=vocab_size, variant=tokenizer)
    else:
        _copy_tokenizer(Path(tokenizer), out_dir)
    tokenizer_size = _tokenizer_size(out_dir)

    if base is not None:
        config["vocab_size"] = tokenizer_size + padded_vocab
        weights = mx.load(str(base / "model.safetensors"))
        weights = {k: np.array(v) for k, v in weights.items()}
        # Perturb the real-token rows only; padding is re-added as zeros below.
        weights = _resize_vocab(weights, tokenizer_size, tokenizer_size)
        rng = np.random.default_rng([seed, 0x5EED])
        if noise:
            weights = {
                name: w
                + np.float32(noise * w.std())
                * rng.standard_normal(w.shape, dtype=np.float32)
                for name, w in sorted(weights.items())
            }
    else:
        config = _model_config(
            arch,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            vocab_size=tokenizer_size + padded_vocab,
        )
        weights = {
            name: _init_param(name, shape, arch=arch, head_scale=head_scale, seed=seed)
            for name, shape in _parameter_shapes(config).items()
        }
    weights = _resize_vocab(weights, config["vocab_size"], tokenizer_size)

    (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    mx.save_safetensors(
        str(out_dir / "model.safetensors"),
        {k: mx.array(v) for k, v in weights.items()},
        metadata={"format": "mlx"},
    )
    return out_dir


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if src.resolve() != dst.resolve():
            shutil.copyfile(src / name, dst / name)


def tiny_llama(
    vocab_size: int, *, num_layers: int = 1, seed: int = 0, head_scale: float = 0.2
):
    """A random in-memory llama (width 32, 2 heads), evaluated, with no checkpoint.

    Its untied ``lm_head`` is redrawn small so that the logits spread over a
    tiny vocabulary, as exact-law and head tests want.

    Args:
        vocab_size: Vocabulary size.
        num_layers: Number of transformer blocks. Default: ``1``.
        seed: Seed of ``mx.random`` before the weights are drawn. Default: ``0``.
        head_scale: Standard deviation of the ``lm_head`` weights.
            Default: ``0.2``.

    Returns:
        An ``mlx_lm.models.llama.Model``.
    """
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=num_layers,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=vocab_size,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    model.lm_head.weight = head_scale * mx.random.normal(model.lm_head.weight.shape)
    mx.eval(model.parameters())
    return model


def quantized_checkpoint(
    src: str | Path,
    dst: str | Path,
    *,
    bits: int = 4,
    group_size: int = 32,
    vocab_bits: int = 8,
) -> Path:
    """``src`` quantized by mlx-lm's own ``quantize_model`` into ``dst``.

    The blocks take ``bits``, the embedding and output layer ``vocab_bits``,
    as in the GGUF of the default target (and mlx-lm's mixed recipes).

    Returns:
        ``dst`` as a ``Path``.
    """
    import mlx_lm
    from mlx_lm.utils import quantize_model, save

    model, tokenizer, config = mlx_lm.load(str(src), return_config=True)
    vocab = {"group_size": group_size, "bits": vocab_bits}

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        return vocab if path in ("model.embed_tokens", "lm_head") else True

    model, config = quantize_model(
        model, config, group_size, bits, quant_predicate=predicate
    )
    save(dst, src, model, tokenizer, config)
    return Path(dst)


def linear_quantizations(module) -> set:
    """``(bits, group_size)`` of each linear layer under ``module``, ``None`` for a float one."""
    import mlx.nn as nn

    return {
        (m.bits, m.group_size) if isinstance(m, nn.QuantizedLinear) else None
        for _, m in module.named_modules()
        if isinstance(m, (nn.Linear, nn.QuantizedLinear))
    }


# --------------------------------------------------------------------------- #
# Checkpoints with MTP layers, in their original (Hugging Face) layout
# --------------------------------------------------------------------------- #


def _mtp_config(arch: str, vocab_size: int) -> dict:
    """``config.json`` of a tiny ``arch`` model with one MTP layer."""
    if arch in ("qwen3_next", "qwen3_5"):
        config = _model_config(
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

    from .mlx_lm_private import model_classes

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
    config = _mtp_config(arch, _tokenizer_size(out_dir))
    weights = {
        name: _init_param(
            name, shape, arch=arch, head_scale=DEFAULT_HEAD_SCALE, seed=seed
        )
        for name, shape in _parameter_shapes(config).items()
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


# --------------------------------------------------------------------------- #
# Checks
# --------------------------------------------------------------------------- #


def _encode(tokenizer, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    return list(prompt)


def greedy_continuation(
    model, prompt_ids: Sequence[int], steps: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens and per-step top-1/top-2 logit gaps, using a KV cache.

    Args:
        model: An mlx-lm model.
        prompt_ids: Prompt token ids.
        steps: Number of tokens to generate.

    Returns:
        ``(tokens, gaps)``: two lists of length ``steps``.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt_ids)[None], cache=cache)[0, -1]
    tokens, gaps = [], []
    for _ in range(steps):
        row = np.array(logits.astype(mx.float32))
        second, first = np.partition(row, -2)[-2:]
        tokens.append(int(row.argmax()))
        gaps.append(float(first - second))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, gaps


def min_top2_gap(
    model, tokenizer, prompts: Iterable[str | Sequence[int]] = PROMPTS, steps: int = 32
) -> float:
    """Smallest top-1 minus top-2 logit over greedy decoding of ``prompts``.

    Args:
        model: An mlx-lm model.
        tokenizer: Its tokenizer (used to encode string prompts).
        prompts: Prompts (strings or token id lists). Default: :data:`PROMPTS`.
        steps: Greedy steps per prompt. Default: ``32``.

    Returns:
        The minimum gap over all prompts and steps.
    """
    return min(
        min(greedy_continuation(model, _encode(tokenizer, p), steps)[1])
        for p in prompts
    )


def greedy_agreement(
    target,
    draft,
    tokenizer,
    prompts: Iterable[str | Sequence[int]] = PROMPTS,
    steps: int = 32,
) -> float:
    """Fraction of positions where the draft's argmax equals the target's.

    Teacher forcing: the target decodes ``steps`` greedy tokens per prompt,
    then the draft reads prompt + continuation in one pass; position ``i``
    agrees when the draft's argmax predicts continuation token ``i``. This
    is the per-token greedy acceptance rate of speculative decoding.

    Args:
        target: The target mlx-lm model.
        draft: A draft model sharing the tokenizer (its head may be padded).
        tokenizer: The shared tokenizer.
        prompts: Prompts (strings or token id lists). Default: :data:`PROMPTS`.
        steps: Continuation length per prompt. Default: ``32``.

    Returns:
        Agreement in ``[0, 1]``.
    """
    import mlx.core as mx

    hits = total = 0
    for prompt in prompts:
        ids = _encode(tokenizer, prompt)
        tokens, _ = greedy_continuation(target, ids, steps)
        logits = draft(mx.array(ids + tokens[:-1])[None])[0, len(ids) - 1 :]
        predicted = np.array(mx.argmax(logits, axis=-1)).tolist()
        hits += sum(p == t for p, t in zip(predicted, tokens))
        total += len(tokens)
    return hits / total


# --------------------------------------------------------------------------- #
# The named test set
# --------------------------------------------------------------------------- #


def _prompt_ids(tokenizer_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]


def _make_target(
    out_dir: Path, arch: str, *, seed: int, tries: int = 20, make=None, **kwargs
) -> Path:
    """``make`` (:func:`make_checkpoint`), re-seeded until its greedy gaps clear GAP_FLOOR."""
    from mlx_lm.utils import load_model

    make = make or make_checkpoint
    for attempt in range(tries):
        make(out_dir, arch, seed=seed + 1000 * attempt, **kwargs)
        model, _ = load_model(out_dir, strict=arch != "deepseek_v3")
        if min_top2_gap(model, None, _prompt_ids(out_dir)) >= GAP_FLOOR:
            return out_dir
    raise RuntimeError(
        f"no {arch} seed in {tries} tries has greedy gaps >= {GAP_FLOOR}"
    )


def _build_set(root: Path) -> dict[str, Path]:
    """Write the named checkpoint set into ``root`` (no caching)."""
    paths: dict[str, Path] = {}
    for i, arch in enumerate(ARCHITECTURES):
        paths[arch] = _make_target(root / arch, arch, seed=i)
        paths[f"{arch}-near"] = make_checkpoint(
            root / f"{arch}-near",
            arch,
            base=paths[arch],
            noise=DEFAULT_NEAR_NOISE,
            seed=100 + i,
        )
    for i, arch in enumerate(ROLLBACK_ARCHITECTURES):
        paths[arch] = _make_target(
            root / arch, arch, seed=20 + i, num_layers=ROLLBACK_LAYERS
        )
        paths[f"{arch}-near"] = make_checkpoint(
            root / f"{arch}-near",
            arch,
            base=paths[arch],
            noise=DEFAULT_NEAR_NOISE,
            seed=120 + i,
        )
    for i, arch in enumerate(MTP_ARCHITECTURES):
        paths[f"{arch}-mtp"] = _make_target(
            root / f"{arch}-mtp", arch, seed=40 + i, make=make_mtp_checkpoint
        )
    paths["llama-unrelated"] = make_checkpoint(
        root / "llama-unrelated",
        "qwen3",
        seed=7001,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
    )
    # Same weights as "qwen2" plus zero rows: its logits over real tokens match.
    paths["qwen2-padded"] = make_checkpoint(
        root / "qwen2-padded", "qwen2", base=paths["qwen2"], padded_vocab=128
    )
    paths["qwen2-padded-near"] = make_checkpoint(
        root / "qwen2-padded-near",
        "qwen2",
        base=paths["qwen2"],
        noise=DEFAULT_NEAR_NOISE,
        padded_vocab=64,
        seed=200,
    )
    paths["llama-othertok"] = make_checkpoint(
        root / "llama-othertok",
        "llama",
        seed=7002,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tokenizer="other",
    )
    return paths


# Names and their intended roles, for documentation and tests.
CHECKPOINT_NAMES = (
    *ALL_ARCHITECTURES,
    *(f"{a}-near" for a in ALL_ARCHITECTURES),
    *(f"{a}-mtp" for a in MTP_ARCHITECTURES),
    "llama-unrelated",
    "qwen2-padded",
    "qwen2-padded-near",
    "llama-othertok",
)


def version_hash() -> str:
    """Hash of everything that determines the checkpoint files."""
    import tokenizers

    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(
        f"{FACTORY_VERSION}|{sys.version_info[:2]}|{tokenizers.__version__}".encode()
    )
    return h.hexdigest()[:16]


def default_root() -> Path:
    """``$MLX_SPEC_TEST_CKPT_DIR`` or ``~/.cache/mlx_spec/test-checkpoints``,
    plus the :func:`version_hash` subdirectory."""
    parent = os.environ.get("MLX_SPEC_TEST_CKPT_DIR") or (
        Path.home() / ".cache" / "mlx_spec" / "test-checkpoints"
    )
    return Path(parent) / version_hash()


def _is_current(root: Path, version: str) -> bool:
    try:
        stamp = json.loads((root / _STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp.get("version") == version


def test_checkpoints(root: str | Path | None = None) -> dict[str, Path]:
    """Build (once) and return the named test checkpoint set.

    Names: every arch in :data:`ALL_ARCHITECTURES` (targets), ``"<arch>-near"``
    (target + small noise, ~0.5-0.9 greedy acceptance), ``"<arch>-mtp"`` for
    :data:`MTP_ARCHITECTURES` (original layout with MTP weights), ``"llama-unrelated"``
    (a small qwen3, low acceptance), ``"qwen2-padded"`` (``"qwen2"`` with 128
    zero vocab rows), ``"qwen2-padded-near"`` (near ``"qwen2"``, 64 zero rows)
    and ``"llama-othertok"`` (a different tokenizer, for mismatch errors).

    The set is built into a temporary sibling directory and renamed into
    place, so concurrent builders are safe; a stale set (older factory
    version) is replaced.

    Args:
        root: Directory to hold the checkpoint directories. Default:
            :func:`default_root`.

    Returns:
        A dict from name to checkpoint directory.
    """
    root = Path(root) if root is not None else default_root()
    version = version_hash()
    if not _is_current(root, version):
        if root.is_dir() and any(root.iterdir()) and not (root / _STAMP).exists():
            raise FileExistsError(f"{root} is not empty and holds no test checkpoints")
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            _build_set(tmp)
            stamp = json.dumps({"version": version})
            (tmp / _STAMP).write_text(stamp, encoding="utf-8")
            _swap_in(tmp, root, version)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {name: root / name for name in CHECKPOINT_NAMES}


test_checkpoints.__test__ = False


def _swap_in(tmp: Path, root: Path, version: str) -> None:
    """Rename the fresh set ``tmp`` to ``root``, moving a stale set aside."""
    if root.exists() and not _is_current(root, version):
        trash = Path(tempfile.mkdtemp(prefix=f".{root.name}-old-", dir=root.parent))
        try:
            os.replace(root, trash / "old")
        except OSError:
            pass  # another builder moved it first
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, root)
    except OSError:
        if not _is_current(root, version):  # a concurrent builder won otherwise
            raise  # not a pytest test despite its name


def main(argv: Sequence[str] | None = None) -> None:
    """Write the named checkpoint set: ``python -m mlx_spec.testing OUT_DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.testing",
        description="Write tiny random mlx-lm checkpoints for tests and demos.",
    )
    parser.add_argument("out_dir", type=Path, help="Directory to write into.")
    args = parser.parse_args(argv)
    for name, path in test_checkpoints(args.out_dir).items():
        print(f"{name:20s} {path}")


if __name__ == "__main__":
    main()
