"""Benchmark harness: mlx-spec against mlx-lm, side by side (``python -m benchmarks.run``)."""
