"""mlx-spec: exact speculative decoding for MLX and mlx-lm."""

from ._blas import ensure_fast_blas

ensure_fast_blas()

__version__ = "0.1.0"
