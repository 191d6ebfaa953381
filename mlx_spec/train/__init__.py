"""Training drafters with MLX: ``mlx_spec train-draft``.

- :mod:`.head_data`, :mod:`.eagle`, :mod:`.medusa`, :mod:`.heads`: draft
  heads on the target's hidden states (``--kind eagle|medusa``).
"""
