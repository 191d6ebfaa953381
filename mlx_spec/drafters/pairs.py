"""The cache of *pairs* that EAGLE heads and MTP layers draft from.

Pair ``j`` is ``(feature of seq[j], seq[j + 1])``, counted from this call's
prompt: the target's feature at a position and the token that followed. The
engine hands over the features of the accepted rows after each target
forward; the next round feeds them in one forward of the drafter module, then
drafts. Draft entries never stay: :meth:`FeaturePairs.rewind` trims the cache
back to the pairs built from the target's features.
"""

from typing import List, Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from .base import RoundState


class FeaturePairs:
    """A drafter module's KV cache of pairs and the features it has not read yet.

    Subclasses implement :meth:`feed`: one forward over ``m`` new pairs.
    """

    def __init__(self, head):
        self.head = head
        self.module = head.module
        # One cache, or a module's own per-layer caches (a published head's).
        make = getattr(self.module, "head_cache", None)
        self.cache = make() if make is not None else KVCache()
        self.pending: List[mx.array] = []  # (m, F) features of pairs fed.. fed+m-1
        self.fed = 0  # pairs in the cache, all built from the target's features
        self.last: Optional[mx.array] = None  # output at the last pair (1, 1, H)

    def add_features(self, features: mx.array, rows: Optional[List[int]]):
        """Features ``(T, F)`` of a target forward; ``rows`` are the accepted ones.

        ``rows=None`` (the prompt's prefill) keeps every row.
        """
        if rows is not None:
            features = features[mx.array(rows, mx.int32)]
        self.pending.append(features)

    def catch_up(self, state: RoundState) -> Optional[mx.array]:
        """Feed the pending pairs; return the output at the last pair ``(1, 1, H)``.

        ``None`` when no pair was ever fed (a one-token prompt's first round).
        """
        if self.pending:
            feats = (
                mx.concatenate(self.pending)
                if len(self.pending) > 1
                else self.pending[0]
            )
            self.pending = []
            m = feats.shape[0]
            tokens = mx.array(state.seq[self.fed + 1 : self.fed + 1 + m], mx.uint32)
            out = self.feed(feats, tokens, state)
            self.fed += m
            self.last = out[:, -1:]
        return self.last

    def feed(self, feats: mx.array, tokens: mx.array, state: RoundState) -> mx.array:
        """One forward over the pairs ``(feats[i], tokens[i])``, ``(m, F)`` and
        ``(m,)``, placed after the ``fed`` pairs: the outputs ``(1, m, H)``."""
        raise NotImplementedError

    def rewind(self):
        """Drop the draft entries: keep the pairs built from the target's features."""
        extra = self.cache.offset - self.fed
        if extra > 0:
            self.cache.trim(extra)
