"""``mlx_spec corpus``: grow and describe a committed distillation corpus.

- ``mlx_spec corpus grow --model M --out DIR [--tokens N]``: the target answers
  prompts not yet in ``DIR`` and appends a shard every few minutes (resume:
  run it again); the card ``DIR/README.md`` is rewritten after each shard.
- ``mlx_spec corpus info DIR``: sizes and breakdown, and the card refreshed.

Example::

    nohup nice -n 19 mlx_spec corpus grow --model models/smollm2-135m-instruct \\
        --out models/smollm2-135m-corpus --tokens 1000000 &
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

from mlx_spec_entry import exit_interrupted

from ..config import check_size
from ..options import one_line_errors
from ..outdir import check_out_dir, check_outside
from . import corpus_grow as G
from .corpus import DEFAULT_CAP_BYTES, Corpus, CorpusFull
from .corpus_prompts import FAMILY_NOTES

DEFAULT_SELF_INSTRUCT = 64
DEFAULT_SWEEP = (32, 64, 96, 128)
DEFAULT_SWEEP_SECONDS = 300.0
# Untimed seconds before each size is timed: rows of every length are in flight by then.
DEFAULT_SWEEP_WARMUP = 120.0
SWEEP_FILE = "sweep.json"
FORCE_HELP = "write into an --out folder that holds files other than a corpus"


def add_max_tokens(parser: argparse.ArgumentParser):
    """``--max-tokens`` of grow and sweep (checked by :func:`check_max_tokens`)."""
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=G.DEFAULT_MAX_TOKENS,
        help="Longest completion, the same in grow and sweep "
        f"(default: {G.DEFAULT_MAX_TOKENS}).",
    )


def check_max_tokens(args):
    """``--max-tokens`` is a size from 1 to 2**31 - 1 (``ValueError`` naming it)."""
    check_size("--max-tokens", args.max_tokens)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx_spec corpus",
        description="A distillation corpus of the target's own completions (token ids).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grow", help="append new completions of the target")
    g.add_argument("--model", required=True, help="The target model (path or repo).")
    g.add_argument("--out", required=True, help="The corpus folder.")
    g.add_argument(
        "--tokens",
        type=int,
        help="Stop after this many new completion tokens (default: when the "
        "prompts run out or the cap is reached).",
    )
    g.add_argument(
        "--batch-size",
        type=int,
        help="Rows decoded together (default: the fastest of the corpus's "
        f"`sweep`, else {G.DEFAULT_BATCH_SIZE}).",
    )
    add_max_tokens(g)
    g.add_argument(
        "--shard-minutes",
        type=float,
        default=G.DEFAULT_SHARD_SECONDS / 60,
        help="Minutes between shards; a kill loses at most this much work "
        f"(default: {G.DEFAULT_SHARD_SECONDS / 60:g}).",
    )
    g.add_argument(
        "--self-instruct",
        type=int,
        default=DEFAULT_SELF_INSTRUCT,
        metavar="N",
        help="Requests the target writes itself, answered in this run "
        f"(default: {DEFAULT_SELF_INSTRUCT}).",
    )
    g.add_argument(
        "--own-share",
        type=float,
        default=G.DEFAULT_FOLLOW_UP_SHARE,
        metavar="P",
        help="Share of the answered requests that are the target's own and "
        "multi-turn follow-ups, spread through the template prompts "
        f"(default: {G.DEFAULT_FOLLOW_UP_SHARE:g}).",
    )
    g.add_argument(
        "--cap-mb",
        type=float,
        help=f"Size cap of the shards in MB (default: the corpus's, else "
        f"{DEFAULT_CAP_BYTES / 1e6:g}).",
    )
    g.add_argument("--seed", type=int, default=0, help="Seed of the prompt order.")
    g.add_argument("--force", action="store_true", help=FORCE_HELP)
    w = sub.add_parser(
        "sweep", help="measure decoding speed by batch size; grow uses the fastest"
    )
    w.add_argument("--model", required=True, help="The target model (path or repo).")
    w.add_argument("--out", required=True, help="The corpus folder.")
    w.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_SWEEP)),
        help=f"Comma-separated batch sizes (default: {','.join(map(str, DEFAULT_SWEEP))}).",
    )
    w.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SWEEP_SECONDS,
        help=f"Timed seconds per batch size (default: {DEFAULT_SWEEP_SECONDS:g}).",
    )
    w.add_argument(
        "--warmup",
        type=float,
        default=DEFAULT_SWEEP_WARMUP,
        help="Untimed seconds before each size is timed, so that answers of every "
        f"length are in flight (default: {DEFAULT_SWEEP_WARMUP:g}).",
    )
    add_max_tokens(w)
    w.add_argument("--force", action="store_true", help=FORCE_HELP)
    i = sub.add_parser("info", help="sizes and breakdown; refresh the card")
    i.add_argument("folder", help="The corpus folder.")
    one_line_errors(p)
    return p


def _log(message: str):
    stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
    print(f"[corpus {stamp}] {message}", flush=True)


def _check(args):
    if args.tokens is not None and args.tokens < 1:
        raise ValueError(f"--tokens must be at least 1, got {args.tokens}.")
    if args.batch_size is not None:  # rows of one batch: an mlx size
        check_size("--batch-size", args.batch_size)
    check_max_tokens(args)
    if not 0 < args.shard_minutes < math.inf:
        raise ValueError(f"--shard-minutes must be positive, got {args.shard_minutes}.")
    check_size("--self-instruct", args.self_instruct, 0)
    if not 0 <= args.own_share < 1:
        raise ValueError(f"--own-share must be in [0, 1), got {args.own_share}.")
    if args.cap_mb is not None and not 0 < args.cap_mb < math.inf:
        raise ValueError(f"--cap-mb must be positive, got {args.cap_mb}.")
    check_out(args)


def _is_corpus_folder(folder: Path) -> bool:
    return (folder / "corpus.json").is_file() or (folder / SWEEP_FILE).is_file()


def check_out(args) -> None:
    """``--out``: not the target's folder, and no folder of other files unless
    ``--force`` (a corpus or a sweep's folder is grown in place).

    Raises:
        OutDirError: One line naming the folder.
    """
    if Path(args.model).expanduser().is_dir():
        check_outside(args.out, args.model, flag="--out", what="the target model")
    check_out_dir(args.out, force=args.force, ours=_is_corpus_folder)


def grow(args) -> int:
    _check(args)
    if args.batch_size is None:
        measured = read_sweep(args.out)
        args.batch_size = measured["best"] if measured else G.DEFAULT_BATCH_SIZE
    from ..fingerprint import fingerprint_mismatch, model_fingerprint
    from ..loading import load_model

    cap = int(args.cap_mb * 1e6) if args.cap_mb else None
    corpus = Corpus(args.out, cap)
    model, tokenizer = load_model(args.model, "model")
    manifest = corpus.manifest()
    if manifest is not None:
        why = fingerprint_mismatch(manifest["target"], model)
        if why:
            raise ValueError(
                f"the corpus in '{args.out}' was written by another target ({why}); "
                "grow it with that target or choose another --out."
            )
    vocab = int(model_fingerprint(model)["vocab_size"])
    if vocab > 1 << 16:
        raise ValueError(
            f"the target's vocabulary ({vocab}) does not fit the corpus's 16-bit ids."
        )
    corpus.create(
        model_fingerprint(model),
        {"vocab_size": vocab, "eos_token_ids": sorted(tokenizer.eos_token_ids)},
        model=args.model,
    )
    run = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    known = corpus.hashes()
    temps = G.DEFAULT_TEMPS
    _log(f"{len(known)} prompts stored; building prompts")
    follow = G.follow_up_jobs(tokenizer, corpus, known, temps)
    if args.self_instruct:
        _log(f"the target writes {args.self_instruct} requests of its own")
    own = G.self_jobs(model, tokenizer, args.self_instruct, known, temps, len(known))
    stream = G.template_jobs(tokenizer, _stream(args.seed), known, temps)
    # Own requests and follow-ups alternate, so that a short run reaches both.
    chat = list(G.interleave(own, follow, 0.5))
    jobs = G.interleave(stream, chat, args.own_share)
    _log(
        f"run {run}: {len(follow)} follow-ups and {len(own)} own requests, "
        f"{args.own_share:g} of the jobs, spread through the template prompts; "
        f"batch {args.batch_size}, up to {args.max_tokens} tokens"
    )
    grower = G.Grower(
        model,
        tokenizer,
        corpus,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        shard_seconds=args.shard_minutes * 60,
        run=run,
        log=lambda line: (_log(line), write_card(corpus)),
    )
    # A kill (SIGTERM) stops like ^C: the finished sequences become a shard.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        made = grower.grow(jobs, args.tokens)
    except CorpusFull as e:
        _log(f"stopped: {e}")
        made = grower.made
    finally:
        signal.signal(signal.SIGTERM, previous)  # a caller's own handling
    write_card(corpus)
    _log(f"done: {made} completion tokens added")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stream(seed: int):
    from .corpus_prompts import prompt_stream

    return prompt_stream(seed)


def sweep(args) -> int:
    check_out(args)
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--batch-sizes must be comma-separated integers, got '{args.batch_sizes}'."
        ) from None
    if not sizes:
        raise ValueError("--batch-sizes must list sizes of at least 1.")
    for size in sizes:
        check_size("--batch-sizes", size)
    if not 0 < args.seconds < math.inf:
        raise ValueError(f"--seconds must be positive, got {args.seconds}.")
    if not 0 <= args.warmup < math.inf:
        raise ValueError(f"--warmup must be 0 or more seconds, got {args.warmup}.")
    check_max_tokens(args)
    from ..loading import load_model
    from .corpus_prompts import prompt_stream

    model, tokenizer = load_model(args.model, "model")
    # The grow's own mix of prompts, more of them than any batch holds.
    prompts = [
        G.encode_messages(tokenizer, p.messages)
        for p in prompt_stream(0)[: 4 * max(sizes)]
    ]
    rows = []
    for size in sizes:
        rows.append(
            G.measure_batch(
                model,
                tokenizer,
                prompts,
                size,
                args.seconds,
                warmup=args.warmup,
                max_tokens=args.max_tokens,
            )
        )
        _log(
            f"batch {size}: {rows[-1]['tokens_per_s']} tokens/s, "
            f"{rows[-1]['tokens_per_cpu_s']} per CPU second"
        )
    record = {
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "warmup": args.warmup,
        "max_tokens": args.max_tokens,
        "rows": rows,
        "best": G.best_batch(rows),
    }
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SWEEP_FILE
    tmp = path.with_name(f".{SWEEP_FILE}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    _log(f"fastest: batch {record['best']} (written to {path})")
    return 0


def _sweep_how(measured: Dict) -> str:
    if "warmup" not in measured:  # a sweep of an earlier version
        return "greedy decoding once every row decodes"
    return (
        "completion tokens of grow's own decoding, its prompts answered up to "
        f"{measured['max_tokens']} tokens with finished rows replaced at once, timed "
        f"after {measured['warmup']:g} s"
    )


def read_sweep(folder) -> Optional[Dict]:
    path = Path(folder) / SWEEP_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def info(args) -> int:
    corpus = Corpus(args.folder)
    corpus.existing_manifest()
    summary = corpus.summary()
    print(card_text(summary, corpus.manifest(), read_sweep(corpus.folder)))
    write_card(corpus, summary)
    return 0


def write_card(corpus: Corpus, summary: Optional[Dict] = None):
    summary = summary or corpus.summary()
    text = card_text(summary, corpus.manifest() or {}, read_sweep(corpus.folder))
    path = corpus.folder / "README.md"
    tmp = path.with_name(".README.md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def card_text(summary: Dict, manifest: Dict, measured: Optional[Dict] = None) -> str:
    """The corpus card (markdown) from :meth:`Corpus.summary`."""
    completion = summary["completion_tokens"]
    lines = [
        f"# Distillation corpus of {manifest.get('model', 'its target')}",
        "",
        "The target's own completions, as token ids only, for training its drafters "
        "(`mlx_spec corpus grow`; read with `mlx_spec.train.corpus.Corpus`). Shards "
        "are append-only: a run adds new ones and never rewrites old ones. Laws and "
        "hidden states are recomputed from the ids by one batched prefill, outside "
        "git.",
        "",
        f"- Sequences: {summary['sequences']:,}; completion tokens: {completion:,}; "
        f"prompt tokens: {summary['prompt_tokens']:,}.",
        f"- Size: {summary['bytes'] / 1e6:.2f} MB in {summary['shards']} shards "
        f"({summary['bytes'] / max(completion + summary['prompt_tokens'], 1):.2f} "
        f"bytes a token); cap {manifest.get('cap_bytes', 0) / 1e6:g} MB.",
        f"- Split (completion tokens): {summary['split_tokens']['train']:,} train, "
        f"{summary['split_tokens']['heldout']:,} held out (by prompt source; never "
        "trained on).",
        "- Temperatures (completion tokens): "
        + ", ".join(
            f"{'greedy' if float(t) == 0 else t}: {n:,}"
            for t, n in sorted(
                summary["temp_tokens"].items(), key=lambda kv: float(kv[0])
            )
        )
        + ".",
        "",
        "| prompt family | what it asks | sequences | completion tokens |",
        "|---|---|---|---|",
    ]
    for name, row in sorted(summary["by_set"].items(), key=lambda kv: -kv[1]["tokens"]):
        note = FAMILY_NOTES.get(name, "")
        lines.append(f"| {name} | {note} | {row['sequences']:,} | {row['tokens']:,} |")
    lines += [
        "",
        "Runs (throughput: tokens decoded per hour of wall time, niced, on a shared "
        "2-core CPU; runs written before decoded tokens were recorded count the "
        "completion tokens of their finished rows only. Per CPU hour: per hour of "
        "the run's own CPU time, which pauses and other jobs do not stretch; "
        "– where the shards predate it):",
        "",
        "| run | shards | completion tokens | hours | tokens/hour | tokens per CPU hour "
        "| batch | max tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, r in sorted(summary["runs"].items()):
        hours = r["seconds"] / 3600
        rate = r["decoded"] / hours if hours else 0
        cpu = r.get("cpu_seconds", 0.0) / 3600
        cpu_rate = f"{r['cpu_decoded'] / cpu:,.0f}" if cpu else "–"
        lines.append(
            f"| {run} | {r['shards']} | {r['tokens']:,} | {hours:.2f} | {rate:,.0f} "
            f"| {cpu_rate} | {r.get('batch_size', '')} | {r.get('max_tokens', '')} |"
        )
    if measured:
        lines += [
            "",
            f"Batch sizes measured by `mlx_spec corpus sweep` ({measured['measured']}; "
            + _sweep_how(measured)
            + "; CPU seconds are this process's, which other jobs on the machine "
            "disturb less than wall time):",
            "",
            "| batch | tokens/s | tokens per CPU second |",
            "|---|---|---|",
            *(
                f"| {r['batch_size']} | {r['tokens_per_s']} | {r['tokens_per_cpu_s']} |"
                for r in measured["rows"]
            ),
            "",
            f"Grow uses batch {measured['best']}.",
        ]
    lines += [
        "",
        "Grow it (resumable; a kill loses at most the shard being gathered):",
        "",
        "```",
        "nohup nice -n 19 mlx_spec corpus grow --model models/smollm2-135m-instruct \\",
        "    --out models/smollm2-135m-corpus --tokens 1000000 &",
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``mlx_spec corpus``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = setup_arg_parser().parse_args(argv)
    try:
        return {"grow": grow, "sweep": sweep, "info": info}[args.command](args)
    except ValueError as e:
        print(f"mlx_spec corpus: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        sys.exit(f"mlx_spec corpus: error: {e}")
    except KeyboardInterrupt:
        exit_interrupted("mlx_spec corpus: interrupted; the shards written are kept.")
