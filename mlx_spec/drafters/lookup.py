"""``--speculative lookup``: propose continuations of n-grams already in the context.

The proposer matches the last ``n`` tokens of the context (prompt, accepted
output and earlier turns) against earlier occurrences in an
:class:`~mlx_spec.drafters.ngram.NGramIndex` and proposes what followed them:
a chain, or several continuations merged into one token tree.
"""

from typing import List, Sequence

import mlx.core as mx

from ..attention.tree import prepare_tree_model, tree_unsupported
from ..costs import VERIFY_SLOPE
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
# A drafted token costs about VERIFY_SLOPE of a step to verify, plus host work:
# a match whose first token is accepted less often than this is not proposed.
MIN_ACCEPTANCE = 2 * VERIFY_SLOPE
# First-token acceptance per match length starts at PRIOR over PRIOR_WEIGHT
# pseudo-rounds; older rounds fade by DECAY per round of that length.
PRIOR, PRIOR_WEIGHT, DECAY = 0.5, 1.0, 0.9
# A match length kept out is proposed again after this many skipped rounds.
PROBE_EVERY = 8
# Once its first token is accepted, a lookup draft's later tokens are accepted
# at about this rate (0.8-0.95 per position in the benchmarks' runs).
LATER_ACCEPTANCE = 0.85


class MatchRates:
    """First-token acceptance of lookup proposals, per match length ``n``.

    Short matches (a single repeated token) are often wrong; their drafts
    then cost verification width and earn nothing. :meth:`worth_proposing`
    keeps such lengths out, probing one now and then so a context that turns
    repetitive (an edit that starts copying) is noticed.
    """

    def __init__(self):
        # The first-token acceptance a match length needs (auto raises it
        # while lookup rounds earn less than its other choices).
        self.min_acceptance = MIN_ACCEPTANCE
        self.hits = {}  # n -> decayed accepted first tokens
        self.tries = {}  # n -> decayed proposals
        self.skipped = {}  # n -> rounds kept out since the last proposal

    def rate(self, n: int) -> float:
        hits, tries = self.hits.get(n, 0.0), self.tries.get(n, 0.0)
        return (hits + PRIOR * PRIOR_WEIGHT) / (tries + PRIOR_WEIGHT)

    def worth_proposing(self, n: int) -> bool:
        if self.rate(n) >= self.min_acceptance:
            return True
        self.skipped[n] = self.skipped.get(n, 0) + 1
        return self.skipped[n] % PROBE_EVERY == 0

    def worth_length(self, n: int) -> int:
        """Longest draft worth proposing for a match of length ``n``: its k-th
        token is reached with ``rate(n) * LATER_ACCEPTANCE ** (k - 1)``."""
        reach, length = self.rate(n) * LATER_ACCEPTANCE, 1
        while length < MAX_LEN_LIMIT and reach >= MIN_ACCEPTANCE:
            reach, length = reach * LATER_ACCEPTANCE, length + 1
        return length

    def observe(self, n: int, first_accepted: bool):
        self.hits[n] = DECAY * self.hits.get(n, 0.0) + float(first_accepted)
        self.tries[n] = DECAY * self.tries.get(n, 0.0) + 1.0
        self.skipped[n] = 0


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
        self.rates = MatchRates()
        self.match_len = 0  # the match length of the pending proposal
        self.verdict = None  # (context length, drafts?) from :meth:`will_draft`

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

    def will_draft(self, seq: List[int]) -> bool:
        """Whether the next round on ``seq`` drafts: a match worth proposing.

        The verdict is kept for that round's :meth:`propose` (and for another
        question about the same context), so a match kept out is counted once.
        """
        if self.verdict is not None and self.verdict[0] == len(seq):
            return self.verdict[1]
        self._catch_up(seq)
        found = self.index.propose(max_len=1, max_candidates=1)
        worthy = bool(found) and self.rates.worth_proposing(self.index.last_match_len)
        self.verdict = (len(seq), worthy)
        return worthy

    def plain_next(self, seq: List[int]) -> bool:
        """After a plain round on ``seq``: whether the next round is plain too,
        decided before its token is read (a match found then drafts a round later)."""
        return not self.will_draft(seq)

    def propose(self, state, gamma: int):
        """Propose up to ``gamma`` tokens (chain) or ``gamma`` tree nodes.

        Returns:
            Proposal: ``tokens`` ``(N,)`` with ``N <= gamma`` (``0`` when
            nothing matches), ``logprobs=None``, and ``parents`` for a tree
            that branches (``None`` for a chain).
        """
        self._catch_up(state.seq)
        self.match_len = 0
        if gamma < 1:
            self.verdict = None
            return Proposal(mx.array([], mx.uint32), None)
        worthy = self.will_draft(state.seq)
        self.verdict = None  # used up by this round
        if not worthy:
            return Proposal(mx.array([], mx.uint32), None)
        # A chain takes the engine's draft length; a tree's branches are capped.
        max_len = min(self.max_len if self.is_tree else MAX_LEN_LIMIT, gamma)
        cands = self.index.propose(max_len=max_len, max_candidates=self.max_candidates)
        n = self.index.last_match_len
        self.match_len = n
        # An uncertain match (few tries, or probed after failing) drafts less.
        max_len = min(max_len, self.rates.worth_length(n))
        cands = [extend_periodic(c[:max_len], max_len) for c in cands]
        if not self.is_tree:
            return Proposal(mx.array(cands[0], mx.uint32), None)
        tokens, parents = build_token_tree(cands, max_nodes=gamma)
        if all(p == i - 1 for i, p in enumerate(parents)):
            return Proposal(mx.array(tokens, mx.uint32), None)
        return Proposal(mx.array(tokens, mx.uint32), None, parents=parents)

    def commit(self, state, proposal, num_accepted: int, path=None):
        """Note whether the match's first token was accepted (nothing to rewind:
        accepted tokens reach the index via ``state.seq``)."""
        if proposal.size and self.match_len:
            self.rates.observe(self.match_len, num_accepted > 0)

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
