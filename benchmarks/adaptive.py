"""Adaptive draft length against a sweep of fixed ones, in one run.

Usage::

    python -m benchmarks.adaptive                       # the default pair in models/
    python -m benchmarks.adaptive --methods draft lookup self --gammas 1 2 3 4 6 8
    python -m benchmarks.adaptive --model PATH --draft-model PATH --json out.json

For each method it runs plain ``mlx_lm`` decoding, the method with every
fixed γ in ``--gammas`` (``--no-adaptive``) and the method with adaptive
control (the default, starting from γ = 4), on the same prompts, token budget
and seed. A warm-up comes first and the order rotates from prompt to prompt
so machine noise hits every configuration alike.

Reported per method and configuration: tokens per target forward, decode
tokens/s (first token to last, so the prompt and self-speculation's layer
search are excluded) and its ratio to plain decoding, and the verdicts the
adaptive controller is held to: it beats the default fixed γ and stays
within 5% of the best fixed γ.
"""

import mlx_spec  # noqa: F401  (must precede mlx: it preloads OpenBLAS)

# isort: split
import argparse
import json
import statistics
import time
from typing import Dict, List, Optional

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import generate_step

from mlx_spec import SpecConfig, SpecStats, speculative_generate_step
from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS
from mlx_spec.loading import default_model_pair

from .prompts import prompt_suite

DEFAULT_GAMMAS = (1, 2, 3, 4, 6, 8)
DEFAULT_METHODS = ("draft", "lookup", "self")
DEFAULT_SETS = ("code_completion", "editing", "free_text")


def run_once(model, draft, ids: List[int], fields: Optional[Dict], max_tokens: int):
    """One greedy generation: ``(tokens, decode seconds, target forwards)``."""
    prompt = mx.array(ids)
    times = []
    if fields is None:
        for _ in generate_step(prompt, model, max_tokens=max_tokens):
            times.append(time.perf_counter())
        forwards = len(times)
    else:
        stats = SpecStats()
        config = SpecConfig(max_tokens=max_tokens, **fields)
        uses_draft = fields["method"] in ("draft", "tree")
        for _ in speculative_generate_step(
            prompt, model, draft if uses_draft else None, config=config, stats=stats
        ):
            times.append(time.perf_counter())
        forwards = stats.target_forwards
    return len(times) - 1, times[-1] - times[0], forwards


def configurations(method: str, gammas) -> Dict[str, Dict]:
    grid = {
        f"γ={g}": dict(method=method, num_draft_tokens=g, adaptive=False)
        for g in gammas
    }
    grid["adaptive"] = dict(method=method, adaptive=True)
    return grid


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="Default: models/ target.")
    parser.add_argument("--draft-model", default=None, help="Default: models/ draft.")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--gammas", type=int, nargs="+", default=list(DEFAULT_GAMMAS))
    parser.add_argument("--prompt-sets", nargs="+", default=list(DEFAULT_SETS))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="One prompt per set.")
    parser.add_argument("--json", default=None, help="Also write the rows here.")
    args = parser.parse_args(argv)

    if args.model is None:
        args.model, default_draft = default_model_pair()
        args.draft_model = args.draft_model or default_draft
    model, tokenizer = mlx_lm.load(str(args.model))
    draft = mlx_lm.load(str(args.draft_model))[0] if args.draft_model else None
    prompts = prompt_suite(quick=args.quick, sets=args.prompt_sets)
    encoded = [tokenizer.encode(p.text) for p in prompts]

    grid = {("plain", "plain"): None}
    for method in args.methods:
        if method in ("draft", "tree") and draft is None:
            raise SystemExit(f"--methods {method} needs --draft-model.")
        for label, fields in configurations(method, args.gammas).items():
            grid[(method, label)] = fields
    keys = list(grid)
    for key in keys:  # warm-up
        run_once(model, draft, encoded[0], grid[key], 16)

    # ratio[(method, label)] = per-run tokens/s over plain's in the same pass
    tps: Dict = {key: [] for key in keys}
    tpf: Dict = {key: [0, 0] for key in keys}
    for rep in range(args.repeats):
        for i, ids in enumerate(encoded):
            shift = (rep + i) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                tokens, seconds, forwards = run_once(
                    model, draft, ids, grid[key], args.max_tokens
                )
                tps[key].append(tokens / max(seconds, 1e-9))
                tpf[key][0] += tokens + 1
                tpf[key][1] += forwards
    plain = tps[("plain", "plain")]
    rows = []
    for key in keys:
        ratios = [a / b for a, b in zip(tps[key], plain)]
        rows.append(
            dict(
                method=key[0],
                config=key[1],
                tokens_per_target_forward=tpf[key][0] / max(tpf[key][1], 1),
                tokens_per_s=statistics.median(tps[key]),
                speedup_vs_plain=statistics.median(ratios),
            )
        )

    print(
        f"model {args.model}, draft {args.draft_model}, {args.max_tokens} tokens, "
        f"greedy, {len(prompts)} prompts x {args.repeats} repeats "
        "(medians of per-run ratios to plain decoding in the same pass)"
    )
    print("| method | config | tok/fwd | tok/s | × plain |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['config']} | {r['tokens_per_target_forward']:.2f} "
            f"| {r['tokens_per_s']:.1f} | {r['speedup_vs_plain']:.2f} |"
        )
    verdicts = []
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        fixed = [r for r in mine if r["config"] != "adaptive"]
        adaptive = next(r for r in mine if r["config"] == "adaptive")
        best = max(fixed, key=lambda r: r["speedup_vs_plain"])
        default = next(
            (r for r in fixed if r["config"] == f"γ={DEFAULT_NUM_DRAFT_TOKENS}"), None
        )
        within = adaptive["speedup_vs_plain"] / best["speedup_vs_plain"]
        line = (
            f"{method}: adaptive {adaptive['speedup_vs_plain']:.2f}x, best fixed "
            f"{best['config']} {best['speedup_vs_plain']:.2f}x "
            f"(adaptive/best = {within:.3f}, goal >= 0.95)"
        )
        if default is not None:
            beats = adaptive["speedup_vs_plain"] / default["speedup_vs_plain"]
            line += f", adaptive/default γ={DEFAULT_NUM_DRAFT_TOKENS} = {beats:.3f}"
        verdicts.append(line)
    print("\n".join(verdicts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "verdicts": verdicts, "args": vars(args)}, f, indent=1
            )


if __name__ == "__main__":
    main()
