"""Planning a continuous-batching round: each row's arm and draft length,
then the round's width for the whole batch.

A row's γ comes from its arm's controller, the single-sequence engine's
(:func:`mlx_spec.planner.chain_controller`), priced for its batch: by the
batch's measured round times, fitted as the single-sequence engine fits
its own (:class:`~mlx_spec.costs.MeasuredCosts`), or by the fixed model
where a seeded sampled batch must not depend on the clock. The
width, from :func:`mlx_spec.planner.batch_width` over every row's
acceptance; whether a lookup match is worth proposing, from the row's
:class:`~mlx_spec.drafters.lookup.MatchRates` as single-sequence lookup and
``auto`` decide it. What is the batch's own: a row of ``auto`` without such
a match drafts with the draft model (alone, ``auto`` also weighs a plain
round and its other arms), whether the draft-model rows sit a round out,
and a periodic round that measures drafts left unverified.
"""

from typing import List, Optional, Tuple

from ..costs import MeasuredCosts, fixed_batch_price
from ..distributed import from_rank0, sharded_group
from ..drafters.ngram import extend_periodic
from ..planner import batch_width, round_rate
from .index import CrossRequestIndex
from .rows import Row

# After this many rounds in a row that left drafts on offer unverified (a
# plain round, or draft-model rows sitting out), every row drafts two tokens,
# so the acceptance estimates keep being measured.
EXPLORE_EVERY = 16


class RowPlanner:
    """Plans each round of a batch's rows (see the module docstring).

    Args:
        draft_step_cost: One draft-model step, in 1-token target forwards.
        index: The cross-request index lookup rows also match against.
        timed: Price rounds by their measured wall time (else the fixed model).
    """

    def __init__(
        self,
        draft_step_cost: float,
        index: Optional[CrossRequestIndex],
        timed: bool = True,
    ):
        self.draft_step_cost = draft_step_cost
        self.index = index
        self.idle = 0  # plain rounds in a row that had drafts on offer
        self.timed = timed
        self.costs = MeasuredCosts({"draft": draft_step_cost, "lookup": 0.0})
        # (arm, steps, rows, width, draft_rows) -> a round's cost.
        self.price = (
            self.costs.batch_round_time if timed else fixed_batch_price(draft_step_cost)
        )
        self.group = sharded_group()  # sharded: every rank prices with rank 0's times

    def observe(self, rows: int, steps: int, width: int, read: int, seconds: float):
        """Record a round of ``rows`` rows verifying ``width`` tokens each after
        ``steps`` draft forwards that read ``read`` tokens in all."""
        if not self.timed:
            return
        seconds = from_rank0(seconds, self.group)
        arm = ("draft" if steps else "lookup") if width > 1 else None
        caught_up = max(read - steps, 0)
        self.costs.observe(arm, steps, rows * width, seconds, caught_up)

    def plan(self, seqs: List[Row], draft_batch: int) -> int:
        """Choose each row's arm and drafts for this round; return the draft steps.

        Each row picks its arm, then its own draft length ``γ`` from that
        arm's controller (:func:`mlx_spec.planner.chain_controller`, as in the
        single-sequence engine, priced for this batch size); a row with a
        lookup match can verify up to its match's length. The round's width ``K <= max γ`` is then chosen for the whole batch
        (:func:`mlx_spec.planner.batch_width`): every row pays for the
        widest one, and the draft-model rows may sit the round out
        (:meth:`width`). Rows verify up to ``K`` drafts (columns the batch
        computes anyway): a lookup row the rest of its match, a draft-model
        row the drafts the batched draft steps make.
        """
        for s in seqs:
            s.arm, s.size, s.proposal, s.from_index = None, 0, [], False
            s.cap, s.batch = 0, len(seqs)
            limit = s.config.max_tokens - s.generated - 1
            if s.spec.method == "none" or limit < 1:
                continue
            cap = min(s.config.max_draft_tokens, limit)
            if s.spec.method in ("lookup", "auto"):
                proposal, match, from_index = self._lookup(s, cap)
                # The single-sequence lookup's rule: a match length whose
                # first token is seldom accepted is kept out (probed now and
                # then), and an uncertain one drafts less.
                if proposal and s.rates.worth_proposing(match):
                    s.proposal = proposal[: s.rates.worth_length(match)]
                    s.match, s.from_index = match, from_index
                    row_size(s, "lookup", len(s.proposal))
                    continue
                if s.spec.method == "lookup" or not s.uses_draft:
                    continue
            row_size(s, "draft", cap)
        widest = max((s.size for s in seqs), default=0)
        width, sit_out = self.width(seqs, widest, draft_batch)
        fixed = [s.size for s in seqs if s.arm and not s.config.adaptive]
        width = max([width] + fixed)  # fixed draft lengths are kept
        self.idle = self.idle + 1 if widest and (sit_out or not width) else 0
        if self.idle >= EXPLORE_EVERY:
            width, sit_out, self.idle = min(widest, 2), False, 0
        for s in seqs:
            if s.arm is not None and (width == 0 or sit_out and s.arm == "draft"):
                s.controller(s.arm).rest()
                s.arm = None
            s.size = min(width, s.cap) if s.arm is not None else 0
            s.proposal = s.proposal[: s.size]
        draft_rows = sum(1 for s in seqs if s.arm == "draft")
        return width if draft_rows and width else 0

    def width(self, seqs: List[Row], widest: int, draft_batch: int) -> Tuple[int, bool]:
        """The round's width, and whether the draft-model rows sit it out.

        Lookup drafts cost nothing to make: when the draft steps cost more
        than their rows gain, the lookup rows still verify theirs alone.
        """
        rows = [
            (s.controller(s.arm).acceptance() if s.arm else [], s.cap) for s in seqs
        ]
        model = [s.arm == "draft" for s in seqs]
        step, draft_rows = self.draft_step_cost, sum(model)
        # Each draft step is a forward of every row of the draft batch.
        computed = dict(draft_batch=draft_batch, price=self.price)
        width = batch_width(rows, draft_rows, step, widest, **computed)
        fixed = any(m and not s.config.adaptive for m, s in zip(model, seqs))
        if not draft_rows or fixed:  # fixed draft lengths are kept
            return width, False
        rest = [([], 0) if m else row for row, m in zip(rows, model)]
        narrow = batch_width(rest, 0, step, widest, price=self.price)
        alone = round_rate(rest, 0, step, narrow, price=self.price)
        if alone > round_rate(rows, draft_rows, step, width, **computed):
            return narrow, True
        return width, False

    def _lookup(self, s: Row, max_len: int) -> Tuple[List[int], int, bool]:
        """The longer of the own-context and cross-request matches (own on ties)."""
        if len(s.local) < len(s.seq):
            s.local.extend(s.seq[len(s.local) :])
        own = s.local.propose(max_len=max_len, max_candidates=1)
        own = extend_periodic(own[0], max_len) if own else []
        own_match = s.local.last_match_len if own else 0
        if self.index is None or s.spec.isolation:
            return own, own_match, False
        cross, cross_match = self.index.propose(s.seq, max_len)
        if cross_match > own_match:
            return cross, cross_match, True
        return own, own_match, False


def row_size(s: Row, arm: str, cap: int):
    """Run ``arm`` on row ``s`` this round: its γ (at most ``cap``, which is at
    least 1) from its controller, or the fixed ``num_draft_tokens``, and the
    drafts it may verify."""
    s.arm = arm
    if s.config.adaptive:
        s.size, s.cap = min(s.controller(arm).choose(), cap), cap
    else:
        s.size = s.cap = min(s.config.num_draft_tokens, cap)
