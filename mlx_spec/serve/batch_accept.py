"""A batch's rows by law: each group of rows that share a sampling law is
accepted (:meth:`mlx_spec.verify.Law.accept_rows`) and drafted
(:meth:`~mlx_spec.verify.Law.draft_choice`) by the single-sequence rules, on
every row of the group at once; the helpers here only arrange the rows.

Row ``b`` of a round verifies ``drafts[b, :sizes[b]]`` against the target's
logprobs ``[b, :sizes[b] + 1]``; columns past a row's size are padding and
never accepted. Nothing here syncs, so the whole batch costs one host sync
per round.
"""

from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from ..sampling import SamplingParams
from ..verify import Law


def emitted_tokens(drafts: mx.array, n: mx.array, next_token: mx.array) -> mx.array:
    """``(B, W)``: accepted drafts, then the next token (later columns repeat it)."""
    B, K = drafts.shape
    padded = mx.concatenate([drafts, mx.zeros((B, 1), drafts.dtype)], axis=1)
    cols = mx.arange(K + 1)[None, :]
    return mx.where(cols < n[:, None], padded, next_token[:, None].astype(drafts.dtype))


def gather_logprobs(logprobs: mx.array, tokens: mx.array) -> mx.array:
    """``logprobs[b, i, tokens[b, i]]``: ``(B, W, V), (B, W) -> (B, W)``."""
    index = tokens[..., None].astype(mx.int32)
    return mx.take_along_axis(logprobs, index, axis=-1)[..., 0]


def law_groups(
    params: Sequence[Optional[SamplingParams]],
) -> "OrderedDict[Optional[SamplingParams], List[int]]":
    """Rows grouped by law, greedy rows under ``None``, in first-seen order."""
    groups: "OrderedDict[Optional[SamplingParams], List[int]]" = OrderedDict()
    for i, p in enumerate(params):
        key = None if p is None or p.greedy else p
        groups.setdefault(key, []).append(i)
    return groups


def sample_rows(
    logprobs: mx.array, params: Sequence[Optional[SamplingParams]]
) -> Tuple[mx.array, Optional[mx.array]]:
    """One token per row from its own law (argmax for greedy rows).

    Args:
        logprobs: ``(R, V)`` normalised log-probabilities.
        params: Each row's law (``None`` or greedy: argmax).

    Returns:
        ``(tokens (R,), laws)``: ``laws`` ``(R, V)`` holds each sampled row's
        processed log-law (greedy rows: their logprobs, unused), ``None``
        when every row is greedy.
    """
    groups = law_groups(params)
    if list(groups) == [None]:
        return mx.argmax(logprobs, axis=-1), None
    if len(groups) == 1:
        (law_params,) = groups
        return Law(law_params).draft_choice(logprobs)
    tokens = mx.argmax(logprobs, axis=-1)
    laws = logprobs + 0.0  # a copy: rows are assigned below
    for law_params, rows in groups.items():
        if law_params is None:
            continue
        index = mx.array(rows)
        token, law = Law(law_params).draft_choice(logprobs[index])
        tokens[index] = token.astype(tokens.dtype)
        laws[index] = law
    return tokens, laws
