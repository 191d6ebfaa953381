"""``--speculative lookup``: propose continuations of n-grams already in the context.

The proposer matches the last ``n`` tokens of the context (prompt, accepted
output and earlier turns) against earlier occurrences in an
:class:`~mlx_spec.drafters.ngram.NGramIndex` and proposes what followed them:
a chain, or several continuations merged into one token tree.
"""

from typing import List, Sequence, Tuple

import mlx.core as mx

from ..adaptive import expected_tokens
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
# Acceptance of a match's first drafted token by its length n (1, 2, 3 or
# more), and of each later token once the one before it was accepted: the
# prior of each estimate, measured on a distillation corpus's training split
# (greedy, first 96 tokens: 0.21, 0.52, 0.83 and 0.55, 0.66, 0.88). A fresh
# 1-token match seldom continues in prose; a 3-token one usually does.
FIRST_PRIOR = (0.2, 0.5, 0.8)
LATER_PRIOR = (0.55, 0.65, 0.85)
# Each prior counts as PRIOR_WEIGHT rounds that never fade (a Beta posterior's
# mean); the rounds of a match length fade by DECAY per round of that length.
PRIOR_WEIGHT, DECAY = 1.0, 0.9
# A match length kept out is proposed again after this many skipped rounds.
PROBE_EVERY = 8


class MatchRates:
    """Acceptance of lookup proposals by match length ``n``, and what pays.

    Each match length keeps Beta posteriors of its first token's acceptance
    and of each later token's given the one before (deeper ones lean on the
    depth above as much as on their prior). A match is proposed at the draft
    length that maximises its expected tokens over the round's cost
    (``costs``, by tokens drafted) when that rate beats ``bar``, the best
    other choice's (a plain round's in the fixed cost model, unless ``auto``
    sets both from what it measured). Lengths kept out are probed now and
    then, so a context that turns repetitive (an edit that starts copying)
    is noticed.
    """

    def __init__(self, max_len: int = 2 * DEFAULT_LOOKUP_DRAFT_TOKENS):
        # Round costs for 0..max_len drafted tokens, and the rate to beat.
        self.costs = [1.0 + VERIFY_SLOPE * g for g in range(max_len + 1)]
        self.bar = 1.0
        self.hits = {}  # n -> decayed accepted first tokens
        self.tries = {}  # n -> decayed proposals
        self.later = {}  # n -> [decayed accepted, reached] per depth 2, 3, ...
        self.skipped = {}  # n -> rounds kept out since the last proposal

    @staticmethod
    def _prior(table, n: int) -> float:
        return table[min(max(n, 1), len(table)) - 1]

    def rate(self, n: int) -> float:
        """Estimated acceptance of a length-``n`` match's first token."""
        hits, tries = self.hits.get(n, 0.0), self.tries.get(n, 0.0)
        prior = self._prior(FIRST_PRIOR, n)
        return (hits + prior * PRIOR_WEIGHT) / (tries + PRIOR_WEIGHT)

    def acceptance(self, n: int, length: int) -> List[float]:
        """``(length,)`` conditional acceptance by depth of a length-``n`` match."""
        out = [self.rate(n)]
        prior = self._prior(LATER_PRIOR, n)
        stats = self.later.get(n, [])
        for k in range(length - 1):
            hits, reached = stats[k] if k < len(stats) else (0.0, 0.0)
            prior = (hits + prior * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def best_length(self, n: int) -> Tuple[int, float]:
        """The draft length in ``[1, len(costs) - 1]`` with the most expected
        tokens per unit of cost for a length-``n`` match, and that rate."""
        tokens = expected_tokens(self.acceptance(n, len(self.costs) - 1))
        best, best_rate = 1, -1.0
        for g in range(1, len(self.costs)):
            rate = tokens[g] / max(self.costs[g], 1e-12)
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = g, rate
        return best, best_rate

    def worth_proposing(self, n: int) -> bool:
        if self.best_length(n)[1] > self.bar * (1 + 1e-9):
            return True
        self.skipped[n] = self.skipped.get(n, 0) + 1
        return self.skipped[n] % PROBE_EVERY == 0

    def worth_length(self, n: int) -> int:
        """The draft length worth proposing for a match of length ``n``."""
        return self.best_length(n)[0]

    def observe(self, n: int, accepted: int, drafted: int = 1):
        """Note a proposal of a length-``n`` match: ``accepted`` of its
        ``drafted`` tokens were accepted (a bool: whether its first was)."""
        accepted = int(accepted)
        self.hits[n] = DECAY * self.hits.get(n, 0.0) + float(accepted > 0)
        self.tries[n] = DECAY * self.tries.get(n, 0.0) + 1.0
        stats = self.later.setdefault(n, [])
        while len(stats) < drafted - 1:
            stats.append((0.0, 0.0))
        for k, (hits, reached) in enumerate(stats):
            depth = k + 2  # reached once the depth above was accepted
            seen = depth <= drafted and accepted >= depth - 1
            hit = float(seen and accepted >= depth)
            stats[k] = (DECAY * hits + hit, DECAY * reached + float(seen))
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
        self.chain_len = 0  # its longest candidate (a chain: its length)
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
        # As long as it pays for this match length (an uncertain one drafts less).
        max_len = min(max_len, self.rates.worth_length(n))
        self.chain_len = max_len
        cands = [extend_periodic(c[:max_len], max_len) for c in cands]
        if not self.is_tree:
            return Proposal(mx.array(cands[0], mx.uint32), None)
        tokens, parents = build_token_tree(cands, max_nodes=gamma)
        if all(p == i - 1 for i, p in enumerate(parents)):
            return Proposal(mx.array(tokens, mx.uint32), None)
        return Proposal(mx.array(tokens, mx.uint32), None, parents=parents)

    def commit(self, state, proposal, num_accepted: int, path=None):
        """Note how much of the match was accepted (nothing to rewind:
        accepted tokens reach the index via ``state.seq``)."""
        if proposal.size and self.match_len:
            drafted = min(proposal.size, self.chain_len)  # a tree: its depth
            self.rates.observe(self.match_len, num_accepted, drafted)

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
