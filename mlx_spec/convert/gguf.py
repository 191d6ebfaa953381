"""Convert a llama-family GGUF file into an mlx-lm checkpoint.

mlx-lm has no GGUF import; many users hold GGUFs. This converts files whose
``general.architecture`` is ``llama`` (Llama 1-3, Mistral 7B v0.1, SmolLM,
TinyLlama and the like, as llama.cpp writes them) with tensors of type F32,
F16, Q4_0, Q4_1 or Q8_0. Every other architecture (``qwen2``, ``gemma``,
``phi3``, ...) and every other tensor type (K-quants, I-quants, BF16, ...) is
refused with a one-line error naming it, as are mixture-of-experts llama files.

What the conversion does:

- ``mx.load`` reads the tensors; Q4_0/Q4_1/Q8_0 ones arrive as MLX affine
  ``weight``/``scales``/``biases`` triples (group 32, 4 or 8 bits), exactly the
  GGUF's values.
- llama.cpp permutes the rows of ``attn_q``/``attn_k`` for its RoPE layout
  (pairs interleaved); :func:`unpermute_rows` undoes it per head.
- GGUF names map to mlx-lm's llama names (:func:`mlx_name`), and the
  ``llama.*`` metadata becomes ``config.json`` (:func:`model_config`);
  Llama 3's ``rope_freqs`` tensor becomes its ``rope_scaling``
  (:func:`llama3_rope_scaling`).
- Weights are written dequantized in ``float32``/``float16``/``bfloat16``, or
  (``keep-quantized``) as mlx-lm quantized layers holding the GGUF's exact
  4-/8-bit values, mixed bits recorded per module in ``config["quantization"]``.
- The tokenizer is rebuilt from the metadata (:mod:`.tokenizer`).

Usage::

    from mlx_spec.convert import convert_gguf
    convert_gguf("model.Q4_1.gguf", "models/my-model")          # dtype by platform

or ``python -m mlx_spec.convert gguf model.Q4_1.gguf --out models/my-model``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from .reader import GGUFFormatError, GGUFHeader, read_header
from .tokenizer import TokenizerConversionError, copy_tokenizer, write_tokenizer

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q8_0")
# Block size of every supported quantized type: mlx-lm's group size.
GGUF_GROUP_SIZE = 32
DTYPES = ("float32", "float16", "bfloat16", "keep-quantized")
# Bump when the converter's output changes for the same input.
CONVERTER_VERSION = 1
STAMP_FILE = "mlx_spec_convert.json"
TOKENIZER_HINT = (
    "; pass --tokenizer DIR with the model's Hugging Face tokenizer files instead"
)

# GGUF tensor name (without "blk.N." and ".weight"/".bias") -> mlx-lm name.
_LAYER_NAMES = {
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
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Llama 3.1+ RoPE: per-frequency divisors llama.cpp precomputes from the
# rope_scaling of the original config (see llama3_rope_scaling).
ROPE_FREQS = "rope_freqs.weight"
_TENSOR_NAME = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|bias)$")


class ConversionError(ValueError):
    """The GGUF cannot be converted (one-line message naming what and why)."""


def default_dtype() -> str:
    """``keep-quantized`` on macOS (lossless, fast on Metal), else ``float32``
    (dequantized: the fast path on CPUs)."""
    return "keep-quantized" if sys.platform == "darwin" else "float32"


# --------------------------------------------------------------------------- #
# Checks and config
# --------------------------------------------------------------------------- #


def mlx_name(gguf_name: str) -> str:
    """The mlx-lm llama parameter name of a GGUF tensor.

    Args:
        gguf_name: E.g. ``"blk.3.attn_q.weight"`` or ``"token_embd.weight"``.

    Returns:
        E.g. ``"model.layers.3.self_attn.q_proj.weight"``.

    Raises:
        ConversionError: A tensor this converter does not know.
    """
    match = _TENSOR_NAME.match(gguf_name)
    if match:
        layer, base, suffix = match.groups()
        if layer is not None and base in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[base]}.{suffix}"
        if layer is None and base in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[base]}.{suffix}"
    raise ConversionError(
        f"unsupported GGUF tensor {gguf_name!r}: not part of a llama model"
    )


def check_supported(header: GGUFHeader) -> None:
    """Refuse a file this converter cannot convert exactly.

    Raises:
        ConversionError: Another architecture, a mixture of experts, another
            tensor type, or an unknown tensor (the message names it).
    """
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"unsupported GGUF architecture {arch!r}: only "
            f"{', '.join(map(repr, SUPPORTED_ARCHITECTURES))} is converted"
        )
    experts = header.metadata.get(f"{arch}.expert_count", 0)
    if experts:
        raise ConversionError(
            f"unsupported GGUF: a mixture of experts ({arch}.expert_count = "
            f"{experts}); only dense llama models are converted"
        )
    for info in header.tensors:
        if info.type_name not in SUPPORTED_TYPES:
            raise ConversionError(
                f"unsupported GGUF tensor type {info.type_name} (tensor "
                f"{info.name!r}); supported: {', '.join(SUPPORTED_TYPES)}"
            )
        if info.name != ROPE_FREQS:
            mlx_name(info.name)


def _scalar(metadata: dict, key: str, default=None):
    value = metadata.get(key, default)
    if value is None:
        raise ConversionError(f"the GGUF has no {key!r} metadata")
    if isinstance(value, list):
        raise ConversionError(
            f"unsupported GGUF: {key!r} varies per layer; only uniform models "
            "are converted"
        )
    return value


def _float32(value) -> float:
    """The shortest decimal that reads back as the same float32."""
    import numpy as np

    return float(str(np.float32(value)))


def _rope_scaling(metadata: dict, arch: str) -> dict | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    factor = metadata.get(f"{arch}.rope.scaling.factor", 1.0)
    if kind == "none" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _float32(factor)}
    if kind == "yarn":
        original = metadata.get(f"{arch}.rope.scaling.original_context_length")
        if original is None:
            raise ConversionError(
                f"the GGUF's YaRN rope scaling has no "
                f"{arch}.rope.scaling.original_context_length"
            )
        return {
            "type": "yarn",
            "factor": _float32(factor),
            "original_max_position_embeddings": int(original),
        }
    raise ConversionError(
        f"unsupported GGUF rope scaling {kind!r} ({arch}.rope.scaling.type); "
        "supported: linear, yarn"
    )


def model_config(header: GGUFHeader) -> dict:
    """The mlx-lm ``config.json`` of a (checked) llama GGUF.

    Args:
        header: The file's header, accepted by :func:`check_supported`.

    Returns:
        An HF-style llama config: sizes, heads, RoPE base and scaling, norm
        epsilon, vocabulary size, tied embeddings when there is no ``output``
        tensor, attention biases when ``attn_q`` has one, BOS/EOS ids.
    """
    md, arch = header.metadata, header.architecture
    hidden = int(_scalar(md, f"{arch}.embedding_length"))
    heads = int(_scalar(md, f"{arch}.attention.head_count"))
    kv_heads = int(_scalar(md, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(_scalar(md, f"{arch}.attention.key_length", hidden // heads))
    value_dim = int(_scalar(md, f"{arch}.attention.value_length", head_dim))
    rope_dims = int(_scalar(md, f"{arch}.rope.dimension_count", head_dim))
    if value_dim != head_dim or rope_dims != head_dim:
        raise ConversionError(
            f"unsupported GGUF: key length {head_dim}, value length {value_dim} "
            f"and rope dimensions {rope_dims} differ; llama needs them equal"
        )
    embedding = header.tensor("token_embd.weight")
    if embedding is None:
        raise ConversionError("the GGUF has no token_embd.weight tensor")
    vocab = int(md.get(f"{arch}.vocab_size") or embedding.shape[0])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(_scalar(md, f"{arch}.block_count")),
        "intermediate_size": int(_scalar(md, f"{arch}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _float32(
            _scalar(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
        ),
        "vocab_size": vocab,
        "max_position_embeddings": int(md.get(f"{arch}.context_length", 4096)),
        "rope_theta": _float32(md.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(md, arch),
        "tie_word_embeddings": header.tensor("output.weight") is None,
        "attention_bias": header.tensor("blk.0.attn_q.bias") is not None,
        "mlp_bias": header.tensor("blk.0.ffn_up.bias") is not None,
        "hidden_act": "silu",
    }
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in md:
            config[key] = int(md[f"tokenizer.ggml.{key}"])
    if config["rope_scaling"] is None:
        del config["rope_scaling"]
    return config


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape (rows first) of a llama model with ``config``."""
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    vocab = config["vocab_size"]
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["output.weight"] = (vocab, hidden)
    layer = {
        "attn_q": (q_rows, hidden),
        "attn_k": (kv_rows, hidden),
        "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, q_rows),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
    }
    biased = set()
    if config["attention_bias"]:
        biased |= {"attn_q", "attn_k", "attn_v", "attn_output"}
    if config["mlp_bias"]:
        biased |= {"ffn_gate", "ffn_up", "ffn_down"}
    for i in range(config["num_hidden_layers"]):
        for base, shape in layer.items():
            shapes[f"blk.{i}.{base}.weight"] = shape
            if base in biased:
                shapes[f"blk.{i}.{base}.bias"] = shape[:1]
    return shapes


def check_shapes(header: GGUFHeader, config: dict) -> None:
    """Refuse a file whose tensors do not make the model ``config`` describes.

    Raises:
        ConversionError: A missing, extra or misshapen tensor (named).
    """
    expected = expected_shapes(config)
    found = {info.name: info.shape for info in header.tensors}
    if ROPE_FREQS in found:
        expected[ROPE_FREQS] = (config["head_dim"] // 2,)
    for name, shape in found.items():
        if name not in expected:
            raise ConversionError(f"unexpected GGUF tensor {name!r} for this model")
        if tuple(shape) != expected[name]:
            raise ConversionError(
                f"GGUF tensor {name!r} has shape {tuple(shape)}, expected "
                f"{expected[name]} from the metadata"
            )
    missing = [name for name in expected if name not in found]
    if missing:
        raise ConversionError(f"the GGUF lacks tensor {missing[0]!r}")


def llama3_factors(config: dict, scaling: dict):
    """llama.cpp's ``rope_freqs`` for Llama-3 rope scaling: ``(head_dim/2,)``.

    Each RoPE frequency is divided by its factor: 1 for short wavelengths,
    ``factor`` for long ones, a smooth blend in between.
    """
    import numpy as np

    dims, base = config["head_dim"], config["rope_theta"]
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelens = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    smooth = (old / wavelens - low) / (high - low)
    blend = 1 / ((1 - smooth) / factor + smooth)
    short, long = wavelens < old / high, wavelens > old / low
    return np.where(short, 1.0, np.where(long, factor, blend))


def llama3_rope_scaling(rope_freqs, config: dict, header: GGUFHeader) -> dict | None:
    """The ``rope_scaling`` (Llama 3) that reproduces a GGUF's ``rope_freqs``.

    The largest factor is the scaling factor; the other parameters are Llama
    3.1-3.3's (low 1, high 4, original context 8192 unless the metadata says).

    Raises:
        ConversionError: The factors match no such configuration.
    """
    import numpy as np

    factors = np.array(rope_freqs, dtype=np.float64)
    if np.all(factors == 1.0):
        return None
    if "rope_scaling" in config:
        raise ConversionError(
            "unsupported GGUF: both rope_freqs and rope.scaling metadata are set"
        )
    key = f"{header.architecture}.rope.scaling.original_context_length"
    scaling = {
        "rope_type": "llama3",
        "factor": _float32(factors.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": int(header.metadata.get(key, 8192)),
    }
    if not np.allclose(llama3_factors(config, scaling), factors, rtol=1e-5, atol=0):
        raise ConversionError(
            "unsupported GGUF rope_freqs: they match no Llama-3 rope scaling "
            f"with factor {scaling['factor']}, low 1, high 4, original context "
            f"{scaling['original_max_position_embeddings']}"
        )
    return scaling


# --------------------------------------------------------------------------- #
# Weights
# --------------------------------------------------------------------------- #


def unpermute_rows(rows, num_heads: int):
    """Undo llama.cpp's RoPE row permutation of a Q or K projection.

    llama.cpp stores each head's rows as interleaved pairs: the rows of one
    head, seen as ``(2, head_dim/2)`` in Hugging Face order, are written as
    ``(head_dim/2, 2)``. Row-wise quantization commutes with this, so it
    applies equally to packed weights, scales, biases and a bias vector.

    Args:
        rows: ``(num_heads * head_dim, ...)`` array (any trailing shape).
        num_heads: Heads of this projection (the KV head count for K).

    Returns:
        The same rows in Hugging Face / mlx-lm order.
    """
    import mlx.core as mx

    n = rows.shape[0]
    order = mx.arange(n).reshape(num_heads, n // num_heads // 2, 2)
    return rows[order.transpose(0, 2, 1).reshape(-1)]


def _bits(weight, scales) -> int:
    """Bits per value of an MLX affine triple with GGUF's group size."""
    return weight.shape[-1] * 32 // (scales.shape[-1] * GGUF_GROUP_SIZE)


def convert_weights(
    header: GGUFHeader, tensors: dict, config: dict, dtype: str
) -> tuple[dict, dict | None]:
    """Rename, un-permute and cast the tensors ``mx.load`` read from a GGUF.

    Args:
        header: The file's header.
        tensors: ``mx.load(path)``: GGUF name -> array, with ``.scales`` and
            ``.biases`` siblings for quantized tensors.
        config: :func:`model_config` of the file.
        dtype: One of :data:`DTYPES`.

    Returns:
        ``(weights, quantization)``: mlx-lm name -> array, and the
        ``config["quantization"]`` dict (``None`` unless weights stay
        quantized): default group size and bits, plus one entry per module
        whose bits differ.
    """
    import mlx.core as mx

    out, bits_of = {}, {}
    heads = {
        "attn_q": config["num_attention_heads"],
        "attn_k": config["num_key_value_heads"],
    }
    target = None if dtype == "keep-quantized" else getattr(mx, dtype)
    for info in header.tensors:
        if info.name == ROPE_FREQS:
            continue  # config["rope_scaling"] (llama3_rope_scaling)
        name = mlx_name(info.name)
        stem = info.name.rsplit(".", 1)[0]
        parts = {"weight": tensors[info.name]}
        if info.type_name in QUANTIZED_TYPES:
            parts["scales"] = tensors[f"{stem}.scales"]
            parts["biases"] = tensors[f"{stem}.biases"]
        base = stem.split(".")[-1]
        if base in heads:
            parts = {k: unpermute_rows(v, heads[base]) for k, v in parts.items()}
        module = name.rsplit(".", 1)[0]
        if "scales" in parts and target is not None:
            # float32 scales make the dequantized values exact (d * (q - 8) etc.).
            bits = _bits(parts["weight"], parts["scales"])
            weight = mx.dequantize(
                parts["weight"],
                parts["scales"].astype(mx.float32),
                parts["biases"].astype(mx.float32),
                group_size=GGUF_GROUP_SIZE,
                bits=bits,
            )
            out[name] = weight.astype(target)
        elif "scales" in parts:
            bits_of[module] = _bits(parts["weight"], parts["scales"])
            for key, value in parts.items():
                out[f"{module}.{key}"] = value
        else:
            value = parts["weight"]
            out[name] = value if target is None else value.astype(target)
    if not bits_of:
        return out, None
    default_bits = Counter(bits_of.values()).most_common(1)[0][0]
    quantization = {"group_size": GGUF_GROUP_SIZE, "bits": default_bits}
    for module, bits in bits_of.items():
        if bits != default_bits:
            quantization[module] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
    return out, quantization


# --------------------------------------------------------------------------- #
# The whole conversion
# --------------------------------------------------------------------------- #


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def inspect_gguf(path: str | Path) -> GGUFHeader:
    """Read and check a GGUF file without loading its tensors.

    Raises:
        ConversionError: Missing file, not GGUF, or not convertible.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"GGUF file '{path}' does not exist")
    try:
        header = read_header(path)
    except GGUFFormatError as e:
        raise ConversionError(str(e)) from None
    check_supported(header)
    return header


def _write_weights(out_dir: Path, weights: dict) -> None:
    import mlx.core as mx
    from mlx_lm.utils import make_shards

    shards = make_shards(weights)
    pattern = "model-{:05d}-of-{:05d}.safetensors"
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, shard in enumerate(shards):
        name = pattern.format(i + 1, len(shards)) if len(shards) > 1 else None
        name = name or "model.safetensors"
        mx.save_safetensors(str(out_dir / name), shard, metadata={"format": "mlx"})
        for key, value in shard.items():
            index["weight_map"][key] = name
            index["metadata"]["total_size"] += value.nbytes
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n", encoding="utf-8"
    )


def read_stamp(out_dir: str | Path) -> dict | None:
    """The conversion record of a checkpoint directory, or ``None``."""
    path = Path(out_dir) / STAMP_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def convert_gguf(
    path: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    source: dict | None = None,
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Convert a llama-family GGUF into an mlx-lm checkpoint directory.

    The directory is written next to ``out_dir`` and swapped in at the end, so
    an interrupted conversion never leaves a half-written checkpoint. It holds
    ``config.json``, ``model.safetensors`` (sharded past 5 GB),
    ``tokenizer.json``, ``tokenizer_config.json`` and a conversion record
    (``mlx_spec_convert.json``). ``mlx_lm.load(out_dir)`` loads it.

    Args:
        path: The ``.gguf`` file.
        out_dir: Checkpoint directory to create (replaced if it exists).
        dtype: One of :data:`DTYPES`. Default: :func:`default_dtype`.
        source: Extra facts to keep in the conversion record (e.g. the file's
            sha256). Default: ``None``.
        tokenizer_dir: A directory with the model's Hugging Face tokenizer
            files to copy instead of rebuilding the tokenizer from the GGUF
            (for SentencePiece vocabularies, which are not rebuilt).
            Default: ``None``.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ConversionError: The file cannot be converted (one-line message).
    """
    import mlx.core as mx
    from mlx_lm.utils import save_config

    dtype = dtype or default_dtype()
    if dtype not in DTYPES:
        raise ConversionError(
            f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
        )
    header = inspect_gguf(path)
    config = model_config(header)
    check_shapes(header, config)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        work.chmod(0o777 & ~umask)  # mkdtemp makes it private
        try:
            if tokenizer_dir is None:
                write_tokenizer(header.metadata, work)
            else:
                copy_tokenizer(tokenizer_dir, work, header.metadata)
        except TokenizerConversionError as e:
            hint = "" if tokenizer_dir else TOKENIZER_HINT
            raise ConversionError(f"{e}{hint}") from None
        try:
            tensors = mx.load(str(path))
        except Exception as e:  # mlx's GGUF reader: keep its first line
            raise ConversionError(f"could not read '{path}': {_one_line(e)}") from None
        if ROPE_FREQS in tensors:
            scaling = llama3_rope_scaling(tensors[ROPE_FREQS], config, header)
            if scaling is not None:
                config["rope_scaling"] = scaling
        weights, quantization = convert_weights(header, tensors, config, dtype)
        del tensors
        if quantization is not None:
            config["quantization"] = quantization
        if dtype != "keep-quantized":
            config["torch_dtype"] = dtype
        _write_weights(work, weights)
        del weights
        save_config(config, work / "config.json")
        record = {
            "converter_version": CONVERTER_VERSION,
            "gguf": Path(path).name,
            "dtype": dtype,
            **(source or {}),
        }
        (work / STAMP_FILE).write_text(json.dumps(record, indent=2) + "\n")
        _replace_dir(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir


def _replace_dir(new: Path, old: Path) -> None:
    """Put directory ``new`` at ``old``, replacing what was there."""
    if old.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{old.name}.old.", dir=old.parent))
        os.replace(old, trash / old.name)
        os.replace(new, old)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, old)
