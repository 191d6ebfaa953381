"""A GGUF file's metadata, tensor table and tensor bytes, read with gguf-py.

gguf-py (the ``gguf`` package, maintained with llama.cpp) parses the file;
this module turns its fields into plain Python values and reads one tensor's
bytes at a time (:meth:`GGUFFile.read`) into fresh memory, so that a
conversion never holds more than the tensor at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

INSTALL_HINT = "pip install gguf"


class GGUFFormatError(ValueError):
    """The file is not a GGUF file gguf-py reads (one-line message)."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table.

    Attributes:
        name: GGUF tensor name, e.g. ``"blk.0.attn_q.weight"``.
        shape: Rows first (numpy/MLX order), i.e. GGUF's dims reversed.
        type_name: ggml type name, e.g. ``"Q4_K"``.
        offset: Byte offset of the data in the file.
        nbytes: Size of the data in bytes.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int
    nbytes: int


def _gguf():
    try:
        import gguf
    except ImportError:
        raise GGUFFormatError(
            f"reading GGUF files needs the gguf package: {INSTALL_HINT}"
        ) from None
    return gguf


class GGUFFile:
    """An open GGUF file (metadata and table read, tensor data on demand).

    Attributes:
        path: The file.
        metadata: Key -> value (``int``/``float``/``bool``/``str`` or a list).
        tensors: The tensor table, in file order.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        gguf = _gguf()
        try:
            reader = gguf.GGUFReader(self.path)
        except Exception as e:  # gguf-py raises ValueError, IndexError, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise GGUFFormatError(
                f"'{self.path}' is not a GGUF file gguf-py can read"
                + (f" ({first})" if first else "")
            ) from None
        self.metadata = {
            key: field.contents()
            for key, field in reader.fields.items()
            if not key.startswith("GGUF.")
        }
        self.tensors = tuple(
            TensorInfo(
                name=t.name,
                shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                type_name=t.tensor_type.name,
                offset=int(t.data_offset),
                nbytes=int(t.n_bytes),
            )
            for t in reader.tensors
        )
        self._by_name = {t.name: t for t in self.tensors}
        del reader  # drops gguf-py's map of the whole file

    @property
    def architecture(self) -> str:
        """``general.architecture``, or ``""``."""
        return str(self.metadata.get("general.architecture", ""))

    def tensor(self, name: str) -> TensorInfo | None:
        """The table entry named ``name``, or ``None``."""
        return self._by_name.get(name)

    def read(self, info: TensorInfo) -> np.ndarray:
        """A tensor's bytes: flat uint8, in memory of their own."""
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            data = np.fromfile(f, dtype=np.uint8, count=info.nbytes)
        if data.size != info.nbytes:
            raise GGUFFormatError(f"'{self.path}' is truncated (tensor {info.name!r})")
        return data
