"""Tiny random checkpoints of real mlx-lm architectures, and in-memory models.

Weights are float32 and seeded, one parameter independent of the others,
and the output head is scaled so that greedy decoding has no near-ties.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path
from typing import Optional

import numpy as np

from .configs import model_config
from .tokenizer import TOKENIZER_VARIANTS, build_tokenizer, tokenizer_rows

DEFAULT_HIDDEN_SIZE = 64
DEFAULT_NUM_LAYERS = 2
DEFAULT_NUM_HEADS = 4
DEFAULT_NUM_KV_HEADS = 2
# Standard deviation of the logits at initialisation; large enough that the
# top-1/top-2 gap dwarfs float32 accumulation noise (~1e-6 here).
DEFAULT_HEAD_SCALE = 6.0
# Noise of the "<arch>-near" drafts: greedy acceptance ~0.6-0.7.
DEFAULT_NEAR_NOISE = 0.1
_GEMMA_BLOCK_GAIN = 2.0


def init_param(name: str, shape: tuple, *, arch: str, head_scale: float, seed: int):
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


def parameter_shapes(config: dict) -> dict[str, tuple]:
    """Parameter names and shapes, taken from mlx-lm's own model class."""
    from mlx.utils import tree_flatten

    from ..mlx_lm_private import model_classes

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
    tokenizer_size = tokenizer_rows(out_dir)

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
        config = model_config(
            arch,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            vocab_size=tokenizer_size + padded_vocab,
        )
        weights = {
            name: init_param(name, shape, arch=arch, head_scale=head_scale, seed=seed)
            for name, shape in parameter_shapes(config).items()
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
    vocab_size: int,
    *,
    num_layers: int = 1,
    seed: int = 0,
    head_scale: Optional[float] = 0.2,
    hidden_size: int = 32,
    num_kv_heads: int = 2,
):
    """A random in-memory llama (2 query heads), evaluated, with no checkpoint.

    Its untied ``lm_head`` is redrawn small so that the logits spread over a
    tiny vocabulary, as exact-law and head tests want.

    Args:
        vocab_size: Vocabulary size.
        num_layers: Number of transformer blocks. Default: ``1``.
        seed: Seed of ``mx.random`` before the weights are drawn. Default: ``0``.
        head_scale: Standard deviation of the ``lm_head`` weights; ``None``
            keeps mlx-lm's initialisation. Default: ``0.2``.
        hidden_size: Model width (the MLP is twice as wide). Default: ``32``.
        num_kv_heads: Key/value heads. Default: ``2``.

    Returns:
        An ``mlx_lm.models.llama.Model``.
    """
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        intermediate_size=2 * hidden_size,
        num_attention_heads=2,
        num_key_value_heads=num_kv_heads,
        rms_norm_eps=1e-6,
        vocab_size=vocab_size,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    if head_scale is not None:
        shape = model.lm_head.weight.shape
        model.lm_head.weight = head_scale * mx.random.normal(shape)
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
