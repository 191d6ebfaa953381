"""``--speculative lookup``: propose continuations of n-grams already in the context.

The proposer matches the last ``n`` tokens of the context (prompt, accepted
output and earlier turns) against earlier occurrences in an
:class:`~mlx_spec.drafters.ngram.NGramIndex` and proposes what followed them:
a chain, or several continuations merged into one token tree.
"""

from typing import List, Sequence

import mlx.core as mx

from ..attention.tree import prepare_tree_model, tree_unsupported
from .base import Proposal, check_no_drafter_cache
from .ngram import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_OCCURRENCES,
    DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN,
    MAX_CANDIDATES_LIMIT,
    MAX_LEN_LIMIT,
    NGramIndex,
    build_token_tree,
    check_int,
    extend_periodic,
)

DEFAULT_LOOKUP_DRAFT_TOKENS = 8


class LookupDrafter:
    """Prompt lookup as a drafter: no model, no cache.

    Each round the index is extended with the tokens accepted since the last
    round (read from ``state.seq``; never rescanned) and proposes the
    continuation of the longest, most recent n-gram match (a continuation
    that reaches the end of the context is extended periodically, see
    :func:`extend_periodic`). Proposals are
    point masses (``Proposal.logprobs is None``), which the engine's
    acceptance handles exactly. With no match the proposal is empty and the
    round is a plain target step.

    Args:
        ngram_min, ngram_max: n-gram lengths to match, longest first.
        max_candidates: Continuations per round. ``1`` proposes a chain;
          more are merged by :func:`build_token_tree` into one token tree.
        max_len: Longest continuation in tree mode (a chain takes the
          engine's draft length). Default: ``8``.
    """

    name = "lookup"
    note = None  # set when trees fall back to chains

    def __init__(
        self,
        *,
        ngram_min: int = DEFAULT_NGRAM_MIN,
        ngram_max: int = DEFAULT_NGRAM_MAX,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        max_len: int = DEFAULT_LOOKUP_DRAFT_TOKENS,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ):
        check_int("max_candidates", max_candidates, 1, MAX_CANDIDATES_LIMIT)
        check_int("max_len", max_len, 1, MAX_LEN_LIMIT)
        self.index = NGramIndex(
            ngram_min=ngram_min, ngram_max=ngram_max, max_occurrences=max_occurrences
        )
        self.max_candidates = max_candidates
        self.max_len = max_len
        self.is_tree = max_candidates > 1
        self.history = 0  # tokens indexed from before this call
        self.step_cost = 0.0  # host-side n-gram matching; no forward

    def chain_only(self):
        """Propose chains only (logits processors need one history per position)."""
        self.max_candidates = 1
        self.is_tree = False

    def prefill(self, tokens, step_size: int):
        """Nothing to do: the index reads the prompt from the first round's state."""

    def add_history(self, tokens: Sequence[int]):
        """Index tokens from before this call (earlier turns in the cache)."""
        self.index.extend(tokens)
        self.history = len(tokens)

    def _catch_up(self, seq: List[int]):
        # seq only grows within a call, so the new tokens are its tail.
        seen = len(self.index) - self.history
        if len(seq) > seen:
            self.index.extend(seq[seen:])

    def propose(self, state, gamma: int):
        """Propose up to ``gamma`` tokens (chain) or ``gamma`` tree nodes.

        Returns:
            Proposal: ``tokens`` ``(N,)`` with ``N <= gamma`` (``0`` when
            nothing matches), ``logprobs=None``, and ``parents`` for a tree
            that branches (``None`` for a chain).
        """
        self._catch_up(state.seq)
        if gamma < 1:
            return Proposal(mx.array([], mx.uint32), None)
        if not self.is_tree:
            max_len = min(gamma, MAX_LEN_LIMIT)
            cands = self.index.propose(max_len=max_len, max_candidates=1)
            chain = extend_periodic(cands[0], max_len) if cands else []
            return Proposal(mx.array(chain, mx.uint32), None)
        max_len = min(self.max_len, gamma)
        cands = self.index.propose(max_len=max_len, max_candidates=self.max_candidates)
        cands = [extend_periodic(c, max_len) for c in cands]
        tokens, parents = build_token_tree(cands, max_nodes=gamma)
        if all(p == i - 1 for i, p in enumerate(parents)):
            return Proposal(mx.array(tokens, mx.uint32), None)
        return Proposal(mx.array(tokens, mx.uint32), None, parents=parents)

    def commit(self, state, proposal, num_accepted: int, path=None):
        """Nothing to rewind: accepted tokens reach the index via ``state.seq``."""

    def caches(self) -> List:
        return []

    def sync(self, seq: List[int], base: int):
        """No cache to bring up to date."""


def make_lookup_drafter(
    config, target, draft_model, cache, kv, vocab_size
) -> LookupDrafter:
    """Drafter factory for ``--speculative lookup`` (see ``registry.FACTORIES``).

    Uses ``config.ngram_min``/``ngram_max``; ``config.lookup_candidates > 1``
    proposes token trees of up to ``config.tree_budget`` nodes (the target is
    prepared for tree attention). A draft model, if given, is not used.
    """
    check_no_drafter_cache(cache, "lookup")
    candidates = getattr(config, "lookup_candidates", DEFAULT_MAX_CANDIDATES)
    reason = None
    if candidates > 1:
        reason = tree_unsupported(target.model, target.cache)
        if reason is None:
            prepare_tree_model(target.model)
    drafter = LookupDrafter(
        ngram_min=config.ngram_min,
        ngram_max=config.ngram_max,
        max_candidates=candidates,
        max_len=max(config.num_draft_tokens, 1),
    )
    if reason is not None:  # one match per round, verified as a chain
        drafter.chain_only()
        drafter.note = f"lookup trees verified as chains ({reason.rstrip('.')})"
    return drafter
