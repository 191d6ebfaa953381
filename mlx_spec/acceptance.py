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


def acceptance_probability(
    draft_tokens: mx.array, target_logprobs: mx.array, draft_logprobs: mx.array
) -> mx.array:
    """``min(1, p_i(d_i) / q_i(d_i))`` for each draft token.

    Args:
        draft_tokens: ``(..., γ)``.
        target_logprobs: ``(..., γ', V)`` with ``γ' >= γ`` (the first γ rows count).
        draft_logprobs: ``(..., γ, V)``.

    Returns:
        ``(..., γ)``.
    """
    gamma = draft_tokens.shape[-1]
    index = draft_tokens[..., None].astype(mx.int32)
    log_p = mx.take_along_axis(target_logprobs[..., :gamma, :], index, axis=-1)
    log_q = mx.take_along_axis(draft_logprobs, index, axis=-1)
    return mx.minimum(mx.exp(log_p[..., 0] - log_q[..., 0]), 1.0)


def recovered_law(
    target_logprobs: mx.array,
    draft_logprobs: mx.array,
    num_accepted: mx.array,
    sizes: Optional[mx.array] = None,
) -> mx.array:
    """The law of the token emitted after ``num_accepted`` acceptances.

    ``normalize(max(0, p_n - q_n))`` after a rejection at position n, and
    ``p_n`` (the bonus law) when all of a row's drafts were accepted.

    Args:
        target_logprobs: ``(..., γ + 1, V)``.
        draft_logprobs: ``(..., γ, V)``.
        num_accepted: ``(...)``.
        sizes: Optional ``(...)`` drafts per row; default ``γ``.

    Returns:
        ``(..., V)`` probabilities.
    """
    # The bonus position has no draft law: q = 0 there, so the residual is p.
    no_draft = mx.full(
        draft_logprobs.shape[:-2] + (1, target_logprobs.shape[-1]), -mx.inf
    )
    log_q_rows = mx.concatenate([draft_logprobs, no_draft], axis=-2)
    at = num_accepted[..., None, None]
    p_n = mx.exp(mx.take_along_axis(target_logprobs, at, axis=-2)[..., 0, :])
    q_n = mx.exp(mx.take_along_axis(log_q_rows, at, axis=-2)[..., 0, :])
    if sizes is not None:  # a row's own bonus position, before the padding
        q_n = mx.where((num_accepted < sizes)[..., None], q_n, 0.0)
    return residual_probs(p_n, q_n)


def rejection_accept(
    draft_tokens: mx.array,
    target_logprobs: mx.array,
    draft_logprobs: Optional[mx.array],
    uniforms: Optional[mx.array] = None,
    sizes: Optional[mx.array] = None,
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
        target_logprobs: Processed target law, shape ``(..., γ + 1, V)``.
        draft_logprobs: Processed draft law, shape ``(..., γ, V)``; ``None`` for
          deterministic proposals (prompt lookup), i.e. point masses.
        uniforms: Optional ``(..., γ)`` uniforms in [0, 1) (tests pass them).
        sizes: Optional ``(...)`` drafts per row (columns past a row's size
          are padding, never accepted). Default: ``γ``.

    Returns:
        ``(num_accepted, next_token)``, each ``(...)``.
    """
    gamma = draft_tokens.shape[-1]
    if gamma == 0:  # a plain step: sample the law (no residual to form)
        rows = draft_tokens.shape[:-1]
        law = target_logprobs[..., 0, :]
        return mx.zeros(rows, mx.int32), mx.random.categorical(law)
    if draft_logprobs is None:
        draft_logprobs = one_hot_logprobs(draft_tokens, target_logprobs.shape[-1])
    if uniforms is None:
        uniforms = mx.random.uniform(shape=draft_tokens.shape)
    accept = uniforms < acceptance_probability(
        draft_tokens, target_logprobs, draft_logprobs
    )
    num_accepted = accepted_prefix_length(accept, sizes)
    law = recovered_law(target_logprobs, draft_logprobs, num_accepted, sizes)
    return num_accepted, mx.random.categorical(mx.log(law))


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
