"""The speed goals of the project's issues, checked against one run's rows.

Each goal names the method it is about, the measured value it reads and its
threshold; :func:`check_goals` gives every goal its measured value and the
verdict ``met``, ``missed`` or ``not run`` (the method, temperature or prompt
set was not in the run, or the value could not be measured). Nothing is
estimated: a goal whose row is missing is never met.

Speedups are decode-only and paired (``mlx_spec.bench.rows``). "Geometric mean"
means over the prompt sets of the run (``*_geomean`` fields of the "all"
rows); the main rows are the methods' defaults at ``--num-draft-tokens``
(adaptive control on), the γ sweep's fixed-γ rows only answer the "best γ"
goal.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .rows import ALL_PROMPTS, NOTHING_ACCEPTED
from .runner import BASELINES, PLAIN_METHODS

MET, MISSED, NOT_RUN = "met", "missed", "not run"
GREEDY, SAMPLED = 0.0, 0.7
CHAT_SET = "chat"
# A measurement: (value, what it is), or (None, why there is none).
Measured = Tuple[Optional[float], str]


@dataclass(frozen=True)
class Goal:
    """One goal: ``measure(rows) >= threshold``.

    Attributes:
        issue: The issue that sets it.
        text: The goal as the issue states it.
        threshold: The smallest value that meets it.
        measure: ``measure(rows, main_gamma) -> (value, detail)``.
    """

    issue: int
    text: str
    threshold: float
    measure: Callable[[Sequence[dict], int], Measured]


def _main(
    rows: Sequence[dict], method: str, temp: float, main_gamma: int, group: str
) -> Optional[dict]:
    """The row of ``method``'s default configuration on ``group``, if it ran."""
    for r in rows:
        gamma_ok = r["gamma"] in (None, main_gamma)
        if (r["method"], r["temp"], r["prompt_set"]) == (method, temp, group):
            if gamma_ok and not r.get("fixed"):
                return r
    return None


def _spec_methods(rows: Sequence[dict], temp: float, main_gamma: int) -> List[dict]:
    """Main "all" rows of mlx-spec methods that accepted anything at ``temp``."""
    return [
        r
        for r in rows
        if r["prompt_set"] == ALL_PROMPTS
        and r["temp"] == temp
        and r["method"] not in BASELINES + PLAIN_METHODS
        and r["gamma"] in (None, main_gamma)
        and not r.get("fixed")
        and (r.get("tokens_per_target_forward") or 0.0) > NOTHING_ACCEPTED
        and r.get("speedup_vs_plain_geomean") is not None
    ]


def best_method(rows: Sequence[dict], temp: float, main_gamma: int) -> Measured:
    """The fastest mlx-spec method by geometric-mean speedup over mlx_lm."""
    spec = _spec_methods(rows, temp, main_gamma)
    if not spec:
        return None, f"no mlx-spec method accepted a draft token at temp {temp:g}"
    best = max(spec, key=lambda r: r["speedup_vs_plain_geomean"])
    return best["speedup_vs_plain_geomean"], best["method"]


def _best_vs_plain(temp: float) -> Callable:
    def measure(rows, main_gamma):
        value, method = best_method(rows, temp, main_gamma)
        if value is None:
            return None, method
        return value, f"best method: {method}"

    return measure


def _best_vs_spec(temp: float) -> Callable:
    def measure(rows, main_gamma):
        value, method = best_method(rows, temp, main_gamma)
        if value is None:
            return None, method
        row = _main(rows, method, temp, main_gamma, ALL_PROMPTS)
        ratio = row.get("speedup_vs_mlx_lm_speculative_geomean")
        if ratio is None:
            return None, f"{method}: mlx_lm_speculative did not run at temp {temp:g}"
        return (
            ratio,
            f"best method: {method}, paired with mlx_lm_speculative γ={main_gamma}",
        )

    return measure


def _field(method: str, temp: float, group: str, name: str) -> Callable:
    """A goal on one field of ``method``'s main row on prompt set ``group``."""

    def measure(rows, main_gamma):
        row = _main(rows, method, temp, main_gamma, group)
        if row is None:
            where = "" if group == ALL_PROMPTS else f" on the {group} set"
            return None, f"{method} did not run at temp {temp:g}{where}"
        value = row.get(name)
        return value, f"{method}, {name}" + ("" if value is not None else ": none")

    return measure


def _draft_best_gamma(rows, main_gamma) -> Measured:
    """Tokens per target forward of ``draft`` at its fastest γ (greedy)."""
    candidates = [
        r
        for r in rows
        if r["method"] == "draft"
        and r["temp"] == GREEDY
        and r["prompt_set"] == ALL_PROMPTS
        and r.get("speedup_vs_plain_geomean") is not None
    ]
    if not candidates:
        return None, "draft did not run greedy"
    best = max(candidates, key=lambda r: r["speedup_vs_plain_geomean"])
    control = "fixed" if best.get("fixed") else "adaptive"
    return best.get("tokens_per_target_forward_geomean"), (
        f"best γ={best['gamma']} ({control}, {best['speedup_vs_plain_geomean']:.2f}× "
        f"mlx_lm) of {len(candidates)} draft rows"
    )


def _auto_floor(temp: Optional[float] = None) -> Callable:
    """The lowest speedup of ``auto`` over the prompt sets at ``temp``
    (``None``: at every temperature)."""

    def measure(rows, main_gamma) -> Measured:
        sets = [
            r
            for r in rows
            if r["method"] == "auto"
            and r["prompt_set"] != ALL_PROMPTS
            and r["gamma"] in (None, main_gamma)
            and not r.get("fixed")
            and (temp is None or r["temp"] == temp)
        ]
        if not sets:
            where = "" if temp is None else f" at temp {temp:g}"
            return None, f"auto did not run{where}"
        if any(r["speedup_vs_plain"] is None for r in sets):
            return None, "auto has a prompt set without a paired speedup"
        low = min(sets, key=lambda r: r["speedup_vs_plain"])
        return low["speedup_vs_plain"], (
            f"lowest of {len(sets)}: {low['prompt_set']} at temp {low['temp']:g}"
        )

    return measure


def _eagle_beats_draft(rows, main_gamma) -> Measured:
    """On how many prompt sets ``eagle`` is faster than ``draft`` (greedy)."""
    eagle = {
        r["prompt_set"]: r
        for r in rows
        if r["method"] == "eagle"
        and r["temp"] == GREEDY
        and r["prompt_set"] != ALL_PROMPTS
        and not r.get("fixed")
        and r["gamma"] in (None, main_gamma)
    }
    if not eagle:
        return None, "eagle did not run greedy"
    wins, compared = 0, 0
    for group, e in eagle.items():
        d = _main(rows, "draft", GREEDY, main_gamma, group)
        if d is None or e["speedup_vs_plain"] is None or d["speedup_vs_plain"] is None:
            continue
        compared += 1
        wins += e["speedup_vs_plain"] > d["speedup_vs_plain"]
    if not compared:
        return None, "draft did not run greedy on eagle's prompt sets"
    return float(wins), f"eagle faster than draft on {wins} of {compared} sets"


GOALS: Tuple[Goal, ...] = (
    Goal(16, "greedy: best mlx-spec method ≥ 1.6× mlx_lm (geomean)", 1.6, _best_vs_plain(GREEDY)),
    Goal(16, "greedy: best mlx-spec method ≥ 1.3× mlx_lm speculative (geomean)", 1.3, _best_vs_spec(GREEDY)),
    Goal(16, "temp 0.7: best mlx-spec method ≥ 1.4× mlx_lm (geomean)", 1.4, _best_vs_plain(SAMPLED)),
    Goal(16, "temp 0.7: best mlx-spec method ≥ 1.5× mlx_lm speculative (geomean)", 1.5, _best_vs_spec(SAMPLED)),
    Goal(16, "draft: per-token acceptance ≥ 0.7, greedy, chat set", 0.7, _field("draft", GREEDY, CHAT_SET, "per_token_acceptance")),
    Goal(16, "draft: tokens per target forward ≥ 2.5 at its best γ (greedy, geomean)", 2.5, _draft_best_gamma),
    Goal(16, "auto ≥ 0.95× mlx_lm on every prompt set (every temperature)", 0.95, _auto_floor()),
    Goal(17, "eagle: tokens per target forward ≥ 3.0, greedy, chat set", 3.0, _field("eagle", GREEDY, CHAT_SET, "tokens_per_target_forward")),
    Goal(17, "eagle ≥ 1.8× mlx_lm, greedy (geomean)", 1.8, _field("eagle", GREEDY, ALL_PROMPTS, "speedup_vs_plain_geomean")),
    Goal(17, "eagle faster than draft on ≥ 3 of 4 prompt sets (greedy)", 3.0, _eagle_beats_draft),
    Goal(17, "medusa ≥ 1.4× mlx_lm, greedy (geomean)", 1.4, _field("medusa", GREEDY, ALL_PROMPTS, "speedup_vs_plain_geomean")),
    Goal(17, "temp 0.7: eagle ≥ 1.5× mlx_lm (geomean)", 1.5, _field("eagle", SAMPLED, ALL_PROMPTS, "speedup_vs_plain_geomean")),
    Goal(36, "greedy: auto ≥ 1.5× mlx_lm (geomean)", 1.5, _field("auto", GREEDY, ALL_PROMPTS, "speedup_vs_plain_geomean")),
    Goal(36, "greedy: auto ≥ 1.3× mlx_lm, chat set", 1.3, _field("auto", GREEDY, CHAT_SET, "speedup_vs_plain")),
    Goal(36, "greedy: auto ≥ 1.0× mlx_lm on every prompt set", 1.0, _auto_floor(GREEDY)),
    Goal(36, "temp 0.7: auto ≥ 1.3× mlx_lm (geomean)", 1.3, _field("auto", SAMPLED, ALL_PROMPTS, "speedup_vs_plain_geomean")),
    Goal(36, "eagle: tokens per target forward ≥ 2.5, greedy, chat set", 2.5, _field("eagle", GREEDY, CHAT_SET, "tokens_per_target_forward")),
)  # fmt: skip


def check_goals(
    rows: Sequence[dict], main_gamma: int, goals: Sequence[Goal] = GOALS
) -> List[Dict]:
    """Every goal with its measured value and verdict.

    Returns:
        One dict per goal: ``issue``, ``goal``, ``threshold``, ``measured``
        (``None`` when not run), ``status`` (``met``/``missed``/``not run``),
        ``detail`` and, when missed, ``shortfall`` (``measured / threshold``).
    """
    out = []
    for goal in goals:
        value, detail = goal.measure(rows, main_gamma)
        if value is None:
            status = NOT_RUN
        else:
            status = MET if value >= goal.threshold else MISSED
        item = {
            "issue": goal.issue,
            "goal": goal.text,
            "threshold": goal.threshold,
            "measured": value,
            "status": status,
            "detail": detail,
        }
        if status == MISSED:
            item["shortfall"] = value / goal.threshold
        out.append(item)
    return out
