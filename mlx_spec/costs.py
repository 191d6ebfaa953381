"""The cost of a round: a fixed model, and one measured while generating.

The fixed model is in units of one 1-token target forward: the engine prices
rounds with it instead of wall time when sampling, so a seed always gives the
same text; drafters use it to pick a draft length. :class:`MeasuredCosts`
fits the same shape to the rounds' measured costs.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

VERIFY_SLOPE = 0.1  # each extra verified token adds 10% of a 1-token forward
DRAFT_LATENCY = 0.05  # a draft forward's fixed cost (launch and dispatch)


def forward_cost(tokens: int) -> float:
    """Modelled cost of one forward over ``tokens`` tokens (all rows together)."""
    return 1.0 + VERIFY_SLOPE * (tokens - 1)


def static_round_cost(
    step_cost: float, forwards: int, width: int, *, rows: int = 1, draft_rows: int = 1
) -> float:
    """Modelled cost of a round: ``forwards`` draft steps plus one verify of ``width``.

    In a batch the verify forward holds ``rows`` rows of ``width`` tokens and
    each draft step is a forward of ``draft_rows`` rows; one row (the
    single-sequence engine) is the default.
    """
    draft = forwards * step_cost * forward_cost(draft_rows)
    return draft + 1.0 + VERIFY_SLOPE * (rows * width - 1)


def fixed_batch_price(step_cost: float):
    """The fixed model as a price of continuous-batching rounds, with the
    signature of :meth:`MeasuredCosts.batch_round_time`."""

    def price(arm, steps: int, rows: int, width: int, draft_rows: int = 1) -> float:
        return static_round_cost(
            step_cost, steps, width, rows=rows, draft_rows=draft_rows
        )

    return price


def chain_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens of a round verifying ``gamma`` drafts: ``sum alpha**i``."""
    return sum(alpha**i for i in range(gamma + 1))


def expected_speedup(alpha: float, gamma: int, step_cost: float) -> float:
    """Tokens per round over its modelled cost, for γ drafts each accepted
    (independently) with rate ``alpha``."""
    return chain_tokens(alpha, gamma) / static_round_cost(step_cost, gamma, gamma + 1)


def best_gamma(
    alpha: float, step_cost: float, gammas: Sequence[int]
) -> Tuple[int, float]:
    """The draft length in ``gammas`` with the highest expected speedup, and it."""
    scored = ((g, expected_speedup(alpha, g, step_cost)) for g in gammas)
    return max(scored, key=lambda pair: pair[1])


def weight_bytes(model) -> int:
    """Bytes of a model's parameters (what one forward reads).

    A model that shares a large table it only indexes (a distilled draft on
    its target's embedding) says what it reads with ``read_bytes()``.
    """
    from mlx.utils import tree_flatten

    if hasattr(model, "read_bytes"):
        return int(model.read_bytes())
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def target_bytes(target) -> int:
    """Bytes one forward of a target reads, alike on every rank when it is sharded.

    Tensor-parallel ranks read their shares at once, so a forward costs rank
    0's share; pipeline stages run one after another, so it costs every
    stage's blocks and the rest (embedding, norm, head) once. Every rank
    takes the same figure, or they would choose different draft lengths.
    """
    from .distributed import from_rank0, sharded_group, summed_over_ranks

    group = sharded_group()
    own = float(weight_bytes(target))
    inner = getattr(target, "model", None)  # mlx-lm's PipelineMixin, if staged
    if group is None or getattr(inner, "pipeline_size", 1) <= 1:
        return int(from_rank0(own, group))
    blocks = float(sum(weight_bytes(block) for block in inner.pipeline_layers))
    return int(summed_over_ranks(blocks, group) + from_rank0(own - blocks, group))


def model_step_cost(draft_model, target_model) -> float:
    """A draft forward's modelled cost: weight bytes read, relative, plus latency."""
    ratio = weight_bytes(draft_model) / max(target_bytes(target_model), 1)
    return DRAFT_LATENCY + ratio


# Online cost model: each kind of round (plain rounds, each arm's) forgets its
# own evidence at this rate per round of that kind, and the prior counts as this
# many rounds on each coefficient (enough to price unseen widths early).
COST_FORGET = 0.97
COST_PRIOR_ROUNDS = 2.0
# An arm's switch is what its rounds cost beyond the rest, which plain rounds
# measure: its prior (none) weighs this little, so it does not draw the step up.
SWITCH_PRIOR_ROUNDS = 0.25
# A round whose drafting is timed on its own measures the draft step directly:
# it counts as this many rounds' worth of evidence.
DRAFT_TIMING_WEIGHT = 8.0
# Coefficients per arm: its draft step, switch and catch-up per token.
PER_ARM = 3
PLAIN = None  # the kind of a round that drafted nothing


class MeasuredCosts:
    """A round's cost by what it ran, fitted online from the rounds' own times.

    Each round's cost (wall seconds under greedy decoding, the fixed model's
    units when sampling) is modelled as::

        cost = step + slope * (width - 1) + draft_step[arm] * forwards
               + switch[arm] + catch_up[arm] * caught_up

    ``step`` is a 1-token target forward with its host work (a plain round),
    ``step + slope * (n - 1)`` verifies ``n`` tokens, ``draft_step[arm]`` is one
    draft forward of an arm, ``switch[arm]`` its fixed cost per drafting
    round (a pipeline broken by the sync, host matching) and
    ``catch_up[arm]`` the cost of each token its first forward reads beyond
    one (the draft catching up on the rounds it sat out). A round is priced
    without catch-up (:meth:`round_time`, :meth:`chain_times`), so whether
    to draft compares steady rates: the tokens a draft missed are caught up
    once, whenever it next drafts, not each round.

    The coefficients come from a least-squares fit over every round (plain,
    lookup, chain and tree rounds each separate some of them, and a few
    rounds time their drafting on its own, see :meth:`observe_drafts`),
    pulled towards the fixed model (:func:`static_round_cost`) in units of
    the plain rounds' mean cost (the first round's, scaled, before any).
    Each kind of round forgets its own evidence as rounds of that kind come
    in, so what only plain rounds measure (``step``, and through it each
    arm's ``switch``) is kept while ``auto`` runs other rounds: forgotten
    with every round, a few early plain rounds would fade and the prior
    would set ``step``. The mean is right even where a plain round's forward
    runs in the round before it (a step queued ahead, which ``mx.async_eval``
    runs nearly at once on a CPU). No forward is added for it: the engine
    times rounds that run anyway. Widths that cost about as much as one
    token (a GPU) give a slope near zero.

    Args:
        step_costs: Each arm's modelled draft step, in 1-token target forwards.
    """

    def __init__(self, step_costs: Optional[Dict[str, float]] = None):
        self.arms: List[str] = []
        self.modelled: Dict[str, float] = {}
        self.first_scale: Optional[float] = None  # the first round's, per unit
        self.rounds = 0
        # Per kind of round (PLAIN or an arm): its (gram, moment) evidence.
        self._evidence: Dict[Optional[str], Tuple[np.ndarray, np.ndarray]] = {}
        self._size = 2
        self._theta: Optional[np.ndarray] = None
        self.forwards: Dict[str, int] = {}  # draft forwards seen per arm
        for arm, cost in (step_costs or {}).items():
            self.add_arm(arm, cost)

    def add_arm(self, arm: str, step_cost: float = DRAFT_LATENCY):
        """Price ``arm``'s draft step at ``step_cost`` until it is measured."""
        if arm in self.modelled:
            return
        self.arms.append(arm)
        self.modelled[arm] = float(step_cost)
        old, self._size = self._size, 2 + PER_ARM * len(self.arms)
        for kind, (gram, moment) in self._evidence.items():
            grown, longer = np.zeros((self._size, self._size)), np.zeros(self._size)
            grown[:old, :old], longer[:old] = gram, moment
            self._evidence[kind] = (grown, longer)
        self._theta = None

    def _column(self, arm: str) -> int:
        """Index of ``arm``'s draft step; its switch and catch-up follow."""
        return 2 + PER_ARM * self.arms.index(arm)

    def _features(
        self, arm: Optional[str], forwards: int, width: int, caught_up: int = 0
    ) -> np.ndarray:
        x = np.zeros(self._size)
        x[0], x[1] = 1.0, width - 1
        if arm is not None and width > 1:
            j = self._column(arm)
            x[j], x[j + 1], x[j + 2] = forwards, 1.0, caught_up
        return x

    def _add(self, kind: Optional[str], x: np.ndarray, cost: float, keep: float):
        """Age ``kind``'s evidence by ``keep`` and add the row ``x`` of ``cost``."""
        zero = (np.zeros((self._size, self._size)), np.zeros(self._size))
        gram, moment = self._evidence.get(kind, zero)
        self._evidence[kind] = (keep * gram + np.outer(x, x), keep * moment + x * cost)
        self._theta = None

    @property
    def scale(self) -> Optional[float]:
        """Seconds (or units) per modelled unit: the plain rounds' mean cost
        (the first round's cost over its modelled one before any)."""
        plain = self._evidence.get(PLAIN)
        if plain is not None and plain[0][0, 0] > 0:
            return float(plain[1][0] / plain[0][0, 0])
        return self.first_scale

    def _prior(self) -> np.ndarray:
        units = [1.0, VERIFY_SLOPE]
        for arm in self.arms:
            # Reading k tokens costs a draft forward as verifying k costs a step.
            step = self.modelled[arm]
            units += [step, 0.0, step * VERIFY_SLOPE]
        return (self.scale or 1.0) * np.array(units)

    def observe(
        self,
        arm: Optional[str],
        forwards: int,
        width: int,
        cost: float,
        caught_up: int = 0,
    ):
        """Record one round: the arm that drafted (``None`` for a plain round),
        its draft forwards, the tokens it verified, its cost and the tokens
        beyond one that its first draft forward read."""
        drafted = arm is not None and width > 1
        if drafted:
            self.add_arm(arm)
        if self.first_scale is None and cost > 0:
            step = self.modelled.get(arm, 0.0) if drafted else 0.0
            self.first_scale = cost / static_round_cost(step, forwards, width)
        if arm is not None:
            self.forwards[arm] = self.forwards.get(arm, 0) + forwards
        x = self._features(arm, forwards, width, caught_up)
        self._add(arm if drafted else PLAIN, x, cost, COST_FORGET)
        self.rounds += 1

    def observe_drafts(self, arm: str, forwards: int, cost: float, caught_up: int = 0):
        """Record the drafting part of a round timed on its own (a sync after
        drafting): it separates ``draft_step[arm]`` from the verification
        slope, which a chain's rounds alone cannot (their widths grow with
        their forwards). It ages with the arm's rounds."""
        self.add_arm(arm)
        x = np.zeros(self._size)
        j = self._column(arm)
        x[j], x[j + 2] = forwards, caught_up
        weight = np.sqrt(DRAFT_TIMING_WEIGHT)
        self._add(arm, weight * x, weight * cost, 1.0)

    def _coefficients(self) -> np.ndarray:
        if self._theta is None:
            prior = self._prior()
            scale = max(self.scale or 1.0, 1e-12)
            gram, moment = np.zeros((self._size, self._size)), np.zeros(self._size)
            for g, m in self._evidence.values():
                gram, moment = gram + g, moment + m
            # The prior's weight is set in modelled units so it does not
            # depend on the clock's.
            weights = np.full(prior.size, COST_PRIOR_ROUNDS)
            weights[3::PER_ARM] = SWITCH_PRIOR_ROUNDS
            ridge = np.diag(weights)
            units = np.linalg.solve(gram + ridge, (moment + ridge @ prior) / scale)
            self._theta = scale * np.maximum(units, 0.0)
            self._theta[0] = scale * max(units[0], 1e-3)
        return self._theta

    def step_time(self) -> float:
        """A plain round: one 1-token target forward and its host work."""
        return float(self._coefficients()[0])

    def verify_time(self, width: int) -> float:
        """A target forward of ``width`` tokens (with a round's host work)."""
        theta = self._coefficients()
        return float(theta[0] + theta[1] * (width - 1))

    def draft_step_time(self, arm: str) -> float:
        """One draft forward of ``arm``."""
        self.add_arm(arm)
        return float(self._coefficients()[self._column(arm)])

    def round_time(self, arm: Optional[str], forwards: int, width: int) -> float:
        """Expected cost of a round of ``arm`` (``None``: plain), catch-up aside."""
        if arm is not None and width > 1:
            self.add_arm(arm)
        return float(self._features(arm, forwards, width) @ self._coefficients())

    def chain_times(self, arm: str, per_token: int, gamma_max: int) -> List[float]:
        """Expected costs of chain rounds of ``arm`` drafting ``0..gamma_max``
        tokens (``per_token`` draft forwards each; 0 drafts: a plain round)."""
        self.add_arm(arm)
        theta = self._coefficients()
        j = self._column(arm)
        gammas = np.arange(gamma_max + 1)
        times = theta[0] + theta[1] * gammas + theta[j] * per_token * gammas
        times[1:] += theta[j + 1]
        return times.tolist()

    def batch_round_time(
        self, arm: Optional[str], steps: int, rows: int, width: int, draft_rows: int = 1
    ) -> float:
        """Expected cost of a continuous-batching round: ``steps`` draft
        forwards of ``draft_rows`` rows each by ``arm`` (``None``: a plain
        round), then one verify of ``rows`` rows of ``width`` tokens.

        A batch round is observed as one round verifying ``rows * width``
        tokens whose draft forwards read ``draft_rows - 1`` tokens each
        beyond one (``caught_up``), so both are priced by what one sequence's
        rounds measure too.
        """
        drafted = arm is not None and width > 1
        if drafted:
            self.add_arm(arm)
        read = steps * max(draft_rows - 1, 0)
        x = self._features(arm if drafted else None, steps, rows * width, read)
        return float(x @ self._coefficients())

    def report(self) -> dict:
        """The fitted model in 1-token target forwards (``step_s`` in the
        clock's unit): verification by width, each arm's draft step and
        per-round switch cost, and the catch-up cost of each token a draft
        forward read beyond one (draft steps and catch-up of arms that ran a
        draft forward)."""
        theta = self._coefficients()
        step = float(theta[0])
        return {
            "rounds": self.rounds,
            "step_s": step,
            "verify_by_width": {
                w: self.verify_time(w) / step for w in (1, 2, 4, 8, 16)
            },
            "forwards": dict(self.forwards),
            "draft_step": {
                arm: float(theta[self._column(arm)]) / step
                for arm in self.arms
                if self.forwards.get(arm)
            },
            "switch": {
                arm: float(theta[self._column(arm) + 1]) / step for arm in self.arms
            },
            "catch_up": {
                arm: float(theta[self._column(arm) + 2]) / step
                for arm in self.arms
                if self.forwards.get(arm)
            },
        }
