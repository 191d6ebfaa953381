"""Results, charts and notes of the benchmarks; the harness is :mod:`mlx_spec.bench`."""
