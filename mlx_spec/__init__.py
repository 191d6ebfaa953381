"""mlx-spec: exact speculative decoding for MLX and mlx-lm.

Importing this package first makes mlx use OpenBLAS on Linux CPUs.
"""

from ._blas import ensure_fast_blas

ensure_fast_blas()

from .batching import SpecBatchResponse, batch_generate  # noqa: E402
from .config import SpecConfig  # noqa: E402
from .engine import speculative_generate_step  # noqa: E402
from .generation import (  # noqa: E402
    SpecResponse,
    SpecStream,
    generate,
    stream_generate,
)
from .integration import register, unregister  # noqa: E402
from .mtp import load_mtp  # noqa: E402
from .sampling import make_sampler  # noqa: E402
from .stats import SpecStats  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "SpecBatchResponse",
    "SpecConfig",
    "SpecResponse",
    "SpecStats",
    "batch_generate",
    "generate",
    "load_mtp",
    "make_sampler",
    "register",
    "speculative_generate_step",
    "stream_generate",
    "unregister",
]
