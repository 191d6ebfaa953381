"""Evaluate the default pair on the held-out stdlib modules.

Everything here is teacher-forced on the held-out token stream (see
``models/data.py``), cut into consecutive non-overlapping windows of
``--seq-len`` tokens (the training context). Per position it measures:

* held-out loss (nats/token) and perplexity of each model;
* top-1 accuracy of each model against the real next token;
* greedy agreement: ``argmax p == argmax q`` (target p, draft q), which is the
  per-token acceptance of greedy speculative decoding on this text;
* ``sum_x min(p_T(x), q_T(x))`` with both distributions at temperature T: the
  exact expected per-token acceptance of Leviathan et al. rejection sampling
  for a draft proposed from ``q_T`` and verified against ``p_T``.

The contexts are the real held-out text, not the models' own outputs, so the
acceptance numbers describe the pair on stdlib-like code. The script also
writes greedy sample completions (``mlx_lm.generate``), the loss-curve PNG and
copies of the training logs, and saves every number to ``eval_results.json``.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python models/evaluate.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root, for mlx_spec

import mlx_spec  # noqa: F401,E402  (must precede mlx: preloads OpenBLAS)

# isort: split

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import data as corpus  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm import generate, load  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_TARGET = str(MODELS_DIR / "stdlib-llama-target")
DEFAULT_DRAFT = str(MODELS_DIR / "stdlib-llama-draft")
DEFAULT_DATA_DIR = "runs/stdlib-corpus"
DEFAULT_SEQ_LEN = 256
DEFAULT_BATCH = 8
DEFAULT_TEMPERATURES = (0.7, 1.0)
DEFAULT_MAX_TOKENS = 64
DEFAULT_LONG_SEQ_LEN = 512
README_START = "<!-- results:start (written by models/evaluate.py) -->"
README_END = "<!-- results:end -->"

# Prompts in the style of the held-out modules (which the models never saw).
# They end without a trailing newline: the byte-level BPE merges a newline with
# the next line's indentation, so a bare final "\n" is a split never seen in
# training.
SAMPLE_PROMPTS = (
    'def heappush(heap, item):\n    """Push item onto heap, maintaining the heap'
    ' invariant."""',
    "import json\n\n\ndef load_config(path):\n    with open(path) as f:",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x",
    'def dedent(text):\n    """Remove any common leading whitespace from every line'
    " in `text`.",
)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="Cap on held-out tokens (default: all).",
    )
    p.add_argument("--sample-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--out", default=str(MODELS_DIR / "eval_results.json"))
    p.add_argument("--plot", default=str(MODELS_DIR / "loss_curve.png"))
    p.add_argument(
        "--long-seq-len",
        type=int,
        default=DEFAULT_LONG_SEQ_LEN,
        help="Also evaluate windows this long (beyond the training context); 0: skip.",
    )
    p.add_argument("--path-prompts", type=int, default=16)
    p.add_argument("--path-prompt-len", type=int, default=64)
    p.add_argument("--path-gen-len", type=int, default=128)
    p.add_argument(
        "--readme",
        default=str(MODELS_DIR / "README.md"),
        help="Rewrite the results section between the markers of this file.",
    )
    return p


def windows(stream: np.ndarray, seq_len: int, max_tokens: int | None):
    """Non-overlapping (inputs, targets) windows, each int32 (n, seq_len)."""
    usable = stream.size - 1 if max_tokens is None else min(max_tokens, stream.size - 1)
    n = usable // seq_len
    win = stream[: n * seq_len + 1].astype(np.int32)
    return win[:-1].reshape(n, seq_len), win[1:].reshape(n, seq_len)


def pair_stats(
    p_logits: mx.array, q_logits: mx.array, targets: mx.array, temperatures
) -> dict:
    """Per-position teacher-forced statistics.

    Args:
        p_logits: target logits, (B, L, V).
        q_logits: draft logits, (B, L, V).
        targets: the real next tokens, (B, L).
        temperatures: temperatures for the rejection-sampling acceptance.

    Returns:
        Dict of float32 arrays of shape (B, L); sum them in float64 on the host.
    """
    p_logp = p_logits - mx.logsumexp(p_logits, axis=-1, keepdims=True)
    q_logp = q_logits - mx.logsumexp(q_logits, axis=-1, keepdims=True)
    tgt = targets[..., None]
    p_top, q_top = mx.argmax(p_logits, axis=-1), mx.argmax(q_logits, axis=-1)
    out = {
        "target_nll": -mx.take_along_axis(p_logp, tgt, axis=-1)[..., 0],
        "draft_nll": -mx.take_along_axis(q_logp, tgt, axis=-1)[..., 0],
        "target_top1": (p_top == targets).astype(mx.float32),
        "draft_top1": (q_top == targets).astype(mx.float32),
        "greedy_agreement": (p_top == q_top).astype(mx.float32),
    }
    for t in temperatures:
        p = mx.softmax(p_logits / t, axis=-1)
        q = mx.softmax(q_logits / t, axis=-1)
        out[f"acceptance_t{t}"] = mx.minimum(p, q).sum(axis=-1)
    return out


def teacher_forced(
    target, draft, stream, *, seq_len, batch_size, max_tokens, temperatures
) -> dict:
    inputs, targets = windows(stream, seq_len, max_tokens)
    totals: dict[str, float] = {}
    for i in range(0, inputs.shape[0], batch_size):
        x = mx.array(inputs[i : i + batch_size])
        y = mx.array(targets[i : i + batch_size])
        stats = pair_stats(target(x), draft(x), y, temperatures)
        mx.eval(stats)
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + float(np.asarray(v, np.float64).sum())
    n = inputs.size
    res = {"positions": int(n), "windows": int(inputs.shape[0]), "seq_len": seq_len}
    for who in ("target", "draft"):
        loss = totals[f"{who}_nll"] / n
        res[who] = {
            "heldout_loss": loss,
            "heldout_ppl": math.exp(loss),
            "top1_acc": totals[f"{who}_top1"] / n,
        }
    res["greedy_agreement"] = totals["greedy_agreement"] / n
    res["rejection_acceptance"] = {
        str(t): totals[f"acceptance_t{t}"] / n for t in temperatures
    }
    return res


def tokens_per_round(match: list[bool], k: int) -> float:
    """Mean tokens emitted per target forward by greedy speculation with k drafts.

    ``match[i]`` says whether the draft's argmax equals the target's greedy token
    at position i of the target's own greedy path. Along that path a round that
    starts at i accepts the run of matches (at most k) and adds one target token
    (the recovered token, or the bonus token after k matches), so this is exact.
    """
    i, rounds = 0, 0
    while i < len(match):
        run = 0
        while run < k and i + run < len(match) and match[i + run]:
            run += 1
        i += run + 1
        rounds += 1
    return len(match) / rounds


def greedy_path(
    target, draft, stream, *, n_prompts, prompt_len, gen_len, eos_ids
) -> dict:
    """Draft/target agreement along the target's own greedy continuations.

    Prompts are ``prompt_len`` held-out tokens at evenly spaced offsets; the
    target continues each greedily (``mlx_lm.generate_step``) for ``gen_len``
    tokens (stopping after EOS), then both models are run over the result.
    """
    offsets = np.linspace(0, stream.size - prompt_len - 1, n_prompts).astype(int)
    matches, target_consistent = [], 0
    for off in offsets:
        prompt = stream[off : off + prompt_len].astype(np.int32).tolist()
        gen = []
        for tok, _ in generate_step(mx.array(prompt), target, max_tokens=gen_len):
            gen.append(int(tok))
            if gen[-1] in eos_ids:
                break
        seq = mx.array([prompt + gen[:-1]])
        start = len(prompt) - 1
        p_top = mx.argmax(target(seq)[0, start:], axis=-1)
        q_top = mx.argmax(draft(seq)[0, start:], axis=-1)
        gen_arr = mx.array(gen)
        target_consistent += (p_top == gen_arr).sum().item()
        matches.append((q_top == gen_arr).tolist())
    flat = [m for row in matches for m in row]
    return {
        "prompts": int(n_prompts),
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "positions": len(flat),
        "greedy_agreement": sum(flat) / len(flat),
        "target_full_forward_consistency": target_consistent / len(flat),
        "tokens_per_target_call": {
            str(k): float(
                np.sum([tokens_per_round(r, k) * len(r) for r in matches]) / len(flat)
            )
            for k in (1, 2, 3, 4, 6, 8)
        },
    }


def round_trip_ok(tokenizer, texts) -> bool:
    return all(tokenizer.decode(tokenizer.encode(t)) == t for t in texts)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_run(records: list[dict]) -> list[dict]:
    """Records of the latest uninterrupted-or-resumed run (drops superseded steps)."""
    by_step: dict[tuple, dict] = {}
    for r in records:
        if "step" in r and r.get("event") in (None, "checkpoint"):
            by_step[(r.get("event") or "train", r["step"])] = r
    return sorted(by_step.values(), key=lambda r: r["step"])


def plot_curves(logs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, recs), color in zip(logs.items(), ("C0", "C1")):
        train = [r for r in recs if r.get("event") is None]
        val = [r for r in recs if r.get("event") == "checkpoint"]
        ax.plot(
            [r["tokens"] / 1e6 for r in train],
            [r["loss"] for r in train],
            color=color,
            alpha=0.6,
            label=f"{name} train",
        )
        ax.plot(
            [r["tokens"] / 1e6 for r in val],
            [r["heldout_loss"] for r in val],
            "o--",
            color=color,
            label=f"{name} held-out",
        )
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_ylim(top=6.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Default pair on the Python stdlib corpus")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M ({n:,})"


def render_results(r: dict) -> str:
    """Markdown for the results section of models/README.md."""
    tf, names = r["teacher_forced"], r["names"]
    lines = ["| | target | draft |", "|---|---|---|"]

    def row(label, fn):
        lines.append(f"| {label} | {fn('target')} | {fn('draft')} |")

    cfg = r["configs"]
    row("folder", lambda w: f"`models/{names[w]}`")
    row("parameters", lambda w: _fmt_params(r["params"][w]))
    row(
        "layers x hidden (heads, MLP)",
        lambda w: f"{cfg[w]['num_hidden_layers']} x {cfg[w]['hidden_size']} "
        f"({cfg[w]['num_attention_heads']}, {cfg[w]['intermediate_size']})",
    )
    tr = r.get("training", {})
    ra = r.get("run_args", {})
    row(
        "peak LR / warmup steps",
        lambda w: f"{ra[w]['lr']:g} / {ra[w]['warmup']}" if w in ra else "?",
    )
    row(
        "batch x context",
        lambda w: f"{ra[w]['batch_size']} x {ra[w]['seq_len']}" if w in ra else "?",
    )
    row("optimizer steps", lambda w: f"{tr[w]['steps']:,}" if w in tr else "?")
    row(
        "training tokens seen",
        lambda w: f"{tr[w]['tokens_seen']:,}" if w in tr else "?",
    )
    row(
        "final train loss (last 10 steps)",
        lambda w: f"{tr[w]['final_train_loss']:.3f}" if w in tr else "?",
    )
    row("held-out loss (nats/token)", lambda w: f"{tf[w]['heldout_loss']:.3f}")
    row("held-out perplexity", lambda w: f"{tf[w]['heldout_ppl']:.2f}")
    row("held-out top-1 accuracy", lambda w: f"{tf[w]['top1_acc']:.3f}")
    out = "\n".join(lines) + "\n\n"
    out += (
        f"Held-out set: {tf['positions']:,} next-token positions "
        f"({tf['windows']} windows of {tf['seq_len']} tokens).\n\n"
    )
    out += "Pair acceptance on held-out text (teacher forced, exact):\n\n"
    out += (
        "| context | greedy agreement | "
        + " | ".join(f"sum min(p,q) at T={t}" for t in tf["rejection_acceptance"])
        + " |\n|---|---|"
        + "---|" * len(tf["rejection_acceptance"])
        + "\n"
    )
    for key in ("teacher_forced", "teacher_forced_long"):
        if key in r:
            t = r[key]
            out += f"| {t['seq_len']}-token windows | {t['greedy_agreement']:.3f} | "
            out += " | ".join(f"{v:.3f}" for v in t["rejection_acceptance"].values())
            out += " |\n"
    if "teacher_forced_long" in r:
        tl = r["teacher_forced_long"]
        out += (
            f"\nWith {tl['seq_len']}-token windows (twice the training context) the "
            f"held-out loss is {tl['target']['heldout_loss']:.3f} (target) and "
            f"{tl['draft']['heldout_loss']:.3f} (draft).\n"
        )
    if "greedy_path" in r:
        g = r["greedy_path"]
        out += (
            f"\nAlong the target's own greedy continuations ({g['prompts']} held-out "
            f"prompts of {g['prompt_len']} tokens, up to {g['gen_len']} generated tokens "
            f"each, {g['positions']:,} positions) the draft's argmax agrees with the "
            f"target's on **{g['greedy_agreement']:.3f}** of positions. Replaying "
            "greedy speculation with k draft tokens per round on those paths "
            "gives these tokens per target forward (exact for these paths, not a "
            "speed measurement):\n\n"
        )
        ks = list(g["tokens_per_target_call"])
        out += "| k | " + " | ".join(ks) + " |\n|---|" + "---|" * len(ks) + "\n"
        out += (
            "| tokens / target call | "
            + " | ".join(f"{v:.2f}" for v in g["tokens_per_target_call"].values())
            + " |\n"
        )
    out += "\nGreedy samples (`mlx_lm.generate`, "
    out += f"{r['sample_tokens']} new tokens at most; prompts written in the style of "
    out += "the held-out modules):\n"
    for k, s in enumerate(r["samples"], 1):
        out += f"\nPrompt {k}:\n\n```python\n{s['prompt']}\n```\n"
        for w in ("target", "draft"):
            out += f"\n{w} continues:\n\n```python\n{s[w]}\n```\n"
    return out + "\n"


def main():
    args = setup_arg_parser().parse_args()
    data_dir = Path(args.data_dir)
    manifest = corpus.prepare(data_dir)
    heldout = corpus.load_stream(data_dir, "heldout")
    target, tok = load(args.target)
    draft, draft_tok = load(args.draft)
    tok_same = (Path(args.target) / "tokenizer.json").read_bytes() == (
        Path(args.draft) / "tokenizer.json"
    ).read_bytes()
    root = corpus.stdlib_root()
    texts = [(root / f).read_text(encoding="utf-8") for f in manifest["heldout_files"]]

    results = {
        "python_version": manifest["python_version"],
        "heldout_modules": manifest["heldout_modules"],
        "heldout_files": len(manifest["heldout_files"]),
        "train_tokens_in_corpus": manifest["train_tokens"],
        "heldout_tokens_in_corpus": manifest["heldout_tokens"],
        "vocab_size": manifest["vocab_size"],
        "tokenizer": {
            "shared": tok_same,
            "eos_token": tok.eos_token,
            "eos_token_ids": sorted(tok.eos_token_ids),
            "heldout_round_trip": round_trip_ok(tok, texts),
        },
        "params": {
            "target": sum(v.size for _, v in tree_flatten(target.parameters())),
            "draft": sum(v.size for _, v in tree_flatten(draft.parameters())),
        },
        "configs": {
            "target": json.loads((Path(args.target) / "config.json").read_text()),
            "draft": json.loads((Path(args.draft) / "config.json").read_text()),
        },
        "names": {"target": Path(args.target).name, "draft": Path(args.draft).name},
    }
    for name, path in (("target", args.target), ("draft", args.draft)):
        log = Path(path) / "checkpoints" / "train_log.jsonl"
        if log.exists():
            recs = last_run(read_log(log))
            (MODELS_DIR / "logs").mkdir(exist_ok=True)
            shutil.copy(log, MODELS_DIR / "logs" / f"{Path(path).name}.jsonl")
        else:
            logged = MODELS_DIR / "logs" / f"{Path(path).name}.jsonl"
            recs = last_run(read_log(logged)) if logged.exists() else []
        args_src = Path(path) / "checkpoints" / "run_args.json"
        args_dst = MODELS_DIR / "logs" / f"{Path(path).name}.args.json"
        if args_src.exists():
            args_dst.parent.mkdir(exist_ok=True)
            shutil.copy(args_src, args_dst)
        if args_dst.exists():
            results.setdefault("run_args", {})[name] = json.loads(args_dst.read_text())
        train = [r for r in recs if r.get("event") is None]
        if train:
            results.setdefault("training", {})[name] = {
                "steps": train[-1]["step"],
                "tokens_seen": train[-1]["tokens"],
                "final_train_loss": train[-1]["loss"],
            }
        results.setdefault("_logs", {})[Path(path).name] = recs

    t0 = time.perf_counter()
    results["teacher_forced"] = teacher_forced(
        target,
        draft,
        heldout,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        temperatures=DEFAULT_TEMPERATURES,
    )
    results["teacher_forced"]["eval_seconds"] = time.perf_counter() - t0
    if args.long_seq_len:
        results["teacher_forced_long"] = teacher_forced(
            target,
            draft,
            heldout,
            seq_len=args.long_seq_len,
            batch_size=max(1, args.batch_size * args.seq_len // args.long_seq_len),
            max_tokens=args.max_tokens,
            temperatures=DEFAULT_TEMPERATURES,
        )

    results["greedy_path"] = greedy_path(
        target,
        draft,
        heldout,
        n_prompts=args.path_prompts,
        prompt_len=args.path_prompt_len,
        gen_len=args.path_gen_len,
        eos_ids=set(tok.eos_token_ids),
    )

    results["samples"], results["sample_tokens"] = [], args.sample_tokens
    for prompt in SAMPLE_PROMPTS:
        row = {"prompt": prompt}
        for name, (m, t) in (("target", (target, tok)), ("draft", (draft, draft_tok))):
            row[name] = generate(m, t, prompt, max_tokens=args.sample_tokens)
        results["samples"].append(row)

    logs = results.pop("_logs")
    if any(logs.values()):
        plot_curves({k: v for k, v in logs.items() if v}, Path(args.plot))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    readme = Path(args.readme)
    if readme.exists() and README_START in readme.read_text():
        text = readme.read_text()
        head, rest = text.split(README_START, 1)
        tail = rest.split(README_END, 1)[1]
        body = render_results(results)
        readme.write_text(head + README_START + "\n" + body + README_END + tail)
    print(json.dumps({k: v for k, v in results.items() if k != "samples"}, indent=2))
    for row in results["samples"]:
        print("=" * 60)
        print(row["prompt"] + "[target]" + row["target"])
        print("-" * 60)
        print(row["prompt"] + "[draft]" + row["draft"])


if __name__ == "__main__":
    main()
