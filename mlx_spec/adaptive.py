"""Adaptive draft length (chains) and tree budget (trees).

Each round :class:`AdaptiveController` picks the draft length ``gamma`` that
maximises the expected number of tokens per second, from online estimates:

* per-depth acceptance ``a_i = P(depth i accepted | depth i-1 accepted)``,
  an exponential moving average per depth; depth 1 is the mean of a Beta
  posterior: the prior counts as ``PRIOR_SHARE / ema`` rounds that never decay,
  so two unlucky rounds cannot price a drafter out, and the rounds an arm
  sits out (:meth:`AdaptiveController.rest`) age its evidence, so an arm
  left out for low acceptance returns once that evidence is old;
* the time of one draft step (EMA) and of one verification forward as a
  function of its width: an EMA per width, through which a line
  ``a + b * width`` is fitted (weighted by observations); the line, not the
  noisy per-width means, prices every width. The engine passes the whole
  round's cost as the verification time and no separate draft time;
* the time of a round that drafted nothing (``gamma = 0``, plain decoding),
  an EMA of its own: such a round pays no draft overhead, so the line
  through drafting rounds would misprice it.

For a chain of ``gamma`` tokens::

    E(gamma) = 1 + sum_{k=1..gamma} prod_{i<=k} a_i      # tokens per round
    T(gamma) = gamma * t_draft + t_verify(gamma + 1) + t_overhead

and the controller returns ``argmax E / T`` over ``[gamma_min, gamma_max]``,
with an occasional (``explore``) step to a neighbour so unseen widths and
depths get measured. Depths that have not been observed recently forget their
old estimate and inherit the estimate of the depth above them, so the
controller grows again after the acceptance rate recovers.

For token trees, :meth:`AdaptiveController.choose_budget` picks a node budget
from ``tree_budgets`` the same way, with the tokens per round (accepted depth
plus one) measured per budget instead of modelled per depth; budgets not
measured recently are interpolated in ``log2(budget + 1)``, since a tree's
gain flattens as it grows, and the next budget above the largest measured
one is extrapolated at half the last measured slope, so a tree that pays grows
a step at a time without waiting for exploration.

Early stopping on the draft's own confidence (``--draft-p-min``) lives in
the drafters (:class:`mlx_spec.drafters.ModelDrafter`).
"""

import math
import random
from typing import Callable, Dict, List, Optional, Sequence

DEFAULT_GAMMA_MIN = 1
DEFAULT_GAMMA_MAX = 12
DEFAULT_INIT_GAMMA = 4
DEFAULT_EMA = 0.2
DEFAULT_PRIOR_ACCEPTANCE = 0.6
DEFAULT_EXPLORE = 0.05
DEFAULT_VERIFY_SLOPE = 0.1
GAMMA_LIMIT = 64

# Pseudo-count pulling a tree budget towards the curve through the others; a
# budget measured every round carries weight ~1/ema, a stale one decays to 0.
_SHRINK_WEIGHT = 0.5
# The prior acceptance of depth 1 counts as this share of the rounds an EMA
# window holds (2 rounds at ema 0.05); it does not decay, so the estimate is a
# Beta posterior's mean over recent rounds.
PRIOR_SHARE = 0.1
_TINY = 1e-12
# The next tree budget up is priced at this share of the last measured gain
# slope: enough to climb where wide trees pay, damped where they do not.
EXTRAPOLATE = 0.5
# A round an arm sits out keeps this share of its acceptance evidence: the
# estimate returns to the prior, the sooner the less the evidence against it.
REST_KEEP = 0.95


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _check_float(name: str, value, low: float, high: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


class _Ema:
    """Bias-corrected exponential moving average: ``total / weight``."""

    __slots__ = ("total", "weight")

    def __init__(self, total: float = 0.0, weight: float = 0.0):
        self.total = total
        self.weight = weight

    def decay(self, keep: float) -> None:
        self.total *= keep
        self.weight *= keep

    def add(self, value: float, keep: float) -> None:
        self.decay(keep)
        self.total += value
        self.weight += 1.0

    def mean(self, prior: float, prior_weight: float) -> float:
        return (self.total + prior_weight * prior) / (self.weight + prior_weight)


def expected_tokens(acceptance: Sequence[float]) -> List[float]:
    """Expected tokens per round for every chain length.

    Args:
        acceptance (Sequence[float]): ``(gamma_max,)`` conditional acceptance
          probabilities ``a_1..a_gamma_max``.

    Returns:
        list[float]: ``(gamma_max + 1,)``; entry ``g`` is
        ``1 + sum_{k<=g} prod_{i<=k} a_i`` (accepted plus the bonus token).
    """
    out = [1.0]
    reach = 1.0
    for a in acceptance:
        reach *= a
        out.append(out[-1] + reach)
    return out


class AdaptiveController:
    """Online choice of the draft length (chains) or node budget (trees).

    Args:
        gamma_min (int): Smallest draft length, in ``[0, gamma_max]``; ``0``
          lets the controller fall back to plain decoding. Default: ``1``.
        gamma_max (int): Largest draft length, in ``[1, 64]``. Default: ``12``.
        init_gamma (int, optional): Length before any measurement, clamped
          to the bounds. Default: ``4``.
        ema (float): Weight of a new observation, in ``(0, 1]``. Default: ``0.2``
          (about the last 5 rounds).
        prior_acceptance (float): Acceptance assumed before measurements, in
          ``[0, 1]``. Default: ``0.6``.
        explore (float): Probability of trying a neighbour of the best choice,
          in ``[0, 1]``. Default: ``0.05``.
        verify_slope (float): Assumed relative cost of one more verified
          token while only one width has been measured, in ``[0, 10]``.
          Default: ``0.1``.
        tree_budgets (Sequence[int], optional): Node budgets that
          :meth:`choose_budget` picks from (each in ``[1, 4096]``).
        init_budget (int, optional): Budget before any measurement. Default:
          the median of ``tree_budgets``.
        seed (int): Seed of the exploration RNG. Default: ``0``.
        depth_weight (float, optional): Rounds' worth of evidence with which
          each depth's estimate leans on the depth above, in ``(0, 1000]``.
          Default: as much as depth 1 leans on its prior (``PRIOR_SHARE / ema``),
          so one lucky round does not lengthen chains.
    """

    def __init__(
        self,
        *,
        gamma_min: int = DEFAULT_GAMMA_MIN,
        gamma_max: int = DEFAULT_GAMMA_MAX,
        init_gamma: int = DEFAULT_INIT_GAMMA,
        ema: float = DEFAULT_EMA,
        prior_acceptance: float = DEFAULT_PRIOR_ACCEPTANCE,
        explore: float = DEFAULT_EXPLORE,
        verify_slope: float = DEFAULT_VERIFY_SLOPE,
        tree_budgets: Optional[Sequence[int]] = None,
        init_budget: Optional[int] = None,
        seed: int = 0,
        depth_weight: Optional[float] = None,
    ):
        self.gamma_max = _check_int("gamma_max", gamma_max, 1, GAMMA_LIMIT)
        self.gamma_min = _check_int("gamma_min", gamma_min, 0, gamma_max)
        self.init_gamma = _check_int("init_gamma", init_gamma, 0, GAMMA_LIMIT)
        self.init_gamma = min(max(init_gamma, gamma_min), gamma_max)
        if isinstance(ema, (int, float)) and ema <= 0:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.ema = _check_float("ema", ema, 0.0, 1.0)
        self.prior_acceptance = _check_float(
            "prior_acceptance", prior_acceptance, 0.0, 1.0
        )
        self.explore = _check_float("explore", explore, 0.0, 1.0)
        self.verify_slope = _check_float("verify_slope", verify_slope, 0.0, 10.0)
        self._keep = 1.0 - self.ema
        self._rng = random.Random(seed)

        # Depth i (1-based) lives at index i - 1; depth 1 leans on the prior
        # (as PRIOR_SHARE of a window's rounds), deeper ones on the depth above.
        self._prior_weight = PRIOR_SHARE / self.ema
        if depth_weight is None:
            depth_weight = self._prior_weight
        self.depth_weight = _check_float("depth_weight", depth_weight, _TINY, 1000.0)
        self._accept = [_Ema() for _ in range(self.gamma_max)]
        self._draft_step = _Ema()
        self._overhead = _Ema()
        self._plain = _Ema()
        self._verify: Dict[int, _Ema] = {}
        self.rounds = 0
        # gamma_max -> costs of chain rounds of 0..gamma_max drafts (0: a
        # plain round), from a cost model shared by several arms; replaces
        # this controller's own cost estimates when set.
        self.pricer: Optional[Callable[[int], Sequence[float]]] = None
        self.last_gamma: Optional[int] = None
        self.last_budget: Optional[int] = None

        self.tree_budgets: List[int] = []
        if tree_budgets is not None:
            for i, b in enumerate(tree_budgets):
                _check_int(f"tree_budgets[{i}]", b, 1, 4096)
            self.tree_budgets = sorted(set(tree_budgets))
            if not self.tree_budgets:
                raise ValueError("tree_budgets must hold at least one budget")
        self._tree_tokens = {b: _Ema() for b in self.tree_budgets}
        self._tree_draft = {b: _Ema() for b in self.tree_budgets}
        if init_budget is None and self.tree_budgets:
            init_budget = self.tree_budgets[(len(self.tree_budgets) - 1) // 2]
        if init_budget is not None and init_budget not in self._tree_tokens:
            raise ValueError(
                f"init_budget must be one of tree_budgets {self.tree_budgets}, "
                f"got {init_budget!r}"
            )
        self.init_budget = init_budget

    # ----------------------------------------------------------- estimates

    def acceptance(self) -> List[float]:
        """Estimated conditional acceptance per depth, ``(gamma_max,)``."""
        out = []
        prior = self.prior_acceptance
        for i, stat in enumerate(self._accept):
            weight = self._prior_weight if i == 0 else self.depth_weight
            prior = stat.mean(prior, weight)
            out.append(prior)
        return out

    def _verify_line(self):
        """Weighted least-squares ``(a, b)`` of verify time vs width, ``b >= 0``.

        Each width's mean counts with its (decayed) number of observations.
        """
        pts = [(w, s.total / s.weight, s.weight) for w, s in self._verify.items()]
        pts = [p for p in pts if p[2] > _TINY]
        if not pts:
            return 0.0, 0.0
        if len(pts) == 1:
            ((w0, t0, _),) = pts
            per = t0 / (1.0 + self.verify_slope * (w0 - 1))
            return per * (1.0 - self.verify_slope), per * self.verify_slope
        n = sum(k for _, _, k in pts)
        mw = sum(k * w for w, _, k in pts) / n
        mt = sum(k * t for _, t, k in pts) / n
        sww = sum(k * (w - mw) ** 2 for w, _, k in pts)
        b = max(sum(k * (w - mw) * (t - mt) for w, t, k in pts) / sww, 0.0)
        a = mt - b * mw
        if a < 0:
            a = 0.0
            b = sum(k * w * t for w, t, k in pts) / sum(k * w * w for w, _, k in pts)
        return a, b

    def verify_time(self, width: int) -> float:
        """Estimated time of a verification of ``width`` tokens.

        Once two widths are measured, from the fitted line (round times are
        noisy, and a line through all of them beats any one width's mean).
        """
        return self._verify_pricer()(width)

    def _verify_pricer(self):
        """``width -> verify_time(width)``, fitting the line once for many widths."""
        if len(self._verify) == 1:
            ((only, stat),) = self._verify.items()
            mean = stat.total / stat.weight
        else:
            only = mean = None
        a, b = self._verify_line()
        return lambda width: mean if width == only else max(a + b * width, 0.0)

    def _draft_time(self) -> float:
        return self._draft_step.mean(0.0, _TINY)

    def _overhead_time(self) -> float:
        return self._overhead.mean(0.0, _TINY)

    def expected_rates(self) -> List[float]:
        """Estimated tokens per second for ``gamma = 0..gamma_max``."""
        tokens = expected_tokens(self.acceptance())
        if self.pricer is not None:
            costs = self.pricer(self.gamma_max)
            return [e / max(t, _TINY) for e, t in zip(tokens, costs)]
        t_draft = self._draft_time()
        t_over = self._overhead_time()
        verify_time = self._verify_pricer()
        rates = []
        for g, e in enumerate(tokens):
            t_ver = verify_time(g + 1)
            rates.append(e / max(g * t_draft + t_ver + t_over, _TINY))
        if self._plain.weight > _TINY:
            rates[0] = 1.0 / max(self._plain.mean(0.0, _TINY), _TINY)
        return rates

    def _explore_around(self, best: int, lo: int, hi: int) -> int:
        if self.explore > 0 and self._rng.random() < self.explore:
            step = 1 if self._rng.random() < 0.5 else -1
            if not lo <= best + step <= hi:
                step = -step
            return min(max(best + step, lo), hi)
        return best

    # ------------------------------------------------------------- choices

    def choose(self) -> int:
        """Draft length for the next round, in ``[gamma_min, gamma_max]``."""
        if not self._verify and self.pricer is None:
            gamma = self.init_gamma
        else:
            rates = self.expected_rates()
            best = self.gamma_min
            for g in range(self.gamma_min, self.gamma_max + 1):
                if rates[g] > rates[best] * (1 + 1e-9):
                    best = g
            gamma = self._explore_around(best, self.gamma_min, self.gamma_max)
        self.last_gamma = gamma
        return gamma

    def _tree_estimates(self):
        """Tokens per round and draft seconds per round, per budget.

        A budget's measured mean is shrunk towards a curve through the
        recently measured budgets, linear in ``log2(budget + 1)`` from
        ``(0 nodes, 1 token)``, extended to the next budget up at ``EXTRAPOLATE`` of
        the slope of its last segment (so a growing tree is tried a step larger as soon
        as that would pay, not only when an exploring round lands there), and
        flat beyond; the result is made non-decreasing in the budget.
        """
        budgets = self.tree_budgets
        recent = [
            (math.log2(b + 1), s.total / s.weight)
            for b, s in self._tree_tokens.items()
            if s.weight >= _SHRINK_WEIGHT
        ]
        curve = sorted([(0.0, 1.0)] + recent)
        larger = [b for b in budgets if math.log2(b + 1) > curve[-1][0]]
        if recent and larger:
            (x0, y0), (x1, y1) = curve[-2], curve[-1]
            slope = EXTRAPOLATE * max(y1 - y0, 0.0) / (x1 - x0)
            x = math.log2(larger[0] + 1)
            curve.append((x, min(y1 + slope * (x - x1), larger[0] + 1.0)))
        tokens, prev = [], 1.0
        for b in budgets:
            prior = _interpolate(curve, math.log2(b + 1))
            prev = max(self._tree_tokens[b].mean(prior, _SHRINK_WEIGHT), prev)
            tokens.append(prev)
        seen = [
            (b, s.total / s.weight) for b, s in self._tree_draft.items() if s.weight
        ]
        drafts = [_interpolate(seen, b) for b in budgets]
        return tokens, drafts

    def choose_budget(self) -> int:
        """Tree node budget for the next round, one of ``tree_budgets``."""
        if not self.tree_budgets:
            raise ValueError("choose_budget needs tree_budgets")
        if not any(s.weight for s in self._tree_tokens.values()):
            budget = self.init_budget
        else:
            best, best_rate = 0, -1.0
            for j, rate in enumerate(self._budget_rates()):
                if rate > best_rate * (1 + 1e-9):
                    best, best_rate = j, rate
            j = self._explore_around(best, 0, len(self.tree_budgets) - 1)
            budget = self.tree_budgets[j]
        self.last_budget = budget
        return budget

    def _budget_rates(self) -> List[float]:
        """Estimated tokens per second for each of ``tree_budgets``."""
        tokens, drafts = self._tree_estimates()
        t_over = self._overhead_time()
        verify_time = self._verify_pricer()
        costs = [
            d + verify_time(b + 1) + t_over for b, d in zip(self.tree_budgets, drafts)
        ]
        return [e / max(cost, _TINY) for e, cost in zip(tokens, costs)]

    def best_rate(self) -> Optional[float]:
        """Estimated tokens per second at the best size (``None`` while no
        cost is known: a tree before its first round, a chain without a
        pricer before its first)."""
        if self.tree_budgets:
            if not any(s.weight for s in self._tree_tokens.values()):
                return None
            return max(self._budget_rates())
        if not self._verify and self.pricer is None:
            return None
        return max(self.expected_rates()[self.gamma_min :])

    # ------------------------------------------------------------- updates

    def rest(self, keep: float = REST_KEEP) -> None:
        """Note a round the arm was offered but did not run (it did not pay):
        its acceptance evidence ages by ``keep``, so each estimate moves back
        towards its prior, slowly while much evidence holds it (an arm far
        below paying, measured over many rounds, waits long) and fast when
        little does; an arm left out for low acceptance is tried again."""
        for stat in self._accept:
            stat.decay(keep)

    def _update_costs(self, verify_time, verify_width, overhead_time, plain=False):
        if plain:
            self._plain.add(verify_time + overhead_time, self._keep)
            self.rounds += 1
            return
        stat = self._verify.setdefault(verify_width, _Ema())
        stat.add(verify_time, self._keep)
        self._overhead.add(overhead_time, self._keep)
        self.rounds += 1

    def update(
        self,
        num_drafted: int,
        num_accepted: int,
        draft_time: float,
        verify_time: float,
        verify_width: Optional[int] = None,
        *,
        draft_steps: Optional[int] = None,
        overhead_time: float = 0.0,
    ) -> None:
        """Record one chain round.

        Args:
            num_drafted (int): Tokens drafted (may be fewer than chosen).
            num_accepted (int): Drafted tokens accepted, in
              ``[0, num_drafted]``.
            draft_time (float): Seconds spent drafting.
            verify_time (float): Seconds of the verification forward.
            verify_width (int, optional): Tokens in that forward. Default:
              ``num_drafted + 1``.
            draft_steps (int, optional): Draft forwards run. Default:
              ``num_drafted``.
            overhead_time (float): Other per-round seconds. Default: ``0``.
        """
        _check_int("num_drafted", num_drafted, 0, 1 << 20)
        _check_int("num_accepted", num_accepted, 0, num_drafted)
        _check_float("draft_time", draft_time, 0.0, math.inf)
        _check_float("verify_time", verify_time, 0.0, math.inf)
        _check_float("overhead_time", overhead_time, 0.0, math.inf)
        if verify_width is None:
            verify_width = num_drafted + 1
        _check_int("verify_width", verify_width, 1, 1 << 20)
        if draft_steps is None:
            draft_steps = num_drafted
        _check_int("draft_steps", draft_steps, 0, 1 << 20)

        keep = self._keep
        # Depths up to the first rejection were observed; deeper ones age.
        # A round with nothing drafted (no lookup match) tells nothing.
        observed = min(num_accepted + (num_accepted < num_drafted), self.gamma_max)
        for i, stat in enumerate(self._accept if num_drafted else ()):
            if i < observed:
                stat.add(1.0 if i < num_accepted else 0.0, keep)
            else:
                stat.decay(keep)
        if draft_steps:
            self._draft_step.add(draft_time / draft_steps, keep)
        plain = num_drafted == 0 and verify_width == 1
        self._update_costs(verify_time, verify_width, overhead_time, plain)

    def update_tree(
        self,
        budget: int,
        num_accepted: int,
        draft_time: float,
        verify_time: float,
        verify_width: Optional[int] = None,
        *,
        overhead_time: float = 0.0,
    ) -> None:
        """Record one tree round.

        Args:
            budget (int): The budget used (one of ``tree_budgets``).
            num_accepted (int): Accepted depth (draft tokens accepted).
            draft_time (float): Seconds spent building the tree.
            verify_time (float): Seconds of the verification forward.
            verify_width (int, optional): Tokens in that forward. Default:
              ``budget + 1``.
            overhead_time (float): Other per-round seconds. Default: ``0``.
        """
        if budget not in self._tree_tokens:
            raise ValueError(
                f"budget must be one of tree_budgets {self.tree_budgets}, "
                f"got {budget!r}"
            )
        _check_int("num_accepted", num_accepted, 0, budget)
        _check_float("draft_time", draft_time, 0.0, math.inf)
        _check_float("verify_time", verify_time, 0.0, math.inf)
        _check_float("overhead_time", overhead_time, 0.0, math.inf)
        if verify_width is None:
            verify_width = budget + 1
        _check_int("verify_width", verify_width, 1, 1 << 20)

        keep = self._keep
        for b, stat in self._tree_tokens.items():
            if b == budget:
                stat.add(1.0 + num_accepted, keep)
            else:
                stat.decay(keep)
        self._tree_draft[budget].add(draft_time, keep)
        self._update_costs(verify_time, verify_width, overhead_time)

    def state(self) -> dict:
        """Current estimates, for logging and stats."""
        a, b = self._verify_line()
        out = {
            "rounds": self.rounds,
            "last_gamma": self.last_gamma,
            "acceptance": self.acceptance(),
            "draft_step_time": self._draft_time(),
            "overhead_time": self._overhead_time(),
            "verify_time": {
                w: s.total / s.weight for w, s in sorted(self._verify.items())
            },
            "verify_line": (a, b),
            "plain_time": self._plain.mean(0.0, _TINY) if self._plain.weight else None,
            "expected_rates": self.expected_rates(),
        }
        if self.tree_budgets:
            tokens, drafts = self._tree_estimates()
            out["last_budget"] = self.last_budget
            out["tree_tokens"] = dict(zip(self.tree_budgets, tokens))
            out["tree_draft_time"] = dict(zip(self.tree_budgets, drafts))
        return out


def _interpolate(points, x: float) -> float:
    """Piecewise-linear through ``points`` ``[(x, y)]``; constant outside."""
    if not points:
        return 0.0
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]
