"""Batches of a draft model's training (:mod:`.draft`): padded sequences and the
positions they supervise, from target-written completions (:mod:`.completions`).

Sequences are padded to a multiple of ``LENGTH_STEP`` and supervised rows to a
multiple of ``ROW_STEP``, so that few shapes are compiled.
"""

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from .completions import Completions

LENGTH_STEP = 64  # sequences are padded to a multiple of this (few compiled shapes)
ROW_STEP = 256  # supervised rows are padded to a multiple of this


@dataclass
class Batch:
    """A padded batch of sequences and its supervised positions (numpy until :meth:`arrays`).

    Positions whose next token is a completion token are supervised, and
    with prompt laws (and ``prompt_weight > 0``) prompt positions too, with
    that weight. They are gathered (``rows``) before the output layer.
    ``R`` is padded to a multiple of :data:`ROW_STEP` with weight-0 rows,
    for few compiled shapes. Completion rows come first in each sequence.

    Attributes:
        tokens: ``(B, T)`` input token ids.
        rows: ``(R,)`` flat index ``b * T + t`` of each supervised position.
        soft_ids: ``(R, K)`` draft index of the teacher's top-K tokens for
          the next token (``-1``: outside the draft vocabulary); ``K = 0``
          for completions without laws.
        soft_p: ``(R, K)`` their probabilities.
        hard: ``(R,)`` draft index of the next token (``-1``: outside).
        weight: ``(R,)`` loss weight: 1 for completion rows, ``prompt_weight``
          for prompt rows, 0 for padding.
        completion: ``(R,)`` 1.0 for completion rows (what accuracy counts).
        target: ``(R,)`` the next token's target id.
        counts: Completion rows of each sequence, in order.
        features: ``(R, H)`` the target's final hidden state at each row, or
          ``None`` (no feature loss).
        positions: ``(B, T)`` rope positions of a packed batch with rollout
          branches (:class:`mlx_spec.train.rollout.Packed`), else ``None``.
        mask: ``(B, T, T)`` bool: which slots each slot attends to (packed only).
    """

    tokens: np.ndarray
    rows: np.ndarray
    soft_ids: np.ndarray
    soft_p: np.ndarray
    hard: np.ndarray
    weight: np.ndarray
    completion: np.ndarray
    target: np.ndarray
    counts: List[int]
    features: Optional[np.ndarray] = None
    positions: Optional[np.ndarray] = None
    mask: Optional[np.ndarray] = None

    def arrays(self):
        names = ("tokens", "rows", "soft_ids", "soft_p", "hard", "weight", "completion")
        out = tuple(mx.array(getattr(self, n)) for n in names)
        return out if self.features is None else (*out, mx.array(self.features))

    def layout(self) -> Optional[Tuple[mx.array, mx.array]]:
        """``(positions, mask)`` of a packed batch, else ``None`` (plain causal rows)."""
        if self.positions is None:
            return None
        return mx.array(self.positions), mx.array(self.mask)


def plan_batches(
    lengths: Sequence[int], batch_tokens: int, max_length: int
) -> List[List[int]]:
    """Sequence indices grouped by padded length into batches of ``<= batch_tokens``."""
    padded = [padded_length(n, max_length) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (padded[i], i))
    batches, current = [], []
    for i in order:
        width = padded[i]
        if current and (
            padded[current[0]] != width or width * (len(current) + 1) > batch_tokens
        ):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded_length(n: int, max_length: int) -> int:
    n = min(n, max_length)
    return min(-(-n // LENGTH_STEP) * LENGTH_STEP, max_length)


def make_batch(
    data: Completions,
    index: Sequence[int],
    to_draft: np.ndarray,
    max_length: int,
    prompt_weight: float = 0.0,
    features: bool = False,
) -> Batch:
    """Pad the sequences ``index`` into a :class:`Batch` (see its fields).

    ``features``: also gather the target's features of the rows.
    """
    width = max(padded_length(len(data.tokens[i]), max_length) for i in index)
    K = data.law_ids[index[0]].shape[1]
    use_prompts = prompt_weight > 0
    tokens = np.zeros((len(index), width), np.int32)
    parts = {"rows": [], "ids": [], "logp": [], "next": [], "weight": [], "done": []}
    parts["features"] = []
    counts = []

    def add(rows, ids, logp, nxt, weight, done, i, lo):
        values = (rows, ids, logp, nxt, weight, done)
        for key, value in zip(parts, values):
            parts[key].append(value)
        if features:
            parts["features"].append(data.features[i][lo : lo + len(rows)])

    for b, i in enumerate(index):
        seq = data.tokens[i][:max_length]
        n, start = len(seq), data.starts[i]
        tokens[b, :n] = seq
        count = max(n - start, 0)
        counts.append(count)
        if count:
            # Position p predicts token p + 1, which is completion token p + 1 - start.
            ones = np.ones(count, np.float32)
            add(
                b * width + np.arange(start - 1, n - 1),
                data.law_ids[i][start - 1 : n - 1],
                data.law_logp[i][start - 1 : n - 1],
                seq[start:n],
                ones,
                ones,
                i,
                start - 1,
            )
        m = min(start, n) - 1  # prompt positions 0 .. m - 1 predict prompt tokens
        if use_prompts and m > 0:
            add(
                b * width + np.arange(m),
                data.law_ids[i][:m],
                data.law_logp[i][:m],
                seq[1 : m + 1],
                np.full(m, prompt_weight, np.float32),
                np.zeros(m, np.float32),
                i,
                0,
            )
    real = sum(len(r) for r in parts["rows"])
    R = max(-(-real // ROW_STEP) * ROW_STEP, ROW_STEP)
    flat = np.zeros(R, np.int32)
    soft_ids = np.full((R, K), -1, np.int32)
    soft_p = np.zeros((R, K), np.float32)
    target = np.full(R, -1, np.int32)
    weight = np.zeros(R, np.float32)
    completion = np.zeros(R, np.float32)
    if real:
        flat[:real] = np.concatenate(parts["rows"])
        soft_ids[:real] = to_draft[np.concatenate(parts["ids"])]
        soft_p[:real] = np.exp(np.concatenate(parts["logp"]).astype(np.float32))
        target[:real] = np.concatenate(parts["next"])
        weight[:real] = np.concatenate(parts["weight"])
        completion[:real] = np.concatenate(parts["done"])
    hard = np.where(target >= 0, to_draft[np.maximum(target, 0)], -1).astype(np.int32)
    feats = None
    if features:
        feats = np.zeros((R, data.features[index[0]].shape[1]), np.float32)
        if real:
            feats[:real] = np.concatenate(parts["features"])
    return Batch(
        tokens, flat, soft_ids, soft_p, hard, weight, completion, target, counts, feats
    )


def append_rows(
    batch: Batch,
    rows: np.ndarray,
    soft_ids: np.ndarray,
    soft_p: np.ndarray,
    target: np.ndarray,
    to_draft: np.ndarray,
    features: Optional[np.ndarray] = None,
) -> Batch:
    """``batch`` with ``E`` more supervised rows of weight 1 (not counted as completion rows).

    Args:
        rows: ``(E,)`` flat index ``b * T + t`` of each row.
        soft_ids: ``(E, K)`` target ids of the teacher's top-K at each row.
        soft_p: ``(E, K)`` their probabilities.
        target: ``(E,)`` the hard label's target id.
        to_draft: ``(V,)`` draft index of each target id (``-1``: outside).
        features: ``(E, H)`` the target's final hidden state at each row
          (when ``batch`` has features).
    """
    real = int((batch.target >= 0).sum())  # real rows come first, padding after
    extra = len(rows)
    R = max(-(-(real + extra) // ROW_STEP) * ROW_STEP, ROW_STEP)

    def grow(old, new, fill):
        out = np.full((R, *old.shape[1:]), fill, old.dtype)
        out[:real] = old[:real]
        out[real : real + extra] = new
        return out

    hard = np.where(target >= 0, to_draft[np.maximum(target, 0)], -1)
    feats = None
    if batch.features is not None:
        feats = grow(batch.features, features, 0.0)
    return replace(
        batch,
        rows=grow(batch.rows, rows, 0),
        soft_ids=grow(batch.soft_ids, to_draft[soft_ids], -1),
        soft_p=grow(batch.soft_p, soft_p, 0.0),
        hard=grow(batch.hard, hard, -1),
        weight=grow(batch.weight, np.ones(extra, np.float32), 0.0),
        completion=grow(batch.completion, np.zeros(extra, np.float32), 0.0),
        target=grow(batch.target, target, -1),
        features=feats,
    )
