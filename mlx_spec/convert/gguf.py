"""Convert a GGUF file into an mlx-lm checkpoint.

mlx-lm has no GGUF import; many users hold GGUFs. This converts the
architectures of :data:`families.FAMILIES` (``llama`` -- which includes
Mistral 7B and SmolLM --, ``qwen2``, ``qwen3``, ``gemma3``, ``phi3``) with
tensors of every type gguf-py dequantizes; anything else is refused in one
line naming it.

What the conversion does:

- gguf-py reads the metadata and the tensor table (:mod:`.gguf_file`);
  tensors are then read, converted and written one at a time
  (:mod:`.safetensors_stream`), so memory stays near the largest tensor.
- Names, configs and llama.cpp's changes to the weights (the llama family's
  Q/K row permutation, Gemma's ``1 + w`` norms) are undone per family
  (:mod:`.families`); Llama 3's ``rope_freqs`` tensor becomes its
  ``rope_scaling`` (:func:`llama3_rope_scaling`).
- ``float32``/``float16``/``bfloat16``: every tensor is dequantized by gguf-py
  (float32 holds the GGUF's values exactly) and cast.
- ``keep-quantized``: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K matrices become
  mlx-lm quantized layers holding exactly the GGUF's values (:mod:`.quants`),
  mixed bits recorded per module in ``config["quantization"]``; F32/F16/BF16
  tensors stay as stored; other quantized matrices (Q6_K, Q2_K, Q3_K,
  I-quants, ...) are requantized to 8-bit MLX layers and their error reported.
- The tokenizer is rebuilt from the metadata (:mod:`.tokenizer`).

Usage::

    from mlx_spec.convert import convert_gguf
    convert_gguf("model.Q4_K_M.gguf", "models/my-model")      # dtype by platform

or ``python -m mlx_spec.convert gguf model.Q4_K_M.gguf --out models/my-model``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from ..outdir import staged_dir
from . import quants
from .families import (
    Family,
    UnsupportedModel,
    family_of,
    float32,
    unpermute_rows,
)
from .gguf_file import GGUFFile, GGUFFormatError, TensorInfo
from .safetensors_stream import SafetensorsWriter
from .tokenizer import (
    TokenizerConversionError,
    copy_tokenizer,
    end_of_generation_ids,
    write_tokenizer,
)

DTYPES = ("float32", "float16", "bfloat16", "keep-quantized")
# Bump when the converter's output changes for the same input.
CONVERTER_VERSION = 2
STAMP_FILE = "mlx_spec_convert.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_HINT = (
    "; pass --tokenizer DIR with the model's Hugging Face tokenizer files instead"
)
# Llama 3.1+ RoPE: per-frequency divisors llama.cpp precomputes from the
# rope_scaling of the original config (see llama3_rope_scaling).
ROPE_FREQS = "rope_freqs.weight"
_PERMUTED = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}


class ConversionError(ValueError):
    """The GGUF cannot be converted (one-line message naming what and why)."""


def default_dtype() -> str:
    """``keep-quantized`` on macOS (lossless, fast on Metal), else ``float32``
    (dequantized: the fast path on CPUs)."""
    return "keep-quantized" if sys.platform == "darwin" else "float32"


# --------------------------------------------------------------------------- #
# Checks and config
# --------------------------------------------------------------------------- #


def _check_types(gguf: GGUFFile) -> None:
    """Refuse a tensor type gguf-py cannot dequantize (named, with its tensor)."""
    import gguf as gguf_py

    checked = set(quants.EXACT_BITS) | set(quants.FLOAT_TYPES)
    for info in gguf.tensors:
        if info.type_name in checked:
            continue
        qtype = gguf_py.GGMLQuantizationType[info.type_name]
        block, size = gguf_py.GGML_QUANT_SIZES[qtype]
        try:
            gguf_py.quants.dequantize(np.zeros((1, size), np.uint8), qtype)
        except NotImplementedError:
            raise ConversionError(
                f"unsupported GGUF tensor type {info.type_name} (tensor "
                f"{info.name!r}): gguf-py cannot dequantize it"
            ) from None
        checked.add(info.type_name)


def model_config(gguf: GGUFFile, family: Family) -> dict:
    """The mlx-lm ``config.json`` of a GGUF of ``family``.

    Raises:
        ConversionError: Missing or unsupported metadata (named).
    """
    shapes = {info.name: info.shape for info in gguf.tensors}
    try:
        fields = family.config(gguf.metadata, shapes)
    except UnsupportedModel as e:
        raise ConversionError(f"unsupported GGUF: {e}") from None
    ends = end_of_generation_ids(gguf.metadata)
    if len(ends) > 1:  # mlx-lm stops on each (llama.cpp's end-of-turn tokens)
        fields["eos_token_id"] = ends
    return {
        "architectures": [family.hf_class],
        "model_type": family.model_type,
        **fields,
    }


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the mlx-lm model ``config`` describes.

    The model is built lazily (nothing is computed or allocated).
    """
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    return {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}


def check_tensors(gguf: GGUFFile, family: Family, config: dict) -> dict[str, str]:
    """Map every tensor to the mlx-lm parameter it becomes; refuse misfits.

    Returns:
        GGUF name -> mlx-lm name (``rope_freqs`` left out).

    Raises:
        ConversionError: An unknown, extra, missing or misshapen tensor (named
            by its GGUF name).
    """
    expected = expected_shapes(config)
    names = {}
    for info in gguf.tensors:
        if info.name == ROPE_FREQS and family.arch == "llama":
            continue
        name = family.mlx_name(info.name)
        if name is None:
            raise ConversionError(
                f"unsupported GGUF tensor {info.name!r}: not part of a "
                f"{family.arch} model as mlx-lm runs it"
            )
        if name not in expected:
            raise ConversionError(
                f"unexpected GGUF tensor {info.name!r} for this model"
            )
        if info.shape != expected[name]:
            raise ConversionError(
                f"GGUF tensor {info.name!r} has shape {info.shape}, expected "
                f"{expected[name]} from the metadata"
            )
        names[info.name] = name
    found = set(names.values())
    optional = {"lm_head.weight"} if config.get("tie_word_embeddings") else set()
    missing = [n for n in expected if n not in found and n not in optional]
    if missing:
        gguf_name = {v: k for k, v in _all_names(family, config).items()}
        raise ConversionError(
            f"the GGUF lacks tensor {gguf_name.get(missing[0], missing[0])!r}"
        )
    return names


def _all_names(family: Family, config: dict) -> dict[str, str]:
    """Every GGUF name the family knows for ``config``'s layers -> mlx name."""
    out = {}
    for base in ("token_embd", "output_norm", "output"):
        out[f"{base}.weight"] = family.mlx_name(f"{base}.weight")
    for i in range(config["num_hidden_layers"]):
        for base in family.layer_names:
            for suffix in ("weight", "bias"):
                gguf_name = f"blk.{i}.{base}.{suffix}"
                out[gguf_name] = family.mlx_name(gguf_name)
    return out


def llama3_factors(config: dict, scaling: dict):
    """llama.cpp's ``rope_freqs`` for Llama-3 rope scaling: ``(head_dim/2,)``.

    Each RoPE frequency is divided by its factor: 1 for short wavelengths,
    ``factor`` for long ones, a smooth blend in between.
    """
    dims, base = config["head_dim"], config["rope_theta"]
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelens = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    smooth = (old / wavelens - low) / (high - low)
    blend = 1 / ((1 - smooth) / factor + smooth)
    short, long = wavelens < old / high, wavelens > old / low
    return np.where(short, 1.0, np.where(long, factor, blend))


def llama3_rope_scaling(rope_freqs, config: dict, metadata: dict) -> dict | None:
    """The ``rope_scaling`` (Llama 3) that reproduces a GGUF's ``rope_freqs``.

    The largest factor is the scaling factor; the other parameters are Llama
    3.1-3.3's (low 1, high 4, original context 8192 unless the metadata says).

    Raises:
        ConversionError: The factors match no such configuration.
    """
    factors = np.array(rope_freqs, dtype=np.float64)
    if factors.shape != (config["head_dim"] // 2,):
        raise ConversionError(
            f"GGUF tensor {ROPE_FREQS!r} has shape {factors.shape}, expected "
            f"({config['head_dim'] // 2},)"
        )
    if np.all(factors == 1.0):
        return None
    if "rope_scaling" in config:
        raise ConversionError(
            "unsupported GGUF: both rope_freqs and rope.scaling metadata are set"
        )
    key = "llama.rope.scaling.original_context_length"
    scaling = {
        "rope_type": "llama3",
        "factor": float32(factors.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": int(metadata.get(key, 8192)),
    }
    if not np.allclose(llama3_factors(config, scaling), factors, rtol=1e-5, atol=0):
        raise ConversionError(
            "unsupported GGUF rope_freqs: they match no Llama-3 rope scaling "
            f"with factor {scaling['factor']}, low 1, high 4, original context "
            f"{scaling['original_max_position_embeddings']}"
        )
    return scaling


# --------------------------------------------------------------------------- #
# Weights, one tensor at a time
# --------------------------------------------------------------------------- #


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 as MLX rounds it, as uint16 bits (row chunks)."""
    import mlx.core as mx

    rows = values.reshape(-1, values.shape[-1])
    out = np.empty(rows.shape, np.uint16)
    for part in quants.row_chunks(*rows.shape):
        out[part] = np.array(
            mx.view(mx.array(rows[part]).astype(mx.bfloat16), mx.uint16)
        )
    return out.reshape(values.shape)


def _cast(values: np.ndarray, dtype: str) -> tuple[np.ndarray, str | None]:
    """float32 values in ``dtype``: ``(array, safetensors dtype or None)``."""
    if dtype == "bfloat16":
        return _bfloat16_bits(values), "BF16"
    return values.astype(getattr(np, dtype), copy=False), None


def convert_tensor(
    gguf: GGUFFile,
    info: TensorInfo,
    family: Family,
    config: dict,
    dtype: str,
) -> tuple[dict, int | None, float | None]:
    """One GGUF tensor as the mlx-lm arrays that replace it.

    Args:
        gguf: The open file.
        info: The tensor (checked by :func:`check_tensors`).
        family: Its model's family.
        config: The model's config.
        dtype: One of :data:`DTYPES`.

    Returns:
        ``(arrays, bits, error)``: suffix (``weight``/``bias`` or ``weight``,
        ``scales``, ``biases``) -> ``(array, safetensors dtype or None)``;
        the MLX bits when the tensor is a quantized layer; and the relative
        error when it was requantized.
    """
    raw, kind, shape = gguf.read(info), info.type_name, info.shape
    base = info.name.split(".")[-2]
    if family.unpermute_qk and base in _PERMUTED:
        raw = unpermute_rows(raw.reshape(shape[0], -1), config[_PERMUTED[base]])
    suffix = info.name.rsplit(".", 1)[1]
    plus_one = family.norms_plus_one and family.is_norm(info.name)
    matrix = len(shape) == 2 and shape[1] % quants.GROUP_SIZE == 0
    if dtype == "keep-quantized" and not plus_one:
        if kind in quants.EXACT_BITS and matrix:
            triple = quants.to_mlx_quantized(raw, kind, shape)
            arrays = dict(zip(("weight", "scales", "biases"), triple))
            return (
                {k: (v, None) for k, v in arrays.items()},
                quants.EXACT_BITS[kind],
                None,
            )
        if kind in ("F32", "F16"):
            values = raw.view(quants.FLOAT_TYPES[kind]).reshape(shape)
            return {suffix: (values, None)}, None, None
        if kind == "BF16":
            return {suffix: (raw.view(np.uint16).reshape(shape), "BF16")}, None, None
        if matrix:
            values = quants.dequantize(raw, kind, shape)
            *triple, error = quants.requantize(values)
            arrays = dict(zip(("weight", "scales", "biases"), triple))
            bits = quants.REQUANTIZE_BITS
            return {k: (v, None) for k, v in arrays.items()}, bits, error
    values = quants.dequantize(raw, kind, shape)
    if plus_one:
        values = values - np.float32(1.0)  # exact: 1 + (w' ) gives back w
    target = "float32" if dtype == "keep-quantized" else dtype
    return {suffix: _cast(values, target)}, None, None


def _quantization(bits_of: dict[str, int]) -> dict | None:
    """mlx-lm's ``config["quantization"]``: the commonest bits, others per module."""
    if not bits_of:
        return None
    default_bits = Counter(bits_of.values()).most_common(1)[0][0]
    quantization = {"group_size": quants.GROUP_SIZE, "bits": default_bits}
    for module, bits in bits_of.items():
        if bits != default_bits:
            quantization[module] = {"group_size": quants.GROUP_SIZE, "bits": bits}
    return quantization


def _output_names(names: dict[str, str], gguf: GGUFFile) -> list[str]:
    """Every name the weights file may hold (quantized layers: three each)."""
    out = []
    for info in gguf.tensors:
        if info.name in names:
            module = names[info.name].rsplit(".", 1)[0]
            out += [names[info.name], f"{module}.scales", f"{module}.biases"]
    return out


def write_weights(
    gguf: GGUFFile,
    family: Family,
    config: dict,
    names: dict[str, str],
    out_dir: Path,
    dtype: str,
    *,
    progress: bool = True,
) -> tuple[dict | None, dict[str, float]]:
    """Convert and write every tensor to ``out_dir/model.safetensors``.

    Returns:
        ``(quantization, requantized)``: ``config["quantization"]`` (or
        ``None``) and module -> relative error of each requantized layer.
    """
    from tqdm import tqdm

    bits_of, requantized, weight_map = {}, {}, {}
    todo = [info for info in gguf.tensors if info.name in names]
    bar = tqdm(
        total=sum(info.nbytes for info in todo),
        unit="B",
        unit_scale=True,
        desc="converting",
        disable=None if progress else True,
    )
    path = out_dir / WEIGHTS_FILE
    with (
        bar,
        SafetensorsWriter(
            path, _output_names(names, gguf), {"format": "mlx"}
        ) as writer,
    ):
        for info in todo:
            arrays, bits, error = convert_tensor(gguf, info, family, config, dtype)
            name = names[info.name]
            module = name.rsplit(".", 1)[0]
            for suffix, (array, kind) in arrays.items():
                key = name if suffix in ("weight", "bias") else f"{module}.{suffix}"
                writer.add(key, array, kind)
                weight_map[key] = WEIGHTS_FILE
            if bits is not None:
                bits_of[module] = bits
            if error is not None:
                requantized[module] = error
            bar.update(info.nbytes)
    index = {
        "metadata": {"total_size": writer.size},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n", encoding="utf-8"
    )
    return _quantization(bits_of), requantized


# --------------------------------------------------------------------------- #
# The whole conversion
# --------------------------------------------------------------------------- #


def inspect_gguf(path: str | Path) -> tuple[GGUFFile, Family]:
    """Open and check a GGUF file without reading its tensors.

    Raises:
        ConversionError: Missing file, not GGUF, another architecture or a
            tensor type gguf-py cannot read.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"GGUF file '{path}' does not exist")
    try:
        gguf = GGUFFile(path)
        family = family_of(gguf.architecture)
    except (GGUFFormatError, UnsupportedModel) as e:
        raise ConversionError(str(e)) from None
    _check_types(gguf)
    return gguf, family


def read_stamp(out_dir: str | Path) -> dict | None:
    """The conversion record of a checkpoint directory, or ``None``."""
    path = Path(out_dir) / STAMP_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _requantized_line(requantized: dict[str, float]) -> str:
    worst = max(requantized, key=requantized.get)
    return (
        f"requantized {len(requantized)} matrices (types without an exact MLX "
        f"layout) to {quants.REQUANTIZE_BITS}-bit: largest error "
        f"{requantized[worst]:.2%} of the largest weight ({worst})"
    )


def convert_gguf(
    path: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    source: dict | None = None,
    tokenizer_dir: str | Path | None = None,
    log=None,
    progress: bool = True,
) -> Path:
    """Convert a GGUF into an mlx-lm checkpoint directory.

    The directory is written next to ``out_dir`` and swapped in at the end, so
    an interrupted conversion never leaves a half-written checkpoint. It holds
    ``config.json``, ``model.safetensors``, ``tokenizer.json``,
    ``tokenizer_config.json`` and a conversion record
    (``mlx_spec_convert.json``). ``mlx_lm.load(out_dir)`` loads it.

    Args:
        path: The ``.gguf`` file.
        out_dir: Checkpoint directory to create (replaced if it exists).
        dtype: One of :data:`DTYPES`. Default: :func:`default_dtype`.
        source: Extra facts to keep in the conversion record (e.g. the file's
            sha256). Default: ``None``.
        tokenizer_dir: A directory with the model's Hugging Face tokenizer
            files to copy instead of rebuilding the tokenizer from the GGUF.
            Default: ``None``.
        log: Receives one-line notes (requantization error). Default: none.
        progress: Show a progress bar on a terminal. Default: ``True``.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ConversionError: The file cannot be converted (one-line message).
    """
    from mlx_lm.utils import save_config

    dtype = dtype or default_dtype()
    if dtype not in DTYPES:
        raise ConversionError(
            f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
        )
    gguf, family = inspect_gguf(path)
    config = model_config(gguf, family)
    names = check_tensors(gguf, family, config)
    rope_freqs = gguf.tensor(ROPE_FREQS)
    if rope_freqs is not None and family.arch == "llama":
        factors = quants.dequantize(
            gguf.read(rope_freqs), rope_freqs.type_name, rope_freqs.shape
        )
        scaling = llama3_rope_scaling(factors, config, gguf.metadata)
        if scaling is not None:
            config["rope_scaling"] = scaling
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as work:
        work.mkdir()
        try:
            if tokenizer_dir is None:
                write_tokenizer(gguf.metadata, work)
            else:
                copy_tokenizer(tokenizer_dir, work, gguf.metadata)
        except TokenizerConversionError as e:
            hint = "" if tokenizer_dir else TOKENIZER_HINT
            raise ConversionError(f"{e}{hint}") from None
        quantization, requantized = write_weights(
            gguf, family, config, names, work, dtype, progress=progress
        )
        if quantization is not None:
            config["quantization"] = quantization
        if dtype != "keep-quantized":
            config["torch_dtype"] = dtype
        save_config(config, work / "config.json")
        record = {
            "converter_version": CONVERTER_VERSION,
            "gguf": Path(path).name,
            "dtype": dtype,
            **(source or {}),
        }
        if requantized:
            record["requantized"] = requantized
            if log is not None:
                log(_requantized_line(requantized))
        (work / STAMP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return out_dir
