"""Write a ``.safetensors`` file one tensor at a time.

``mx.save_safetensors`` (and the ``safetensors`` package) take every tensor at
once, so a conversion would hold the whole model. The format is a JSON header
(name -> dtype, shape, byte range) followed by the data; the header comes
first but is known last. :class:`SafetensorsWriter` therefore reserves room
for it (bounded from the tensor names, which are known up front), streams the
data behind it, and writes the header at the end, padded with spaces as the
format allows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

# numpy dtype -> safetensors dtype name; bfloat16 arrives as uint16 bits.
DTYPE_NAMES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint8): "U8",
}
# Bound on one header entry besides its name: dtype, a 2-D shape and two
# offsets of up to 20 digits each, with the JSON punctuation.
_ENTRY_BYTES = 160


class SafetensorsWriter:
    """A ``.safetensors`` file written tensor by tensor.

    Args:
        path: The file to create.
        names: Every tensor name that :meth:`add` may receive.
        metadata: The header's ``__metadata__`` (strings). Default: none.
    """

    def __init__(self, path: str | Path, names: Iterable[str], metadata=None):
        self.path = Path(path)
        self.metadata = dict(metadata or {})
        reserve = len(json.dumps({"__metadata__": self.metadata})) + 64
        reserve += sum(len(name) + _ENTRY_BYTES for name in names)
        self.reserve = reserve + (-(8 + reserve) % 8)  # data 8-byte aligned
        self.entries: dict[str, dict] = {}
        self.size = 0
        self.file = open(self.path, "wb")
        self.file.seek(8 + self.reserve)

    def add(self, name: str, array: np.ndarray, dtype: str | None = None) -> None:
        """Append one tensor.

        Args:
            name: Its name (one of ``names``).
            array: Its values.
            dtype: The safetensors dtype (``"BF16"`` for uint16 bits).
                Default: from ``array.dtype``.
        """
        array = np.ascontiguousarray(array)
        dtype = dtype or DTYPE_NAMES[array.dtype]
        self.entries[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [self.size, self.size + array.nbytes],
        }
        self.file.write(memoryview(array.reshape(-1)).cast("B"))
        self.size += array.nbytes

    def close(self) -> int:
        """Write the header; return the bytes of tensor data."""
        header = {"__metadata__": self.metadata, **self.entries}
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) > self.reserve:
            raise ValueError("safetensors header larger than reserved")
        self.file.seek(0)
        self.file.write(self.reserve.to_bytes(8, "little"))
        self.file.write(text.ljust(self.reserve, b" "))
        self.file.close()
        return self.size

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.file.close()
