"""One rank of a sharded run (started by mlx.launch from tests/test_sharded.py).

Each rank decodes the same prompt with each method on the sharded target and
writes the token ids it produced to ``OUT/rank<r>.json``; the test compares
the ranks with each other and with unsharded plain decoding.
"""

import argparse
import json
from pathlib import Path

import mlx_spec  # noqa: F401  (OpenBLAS before mlx)

# isort: split
import mlx.core as mx

from mlx_spec import stream_generate
from mlx_spec.distributed import load_sharded, sharded_group, shared_seed
from mlx_spec.drafters.heads import random_head
from mlx_spec.loading import load_draft


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model")
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--prompt", type=int, nargs="+", required=True)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    group = sharded_group()
    model, tokenizer = load_sharded(args.model, pipeline=args.pipeline)
    draft = None
    if args.draft_model:
        draft = load_draft(args.draft_model, model, tokenizer)
    results = {}
    for method in args.methods:
        drafter = draft
        if method.startswith("eagle"):
            drafter = random_head("eagle", model, seed=1)
        elif method in ("lookup", "self", "none"):
            drafter = None
        seed = shared_seed(args.seed)
        if seed is not None:
            mx.random.seed(seed)
        stream = stream_generate(
            model,
            tokenizer,
            args.prompt,
            draft_model=drafter,
            speculative=method,
            max_tokens=args.max_tokens,
            temp=args.temp,
        )
        tokens = [r.token for r in stream]
        results[method] = {
            "tokens": tokens,
            "rounds": stream.stats.rounds,
            "tokens_per_forward": stream.stats.as_dict().get("tokens_per_forward"),
            # What every rank decided from: it must be the same on all of them.
            "drafted_per_round": stream.stats.drafted_per_round,
            "cost_model": stream.stats.cost_model,
        }
    if not args.pipeline:
        layer = model.layers[0]
        results["split"] = {
            "attention": type(layer.self_attn.q_proj).__name__,
            "mlp": type(layer.mlp.down_proj).__name__,
        }
    out = Path(args.out) / f"rank{group.rank()}.json"
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
