"""Serving: mlx-lm's OpenAI-compatible server with speculative decoding."""
