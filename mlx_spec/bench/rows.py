"""Measuring: result rows from the raw runs.

Each row aggregates the runs of one (method, temperature, γ), over all prompts
and per prompt set: throughput, paired speedups (each run over its block's
plain ``mlx_lm`` runs, median over blocks), acceptance, tokens per target
forward, the implementation overhead (each round's time over the bare cost
of its forwards, :class:`mlx_spec.bench.measure.BareCosts`) and greedy identity.
Also here: the noise floor, the loud warnings and the labelled projection to
real target shapes. Every quantity is defined in :data:`DEFINITIONS`.
"""

import math
import statistics
from typing import Dict, List, Optional, Sequence

from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS

from .measure import BareCosts, interpolate
from .prompts import PROMPT_SETS
from .runner import MLX_LM_SPECULATIVE, PLAIN, PLAIN_METHODS, SWEEP_METHODS, Run

# Plain mlx_lm's overhead outside 1 ± this: the overhead column is suspect.
CALIBRATION_TOLERANCE = 0.15
# Tokens per target forward at or below this: nothing was accepted.
NOTHING_ACCEPTED = 1.0 + 1e-9
ALL_PROMPTS = "all"
# Draft positions reported in acceptance by position.
MAX_POSITIONS = 8
# Fields of an "all" row also given as the geometric mean of its prompt sets' rows.
GEOMEAN_FIELDS = (
    "speedup_vs_plain",
    "speedup_vs_plain_e2e",
    "speedup_vs_mlx_lm_speculative",
    "tokens_per_target_forward",
    "per_token_acceptance",
)
REQUIRED_ROW_KEYS = (
    "method",
    "temp",
    "prompt_set",
    "gamma",
    "repeats",
    "tokens_per_s",
    "decode_tokens_per_s",
    "speedup_vs_plain",
    "acceptance_rate",
    "tokens_per_target_forward",
    "peak_memory_gb",
    "memory_increase_gb",
    "overhead",
)
DEFINITIONS = {
    "tokens_per_s": "end to end: generated tokens / wall time from the call to the "
    "last token, summed over all runs of the row (prompt processing included)",
    "decode_tokens_per_s": "decode only: tokens generated after the first round / "
    "time from the first token to the last, summed over all runs of the row",
    "speedup_vs_plain": "paired, decode only: per block (one prompt, repeat, "
    "temp and draw), a run's decode tokens/s over the mean of the block's two "
    "mlx_lm runs (run first and last in the block); the median over blocks. "
    "1 for mlx_lm",
    "speedup_vs_plain_e2e": "the same with end-to-end tokens/s",
    "speedup_vs_mlx_lm_speculative": "paired, decode only: over the "
    "mlx_lm_speculative run of the same block and gamma; median over blocks",
    "acceptance_rate": "accepted draft tokens / drafted tokens (mlx_lm_speculative: "
    "from_draft tokens / drafted tokens, drafted = min(gamma, tokens left) per round)",
    "tokens_per_target_forward": "generated tokens / target forwards (verification rounds)",
    "per_token_acceptance": "accepted draft tokens / (accepted draft tokens + "
    "rounds that rejected a drafted token): the chance that the next draft token "
    "is accepted, given that the ones before it were (the alpha of a geometric "
    "acceptance model; a tree counts its accepted depth)",
    "acceptance_by_position": "for draft position k = 1, 2, ...: rounds that "
    "accepted token k / rounds that drafted at least k tokens and accepted the "
    "k - 1 before it. Trees: k is the depth, and a round counts as having "
    "drafted k when its tree has at least k nodes (a lower bound past its depth)",
    "fixed": "adaptive control off: gamma stays fixed (the gamma sweep's rows of "
    "mlx-spec methods); false for the methods' defaults",
    "*_geomean": "on the 'all' rows: the geometric mean of the field over the "
    "prompt sets' rows (null when a set has no value)",
    "draft_time_share": "profiled pass (a separate run of every prompt with an "
    "extra sync per round): seconds spent drafting / decode seconds, summed over "
    "the prompts. verify_time_share: verification forward and its sync. "
    "host_time_share: the rest (acceptance on the host, cache commits, yielding, "
    "detokenizing, Python). Null for mlx_lm's own modes",
    "overhead": "median over rounds 2.. of all runs of the row of: round time / "
    "(forwards * D(drafted / forwards) + T(drafted + 1)), where T and D are the "
    "target's and the draft's bare forward times against width w: medians of "
    "samples at the widths used, a + b*w between sampled neighbours. A sample is "
    "the steady-state time per forward of a chain of pipelined forwards (as mlx_lm "
    "decodes) on a cache of typical length; one is taken after every run. A "
    "round's time runs from its first yielded token to the next round's. Plain "
    "mlx_lm is the calibration (~1.0); null where the draft cost is unknown "
    "(self-speculation)",
    "draft_step_cost": "measured online by the engine (greedy runs: wall time; "
    "sampled runs: the fixed cost model, so a seed gives the same text): one "
    "draft forward of the arm that ran the most of them, in 1-token target "
    "forwards; median over runs. verify_cost_n: a target forward of n tokens "
    "over one of 1 token, fitted from the rounds' own times; target_step_ms: a "
    "plain round (1-token forward and host work) in milliseconds",
    "peak_memory_gb": "largest peak memory of a run (mx peak memory reset just "
    "before each run; includes the weights)",
    "memory_increase_gb": "largest increase of a run: its peak memory minus the "
    "active memory just before it (KV caches and activations of the method)",
    "greedy_identical": "at temp 0: fraction of runs whose tokens equal the tokens "
    "of the first mlx_lm run of the same block",
    "projected_speedup": "PROJECTION, not a measurement: measured tokens per target "
    "forward combined with measured forward costs of random-weight models of real "
    "shapes, assuming zero implementation overhead",
}


def round_ratios(run: Run, costs: Optional[BareCosts]) -> List[float]:
    """Each timed round's time over its bare cost (empty when unknown)."""
    if costs is None or not run.draft_cost_known:
        return []
    out = []
    for t, d, f in zip(run.round_s, run.round_drafted, run.round_forwards):
        bare = costs.round(d, f)
        if bare is None:
            return []
        if bare > 0:
            out.append(t / bare)
    return out


def acceptance_by_position(
    accepted: Sequence[int], drafted: Sequence[int], positions: int = MAX_POSITIONS
) -> List[Optional[float]]:
    """Acceptance of draft token ``k``, given the ``k - 1`` before it, for ``k = 1..``.

    Args:
        accepted: Accepted draft tokens of each round that drafted.
        drafted: Drafted tokens of the same rounds.
        positions: Positions to report. Default: ``MAX_POSITIONS``.

    Returns:
        ``positions`` rates, ``None`` where no round reached the position.
    """
    out = []
    for k in range(1, positions + 1):
        reached = sum(1 for n, d in zip(accepted, drafted) if d >= k and n >= k - 1)
        passed = sum(1 for n, d in zip(accepted, drafted) if d >= k and n >= k)
        out.append(passed / reached if reached else None)
    return out


def per_token_acceptance(
    accepted: Sequence[int], drafted: Sequence[int]
) -> Optional[float]:
    """Accepted tokens / (accepted tokens + rounds that rejected one)."""
    total = sum(accepted)
    rejections = sum(1 for n, d in zip(accepted, drafted) if n < d)
    return _ratio(total, total + rejections)


def measured_costs(runs: Sequence[Run]) -> dict:
    """Medians over runs of the cost model each measured: the draft step of
    its most used drafting arm and verification of 2, 4 and 8 tokens, each in
    1-token target forwards, and that forward in milliseconds."""
    models = [r.cost_model for r in runs if r.cost_model]
    steps = []
    for m in models:
        used = {a: n for a, n in (m.get("forwards") or {}).items() if n}
        if used and max(used, key=used.get) in m["draft_step"]:
            steps.append(m["draft_step"][max(used, key=used.get)])
    verify = {w: _median([m["verify_by_width"][w] for m in models]) for w in (2, 4, 8)}
    return {
        "draft_step_cost": _median(steps),
        "verify_cost_2": verify[2],
        "verify_cost_4": verify[4],
        "verify_cost_8": verify[8],
        "target_step_ms": _median([1e3 * m["step_s"] for m in models]),
    }


def geomean(values: Sequence[Optional[float]]) -> Optional[float]:
    """Geometric mean; ``None`` when any value is missing or none is given."""
    if not values or any(v is None for v in values):
        return None
    if any(v <= 0 for v in values):
        return 0.0
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or not b:
        return None
    return a / b


def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _sum_ratio(runs, num, den) -> Optional[float]:
    return _ratio(sum(num(r) for r in runs), sum(den(r) for r in runs))


def aggregate(
    runs: Sequence[Run], group: str, repeats: int, costs: Optional[BareCosts]
) -> dict:
    """One result row from the runs of one configuration on prompt set ``group``."""
    first = runs[0]
    tokens = sum(len(r.tokens) for r in runs)
    wall = sum(r.wall_s for r in runs)
    decode_tokens = sum(r.decode_tokens for r in runs)
    decode_s = sum(r.decode_s for r in runs)
    per_repeat = {}
    for r in runs:
        n, t = per_repeat.get(r.repeat, (0, 0.0))
        per_repeat[r.repeat] = (n + r.decode_tokens, t + r.decode_s)
    repeat_tps = [n / t for n, t in per_repeat.values() if t > 0]
    plain = first.method in PLAIN_METHODS
    rounds = sum(r.rounds for r in runs)
    accepted = sum(r.accepted for r in runs)
    ratios = [x for r in runs for x in round_ratios(r, costs)]
    round_accepted = [n for r in runs for n in r.accepted_per_round]
    round_drafted = [d for r in runs for d in r.drafted_per_round]
    return {
        "method": first.method,
        "temp": first.temp,
        "gamma": first.gamma,
        "fixed": first.fixed,
        "prompt_set": group,
        "repeats": repeats,
        "runs": len(runs),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "decode_tokens_per_s": _ratio(decode_tokens, decode_s),
        "decode_tokens_per_s_stdev": (
            statistics.stdev(repeat_tps) if len(repeat_tps) > 1 else None
        ),
        "speedup_vs_plain": None,
        "speedup_vs_plain_e2e": None,
        "speedup_vs_mlx_lm_speculative": None,
        "pairs": 0,
        "acceptance_rate": (
            None
            if plain
            else _sum_ratio(runs, lambda r: r.accepted, lambda r: r.drafted)
        ),
        "tokens_per_target_forward": _ratio(tokens, rounds) or 0.0,
        "per_token_acceptance": (
            None if plain else per_token_acceptance(round_accepted, round_drafted)
        ),
        "acceptance_by_position": (
            None if plain else acceptance_by_position(round_accepted, round_drafted)
        ),
        "accepted_per_round": None if plain else _ratio(accepted, rounds),
        "draft_forwards_per_round": _ratio(sum(r.draft_forwards for r in runs), rounds),
        "verify_width": (
            _sum_ratio(runs, lambda r: r.drafted, lambda r: r.rounds) or 0.0
        )
        + 1,
        "overhead": _median(ratios),
        "rounds_timed": len(ratios),
        "round_s_median": _median([t for r in runs for t in r.round_s]),
        "peak_memory_gb": max(r.peak_memory_gb for r in runs),
        "memory_increase_gb": max(r.memory_increase_gb for r in runs),
        "ttft_s": statistics.median(r.ttft_s for r in runs),
        "greedy_identical": None,
        "draft_cost_known": first.draft_cost_known,
        "draft_time_share": None,
        "verify_time_share": None,
        "host_time_share": None,
        "profiled_round_ms": None,
        "profiled_prompts": 0,
        **measured_costs(runs),
    }


class Blocks:
    """The runs indexed by block, for paired ratios and greedy identity."""

    def __init__(self, runs: Sequence[Run]):
        self._index: Dict[tuple, List[Run]] = {}
        for r in runs:
            key = (r.block, r.method, r.gamma, r.fixed)
            self._index.setdefault(key, []).append(r)

    def ratio(self, run: Run, method: str, gamma, metric) -> Optional[float]:
        """``metric(run)`` over the mean ``metric`` of ``method``'s runs in its block.

        ``method`` runs with its default control (not a fixed-γ sweep row).
        """
        base = self._index.get((run.block, method, gamma, False), [])
        base = [metric(b) for b in base]
        base = [v for v in base if v]
        return _ratio(metric(run), statistics.fmean(base) if base else None)

    def reference(self, run: Run) -> Optional[List[int]]:
        """The tokens of the block's first mlx_lm run."""
        plain = self._index.get((run.block, PLAIN, None, False))
        return min(plain, key=lambda r: r.position).tokens if plain else None


def _decode_tps(run: Run) -> Optional[float]:
    return run.decode_tokens_per_s


def _e2e_tps(run: Run) -> Optional[float]:
    return run.tokens_per_s


def _fill_paired(row: dict, runs: Sequence[Run], blocks: Blocks, main_gamma) -> None:
    """Paired speedups (median over blocks) and greedy identity of one row."""
    method, gamma = row["method"], row["gamma"]
    spec_gamma = gamma if gamma is not None else main_gamma
    vs_plain = [blocks.ratio(r, PLAIN, None, _decode_tps) for r in runs]
    vs_plain_e2e = [blocks.ratio(r, PLAIN, None, _e2e_tps) for r in runs]
    vs_spec = [
        blocks.ratio(r, MLX_LM_SPECULATIVE, spec_gamma, _decode_tps) for r in runs
    ]
    row["pairs"] = sum(v is not None for v in vs_plain)
    row["speedup_vs_plain"] = 1.0 if method == PLAIN else _median(vs_plain)
    row["speedup_vs_plain_e2e"] = 1.0 if method == PLAIN else _median(vs_plain_e2e)
    row["speedup_vs_mlx_lm_speculative"] = (
        1.0 if method == MLX_LM_SPECULATIVE else _median(vs_spec)
    )
    if row["temp"] == 0:
        same = [
            r.tokens == ref for r in runs if (ref := blocks.reference(r)) is not None
        ]
        row["greedy_identical"] = sum(same) / len(same) if same else None


def build_rows(
    runs: Sequence[Run],
    repeats: int,
    costs: Optional[BareCosts],
    main_gamma: int = DEFAULT_NUM_DRAFT_TOKENS,
) -> List[dict]:
    """Rows per configuration over all prompts and per prompt set.

    The "all" rows also get the geometric mean of their prompt sets' rows
    (:data:`GEOMEAN_FIELDS`, suffix ``_geomean``).
    """
    configs: Dict[tuple, List[Run]] = {}
    for r in runs:
        configs.setdefault((r.method, r.temp, r.gamma, r.fixed), []).append(r)
    blocks = Blocks(runs)
    rows = []
    for config_runs in configs.values():
        groups = {ALL_PROMPTS: config_runs}
        for r in config_runs:
            groups.setdefault(r.prompt_set, []).append(r)
        for group, group_runs in groups.items():
            row = aggregate(group_runs, group, repeats, costs)
            _fill_paired(row, group_runs, blocks, main_gamma)
            rows.append(row)
    add_geomeans(rows)
    order = {name: i for i, name in enumerate((ALL_PROMPTS,) + PROMPT_SETS)}
    rows.sort(
        key=lambda r: (
            order.get(r["prompt_set"], len(order)),
            r["prompt_set"],
            r["temp"],
            r["gamma"] or 0,
            r["fixed"],
        )
    )
    return rows


def row_key(row: dict) -> tuple:
    """``(method, temp, γ, fixed)``: the configuration a row belongs to."""
    return row["method"], row["temp"], row["gamma"], row["fixed"]


def add_geomeans(rows: Sequence[dict]) -> None:
    """Give each "all" row the geometric mean of its prompt sets' rows."""
    by_config: Dict[tuple, List[dict]] = {}
    for r in rows:
        if r["prompt_set"] != ALL_PROMPTS:
            by_config.setdefault(row_key(r), []).append(r)
    for r in rows:
        if r["prompt_set"] != ALL_PROMPTS:
            continue
        sets = by_config.get(row_key(r), [])
        r["prompt_sets"] = len(sets)
        for name in GEOMEAN_FIELDS:
            r[f"{name}_geomean"] = geomean([s[name] for s in sets])


def add_time_split(rows: Sequence[dict], profiles: Sequence[dict]) -> None:
    """Fill each row's time shares from the profiled pass.

    Args:
        rows: Result rows (changed in place).
        profiles: One dict per profiled generation: ``method``, ``temp``,
            ``gamma``, ``fixed``, ``prompt_set`` and seconds of ``generation``,
            ``draft``, ``verify`` and ``host`` work, and ``rounds``.
    """
    for row in rows:
        mine = [
            p
            for p in profiles
            if (p["method"], p["temp"], p["gamma"], p["fixed"]) == row_key(row)
            and row["prompt_set"] in (ALL_PROMPTS, p["prompt_set"])
        ]
        total = sum(p["generation"] for p in mine)
        if not mine or total <= 0:
            continue
        for part in ("draft", "verify", "host"):
            row[f"{part}_time_share"] = sum(p[part] for p in mine) / total
        rounds = sum(p["rounds"] for p in mine)
        row["profiled_round_ms"] = 1e3 * total / rounds if rounds else None
        row["profiled_prompts"] = len(mine)


def plain_drift(runs: Sequence[Run]) -> Optional[float]:
    """Median over blocks of |second mlx_lm run / first - 1| in decode tokens/s.

    The two baseline runs of a block are the same work, so this is the noise
    floor of the paired speedups.
    """
    by_block: Dict[int, List[Run]] = {}
    for r in runs:
        if r.method == PLAIN:
            by_block.setdefault(r.block, []).append(r)
    drifts = []
    for pair in by_block.values():
        pair.sort(key=lambda r: r.position)
        if len(pair) >= 2:
            a, b = pair[0].decode_tokens_per_s, pair[-1].decode_tokens_per_s
            if a and b:
                drifts.append(abs(b / a - 1))
    return _median(drifts)


def check_rows(rows: Sequence[dict]) -> List[str]:
    """Loud warnings: greedy output that differs from mlx_lm, bad calibration."""
    warnings = []
    for r in rows:
        if r["prompt_set"] != ALL_PROMPTS:
            continue
        same = r.get("greedy_identical")
        if r["temp"] == 0 and same is not None and same < 1:
            who = r["method"]
            if r["gamma"] is not None:
                who += f" (γ={r['gamma']}{', fixed' if r.get('fixed') else ''})"
            warnings.append(
                f"GREEDY MISMATCH: {who} at temp 0 produced mlx_lm's tokens in only "
                f"{same:.0%} of its runs; exact decoding must give 100%."
            )
        if r["method"] == PLAIN and r.get("overhead") is not None:
            if abs(r["overhead"] - 1) > CALIBRATION_TOLERANCE:
                warnings.append(
                    f"OVERHEAD CALIBRATION: plain mlx_lm at temp {r['temp']:g} comes out "
                    f"at {r['overhead']:.2f} (expected ~1.00): the overhead column of "
                    "this run is unreliable (a very busy machine?)."
                )
    return warnings


# --------------------------------------------------------------------------- #
# Projection
# --------------------------------------------------------------------------- #


def project(
    rows: Sequence[dict], curves: Dict[str, dict], pair_draft_ratio: Optional[float]
):
    """PROJECTED speedups for real target shapes from measured acceptance.

    For each measured speculative row over all prompts, and each target shape
    with a measured cost curve ``T(w)``:
    ``speedup = E * T(1) / (d * t_draft + T(w))`` with ``E`` the measured
    tokens per target forward, ``d`` the draft forwards per round and ``w``
    the mean verified width. The draft cost is either a measured smaller shape
    (Qwen2.5-0.5B drafting for 1.5B) or ``T(1)`` times the draft/target cost
    ratio of the benchmarked pair. Implementation overhead is assumed zero.
    """
    names = list(curves)
    out = []
    for row in rows:
        if row["prompt_set"] != ALL_PROMPTS or row["method"] in PLAIN_METHODS:
            continue
        if not row["draft_cost_known"]:
            continue
        d = row["draft_forwards_per_round"] or 0.0
        w = row["verify_width"]
        e = row["tokens_per_target_forward"]
        for i, target in enumerate(names):
            c = curves[target]
            t1 = c["forward_s"][0]
            tw = interpolate(c["widths"], c["forward_s"], w)
            drafts = []
            if d == 0:
                drafts.append(("none (draft-free)", 0.0))
            else:
                for smaller in names[:i]:
                    drafts.append(
                        (f"{smaller} (random weights)", curves[smaller]["forward_s"][0])
                    )
                if pair_draft_ratio is not None:
                    drafts.append(
                        (
                            f"cost ratio of the benchmarked pair ({pair_draft_ratio:.3f})",
                            pair_draft_ratio * t1,
                        )
                    )
            for draft_name, t_draft in drafts:
                out.append(
                    {
                        "kind": "projected",
                        "target_shape": target,
                        "draft_cost": draft_name,
                        "method": row["method"],
                        "temp": row["temp"],
                        "gamma": row["gamma"],
                        "measured_tokens_per_target_forward": e,
                        "verify_width": w,
                        "draft_forwards_per_round": d,
                        "projected_speedup": e * t1 / (d * t_draft + tw),
                    }
                )
    return out


def overhead_calibration(rows: Sequence[dict]) -> Dict[str, Optional[float]]:
    """Plain mlx_lm's overhead per temperature (1.0 when the method is sound)."""
    return {
        f"{r['temp']:g}": r["overhead"]
        for r in rows
        if r["method"] == PLAIN and r["prompt_set"] == ALL_PROMPTS
    }


def main_rows(results: dict) -> List[dict]:
    """Rows over all prompts at the main γ, default control (the sweep left out)."""
    main_gamma = results["settings"]["num_draft_tokens"]
    return [
        r
        for r in results["rows"]
        if r["prompt_set"] == ALL_PROMPTS
        and r["gamma"] in (None, main_gamma)
        and not r.get("fixed")
    ]


def sweep_rows(results: dict) -> List[dict]:
    """Rows over all prompts of the methods the γ sweep runs, at every γ."""
    return [
        r
        for r in results["rows"]
        if r["prompt_set"] == ALL_PROMPTS
        and r["method"] in SWEEP_METHODS
        and r["gamma"] is not None
    ]
