"""One rank of sharded runs (started by mlx.launch from tests/test_sharded.py).

``--jobs FILE`` holds ``{name: job}``; each job loads its target sharded
(``model``, ``draft_model`` if any, ``pipeline``, the ``head`` kind of its
EAGLE methods) and decodes the same prompt with each of its ``methods`` (at
``temp``, seeded by ``seed``, with any other ``options`` of
``stream_generate``), up to its own ``max_tokens`` if it has one. A job with
``load`` (``{"method": ..., **options}``) loads as the front ends do, through
``load_pair``. Every rank writes ``{name: {method: results}}`` to
``OUT/rank<r>.json`` (``{"error": line}`` for a job or a method refused with
a ``ValueError``); the tests compare the
ranks with each other and with unsharded decoding. One process group runs
them all: a rank's start-up (imports, the ring) costs as much as the decodes.
"""

import argparse
import json
from pathlib import Path

import mlx_spec  # noqa: F401  (OpenBLAS before mlx)

# isort: split
import mlx.core as mx

from mlx_spec import stream_generate
from mlx_spec.costs import target_bytes, weight_bytes
from mlx_spec.distributed import load_sharded, sharded_group, shared_seed
from mlx_spec.drafters.heads import random_head
from mlx_spec.loading import load_draft, load_pair


def load_job(job: dict):
    """``(model, tokenizer, draft)`` of one job (see the module's docstring)."""
    pipeline = job.get("pipeline", False)
    if "load" in job:
        options = dict(job["load"])
        method = options.pop("method")
        draft_path = job.get("draft_model")
        return load_pair(job["model"], draft_path, method, pipeline=pipeline, **options)
    model, tokenizer = load_sharded(job["model"], pipeline=pipeline)
    draft = None
    if job.get("draft_model"):
        draft = load_draft(job["draft_model"], model, tokenizer)
    return model, tokenizer, draft


def run_job(job: dict, prompt: list, max_tokens: int) -> dict:
    """``{method: results}`` of one job (see the module's docstring)."""
    pipeline = job.get("pipeline", False)
    try:
        model, tokenizer, draft = load_job(job)
    except ValueError as e:  # a refusal, met alike by every rank
        return {"error": str(e)}
    results = {"drafter": None if draft is None else type(draft).__name__}
    for method in job["methods"]:
        drafter = draft
        if method.startswith("eagle"):
            drafter = random_head(job.get("head", "eagle"), model, seed=1)
        elif method in ("lookup", "self", "none"):
            drafter = None
        seed = shared_seed(job.get("seed"))
        if seed is not None:
            mx.random.seed(seed)
        try:
            stream = stream_generate(
                model,
                tokenizer,
                prompt,
                draft_model=drafter,
                speculative=method,
                max_tokens=job.get("max_tokens", max_tokens),
                temp=job.get("temp", 0.0),
                **job.get("options", {}),
            )
            tokens = [r.token for r in stream]
        except ValueError as e:  # a refusal, met alike by every rank
            results[method] = {"error": str(e)}
            continue
        results[method] = {
            "tokens": tokens,
            "rounds": stream.stats.rounds,
            "tokens_per_forward": stream.stats.as_dict().get("tokens_per_forward"),
            # What every rank decided from: it must be the same on all of them.
            "drafted_per_round": stream.stats.drafted_per_round,
            "cost_model": stream.stats.cost_model,
        }
    # What a draft step is priced against, and this rank's own share.
    results["target_bytes"] = target_bytes(model)
    results["own_bytes"] = weight_bytes(model)
    if not pipeline:
        layer = model.layers[0]
        results["split"] = {
            "attention": type(layer.self_attn.q_proj).__name__,
            "mlp": type(layer.mlp.down_proj).__name__,
        }
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", required=True)
    p.add_argument("--prompt", type=int, nargs="+", required=True)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    group = sharded_group()
    jobs = json.loads(Path(args.jobs).read_text())
    results = {
        name: run_job(job, args.prompt, args.max_tokens) for name, job in jobs.items()
    }
    out = Path(args.out) / f"rank{group.rank()}.json"
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
