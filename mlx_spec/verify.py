"""Verification: the target scores a round's proposal in one forward and
accepts on device.

Output vocabulary (as in vLLM): the emitted tokens of a round are the
*accepted* draft tokens followed by one *recovered* token (the target's own,
after a rejection) or one *bonus* token (after every draft was accepted).
Nothing here syncs with the host: each verifier returns one packed int array
for the round's single sync and a ``decode`` that reads it as a
:class:`RoundResult`.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import mlx.core as mx

from .acceptance import match_accept, rejection_accept, tree_accept
from .attention.tree import Tree, tree_forward
from .drafters.base import Proposal
from .sampling import (
    SamplingParams,
    filter_input,
    law_of_logits,
    normalize,
    sampling_logits,
)

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
ACCEPTED, RECOVERED, BONUS, TARGET = "accepted", "recovered", "bonus", "target"


def token_kind(index: int, accepted: int, drafted: int, bonus: bool) -> str:
    """What the ``index``-th token a round emits is: an accepted draft, the
    recovered or bonus token after ``drafted`` drafts (``bonus``: none was
    rejected), or a plain step's ``target`` token."""
    if index < accepted:
        return ACCEPTED
    if drafted == 0:
        return TARGET
    return BONUS if bonus else RECOVERED


class Law:
    """How tokens are chosen: greedy, exact rejection sampling, or sample-and-match.

    Exact rejection sampling needs the sampler's law; an opaque ``sampler``
    callable falls back to sample-and-match, which is also exact. Neither
    (``Law(None)``) is greedy.
    """

    def __init__(
        self, params: Optional[SamplingParams], sampler: Optional[Callable] = None
    ):
        self.params = params
        self.sampler = sampler
        if params is None and sampler is None or params is not None and params.greedy:
            self.mode = "greedy"
        elif params is not None:
            self.mode = "rejection"
        else:
            self.mode = "match"

    def draft_choice(self, logits: mx.array) -> Tuple[mx.array, Optional[mx.array]]:
        """Pick a draft token per row of ``logits`` ``(R, V)`` (or logprobs: any
        per-row shift); return them ``(R,)`` and their law ``(R, V)`` (``None``
        unless rejection sampling needs it)."""
        if self.mode == "greedy":
            return mx.argmax(logits, axis=-1), None
        if self.mode == "rejection":
            law = law_of_logits(logits, self.params)
            return mx.random.categorical(law), law
        return self.sampler(normalize(logits)), None

    def node_choices(self, target_logits: mx.array) -> mx.array:
        """The target's own token at each row ``(N, V) -> (N,)``: argmax or a
        sample. ``target_logits`` may be logits or logprobs (any per-row shift)."""
        if self.mode == "greedy":
            return mx.argmax(target_logits, axis=-1)
        if self.mode == "match":
            return self.sampler(normalize(target_logits))
        return mx.random.categorical(self._draw_logits(target_logits))

    def _draw_logits(self, target_logits: mx.array) -> mx.array:
        """What ``make_sampler`` draws from, without normalising more than it does."""
        return sampling_logits(filter_input(target_logits, self.params), self.params)

    def accept(self, proposal: Proposal, target_logits: mx.array):
        """Return ``(num_accepted, next_token)`` on device.

        Args:
            proposal: The round's draft tokens ``(γ,)`` and their law.
            target_logits: The target's logits ``(γ + 1, V)``, or its logprobs
              (any per-row shift).
        """
        if self.mode == "match":
            target_logprobs = normalize(target_logits)
            return match_accept(proposal.tokens, self.sampler(target_logprobs))
        return self.accept_rows(
            proposal.tokens, target_logits, proposal.logprobs, columns=proposal.columns
        )

    def accept_rows(
        self,
        drafts: mx.array,
        target_logprobs: mx.array,
        draft_logprobs: Optional[mx.array] = None,
        sizes: Optional[mx.array] = None,
        columns: Optional[mx.array] = None,
    ) -> Tuple[mx.array, mx.array]:
        """``(num_accepted, next_token)`` of rows that share this law (greedy or
        rejection sampling), on device; one row is the single-sequence round.

        Each row of the target's law is normalised at most once (top-p also
        reads probabilities), only where acceptance reads it, and a plain step
        (``γ = 0``) draws as ``make_sampler`` does, unnormalised.

        Args:
            drafts: ``(..., γ)`` draft tokens.
            target_logprobs: ``(..., γ + 1, V)`` the target's logprobs, or its
              logits (any per-row shift).
            draft_logprobs: ``(..., γ, V)`` the law each draft was drawn from
              (``None``: point masses, a deterministic proposal).
            sizes: Optional ``(...)`` drafts per row (the rest is padding).
            columns: Optional ``(C,)`` target ids of ``draft_logprobs``'s
              columns, a law over a vocabulary subset ``(..., γ, C)``.
        """
        if self.mode == "greedy":
            return match_accept(drafts, mx.argmax(target_logprobs, axis=-1), sizes)
        if self.mode == "match":
            raise ValueError("sample-and-match accepts one proposal: use Law.accept")
        if drafts.shape[-1] == 0:  # a plain step: a (1, V) row, as mlx_lm draws
            row = self._draw_logits(target_logprobs[..., :1, :])
            token = mx.random.categorical(row)[..., 0]
            return mx.zeros(drafts.shape[:-1], mx.int32), token
        law = self._draw_logits(target_logprobs)  # rows normalised where read
        return rejection_accept(
            drafts, law, draft_logprobs, sizes=sizes, draft_columns=columns
        )


def process_logits(
    logits: mx.array, history: Optional[mx.array], processors: List[LogitsProcessor]
) -> mx.array:
    """Apply logits processors row by row (each row has its own history)."""
    if not processors:
        return normalize(logits)
    rows = []
    for i in range(logits.shape[0]):
        row = logits[i : i + 1]
        for processor in processors:
            row = processor(history[: history.shape[0] - logits.shape[0] + 1 + i], row)
        rows.append(row)
    return normalize(mx.concatenate(rows, axis=0))


@dataclass
class RoundResult:
    """What the host learns from a round's sync.

    Attributes:
        num_accepted: Accepted draft tokens.
        path: Accepted proposal nodes, in order (chain: ``0..n-1``).
        emitted: Accepted tokens followed by the recovered or bonus token.
        rows: Row of the target's logprobs that predicted each emitted token.
        rejected: Draft tokens the recovered token replaced (for display).
        bonus: Whether the last token is a bonus (nothing left to reject).
    """

    num_accepted: int
    path: List[int]
    emitted: List[int]
    rows: List[int]
    rejected: List[int]
    bonus: bool


def verify_chain(target, root, proposal, law, processors, history):
    """Score ``[root, d_1..d_γ]`` in one target forward and accept on device.

    Returns ``(packed, scores, decode)``: the round's ints for its sync, the
    target's processed logits ``(γ + 1, V)`` (unnormalised: see
    :func:`emitted_logprobs`) and the reader of the synced ints.
    """
    logits = target(mx.concatenate([root, proposal.tokens]))
    scores = logits
    if processors:
        verify_history = mx.concatenate([history, proposal.tokens])
        scores = process_logits(logits, verify_history, processors)
    num_accepted, next_token = law.accept(proposal, scores)
    packed = mx.concatenate(
        [
            num_accepted.reshape(1).astype(mx.uint32),
            next_token.reshape(1).astype(mx.uint32),
            proposal.tokens.astype(mx.uint32),
        ]
    )
    gamma = proposal.size

    def decode(values) -> RoundResult:
        n, token, drafts = values[0], values[1], values[2:]
        return RoundResult(
            n,
            list(range(n)),
            drafts[:n] + [token],
            list(range(n + 1)),
            drafts[n:],
            n == gamma,
        )

    return packed, scores, decode


def verify_tree(target, root, proposal, law):
    """Score the root and a draft tree in one tree-attention forward."""
    draft_tree = getattr(proposal, "tree", None)  # reuse the drafter's mask
    if draft_tree is None:
        draft_tree = Tree.from_parents(
            proposal.tokens.astype(mx.uint32), proposal.parents
        )
    tree = draft_tree.with_root(root)
    scores = tree_forward(target.model, target.cache, tree)
    choices = law.node_choices(scores)
    deepest, num_accepted, next_token = tree_accept(
        tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, choices
    )
    packed = mx.concatenate(
        [
            mx.stack([deepest, num_accepted, next_token]).astype(mx.int32),
            tree.tokens.astype(mx.int32),
            tree.parents,
        ]
    )
    size = tree.size

    def decode(values) -> RoundResult:
        deepest, n, token = values[:3]
        tokens, parents = values[3 : 3 + size], values[3 + size :]
        nodes = []
        node = deepest
        while node > 0:
            nodes.append(node)
            node = parents[node]
        nodes.reverse()
        children = [tokens[i] for i in range(size) if parents[i] == deepest]
        return RoundResult(
            n,
            [v - 1 for v in nodes],
            [tokens[v] for v in nodes] + [token],
            [0] + nodes,
            children,
            not children,
        )

    return packed, scores, decode


def emitted_logprobs(scores: mx.array, rows: List[int]) -> mx.array:
    """The target's logprobs ``(len(rows), V)`` of the emitted tokens' rows of
    ``scores`` ``(N, V)``: only the rows a round emits are normalised."""
    return normalize(scores[mx.array(rows)])
