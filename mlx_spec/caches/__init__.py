"""Exact rollback for every mlx-lm cache type.

Speculative decoding feeds a round's draft tokens to the model, then keeps
only the accepted ones, so every cache must be rewound exactly:

- ``KVCache``, ``QuantizedKVCache``, ``ChunkedKVCache``: trimmed (mlx-lm's own
  ``trim``), ``ConcatenateKVCache``: sliced;
- ``ArraysCache`` (recurrent and convolution state of linear-attention, SSM and
  short-convolution layers): a snapshot at each round's mark, then a replay
  of the kept tokens through the recurrent mixers alone (:mod:`.recurrent`);
- ``RotatingKVCache`` (sliding windows), also once the window is full: the
  entries a round evicts are kept and the buffer is rebuilt in temporal
  order (:mod:`.rotating`);
- ``CacheList``: each of its caches as above.

The modules that update the last two kinds are found by one probe forward
and captured at run time (:mod:`.capture`); no model file is forked.
"""

from .capture import leaf_caches
from .rollback import (
    CacheRollback,
    check_rewindable,
    copy_states,
    model_type,
    needs_journal,
    set_states,
    unsupported,
)

__all__ = [
    "CacheRollback",
    "check_rewindable",
    "copy_states",
    "set_states",
    "leaf_caches",
    "model_type",
    "needs_journal",
    "unsupported",
]
