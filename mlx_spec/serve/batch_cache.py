"""A batch KV cache whose rows each roll back to their own length.

mlx_lm's ``BatchKVCache`` keeps the rows of a batch in one ``(B, H, T, D)``
array: a forward of width ``N`` writes every row's new keys at the same frame
slots ``[T, T + N)``, shorter rows are left-padded, and the attention mask
hides the padding. Speculation breaks that layout after every round: each
row keeps only its own root token and accepted drafts (a different count per
row) of the ``N`` verified slots.

:class:`RaggedBatch` keeps the dropped slots where they are, as *gaps*: dead
slots the mask hides exactly like left padding. A host-side map ``live``
``(B, T)`` says which slots of each row hold one of its tokens, and
``lengths`` ``(B,)`` counts them; each layer's ``offset`` (the RoPE position
of a row's next token) is the row's length, not the frame.

Why a row's outputs are exact: the live slots of row ``r``, in frame order,
hold exactly the keys and values of its tokens, each computed at its own
logical position (invariant kept by every method below). A query of row
``r`` therefore attends to the same (key, value) pairs, in the same order,
as the single-sequence ``KVCache`` of that row; dead slots get the mask's
``-inf`` score and weight ``exp(-inf) = 0``. Only the length of the float
reductions differs (extra exact zeros), as with mlx_lm's left padding.

Gaps cost memory and attention width, never results. When rows join or
leave (which copies the cache anyway, as mlx_lm's ``filter``/``extend`` do),
the rows are gathered back into a tight right-aligned frame.
"""

import weakref
from typing import Any, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from ..mlx_lm_private import set_write_index


def batchable(model) -> Optional[str]:
    """``None`` if ``model``'s caches can be batched here, else the reason.

    Only plain ``KVCache`` layers are batched: sliding windows, recurrent
    state and quantized caches are served one request at a time.
    """
    try:
        kinds = {type(c).__name__ for c in make_prompt_cache(model)}
    except Exception as e:  # a drafting head, for example
        return f"its caches cannot be made ({type(e).__name__})"
    others = sorted(k for k in kinds if k != "KVCache")
    if others:
        return f"its caches ({', '.join(others)}) have no batched rollback"
    return None


def pair_unbatchable(model, draft_model=None) -> Optional[str]:
    """``None`` if ``model`` and its drafter can decode in a batch, else why."""
    reason = batchable(model)
    if reason is None and getattr(draft_model, "is_head", False):
        return "a draft head drafts for one request at a time"
    if reason is None and draft_model is not None:
        reason = batchable(draft_model)
        return reason and f"the draft model: {reason}"
    return reason


class RaggedKVCache(BatchKVCache):
    """One layer's cache in a :class:`RaggedBatch`.

    It writes like mlx_lm's ``BatchKVCache`` (frame slots shared by every
    row); its attention mask and row bookkeeping come from the batch. The
    row operations (``filter``, ``extend``, ``extract``) are the batch's.
    """

    def __init__(self, batch: "RaggedBatch"):
        super().__init__([0] * batch.size)
        # A weak reference: no cycle, so a dropped batch frees its arrays at once.
        self._batch = weakref.ref(batch)

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        if kwargs.get("window_size") is not None:
            raise ValueError("sliding-window attention is not batched here.")
        return self._batch().mask(N, return_array)

    def filter(self, batch_indices):
        raise NotImplementedError("use RaggedBatch.select on the whole batch.")

    def extend(self, other):
        raise NotImplementedError("use RaggedBatch.concat on whole batches.")

    def extract(self, idx):
        raise NotImplementedError("use RaggedBatch.extract on the whole batch.")


class RaggedBatch:
    """The caches of a batch of sequences, one :class:`RaggedKVCache` per layer.

    Call :meth:`prepare` before each forward ``model(tokens, cache=batch.caches)``
    with ``tokens`` ``(B, N)``, then :meth:`commit` to say how many of the
    ``N`` new slots each row keeps.

    Attributes:
        caches: The layer caches, in the model's order.
        live: ``(B, C)`` bool, slot ``j`` of row ``b`` holds one of its
          tokens (``C`` >= :attr:`frame`).
        lengths: ``(B,)`` tokens each row holds.
        frame: Slots in use (every layer's ``_idx``).
    """

    def __init__(self, num_layers: int, size: int):
        self.size = size
        self.caches = [RaggedKVCache(self) for _ in range(num_layers)]
        self.live = np.zeros((size, 0), bool)
        self.lengths = np.zeros(size, np.int64)
        self.frame = 0

    # ------------------------------------------------------------------ #
    # Building

    @classmethod
    def from_rows(cls, rows: Sequence[Tuple[List[Any], Optional[np.ndarray]]]):
        """Gather rows into a tight right-aligned batch.

        Args:
            rows: ``(layer_caches, positions)`` per row: the row's per-layer
              ``(keys, values)`` arrays ``(1, H, T, D)`` and the frame slots
              holding its tokens, in order (``None``: the first ``T``).
        """
        num_layers = len(rows[0][0])
        positions = [np.arange(_slots(kv)) if pos is None else pos for kv, pos in rows]
        lengths = np.array([len(p) for p in positions], np.int64)
        frame = int(lengths.max()) if len(lengths) else 0
        batch = cls(num_layers, len(rows))
        for layer, cache in enumerate(batch.caches):
            if frame == 0:
                break
            template = next(kv[layer] for kv, _ in rows if kv[layer][0] is not None)
            keys, values = [], []
            for (kv, _), pos in zip(rows, positions):
                k, v = _gather(kv[layer], pos, frame, template)
                keys.append(k)
                values.append(v)
            cache.keys = mx.concatenate(keys, axis=0)
            cache.values = mx.concatenate(values, axis=0)
        batch.frame = frame
        batch.lengths = lengths
        batch.live = np.arange(frame)[None, :] >= (frame - lengths)[:, None]
        batch._sync_layers()
        return batch

    @classmethod
    def from_caches(cls, caches: Sequence[List[KVCache]]) -> "RaggedBatch":
        """A batch of single-sequence prompt caches (each a list of ``KVCache``)."""
        return cls.from_rows([([_kv(c) for c in cache], None) for cache in caches])

    def row(self, r: int) -> Tuple[List[Any], np.ndarray]:
        """Row ``r`` as a :meth:`from_rows` source."""
        if self.frame == 0:
            return [(None, None) for _ in self.caches], np.zeros(0, np.int64)
        kv = [(c.keys[r : r + 1], c.values[r : r + 1]) for c in self.caches]
        return kv, np.flatnonzero(self.live[r, : self.frame])

    def select(self, rows: Sequence[int]) -> "RaggedBatch":
        """A compacted batch of ``rows`` (indices into this one), in that order."""
        if not rows:
            return RaggedBatch(len(self.caches), 0)
        return RaggedBatch.from_rows([self.row(r) for r in rows])

    @staticmethod
    def concat(parts: Sequence["RaggedBatch"]) -> "RaggedBatch":
        """The rows of several batches, compacted into one."""
        rows = [p.row(r) for p in parts for r in range(p.size)]
        num_layers = next(len(p.caches) for p in parts)
        return RaggedBatch.from_rows(rows) if rows else RaggedBatch(num_layers, 0)

    def compact(self) -> "RaggedBatch":
        """This batch without gaps (same rows, same order)."""
        return self.select(list(range(self.size)))

    @property
    def slack(self) -> int:
        """Frame slots beyond the longest row."""
        return self.frame - int(self.lengths.max(initial=0))

    def extract(self, r: int, length: Optional[int] = None) -> List[KVCache]:
        """Row ``r``'s first ``length`` tokens as single-sequence ``KVCache``s."""
        pos = np.flatnonzero(self.live[r, : self.frame])
        if length is not None:
            pos = pos[:length]
        out = []
        for c in self.caches:
            cache = KVCache()
            if len(pos):
                kv = (c.keys[r : r + 1], c.values[r : r + 1])
                k, v = _gather(kv, pos, len(pos), kv)
                cache.keys, cache.values = mx.contiguous(k), mx.contiguous(v)
                cache.offset = len(pos)
            out.append(cache)
        return out

    # ------------------------------------------------------------------ #
    # Forwards

    def mask(self, N: int, return_array: bool = False):
        """Attention mask ``(B, 1, N, frame + N)``: live slots and causal new ones.

        Without gaps or padding (every row fills the frame, e.g. a batch of
        one) it is mlx_lm's: ``None`` for one token, else ``"causal"``.
        """
        frame = self.frame
        if self.live[:, :frame].all():
            if return_array:
                return create_causal_mask(N, frame)
            return None if N == 1 else "causal"
        mask = np.zeros((self.size, 1, N, frame + N), bool)
        mask[:, 0, :, :frame] = self.live[:, None, :frame]
        mask[:, 0, :, frame:] = np.tril(np.ones((N, N), bool))
        return mx.array(mask)

    def prepare(self):
        """Set every layer's frame and per-row offsets before a forward."""
        self._sync_layers()

    def commit(self, width: int, keep: Sequence[int]):
        """After a forward of ``width`` new slots, row ``b`` keeps its first ``keep[b]``.

        The dropped slots become gaps; trailing slots dead in every row are
        given back to the frame.
        """
        start = self.frame
        end = start + width
        if self.live.shape[1] < end:
            grow = max(end - self.live.shape[1], 256)
            self.live = np.pad(self.live, ((0, 0), (0, grow)))
        keep = np.asarray(keep, np.int64)
        if np.any(keep < 0) or np.any(keep > width):
            raise ValueError(f"keep={keep.tolist()} is outside [0, {width}].")
        cols = np.arange(width)[None, :]
        self.live[:, start:end] = cols < keep[:, None]
        self.lengths = self.lengths + keep
        self.frame = self._used(end)
        self._sync_layers()

    def truncate(self, lengths: Sequence[int]):
        """Row ``b`` keeps only its first ``lengths[b]`` tokens (no-op if shorter)."""
        for b, n in enumerate(lengths):
            if n < self.lengths[b]:
                pos = np.flatnonzero(self.live[b, : self.frame])
                self.live[b, pos[n:]] = False
                self.lengths[b] = n
        self.frame = self._used(self.frame)
        self._sync_layers()

    # ------------------------------------------------------------------ #

    def _used(self, end: int) -> int:
        """The frame without trailing slots that are dead in every row."""
        alive = np.flatnonzero(self.live[:, :end].any(axis=0))
        return int(alive[-1]) + 1 if len(alive) else 0

    def _sync_layers(self):
        offset = mx.array(self.lengths.astype(np.int32))
        padding = mx.array((self.frame - self.lengths).astype(np.int32))
        for c in self.caches:
            set_write_index(c, self.frame)
            c.offset = offset
            c.left_padding = padding

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)


def _kv(cache: KVCache) -> Tuple[Optional[mx.array], Optional[mx.array]]:
    """A ``KVCache``'s used keys and values, ``(1, H, offset, D)`` (or ``None``)."""
    if cache.keys is None or cache.offset == 0:
        return None, None
    return cache.keys[..., : cache.offset, :], cache.values[..., : cache.offset, :]


def _slots(kv) -> int:
    return 0 if kv[0][0] is None else int(kv[0][0].shape[2])


def _gather(kv, pos: np.ndarray, frame: int, template):
    """Slots ``pos`` of ``(keys, values)`` right-aligned in ``frame`` slots.

    An empty row is all zeros shaped like ``template`` (another row's arrays).
    """
    keys, values = kv
    n = len(pos)
    if n == 0:
        return _zeros_like(template, frame)
    if pos[-1] - pos[0] + 1 == n:  # contiguous: a slice
        k = keys[..., int(pos[0]) : int(pos[-1]) + 1, :]
        v = values[..., int(pos[0]) : int(pos[-1]) + 1, :]
    else:
        index = mx.array(pos.astype(np.int32))
        k = mx.take(keys, index, axis=2)
        v = mx.take(values, index, axis=2)
    if frame > n:
        pad = [(0, 0), (0, 0), (frame - n, 0), (0, 0)]
        k, v = mx.pad(k, pad), mx.pad(v, pad)
    return k, v


def _zeros_like(kv, frame: int):
    keys, values = kv
    shape_k = (1, keys.shape[1], frame, keys.shape[3])
    shape_v = (1, values.shape[1], frame, values.shape[3])
    return mx.zeros(shape_k, keys.dtype), mx.zeros(shape_v, values.dtype)
