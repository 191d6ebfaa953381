"""Shared pytest set-up: load OpenBLAS before mlx is imported anywhere."""

import mlx_spec  # noqa: F401  (must precede every mlx import: it preloads OpenBLAS)
