"""Train one model of the default pair: a small mlx_lm Llama on the stdlib corpus.

The model is ``mlx_lm.models.llama.Model`` itself, so the exported folder loads
with plain ``mlx_lm.load``. Training is resumable: every ``--ckpt-every``
seconds the weights, optimizer state and step go to ``<out>/checkpoints/``
(gitignored), and a rerun of the same command continues from there. Batches
are a pure function of (seed, step), so a resumed run sees the same data.

Example (the exact commands used are in models/README.md)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python models/train.py \\
        --out models/stdlib-llama-draft --hidden-size 128 --layers 2 --steps 1000
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
from functools import partial

import data as corpus
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama

DEFAULT_DATA_DIR = "runs/stdlib-corpus"
DEFAULT_SEQ_LEN = 256
DEFAULT_BATCH_SIZE = 8
DEFAULT_LR = 1e-3
DEFAULT_WARMUP = 50
DEFAULT_WEIGHT_DECAY = 0.1
DEFAULT_SEED = 0
DEFAULT_CKPT_EVERY = 240.0
DEFAULT_EVAL_TOKENS = 16384


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="Output model folder (HF layout).")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument(
        "--intermediate-size",
        type=int,
        default=None,
        help="Default: 8/3 * hidden, rounded to 32.",
    )
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--weight-decay", type=float, default=DEFAULT_WEIGHT_DECAY)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument(
        "--ckpt-every", type=float, default=DEFAULT_CKPT_EVERY, help="Seconds."
    )
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-tokens", type=int, default=DEFAULT_EVAL_TOKENS)
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="Stop (after a checkpoint) after this long; for probes.",
    )
    p.add_argument(
        "--stop-step",
        type=int,
        default=None,
        help="Stop after this step; the LR schedule still spans --steps.",
    )
    p.add_argument("--no-export", action="store_true")
    return p


def model_args(args, vocab_size: int, eos_id: int) -> dict:
    """The config.json dict of the model (also fed to ``llama.ModelArgs``)."""
    inter = args.intermediate_size or 32 * math.ceil(args.hidden_size * 8 / 3 / 32)
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.layers,
        "intermediate_size": inter,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads or args.heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "max_position_embeddings": args.seq_len,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def build_model(config: dict) -> llama.Model:
    fields = llama.ModelArgs.__dataclass_fields__
    return llama.Model(
        llama.ModelArgs(**{k: v for k, v in config.items() if k in fields})
    )


def count_params(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def batch_at(
    stream: np.ndarray, step: int, *, seed: int, batch_size: int, seq_len: int
):
    """Random windows for ``step``: a pure function of (seed, step).

    Returns:
        ``(inputs, targets)``, each int32 of shape (batch_size, seq_len).
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, stream.size - seq_len - 1, size=batch_size)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    win = stream[idx].astype(np.int32)
    return mx.array(win[:, :-1]), mx.array(win[:, 1:])


def loss_fn(model, inputs, targets):
    """Mean next-token cross entropy (nats) over a (B, L) batch."""
    logits = model(inputs)
    return nn.losses.cross_entropy(logits, targets, reduction="mean")


def evaluate_loss(model, stream: np.ndarray, *, seq_len: int, max_tokens: int) -> float:
    """Mean loss over consecutive non-overlapping windows from the stream start."""
    n = min(max_tokens, stream.size - 1) // seq_len
    win = stream[: n * seq_len + 1].astype(np.int32)
    inputs = mx.array(win[:-1].reshape(n, seq_len))
    targets = mx.array(win[1:].reshape(n, seq_len))
    total = mx.array(0.0)
    for i in range(0, n, 8):
        total = total + nn.losses.cross_entropy(
            model(inputs[i : i + 8]), targets[i : i + 8], reduction="sum"
        )
        mx.eval(total)
    return total.item() / (n * seq_len)


def make_optimizer(args) -> optim.AdamW:
    warm = optim.linear_schedule(0.0, args.lr, max(args.warmup, 1))
    decay = optim.cosine_decay(
        args.lr, max(args.steps - args.warmup, 1), end=args.lr * args.min_lr_ratio
    )
    sched = optim.join_schedules([warm, decay], [args.warmup])
    return optim.AdamW(learning_rate=sched, weight_decay=args.weight_decay)


def save_checkpoint(ckpt: Path, model, opt, step: int) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(ckpt / "weights.tmp.safetensors"), dict(tree_flatten(model.parameters()))
    )
    mx.save_safetensors(
        str(ckpt / "optimizer.tmp.safetensors"), dict(tree_flatten(opt.state))
    )
    (ckpt / "weights.tmp.safetensors").replace(ckpt / "weights.safetensors")
    (ckpt / "optimizer.tmp.safetensors").replace(ckpt / "optimizer.safetensors")
    (ckpt / "step.json").write_text(json.dumps({"step": step}) + "\n")


def load_checkpoint(ckpt: Path, model, opt) -> int:
    """Restore weights and optimizer state; returns the next step (0 if none)."""
    if not (ckpt / "step.json").exists():
        return 0
    model.load_weights(str(ckpt / "weights.safetensors"))
    opt.state = tree_unflatten(
        list(mx.load(str(ckpt / "optimizer.safetensors")).items())
    )
    return json.loads((ckpt / "step.json").read_text())["step"]


def export(out: Path, model, config: dict, data_dir: Path) -> None:
    """Write the HF-layout folder: config, float32 safetensors, tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(
        str(out / "model.safetensors"), weights, metadata={"format": "mlx"}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(data_dir / name, out / name)


def log_line(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def main():
    args = setup_arg_parser().parse_args()
    out, data_dir = Path(args.out), Path(args.data_dir)
    manifest = corpus.prepare(data_dir)
    train = corpus.load_stream(data_dir, "train")
    heldout = corpus.load_stream(data_dir, "heldout")
    from tokenizers import Tokenizer

    eos_id = Tokenizer.from_file(str(data_dir / "tokenizer.json")).token_to_id(
        corpus.EOS_TOKEN
    )
    config = model_args(args, manifest["vocab_size"], eos_id)

    mx.random.seed(args.seed)
    model = build_model(config)
    mx.eval(model.parameters())
    opt = make_optimizer(args)
    opt.init(model.trainable_parameters())
    ckpt = out / "checkpoints"
    log_path = ckpt / "train_log.jsonl"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "run_args.json").write_text(json.dumps(vars(args), indent=2) + "\n")
    start = load_checkpoint(ckpt, model, opt)
    n_params = count_params(model)
    tokens_per_step = args.batch_size * args.seq_len
    log_line(
        log_path,
        {"event": "start", "step": start, "params": n_params, "config": config},
    )

    state = [model.state, opt.state]
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    @partial(mx.compile, inputs=state, outputs=state)
    def train_step(inputs, targets):
        loss, grads = loss_and_grad(model, inputs, targets)
        opt.update(model, grads)
        return loss

    t0 = t_ckpt = t_log = time.perf_counter()
    losses, step = [], start
    last = args.steps if args.stop_step is None else min(args.stop_step, args.steps)
    for step in range(start, last):
        inputs, targets = batch_at(
            train,
            step,
            seed=args.seed,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
        )
        loss = train_step(inputs, targets)
        mx.eval(state, loss)
        losses.append(loss.item())
        now = time.perf_counter()
        done = step + 1
        if done % args.log_every == 0 or done == last:
            log_line(
                log_path,
                {
                    "step": done,
                    "tokens": done * tokens_per_step,
                    "loss": float(np.mean(losses)),
                    "lr": float(opt.learning_rate.item()),
                    "tok_per_s": len(losses) * tokens_per_step / (now - t_log),
                    "elapsed_s": now - t0,
                },
            )
            losses, t_log = [], time.perf_counter()
        over_time = args.max_seconds is not None and now - t0 > args.max_seconds
        if now - t_ckpt > args.ckpt_every or done == last or over_time:
            save_checkpoint(ckpt, model, opt, done)
            val = evaluate_loss(
                model, heldout, seq_len=args.seq_len, max_tokens=args.eval_tokens
            )
            log_line(
                log_path,
                {
                    "event": "checkpoint",
                    "step": done,
                    "tokens": done * tokens_per_step,
                    "heldout_loss": val,
                },
            )
            t_ckpt = t_log = time.perf_counter()
            if not args.no_export:
                export(out, model, config, data_dir)
        if over_time:
            break
    log_line(
        log_path, {"event": "end", "step": step + 1 if last > start else start}
    )


if __name__ == "__main__":
    main()
