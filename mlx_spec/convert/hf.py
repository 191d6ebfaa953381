"""Hugging Face safetensors -> mlx-lm checkpoints that keep their MTP layers.

mlx-lm's converter writes the model and drops the multi-token-prediction
(MTP) tensors in each model's ``sanitize``. :func:`convert_hf` runs that
converter unchanged for the model, then reads the MTP tensors from the
original files, converts them like the model (dtype, quantization) and
writes them to ``mtp.safetensors`` next to it (see :mod:`mlx_spec.mtp`).
``mlx_lm.load`` reads ``model*.safetensors`` only, so the output stays a
plain mlx-lm checkpoint.
"""

from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from ..outdir import OutDirError, check_out_dir, staged_dir
from .gguf import ConversionError

DTYPES = ("float16", "bfloat16", "float32")


def _cast(head, dtype):
    """Cast the MTP module's float weights to ``dtype``, as mlx-lm casts the model."""

    def cast(_, v):
        return v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v

    head.module.update(tree_map_with_path(cast, head.module.parameters()))


def _float_dtype(model: nn.Module):
    """The float dtype the converted model computes in (its embedding's)."""
    from ..features import feature_owner

    embedding = feature_owner(model).embed_tokens
    scales = getattr(embedding, "scales", None)
    return (scales if scales is not None else embedding.weight).dtype


def _quantize(head, model: nn.Module, quantization: dict) -> dict:
    """Quantize the MTP module like the model; return the settings per layer.

    Uses the model's own ``quant_predicate`` (e.g. 8-bit MoE gates), on the
    block's paths, as ``mlx_lm.convert`` does for the model.
    """
    group_size, bits = quantization["group_size"], quantization["bits"]
    mode = quantization.get("mode", "affine")
    predicate = getattr(model, "quant_predicate", None)
    settings = {"group_size": group_size, "bits": bits, "mode": mode}

    def choose(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        chosen = predicate(path, module) if predicate is not None else True
        if isinstance(chosen, dict):
            settings[path] = chosen
        return chosen

    nn.quantize(head.module, group_size, bits, mode=mode, class_predicate=choose)
    return settings


def convert_hf(
    src,
    out,
    *,
    quantize: bool = False,
    q_bits: Optional[int] = None,
    q_group_size: Optional[int] = None,
    dtype: Optional[str] = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Convert a Hugging Face checkpoint with mlx-lm, keeping its MTP layer.

    Args:
        src: The original checkpoint directory (or a hub id in the local cache).
        out: The directory to write. It is written beside ``out`` and renamed
          into place at the end, so an interrupted run leaves no half-written
          checkpoint.
        quantize: Quantize the model and its MTP layer. Default: ``False``.
        q_bits, q_group_size: Quantization settings (mlx-lm's defaults).
        dtype: ``float16``, ``bfloat16`` or ``float32``; default: the
          checkpoint's ``torch_dtype``.
        force: Replace ``out`` if it holds files. Default: ``False``.
        log: Receives progress lines. Default: ``print``.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        ConversionError: One line naming what went wrong.
    """
    try:
        out = check_out_dir(out, force=force)
    except OutDirError as e:
        raise ConversionError(str(e)) from None
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    with staged_dir(out) as work:
        settings = dict(quantize=quantize, q_bits=q_bits, q_group_size=q_group_size)
        _convert_with_mtp(src, work, out, dict(settings, dtype=dtype), log)
    return out


def _convert_with_mtp(src, work: Path, out: Path, settings: dict, log) -> None:
    """Convert ``src`` into ``work`` (logged as ``out``), MTP layer included."""
    from mlx_lm.convert import convert
    from mlx_lm.utils import load_model

    from .. import mtp

    try:
        convert(str(src), str(work), **settings)
    except Exception as e:  # mlx-lm's own errors are long; keep the first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"mlx-lm could not convert '{src}': {first}") from None
    model, config = load_model(work, lazy=True)
    kind = mtp.model_type(model)
    if kind not in mtp.FAMILIES:
        log(f"model type '{kind}' has no MTP layers mlx-spec runs: wrote {out} without")
        return
    try:
        raw = mtp.read_raw(mtp.local_dir(src), model)
        if not raw:
            log(f"'{src}' holds no MTP weights: wrote {out} without them")
            return
        head = mtp.bind_weights(mtp.convert_raw(raw, model), model, src)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    _cast(head, _float_dtype(model))
    quantization = None
    if config.get("quantization"):
        quantization = _quantize(head, model, config["quantization"])
    mtp.save_mtp(work, head, quantization)
    log(f"kept the MTP layer in {out / mtp.MTP_FILE}")
