"""GGUF tensor data -> MLX arrays: exact affine layers, or dequantized floats.

Seven ggml block types are MLX affine quantization in another layout: every
group of 32 values is ``scale * q + bias`` with ``q`` an unsigned integer of
4, 5 or 8 bits. :func:`to_mlx_quantized` repacks them without loss:

========  ======  ======================================================
type      bits    scale, bias of a group of 32
========  ======  ======================================================
Q4_0      4       ``d``, ``-8 d``
Q4_1      4       ``d``, ``m``
Q5_0      5       ``d``, ``-16 d``
Q5_1      5       ``d``, ``m``
Q8_0      8       ``d``, ``-128 d`` (``q`` = the int8 value + 128)
Q4_K      4       ``d * sc``, ``-dmin * m`` (6-bit ``sc``/``m`` per 32 of 256)
Q5_K      5       ``d * sc``, ``-dmin * m``
========  ======  ======================================================

Scales and biases are stored in float16 when every one of a tensor's is a
float16 exactly (the legacy types), else in float32 (K-quants: ``d * sc``
needs 17 bits). Either way ``mx.dequantize`` gives gguf-py's float32 values
bit for bit. Every other type (Q2_K, Q3_K, Q6_K, IQ*, TQ*, MXFP4, BF16, ...)
is dequantized by gguf-py (:func:`dequantize`); :func:`requantize` turns such
a matrix into an 8-bit MLX layer and measures the error.
"""

from __future__ import annotations

import numpy as np

GROUP_SIZE = 32
# ggml type name -> MLX bits of the exact mapping.
EXACT_BITS = {
    "Q4_0": 4,
    "Q4_1": 4,
    "Q5_0": 5,
    "Q5_1": 5,
    "Q8_0": 8,
    "Q4_K": 4,
    "Q5_K": 5,
}
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
# Bits of the MLX layer a non-exact matrix is requantized to (keep-quantized).
REQUANTIZE_BITS = 8
# Values per chunk of rows: a tensor is converted a chunk at a time into its
# output, so the work arrays stay this small (16 MB of float32).
CHUNK_VALUES = 1 << 22


def row_chunks(rows: int, cols: int):
    """Slices of ``rows`` holding about :data:`CHUNK_VALUES` values each."""
    step = max(1, CHUNK_VALUES // max(cols, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def _half(raw: np.ndarray) -> np.ndarray:
    """``(n, 2)`` bytes -> ``(n,)`` float32 (a float16 each)."""
    return np.ascontiguousarray(raw).view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``(n, 16)`` bytes -> ``(n, 32)``: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """``(n, 4)`` bytes (a little-endian u32) -> ``(n, 32)`` bits, bit j at j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in a K-quant's 12 bytes.

    Args:
        scales: ``(n, 12)`` uint8.

    Returns:
        ``(sc, m)``, each ``(n, 8)`` uint8: for j < 4 the low 6 bits of bytes
        j and j + 4; for j >= 4 a nibble of byte j + 4 with the top 2 bits of
        bytes j - 4 (scale) and j (min).
    """
    low, high, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([low & 63, (mixed & 0x0F) | ((low >> 6) << 4)], axis=-1)
    m = np.concatenate([high & 63, (mixed >> 4) | ((high >> 6) << 4)], axis=-1)
    return sc, m


def _legacy_groups(blocks: np.ndarray, kind: str):
    """Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks -> ``(q (n, 32), scale (n,), bias (n,))``."""
    d = _half(blocks[:, 0:2])
    if kind == "Q8_0":
        q = (blocks[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, d, -128 * d
    if kind in ("Q4_1", "Q5_1"):
        bias, rest = _half(blocks[:, 2:4]), blocks[:, 4:]
    else:
        bias, rest = None, blocks[:, 2:]
    if kind.startswith("Q5"):
        q = _nibbles(rest[:, 4:20]) | (_high_bits(rest[:, 0:4]) << 4)
    else:
        q = _nibbles(rest[:, 0:16])
    if bias is None:
        bias = -(8 if kind == "Q4_0" else 16) * d
    return q, d, bias


def _k_groups(blocks: np.ndarray, kind: str):
    """Q4_K/Q5_K super-blocks -> ``(q (8n, 32), scale (8n,), bias (8n,))``."""
    n = blocks.shape[0]
    d, dmin = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
    sc, m = _scale_min_k4(blocks[:, 4:16])
    qs = blocks[:, -128:].reshape(n, 4, 32)
    # Each 32 bytes hold two sub-blocks: low nibbles, then high nibbles.
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    if kind == "Q5_K":
        # Bit j of qh[l] is the fifth bit of value l of sub-block j.
        high = np.unpackbits(blocks[:, 16:48, None], axis=-1, bitorder="little")
        q = q | (high.transpose(0, 2, 1) << 4)
    scale = d[:, None] * sc.astype(np.float32)
    bias = -(dmin[:, None] * m.astype(np.float32))
    return q.reshape(8 * n, 32), scale.reshape(-1), bias.reshape(-1)


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing: each row's values as one little-endian bit stream.

    Args:
        q: ``(rows, cols)`` uint8 values below ``2**bits``; ``cols * bits``
            a multiple of 32.
        bits: 4, 5 or 8 (any of 1-8 works).

    Returns:
        ``(rows, cols * bits // 32)`` uint32.
    """
    rows, cols = q.shape
    if bits == 8:
        packed = q
    elif bits == 4:
        packed = q[:, 0::2] | (q[:, 1::2] << 4)
    else:
        # 8 values -> one 64-bit word -> its low ``bits`` bytes.
        groups = q.reshape(rows, cols // 8, 8).astype(np.uint64)
        shifts = np.arange(8, dtype=np.uint64) * np.uint64(bits)
        words = np.bitwise_or.reduce(groups << shifts, axis=-1)
        packed = words[..., None].view(np.uint8)[..., :bits].reshape(rows, -1)
    return np.ascontiguousarray(packed).view(np.uint32)


def _narrowest(scales: np.ndarray, biases: np.ndarray):
    """Both in float16 if that loses nothing, else both in float32."""
    half_s, half_b = scales.astype(np.float16), biases.astype(np.float16)
    exact = np.array_equal(half_s, scales) and np.array_equal(half_b, biases)
    return (half_s, half_b) if exact else (scales, biases)


def to_mlx_quantized(raw: np.ndarray, kind: str, shape: tuple[int, int]):
    """An exactly-mapped GGUF matrix as an MLX affine triple (group 32).

    Args:
        raw: The tensor's bytes, ``(rows, bytes per row)`` or flat uint8.
        kind: A key of :data:`EXACT_BITS`.
        shape: ``(rows, cols)`` of the matrix.

    Returns:
        ``(weight, scales, biases)``: ``(rows, cols * bits / 32)`` uint32 and
        two ``(rows, cols / 32)`` float16 or float32 arrays, such that
        ``mx.dequantize`` gives the GGUF's values.
    """
    import gguf

    rows, cols = shape
    bits = EXACT_BITS[kind]
    qtype = gguf.GGMLQuantizationType[kind]
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw_rows = np.ascontiguousarray(raw).reshape(rows, -1)
    groups = (rows, cols // GROUP_SIZE)
    weight = np.empty((rows, cols * bits // 32), np.uint32)
    scales, biases = np.empty(groups, np.float32), np.empty(groups, np.float32)
    for part in row_chunks(rows, cols):
        blocks = raw_rows[part].reshape(-1, type_size)
        if kind in ("Q4_K", "Q5_K"):
            q, scale, bias = _k_groups(blocks, kind)
        else:
            q, scale, bias = _legacy_groups(blocks, kind)
        weight[part] = pack_bits(q.reshape(-1, cols), bits)
        scales[part] = scale.reshape(-1, groups[1])
        biases[part] = bias.reshape(-1, groups[1])
    return (weight, *_narrowest(scales, biases))


def dequantize(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's float32 values of a tensor of any type it reads.

    Args:
        raw: The tensor's bytes (uint8) or its float array.
        kind: ggml type name (``"Q6_K"``, ``"BF16"``, ``"F16"``, ...).
        shape: The tensor's shape, rows first.

    Returns:
        ``shape`` float32.
    """
    import gguf

    if kind in FLOAT_TYPES:
        values = np.ascontiguousarray(raw).view(FLOAT_TYPES[kind])
        return values.astype(np.float32).reshape(shape)
    qtype = gguf.GGMLQuantizationType[kind]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    flat = np.ascontiguousarray(raw).reshape(rows, -1)
    out = np.empty((rows, shape[-1]), np.float32)
    for part in row_chunks(rows, shape[-1]):
        out[part] = gguf.quants.dequantize(flat[part], qtype)
    return out.reshape(shape)


def requantize(values: np.ndarray, bits: int = REQUANTIZE_BITS):
    """A float matrix as an MLX affine triple (group 32), and the error.

    Args:
        values: ``(rows, cols)`` float32, ``cols`` a multiple of 32.
        bits: MLX bits. Default: ``8``.

    Returns:
        ``(weight, scales, biases, error)``: numpy arrays as
        :func:`to_mlx_quantized` returns, and the largest absolute error
        divided by the largest absolute value.
    """
    import mlx.core as mx

    rows, cols = values.shape
    weight = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, cols // GROUP_SIZE), np.float32)
    biases = np.empty_like(scales)
    largest_error = peak = 0.0
    for part in row_chunks(rows, cols):
        w = mx.array(values[part])
        triple = mx.quantize(w, group_size=GROUP_SIZE, bits=bits)
        back = mx.dequantize(*triple, group_size=GROUP_SIZE, bits=bits)
        largest_error = max(largest_error, mx.abs(back - w).max().item())
        peak = max(peak, mx.abs(w).max().item())
        for out, array in zip((weight, scales, biases), triple):
            out[part] = np.array(array)
        del w, triple, back
    error = largest_error / peak if peak else 0.0
    return weight, scales, biases, error
