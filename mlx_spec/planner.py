"""Round planning: the arm a round runs and its size, fixed or adaptive.

The planner owns one :class:`~mlx_spec.adaptive.AdaptiveController` per arm
and feeds it each round's acceptance and cost (wall time under greedy
decoding, the fixed cost model of :mod:`mlx_spec.costs` when sampling).
"""

import time
from typing import List, Optional, Sequence, Tuple

from .adaptive import AdaptiveController, expected_tokens
from .config import SpecConfig
from .costs import (
    VERIFY_SLOPE,
    MeasuredCosts,
    best_gamma,
    fixed_batch_price,
    static_round_cost,
)
from .distributed import from_rank0, sharded_group

# An adaptive tree's first budget; its controller grows it where that pays.
TREE_START_BUDGET = 4
# An arm's first drafting rounds, then one in SPLIT_EVERY, sync once after
# drafting so the cost model measures its draft step apart from verification.
SPLIT_FIRST = 4
SPLIT_EVERY = 16
# The acceptance memory of auto's chain arms (a window of about 1 / ARM_EMA
# rounds): long for a model's drafts, shorter for lookup's, which follow its
# matches; a lookup draft's later tokens follow its first (a copy runs on), so
# its deeper depths lean little on the depth above (LOOKUP_DEPTH_WEIGHT rounds).
ARM_EMA = 0.05
LOOKUP_EMA = 0.1
LOOKUP_DEPTH_WEIGHT = 0.5
# The evidence an arm of auto keeps per round it sits out (AdaptiveController.rest).
ARM_REST_KEEP = 0.99


class RoundPlanner:
    """Which drafter (arm) runs each round, and its draft length or tree budget.

    Fixed by default; with ``config.adaptive`` each arm gets its own
    :class:`AdaptiveController`, fed with the arm's acceptance and the cost
    of each round as a function of its verified width (draft steps,
    verification and host work together, so no time is attributed by
    guesswork and no extra sync is needed). Under greedy decoding that cost
    is the round's wall time (the output cannot depend on it); when sampling
    it comes from :func:`static_round_cost`, so a seed always gives the same
    text. ``clock`` (seconds; default :func:`time.perf_counter`) times the
    rounds; a replay passes a modelled one.
    """

    def __init__(self, config: SpecConfig, drafter, timed: bool, clock=None):
        self.config = config
        self.drafter = drafter
        self.timed = timed
        self.controllers = {}
        self.arm = drafter
        self.pending = None  # the last round, until its cost is known
        self.planned = None  # the next round's (is_tree, size), once chosen
        self.tic = 0.0
        self.clock = clock
        # Sharded, every rank decides with rank 0's measured costs.
        self.group = sharded_group()
        # Every round's cost by what it ran; it prices auto's arms against
        # each other and against plain rounds, and is reported in the stats.
        self.costs = MeasuredCosts()
        self.split_rounds = {}  # drafting rounds per arm, for times_drafts
        if hasattr(drafter, "use_estimates"):
            drafter.use_estimates(self)

    def _controller(self, arm):
        # A static tree (fixed choices) has nothing to adapt.
        if not self.config.adaptive or getattr(arm, "static", None) is not None:
            return None
        key = getattr(arm, "name", "drafter")
        if key not in self.controllers:
            alone = arm is self.drafter
            controller = make_controller(self.config, arm, alone=alone)
            if not alone and not arm.is_tree:
                controller.pricer = self._chain_pricer(arm)
            self.controllers[key] = controller
        return self.controllers[key]

    def _chain_pricer(self, arm):
        """``gamma_max -> costs`` of chain rounds of ``arm`` drafting
        ``0..gamma_max`` tokens, from the shared costs."""
        name, step = getattr(arm, "name", "drafter"), getattr(arm, "step_cost", 0.0)
        self.costs.add_arm(name, step)
        per_token = 1 if step > 0 else 0  # a lookup draft runs no forward
        return lambda gamma_max: self.costs.chain_times(name, per_token, gamma_max)

    def times_drafts(self, proposal) -> bool:
        """Whether this round's drafting is timed on its own (measured rounds
        that ran a draft forward: the first SPLIT_FIRST of an arm, then one
        in SPLIT_EVERY); the engine then syncs once after drafting and
        reports it with :meth:`drafts_took`."""
        if not self.timed or proposal.forwards == 0:
            return False
        name = getattr(self.arm, "name", "drafter")
        seen = self.split_rounds.get(name, 0)
        self.split_rounds[name] = seen + 1
        return seen < SPLIT_FIRST or seen % SPLIT_EVERY == 0

    def drafts_took(self, proposal, seconds: float):
        """The drafting part of this round took ``seconds``."""
        name = getattr(self.arm, "name", "drafter")
        self.costs.add_arm(name, getattr(self.arm, "step_cost", 0.0))
        seconds = from_rank0(seconds, self.group)  # sharded: every rank alike
        caught_up = getattr(proposal, "caught_up", 0)
        self.costs.observe_drafts(name, proposal.forwards, seconds, caught_up)

    def plain_rate(self) -> float:
        """Expected tokens per unit of cost of a plain round."""
        return 1.0 / max(self.costs.step_time(), 1e-12)

    def round_cost(self, arm, gamma: int) -> float:
        """Expected cost of a chain round of ``gamma`` drafts by ``arm``."""
        name, step = getattr(arm, "name", "drafter"), getattr(arm, "step_cost", 0.0)
        self.costs.add_arm(name, step)
        return self.costs.round_time(name, gamma if step > 0 else 0, gamma + 1)

    def arm_rate(self, arm):
        """Expected tokens per unit of cost of ``arm`` at its best size
        (``None`` while that cannot be priced: a tree before its first round)."""
        controller = self._controller(arm)
        return None if controller is None else controller.best_rate()

    def plan(self, seq=None) -> Tuple[bool, int]:
        """Pick the next round's arm and size ahead of its start (see :meth:`begin_round`).

        ``seq`` is the context so far, for a drafter that chooses its arm by it.
        """
        if self.planned is None:
            select = getattr(self.drafter, "select", None)
            self.arm = select(seq) if select is not None else self.drafter
            is_tree = getattr(self.arm, "is_tree", False)
            controller = self._controller(self.arm)
            if controller is None:
                config = self.config
                size = config.tree_budget if is_tree else config.num_draft_tokens
            elif getattr(self.drafter, "probing", False) and not is_tree:
                size = max(controller.gamma_min, 1)  # a probe drafts one token
            elif getattr(self.drafter, "sizes_itself", False) and not is_tree:
                size = controller.gamma_max  # the arm drafts what pays, up to this
            else:
                size = controller.choose_budget() if is_tree else controller.choose()
            self.planned = (is_tree, size)
        return self.planned

    def begin_round(self, seq=None) -> Tuple[bool, int]:
        """Start a round on the context ``seq`` with its planned arm; return
        ``(is_tree, size)``.

        A measured round costs the time from its start to the next round's
        start, so per-round host work (commit, streaming) counts too.
        """
        now = time.perf_counter() if self.clock is None else self.clock()
        if self.pending is not None:
            self._record(now - self.tic)
        self.tic = now
        planned = self.plan(seq)
        self.planned = None
        return planned

    def queues_plain_round(self, seq: List[int]) -> bool:
        """Plan the round after a plain one; True if it drafts nothing too.

        Its target step can then be queued before this round's sync, as in
        plain decoding, so the decision cannot read this round's token. A
        drafter says so either for any context of a length
        (``drafts_nothing(size, seq_len)``: self-speculation), or from the
        context one token behind (``plain_next(seq)``: prompt lookup, whose
        new match then drafts a round later, and ``auto``).
        """
        plain_next = getattr(self.drafter, "plain_next", None)
        if plain_next is not None:
            if self.planned is not None or not plain_next(seq):
                return False
            self.arm = getattr(self.drafter, "plain_arm", self.drafter)
            self.planned = (False, 0)
            return True
        if getattr(self.drafter, "select", None) is not None:
            return False  # auto picks an arm per round; keep commits in order
        is_tree, size = self.plan()
        drafts_nothing = getattr(self.arm, "drafts_nothing", None)
        return (
            not is_tree
            and drafts_nothing is not None
            and drafts_nothing(size, len(seq) + 1)
        )

    def end_round(self, size: int, proposal, accepted: int):
        """Note the round's outcome; it is recorded once its cost is known."""
        self.pending = (size, proposal, accepted)
        if not self.timed:
            step = getattr(self.arm, "step_cost", 0.0)
            self._record(static_round_cost(step, proposal.forwards, proposal.size + 1))

    def _record(self, cost: float):
        size, proposal, accepted = self.pending
        self.pending = None
        if self.timed:
            cost = max(cost - proposal.setup_time, 0.0)  # a one-off search
            cost = from_rank0(cost, self.group)  # sharded: every rank decides alike
        drafted, width = proposal.size, proposal.size + 1
        name = None
        if drafted:
            name = getattr(self.arm, "name", "drafter")
            self.costs.add_arm(name, getattr(self.arm, "step_cost", 0.0))
        caught_up = getattr(proposal, "caught_up", 0)  # tokens a draft missed
        self.costs.observe(name, proposal.forwards, width, cost, caught_up)
        controller = self._controller(self.arm)
        if controller is None:
            pass
        elif getattr(self.arm, "is_tree", False):
            if drafted:
                controller.update_tree(size, accepted, 0.0, cost, width)
        elif drafted or controller.gamma_min == 0:
            # With γ 0 allowed, a round that drafted nothing prices plain decoding.
            controller.update(drafted, accepted, 0.0, cost, width, draft_steps=0)
        # Arms that sat this round out age their evidence (see AdaptiveController.rest).
        for arm in getattr(self.drafter, "idle_arms", lambda: ())():
            resting = self._controller(arm)
            if resting is not None:
                resting.rest(ARM_REST_KEEP)
        if hasattr(self.drafter, "observe"):
            self.drafter.observe(accepted + 1, cost, proposal.size)


def make_controller(config: SpecConfig, arm, alone: bool = True):
    """A controller for one arm, starting from the arm's own cost and acceptance.

    A chain round's cost grows by a draft step plus a verified token per γ
    (:func:`static_round_cost`), which prices widths until two are measured.
    An arm with an acceptance estimate (self's layer search) also starts at
    the γ that estimate favours, capped at the fixed default. An arm that
    can draft nothing for a round at no later cost (``drafts_nothing``:
    self, whose draft is the target) may choose γ 0, a plain round, when
    drafting does not pay in measured time. So may a draft model drafting
    alone (it catches up in its next drafting round); under ``auto``, where
    plain rounds are an arm of their own, its arms keep γ ≥ 1.
    """
    if arm.is_tree:
        # Down to 1 node (a one-token chain): where wide verification costs
        # more than a weak draft earns, the tree shrinks to what pays. A
        # drafted tree starts small, so a weak draft costs little before that
        # is measured; lookup's (no draft forward) branches only past its
        # first candidate, so it starts at the budget.
        start = config.tree_budget
        if getattr(arm, "step_cost", 0.0) > 0:
            start = min(start, TREE_START_BUDGET)
        budgets = {
            b for b in (1, 2, 4, 8, 16, 24, 32, 48, 64) if b <= config.tree_budget * 4
        }
        return AdaptiveController(
            tree_budgets=sorted(budgets | {config.tree_budget, start}),
            init_budget=start,
        )
    step = getattr(arm, "step_cost", 0.0)
    pauses = getattr(arm, "drafts_nothing", None) is not None
    if getattr(arm, "catches_up", False) and not alone:
        pauses = False
    alpha = getattr(arm, "acceptance_estimate", None)
    return chain_controller(
        config, step, pauses=pauses, alone=alone, acceptance_estimate=alpha
    )


def chain_controller(
    config: SpecConfig,
    step_cost: float,
    *,
    pauses: bool,
    alone: bool = True,
    acceptance_estimate: Optional[float] = None,
) -> AdaptiveController:
    """The controller of a chain arm (see :func:`make_controller`); a row of
    continuous batching gets one per arm too.

    Args:
        config: Draft lengths come from ``max_draft_tokens`` and
          ``num_draft_tokens``.
        step_cost: One draft forward, in 1-token target forwards (0: lookup).
        pauses: Whether the arm may choose γ 0, a plain round.
        alone: False for one of several arms (``auto``): a longer memory.
        acceptance_estimate: A searched acceptance to start from.
    """
    gamma_max = config.max_draft_tokens
    options = dict(
        gamma_min=0 if pauses else 1,
        gamma_max=gamma_max,
        verify_slope=VERIFY_SLOPE + step_cost,
    )
    if not alone:
        # auto compares its arms with plain rounds: steadier estimates, no
        # arm priced out by a short unlucky run.
        options["ema"] = ARM_EMA if step_cost > 0 else LOOKUP_EMA
    if step_cost == 0:
        options["depth_weight"] = LOOKUP_DEPTH_WEIGHT
    alpha = acceptance_estimate
    if alpha is None:
        options["init_gamma"] = min(config.num_draft_tokens, gamma_max)
    else:
        # Searched estimates run high: start no longer than the fixed default.
        gamma, _ = best_gamma(alpha, step_cost, range(1, gamma_max + 1))
        gamma = min(gamma, config.num_draft_tokens)
        options.update(prior_acceptance=alpha, init_gamma=gamma)
    return AdaptiveController(**options)


def batch_width(
    rows: Sequence[Tuple[Sequence[float], int]],
    draft_rows: int,
    step_cost: float,
    max_width: int,
    *,
    draft_batch: Optional[int] = None,
    price=None,
) -> int:
    """The draft width ``K`` of a continuous-batching round (0: a plain round).

    Every row pays for the widest row: the verify forward holds ``B * (K + 1)``
    tokens, and ``K`` draft steps run when ``draft_rows`` rows draft with the
    draft model, each step a forward of the whole draft batch. ``K``
    maximises the batch's expected tokens over the round's cost, so one
    row's long match does not widen a batch whose other rows would gain
    nothing.

    Args:
        rows: ``(acceptance, available)`` per row: its arm's conditional
          acceptance by depth (:meth:`AdaptiveController.acceptance`) and the
          drafts it can verify this round (``0``: none).
        draft_rows: Rows whose drafts come from the draft model.
        step_cost: One draft forward, relative to one target forward.
        max_width: The largest ``K`` to consider.
        draft_batch: Rows each draft step computes (rows that do not draft
          this round catch up or idle in it). Default: ``draft_rows``.
        price: A round's cost, ``(arm, steps, rows, width, draft_rows) ->
          cost`` (:meth:`~mlx_spec.costs.MeasuredCosts.batch_round_time`).
          Default: the fixed model at ``step_cost``
          (:func:`~mlx_spec.costs.fixed_batch_price`).
    """
    best, best_rate = 0, 0.0
    for K in range(max_width + 1):
        rate = round_rate(
            rows, draft_rows, step_cost, K, draft_batch=draft_batch, price=price
        )
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = K, rate
    return best


def round_rate(
    rows: Sequence[Tuple[Sequence[float], int]],
    draft_rows: int,
    step_cost: float,
    width: int,
    *,
    draft_batch: Optional[int] = None,
    price=None,
) -> float:
    """A batch round's expected tokens over its cost (see :func:`batch_width`)."""
    computed = draft_rows if draft_batch is None else max(draft_batch, draft_rows)
    tokens = sum(expected_tokens(acc[: min(width, n)])[-1] for acc, n in rows)
    price = price or fixed_batch_price(step_cost)
    arm = ("draft" if draft_rows else "lookup") if width else None
    steps = width if draft_rows else 0
    cost = price(arm, steps, len(rows), width + 1, computed)
    return tokens / max(cost, 1e-12)
