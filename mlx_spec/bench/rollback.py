"""What exact rollback costs on recurrent and sliding-window models, as a share of a round.

Usage::

    python -m mlx_spec.bench.rollback                       # every rollback family, γ = 4
    python -m mlx_spec.bench.rollback --archs qwen3_next mamba2 --max-tokens 96 --json out.json

For each test fixture family (``mlx_spec.testing.ROLLBACK_ARCHITECTURES``:
the target and its ``-near`` draft, both with recurrent or sliding-window
layers) it measures, in one process:

* **share of a round** (the number the design is judged by): speculative
  decoding with the draft method at fixed γ, with every cache rewind
  (target and draft) timed: the rewound states are evaluated inside the
  timer, so the share is the rewinds' time over the whole generation time
  of the same runs (an upper bound: the extra syncs forgo overlap);
* **the designs compared**, per round on the target alone after a prompt,
  as multiples of one verification forward of γ + 1 tokens, averaged over
  the accepted counts the runs above saw:

  - ``replay`` (used): restore the snapshot, replay the kept tokens through
    the recurrent mixers only, their projections reused from the verification;
  - ``per-position states``: run each recurrent mixer one token at a time
    inside the verification, keeping every intermediate state (the extra
    cost of that verification, paid every round);
  - ``re-forward``: restore the snapshot, run the whole model again on the
    kept tokens.

Timings are ratios within one run on this machine; runs are interleaved and
medians reported. Greedy output is checked against plain mlx_lm decoding.
"""

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from typing import Dict, List

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import generate_step

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.caches import CacheRollback, capture, leaf_caches
from mlx_spec.engine import speculative_events
from mlx_spec.options import one_line_errors
from mlx_spec.testing import PROMPTS, ROLLBACK_ARCHITECTURES, test_checkpoints
from mlx_spec.validation import check_gammas
from mlx_spec_entry import guarded

from .options import check_run_lengths

DEFAULT_GAMMA = 4
DEFAULT_MAX_TOKENS = 64
DEFAULT_REPEATS = 3
MICRO_REPEATS = 20


def _states(cache) -> List:
    return [c.state for c in leaf_caches(cache)]


@contextmanager
def timed_rewinds(record: List[float]):
    """Time every ``CacheRollback.trim_to``, its rewound states evaluated inside."""
    original = CacheRollback.trim_to

    def trim_to(self, length):
        mx.eval(_states(self.cache))  # the round's own work is not counted
        tic = time.perf_counter()
        original(self, length)
        mx.eval(_states(self.cache))
        record.append(time.perf_counter() - tic)

    CacheRollback.trim_to = trim_to
    try:
        yield
    finally:
        CacheRollback.trim_to = original


def engine_runs(model, draft, prompts, gamma, max_tokens, repeats) -> Dict:
    """Rewind share of the generation time, acceptance histogram, greedy check."""
    config = SpecConfig(
        method="draft", num_draft_tokens=gamma, max_tokens=max_tokens, adaptive=False
    )
    shares, histogram, identical = [], [0] * (gamma + 1), True
    rewind_total = generation_total = 0.0
    rounds = 0
    for ids in prompts:  # warm-up
        list(speculative_events(mx.array(ids), model, draft, config=config))
    for _ in range(repeats):
        for ids in prompts:
            stats, record = SpecStats(), []
            with timed_rewinds(record):
                out = [
                    e.token
                    for e in speculative_events(
                        mx.array(ids), model, draft, config=config, stats=stats
                    )
                ]
            plain = [
                t for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens)
            ]
            identical &= out == plain
            shares.append(sum(record) / stats.generation_time)
            rewind_total += sum(record)
            generation_total += stats.generation_time
            rounds += stats.rounds
            for n in stats.accepted_per_round:
                histogram[n] += 1
    return {
        "rewind_share_median": statistics.median(shares),
        "rewind_share_total": rewind_total / generation_total,
        "round_ms": 1e3 * generation_total / rounds,
        "rewind_ms_per_round": 1e3 * rewind_total / rounds,
        "accepted_histogram": histogram,
        "greedy_identical": identical,
    }


@contextmanager
def stepped_mixers():
    """Run every captured recurrent mixer one token at a time (per-position states)."""
    original = capture._captured_call

    def call(self, *args, **kwargs):
        from mlx_spec.caches.recurrent import sequence_length

        cls = type(self)._mlx_spec_original
        length = sequence_length(args, kwargs)
        if length == 1 or not any(
            type(v).__name__ == "ArraysCache" for v in (*args, *kwargs.values())
        ):
            return original(self, *args, **kwargs)
        outs = []
        for t in range(length):
            step = lambda v: (  # noqa: E731
                v[:, t : t + 1]
                if isinstance(v, mx.array) and v.ndim >= 2 and v.shape[1] == length
                else v
            )
            outs.append(
                cls.__call__(
                    self,
                    *(step(a) for a in args),
                    **{k: step(v) for k, v in kwargs.items()},
                )
            )
        return mx.concatenate(outs, axis=1)

    for cls in capture._CAPTURED_CLASSES.values():
        cls.__call__ = call
    try:
        yield
    finally:
        for cls in capture._CAPTURED_CLASSES.values():
            cls.__call__ = original


def design_costs(model, prompt, gamma, histogram) -> Dict:
    """Per-round cost of each design, in verification forwards (see the module docstring)."""
    cache = mlx_lm.models.cache.make_prompt_cache(model)
    rollback = CacheRollback(model, cache)
    model(mx.array([prompt]), cache=cache)
    mx.eval(_states(cache))
    size = len(prompt)
    tokens = mx.array([list(range(3, 4 + gamma))])

    def verify(x=tokens):
        rollback.mark(size)
        mx.eval(model(x, cache=cache), _states(cache))

    def reset():
        rollback.trim_to(size)
        mx.eval(_states(cache))

    samples: Dict[str, List[float]] = {"verify": [], "stepped": []}
    for n in range(gamma):
        samples[f"replay {n}"], samples[f"reforward {n}"] = [], []
    for _ in range(MICRO_REPEATS):
        tic = time.perf_counter()
        verify()
        samples["verify"].append(time.perf_counter() - tic)
        reset()
        with stepped_mixers():
            tic = time.perf_counter()
            verify()
            samples["stepped"].append(time.perf_counter() - tic)
        reset()
        for n in range(gamma):  # n accepted: keep n + 1 tokens
            verify()
            tic = time.perf_counter()
            rollback.trim_to(size + n + 1)
            mx.eval(_states(cache))
            samples[f"replay {n}"].append(time.perf_counter() - tic)
            reset()
            tic = time.perf_counter()
            reset()  # the snapshot restored, then the model again on n + 1 tokens
            verify(tokens[:, : n + 1])
            samples[f"reforward {n}"].append(time.perf_counter() - tic)
            reset()
    med = {k: statistics.median(v) for k, v in samples.items()}
    rounds = max(sum(histogram), 1)
    weights = [histogram[n] / rounds for n in range(gamma)]  # n = γ needs nothing
    replay = sum(w * med[f"replay {n}"] for n, w in enumerate(weights))
    reforward = sum(w * med[f"reforward {n}"] for n, w in enumerate(weights))
    return {
        "verify_ms": 1e3 * med["verify"],
        "replay_per_round": replay / med["verify"],
        "per_position_states_per_round": (med["stepped"] - med["verify"])
        / med["verify"],
        "reforward_per_round": reforward / med["verify"],
        "replay_by_accepted": [
            med[f"replay {n}"] / med["verify"] for n in range(gamma)
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.rollback", description=__doc__.split("\n")[0]
    )
    one_line_errors(parser)
    parser.add_argument(
        "--archs",
        nargs="+",
        choices=ROLLBACK_ARCHITECTURES,
        default=list(ROLLBACK_ARCHITECTURES),
    )
    parser.add_argument("--gamma", type=int, default=DEFAULT_GAMMA)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--json", help="Write the results to this file.")
    args = parser.parse_args(argv)
    try:  # before any checkpoint is built or loaded
        check_gammas([args.gamma], "--gamma")
        check_run_lengths(args.max_tokens, args.repeats)
    except ValueError as e:
        parser.error(str(e))
    paths = test_checkpoints()
    results = {}
    print(
        f"γ = {args.gamma}, draft method, {args.max_tokens} tokens x "
        f"{len(PROMPTS)} prompts x {args.repeats} repeats"
    )
    header = (
        "| family | round (ms) | rewinds / round | share of round | greedy = mlx_lm "
        "| replay | per-position states | re-forward |"
    )
    print(header)
    print("|" + "---|" * 8)
    for arch in args.archs:
        model, tokenizer = mlx_lm.load(str(paths[arch]))
        draft, _ = mlx_lm.load(str(paths[f"{arch}-near"]))
        prompts = [tokenizer.encode(p) for p in PROMPTS]
        run = engine_runs(
            model, draft, prompts, args.gamma, args.max_tokens, args.repeats
        )
        design = design_costs(model, prompts[0], args.gamma, run["accepted_histogram"])
        results[arch] = {**run, **design}
        print(
            f"| {arch} | {run['round_ms']:.2f} | {run['rewind_ms_per_round']:.3f} ms "
            f"| {100 * run['rewind_share_total']:.1f}% "
            f"| {'yes' if run['greedy_identical'] else 'NO'} "
            f"| {design['replay_per_round']:.2f} "
            f"| {design['per_position_states_per_round']:.2f} "
            f"| {design['reforward_per_round']:.2f} |",
            flush=True,
        )
    print(
        "\nreplay / per-position states / re-forward: extra cost per round in "
        "verification forwards of γ + 1 tokens (target alone)."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gamma": args.gamma, "results": results}, f, indent=2)


if __name__ == "__main__":
    guarded(main)
