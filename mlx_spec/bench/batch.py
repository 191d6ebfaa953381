"""``mlx_spec.batch_generate`` against ``mlx_lm.batch_generate``, in one run.

Usage::

    python -m mlx_spec.bench.batch                      # default pair, 4 and 16 prompts
    python -m mlx_spec.bench.batch --model PATH --draft-model PATH --batch-sizes 8 --json out.json

Each batch holds the first prompts of the built-in suite (chat, code, editing
and summarize in turn, through the chat template when the model has one).
Every batch size runs ``mlx_lm.batch_generate`` and ``mlx_spec.batch_generate``
with each method on the same prompts and token budget (greedy unless
``--temp``, sampled rows seeded alike); warm-up runs
come first and repeats are interleaved, so machine noise hits every method
alike. Reported per batch size and method:

* ``tok/s``: generated tokens over the wall time of the call (prompt
  processing included, as a caller sees it);
* ``× mlx_lm``: that over ``mlx_lm.batch_generate``'s, from the best repeat of each;
* ``identical``: every row's tokens equal mlx_lm's (greedy only: sampled
  rows draw their own answers).
"""

import argparse
import json
import time
from typing import Dict, List

import mlx.core as mx
import mlx_lm
from mlx_lm.sample_utils import make_sampler

from mlx_spec import batch_generate as spec_batch_generate
from mlx_spec.loading import default_model_pair, load_draft, load_model
from mlx_spec.options import one_line_errors
from mlx_spec.serve.batch import BATCH_METHODS
from mlx_spec_entry import guarded

from .prompts import encode, has_chat_template, prompt_suite

DEFAULT_BATCH_SIZES = (4, 16)
DEFAULT_MAX_TOKENS = 48
DEFAULT_REPEATS = 2
BASELINE = "mlx_lm"


def batch_prompts(tokenizer, size: int) -> List[List[int]]:
    """The first ``size`` prompts of the suite, taking the sets in turn."""
    chat = has_chat_template(tokenizer)
    suite = prompt_suite(chat=chat)
    by_set: Dict[str, list] = {}
    for p in suite:
        by_set.setdefault(p.prompt_set, []).append(p)
    ordered = [p for group in zip(*by_set.values()) for p in group]
    ordered += [p for p in suite if p not in ordered]
    chosen = [ordered[i % len(ordered)] for i in range(size)]
    return [encode(p, tokenizer, chat=chat) for p in chosen]


def run_once(
    method: str, model, tokenizer, draft, prompts, max_tokens: int, temp: float = 0.0
):
    """One call: ``(token ids per row, seconds)``."""
    mx.random.seed(0)
    tic = time.perf_counter()
    if method == BASELINE:
        out = mlx_lm.batch_generate(
            model,
            tokenizer,
            prompts,
            max_tokens=max_tokens,
            sampler=make_sampler(temp),
            return_token_ids=True,
        )
    else:
        out = spec_batch_generate(
            model,
            tokenizer,
            prompts,
            draft_model=draft,
            speculative=method,
            max_tokens=max_tokens,
            temp=temp,
            return_token_ids=True,
        )
    return out.token_ids, time.perf_counter() - tic


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.batch", description=__doc__.split("\n")[0]
    )
    one_line_errors(parser)
    parser.add_argument("--model", default=None, help="Target (default: the pair's).")
    parser.add_argument(
        "--draft-model", default=None, help="Draft model (default: the pair's)."
    )
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES)
    )
    parser.add_argument(
        "--methods", nargs="+", choices=BATCH_METHODS, default=list(BATCH_METHODS)
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--temp", type=float, default=0.0, help="Sampling temperature.")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--json", default=None, help="Also write the rows here.")
    return parser


def main(argv=None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if min(args.batch_sizes) < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--batch-sizes, --max-tokens and --repeats must be at least 1.")
    if not 0 <= args.temp < float("inf"):
        parser.error(f"--temp={args.temp} is out of range: 0 or more.")
    target, draft_path = args.model, args.draft_model
    if target is None:
        target, pair_draft = default_model_pair()
        draft_path = draft_path or pair_draft
    try:
        model, tokenizer = load_model(target, "model")
        draft = load_draft(draft_path, model, tokenizer) if draft_path else None
    except ValueError as e:  # a bad path, or a draft of another tokenizer
        parser.error(str(e))
    methods = [m for m in args.methods if m != "draft" or draft is not None]
    grid = [BASELINE, *methods]

    rows = []
    for size in args.batch_sizes:
        prompts = batch_prompts(tokenizer, size)
        for method in grid:  # warm-up
            run_once(method, model, tokenizer, draft, prompts[:2], 4)
        best: Dict[str, float] = {}
        tokens: Dict[str, List[List[int]]] = {}
        for rep in range(args.repeats):
            shift = rep % len(grid)  # rotate the method order
            for method in grid[shift:] + grid[:shift]:
                ids, seconds = run_once(
                    method, model, tokenizer, draft, prompts, args.max_tokens, args.temp
                )
                best[method] = min(best.get(method, seconds), seconds)
                tokens[method] = ids
        # Each call reseeds, so a method's repeats emit the same tokens.
        rate = {m: sum(map(len, tokens[m])) / best[m] for m in grid}
        for method in grid:
            rows.append(
                dict(
                    batch_size=size,
                    method=method,
                    tokens_per_s=rate[method],
                    speedup=rate[method] / rate[BASELINE],
                    identical=(
                        tokens[method] == tokens[BASELINE] if args.temp == 0 else None
                    ),
                )
            )

    sampling = "greedy" if args.temp == 0 else f"temp {args.temp}"
    print(f"model {target}, draft {draft_path}, {args.max_tokens} tokens, {sampling}")
    print("| prompts | method | tok/s | × mlx_lm | identical |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch_size']} | {r['method']} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f} | {r['identical']} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=2)
    return rows


if __name__ == "__main__":
    guarded(main)
