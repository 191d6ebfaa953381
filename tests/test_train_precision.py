"""Mixed-precision training: float32 weights, forwards in the compute dtype."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlx_spec.train.precision import compute_dtype, computing_in


def test_auto_precision_is_float32_on_a_cpu_and_bfloat16_on_metal():
    expected = mx.bfloat16 if mx.metal.is_available() else mx.float32
    assert compute_dtype("auto") == expected
    assert compute_dtype("bfloat16") == mx.bfloat16
    assert compute_dtype("float32") == mx.float32


def test_unknown_precision_one_line_error():
    with pytest.raises(ValueError, match="--precision must be one of") as e:
        compute_dtype("float8")
    assert "\n" not in str(e.value)


def test_forward_in_bfloat16_gives_float32_gradients_to_float32_weights():
    mx.random.seed(0)
    layer = nn.Linear(8, 4)
    frozen = nn.Linear(8, 8)
    frozen.freeze()
    model = nn.Sequential(frozen, layer)
    x = mx.random.normal((3, 8))
    seen = {}

    def loss(model, x):
        with computing_in(model, mx.bfloat16):
            seen["weight"] = model.layers[1].weight.dtype
            seen["frozen"] = model.layers[0].weight.dtype
            out = model.layers[1](x.astype(mx.bfloat16))
        seen["out"] = out.dtype
        return (out.astype(mx.float32) ** 2).mean()

    value, grads = nn.value_and_grad(model, loss)(model, x)
    assert seen == {"weight": mx.bfloat16, "frozen": mx.float32, "out": mx.bfloat16}
    assert model.layers[1].weight.dtype == mx.float32  # restored on exit
    g = grads["layers"][1]["weight"]
    assert g.dtype == mx.float32 and mx.abs(g).sum().item() > 0
    # The same loss in float32 is close: the casts only round.
    with computing_in(model, mx.float32):
        exact = (model.layers[1](x) ** 2).mean()
    assert abs(value.item() - exact.item()) < 0.05 * abs(exact.item()) + 1e-3


def test_head_and_draft_train_in_bfloat16_with_float32_weights(load_model):
    """Both trainers run their forwards in bfloat16 and still learn."""
    from mlx.utils import tree_flatten

    from mlx_spec.train import completions as C
    from mlx_spec.train import draft as D
    from mlx_spec.train.head_data import from_completions
    from mlx_spec.train.heads import HeadTrainConfig, HeadTrainer
    from mlx_spec.train.prompts import mixed_prompts

    model, tokenizer = load_model("llama")
    prompts = mixed_prompts(4, "train", seed=0, shares={"chat": 1.0})
    data = C.generate_completions(
        model, tokenizer, prompts, [0.0] * 4, max_tokens=16, progress=None
    )
    config = D.DraftTrainConfig(
        steps=10, lr=1e-2, warmup=1, draft_vocab=200, layers=[1], precision="bfloat16"
    )
    draft = D.DraftTrainer(model, tokenizer, data, data, config)
    losses = [draft.train_step()["loss"] for _ in range(10)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(v.dtype == mx.float32 for v in draft.draft.trainable_state().values())

    heads = HeadTrainer(
        model,
        from_completions(data),
        HeadTrainConfig(
            kind="eagle", lr=1e-2, batch_size=4, window=64, precision="bfloat16"
        ),
        heldout_index=[0],
    )
    losses = [heads.train_step()["loss"] for _ in range(10)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(heads.head.parameters()))
