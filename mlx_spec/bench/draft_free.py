"""Prompt lookup and self-speculation against plain decoding, in one run.

Usage::

    python -m mlx_spec.bench.draft_free --model models/smollm2-135m-instruct
    python -m mlx_spec.bench.draft_free --model PATH --gammas 2 4 8 --max-tokens 128 --json out.json

For each prompt set (``editing``: repeat a text or function with one change;
``summarize`` for a model with a chat template, ``free_text`` to continue
otherwise) it runs plain ``mlx_lm`` decoding, prompt
lookup as a chain at several γ and as a tree, and self-speculation at
several γ, with the same prompts and token budget. Warm-up runs come first
and repetitions are interleaved so machine noise hits every method alike.

Reported per method and prompt set:

* ``tok/fwd``: generated tokens / target forwards (1.00 for plain decoding);
* ``tok/s``: generated tokens / wall time from the call to the last token
  (prompt processing, and self-speculation's layer search, included);
* ``× plain``: ``tok/s`` over plain decoding's in the same run.
"""

import argparse
import json
import time
from contextlib import contextmanager
from typing import Dict, List, Tuple

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlx_spec import SpecConfig, SpecStats, speculative_generate_step
from mlx_spec.drafters.registry import FACTORIES as DRAFTER_FACTORIES
from mlx_spec.drafters.self_spec import SelfDrafter
from mlx_spec.loading import load_model
from mlx_spec.options import one_line_errors
from mlx_spec.validation import DRAFTER_LATER, check_gammas, spec_config
from mlx_spec_entry import guarded

from .options import check_run_lengths
from .prompts import encode, has_chat_template, prompt_suite

DEFAULT_GAMMAS = (2, 4, 8)
DEFAULT_SELF_GAMMAS = (2, 4)
DEFAULT_MAX_TOKENS = 96
DEFAULT_REPEATS = 2
PROMPT_SETS = ("editing", "free_text")
CHAT_PROMPT_SETS = ("editing", "summarize")


def method_grid(gammas, self_gammas, self_skip=None) -> List[Tuple[str, Dict]]:
    """``(label, SpecConfig fields)`` of every method run; ``None`` is plain.

    ``self_skip`` adds self-speculation with those blocks skipped, drafting
    even where the layer search would not (field ``_skip``, not a config one).
    """
    grid = [("plain", None)]
    grid += [
        (f"lookup γ={g}", dict(method="lookup", num_draft_tokens=g, adaptive=False))
        for g in gammas
    ]
    grid.append(("lookup adaptive", dict(method="lookup")))
    grid.append(
        (
            "lookup tree",
            dict(
                method="lookup",
                lookup_candidates=4,
                tree_budget=16,
                num_draft_tokens=8,
                adaptive=False,
            ),
        )
    )
    grid += [
        (f"self γ={g}", dict(method="self", num_draft_tokens=g, adaptive=False))
        for g in self_gammas
    ]
    grid.append(("self adaptive", dict(method="self")))
    if self_skip is not None:
        grid += [
            (
                f"self skip={self_skip} γ={g}",
                dict(
                    method="self", num_draft_tokens=g, adaptive=False, _skip=self_skip
                ),
            )
            for g in self_gammas
        ]
    return grid


@contextmanager
def fixed_self_skip(skip: List[int]):
    """Make ``--speculative self`` skip exactly ``skip`` while inside."""

    def factory(config, target, draft_model, cache, kv, vocab_size):
        return SelfDrafter(target, vocab_size, skipped=skip)

    saved = DRAFTER_FACTORIES["self"]
    DRAFTER_FACTORIES["self"] = factory
    try:
        yield
    finally:
        DRAFTER_FACTORIES["self"] = saved


def run_once(model, ids: List[int], fields, max_tokens: int, temp: float):
    """One generation: ``(tokens, target forwards, seconds, stats or None)``."""
    prompt = mx.array(ids)
    tic = time.perf_counter()
    if fields is None:
        sampler = None if temp == 0 else (lambda lp: mx.random.categorical(lp / temp))
        out = [
            t
            for t, _ in generate_step(
                prompt, model, max_tokens=max_tokens, sampler=sampler
            )
        ]
        return len(out), len(out), time.perf_counter() - tic, None
    stats = SpecStats()
    fields = dict(fields)
    skip = fields.pop("_skip", None)
    config = SpecConfig(max_tokens=max_tokens, temp=temp, **fields)
    if skip is not None:
        with fixed_self_skip(skip):
            out = [
                t
                for t, _, _ in speculative_generate_step(
                    prompt, model, config=config, stats=stats
                )
            ]
        return len(out), stats.target_forwards, time.perf_counter() - tic, stats
    out = [
        t
        for t, _, _ in speculative_generate_step(
            prompt, model, config=config, stats=stats
        )
    ]
    return len(out), stats.target_forwards, time.perf_counter() - tic, stats


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.draft_free", description=__doc__.split("\n")[0]
    )
    one_line_errors(parser)
    parser.add_argument("--model", required=True, help="Target model path or repo.")
    parser.add_argument("--gammas", type=int, nargs="+", default=list(DEFAULT_GAMMAS))
    parser.add_argument(
        "--self-gammas", type=int, nargs="+", default=list(DEFAULT_SELF_GAMMAS)
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument(
        "--self-skip",
        type=int,
        nargs="+",
        default=None,
        help="Also run self-speculation skipping exactly these blocks.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="First prompt of each set only."
    )
    parser.add_argument(
        "--json", default=None, help="Also write the rows to this file."
    )
    args = parser.parse_args(argv)
    try:  # the ranges and the model's path, before anything loads
        check_gammas(args.gammas, "--gammas")
        check_gammas(args.self_gammas, "--self-gammas")
        check_run_lengths(args.max_tokens, args.repeats)
        spec_config(None, DRAFTER_LATER, flags=True, temp=args.temp)
        model, tokenizer = load_model(args.model)
    except ValueError as e:
        parser.error(str(e))
    grid = method_grid(args.gammas, args.self_gammas, args.self_skip)
    chat = has_chat_template(tokenizer)
    sets = CHAT_PROMPT_SETS if chat else PROMPT_SETS
    prompts = prompt_suite(quick=args.quick, sets=sets, chat=chat)
    encoded = [(p.prompt_set, encode(p, tokenizer, chat=chat)) for p in prompts]
    for _, fields in grid:  # warm-up
        run_once(model, encoded[0][1], fields, 8, args.temp)

    totals: Dict[Tuple[str, str], List[float]] = {}
    skipped: Dict[str, List] = {}
    mx.random.seed(0)
    for rep in range(args.repeats):
        for i, (prompt_set, ids) in enumerate(encoded):
            shift = (rep + i) % len(grid)  # rotate the method order
            for label, fields in grid[shift:] + grid[:shift]:
                tokens, forwards, seconds, stats = run_once(
                    model, ids, fields, args.max_tokens, args.temp
                )
                row = totals.setdefault((prompt_set, label), [0, 0, 0.0])
                row[0] += tokens
                row[1] += forwards
                row[2] += seconds
                if stats is not None and stats.skipped_layers is not None:
                    skipped.setdefault(label, []).append(stats.skipped_layers)

    rows = []
    for prompt_set in sets:
        plain_tps = None
        for label, _ in grid:
            tokens, forwards, seconds = totals[(prompt_set, label)]
            tps = tokens / seconds
            plain_tps = tps if plain_tps is None else plain_tps
            rows.append(
                dict(
                    prompt_set=prompt_set,
                    method=label,
                    tokens_per_target_forward=tokens / forwards,
                    tokens_per_s=tps,
                    speedup=tps / plain_tps,
                )
            )
    print(
        f"model {args.model}, {args.max_tokens} tokens, temp {args.temp}, "
        f"{len(prompts)} prompts x {args.repeats} repeats"
    )
    print("| prompt set | method | tok/fwd | tok/s | × plain |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['prompt_set']} | {r['method']} | {r['tokens_per_target_forward']:.2f} | "
            f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f} |"
        )
    for label, sets in skipped.items():
        print(f"{label}: skipped layers per run {sets}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(args=vars(args), rows=rows, skipped=skipped), f, indent=2)


if __name__ == "__main__":
    guarded(main)
