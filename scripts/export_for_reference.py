"""Export an EAGLE-3 head from mlx-spec, with its draft logits, for the reference to check.

Run with the project's environment, then check the folder with the reference
code (speculators' ``Eagle3DraftModel``) in its own virtualenv::

    python scripts/export_for_reference.py /tmp/exported
    /tmp/refvenv/bin/python scripts/published_fixtures.py /tmp/exported --check-export

The head is random, shaped for a small llama target (with a draft vocabulary,
qwen3 q/k norms and the norm before the residual, so every part is written).
Beside the folder, ``exported.io.safetensors`` holds fixed target features
and tokens and mlx-spec's logits of three unrolled draft steps from every
position: the reference computes the same steps as its training-time test.

With ``--own``, the head is one of our own ``train-draft --kind eagle3``
heads (a head directory, briefly trained on the small target's greedy
text), exported by ``mlx_spec export``'s code path; the logits are those of
the head directory as mlx-spec drafts with it, and the io file also keeps
the target's embedding (the head reads it). The committed fixture
``tests/fixtures/published/mlx-spec-eagle3`` is made this way, then given
the reference's logits by ``published_fixtures.py --check-export --record``.
"""

import argparse
import tempfile
from pathlib import Path

import mlx_spec  # noqa: F401  (preloads OpenBLAS before mlx)

# isort: split
import mlx.core as mx
from mlx_lm.models import llama

from mlx_spec.drafters.heads import load_head
from mlx_spec.drafters.published import load_published
from mlx_spec.drafters.published.export import random_eagle3, unrolled_chain
from mlx_spec.testing import tiny_llama

STEPS = 3
TOKENS = 7


def small_target(vocab: int = 64, layers: int = 6) -> llama.Model:
    """A random llama target the exported head is shaped for (the fixtures' shape)."""
    return tiny_llama(
        vocab, num_layers=layers, hidden_size=16, num_kv_heads=1, head_scale=None
    )


def own_eagle3(target, folder: Path, out: Path):
    """Train a ``--kind eagle3`` head briefly into ``folder``; export it to ``out``."""
    import numpy as np

    from mlx_spec.drafters.published.export import export_eagle3
    from mlx_spec.testing import greedy_continuation
    from mlx_spec.train.head_data import teacher_data
    from mlx_spec.train.heads import HeadTrainConfig, train_head

    rng = np.random.default_rng(0)
    sequences = []
    for _ in range(12):
        prompt = rng.integers(0, 64, size=4).tolist()
        sequences.append(prompt + greedy_continuation(target, prompt, 24)[0])
    layers = [1, 2, 4]  # blocks: speculators' layer ids 2, 3, 5
    data = teacher_data(target, sequences, [4] * 12, feature_layers=layers)
    config = HeadTrainConfig(
        kind="eagle3",
        steps=20,
        batch_size=4,
        window=28,
        draft_vocab=32,
        heldout=2,
        eval_every=20,
        feature_layers=layers,
    )
    train_head(target, data, config, folder, progress=False)
    export_eagle3(folder, target, out, verifier="mlx-spec/tiny-llama")


def unrolled_steps(head, hidden: mx.array, ids: mx.array) -> mx.array:
    """``(STEPS, T, C)``: the chain from every pair (see ``unrolled_chain``)."""
    chains = [
        unrolled_chain(head, hidden, ids, t, STEPS) for t in range(hidden.shape[0])
    ]
    return mx.stack(chains, axis=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the head to")
    parser.add_argument(
        "--own",
        action="store_true",
        help="export one of our own --kind eagle3 heads (trained briefly)",
    )
    args = parser.parse_args(argv)
    mx.random.seed(0)
    target = small_target()
    extra = {}
    if args.own:
        with tempfile.TemporaryDirectory() as folder:
            own_eagle3(target, Path(folder) / "head", args.out)
            head = load_head(Path(folder) / "head", target)
        extra["verifier_embed"] = target.model.embed_tokens.weight
    else:
        ids = sorted(range(0, 64, 2))  # a draft vocabulary of the even ids
        random_eagle3(
            target,
            args.out,
            seed=0,
            ids=ids,
            layer_ids=[2, 3, 5],
            model_type="qwen3",
            norm_before_residual=True,
        )
        head = load_published(args.out, target)
    mx.random.seed(1)
    hidden = mx.random.normal((TOKENS, 3 * 16))
    tokens = mx.random.randint(0, 64, (TOKENS,)).astype(mx.int32)
    logits = unrolled_steps(head, hidden, tokens)
    io = args.out.parent / f"{args.out.name}.io.safetensors"
    mx.save_safetensors(
        str(io),
        {"hidden_states": hidden, "input_ids": tokens, "step_logits": logits, **extra},
    )
    print(f"wrote {args.out} and {io}")


if __name__ == "__main__":
    main()
