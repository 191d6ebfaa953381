"""mlx-spec: exact speculative decoding for MLX and mlx-lm.

Importing this package first makes mlx use OpenBLAS on Linux CPUs. The
batch API (``batch_generate``) loads the continuous-batching engine of
:mod:`mlx_spec.serve` on first use, so importing the package loads no
server module.
"""

from ._blas import ensure_fast_blas

ensure_fast_blas()

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

# Names loaded on first use (PEP 562), so ``import mlx_spec`` stays light.
_LAZY = {"SpecBatchResponse": "batching", "batch_generate": "batching"}


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
