"""Rollouts: the draft's own tokens in its training context, as at inference.

Teacher forcing trains the draft only on prefixes the target wrote. At
inference, draft position ``i`` of a round reads the ``i - 1`` tokens the
draft itself proposed before it. A rollout step (``--rollout-steps k``) puts
such contexts in training, in the spirit of on-policy distillation
(DistillSpec, GKD) and of EAGLE-3's training-time test, and packs them as
EAGLE-3 does, so one forward covers them all:

1. in each sequence of the step's batch, about one completion position in
   :data:`ROLLOUT_EVERY` is a *cut* ``c`` (seeded by the step, so a resumed
   run cuts alike);
2. each cut gets a *branch* of ``k`` slots after the sequence (the *trunk*):
   branch token ``j`` sits at rope position ``c + j`` and sees the trunk's
   first ``c`` tokens and the branch's tokens up to itself (a mask, as tree
   attention uses, on unmodified mlx-lm models);
3. the draft writes the branches from its own law (greedy, or sampled at
   ``--rollout-temp``), one level per forward: ``k`` forwards of the packed batch;
4. the target scores the packed batch in one forward and keeps its top-K
   law at every branch slot (its output layer runs at those slots only);
5. the draft trains on the packed batch: the trunk's rows as usual
   (teacher-forced, the stored laws) and the branch slots (soft labels: the
   target's law there; hard label: its top token).

A branch slot's context holds 1 .. k draft tokens; it weighs in the loss
like a completion row but does not count in ``tokens_seen`` nor in the
step's accuracy.

A draft token counts only if every earlier one of its round was accepted,
so a draft model that reads tokens alone is read, at inference, in the
target's own text: rollouts change which contexts train, not those it is
read in. Measured on the real pair they gained nothing (benchmarks/README.md),
so they are off by default.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from ..attention.tree import prepare_tree_model, rope_positions
from ..features import feature_logits, feature_owner
from .completions import top_laws

# One cut per this many completion positions, at random positions.
ROLLOUT_EVERY = 8


def is_rollout_step(step: int, share: float) -> bool:
    """Whether optimizer step ``step`` (0-based) rolls out: an even ``share`` of steps."""
    return int((step + 1) * share) > int(step * share)


def rollout_cuts(
    start: int, n: int, every: int, rng: np.random.Generator
) -> np.ndarray:
    """Sorted cuts of one sequence: ``ceil(span / every)`` distinct positions ``c``
    with ``max(start, 1) <= c < n`` (a branch continues ``tokens[:c]``)."""
    lo = max(start, 1)
    span = n - lo
    if span <= 0:
        return np.zeros(0, np.int64)
    count = -(-span // every)
    return np.sort(rng.choice(np.arange(lo, n), size=count, replace=False))


@dataclass
class Packed:
    """A batch's trunks and branches laid out for one masked forward (numpy).

    ``W`` is the trunk width, ``M`` the most cuts of a row, ``k`` the branch
    length; branch ``m``'s token ``j`` sits in slot ``W + m * k + j``.

    Attributes:
        tokens: ``(B, N)`` int32 ids, ``N = W + M * k`` (branches still empty).
        positions: ``(B, N)`` int32 rope positions.
        mask: ``(B, N, N)`` bool: slot ``i`` attends to slot ``j``.
        slots: ``(B, M, k)`` the slot of each branch token.
        source: ``(B, M, k)`` the slot whose output proposes it: the trunk's
          ``c - 1`` for ``j = 0``, else the branch's previous slot.
        real: ``(B, M)`` bool: a cut (rows with fewer cuts have empty branches,
          which see only themselves).
    """

    tokens: np.ndarray
    positions: np.ndarray
    mask: np.ndarray
    slots: np.ndarray
    source: np.ndarray
    real: np.ndarray


def pack(trunks: np.ndarray, cuts: Sequence[np.ndarray], steps: int) -> Packed:
    """Lay out ``trunks`` ``(B, W)`` and a branch of ``steps`` slots per cut (see :class:`Packed`)."""
    B, W = trunks.shape
    M = max(max((len(c) for c in cuts), default=0), 1)
    N = W + M * steps
    tokens = np.zeros((B, N), np.int32)
    tokens[:, :W] = trunks
    positions = np.zeros((B, N), np.int32)
    positions[:, :W] = np.arange(W)
    mask = np.zeros((B, N, N), bool)
    mask[:, :W, :W] = np.tril(np.ones((W, W), bool))
    slots = W + np.arange(M)[:, None] * steps + np.arange(steps)[None]  # (M, k)
    slots = np.broadcast_to(slots, (B, M, steps)).copy()
    source = np.concatenate([slots[..., :1], slots[..., :-1]], axis=-1)
    real = np.zeros((B, M), bool)
    below = np.tril(np.ones((steps, steps), bool))
    for b, row_cuts in enumerate(cuts):
        for m in range(M):
            s = W + m * steps
            if m >= len(row_cuts):
                mask[b, s : s + steps, s : s + steps] = np.eye(steps, dtype=bool)
                continue
            c = int(row_cuts[m])
            real[b, m] = True
            mask[b, s : s + steps, :c] = True
            mask[b, s : s + steps, s : s + steps] = below
            positions[b, s : s + steps] = c + np.arange(steps)
            source[b, m, 0] = c - 1
    return Packed(tokens, positions, mask, slots, source, real)


class PackedView:
    """A stand-in layer cache that stores nothing: per-slot rope positions and the mask.

    Passed as the ``cache`` of an mlx-lm model prepared by
    :func:`mlx_spec.attention.tree.prepare_tree_model`, it makes one forward
    read a :class:`Packed` layout; with gradients, as nothing is written.
    """

    def __init__(self, positions: mx.array, mask: mx.array):
        self.offset = rope_positions(positions)
        self._mask = mask[:, None]  # (B, 1, N, N): the same for every head

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        return keys, values

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        return self._mask


def packed_cache(model, positions: mx.array, mask: mx.array) -> List[PackedView]:
    """One :class:`PackedView` per layer of ``model`` (prepared for tree forwards)."""
    prepare_tree_model(model)
    view = PackedView(positions, mask)
    return [view] * len(model.layers)


def draft_rollout(
    draft,
    tokens: mx.array,
    layout: Tuple[mx.array, mx.array],
    slots: mx.array,
    source: mx.array,
    *,
    temp: float = 0.0,
    key: Optional[mx.array] = None,
) -> mx.array:
    """The branches written by the draft, one level per packed forward.

    Args:
        draft: A :class:`~mlx_spec.drafters.distilled.DistilledDraft`.
        tokens: ``(B, N)`` the packed ids (see :class:`Packed`).
        layout: ``(positions (B, N), mask (B, N, N))``.
        slots, source: ``(B, M, k)`` as in :class:`Packed`.
        temp: Sampling temperature of the draft's law (``0``: greedy).
        key: PRNG key of the draws when ``temp > 0``.

    Returns:
        ``(B, N)``: ``tokens`` with every branch slot written.
    """
    tokens = mx.array(tokens)  # the caller's array is left as it was
    cache = packed_cache(draft, *layout)
    rows = mx.arange(tokens.shape[0])[:, None]
    token_ids = draft.lm_head.token_ids
    steps = slots.shape[-1]
    keys = mx.random.split(key, steps) if temp > 0 else None
    for j in range(steps):
        # Slots of level j see only earlier levels: later ones do not change them.
        h = draft.hidden(tokens, cache=cache)[rows, source[..., j]]  # (B, M, H)
        logits = draft.lm_head.subset_logits(h)  # (B, M, k)
        if temp > 0:
            pick = mx.random.categorical(logits * (1.0 / temp), key=keys[j])
        else:
            pick = mx.argmax(logits, axis=-1)
        tokens[rows, slots[..., j]] = token_ids[pick].astype(tokens.dtype)
    return tokens


def target_laws_at(
    target,
    tokens: mx.array,
    layout: Tuple[mx.array, mx.array],
    rows: mx.array,
    top_k: int,
) -> Tuple[mx.array, mx.array, mx.array]:
    """The target's top-``top_k`` law and final hidden state at flat slots ``rows``.

    One forward of the target's body over the packed ``tokens`` ``(B, N)``;
    the output layer runs at the ``R`` rows only (flat index ``b * N + slot``).

    Returns:
        ``(ids (R, K) int32, logp (R, K) float16, features (R, H))``, as
        :func:`mlx_spec.train.completions.top_laws` orders them.
    """
    body = feature_owner(target)
    h = body(tokens, cache=packed_cache(target, *layout))  # (B, N, H) final normed
    h = h.reshape(-1, h.shape[-1])[rows]
    ids, logp = top_laws(feature_logits(target, h), top_k)
    return ids, logp, h
