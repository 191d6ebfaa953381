"""Benchmark mlx-spec against mlx-lm, side by side, in one process.

Usage::

    python -m benchmarks.run --quick --out bench_out
    python -m benchmarks.run --model mlx-community/Qwen2.5-7B-Instruct-4bit \\
        --draft-model mlx-community/Qwen2.5-0.5B-Instruct-4bit --out bench_out

Every method sees the same models, prompts, seeds and token budget:
``mlx_lm`` (plain ``mlx_lm.generate.stream_generate``), ``mlx_lm_speculative``
(mlx-lm's own speculative mode, same draft and γ) and every mlx-spec method
that exists (``mlx_spec.config.METHODS``, discovered at run time).

The runs come in *blocks*: one prompt, one repeat, one temperature. A block
runs plain ``mlx_lm`` first, every other configuration in an order that
rotates from block to block, and plain ``mlx_lm`` again last. Speedups are
*paired*: each run's tokens/s over the mean of its block's two ``mlx_lm``
runs, then the median over blocks. After each run one of the bare forwards
the rounds are made of is timed again (round robin), so they see the same
machine noise.

Definitions (also written to ``results.json`` and ``benchmarks/README.md``):

* ``decode_tokens_per_s``: tokens generated after the first round / time from
  the first token to the last (no prompt processing).
* ``tokens_per_s``: generated tokens / wall time from the call to the last
  token (end to end, prompt processing included).
* ``speedup_vs_plain``: median over blocks of the decode tokens/s of a run
  over that of the block's ``mlx_lm`` runs.
* ``overhead``: median over rounds of a round's time / the bare cost of what
  it is made of (draft forwards + one target forward of its verified width),
  with pipelined bare forwards timed in this run: medians per sampled width,
  ``T(w) = a + b * w`` between sampled neighbours. Plain ``mlx_lm`` is the
  calibration: it comes out at ~1.0.
"""

# isort: off
import mlx_spec  # noqa: F401  (must precede mlx: it preloads OpenBLAS)

# isort: on

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import stream_generate as mlx_lm_stream_generate
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from mlx_spec import stream_generate as spec_stream_generate
from mlx_spec._blas import blas_in_use
from mlx_spec.config import (
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_TREE_BUDGET,
    DEFAULT_TREE_TOP_K,
    METHODS,
)
from mlx_spec.loading import default_model_pair, load_pair

from .measure import (
    QWEN2_SHAPES,
    ForwardTimer,
    PiecewiseCost,
    cost_curves,
    interpolate,
    load_cost_curves,
)
from .progress import Progress
from .prompts import PROMPT_SETS, prompt_suite

PLAIN = "mlx_lm"
MLX_LM_SPECULATIVE = "mlx_lm_speculative"
BASELINES = (PLAIN, MLX_LM_SPECULATIVE)
# Methods with no draft step: their γ is meaningless and recorded as None.
PLAIN_METHODS = (PLAIN, "none")
# Methods run again at every γ of the sweep.
SWEEP_METHODS = ("draft", MLX_LM_SPECULATIVE)
DEFAULT_TEMPS = (0.0, 0.7)
DEFAULT_MAX_TOKENS = 96
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1
DEFAULT_SEED = 0
DEFAULT_OUT = "bench_out"
DEFAULT_GAMMA_SWEEP = (1, 2, 3, 4, 6, 8)
QUICK_GAMMA_SWEEP = (2, 4, 6)
QUICK_MAX_TOKENS = 48
QUICK_REPEATS = 2
WARMUP_MAX_TOKENS = 16
# One bare sample: the mean gap of a chain of this many pipelined forwards.
BARE_CHAIN = 5
# Plain mlx_lm's overhead outside 1 ± this: the overhead column is suspect.
CALIBRATION_TOLERANCE = 0.15
# Tokens per target forward at or below this: nothing was accepted.
NOTHING_ACCEPTED = 1.0 + 1e-9
ALL_PROMPTS = "all"
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
    "speedup_vs_plain": "paired, decode only: per block (one prompt, repeat and "
    "temp), a run's decode tokens/s over the mean of the block's two mlx_lm runs "
    "(run first and last in the block); the median over blocks. 1 for mlx_lm",
    "speedup_vs_plain_e2e": "the same with end-to-end tokens/s",
    "speedup_vs_mlx_lm_speculative": "paired, decode only: over the "
    "mlx_lm_speculative run of the same block and gamma; median over blocks",
    "acceptance_rate": "accepted draft tokens / drafted tokens (mlx_lm_speculative: "
    "from_draft tokens / drafted tokens, drafted = min(gamma, tokens left) per round)",
    "tokens_per_target_forward": "generated tokens / target forwards (verification rounds)",
    "overhead": "median over rounds 2.. of all runs of the row of: round time / "
    "(forwards * D(drafted / forwards) + T(drafted + 1)), where T and D are the "
    "target's and the draft's bare forward times against width w: medians of "
    "samples at the widths used, a + b*w between sampled neighbours. A sample is "
    "the steady-state time per forward of a chain of pipelined forwards (as mlx_lm "
    "decodes) on a cache of typical length; one is taken after every run. A "
    "round's time runs from its first yielded token to the next round's. Plain "
    "mlx_lm is the calibration (~1.0); null where the draft cost is unknown "
    "(self-speculation)",
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


# --------------------------------------------------------------------------- #
# One generation
# --------------------------------------------------------------------------- #


@dataclass
class Trace:
    """What a generation yielded, one entry per response.

    Attributes:
        times: ``perf_counter`` seconds when each response arrived.
        rounds: Index of the verification round that emitted each response.
        counted: ``False`` for the EOS of a ``"stop"`` finish (not a token).
        drafted: Drafted tokens so far, the current round included.
        forwards: Draft forwards so far, the current round included.
    """

    times: List[float] = field(default_factory=list)
    rounds: List[int] = field(default_factory=list)
    counted: List[bool] = field(default_factory=list)
    drafted: List[int] = field(default_factory=list)
    forwards: List[int] = field(default_factory=list)


def split_rounds(trace: Trace) -> dict:
    """Decode span and per-round times and counts from a :class:`Trace`.

    A round starts with its first response. Round 0 follows the prompt's
    prefill and has no separate start, so round times begin with round 1:
    ``start[k] - start[k - 1]``, the time of round ``k`` (its drafting,
    verification and sync, plus yielding round ``k - 1``'s tokens).

    Returns:
        ``decode_s`` (first response to the last counted one),
        ``decode_tokens`` (counted tokens after round 0), and per round
        ``k >= 1``: ``round_s``, ``round_drafted``, ``round_forwards``.
    """
    starts, drafted, forwards = [], [], []
    previous = None
    for t, r, d, f in zip(trace.times, trace.rounds, trace.drafted, trace.forwards):
        if r != previous:
            starts.append(t)
            drafted.append(d)
            forwards.append(f)
            previous = r
    first = trace.rounds[0] if trace.rounds else None
    decode_tokens = sum(
        1 for r, c in zip(trace.rounds, trace.counted) if c and r != first
    )
    last = max((t for t, c in zip(trace.times, trace.counted) if c), default=None)
    decode_s = last - trace.times[0] if decode_tokens and last is not None else 0.0
    return {
        "decode_s": decode_s,
        "decode_tokens": decode_tokens,
        "round_s": [b - a for a, b in zip(starts, starts[1:])],
        "round_drafted": [b - a for a, b in zip(drafted, drafted[1:])],
        "round_forwards": [b - a for a, b in zip(forwards, forwards[1:])],
    }


@dataclass
class Run:
    """Counters and timings of one generation (one run of one block).

    ``round_s[k]``, ``round_drafted[k]`` and ``round_forwards[k]`` describe
    round ``k + 1`` (see :func:`split_rounds`); the overhead compares each
    round's time with the bare cost of its draft forwards and verification.
    """

    method: str
    temp: float
    gamma: Optional[int]
    prompt: str
    prompt_set: str
    repeat: int
    block: int
    position: int
    tokens: List[int]
    wall_s: float
    ttft_s: float
    decode_s: float
    decode_tokens: int
    rounds: int
    accepted: int
    drafted: int
    draft_forwards: int
    round_s: List[float]
    round_drafted: List[int]
    round_forwards: List[int]
    peak_memory_gb: float
    memory_increase_gb: float
    draft_cost_known: bool = True

    @property
    def tokens_per_s(self) -> Optional[float]:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> Optional[float]:
        if self.decode_tokens <= 0 or self.decode_s <= 0:
            return None
        return self.decode_tokens / self.decode_s

    def raw(self) -> dict:
        """The run as stored in ``results.json`` (token ids left out)."""
        return {
            "method": self.method,
            "temp": self.temp,
            "gamma": self.gamma,
            "prompt": self.prompt,
            "prompt_set": self.prompt_set,
            "repeat": self.repeat,
            "block": self.block,
            "position": self.position,
            "generated_tokens": len(self.tokens),
            "wall_s": self.wall_s,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "decode_tokens": self.decode_tokens,
            "rounds": self.rounds,
            "accepted": self.accepted,
            "drafted": self.drafted,
            "draft_forwards": self.draft_forwards,
            "peak_memory_gb": self.peak_memory_gb,
            "memory_increase_gb": self.memory_increase_gb,
            "round_s": [round(t, 7) for t in self.round_s],
            "round_drafted": self.round_drafted,
            "round_forwards": self.round_forwards,
        }


@dataclass
class Setup:
    """Loaded models and run settings shared by every generation."""

    model: Any
    tokenizer: Any
    draft: Any
    max_tokens: int
    method_options: Dict[str, Any] = field(default_factory=dict)


def _consume(make_stream: Callable, describe: Callable) -> dict:
    """Create and drain a response stream, timing from before its creation.

    ``describe(response)`` gives ``(round, drafted so far, forwards so far)``.
    Peak memory is reset just before the stream is created.

    Returns:
        The stream, its tokens (the EOS of a ``"stop"`` finish left out) and
        its timings: ``wall_s``, ``ttft_s`` and those of :func:`split_rounds`.
    """
    trace = Trace()
    tokens = []
    mx.reset_peak_memory()
    active = mx.get_active_memory()
    tic = time.perf_counter()
    stream = make_stream()
    for response in stream:
        now = time.perf_counter()
        r, d, f = describe(response)
        counted = response.finish_reason != "stop"
        trace.times.append(now)
        trace.rounds.append(r)
        trace.counted.append(counted)
        trace.drafted.append(d)
        trace.forwards.append(f)
        if counted:
            tokens.append(int(response.token))
    end = time.perf_counter()
    peak = mx.get_peak_memory()
    return dict(
        stream=stream,
        tokens=tokens,
        wall_s=end - tic,
        ttft_s=(trace.times[0] if trace.times else end) - tic,
        peak_memory_gb=peak / 1e9,
        memory_increase_gb=max(peak - active, 0) / 1e9,
        drafted_total=trace.drafted[-1] if trace.drafted else 0,
        **split_rounds(trace),
    )


def _mlx_lm_rounds(max_tokens: int, gamma: Optional[int]) -> Callable:
    """A ``describe`` for mlx_lm's stream: rounds end at a token not from the draft.

    mlx-lm drafts ``min(max_tokens - tokens so far, γ)`` tokens per round.
    """
    state = {"round": 0, "new": True, "seen": 0, "drafted": 0}

    def describe(response):
        if state["new"] and gamma:
            state["drafted"] += min(max_tokens - state["seen"], gamma)
        r = state["round"]
        state["seen"] += 1
        state["new"] = not (gamma and response.from_draft)
        if state["new"]:
            state["round"] += 1
        return r, state["drafted"], state["drafted"]

    return describe


def run_mlx_lm(setup: Setup, ids, temp, gamma, seed, *, speculative: bool) -> dict:
    """One generation with mlx-lm's own ``stream_generate``."""
    mx.random.seed(seed)
    kwargs = dict(max_tokens=setup.max_tokens, sampler=mlx_lm_make_sampler(temp))
    if speculative:
        kwargs.update(draft_model=setup.draft, num_draft_tokens=gamma)
    from_draft = []

    def tagged():
        stream = mlx_lm_stream_generate(setup.model, setup.tokenizer, ids, **kwargs)
        for response in stream:
            from_draft.append(bool(response.from_draft))
            yield response

    out = _consume(
        tagged, _mlx_lm_rounds(setup.max_tokens, gamma if speculative else 0)
    )
    out.pop("stream")
    n = len(out["tokens"])
    if speculative:
        flags = from_draft[:n]
        rounds = max(sum(not f for f in flags), 1)
        accepted = sum(flags)
        drafted = out["drafted_total"]
    else:
        rounds, accepted, drafted = n, 0, 0
    out.pop("drafted_total")
    return dict(
        out,
        rounds=rounds,
        accepted=accepted,
        drafted=drafted,
        draft_forwards=drafted,
    )


def _spec_rounds(response) -> Tuple[int, int, int]:
    stats = response.stats
    return response.round, stats.draft_tokens, stats.draft_forwards


def run_mlx_spec(
    setup: Setup, method, ids, temp, gamma, seed, *, use_draft=True, fixed=False
) -> dict:
    """One generation with ``mlx_spec.stream_generate`` and method ``method``."""
    options = dict(setup.method_options)
    if fixed:
        options["adaptive"] = False
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
        **options,
    )
    out = _consume(make_stream, _spec_rounds)
    out.pop("drafted_total")
    stats = out.pop("stream").stats
    # Self-speculation drafts with part of the target: no bare draft cost.
    self_rounds = (stats.auto_rounds or {}).get("self", 0)
    return dict(
        out,
        rounds=stats.rounds,
        accepted=stats.accepted_tokens,
        drafted=stats.draft_tokens,
        draft_forwards=stats.draft_forwards,
        draft_cost_known="self" not in (method, stats.method) and not self_rounds,
    )


def generate_once(
    setup: Setup, method, ids, temp, gamma, seed, uses_draft, fixed=False
) -> dict:
    """One run; ``fixed`` turns adaptive control off (γ-sweep rows)."""
    if method == PLAIN:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=False)
    if method == MLX_LM_SPECULATIVE:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=True)
    return run_mlx_spec(
        setup, method, ids, temp, gamma, seed, use_draft=uses_draft, fixed=fixed
    )


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
# Bare forward costs
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class BareCosts:
    """Bare forward-time models of the target and the draft (seconds).

    A round that drafts ``d`` tokens in ``f`` draft forwards and verifies
    ``d + 1`` tokens costs ``f * draft(d / f) + target(d + 1)``: a chain
    feeds one token per draft forward, a tree a level of nodes per forward.
    """

    target: PiecewiseCost
    draft: Optional[PiecewiseCost]

    def round(self, drafted: int, forwards: int) -> Optional[float]:
        cost = self.target(drafted + 1)
        if forwards:
            if self.draft is None:
                return None
            cost += forwards * self.draft(max(drafted / forwards, 1.0))
        return cost


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


def bare_widths(configs: Sequence[tuple], setup: Setup) -> Dict[str, List[int]]:
    """Widths to time per model: those the configurations verify and draft."""
    target = {1, 2}
    draft = {1}
    for method, _, gamma in configs:
        if method in PLAIN_METHODS:
            continue
        target.add((gamma or DEFAULT_NUM_DRAFT_TOKENS) + 1)
        if method in ("tree", "auto"):
            budget = setup.method_options.get("tree_budget", DEFAULT_TREE_BUDGET)
            target.add(int(budget) + 1)
            draft.add(int(setup.method_options.get("tree_top_k", DEFAULT_TREE_TOP_K)))
    out = {"target": sorted(target)}
    if setup.draft is not None:
        out["draft"] = sorted(draft)
    return out


def _sample_bare(timer: ForwardTimer, setup: Setup, widths, first: bool) -> None:
    """One more sample of every bare forward in ``widths``."""
    for name, ws in widths.items():
        for w in ws:
            _sample_one(timer, setup, (name, w), warmup=1 if first else 0)


def _sample_one(timer: ForwardTimer, setup: Setup, which, warmup: int = 0) -> None:
    name, width = which
    model = setup.model if name == "target" else setup.draft
    timer.sample(name, model, width, repeats=1, warmup=warmup)


def bare_costs(timer: ForwardTimer) -> Optional[BareCosts]:
    target = timer.curve("target")
    if target is None:
        return None
    return BareCosts(target, timer.curve("draft"))


# --------------------------------------------------------------------------- #
# Aggregation
# --------------------------------------------------------------------------- #


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
    """One result row from the runs of one (method, temp, γ) on prompt set ``group``."""
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
    }


class Blocks:
    """The runs indexed by block, for paired ratios and greedy identity."""

    def __init__(self, runs: Sequence[Run]):
        self._index: Dict[tuple, List[Run]] = {}
        for r in runs:
            self._index.setdefault((r.block, r.method, r.gamma), []).append(r)

    def ratio(self, run: Run, method: str, gamma, metric) -> Optional[float]:
        """``metric(run)`` over the mean ``metric`` of ``method``'s runs in its block."""
        base = [metric(b) for b in self._index.get((run.block, method, gamma), [])]
        base = [v for v in base if v]
        return _ratio(metric(run), statistics.fmean(base) if base else None)

    def reference(self, run: Run) -> Optional[List[int]]:
        """The tokens of the block's first mlx_lm run."""
        plain = self._index.get((run.block, PLAIN, None))
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
    """Rows per (method, temp, γ) over all prompts and per prompt set."""
    configs: Dict[tuple, List[Run]] = {}
    for r in runs:
        configs.setdefault((r.method, r.temp, r.gamma), []).append(r)
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
    order = {name: i for i, name in enumerate((ALL_PROMPTS,) + PROMPT_SETS)}
    rows.sort(
        key=lambda r: (order.get(r["prompt_set"], 99), r["temp"], r["gamma"] or 0)
    )
    return rows


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
            who = r["method"] + (f" (γ={r['gamma']})" if r["gamma"] is not None else "")
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
        help=f"Also run {' and '.join(SWEEP_METHODS)} at these γ (no values: "
        f"{' '.join(map(str, DEFAULT_GAMMA_SWEEP))}). Default: that sweep at every "
        f"temperature in full mode; {' '.join(map(str, QUICK_GAMMA_SWEEP))} at the "
        "first temperature with --quick.",
    )
    parser.add_argument(
        "--no-gamma-sweep",
        action="store_true",
        help="Run every method at --num-draft-tokens only.",
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
        help=f"One prompt per set, {QUICK_REPEATS} repeats, {QUICK_MAX_TOKENS}-token "
        f"generations, a short γ sweep ({' '.join(map(str, QUICK_GAMMA_SWEEP))}) at "
        "the first temperature only.",
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
        default=3,
        help="Bare samples per width taken before the first block (more are "
        "taken after every block). Default: 3.",
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
    if args.no_gamma_sweep:
        sweep = []
    elif sweep is None:
        sweep = list(QUICK_GAMMA_SWEEP if quick else DEFAULT_GAMMA_SWEEP)
    elif not sweep:
        sweep = list(DEFAULT_GAMMA_SWEEP)
    settings = {
        "quick": quick,
        "temps": [float(t) for t in args.temps],
        "num_draft_tokens": args.num_draft_tokens,
        "gamma_sweep": sorted(set(sweep)),
        # --quick sweeps γ at the first temperature only, to stay short.
        "sweep_temps": [float(t) for t in (args.temps[:1] if quick else args.temps)],
        "max_tokens": _default(
            args.max_tokens, QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS
        ),
        "repeats": _default(args.repeats, QUICK_REPEATS if quick else DEFAULT_REPEATS),
        "warmup": args.warmup,
        "seed": args.seed,
        "forward_repeats": args.forward_repeats,
        "bare_chain": BARE_CHAIN,
        "method_options": dict(args.option),
    }
    for name, value, low in (
        ("--max-tokens", settings["max_tokens"], 1),
        ("--repeats", settings["repeats"], 1),
        ("--warmup", settings["warmup"], 0),
        ("--forward-repeats", settings["forward_repeats"], 1),
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
    """``(method, temp, γ)`` of every benchmarked configuration, γ sweep included.

    Plain mlx_lm is always among them: every block runs it first and last.
    """
    gamma = settings["num_draft_tokens"]
    configs = []
    for temp in settings["temps"]:
        configs.append((PLAIN, temp, None))
        for m in methods:
            if m != PLAIN:
                configs.append((m, temp, None if m in PLAIN_METHODS else gamma))
        if temp not in settings["sweep_temps"]:
            continue
        for m in SWEEP_METHODS:
            if m in methods:
                configs += [(m, temp, g) for g in settings["gamma_sweep"] if g != gamma]
    return configs


def block_order(configs: Sequence[tuple], shift: int) -> List[tuple]:
    """mlx_lm first and last; the other configurations rotated by ``shift``."""
    plain = [c for c in configs if c[0] == PLAIN]
    others = [c for c in configs if c[0] != PLAIN]
    if others:
        shift %= len(others)
        others = others[shift:] + others[:shift]
    return plain + others + plain


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
    setup, configs, prompts, ids, settings, uses_draft, timer, widths, progress
) -> List[Run]:
    """Every block: one prompt, repeat and temperature, all its configurations.

    After each run, one bare forward (the next width, round robin) is timed,
    so the bare forwards see the same machine noise as the generations.
    """
    runs: List[Run] = []
    cycle = [(name, w) for name, ws in widths.items() for w in ws]
    sampled = 0
    temps = settings["temps"]
    per_block = {t: [c for c in configs if c[1] == t] for t in temps}
    n_runs = sum(len(block_order(c, 0)) for c in per_block.values())
    progress.start(settings["repeats"] * len(prompts) * n_runs, "benchmark")
    block = 0
    for rep in range(settings["repeats"]):
        for pi, p in enumerate(prompts):
            seed = settings["seed"] + 1000 * rep + pi
            for t in temps:
                order = block_order(per_block[t], block)
                for position, (m, _, g) in enumerate(order):
                    result = generate_once(
                        setup,
                        m,
                        ids[p.name],
                        t,
                        g or settings["num_draft_tokens"],
                        seed,
                        uses_draft.get(m, True),
                        fixed=g is not None and g != settings["num_draft_tokens"],
                    )
                    runs.append(
                        Run(
                            method=m,
                            temp=t,
                            gamma=g,
                            prompt=p.name,
                            prompt_set=p.prompt_set,
                            repeat=rep,
                            block=block,
                            position=position,
                            **result,
                        )
                    )
                    _sample_one(timer, setup, cycle[sampled % len(cycle)])
                    sampled += 1
                    progress.update(
                        f"rep {rep + 1} {p.name} {m} temp={t}"
                        + (f" γ={g}" if g else "")
                    )
                block += 1
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


def _overhead_calibration(rows: Sequence[dict]) -> Dict[str, Optional[float]]:
    """Plain mlx_lm's overhead per temperature (1.0 when the method is sound)."""
    return {
        f"{r['temp']:g}": r["overhead"]
        for r in rows
        if r["method"] == PLAIN and r["prompt_set"] == ALL_PROMPTS
    }


def benchmark(args) -> dict:
    """Run the benchmark described by parsed ``args``; return the results dict."""
    started = time.perf_counter()
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
    timer = ForwardTimer(context=context, seed=settings["seed"], chain=BARE_CHAIN)
    widths = bare_widths(configs, setup)
    for i in range(settings["forward_repeats"]):
        _sample_bare(timer, setup, widths, first=i == 0)
    runs = _interleaved_runs(
        setup, configs, prompts, ids, settings, uses_draft, timer, widths, progress
    )
    timer.close()
    costs = bare_costs(timer)
    rows = build_rows(runs, settings["repeats"], costs, settings["num_draft_tokens"])
    warnings = check_rows(rows)
    bare = timer.table()
    pair_ratio = None
    if costs is not None and costs.draft is not None:
        pair_ratio = costs.draft(1) / costs.target(1)
    fits = {name: timer.fit(name) for name in bare}

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
        if r.method == PLAIN and r.temp == 0 and r.repeat == 0 and r.position == 0
    }
    return {
        "rows": rows,
        "warnings": warnings,
        "overhead_calibration": _overhead_calibration(rows),
        "plain_drift": plain_drift(runs),
        "projections": projections,
        "cost_curves": curves,
        "bare_forward_s": {
            k: {str(w): t for w, t in v.items()} for k, v in bare.items()
        },
        "bare_forward_samples_s": {
            k: {str(w): t for w, t in v.items()} for k, v in timer.samples().items()
        },
        "bare_forward_fit": {k: f.as_dict() for k, f in fits.items() if f},
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
            "elapsed_s": time.perf_counter() - started,
        },
        "methods_skipped": skipped,
        "definitions": DEFINITIONS,
        "runs": [r.raw() for r in runs],
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
    for warning in results["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)


if __name__ == "__main__":
    main()
