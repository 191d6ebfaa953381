"""Acceptance for a batch of rows, each with its own draft length and law.

Row ``b`` of a round verifies ``drafts[b, :sizes[b]]`` against the target's
logprobs ``[b, :sizes[b] + 1]``; columns past a row's size are padding and
never accepted. The rules are those of :mod:`mlx_spec.acceptance` (greedy
matching, Leviathan et al. rejection sampling with the recovered and bonus
laws), applied to every row at once on device: nothing here syncs, so the
whole batch costs one host sync per round.
"""

from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from ..acceptance import accepted_prefix_length, residual_probs
from ..sampling import SamplingParams, processed_logprobs


def prefix_lengths(accept: mx.array, sizes: mx.array) -> mx.array:
    """Leading accepted run of each row, capped at its size.

    Args:
        accept: ``(B, K)`` bool, column ``i`` of row ``b`` accepted.
        sizes: ``(B,)`` int, drafts row ``b`` proposed (``<= K``).

    Returns:
        ``(B,)`` int32.
    """
    B, K = accept.shape
    if K == 0:
        return mx.zeros((B,), mx.int32)
    valid = accept & (mx.arange(K)[None, :] < sizes[:, None])
    return accepted_prefix_length(valid).astype(mx.int32)


def greedy_accept_rows(
    target_tokens: mx.array, drafts: mx.array, sizes: mx.array
) -> Tuple[mx.array, mx.array]:
    """Accept while the target's own token equals the draft, per row.

    Args:
        target_tokens: ``(B, W)`` the target's choice at each position.
        drafts: ``(B, W - 1)`` draft tokens (padded).
        sizes: ``(B,)`` draft tokens per row.

    Returns:
        ``(num_accepted, next_token)``, each ``(B,)``.
    """
    K = drafts.shape[1]
    n = prefix_lengths(drafts == target_tokens[:, :K], sizes)
    return n, mx.take_along_axis(target_tokens, n[:, None], axis=1)[:, 0]


def rejection_accept_rows(
    target_law: mx.array,
    drafts: mx.array,
    sizes: mx.array,
    draft_law: mx.array,
    uniforms: Optional[mx.array] = None,
) -> Tuple[mx.array, mx.array]:
    """Rejection sampling per row (each row as :func:`rejection_accept`).

    Draft ``d_i`` of row ``b`` is accepted with probability
    ``min(1, p_i(d_i) / q_i(d_i))``; after the first rejection at ``n`` the
    recovered token is drawn from ``normalize(max(0, p_n - q_n))``, and
    after ``sizes[b]`` acceptances the bonus token from ``p_{sizes[b]}``
    (there is no draft law there: ``q = 0``).

    Args:
        target_law: ``(B, W, V)`` processed target log-law.
        drafts: ``(B, K)`` draft tokens, ``K = W - 1`` (padded).
        sizes: ``(B,)`` draft tokens per row.
        draft_law: ``(B, K, V)`` log-law each draft token was drawn from
          (a point mass, ``0`` at the token and ``-inf`` elsewhere, for a
          deterministic proposal).
        uniforms: Optional ``(B, K)`` uniforms in [0, 1) (tests pass them).

    Returns:
        ``(num_accepted, next_token)``, each ``(B,)``.
    """
    B, W, V = target_law.shape
    K = drafts.shape[1]
    if K == 0:  # a plain round: every row samples its law (no residual to form)
        return mx.zeros((B,), mx.int32), mx.random.categorical(target_law[:, 0])
    index = drafts[..., None].astype(mx.int32)
    log_p = mx.take_along_axis(target_law[:, :K], index, axis=-1)[..., 0]
    log_q = mx.take_along_axis(draft_law, index, axis=-1)[..., 0]
    if uniforms is None:
        uniforms = mx.random.uniform(shape=(B, K))
    accept = uniforms < mx.minimum(mx.exp(log_p - log_q), 1.0)
    n = prefix_lengths(accept, sizes)
    at = mx.minimum(n, K - 1)[:, None, None]
    q_n = mx.exp(mx.take_along_axis(draft_law, at, axis=1)[:, 0])
    q_n = mx.where((n < sizes)[:, None], q_n, 0.0)
    p_n = mx.exp(mx.take_along_axis(target_law, n[:, None, None], axis=1)[:, 0])
    law = residual_probs(p_n, q_n)
    return n, mx.random.categorical(mx.log(law))


def point_mass_law(tokens: mx.array, vocab_size: int) -> mx.array:
    """Log-laws of point masses on ``tokens`` ``(B, K)``: ``(B, K, V)``."""
    hit = mx.arange(vocab_size)[None, None, :] == tokens[..., None]
    return mx.where(hit, 0.0, -mx.inf)


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
        law = processed_logprobs(logprobs, law_params)
        return mx.random.categorical(law), law
    tokens = mx.argmax(logprobs, axis=-1)
    laws = logprobs + 0.0  # a copy: rows are assigned below
    for law_params, rows in groups.items():
        if law_params is None:
            continue
        index = mx.array(rows)
        law = processed_logprobs(logprobs[index], law_params)
        tokens[index] = mx.random.categorical(law).astype(tokens.dtype)
        laws[index] = law
    return tokens, laws
