"""Speculation on a sharded target against sharded plain decoding, by link latency.

Run on every rank with ``mlx.launch``, or on one machine with Open MPI's
``mpirun`` (its all-reduce costs microseconds there, the ring's milliseconds)::

    mlx.launch --backend ring -n 2 -- python -m mlx_spec.bench.sharded --out DIR
    mpirun -np 2 python -m mlx_spec.bench.sharded --out DIR

Each collective of a sharded forward (an all-reduce per sharded layer, a
send per pipeline stage) pays the link's latency once, whatever the number
of tokens it carries: plain decoding pays it per token, speculation once
per round. ``--delays`` adds a fixed wait before every collective (0.3 ms is
about Thunderbolt, 1 ms Ethernet), so the amortisation shows even on one
machine. Rank 0 writes ``sharded.json``, ``sharded.md`` and, with
matplotlib, ``sharded.png`` (speedup against latency).
"""

import argparse
import json
from pathlib import Path
from statistics import geometric_mean
from typing import Dict, List

from mlx_spec_entry import guarded

from ..distributed import (
    barrier,
    collective_delay,
    errors_in_one_line,
    rank,
    rank0_prints,
    sharded_group,
)
from ..generation import stream_generate
from ..loading import default_model_pair, load_draft, load_sharded_model
from .prompts import encode, prompt_suite

DEFAULT_DELAYS_MS = (0.0, 0.3, 1.0)
DEFAULT_METHODS = ("none", "draft", "tree", "lookup", "eagle")
DRAFTLESS = ("none", "lookup", "self")


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx_spec.bench.sharded",
        description="Speculative vs plain decoding on a sharded target, by link "
        "latency (run under mlx.launch).",
    )
    p.add_argument("--model", help="Target (default: the default target).")
    p.add_argument("--draft-model", help="Draft (default: the shipped draft).")
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        help="Methods to measure; plain decoding (none), the baseline, always runs.",
    )
    p.add_argument(
        "--delays",
        nargs="+",
        type=float,
        default=list(DEFAULT_DELAYS_MS),
        help="Added latency per collective, in milliseconds.",
    )
    p.add_argument("--prompt-sets", nargs="+", default=["chat"])
    p.add_argument("--prompts-per-set", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--pipeline", action="store_true", help="Pipeline stages.")
    p.add_argument("--out", required=True, help="Folder of the results (rank 0).")
    return p


def _default_pair(method: str):
    """The default pair, built once by rank 0 while the others wait."""
    if rank() == 0:
        pair = default_model_pair(method)
    barrier()
    return pair if rank() == 0 else default_model_pair(method, build=False)


def _drafters(methods, draft_model, model, tokenizer) -> Dict[str, object]:
    drafters = {}
    for method in methods:
        if method in DRAFTLESS:
            drafters[method] = None
            continue
        path = draft_model
        if path is None:
            _, path = _default_pair(method)
        if path is None:
            raise ValueError(
                f"no shipped drafter for --methods {method}: pass --draft-model, "
                "or in a checkout run with MLX_SPEC_HOME=. (the drafters are in models/)."
            )
        drafters[method] = load_draft(path, model, tokenizer)
    return drafters


def _run(model, tokenizer, drafter, method, prompt, max_tokens) -> Dict:
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        draft_model=drafter,
        speculative=method,
        max_tokens=max_tokens,
    )
    tokens = [r.token for r in stream]
    stats = stream.stats
    forwards = stats.rounds if method != "none" else len(tokens)
    return {
        "tokens": len(tokens),
        "seconds": stats.generation_time,
        "forwards": forwards,
        "ids": tokens,
    }


def measure(args) -> List[Dict]:
    """One row per (delay, method): pooled tokens/s and tokens per target forward."""
    model_path = args.model or _default_pair("none")[0]
    model, tokenizer = load_sharded_model(model_path, pipeline=args.pipeline)
    methods = ["none"] + [m for m in args.methods if m != "none"]
    drafters = _drafters(methods, args.draft_model, model, tokenizer)
    prompts = [
        p
        for s in args.prompt_sets
        for p in prompt_suite(sets=[s], chat=True)[: args.prompts_per_set]
    ]
    ids = [encode(p, tokenizer, chat=True) for p in prompts]
    _run(model, tokenizer, None, "none", ids[0], 4)  # warm-up
    rows = []
    for delay in args.delays:
        with collective_delay(delay / 1000):
            # Methods interleaved per prompt: a shared machine's load drifts
            # over minutes, and each prompt's ratio then sees the same load.
            runs = {method: [] for method in methods}
            for p in ids:
                for method in methods:
                    drafter = drafters[method]
                    run = _run(model, tokenizer, drafter, method, p, args.max_tokens)
                    runs[method].append(run)
        for method in methods:
            rows.append(_row(delay, method, runs[method], runs["none"]))
            if rank() == 0:
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _row(delay: float, method: str, runs: List[Dict], plain: List[Dict]) -> Dict:
    """Pooled tokens/s and tokens per forward of ``runs``, and against the
    ``plain`` runs of the same prompts: the geometric mean of the per-prompt
    speed ratios, and whether the outputs were identical."""
    tokens = sum(r["tokens"] for r in runs)
    row = {
        "delay_ms": delay,
        "method": method,
        "tokens_per_s": tokens / sum(r["seconds"] for r in runs),
        "tokens_per_forward": tokens / sum(r["forwards"] for r in runs),
    }
    row["identical"] = all(a["ids"] == b["ids"] for a, b in zip(runs, plain))
    row["x_plain"] = geometric_mean(
        (r["tokens"] / r["seconds"]) / (q["tokens"] / q["seconds"])
        for r, q in zip(runs, plain)
    )
    return row


def table(rows: List[Dict], processes: int, pipeline: bool) -> str:
    """Markdown: × sharded plain per method and delay, tokens per forward."""
    delays = sorted({r["delay_ms"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    kind = "pipeline" if pipeline else "tensor parallel"
    lines = [
        f"{processes} processes, {kind}; × sharded plain decoding (tokens per "
        "target forward)",
        "",
        "| method | " + " | ".join(f"{d:g} ms" for d in delays) + " |",
        "|---|" + "---|" * len(delays),
    ]
    for method in methods:
        cells = []
        for d in delays:
            row = next(r for r in rows if r["method"] == method and r["delay_ms"] == d)
            mark = "" if row.get("identical", True) else " (differs!)"
            cells.append(
                f"{row.get('x_plain', 1.0):.2f} ({row['tokens_per_forward']:.2f}){mark}"
            )
        lines.append(f"| `{method}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: List[Dict], path: Path):
    """Speedup against added latency, one line per method (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted(
            (r for r in rows if r["method"] == method), key=lambda r: r["delay_ms"]
        )
        ax.plot(
            [r["delay_ms"] for r in mine],
            [r.get("x_plain", 1.0) for r in mine],
            "o-",
            label=method,
        )
    ax.set_xlabel("added latency per collective (ms)")
    ax.set_ylabel("× sharded plain decoding")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    rank0_prints()
    with errors_in_one_line(parser, (ValueError,)):
        group = sharded_group()
        rows = measure(args)
    if rank() == 0:
        out = Path(args.out).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        (out / "sharded.json").write_text(json.dumps(rows, indent=2) + "\n")
        md = table(rows, group.size(), args.pipeline)
        (out / "sharded.md").write_text(md)
        plot(rows, out / "sharded.png")
        print(md)
    barrier()  # leave together


if __name__ == "__main__":
    guarded(main)
