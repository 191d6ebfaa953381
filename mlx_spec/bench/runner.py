"""Running one timed generation, and finding which methods run.

A generation is a *run*: one method, temperature, γ, prompt and seed. This
module owns how a run is driven and timed: plain ``mlx_lm`` and mlx-lm's own
speculative mode through ``mlx_lm.generate.stream_generate``, every mlx-spec
method through ``mlx_spec.stream_generate``. Each response is time-stamped
(:class:`Trace`), and :func:`split_rounds` turns the stamps into the decode
span and each verification round's time, drafted tokens and draft forwards
(:class:`Run`). :func:`discover_methods` tries each mlx-spec method on a
2-token generation and says why one is skipped.
"""

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.generate import stream_generate as mlx_lm_stream_generate
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from mlx_spec import stream_generate as spec_stream_generate
from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS
from mlx_spec.drafters import registry

PLAIN = "mlx_lm"
MLX_LM_SPECULATIVE = "mlx_lm_speculative"
BASELINES = (PLAIN, MLX_LM_SPECULATIVE)
# Methods with no draft step: their γ is meaningless and recorded as None.
PLAIN_METHODS = (PLAIN, "none")
# Methods run again at every γ of the sweep.
SWEEP_METHODS = ("draft", MLX_LM_SPECULATIVE)


class Config(NamedTuple):
    """One benchmarked configuration.

    Attributes:
        method: ``mlx_lm``, ``mlx_lm_speculative`` or an mlx-spec method.
        temp: Sampling temperature (0 is greedy).
        gamma: Draft tokens per round; ``None`` for methods that draft nothing.
        fixed: Adaptive control off, so γ stays fixed (the γ sweep's rows of
            mlx-spec methods). mlx-lm's speculative mode is always fixed.
    """

    method: str
    temp: float
    gamma: Optional[int]
    fixed: bool = False

    def label(self) -> str:
        """``method``, with ``γ=g`` and ``fixed`` when they apply."""
        text = self.method
        if self.gamma is not None:
            text += f" γ={self.gamma}" + (" fixed" if self.fixed else "")
        return text


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
    ``accepted_per_round`` and ``drafted_per_round`` hold every round that
    drafted something, round 0 included (acceptance by draft position).
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
    fixed: bool = False
    draw: int = 0  # which of a prompt's sampled answers (see --draws)
    seed: int = 0
    accepted_per_round: List[int] = field(default_factory=list)
    drafted_per_round: List[int] = field(default_factory=list)
    # The round cost model the engine measured (mlx-spec methods; see
    # mlx_spec.costs.MeasuredCosts.report).
    cost_model: Optional[dict] = None

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
            "draw": self.draw,
            "seed": self.seed,
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
            "cost_model": self.cost_model,
            "fixed": self.fixed,
            "accepted_per_round": self.accepted_per_round,
            "drafted_per_round": self.drafted_per_round,
        }


@dataclass
class Setup:
    """Loaded models and run settings shared by every generation."""

    model: Any
    tokenizer: Any
    draft: Any
    max_tokens: int
    method_options: Dict[str, Any] = field(default_factory=dict)
    # Per-method drafters given on the command line (method -> loaded drafter).
    drafts: Dict[str, Any] = field(default_factory=dict)
    # Trained draft heads for the target (``mlx_spec.drafters.heads.LoadedHead``).
    heads: List[Any] = field(default_factory=list)

    def draft_for(self, method: str) -> Any:
        """The draft model ``method`` is given first: its own, else the shared one."""
        return self.drafts.get(method, self.draft)

    def candidates(self, method: str) -> List[Any]:
        """Drafters to try for ``method``, in order: its own, the shared draft
        model, each head, then none."""
        out = []
        for d in (self.drafts.get(method), self.draft, *self.heads):
            if d is not None and not any(d is o for o in out):
                out.append(d)
        return out + [None]

    def describe(self, drafter: Any) -> Optional[str]:
        """What ``drafter`` is, for the report."""
        if drafter is None:
            return None
        if drafter is self.draft:
            return "draft model"
        path = getattr(drafter, "path", None)
        kind = getattr(drafter, "kind", None)
        if kind is not None:
            return f"{kind} head" + (f" {path}" if path else "")
        return "own drafter" + (f" {path}" if path else "")


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


def mlx_lm_round_counts(
    from_draft: List[bool], max_tokens: int, gamma: int
) -> Tuple[List[int], List[int]]:
    """Accepted and drafted tokens of each round of mlx-lm's speculative mode.

    A round yields its accepted draft tokens (``from_draft``) and ends with a
    token of the target; it drafted ``min(γ, max_tokens - tokens so far)``.
    """
    accepted, drafted = [], []
    seen, run = 0, None
    for flag in from_draft:
        if run is None:
            run = 0
            drafted.append(min(gamma, max_tokens - seen))
        seen += 1
        if flag:
            run += 1
        else:
            accepted.append(run)
            run = None
    if run is not None:  # an EOS or the budget cut the last round
        accepted.append(run)
    return accepted, drafted


def run_mlx_lm(setup: Setup, ids, temp, gamma, seed, *, speculative: bool) -> dict:
    """One generation with mlx-lm's own ``stream_generate``."""
    mx.random.seed(seed)
    kwargs = dict(max_tokens=setup.max_tokens, sampler=mlx_lm_make_sampler(temp))
    if speculative:
        kwargs.update(
            draft_model=setup.draft_for(MLX_LM_SPECULATIVE), num_draft_tokens=gamma
        )
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
    per_round = ([], [])
    if speculative:
        flags = from_draft[:n]
        rounds = max(sum(not f for f in flags), 1)
        accepted = sum(flags)
        drafted = out["drafted_total"]
        per_round = mlx_lm_round_counts(flags, setup.max_tokens, gamma)
    else:
        rounds, accepted, drafted = n, 0, 0
    out.pop("drafted_total")
    return dict(
        out,
        rounds=rounds,
        accepted=accepted,
        drafted=drafted,
        draft_forwards=drafted,
        accepted_per_round=per_round[0],
        drafted_per_round=per_round[1],
    )


def _spec_rounds(response) -> Tuple[int, int, int]:
    stats = response.stats
    return response.round, stats.draft_tokens, stats.draft_forwards


def run_mlx_spec(
    setup: Setup,
    method,
    ids,
    temp,
    gamma,
    seed,
    *,
    drafter=None,
    fixed=False,
    profile=False,
) -> dict:
    """One generation with ``mlx_spec.stream_generate`` and method ``method``.

    ``drafter`` is passed as its ``draft_model`` (a draft model, a head or
    ``None``). ``fixed`` turns adaptive control off. ``profile`` adds a sync per round
    that splits its time into drafting and verification (key ``profile``:
    seconds of ``generation``, ``draft``, ``verify`` and ``host`` work).
    """
    options = dict(setup.method_options)
    if fixed:
        options["adaptive"] = False
    make_stream = functools.partial(
        spec_stream_generate,
        setup.model,
        setup.tokenizer,
        ids,
        draft_model=drafter,
        speculative=method,
        num_draft_tokens=gamma or DEFAULT_NUM_DRAFT_TOKENS,
        temp=temp,
        max_tokens=setup.max_tokens,
        seed=seed,
        profile=profile,
        **options,
    )
    out = _consume(make_stream, _spec_rounds)
    out.pop("drafted_total")
    stats = out.pop("stream").stats
    # Bare draft costs are timed for the shared draft model only; self-speculation
    # drafts with part of the target and heads are priced by nobody.
    self_rounds = (stats.auto_rounds or {}).get("self", 0)
    known = drafter is None or drafter is setup.draft or not stats.draft_forwards
    if profile:
        out["profile"] = {
            "generation": stats.generation_time,
            "draft": stats.draft_time or 0.0,
            "verify": stats.verify_time or 0.0,
            "host": stats.host_time,
            "rounds": stats.rounds,
            "tokens": stats.generated_tokens,
        }
    return dict(
        out,
        rounds=stats.rounds,
        accepted=stats.accepted_tokens,
        drafted=stats.draft_tokens,
        draft_forwards=stats.draft_forwards,
        draft_cost_known=known
        and "self" not in (method, stats.method)
        and not self_rounds,
        accepted_per_round=list(stats.accepted_per_round),
        drafted_per_round=list(stats.drafted_per_round),
        cost_model=stats.cost_model,
    )


def generate_once(
    setup: Setup, config: Config, ids, seed, drafter=None, profile=False
) -> dict:
    """One run of ``config``; ``drafter`` and ``profile`` for mlx-spec methods."""
    method, temp, gamma = config.method, config.temp, config.gamma
    gamma = gamma or DEFAULT_NUM_DRAFT_TOKENS
    if method == PLAIN:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=False)
    if method == MLX_LM_SPECULATIVE:
        return run_mlx_lm(setup, ids, temp, gamma, seed, speculative=True)
    return run_mlx_spec(
        setup,
        method,
        ids,
        temp,
        gamma,
        seed,
        drafter=drafter,
        fixed=config.fixed,
        profile=profile,
    )


# --------------------------------------------------------------------------- #
# Method discovery
# --------------------------------------------------------------------------- #


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def discover_methods(
    setup: Setup, ids, methods: Optional[Sequence[str]] = None
) -> tuple:
    """Try each mlx-spec method on a 2-token generation with each drafter.

    The drafters are tried in the order of :meth:`Setup.candidates`; the
    first one the method runs with is its drafter. ``methods`` defaults to the
    registry's (``mlx_spec.drafters.registry.METHODS``, read at call time), so
    a new drafter joins with no change to the harness.

    mlx-lm's speculative mode is tried too, with its draft model.

    Returns:
        ``(drafters, skipped)``: method -> the drafter it runs with (``None``
        for none), and method -> why it was skipped.
    """
    drafters, skipped = {}, {}
    saved = setup.max_tokens
    setup.max_tokens = 2
    try:
        if setup.draft_for(MLX_LM_SPECULATIVE) is not None:
            try:
                run_mlx_lm(setup, ids, 0.0, 2, 0, speculative=True)
                drafters[MLX_LM_SPECULATIVE] = setup.draft_for(MLX_LM_SPECULATIVE)
            except Exception as e:  # e.g. caches mlx-lm cannot trim
                skipped[MLX_LM_SPECULATIVE] = _first_line(e)
        for method in registry.METHODS if methods is None else methods:
            for drafter in setup.candidates(method):
                try:
                    run_mlx_spec(setup, method, ids, 0.0, None, 0, drafter=drafter)
                except Exception as e:  # a method still being written
                    skipped.setdefault(method, _first_line(e))
                    if "not available" in str(e):
                        break
                    continue
                drafters[method] = drafter
                skipped.pop(method, None)
                break
    finally:
        setup.max_tokens = saved
    return drafters, skipped
