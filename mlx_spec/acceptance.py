"""Accepting draft tokens: small pure functions, computed on device.

Vocabulary (as in vLLM's rejection sampler): a round's output is the
*accepted* draft tokens followed by one target token, which is either the
*recovered* token (drawn after a rejection) or the *bonus* token (drawn
when every draft token was accepted).

Every function returns ``(num_accepted, next_token)`` on device, so the
caller syncs once per round. The chain rules take leading row axes: the
single-sequence engine calls them on one row, continuous batching on every
row of a round at once (each row with its own draft length ``sizes``).
"""

from typing import Optional, Tuple

import mlx.core as mx


def accepted_prefix_length(
    match: mx.array, sizes: Optional[mx.array] = None
) -> mx.array:
    """Length of the leading run of ``True`` in ``match``, capped at ``sizes``.

    Args:
        match: ``(..., γ)`` bool, position ``i`` accepted.
        sizes: Optional ``(...)`` int, positions each row proposed (``<= γ``;
          later columns are padding). Default: all ``γ``.

    Returns:
        ``(...)`` int32.
    """
    gamma = match.shape[-1]
    if gamma == 0:
        return mx.zeros(match.shape[:-1], mx.int32)
    if sizes is not None:
        match = match & (mx.arange(gamma) < sizes[..., None])
    return mx.sum(mx.cumprod(match.astype(mx.int32), axis=-1), axis=-1)


def match_accept(
    draft_tokens: mx.array,
    target_tokens: mx.array,
    sizes: Optional[mx.array] = None,
) -> Tuple[mx.array, mx.array]:
    """Accept while the target's own choice equals the draft token.

    With ``target_tokens`` the target's argmax this is exact greedy
    decoding; with independent samples from the target's sampler it is the
    (exact, but weak) sample-and-match rule mlx-lm uses.

    Args:
        draft_tokens: Draft proposals, shape ``(..., γ)``.
        target_tokens: The target's choice at each position, ``(..., γ + 1)``.
        sizes: Optional ``(...)`` drafts per row (see
          :func:`accepted_prefix_length`).

    Returns:
        ``(num_accepted, next_token)``, each ``(...)``.
    """
    gamma = draft_tokens.shape[-1]
    match = draft_tokens == target_tokens[..., :gamma]
    num_accepted = accepted_prefix_length(match, sizes)
    index = num_accepted[..., None]
    return num_accepted, mx.take_along_axis(target_tokens, index, axis=-1)[..., 0]


def greedy_accept(
    draft_tokens: mx.array, target_logits: mx.array
) -> Tuple[mx.array, mx.array]:
    """Greedy acceptance: ``target_logits`` has shape ``(..., γ + 1, V)``."""
    return match_accept(draft_tokens, mx.argmax(target_logits, axis=-1))


def one_hot_logprobs(tokens: mx.array, vocab_size: int) -> mx.array:
    """Log-probabilities of point masses on ``tokens`` ``(...)``: ``(..., V)``."""
    hit = mx.arange(vocab_size) == tokens[..., None]
    return mx.where(hit, 0.0, -mx.inf)


def residual_probs(p: mx.array, q: mx.array) -> mx.array:
    """``normalize(max(0, p - q))`` per row; rows where it vanishes fall back to p."""
    residual = mx.maximum(p - q, 0.0)
    total = residual.sum(axis=-1, keepdims=True)
    return mx.where(total > 0, residual / mx.maximum(total, 1e-30), p)


def draw_from_probs(probs: mx.array, uniforms: Optional[mx.array] = None) -> mx.array:
    """One token per row of ``probs`` ``(..., V)`` by inverse transform sampling.

    One uniform and a cumulative sum per row, where ``mx.random.categorical``
    would draw V Gumbel variates (and need the log of ``probs``). A token of
    zero probability is never drawn.

    Args:
        probs: ``(..., V)`` non-negative, each row with positive mass
          (normalised or not).
        uniforms: Optional ``(...)`` uniforms in [0, 1) (tests pass them).

    Returns:
        ``(...)`` int32 token ids.
    """
    if uniforms is None:
        uniforms = mx.random.uniform(shape=probs.shape[:-1])
    cdf = mx.cumsum(probs, axis=-1)
    total = cdf[..., -1:]
    # Strictly below the total, even where u * total rounds up to it.
    below = mx.minimum(uniforms[..., None] * total, total * (1.0 - 2.0**-23))
    return mx.argmax(cdf > below, axis=-1).astype(mx.int32)


def acceptance_probability(
    draft_tokens: mx.array,
    target_logprobs: mx.array,
    draft_logprobs: Optional[mx.array],
    draft_columns: Optional[mx.array] = None,
) -> mx.array:
    """``min(1, p_i(d_i) / q_i(d_i))`` for each draft token.

    Args:
        draft_tokens: ``(..., γ)``.
        target_logprobs: ``(..., γ', V)`` with ``γ' >= γ`` (the first γ rows
          count), normalised or not (any per-row shift: each row is
          normalised here).
        draft_logprobs: ``(..., γ, V)``, or ``(..., γ, C)`` over ``draft_columns``;
          ``None`` for point masses (``q_i(d_i) = 1``).
        draft_columns: Optional ``(C,)`` distinct target ids of the columns of
          ``draft_logprobs`` (the draft's law is zero elsewhere).

    Returns:
        ``(..., γ)``.
    """
    gamma = draft_tokens.shape[-1]
    index = draft_tokens[..., None].astype(mx.int32)
    rows = target_logprobs[..., :gamma, :]
    log_p = mx.take_along_axis(rows, index, axis=-1)[..., 0]
    log_p = log_p - mx.logsumexp(rows, axis=-1)
    if draft_logprobs is not None:
        if draft_columns is not None:  # each draft's column in the subset
            index = mx.argmax(index == draft_columns, axis=-1, keepdims=True)
        log_p = log_p - mx.take_along_axis(draft_logprobs, index, axis=-1)[..., 0]
    return mx.minimum(mx.exp(log_p), 1.0)


def _draft_probs_at(
    draft_logprobs: Optional[mx.array],
    draft_tokens: Optional[mx.array],
    num_accepted: mx.array,
    vocab_size: int,
    sizes: Optional[mx.array],
    draft_columns: Optional[mx.array] = None,
) -> mx.array:
    """The draft's law ``q_n`` ``(..., V)`` at position ``n = num_accepted``
    (``γ >= 1``): zero at a row's bonus position (nothing was drafted there),
    a point mass on ``d_n`` when ``draft_logprobs`` is ``None``. A law over
    ``draft_columns`` is exponentiated on them only, then placed at full width."""
    if draft_logprobs is None:
        gamma = draft_tokens.shape[-1]
        at = mx.minimum(num_accepted, gamma - 1)[..., None]
        token = mx.take_along_axis(draft_tokens.astype(mx.int32), at, axis=-1)
        q_n = mx.arange(vocab_size) == token
    else:
        gamma = draft_logprobs.shape[-2]
        at = mx.minimum(num_accepted, gamma - 1)[..., None, None]
        q_n = mx.exp(mx.take_along_axis(draft_logprobs, at, axis=-2)[..., 0, :])
        if draft_columns is not None:
            columns = mx.broadcast_to(draft_columns.astype(mx.int32), q_n.shape)
            zeros = mx.zeros((*q_n.shape[:-1], vocab_size), q_n.dtype)
            q_n = mx.put_along_axis(zeros, columns, q_n, axis=-1)
    drafted = num_accepted < (gamma if sizes is None else sizes)
    return mx.where(drafted[..., None], q_n, 0.0)


def recovered_law(
    target_logprobs: mx.array,
    draft_logprobs: Optional[mx.array],
    num_accepted: mx.array,
    sizes: Optional[mx.array] = None,
    draft_tokens: Optional[mx.array] = None,
    draft_columns: Optional[mx.array] = None,
) -> mx.array:
    """The law of the token emitted after ``num_accepted`` acceptances.

    ``normalize(max(0, p_n - q_n))`` after a rejection at position n, and
    ``p_n`` (the bonus law) when all of a row's drafts were accepted. Only
    row n of either law is exponentiated.

    Args:
        target_logprobs: ``(..., γ + 1, V)``, normalised or not (row n is
          normalised here).
        draft_logprobs: ``(..., γ, V)``, or ``(..., γ, C)`` over
          ``draft_columns``; ``None`` for point masses on ``draft_tokens``.
        num_accepted: ``(...)``.
        sizes: Optional ``(...)`` drafts per row; default ``γ``.
        draft_tokens: ``(..., γ)``, needed only for point masses.
        draft_columns: Optional ``(C,)`` distinct target ids of the columns of
          ``draft_logprobs``.

    Returns:
        ``(..., V)`` probabilities.
    """
    at = num_accepted[..., None, None]
    p_n = mx.softmax(mx.take_along_axis(target_logprobs, at, axis=-2)[..., 0, :], -1)
    if draft_logprobs is None:
        gamma = draft_tokens.shape[-1]
    else:
        gamma = draft_logprobs.shape[-2]
    if gamma == 0:  # nothing was drafted: the bonus law
        q_n = mx.zeros_like(p_n)
    else:
        q_n = _draft_probs_at(
            draft_logprobs,
            draft_tokens,
            num_accepted,
            p_n.shape[-1],
            sizes,
            draft_columns,
        )
    return residual_probs(p_n, q_n)


def rejection_accept(
    draft_tokens: mx.array,
    target_logprobs: mx.array,
    draft_logprobs: Optional[mx.array],
    uniforms: Optional[mx.array] = None,
    sizes: Optional[mx.array] = None,
    draft_columns: Optional[mx.array] = None,
) -> Tuple[mx.array, mx.array]:
    """Leviathan et al. rejection sampling over a chain of draft tokens.

    Draft token ``d_i`` is accepted with probability
    ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the recovered
    token is drawn from ``normalize(max(0, p_i - q_i))``, and if all are
    accepted the bonus token is drawn from ``p_γ``. Every emitted token
    then follows the target's law exactly. Leading axes are rows (a batch),
    each with its own draft length ``sizes``; one row without them is the
    single-sequence engine's round.

    Args:
        draft_tokens: Proposals, shape ``(..., γ)``, drawn from ``draft_logprobs``.
        target_logprobs: Processed target law, shape ``(..., γ + 1, V)``, as
          logprobs or as logits (any per-row shift): a row is normalised
          only where it is read (the drafted rows' normalisers, and row n).
        draft_logprobs: Processed draft law, shape ``(..., γ, V)``; ``None`` for
          deterministic proposals (prompt lookup), i.e. point masses.
        uniforms: Optional ``(..., γ)`` uniforms in [0, 1) (tests pass them).
        sizes: Optional ``(...)`` drafts per row (columns past a row's size
          are padding, never accepted). Default: ``γ``.
        draft_columns: Optional ``(C,)`` distinct target ids: ``draft_logprobs``
          is then ``(..., γ, C)``, the draft's law on these tokens (zero
          elsewhere), which saves widening it to V.

    Returns:
        ``(num_accepted, next_token)``, each ``(...)``.
    """
    gamma = draft_tokens.shape[-1]
    if gamma == 0:  # a plain step: sample the law (no residual to form)
        rows = draft_tokens.shape[:-1]
        law = target_logprobs[..., 0, :]
        return mx.zeros(rows, mx.int32), mx.random.categorical(law)
    if uniforms is None:
        uniforms = mx.random.uniform(shape=draft_tokens.shape)
    accept = uniforms < acceptance_probability(
        draft_tokens, target_logprobs, draft_logprobs, draft_columns
    )
    num_accepted = accepted_prefix_length(accept, sizes)
    law = recovered_law(
        target_logprobs,
        draft_logprobs,
        num_accepted,
        sizes,
        draft_tokens,
        draft_columns,
    )
    return num_accepted, draw_from_probs(law)


def tree_accept(
    tokens: mx.array,
    parents: mx.array,
    depth: mx.array,
    ancestor_mask: mx.array,
    target_choices: mx.array,
) -> Tuple[mx.array, mx.array, mx.array]:
    """Accept the deepest root-to-node path that the target's choices follow.

    Node 0 is the root (the last accepted token); node ``i`` is accepted when
    its token equals the target's choice at its parent and its parent is
    accepted. With argmax choices this is greedy decoding. With one
    independent sample of the target's law per node it is exact sampling
    for any children chosen without looking at the target (top-k of a
    draft, static shapes, n-gram lookup): the emitted token at every step is
    the target's own sample at the current node. This is recursive rejection
    sampling with point-mass proposals, where accepting sibling ``c`` given
    that earlier siblings were rejected has probability ``p(c) / (1 - sum of
    rejected p)``, i.e. "the target's sample is ``c``".

    Args:
        tokens: ``(N,)`` node tokens, node 0 the root.
        parents: ``(N,)`` parent indices, ``-1`` for the root.
        depth: ``(N,)`` depths (root 0).
        ancestor_mask: ``(N, N)`` bool, ancestor-or-self.
        target_choices: ``(N,)`` the target's token at each node.

    Returns:
        ``(deepest, num_accepted, next_token)``: the deepest accepted node,
        its depth (= accepted draft tokens) and the token emitted after it.
    """
    parent_choice = target_choices[mx.maximum(parents, 0)]
    mismatch = (tokens != parent_choice) & (parents >= 0)
    accepted = ~(ancestor_mask & mismatch[None, :]).any(axis=1)
    deepest = mx.argmax(mx.where(accepted, depth, -1))
    return deepest, depth[deepest], target_choices[deepest]
