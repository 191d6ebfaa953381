"""Attention over token trees on unmodified mlx-lm models (masks, positions, cache views)."""
