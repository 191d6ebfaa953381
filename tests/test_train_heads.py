"""Training draft heads: teacher data, the unrolled EAGLE loss, resume, head files.

Everything runs on a tiny 1-layer llama over 8 tokens, whose greedy text a
head learns in seconds.
"""

import argparse
import signal
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.drafters.heads import load_head, read_head_config
from mlx_spec.engine import speculative_events
from mlx_spec.features import FeatureCapture
from mlx_spec.testing import greedy_continuation, tiny_llama
from mlx_spec.train import eagle as eagle_train
from mlx_spec.train.checkpoint import TrainingPaused, read_state
from mlx_spec.train.head_command import (
    add_head_arguments,
    eagle3_blocks,
    head_config,
    run_head_training,
)
from mlx_spec.train.head_data import teacher_data
from mlx_spec.train.heads import EVAL_DEPTH, HeadTrainConfig, HeadTrainer, train_head
from mlx_spec.train.rounds import calibrated_choices, tree_depths

VOCAB = 8


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(VOCAB)


@pytest.fixture(scope="module")
def sequences(tiny):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(20):
        prompt = rng.integers(0, VOCAB, size=5).tolist()
        out.append(prompt + greedy_continuation(tiny, prompt, 30)[0])
    return out


def test_teacher_data_holds_features_and_laws_of_a_full_forward(tiny, sequences):
    data = teacher_data(tiny, sequences[:3], [5, 5, 5], batch_tokens=40)
    for seq, feats, ids, logp in zip(
        sequences[:3], data.features, data.teacher_ids, data.teacher_logp
    ):
        capture = FeatureCapture(tiny)
        with capture.capturing():
            logits = tiny(mx.array([seq]))[0]
        assert np.allclose(feats, np.array(capture.take()), atol=1e-2)
        assert (ids[:, 0] == np.array(mx.argmax(logits, -1))).all()
        law = np.array(logits - mx.logsumexp(logits, -1, keepdims=True))
        assert np.allclose(logp[:, 0], law.max(-1), atol=1e-2)
    # Laws given (kept while generating): the same features, the laws as given.
    laws = (list(data.teacher_ids), list(data.teacher_logp))
    again = teacher_data(tiny, sequences[:3], [5, 5, 5], laws=laws)
    for a, b in zip(again.features, data.features):
        assert np.allclose(a, b, atol=1e-2)
    assert again.teacher_ids[0] is data.teacher_ids[0]


def test_unrolled_masks_see_true_pairs_then_own_drafts():
    """Step s at query q sees step-1 entries <= q - s + 1 and step-k entries at q - s + k."""
    masks = eagle_train.unrolled_masks(6, 3)
    m = np.array(masks[2])  # step 3: keys are [step 1 | step 2 | step 3]
    q = 4
    assert m[q, :6].tolist() == [True, True, True, False, False, False]
    assert np.flatnonzero(m[q, 6:12]).tolist() == [3]
    assert np.flatnonzero(m[q, 12:]).tolist() == [4]
    assert np.array(masks[0]).tolist() == np.tril(np.ones((6, 6), bool)).tolist()


def test_training_raises_held_out_acceptance_and_resumes(tiny, sequences, tmp_path):
    config = HeadTrainConfig(
        kind="eagle",
        steps=40,
        batch_size=8,
        window=40,
        lr=1e-2,
        draft_vocab=0,
        heldout=4,
        eval_every=20,
        checkpoint_every=20,
    )
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    start = HeadTrainer(tiny, data, config).evaluate()["tokens_per_round"]
    trainer = train_head(tiny, data, config, tmp_path, progress=False)
    evals = [e["tokens_per_round"] for e in trainer.evals]
    assert evals[-1] > start + 0.5, (start, evals)
    # Resume: a longer run continues from the saved step.
    longer = HeadTrainConfig(**{**config.__dict__, "steps": 60})
    resumed = train_head(tiny, data, longer, tmp_path, progress=False)
    assert resumed.history[40]["step"] == 41 and resumed.step == 60
    with pytest.raises(ValueError, match="other draft_vocab"):
        other = HeadTrainConfig(**{**config.__dict__, "draft_vocab": 4})
        train_head(tiny, data, other, tmp_path, progress=False)
    head = load_head(tmp_path, tiny)
    stats = SpecStats()
    prompt = sequences[0][:5]
    spec = SpecConfig(method="eagle-chain", max_tokens=30, adaptive=False)
    out = [
        e.token
        for e in speculative_events(
            mx.array(prompt), tiny, head, config=spec, stats=stats
        )
    ]
    assert out == greedy_continuation(tiny, prompt, 30)[0]
    assert stats.tokens_per_target_forward > 1.5


def test_held_out_ranks_are_where_each_unrolled_step_puts_the_targets_token(
    tiny, sequences
):
    """EAGLE's held-out ranks order each step's draft logits as argmax does;
    the chain is their zero prefix, and a tree that is that chain has its τ."""
    config = HeadTrainConfig(kind="eagle", draft_vocab=0, heldout=4, tree_size=12)
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    trainer = HeadTrainer(tiny, data, config)
    batch = eagle_train.make_batch(
        data, trainer.eval_index, trainer.to_draft, 1 << 30, np.random.default_rng(0)
    )
    depth = 3
    ranks = eagle_train.step_ranks(
        trainer.head, trainer.embed_fn, trainer.logits_fn(), batch, depth
    )
    outs = eagle_train.unrolled_outputs(
        trainer.head, trainer.embed_fn, trainer.logits_fn(), batch, depth
    )
    logits = np.stack([np.array(l) for _, l in outs], axis=-2)  # (B, Q, depth, V)
    top, valid = np.array(batch.teacher_top)[:, 1:], batch.valid_np[:, 1:]
    expected = []
    for b, j in zip(*np.nonzero(valid)):
        row = []
        for s in range(depth):
            q = j + s
            if q >= valid.shape[1] or not valid[b, q]:
                row.append(-1)
                continue
            order = np.argsort(-logits[b, q, s], kind="stable").tolist()
            row.append(order.index(top[b, q]))
        expected.append(row)
    assert ranks.tolist() == expected and (ranks > 0).any()
    summary = trainer.evaluate()
    assert summary["tree_nodes"] == 12 and len(summary["tree_choices"]) == 12
    chain = [(0,) * s for s in range(1, EVAL_DEPTH + 1)]
    all_ranks = eagle_train.step_ranks(
        trainer.head, trainer.embed_fn, trainer.logits_fn(), batch, EVAL_DEPTH
    )
    tau = 1 + tree_depths(all_ranks, chain).mean()
    assert summary["tokens_per_round"] == pytest.approx(tau, abs=1e-4)


def test_a_static_tree_accepts_the_longest_prefix_of_ranks_that_is_a_node():
    choices = [(0,), (1,), (0, 0), (0, 2), (1, 0), (0, 0, 0)]
    ranks = np.array(
        [
            [0, 0, 0],  # the chain of argmaxes: all 3
            [1, 0, 5],  # second candidate, then its first child: 2
            [0, 2, 0],  # (0, 2) has no child in the tree: 2
            [0, 1, 0],  # (0, 1) is not a node: 1
            [2, 0, 0],  # (2,) is not a node: 0
            [0, 0, -1],  # the sequence ends after 2 drafts: 2
            [10, 0, 0],  # past the ranked candidates: 0
        ]
    )
    assert tree_depths(ranks, choices).tolist() == [3, 2, 2, 1, 0, 2, 0]


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_ctrl_c_pauses_a_head_after_the_step_and_the_run_goes_on_unchanged(
    tiny, sequences, tmp_path, monkeypatch, kind
):
    config = HeadTrainConfig(
        kind=kind,
        steps=12,
        batch_size=4,
        window=24,
        lr=1e-2,
        draft_vocab=0,
        heldout=4,
        eval_every=6,
        checkpoint_every=6,
    )
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    straight = train_head(tiny, data, config, tmp_path / "a", progress=False)
    real = HeadTrainer.train_step

    def pressed_during_step_8(self):
        if self.step == 7:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            signal.raise_signal(signal.SIGINT)
        return real(self)

    monkeypatch.setattr(HeadTrainer, "train_step", pressed_during_step_8)
    with pytest.raises(TrainingPaused) as paused:
        train_head(tiny, data, config, tmp_path / "b", progress=False)
    assert paused.value.step == 8 and read_state(tmp_path / "b")["step"] == 8
    monkeypatch.setattr(HeadTrainer, "train_step", real)
    resumed = train_head(tiny, data, config, tmp_path / "b", progress=False)
    assert resumed.step == 12 and [e["step"] for e in resumed.evals] == [6, 12]
    theirs = dict(tree_flatten(resumed.head.parameters()))
    for name, value in tree_flatten(straight.head.parameters()):
        assert mx.allclose(value, theirs[name], atol=1e-5).item(), name


def test_ctrl_c_in_the_last_step_pauses_before_the_head_is_written(
    tiny, sequences, tmp_path, monkeypatch
):
    config = HeadTrainConfig(
        kind="medusa", steps=3, batch_size=4, window=24, draft_vocab=0, heldout=4
    )
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    real = HeadTrainer.train_step

    def pressed_during_the_last_step(self):
        if self.step == 2:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            signal.raise_signal(signal.SIGINT)
        return real(self)

    monkeypatch.setattr(HeadTrainer, "train_step", pressed_during_the_last_step)
    with pytest.raises(TrainingPaused) as paused:
        train_head(tiny, data, config, tmp_path, progress=False)
    assert paused.value.step == 3 and not (tmp_path / "config.json").exists()
    monkeypatch.setattr(HeadTrainer, "train_step", real)
    assert train_head(tiny, data, config, tmp_path, progress=False).step == 3
    assert read_head_config(tmp_path)["mlx_spec_head"]["kind"] == "medusa"


def test_a_head_warm_starts_from_a_trained_one_of_its_kind(tiny, sequences, tmp_path):
    config = HeadTrainConfig(
        kind="eagle", steps=20, batch_size=8, window=40, lr=1e-2, draft_vocab=0
    )
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    train_head(tiny, data, config, tmp_path / "eagle", progress=False)
    # Another draft vocabulary: the rows are the target's, so the head still fits.
    warm = HeadTrainer(
        tiny,
        data,
        HeadTrainConfig(
            **{
                **config.__dict__,
                "draft_vocab": 40,
                "init_from": str(tmp_path / "eagle"),
            }
        ),
    )
    saved = dict(tree_flatten(load_head(tmp_path / "eagle", tiny).module.parameters()))
    for name, value in tree_flatten(warm.head.parameters()):
        assert mx.allclose(value, saved[name].astype(mx.float32)).item(), name
    cold = HeadTrainer(
        tiny, data, HeadTrainConfig(**{**config.__dict__, "draft_vocab": 40})
    )
    assert warm.evaluate()["tokens_per_round"] > cold.evaluate()["tokens_per_round"]
    medusa = HeadTrainConfig(kind="medusa", init_from=str(tmp_path / "eagle"))
    with pytest.raises(
        ValueError, match="holds no medusa head \\(found: eagle\\)"
    ) as e:
        HeadTrainer(tiny, data, medusa)
    assert "\n" not in str(e.value)


def test_head_command_caches_the_teacher_pass_by_chunk(
    tiny, sequences, tmp_path, monkeypatch
):
    from mlx_spec.train import head_command

    parser = argparse.ArgumentParser()
    parser.add_argument("--draft-vocab", type=int)  # train-draft's own flag is kept
    add_head_arguments(parser)
    args = parser.parse_args(
        ["--window", "40", "--eval-every", "5", "--batch-size", "4"]
    )
    args.out, args.steps, args.lr, args.no_progress = str(tmp_path), 5, 1e-2, True
    assert head_config(args, "medusa").draft_vocab == head_command.DEFAULT_DRAFT_VOCAB
    monkeypatch.setattr(head_command, "TEACHER_CHUNK", 8)
    train = SimpleNamespace(tokens=sequences[:16], starts=[5] * 16)
    heldout = SimpleNamespace(tokens=sequences[16:], starts=[5] * 4)
    args.draft_vocab = 0
    run_head_training(args, "medusa", tiny, train, heldout, log=lambda _: None)
    chunks = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert len(chunks) == 3  # two training chunks, one held-out chunk
    assert read_head_config(tmp_path)["training"]["heldout_sequences"] == 4
    card = (tmp_path / "README.md").read_text()
    assert "- Reads: the target's final hidden state (4 heads)." in card
    # More training data: the held-out chunk and the first chunks are reused.
    calls = []
    real = head_command.teacher_data
    monkeypatch.setattr(
        head_command,
        "teacher_data",
        lambda *a, **k: calls.append(len(a[1])) or real(*a, **k),
    )
    args.steps = 6
    more = SimpleNamespace(tokens=sequences[:16] + sequences[:4], starts=[5] * 20)
    run_head_training(args, "medusa", tiny, more, heldout, log=lambda _: None)
    assert calls == [4]


def test_eagle3_blocks_are_a_low_a_middle_and_a_high_block():
    assert eagle3_blocks(30) == [2, 15, 27]  # SmolLM2-135M, as the shipped head
    assert eagle3_blocks(32) == [2, 16, 29]
    # Tiny targets: moved inward, still distinct blocks of the target.
    assert eagle3_blocks(4) == [0, 2, 3]
    assert eagle3_blocks(2) == [0, 1] and eagle3_blocks(1) == [0]
    for n in range(1, 65):
        blocks = eagle3_blocks(n)
        assert len(blocks) == min(3, n) and blocks == sorted(set(blocks)), n
        assert 0 <= blocks[0] and blocks[-1] < n, n


def _head_args(*argv):
    parser = argparse.ArgumentParser()
    add_head_arguments(parser)
    return parser.parse_args(list(argv))


def test_eagle_reads_eagle3_blocks_unless_told_and_medusa_the_final_state():
    assert head_config(_head_args(), "eagle", 30).feature_layers == [2, 15, 27]
    assert head_config(_head_args(), "eagle", 2).feature_layers == [0, 1]
    told = _head_args("--feature-layers", "-1")
    assert head_config(told, "eagle", 30).feature_layers == [-1]
    assert head_config(_head_args(), "medusa", 30).feature_layers == [-1]
    assert head_config(told, "medusa", 30).feature_layers == [-1]
    with pytest.raises(ValueError, match="--feature-layers is for --kind eagle") as e:
        head_config(_head_args("--feature-layers", "2,15"), "medusa", 30)
    assert "\n" not in str(e.value)


def test_calibrated_tree_keeps_every_prefix_and_the_best_paths():
    acc = np.array([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.1]])
    choices = calibrated_choices(acc, 5)
    # Path values: (0,) .6, (0, 0) .3, (1,) .2, (0, 0, 0) .12, (0, 1) .12, then <= .1.
    assert choices == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert all(c[:-1] in choices for c in choices if len(c) > 1)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_trains_on_a_quantized_target(kind, tmp_path):
    """As on a Mac, whose models are mostly 4-bit: the head is as wide as the
    target's hidden states, not as its packed embedding rows."""
    import mlx.nn as nn

    target = tiny_llama(VOCAB)
    nn.quantize(target, group_size=32, bits=4)
    sequences = []
    rng = np.random.default_rng(1)
    for _ in range(20):
        prompt = rng.integers(0, VOCAB, size=5).tolist()
        sequences.append(prompt + greedy_continuation(target, prompt, 30)[0])
    layers = [0] if kind == "eagle3" else [-1]  # EAGLE-3 fuses blocks
    config = HeadTrainConfig(
        kind=kind,
        steps=40,
        batch_size=8,
        window=40,
        lr=1e-2,
        draft_vocab=0,
        heldout=4,
        feature_layers=layers,
    )
    data = teacher_data(target, sequences, [5] * len(sequences), feature_layers=layers)
    start = HeadTrainer(target, data, config).evaluate()["tokens_per_round"]
    trainer = train_head(target, data, config, tmp_path, progress=False)
    args = trainer.head.args
    assert getattr(args, "shape", args).hidden_size == 32
    assert trainer.evaluate()["tokens_per_round"] > start + 0.3
    assert load_head(tmp_path, target).kind == ("eagle" if kind == "eagle3" else kind)


# --------------------------------------------------------------------------- #
# EAGLE-3-shaped heads (--kind eagle3)
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny2():
    return tiny_llama(VOCAB, num_layers=2)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_unrolled_training_steps_are_the_chains_the_head_drafts(tiny2, kind):
    """The training-time test: step ``s`` at query ``q`` gives the logits of the
    ``s``-th draft of the chain whose last true pair is ``q - s + 1``, as the
    drafter computes it (own outputs fed back, its own cache)."""
    from mlx_spec.drafters.heads import random_head
    from mlx_spec.drafters.published.export import unrolled_chain
    from mlx_spec.features import embed
    from mlx_spec.train.heads import output_weight

    head = random_head(kind, tiny2, seed=4, feature_layers=[0, 1])
    mx.random.seed(5)
    W, steps = 7, 3
    batch = SimpleNamespace(
        tokens=mx.random.randint(0, VOCAB, (1, W)).astype(mx.int32),
        features=mx.random.normal((1, W, 2 * 32)),
    )
    if kind == "eagle3":
        logits_fn = head.module.logits
    else:
        logits_fn = eagle_train.frozen_rows(output_weight(tiny2, None))
    outs = eagle_train.unrolled_outputs(
        head.module, lambda t: embed(tiny2, t), logits_fn, batch, steps
    )
    hidden, ids = batch.features[0, :-1], batch.tokens[0, 1:]
    for s in range(1, steps + 1):
        for q in range(s - 1, W - 1):
            chain = unrolled_chain(head, hidden, ids, q - s + 1, s)
            got = outs[s - 1][1][0, q]
            assert mx.allclose(got, chain[s - 1], atol=1e-4, rtol=1e-4), (s, q)


def test_an_eagle3_head_trains_saves_and_drafts_exactly(tiny2, tmp_path):
    """``--kind eagle3``: held-out acceptance rises, the directory loads as an
    ``eagle`` head of EAGLE-3's architecture, and drafting with it is exact."""
    from mlx_spec.drafters.heads import head_architecture
    from mlx_spec.drafters.published.eagle3 import Eagle3Head
    from mlx_spec.train.head_command import write_card

    rng = np.random.default_rng(2)
    sequences = []
    for _ in range(20):
        prompt = rng.integers(0, VOCAB, size=5).tolist()
        sequences.append(prompt + greedy_continuation(tiny2, prompt, 30)[0])
    config = HeadTrainConfig(
        kind="eagle3",
        steps=40,
        batch_size=8,
        window=40,
        lr=1e-2,
        draft_vocab=6,
        heldout=4,
        eval_every=20,
        checkpoint_every=20,
        feature_layers=[0, 1],
    )
    data = teacher_data(tiny2, sequences, [5] * len(sequences), feature_layers=[0, 1])
    start = HeadTrainer(tiny2, data, config).evaluate()["tokens_per_round"]
    trainer = train_head(tiny2, data, config, tmp_path, progress=False)
    assert trainer.evals[-1]["tokens_per_round"] > start + 0.5, trainer.evals
    longer = HeadTrainConfig(**{**config.__dict__, "steps": 50})
    assert train_head(tiny2, data, longer, tmp_path, progress=False).step == 50
    saved = read_head_config(tmp_path)
    assert head_architecture(saved) == "eagle3" and saved["draft_vocab_size"] == 6
    write_card(tmp_path, "mlx_spec train-draft --kind eagle3")
    assert "Architecture: EAGLE-3" in (tmp_path / "README.md").read_text()
    head = load_head(tmp_path, tiny2)
    assert head.kind == "eagle" and isinstance(head.module, Eagle3Head)
    assert head.vocab.size == 6
    prompt = sequences[0][:5]
    for method in ("eagle-chain", "eagle"):
        stats = SpecStats()
        spec = SpecConfig(method=method, max_tokens=30, adaptive=False)
        out = [
            e.token
            for e in speculative_events(
                mx.array(prompt), tiny2, head, config=spec, stats=stats
            )
        ]
        assert out == greedy_continuation(tiny2, prompt, 30)[0], method
        assert stats.tokens_per_target_forward > 1.5, method


def test_eagle3_refuses_the_final_state_and_an_eagle_init_in_one_line(tiny2, tmp_path):
    from mlx_spec.drafters.heads import random_head, save_head
    from mlx_spec.fingerprint import model_fingerprint
    from mlx_spec.train.cli_options import check_init_from

    with pytest.raises(ValueError, match="--kind eagle3 fuses target blocks") as e:
        head_config(_head_args("--feature-layers", "0,-1"), "eagle3", 30)
    assert "\n" not in str(e.value)
    assert head_config(_head_args(), "eagle3", 30).feature_layers == [2, 15, 27]
    head = random_head("eagle", tiny2, seed=1)
    fingerprint = model_fingerprint(tiny2)
    save_head(tmp_path, "eagle", head.module, target_fingerprint=fingerprint)
    with pytest.raises(ValueError, match="holds the eagle drafter") as e:
        check_init_from(str(tmp_path), "eagle3")
    assert "\n" not in str(e.value) and "--kind eagle3" in str(e.value)


def test_a_head_card_names_the_corpus_it_was_trained_on():
    """A corpus run records no sampling or generation time: the card names the
    corpus instead of printing None for them."""
    from mlx_spec.train.card import head_card

    data = {
        "corpus": "smollm2-135m-corpus",
        "train_sets": {"chat": 2, "code": 1},
        "train_prompt_tokens": 30,
        "train_completion_tokens": 90,
    }
    config = {"training": {"config": {"kind": "eagle3"}, "evals": []}, "data": data}
    card = head_card(config, "mlx_spec train-draft --kind eagle3 --corpus c")
    line = next(x for x in card.splitlines() if x.startswith("- Prompts:"))
    assert line == (
        "- Prompts: 2 chat, 1 code; 30 prompt and 90 completion tokens of the "
        "corpus `smollm2-135m-corpus`."
    )


@pytest.mark.parametrize("init_from", ["models/old-head", ""])
def test_a_head_card_names_the_head_it_warm_started_from(init_from):
    from mlx_spec.train.card import head_card

    config = {"training": {"config": {"kind": "eagle", "init_from": init_from}}}
    card = head_card(config, "mlx_spec train-draft --kind eagle")
    assert ("Warm-started from the head in `models/old-head`." in card) == bool(
        init_from
    )
