"""Training an EAGLE head: losses unrolled over its own draft steps.

A batch holds windows of teacher data (:mod:`mlx_spec.train.head_data`).
Step 1 is teacher forcing: the pair at ``q`` is ``(f_q, x_{q+1})`` and the
head output ``g¹_q`` should predict ``f_{q+1}`` and the target's law at
``q + 1``. Step ``s > 1`` reproduces what drafting sees (as in EAGLE-3's
training-time test): the pair at ``q`` is ``(g^{s-1}_{q-1}, x_{q+1})``, and
it attends to the step-1 entries of positions ``<= q - s + 1`` (the pairs
built from true features) and to the step-``k`` entries at ``q - s + k``
for ``k = 2..s`` (its own earlier drafts), exactly as the head's cache
holds them when it drafts ``s`` tokens ahead. So the loss of step ``s`` is
the loss of the ``s``-th draft token.

Loss per step: cross-entropy of the head's law over the draft vocabulary
against the target's (top-K) law, plus a smooth-L1 regression of ``g`` on
the next feature when the feature is the final hidden state; steps are
weighted ``STEP_DECAY**(s - 1)``.

The same unrolling trains heads of EAGLE-3's architecture (``--kind
eagle3``): their logits come from their own norm and output layer
(``logits_fn``), and they have no feature regression, as in SpecForge and
speculators, whose training-time test also feeds step ``s``'s outputs back
with the tokens shifted by one and weighs the steps ``0.8**(s - 1)``.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..features import FINAL
from .head_data import HeadData
from .rounds import TOP_RANKS

STEP_DECAY = 0.8
DEFAULT_TRAIN_STEPS = 3  # unrolled draft steps in training
DEFAULT_FEATURE_WEIGHT = 0.2


@dataclass
class Batch:
    """A padded batch of windows (device arrays).

    Attributes:
        features: ``(B, W, F)`` target features.
        tokens: ``(B, W)`` token ids.
        teacher_ids: ``(B, W, K)`` draft-vocabulary index of the teacher's
          top-K tokens at each position (``-1`` outside the draft vocabulary).
        teacher_p: ``(B, W, K)`` their probabilities.
        teacher_top: ``(B, W)`` the teacher's top token (target id).
        valid: ``(B, W)`` True where position ``t``'s law is supervised: over a
          completion token, or over a prompt token when prompts are weighted.
        valid_np: The same on the host (to gather the supervised rows).
        weight: ``(B, W)`` loss weight of each position (1 on completions).
    """

    features: mx.array
    tokens: mx.array
    teacher_ids: mx.array
    teacher_p: mx.array
    teacher_top: mx.array
    valid: mx.array
    valid_np: np.ndarray
    weight: mx.array


def make_batch(
    data: HeadData,
    index: Sequence[int],
    to_draft: np.ndarray,
    window: int,
    rng: np.random.Generator,
    prompt_weight: float = 0.0,
) -> Batch:
    """Crop one window per sequence in ``index`` and pad them to a batch.

    A sequence longer than the window keeps its end (the completion, where
    the loss mostly is) and a random amount of what precedes it. Positions
    whose next token is a prompt token weigh ``prompt_weight`` (``0``: not
    supervised).
    """
    width = min(window, max(len(data.tokens[i]) for i in index))
    B = len(index)
    F = data.features[index[0]].shape[1]
    K = data.teacher_ids[index[0]].shape[1]
    feats = np.zeros((B, width, F), np.float32)
    tokens = np.zeros((B, width), np.int32)
    ids = np.full((B, width, K), -1, np.int32)
    p = np.zeros((B, width, K), np.float32)
    top = np.full((B, width), -1, np.int32)
    weight = np.zeros((B, width), np.float32)
    for row, i in enumerate(index):
        n = len(data.tokens[i])
        start = data.starts[i]
        lo = 0
        if n > width:  # keep the end; shift by up to an eighth of the window
            lo = n - width - int(rng.integers(0, min(width // 8, n - width) + 1))
        hi = min(n, lo + width)
        L = hi - lo
        feats[row, :L] = data.features[i][lo:hi]
        tokens[row, :L] = data.tokens[i][lo:hi]
        t_ids = data.teacher_ids[i][lo:hi]
        ids[row, :L] = to_draft[t_ids]
        p[row, :L] = np.exp(data.teacher_logp[i][lo:hi].astype(np.float32))
        top[row, :L] = t_ids[:, 0]
        positions = np.arange(lo, hi)
        weight[row, :L] = np.where(positions >= start - 1, 1.0, prompt_weight)
        weight[row, L - 1] = 0.0  # its next token is outside the window
    valid = weight > 0
    return Batch(
        mx.array(feats),
        mx.array(tokens),
        mx.array(ids),
        mx.array(p),
        mx.array(top),
        mx.array(valid),
        valid,
        mx.array(weight),
    )


def unrolled_masks(length: int, steps: int) -> List[mx.array]:
    """Attention masks of the unrolled steps: ``steps`` arrays ``(Q, s * Q)``.

    Keys are ordered step 1 (all positions), step 2, ..., step ``s``.
    """
    q = np.arange(length)[:, None]
    p = np.arange(length)[None, :]
    masks = []
    for s in range(1, steps + 1):
        blocks = [p <= q - s + 1]
        blocks += [p == q - s + k for k in range(2, s + 1)]
        masks.append(mx.array(np.concatenate(blocks, axis=1)))
    return masks


def _cross_entropy(logits: mx.array, ids: mx.array, p: mx.array) -> mx.array:
    """``-sum_j p_j log q(ids_j)`` per position: logits ``(B, Q, k)``, ids/p ``(B, Q, K)``.

    Computed in float32 whatever the dtype of ``logits``.
    """
    logits = logits.astype(mx.float32)
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logq, mx.maximum(ids, 0), axis=-1)
    return -(mx.where(ids >= 0, p, 0.0) * picked).sum(-1)


LogitsFn = Callable[[mx.array], mx.array]


def frozen_rows(vocab_weight: mx.array) -> LogitsFn:
    """Draft logits through the target's frozen output rows ``(k, H)``."""
    return lambda g: g @ vocab_weight.T


def unrolled_outputs(
    head, embed_fn, logits_fn: Optional[LogitsFn], batch: Batch, steps: int
) -> List[Tuple[mx.array, mx.array]]:
    """Head outputs and draft logits of every unrolled step.

    Args:
        head: An EAGLE head (ours or EAGLE-3-shaped), with ``project`` and
          ``training_cache``.
        embed_fn: Token ids -> embeddings.
        logits_fn: Head outputs ``(..., H)`` -> draft logits ``(..., k)``, or ``None``.
        batch: The windows.
        steps: Unrolled draft steps.

    Returns:
        ``steps`` pairs ``(g (B, Q, H), logits (B, Q, k))`` for queries
        ``q = 0..W-2`` (logits ``None`` without ``logits_fn``).
    """
    B, W = batch.tokens.shape
    Q = W - 1
    emb = embed_fn(batch.tokens[:, 1:])
    positions = mx.broadcast_to(mx.arange(Q)[None], (B, Q))
    inputs = head.project(batch.features[:, :-1])
    cache = head.training_cache()  # keys of step 1, then 2, ...
    outs = []
    for mask in unrolled_masks(Q, steps):
        g, _ = head(inputs, emb, positions, mask, cache=cache)
        outs.append((g, None if logits_fn is None else logits_fn(g)))
        # The next step's input at q is this step's output at q - 1.
        inputs = mx.concatenate([mx.zeros_like(g[:, :1]), g[:, :-1]], axis=1)
    return outs


def supervised_rows(batch: Batch, step: int) -> mx.array:
    """Flat indices ``b * Q + q`` of the queries supervised at unrolled ``step``.

    Query ``q`` predicts the law at ``q + 1`` (a completion token there) and
    exists at step ``s`` once ``q >= s - 1``.
    """
    valid = batch.valid_np[:, 1:].copy()
    valid[:, : step - 1] = False
    return mx.array(np.flatnonzero(valid).astype(np.int32))


def eagle_loss(
    head,
    embed_fn,
    logits_fn: LogitsFn,
    batch: Batch,
    *,
    steps: int = DEFAULT_TRAIN_STEPS,
    feature_weight: float = DEFAULT_FEATURE_WEIGHT,
    final_feature: bool = True,
) -> Tuple[mx.array, mx.array]:
    """The weighted loss and per-step draft accuracies ``(steps,)``.

    Only supervised rows go through the output layer ``logits_fn`` (the
    prompt's do not).
    """
    outs = unrolled_outputs(head, embed_fn, None, batch, steps)
    H = outs[0][0].shape[-1]
    K = batch.teacher_ids.shape[-1]
    ids = batch.teacher_ids[:, 1:].reshape(-1, K)
    p = batch.teacher_p[:, 1:].reshape(-1, K)
    feats = batch.features[:, 1:].reshape(-1, batch.features.shape[-1])
    row_weight = batch.weight[:, 1:].reshape(-1)
    total, weights, accs = 0.0, 0.0, []
    for s, (g, _) in enumerate(outs, start=1):
        rows = supervised_rows(batch, s)
        count = max(int(rows.size), 1)
        w = row_weight[rows]
        norm = mx.maximum(w.sum(), 1e-6)
        g = g.reshape(-1, H)[rows]
        logits = logits_fn(g)
        loss = (w * _cross_entropy(logits, ids[rows], p[rows])).sum() / norm
        if final_feature and feature_weight > 0:
            reg = nn.losses.smooth_l1_loss(
                g.astype(mx.float32), feats[rows].astype(mx.float32), reduction="none"
            )
            loss = loss + feature_weight * (w * reg.mean(-1)).sum() / norm
        w = STEP_DECAY ** (s - 1)
        total = total + w * loss
        weights += w
        hit = logits.argmax(-1) == ids[rows][:, 0]
        accs.append(hit.sum() / count)
    return total / weights, mx.stack(accs)


def step_ranks(
    head, embed_fn, logits_fn: LogitsFn, batch: Batch, depth: int
) -> np.ndarray:
    """Rank of the target's token among each draft's candidates, from every round start.

    Draft ``s`` of a round whose last true pair is ``j`` is the unrolled
    step-``s`` output at ``q = j + s - 1``: what the head drafts there when
    drafts ``1..s-1`` were the target's tokens (see :mod:`.rounds`).

    Returns:
        ``(N, depth)`` int for each valid round start: the rank (0 = the
        head's argmax; ties go to the lower draft index, as ``argmax`` does)
        of the target's top token among step ``s``'s draft logits,
        ``TOP_RANKS`` past them or outside the draft vocabulary, ``-1`` past
        the supervised positions.
    """
    outs = unrolled_outputs(head, embed_fn, logits_fn, batch, depth)
    true = batch.teacher_ids[:, 1:, 0]  # (B, Q) draft index of the target's top token
    index = mx.arange(outs[0][1].shape[-1])
    ranks = []
    for _, logits in outs:
        t = mx.take_along_axis(logits, mx.maximum(true, 0)[..., None], axis=-1)
        ahead = (logits > t) | ((logits == t) & (index < true[..., None]))
        rank = mx.minimum(ahead.sum(-1), TOP_RANKS)
        ranks.append(mx.where(true >= 0, rank, TOP_RANKS))
    ranks = np.array(mx.stack(ranks, axis=-1)).astype(np.int64)  # (B, Q, depth)
    valid = np.array(batch.valid[:, 1:])
    B, Q, _ = ranks.shape
    rows = []
    for b in range(B):
        for j in range(Q):
            if not valid[b, j]:
                continue
            row = np.full(depth, -1, np.int64)
            for s in range(depth):
                q = j + s
                if q < Q and valid[b, q]:
                    row[s] = ranks[b, q, s]
            rows.append(row)
    return np.array(rows, np.int64).reshape(-1, depth)


def final_only(layers: Sequence[int]) -> bool:
    return list(layers) == [FINAL]
