"""Rollouts: the draft's own tokens in its training context, as at inference.

Teacher forcing trains the draft only on prefixes the target wrote. At
inference, draft position ``i`` of a round reads the ``i - 1`` tokens the
draft itself proposed before it. A rollout step (``--rollout-steps k``) puts
such contexts in training, in the spirit of on-policy distillation
(DistillSpec, GKD) and of EAGLE-3's training-time test, cheaply:

1. each sequence of the step's batch is cut at a random completion position
   ``c`` (seeded by the step, so a resumed run cuts alike);
2. the draft writes ``k`` tokens after ``tokens[:c]`` from its own law
   (greedy, or sampled at ``--rollout-temp``), all rows at once: ``k``
   cache-free forwards of the draft over the padded batch;
3. the target scores ``tokens[:c]`` + rollout in one batched forward, and
   its top-K law is kept at the ``k`` positions that read rollout tokens
   (the output layer runs at those rows only);
4. the draft trains on those rows (soft labels: that law; hard label: its
   top token) next to the teacher-forced rows of the kept prefixes.

A rollout row's context holds 1 .. k draft tokens; it counts in the loss
like a completion row but not in ``tokens_seen`` nor in the step's accuracy.
"""

from typing import Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from ..features import feature_logits, feature_owner
from .completions import Completions, top_laws


def is_rollout_step(step: int, share: float) -> bool:
    """Whether optimizer step ``step`` (0-based) is a rollout step: an even ``share`` of steps."""
    return int((step + 1) * share) > int(step * share)


def rollout_cuts(
    starts: Sequence[int],
    lengths: Sequence[int],
    steps: int,
    max_length: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Where each sequence's rollout starts: ``(B,)`` int, ``-1`` for none.

    A cut ``c`` keeps ``tokens[:c]`` (the whole prompt, part of the
    completion) and needs room for ``steps`` tokens: ``start <= c < n`` and
    ``c + steps <= max_length``.
    """
    cuts = np.full(len(starts), -1, np.int64)
    for b, (start, n) in enumerate(zip(starts, lengths)):
        last = min(n - 1, max_length - steps)  # the latest cut allowed
        if start >= 1 and last >= start:
            cuts[b] = rng.integers(start, last + 1)
    return cuts


def cut_view(data: Completions, index: Sequence[int], cuts: np.ndarray) -> Completions:
    """The sequences ``index`` cut at ``cuts`` (``-1``: kept whole), with their laws and features."""
    view = data.subset(index)
    for b, c in enumerate(cuts):
        if c < 0:
            continue
        view.tokens[b] = view.tokens[b][:c]
        view.law_ids[b] = view.law_ids[b][:c]
        view.law_logp[b] = view.law_logp[b][:c]
        if view.features is not None:
            view.features[b] = view.features[b][:c]
    return view


def draft_rollout(
    draft,
    tokens: mx.array,
    cuts: mx.array,
    steps: int,
    *,
    temp: float = 0.0,
    key: Optional[mx.array] = None,
) -> mx.array:
    """The draft's ``steps`` tokens written after each row's cut.

    Args:
        draft: A :class:`~mlx_spec.drafters.distilled.DistilledDraft`.
        tokens: ``(B, W)`` token ids; row ``b`` holds its prefix in
          ``[:cuts[b]]`` and room for the rollout after it (``W >= cut + steps``).
        cuts: ``(B,)`` int: each row's cut (``>= 1``).
        steps: Tokens the draft writes per row.
        temp: Sampling temperature of the draft's law (``0``: greedy).
        key: PRNG key of the draws when ``temp > 0``.

    Returns:
        ``(B, W)``: ``tokens`` with ``[cut, cut + steps)`` holding the draft's tokens.
    """
    tokens = mx.array(tokens)  # the caller's array is left as it was
    rows = mx.arange(tokens.shape[0])
    token_ids = draft.lm_head.token_ids
    keys = mx.random.split(key, steps) if temp > 0 else None
    for j in range(steps):
        # Causal attention: what follows position cut - 1 + j does not change it.
        h = draft.hidden(tokens)[rows, cuts - 1 + j]  # (B, H)
        logits = draft.lm_head.subset_logits(h)  # (B, k)
        if temp > 0:
            pick = mx.random.categorical(logits * (1.0 / temp), key=keys[j])
        else:
            pick = mx.argmax(logits, axis=-1)
        tokens[rows, cuts + j] = token_ids[pick].astype(tokens.dtype)
    return tokens


def target_laws_at(
    target, tokens: mx.array, rows: mx.array, top_k: int
) -> Tuple[mx.array, mx.array, mx.array]:
    """The target's top-``top_k`` law and final hidden state at flat positions ``rows``.

    One batched forward of the target's body over ``tokens`` ``(B, W)``; the
    output layer runs at the ``R`` rows only (flat index ``b * W + t``).

    Returns:
        ``(ids (R, K) int32, logp (R, K) float16, features (R, H))``, as
        :func:`mlx_spec.train.completions.top_laws` orders them.
    """
    h = feature_owner(target)(tokens)  # (B, W, H): the final normed hidden state
    h = h.reshape(-1, h.shape[-1])[rows]
    ids, logp = top_laws(feature_logits(target, h), top_k)
    return ids, logp, h
