"""Benchmark mlx-spec against mlx-lm, side by side, in one process.

Usage::

    python -m benchmarks.run --quick --out bench_out
    python -m benchmarks.run --model mlx-community/Qwen2.5-7B-Instruct-4bit \\
        --draft-model mlx-community/Qwen2.5-0.5B-Instruct-4bit --out bench_out

Every method sees the same models, prompts, seeds and token budget:
``mlx_lm`` (plain ``mlx_lm.generate.stream_generate``), ``mlx_lm_speculative``
(mlx-lm's own speculative mode, same draft and γ) and every mlx-spec method
that exists (``mlx_spec.config.METHODS``, discovered at run time). Warm-up
runs come first; repetitions are interleaved, with the method order rotated
per prompt, so machine noise hits all methods alike.

Definitions (also written to ``results.json``):

* ``tokens_per_s``: generated tokens / wall time from the call to the last
  token, summed over runs (prompt processing included, the same for all).
* ``speedup_vs_plain``: ``tokens_per_s`` / that of ``mlx_lm`` at the same
  temperature on the same prompts.
* ``overhead``: time of a decoding round / the bare forward times of its
  parts (draft 1-token steps plus one target forward of the verified width),
  all measured in this run. 1.0 means no cost beyond the model forwards.
"""

# isort: off
import mlx_spec  # noqa: F401  (must precede mlx: it preloads OpenBLAS)

# isort: on

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import stream_generate as mlx_lm_stream_generate
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from mlx_spec import stream_generate as spec_stream_generate
from mlx_spec._blas import blas_in_use
from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS, METHODS
from mlx_spec.loading import default_model_pair, load_pair

from .measure import (
    QWEN2_SHAPES,
    ForwardTimer,
    cost_curves,
    interpolate,
    load_cost_curves,
)
from .progress import Progress
from .prompts import PROMPT_SETS, Prompt, prompt_suite

PLAIN = "mlx_lm"
MLX_LM_SPECULATIVE = "mlx_lm_speculative"
BASELINES = (PLAIN, MLX_LM_SPECULATIVE)
# Methods with no draft step: their γ is meaningless and recorded as None.
PLAIN_METHODS = (PLAIN, "none")
DEFAULT_TEMPS = (0.0, 0.7)
DEFAULT_MAX_TOKENS = 96
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1
DEFAULT_SEED = 0
DEFAULT_OUT = "bench_out"
DEFAULT_GAMMA_SWEEP = (1, 2, 3, 4, 6, 8)
QUICK_MAX_TOKENS = 64
QUICK_REPEATS = 1
WARMUP_MAX_TOKENS = 16
BARE_SAMPLES_PER_PASS = 5
ALL_PROMPTS = "all"
REQUIRED_ROW_KEYS = (
    "method",
    "temp",
    "prompt_set",
    "gamma",
    "repeats",
    "tokens_per_s",
    "speedup_vs_plain",
    "acceptance_rate",
    "tokens_per_target_forward",
    "peak_memory_gb",
    "overhead",
)
DEFINITIONS = {
    "tokens_per_s": "generated tokens / wall time from the call to the last token, "
    "summed over all runs of the row (prompt processing included)",
    "speedup_vs_plain": "tokens_per_s / tokens_per_s of mlx_lm, same temp and prompts",
    "speedup_vs_mlx_lm_speculative": "tokens_per_s / that of mlx_lm_speculative, "
    "same temp, prompts and gamma",
    "acceptance_rate": "accepted draft tokens / drafted tokens (mlx_lm_speculative: "
    "from_draft tokens / (rounds * gamma), an estimate)",
    "tokens_per_target_forward": "generated tokens / target forwards (verification rounds)",
    "overhead": "mean round time / (draft forwards per round * bare 1-token draft "
    "forward + bare target forward of the verified width), bare forwards measured "
    "in this run on a cache of typical length; null where the draft cost is unknown",
    "greedy_identical": "at temp 0: fraction of runs whose tokens equal mlx_lm's",
    "projected_speedup": "PROJECTION, not a measurement: measured tokens per target "
    "forward combined with measured forward costs of random-weight models of real "
    "shapes, assuming zero implementation overhead",
}


# --------------------------------------------------------------------------- #
# One generation
# --------------------------------------------------------------------------- #


@dataclass
class Run:
    """Counters and timings of one generation.

    ``loop_time`` / ``loop_rounds`` is the mean round time used for the
    overhead; ``draft_forwards`` / ``rounds`` and ``verify_width`` describe
    what a round costs in bare forwards.
    """

    method: str
    temp: float
    gamma: Optional[int]
    prompt: str
    prompt_set: str
    repeat: int
    tokens: List[int]
    wall_s: float
    ttft_s: float
    rounds: int
    accepted: int
    drafted: int
    draft_forwards: int
    loop_time: float
    loop_rounds: int
    peak_memory_gb: float
    reported_tps: float
    draft_cost_known: bool = True

    @property
    def verify_width(self) -> float:
        """Mean tokens per verification forward (drafts + 1)."""
        return self.drafted / self.rounds + 1 if self.rounds else 1.0


@dataclass
class Setup:
    """Loaded models and run settings shared by every generation."""

    model: Any
    tokenizer: Any
    draft: Any
    max_tokens: int
    method_options: Dict[str, Any] = field(default_factory=dict)


def _consume(make_stream):
    """Create and drain a response stream, timing from before its creation.

    Returns:
        ``(stream, tokens, wall seconds, ttft, first-to-last seconds, last response)``;
        the EOS token of a ``"stop"`` finish is not counted.
    """
    tic = time.perf_counter()
    stream = make_stream()
    first = last = None
    tokens, response = [], None
    for response in stream:
        now = time.perf_counter()
        first = first if first is not None else now
        last = now
        if response.finish_reason != "stop":
            tokens.append(int(response.token))
    end = time.perf_counter()
    first = first if first is not None else end
    last = last if last is not None else end
    return stream, tokens, end - tic, first - tic, last - first, response


def run_mlx_lm(setup: Setup, ids, temp, gamma, seed, *, speculative: bool) -> dict:
    """One generation with mlx-lm's own ``stream_generate``."""
    mx.random.seed(seed)
    kwargs = dict(max_tokens=setup.max_tokens, sampler=mlx_lm_make_sampler(temp))
    if speculative:
        kwargs.update(draft_model=setup.draft, num_draft_tokens=gamma)
    mx.reset_peak_memory()
    from_draft = []

    def tagged():
        stream = mlx_lm_stream_generate(setup.model, setup.tokenizer, ids, **kwargs)
        for response in stream:
            from_draft.append(bool(response.from_draft))
            yield response

    _, tokens, wall, ttft, span, last = _consume(tagged)
    n = len(tokens)
    from_draft = from_draft[:n]
    if speculative:
        rounds = max(sum(not f for f in from_draft), 1)
        accepted = sum(from_draft)
        # A round's first yield ends it for the timing span: rounds 2..R fall in it.
        loop_rounds, drafted, draft_forwards = (
            rounds - 1,
            rounds * gamma,
            rounds * gamma,
        )
    else:
        rounds, accepted, drafted, draft_forwards = n, 0, 0, 0
        loop_rounds = n - 1
    return dict(
        tokens=tokens,
        wall_s=wall,
        ttft_s=ttft,
        rounds=rounds,
        accepted=accepted,
        drafted=drafted,
        draft_forwards=draft_forwards,
        loop_time=span,
        loop_rounds=loop_rounds,
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        reported_tps=float(last.generation_tps) if last is not None else 0.0,
    )


def run_mlx_spec(
    setup: Setup, method, ids, temp, gamma, seed, *, use_draft=True
) -> dict:
    """One generation with ``mlx_spec.stream_generate`` and method ``method``."""
    mx.reset_peak_memory()
    make_stream = functools.partial(
        spec_stream_generate,
        setup.model,
        setup.tokenizer,
        ids,
        setup.draft if use_draft else None,
        speculative=method,
        num_draft_tokens=gamma or DEFAULT_NUM_DRAFT_TOKENS,
        temp=temp,
        max_tokens=setup.max_tokens,
        seed=seed,
        **setup.method_options,
    )
    stream, tokens, wall, ttft, _, _ = _consume(make_stream)
    stats = stream.stats
    rounds = stats.rounds
    # Plain decoding times from the first token on: one round fewer.
    loop_rounds = rounds - 1 if method == "none" else rounds
    return dict(
        tokens=tokens,
        wall_s=wall,
        ttft_s=ttft,
        rounds=rounds,
        accepted=stats.accepted_tokens,
        drafted=stats.draft_tokens,
        draft_forwards=stats.draft_forwards,
        loop_time=stats.generation_time,
        loop_rounds=loop_rounds,
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        reported_tps=stats.generation_tps,
        # Self-speculation drafts with part of the target: no bare draft cost.
        draft_cost_known=stats.method != "self" and method != "self",
    )


def generate_once(setup: Setup, method, ids, temp, gamma, seed, uses_draft) -> dict:
    if method == PLAIN:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=False)
    if method == MLX_LM_SPECULATIVE:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=True)
    return run_mlx_spec(setup, method, ids, temp, gamma, seed, use_draft=uses_draft)


# --------------------------------------------------------------------------- #
# Method discovery
# --------------------------------------------------------------------------- #


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def discover_methods(setup: Setup, ids) -> tuple:
    """Try each mlx-spec method on a 2-token generation.

    Returns:
        ``(uses_draft, skipped)``: method -> whether it runs with the draft
        model passed, and method -> why it was skipped.
    """
    uses_draft, skipped = {}, {}
    saved = setup.max_tokens
    setup.max_tokens = 2
    try:
        for method in METHODS:
            attempts = [True, False] if setup.draft is not None else [False]
            for with_draft in attempts:
                try:
                    run_mlx_spec(setup, method, ids, 0.0, None, 0, use_draft=with_draft)
                except Exception as e:  # a method still being written
                    skipped[method] = _first_line(e)
                    if "not available" in str(e):
                        break
                    continue
                uses_draft[method] = with_draft
                skipped.pop(method, None)
                break
    finally:
        setup.max_tokens = saved
    return uses_draft, skipped


# --------------------------------------------------------------------------- #
# Aggregation
# --------------------------------------------------------------------------- #


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or not b:
        return None
    return a / b


def _round_cost(run: Run, timer: ForwardTimer, setup: Setup) -> Optional[float]:
    """Bare seconds of one round of ``run``: its draft steps plus its verification."""
    if not run.rounds or not run.draft_cost_known:
        return None
    draft_steps = run.draft_forwards / run.rounds
    cost = timer("target", setup.model, run.verify_width)
    if draft_steps:
        if setup.draft is None:
            return None
        cost += draft_steps * timer("draft", setup.draft, 1)
    return cost


def _sample_bare_forwards(
    timer: ForwardTimer, setup: Setup, runs: Sequence[Run], n: int
):
    """Add ``n`` timings of every bare forward the rounds of ``runs`` are made of."""
    needed = set()
    for r in runs:
        if not r.rounds or not r.draft_cost_known:
            continue
        w = r.verify_width
        needed.update({("target", max(int(w), 1)), ("target", max(math.ceil(w), 1))})
        if r.draft_forwards and setup.draft is not None:
            needed.add(("draft", 1))
    for name, width in sorted(needed):
        timer.sample(name, setup.model if name == "target" else setup.draft, width, n)


def aggregate(
    runs: Sequence[Run],
    group: str,
    repeats: int,
    round_costs: Dict[int, Optional[float]],
) -> dict:
    """One result row from the runs of one (method, temp, γ) on prompt set ``group``."""
    first = runs[0]
    tokens = sum(len(r.tokens) for r in runs)
    wall = sum(r.wall_s for r in runs)
    per_repeat = {}
    for r in runs:
        n, t = per_repeat.get(r.repeat, (0, 0.0))
        per_repeat[r.repeat] = (n + len(r.tokens), t + r.wall_s)
    repeat_tps = [n / t for n, t in per_repeat.values() if t > 0]
    plain = first.method in PLAIN_METHODS
    drafted = sum(r.drafted for r in runs)
    rounds = sum(r.rounds for r in runs)
    costs = [round_costs.get(id(r)) for r in runs]
    overhead = None
    if all(c is not None for c in costs):
        bare = sum(c * r.loop_rounds for c, r in zip(costs, runs))
        overhead = _ratio(sum(r.loop_time for r in runs), bare)
    return {
        "method": first.method,
        "temp": first.temp,
        "gamma": first.gamma,
        "prompt_set": group,
        "repeats": repeats,
        "runs": len(runs),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "tokens_per_s_stdev": (
            statistics.stdev(repeat_tps) if len(repeat_tps) > 1 else 0.0
        ),
        "speedup_vs_plain": None,
        "speedup_vs_mlx_lm_speculative": None,
        "acceptance_rate": (
            None if plain else _ratio(sum(r.accepted for r in runs), drafted)
        ),
        "tokens_per_target_forward": _ratio(tokens, rounds) or 0.0,
        "accepted_per_round": (
            None if plain else _ratio(sum(r.accepted for r in runs), rounds)
        ),
        "draft_forwards_per_round": _ratio(sum(r.draft_forwards for r in runs), rounds),
        "verify_width": _ratio(drafted, rounds) + 1 if rounds else 1.0,
        "overhead": overhead,
        "peak_memory_gb": max(r.peak_memory_gb for r in runs),
        "ttft_s": statistics.mean(r.ttft_s for r in runs),
        "reported_generation_tps": statistics.mean(r.reported_tps for r in runs),
        "greedy_identical": None,
        "draft_cost_known": first.draft_cost_known,
    }


def _fill_relative(rows: List[dict], main_gamma: int) -> None:
    """Speedups against mlx_lm (same temp, prompts) and mlx_lm_speculative (+ same γ)."""
    base = {(r["temp"], r["prompt_set"]): r for r in rows if r["method"] == PLAIN}
    spec = {
        (r["temp"], r["prompt_set"], r["gamma"]): r
        for r in rows
        if r["method"] == MLX_LM_SPECULATIVE
    }
    for row in rows:
        plain = base.get((row["temp"], row["prompt_set"]))
        if plain is not None:
            row["speedup_vs_plain"] = _ratio(row["tokens_per_s"], plain["tokens_per_s"])
        gamma = row["gamma"] if row["gamma"] is not None else main_gamma
        other = spec.get((row["temp"], row["prompt_set"], gamma))
        if other is not None:
            row["speedup_vs_mlx_lm_speculative"] = _ratio(
                row["tokens_per_s"], other["tokens_per_s"]
            )


def _greedy_identical(runs: Sequence[Run]) -> Dict[tuple, float]:
    """Fraction of temp-0 runs per config whose tokens equal mlx_lm's."""
    reference = {
        (r.prompt, r.repeat): r.tokens
        for r in runs
        if r.method == PLAIN and r.temp == 0
    }
    out: Dict[tuple, List[bool]] = {}
    for r in runs:
        ref = reference.get((r.prompt, r.repeat))
        if r.temp == 0 and ref is not None:
            out.setdefault((r.method, r.gamma), []).append(r.tokens == ref)
    return {k: sum(v) / len(v) for k, v in out.items()}


def build_rows(
    runs: Sequence[Run],
    repeats: int,
    round_costs,
    main_gamma: int = DEFAULT_NUM_DRAFT_TOKENS,
) -> List[dict]:
    configs: Dict[tuple, List[Run]] = {}
    for r in runs:
        configs.setdefault((r.method, r.temp, r.gamma), []).append(r)
    identical = _greedy_identical(runs)
    rows = []
    for (method, temp, gamma), config_runs in configs.items():
        groups = {ALL_PROMPTS: config_runs}
        for r in config_runs:
            groups.setdefault(r.prompt_set, []).append(r)
        for group, group_runs in groups.items():
            row = aggregate(group_runs, group, repeats, round_costs)
            if temp == 0:
                row["greedy_identical"] = identical.get((method, gamma))
            rows.append(row)
    _fill_relative(rows, main_gamma)
    order = {name: i for i, name in enumerate((ALL_PROMPTS,) + PROMPT_SETS)}
    rows.sort(
        key=lambda r: (order.get(r["prompt_set"], 99), r["temp"], r["gamma"] or 0)
    )
    return rows


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


# --------------------------------------------------------------------------- #
# Machine
# --------------------------------------------------------------------------- #


def _git_commit() -> Optional[str]:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "mlx_spec": mlx_spec.__version__,
        "blas": blas_in_use(),
        "device": str(mx.default_device()),
        "git_commit": _git_commit(),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = list(os.getloadavg())
    return info


def _param_count(model) -> int:
    from mlx.utils import tree_flatten

    return int(sum(v.size for _, v in tree_flatten(model.parameters())))


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #


def _parse_option(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option {text!r}: expected KEY=VALUE.")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark mlx-spec methods against mlx_lm and mlx_lm's "
        "speculative decoding, side by side in one process.",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="Target model: an mlx_lm path or hub id. Default: the "
        "embedded default pair (models/), or tiny test checkpoints.",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="Draft model (same tokenizer). Default: the default pair's "
        "draft when --model is not given, else none.",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"Methods to run, from {', '.join(BASELINES + METHODS)}. "
        "Default: the baselines and every mlx-spec method that is available.",
    )
    parser.add_argument(
        "--temps",
        nargs="+",
        type=float,
        default=list(DEFAULT_TEMPS),
        help="Sampling temperatures (0 is greedy). Default: 0 0.7.",
    )
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=DEFAULT_NUM_DRAFT_TOKENS,
        help=f"Draft tokens per round γ. Default: {DEFAULT_NUM_DRAFT_TOKENS}.",
    )
    parser.add_argument(
        "--gamma-sweep",
        nargs="*",
        type=int,
        default=None,
        help="Also run the draft method at these γ (no values: "
        f"{' '.join(map(str, DEFAULT_GAMMA_SWEEP))}). Default: that "
        "sweep in full mode, none with --quick.",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"Tokens per generation. Default: {DEFAULT_MAX_TOKENS} "
        f"({QUICK_MAX_TOKENS} with --quick).",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"Repetitions over the prompt suite. Default: {DEFAULT_REPEATS} "
        f"({QUICK_REPEATS} with --quick).",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"Warm-up generations per method and temp. Default: {DEFAULT_WARMUP}.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="One prompt per set, one repeat, short generations, no γ sweep.",
    )
    parser.add_argument(
        "--prompt-sets",
        nargs="+",
        default=None,
        choices=PROMPT_SETS,
        help="Prompt sets to run. Default: all.",
    )
    parser.add_argument(
        "--option",
        action="append",
        type=_parse_option,
        default=[],
        metavar="KEY=VALUE",
        help="An extra mlx-spec option (a SpecConfig field), e.g. "
        "tree_budget=32. Repeatable.",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"Output directory for results.json/.md and charts. "
        f"Default: {DEFAULT_OUT}.",
    )
    parser.add_argument(
        "--cost-curves",
        action="store_true",
        help="Also measure forward time against verified width (1-64) "
        "for random-weight Qwen2.5-0.5B/1.5B shapes (float32, ~8 GB) "
        "and write PROJECTED speedups for them.",
    )
    parser.add_argument(
        "--cost-curves-from",
        default=None,
        metavar="JSON",
        help="Project with cost curves measured earlier (a results.json, or the "
        "output of `python -m benchmarks.measure`) instead of measuring them.",
    )
    parser.add_argument(
        "--cost-shapes",
        nargs="+",
        default=list(QWEN2_SHAPES),
        choices=list(QWEN2_SHAPES),
        help="Shapes for --cost-curves.",
    )
    parser.add_argument(
        "--forward-repeats",
        type=int,
        default=10,
        help="Timed bare forwards per width when a width was not sampled "
        "between passes. Default: 10.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"Base seed (the same per prompt for all methods). "
        f"Default: {DEFAULT_SEED}.",
    )
    parser.add_argument("--no-charts", action="store_true", help="Skip the PNG charts.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def _default(value, default):
    return default if value is None else value


def _settings(args) -> dict:
    quick = args.quick
    sweep = args.gamma_sweep
    if sweep is None:
        sweep = [] if quick else list(DEFAULT_GAMMA_SWEEP)
    elif not sweep:
        sweep = list(DEFAULT_GAMMA_SWEEP)
    settings = {
        "quick": quick,
        "temps": [float(t) for t in args.temps],
        "num_draft_tokens": args.num_draft_tokens,
        "gamma_sweep": sorted(set(sweep)),
        "max_tokens": _default(
            args.max_tokens, QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS
        ),
        "repeats": _default(args.repeats, QUICK_REPEATS if quick else DEFAULT_REPEATS),
        "warmup": args.warmup,
        "seed": args.seed,
        "method_options": dict(args.option),
    }
    for name, value, low in (
        ("--max-tokens", settings["max_tokens"], 1),
        ("--repeats", settings["repeats"], 1),
        ("--warmup", settings["warmup"], 0),
    ):
        if value < low:
            raise ValueError(f"{name}={value} is out of range: an integer >= {low}.")
    for g in [args.num_draft_tokens] + settings["gamma_sweep"]:
        if not 1 <= g <= 64:
            raise ValueError(f"γ={g} is out of range: an integer from 1 to 64.")
    if any(t < 0 for t in settings["temps"]):
        raise ValueError(
            f"--temps {settings['temps']}: every temperature must be >= 0."
        )
    return settings


def _choose_methods(requested, uses_draft, skipped, has_draft) -> tuple:
    known = BASELINES + METHODS
    wanted = list(requested) if requested else list(BASELINES) + list(METHODS)
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ValueError(
            f"unknown method(s) {unknown}; choose from {', '.join(known)}."
        )
    chosen, notes = [], dict(skipped)
    for m in wanted:
        if m == MLX_LM_SPECULATIVE and not has_draft:
            notes[m] = "no draft model"
        elif m in METHODS and m not in uses_draft:
            notes.setdefault(m, "not available")
        elif m not in chosen:
            chosen.append(m)
    return chosen, {m: notes[m] for m in notes if m in wanted}


def _configs(methods: Sequence[str], settings: dict) -> List[tuple]:
    """``(method, temp, γ)`` of every benchmarked configuration, γ sweep included."""
    gamma = settings["num_draft_tokens"]
    configs = []
    for temp in settings["temps"]:
        for m in methods:
            configs.append((m, temp, None if m in PLAIN_METHODS else gamma))
        if "draft" in methods:
            configs += [
                ("draft", temp, g) for g in settings["gamma_sweep"] if g != gamma
            ]
    return configs


def _warm_up(setup, configs, ids, settings, uses_draft, progress) -> None:
    """Run every (method, temp) ``warmup`` times on a short generation."""
    saved, setup.max_tokens = setup.max_tokens, min(WARMUP_MAX_TOKENS, setup.max_tokens)
    warm = sorted({(m, t) for m, t, _ in configs}, key=lambda c: (c[1], c[0]))
    progress.start(settings["warmup"] * len(warm), "warm-up")
    for _ in range(settings["warmup"]):
        for m, t in warm:
            generate_once(
                setup,
                m,
                ids,
                t,
                settings["num_draft_tokens"],
                settings["seed"],
                uses_draft.get(m, True),
            )
            progress.update(f"warm-up {m} temp={t}")
    progress.close()
    setup.max_tokens = saved


def _interleaved_runs(
    setup, configs, prompts, ids, settings, uses_draft, timer, progress
):
    """All repetitions; the method order rotates per prompt and repeat.

    After each prompt's pass, the bare forwards its rounds are made of are
    sampled again, so they see the same machine noise as the generations.
    """
    runs: List[Run] = []
    progress.start(settings["repeats"] * len(prompts) * len(configs), "benchmark")
    step = 0
    for rep in range(settings["repeats"]):
        for pi, p in enumerate(prompts):
            seed = settings["seed"] + 1000 * rep + pi
            shift = step % len(configs)
            for m, t, g in configs[shift:] + configs[:shift]:
                result = generate_once(
                    setup,
                    m,
                    ids[p.name],
                    t,
                    g or settings["num_draft_tokens"],
                    seed,
                    uses_draft.get(m, True),
                )
                runs.append(
                    Run(
                        method=m,
                        temp=t,
                        gamma=g,
                        prompt=p.name,
                        prompt_set=p.prompt_set,
                        repeat=rep,
                        **result,
                    )
                )
                progress.update(
                    f"rep {rep + 1} {p.name} {m} temp={t}" + (f" γ={g}" if g else "")
                )
            _sample_bare_forwards(
                timer, setup, runs[-len(configs) :], BARE_SAMPLES_PER_PASS
            )
            step += 1
    progress.close()
    return runs


def _context_note(model, ids, max_tokens) -> Optional[str]:
    longest = max(len(v) for v in ids.values()) + max_tokens
    limit = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    if limit and longest > limit:
        return (
            f"the longest prompt plus --max-tokens is {longest} tokens, beyond the "
            f"target's max_position_embeddings ({limit})"
        )
    return None


def benchmark(args) -> dict:
    """Run the benchmark described by parsed ``args``; return the results dict."""
    settings = _settings(args)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path, default_draft = default_model_pair()
        draft_path = draft_path or default_draft
    progress = Progress(enabled=not args.no_progress)
    progress.note(
        f"loading {model_path}" + (f" + draft {draft_path}" if draft_path else "")
    )
    model, tokenizer, draft = load_pair(model_path, draft_path)
    setup = Setup(
        model, tokenizer, draft, settings["max_tokens"], settings["method_options"]
    )

    prompts = prompt_suite(quick=settings["quick"], sets=args.prompt_sets)
    ids = {p.name: tokenizer.encode(p.text) for p in prompts}
    note = _context_note(model, ids, settings["max_tokens"])
    if note:
        settings["context_note"] = note
        progress.note("note: " + note)
    uses_draft, skipped = discover_methods(setup, ids[prompts[0].name])
    methods, skipped = _choose_methods(
        args.methods, uses_draft, skipped, draft is not None
    )
    if not methods:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise ValueError(f"no method to run: {reasons}")
    for m, why in skipped.items():
        progress.note(f"skipping method {m}: {why}")

    configs = _configs(methods, settings)
    _warm_up(setup, configs, ids[prompts[0].name], settings, uses_draft, progress)
    # Bare forwards on a cache as long as a typical mid-generation context.
    lengths = sorted(len(v) for v in ids.values())
    context = lengths[len(lengths) // 2] + settings["max_tokens"] // 2
    timer = ForwardTimer(
        context=context, repeats=args.forward_repeats, seed=settings["seed"]
    )
    runs = _interleaved_runs(
        setup, configs, prompts, ids, settings, uses_draft, timer, progress
    )
    round_costs = {id(r): _round_cost(r, timer, setup) for r in runs}
    timer.close()
    rows = build_rows(
        runs, settings["repeats"], round_costs, settings["num_draft_tokens"]
    )
    bare = timer.table()
    pair_ratio = None
    if bare.get("draft", {}).get(1) and bare.get("target", {}).get(1):
        pair_ratio = bare["draft"][1] / bare["target"][1]

    curves, projections = {}, []
    if args.cost_curves_from:
        curves = load_cost_curves(args.cost_curves_from)
    elif args.cost_curves:
        shapes = {k: QWEN2_SHAPES[k] for k in args.cost_shapes}
        curves = cost_curves(shapes, context=context, progress=progress.note)
    if curves:
        projections = project(rows, curves, pair_ratio)

    samples = {
        r.prompt: tokenizer.decode(r.tokens)
        for r in runs
        if r.method == PLAIN and r.temp == 0 and r.repeat == 0
    }
    return {
        "rows": rows,
        "projections": projections,
        "cost_curves": curves,
        "bare_forward_s": {
            k: {str(w): t for w, t in v.items()} for k, v in bare.items()
        },
        "draft_to_target_forward_ratio": pair_ratio,
        "machine": machine_info(),
        "models": {
            "target": str(model_path),
            "draft": str(draft_path) if draft_path else None,
            "target_params": _param_count(model),
            "draft_params": _param_count(draft) if draft is not None else None,
        },
        "settings": {
            **settings,
            "methods": methods,
            "bare_forward_context": context,
            "prompts": [p.name for p in prompts],
        },
        "methods_skipped": skipped,
        "definitions": DEFINITIONS,
        "samples_mlx_lm_greedy": samples,
    }


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command-line entry point (also ``mlx_spec.bench``)."""
    from .report import write_outputs

    args = setup_arg_parser().parse_args(argv)
    try:
        results = benchmark(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    paths = write_outputs(results, Path(args.out), charts=not args.no_charts)
    print((Path(args.out) / "results.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)


if __name__ == "__main__":
    main()
