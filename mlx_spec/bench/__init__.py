"""Benchmark harness: mlx-spec against mlx-lm, side by side (``mlx_spec bench``, ``python -m mlx_spec.bench``)."""
