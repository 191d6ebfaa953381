"""Training Medusa heads, and the ranks their held-out acceptance is read from.

Head ``k`` reads the target's final feature ``f_q`` (which chose token
``x_{q+1}``) and should predict ``x_{q+1+k}``: its loss is the
cross-entropy against the target's own law at position ``q + k``
(self-distillation, as Medusa-2 does), over the draft vocabulary.
"""

from typing import Tuple

import mlx.core as mx
import numpy as np

from .eagle import Batch, _cross_entropy
from .rounds import TOP_RANKS


def head_logits(heads, vocab_weight: mx.array, features: mx.array) -> mx.array:
    """``(B, W, H)`` features -> ``(B, W, K, k)`` draft logits of every head."""
    return heads(features) @ vocab_weight.T


def medusa_loss(
    heads, vocab_weight: mx.array, batch: Batch
) -> Tuple[mx.array, mx.array]:
    """Mean cross-entropy over heads and per-head top-1 accuracy ``(K,)``.

    Only supervised rows go through the heads and the output layer.
    """
    B, W = batch.tokens.shape
    H = batch.features.shape[-1]
    K_teacher = batch.teacher_ids.shape[-1]
    feats = batch.features.reshape(-1, H)
    ids = batch.teacher_ids.reshape(-1, K_teacher)
    p = batch.teacher_p.reshape(-1, K_teacher)
    row_weight = batch.weight.reshape(-1)
    valid = batch.valid_np
    num_heads = len(heads.heads)
    # Rows whose feature is read by at least one supervised head.
    q = np.zeros_like(valid)
    for k in range(1, num_heads + 1):
        q[:, : W - k] |= valid[:, k:]
    rows = np.flatnonzero(q)
    hidden = heads(feats[mx.array(rows.astype(np.int32))])  # (N, K, H)
    position = {r: i for i, r in enumerate(rows.tolist())}
    total, accs = 0.0, []
    for k in range(1, num_heads + 1):
        sup = np.zeros_like(valid)
        sup[:, : W - k] = valid[:, k:]
        src = np.flatnonzero(sup)
        count = max(src.size, 1)
        at = mx.array(np.array([position[r] for r in src.tolist()], np.int32))
        dst = mx.array((src + k).astype(np.int32))  # the teacher's row q + k
        logits = hidden[at, k - 1] @ vocab_weight.T
        w = row_weight[dst]
        loss = (w * _cross_entropy(logits, ids[dst], p[dst])).sum()
        total = total + loss / mx.maximum(w.sum(), 1e-6)
        accs.append((logits.argmax(-1) == ids[dst][:, 0]).sum() / count)
    return total / num_heads, mx.stack(accs)


def rank_hits(heads, vocab_weight, draft_ids: mx.array, batch: Batch) -> np.ndarray:
    """Per valid round start ``j``: the rank of the target's token in each head's list.

    Returns:
        ``(N, K)`` int: rank (0 = best) of the target's top token at ``j + k``
        among head ``k``'s candidates, ``TOP_RANKS`` if not in its top
        ``TOP_RANKS``, ``-1`` where ``j + k`` is outside the window.
    """
    logits = head_logits(heads, vocab_weight, batch.features)
    order = mx.argsort(-logits, axis=-1)[..., :TOP_RANKS]
    cands = np.array(draft_ids[order])  # (B, W, K, R) target ids
    top = np.array(batch.teacher_top)
    valid = np.array(batch.valid)
    B, W, K, R = cands.shape
    rows = []
    for b in range(B):
        for j in range(W):
            if not valid[b, j]:
                continue
            ranks = []
            for k in range(1, K + 1):
                if j + k >= W or not valid[b, j + k]:
                    ranks.append(-1)
                    continue
                where = np.nonzero(cands[b, j, k - 1] == top[b, j + k])[0]
                ranks.append(int(where[0]) if where.size else R)
            rows.append(ranks)
    return np.array(rows, np.int64).reshape(-1, K)
