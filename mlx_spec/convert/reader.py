"""Reading a GGUF file's header: metadata and the tensor table, no tensor data.

``mx.load(path)`` reads the tensors themselves (quantized ones as MLX
``weight``/``scales``/``biases`` triples) but not their GGUF storage types,
which decide whether a file can be converted at all. This module reads the
header alone, in pure Python, so a file is checked before any tensor is loaded.

Layout (GGUF v2/v3, little endian): magic ``GGUF``, version (u32), tensor count
(u64), key-value count (u64), the key-value pairs, then one entry per tensor:
name, number of dims (u32), dims (u64 each, fastest-varying first), type (u32),
data offset (u64).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# ggml tensor type ids -> names (ggml.h); unknown ids are reported by number.
GGML_TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}

# Metadata value types: fixed-size scalars (struct format), string 8, array 9.
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands (one-line message)."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table.

    Attributes:
        name: GGUF tensor name, e.g. ``"blk.0.attn_q.weight"``.
        shape: Shape in row-major (numpy/MLX) order: ``(rows, columns)`` for a
            matrix, i.e. GGUF's dims reversed.
        type_id: ggml type id.
    """

    name: str
    shape: tuple[int, ...]
    type_id: int

    @property
    def type_name(self) -> str:
        """The ggml type name (``"Q4_1"``), or ``"type N"`` for unknown ids."""
        return GGML_TYPE_NAMES.get(self.type_id, f"type {self.type_id}")


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's metadata and tensor table.

    Attributes:
        version: GGUF format version (2 or 3).
        metadata: Key -> value; scalars as Python ``int``/``float``/``bool``/
            ``str``, arrays as lists.
        tensors: The tensor table, in file order.
    """

    version: int
    metadata: dict
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        """``general.architecture``, or ``""`` when the file has none."""
        return str(self.metadata.get("general.architecture", ""))

    def tensor(self, name: str) -> TensorInfo | None:
        """The table entry named ``name``, or ``None``."""
        for info in self.tensors:
            if info.name == name:
                return info
        return None


class _Cursor:
    """Sequential little-endian reads from a buffer."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.pos, self.path = buffer, 0, path

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buffer):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header")
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        size = self.unpack("<Q")
        end = self.pos + size
        if end > len(self.buffer):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header")
        raw = bytes(self.buffer[self.pos : end])
        self.pos = end
        return raw.decode("utf-8", errors="replace")

    def _strings(self, count: int) -> list[str]:
        # Vocabularies hold ~1e5 strings: a tight loop, no per-item checks.
        buffer, pos, out = self.buffer, self.pos, []
        try:
            for _ in range(count):
                (size,) = _U64.unpack_from(buffer, pos)
                pos += 8
                out.append(str(buffer[pos : pos + size], "utf-8", "replace"))
                pos += size
        except struct.error:
            raise GGUFFormatError(f"{self.path}: truncated GGUF header") from None
        if pos > len(buffer):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header")
        self.pos = pos
        return out

    def value(self, value_type: int):
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item_type]
                size = struct.calcsize(fmt) * count
                if self.pos + size > len(self.buffer):
                    raise GGUFFormatError(f"{self.path}: truncated GGUF header")
                items = struct.unpack_from(f"<{count}{fmt[1:]}", self.buffer, self.pos)
                self.pos += size
                return list(items)
            if item_type == _STRING:
                return self._strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise GGUFFormatError(
            f"{self.path}: unknown GGUF metadata value type {value_type}"
        )


def read_header(path: str | Path) -> GGUFHeader:
    """Read the metadata and tensor table of a GGUF file (no tensor data).

    Args:
        path: The ``.gguf`` file.

    Returns:
        The :class:`GGUFHeader`.

    Raises:
        GGUFFormatError: The file is not GGUF, is truncated, or uses GGUF v1.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    with open(path, "rb") as f:
        if path.stat().st_size < 24:
            raise GGUFFormatError(f"{path}: not a GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            view = memoryview(buffer)
            try:
                return _parse(view, path)
            finally:
                view.release()  # the mmap cannot close while a view exists


def _parse(buffer, path: Path) -> GGUFHeader:
    cursor = _Cursor(buffer, path)
    if bytes(buffer[:4]) != b"GGUF":
        raise GGUFFormatError(f"{path}: not a GGUF file (no GGUF magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(
            f"{path}: GGUF version {version} is not supported (only 2 and 3);"
            " re-convert the model with a recent llama.cpp"
        )
    n_tensors, n_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
        type_id = cursor.unpack("<I")
        cursor.unpack("<Q")  # data offset: mx.load reads the data
        tensors.append(TensorInfo(name, tuple(reversed(dims)), type_id))
    return GGUFHeader(version, metadata, tuple(tensors))
