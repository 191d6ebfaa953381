"""Teacher data for draft heads: the target's features and next-token laws.

Heads are trained by self-distillation on token sequences the target wrote
itself (prompt + its own completion). One teacher-forced forward of the
target per batch gives, at every position ``t``:

- the features the head reads (:mod:`mlx_spec.features`), stored as float16;
- the target's law of the next token, kept as its top ``K`` token ids and
  log-probabilities (the soft labels; ``K`` = 8 holds nearly all the mass of
  a chat model's next-token law).

Sequences are right-padded within a batch (causal attention makes padding
invisible to earlier positions), so the features equal those of the
target's forward in generation up to float rounding.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..features import FeatureCapture, maybe_capturing
from .completions import top_laws

DEFAULT_TEACHER_TOP_K = 8
DEFAULT_BATCH_TOKENS = 2048


@dataclass
class HeadData:
    """Per-sequence teacher data (all numpy, host memory).

    Attributes:
        tokens: ``(T_i,)`` int32 token ids of each sequence.
        starts: Index of each sequence's first completion token (the loss
          covers predictions of completion tokens only).
        features: ``(T_i, F)`` float16 target features.
        teacher_ids: ``(T_i, K)`` int32 top-K ids of the target's law at ``t``
          (over token ``t + 1``), best first.
        teacher_logp: ``(T_i, K)`` float16 their log-probabilities.
    """

    tokens: List[np.ndarray]
    starts: List[int]
    features: List[np.ndarray]
    teacher_ids: List[np.ndarray]
    teacher_logp: List[np.ndarray]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return int(sum(len(t) for t in self.tokens))

    def subset(self, index: Sequence[int]) -> "HeadData":
        return HeadData(
            [self.tokens[i] for i in index],
            [self.starts[i] for i in index],
            [self.features[i] for i in index],
            [self.teacher_ids[i] for i in index],
            [self.teacher_logp[i] for i in index],
        )

    def save(self, path):
        """One ``.npz`` file (sequences concatenated, with their lengths)."""
        lengths = np.array([len(t) for t in self.tokens], np.int64)
        np.savez(
            path,
            lengths=lengths,
            starts=np.array(self.starts, np.int64),
            tokens=np.concatenate(self.tokens),
            features=np.concatenate(self.features),
            teacher_ids=np.concatenate(self.teacher_ids),
            teacher_logp=np.concatenate(self.teacher_logp),
        )

    @classmethod
    def load(cls, path, features: bool = True) -> "HeadData":
        """A saved file; without ``features``, ``(T_i, 0)`` arrays stand for them."""
        data = np.load(path)
        cuts = np.cumsum(data["lengths"])[:-1]

        def split(name):
            return list(np.split(data[name], cuts))

        tokens = split("tokens")
        return cls(
            tokens,
            [int(s) for s in data["starts"]],
            (
                split("features")
                if features
                else [np.zeros((len(t), 0), np.float16) for t in tokens]
            ),
            split("teacher_ids"),
            split("teacher_logp"),
        )


def _batches(lengths: Sequence[int], batch_tokens: int) -> List[List[int]]:
    """Group sequence indices (sorted by length) into batches of about ``batch_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        longest = max([lengths[j] for j in current] + [lengths[i]])
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def teacher_data(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    starts: Sequence[int],
    *,
    feature_layers: Sequence[int] = (-1,),
    top_k: int = DEFAULT_TEACHER_TOP_K,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    progress: Optional[Callable[[int], None]] = None,
    laws: Optional[tuple] = None,
) -> HeadData:
    """Run the target over ``sequences`` and keep what a head learns from.

    Args:
        model: The target (an mlx-lm model).
        sequences: Token ids of each sequence (prompt then completion).
        starts: Index of each sequence's first completion token.
        feature_layers: The features to keep (see :mod:`mlx_spec.features`);
          none keeps ``(T_i, 0)`` arrays.
        top_k: Teacher ids and log-probabilities kept per position.
        batch_tokens: Padded tokens per target forward.
        progress: Called with the number of tokens done after each batch.
        laws: The target's laws at every position when already known
          (kept while generating the sequences): ``(ids, logp)``, per
          sequence ``(T_i, K)`` arrays. The pass then skips the output layer.

    Returns:
        The :class:`HeadData`, in the order of ``sequences``.
    """
    capture = FeatureCapture(model, feature_layers) if feature_layers else None
    n = len(sequences)
    out = [None] * n
    lengths = [len(s) for s in sequences]
    for batch in _batches(lengths, batch_tokens):
        width = max(lengths[i] for i in batch)
        ids = np.zeros((len(batch), width), np.int32)
        for row, i in enumerate(batch):
            ids[row, : lengths[i]] = sequences[i]
        if laws is not None:  # features only: the inner model, no output layer
            with maybe_capturing(capture):
                model.model(mx.array(ids))
            feats = np.array(_features(capture, ids.shape))
            for row, i in enumerate(batch):
                out[i] = (feats[row, : lengths[i]], laws[0][i], laws[1][i])
        else:
            with maybe_capturing(capture):
                logits = model(mx.array(ids))
            feats = _features(capture, ids.shape)
            top, values = top_laws(logits, top_k)
            mx.eval(feats, top, values)
            feats, top, values = np.array(feats), np.array(top), np.array(values)
            for row, i in enumerate(batch):
                L = lengths[i]
                out[i] = (feats[row, :L], top[row, :L], values[row, :L])
        if progress is not None:
            progress(sum(lengths[i] for i in batch))
        mx.clear_cache()
    return HeadData(
        [np.asarray(s, np.int32) for s in sequences],
        [int(s) for s in starts],
        [o[0] for o in out],
        [o[1] for o in out],
        [o[2] for o in out],
    )


def _features(capture: Optional[FeatureCapture], shape) -> mx.array:
    """The captured features ``(B, L, F)`` float16; ``(B, L, 0)`` without a capture."""
    if capture is None:
        return mx.zeros((*shape, 0), mx.float16)
    return capture.take(batched=True).astype(mx.float16)


def from_completions(data) -> HeadData:
    """The :class:`HeadData` of completions that kept their features and laws."""
    return HeadData(
        [np.asarray(t, np.int32) for t in data.tokens],
        list(data.starts),
        list(data.features),
        list(data.law_ids),
        list(data.law_logp),
    )


def token_counts(data: HeadData, vocab_size: int) -> np.ndarray:
    """How often each token is the target's top choice on completions ``(V,)``."""
    counts = np.zeros(vocab_size, np.int64)
    for ids, start in zip(data.teacher_ids, data.starts):
        np.add.at(counts, ids[max(start - 1, 0) :, 0], 1)
    return counts


def draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent ids, ascending (ties by lower id)."""
    order = np.lexsort((np.arange(len(counts)), -counts))[:size]
    return np.sort(order).astype(np.int32)


def token_rows(token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """Target id -> row of a draft vocabulary ``token_ids``: ``(vocab_size,)``, ``-1`` outside."""
    rows = np.full(vocab_size, -1, np.int32)
    rows[np.asarray(token_ids, np.int64)] = np.arange(len(token_ids), dtype=np.int32)
    return rows


def coverage(counts: np.ndarray, ids: np.ndarray) -> float:
    """Share of the counted top choices that ``ids`` contains."""
    total = counts.sum()
    return float(counts[ids].sum() / total) if total else 0.0
