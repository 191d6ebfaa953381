"""Mixed precision for drafter training: float32 weights, compute where it is fastest.

The trainable weights and the optimizer state stay float32. With a lower
compute dtype, each forward reads the weights cast to that dtype (the casts
are part of the graph, so the gradients reach the float32 weights), its
inputs are cast too, and the losses are computed in float32 from the logits.

``auto`` picks bfloat16 on Apple silicon (Metal), where it roughly halves
the cost of the matmuls, and float32 on a CPU, where bfloat16 matmuls are
several times slower than float32 ones.
"""

from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

PRECISIONS = ("auto", "float32", "bfloat16")


def compute_dtype(precision: str = "auto") -> mx.Dtype:
    """The compute dtype of ``precision`` (one of :data:`PRECISIONS`).

    Raises:
        ValueError: ``precision`` is not one of them.
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"--precision must be one of {', '.join(PRECISIONS)}, got '{precision}'."
        )
    if precision == "auto":
        return mx.bfloat16 if mx.metal.is_available() else mx.float32
    return getattr(mx, precision)


@contextmanager
def computing_in(module: nn.Module, dtype: mx.Dtype) -> Iterator[nn.Module]:
    """Inside the block, ``module``'s trainable weights are their own cast to ``dtype``.

    Used inside a function that :func:`mlx.nn.value_and_grad` differentiates,
    so the casts sit between the float32 weights and the forward; the module
    gets its float32 weights back on exit. Frozen weights are left as they
    are: cast what is read of them (an embedding's rows) where it is read.
    """
    if dtype == mx.float32:
        yield module
        return
    saved = module.trainable_parameters()

    def cast(p):
        return p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p

    module.update(tree_map(cast, saved))
    try:
        yield module
    finally:
        module.update(saved)
