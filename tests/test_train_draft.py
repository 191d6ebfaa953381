"""Distilled drafts (``mlx_spec train-draft --kind draft``): data, training, resume,
loading, exactness and target checks, on tiny random targets."""

import itertools
import json
import shutil
import signal
from dataclasses import replace
from pathlib import Path
from typing import List

import mlx.core as mx
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics
from mlx.utils import tree_flatten

from mlx_spec import SpecConfig, SpecStats, stream_generate
from mlx_spec.drafters import distilled
from mlx_spec.engine import speculative_events
from mlx_spec.loading import load_draft
from mlx_spec.testing import linear_quantizations, tiny_llama
from mlx_spec.train import completions as C
from mlx_spec.train import draft as D
from mlx_spec.train.checkpoint import TrainingPaused, read_state
from mlx_spec.train.draft_batches import make_batch
from mlx_spec.train.prompts import mixed_prompts

CHAT_ONLY = {"chat": 1.0}


@pytest.fixture(scope="module")
def target(load_model):
    return load_model("llama")


@pytest.fixture(scope="module")
def data(target, tmp_path_factory):
    """Completions of 6 training and 2 held-out chat prompts (greedy and sampled)."""
    model, tokenizer = target
    folder = tmp_path_factory.mktemp("completions")
    prompts = mixed_prompts(8, "heldout", seed=0, shares=CHAT_ONLY)
    options = dict(max_tokens=16, shard_size=4, progress=False)
    train = C.build_completions(
        model, tokenizer, prompts[:6], folder, "train", **options
    )
    heldout = C.build_completions(
        model, tokenizer, prompts[6:], folder, "heldout", sampled_share=0.0, **options
    )
    return train, heldout, prompts, folder


def _config(**kw):
    base = dict(
        steps=12,
        batch_tokens=1024,
        lr=1e-2,
        warmup=2,
        draft_vocab=200,
        layers=[1],
        eval_every=6,
        checkpoint_every=6,
    )
    return D.DraftTrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(target, data, tmp_path_factory):
    """A draft trained for a few steps and written to a directory."""
    model, tokenizer = target
    train, heldout, _, _ = data
    out = tmp_path_factory.mktemp("draft")
    D.train_draft(model, tokenizer, train, heldout, _config(), out, progress=False)
    return out


def test_completions_hold_prompt_completion_and_teacher_laws(target, data):
    model, tokenizer = target
    train, heldout, prompts, _ = data
    assert len(train) == 6 and len(heldout) == 2
    assert train.temps.count(C.DEFAULT_SAMPLED_TEMP) == 1  # a quarter, spread out
    for i, tokens in enumerate(train.tokens):
        start = train.starts[i]
        assert tokens[:start].tolist() == C.encode_prompt(tokenizer, prompts[i])
        rows = len(tokens) - start
        assert train.teacher_ids[i].shape == (rows, C.DEFAULT_TOP_K)
        logp = train.teacher_logp[i].astype(np.float32)
        assert (np.diff(logp, axis=1) <= 0).all()  # best first
        if train.temps[i] == 0.0:  # greedy: the written token is the law's top
            assert (train.teacher_ids[i][:, 0] == tokens[start:]).all()


def test_prompt_laws_are_the_targets_laws_over_the_prompt(target, data):
    model, _ = target
    train = data[0]
    assert train.prompt_ids is not None
    for i in (0, 3):
        start = train.starts[i]
        logits = model(mx.array(train.tokens[i][None, :start]))[0]
        best = np.array(mx.argmax(logits, axis=-1))[: start - 1]
        assert train.prompt_ids[i].shape == (start - 1, C.DEFAULT_TOP_K)
        assert (
            train.prompt_ids[i][:, 0] == best
        ).mean() > 0.99  # float near-ties aside


def test_generation_keeps_the_features_and_laws_of_a_teacher_forced_forward(
    target, data
):
    """Every position, prompt and completion: features and top-K laws equal a full forward's."""
    from mlx_spec.features import FeatureCapture

    model, _ = target
    train = data[0]
    assert train.feature_layers == (-1,)
    for i in (0, 2):  # a greedy and a sampled completion
        tokens = train.tokens[i]
        capture = FeatureCapture(model)
        with capture.capturing():
            logits = model(mx.array(tokens[None]))[0]
        feats = np.array(capture.take())
        assert train.features[i].shape == feats.shape
        assert np.allclose(train.features[i], feats, atol=2e-2)
        logp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        assert train.law_ids[i].shape == (len(tokens), C.DEFAULT_TOP_K)
        top = np.argsort(-logp, axis=-1)[:, : C.DEFAULT_TOP_K]
        assert (train.law_ids[i][:, 0] == top[:, 0]).mean() > 0.99
        kept = np.take_along_axis(logp, train.law_ids[i].astype(np.int64), axis=-1)
        assert np.allclose(train.law_logp[i].astype(np.float32), kept, atol=2e-2)


def test_greedy_batches_draw_nothing_and_are_kept_apart_from_sampled_ones(
    target, monkeypatch
):
    """A batch holds greedy or sampled rows, not both; a greedy one never draws."""
    model, tokenizer = target
    prompts = mixed_prompts(6, "heldout", seed=1, shares=CHAT_ONLY)
    temps = [0.0, 0.7, 0.0, 0.7, 0.0, 0.0]
    real_batch, real_draw = C.generate_batch, mx.random.categorical
    batches, draws = [], []

    def recording_batch(model, ids, batch_temps, **kw):
        batches.append(list(batch_temps))
        return real_batch(model, ids, batch_temps, **kw)

    def recording_draw(*args, **kw):
        draws.append(batches[-1])
        return real_draw(*args, **kw)

    monkeypatch.setattr(C, "generate_batch", recording_batch)
    monkeypatch.setattr(C.mx.random, "categorical", recording_draw)
    data = C.generate_completions(
        model, tokenizer, prompts, temps, max_tokens=6, batch_size=3
    )
    assert sorted(map(sorted, batches)) == [[0.0] * 3, [0.0, 0.7, 0.7]]
    assert draws and all(0.7 in b for b in draws)
    assert data.temps == temps  # back in the prompts' order
    for i in (0, 2):  # greedy rows write the top of their laws
        written = data.tokens[i][data.starts[i] :]
        assert (data.teacher_ids[i][:, 0] == written).all()


def test_completions_keeping_several_layers_give_each_one_alone(target, data):
    """Features kept for blocks 0 and final: each slice is that layer's own.

    The final layer's features are compared with a run that keeps it alone on
    the same batch and seed, so the sums run in the same order and float16
    matches bit for bit (``train`` was batched with other prompts and padded
    otherwise, so its features may differ in the last bit).
    """
    model, tokenizer = target
    train, _, prompts, _ = data

    def completions(layers):
        return C.generate_completions(
            model,
            tokenizer,
            prompts[:2],
            train.temps[:2],
            max_tokens=16,
            feature_layers=layers,
            seeds=[0],  # a sampled row draws alike in both runs
        )

    both, alone = completions((0, -1)), completions((-1,))
    final = both.with_features([-1])
    assert final.feature_layers == (-1,)
    for i in range(2):
        assert np.array_equal(final.tokens[i], alone.tokens[i])
        assert np.array_equal(final.features[i], alone.features[i])
    block0 = both.with_features([0])
    swapped = both.with_features([-1, 0])
    H = train.features[0].shape[1]
    assert block0.features[0].shape == (len(both.tokens[0]), H)
    assert np.array_equal(swapped.features[0][:, H:], block0.features[0])
    assert both.with_features([1]) is None and both.with_features([0, -1]) is both


@pytest.fixture
def completion_calls(monkeypatch):
    """The prompts per chunk of each ``stream_completions`` call (which still runs)."""
    calls = []
    real = C.stream_completions

    def counting(model, tokenizer, chunks, **kw):
        calls.append([len(prompts) for prompts, _ in chunks])
        return real(model, tokenizer, chunks, **kw)

    monkeypatch.setattr(C, "stream_completions", counting)
    return calls


def test_completions_resume_only_missing_shards(target, data, completion_calls):
    model, tokenizer = target
    train, _, prompts, folder = data
    (folder / "train-00001.npz").unlink()
    again = C.build_completions(
        model,
        tokenizer,
        prompts[:6],
        folder,
        "train",
        max_tokens=16,
        shard_size=4,
        progress=False,
    )
    assert completion_calls == [[2]]  # only the missing shard's prompts
    for i in range(6):
        if train.temps[i] == 0.0:
            assert again.tokens[i].tolist() == train.tokens[i].tolist()


def test_more_prompts_only_add_shards(target, data, completion_calls, tmp_path):
    import shutil

    model, tokenizer = target
    train, _, prompts, folder = data
    for path in folder.glob("train*"):
        shutil.copy(path, tmp_path / path.name)
    more = C.build_completions(
        model,
        tokenizer,
        prompts[:8],
        tmp_path,
        "train",
        max_tokens=16,
        shard_size=4,
        progress=False,
    )
    assert completion_calls == [[4]]  # shard 0 kept; shard 1 grew from 2 to 4 prompts
    assert len(more) == 8
    assert [t.tolist() for t in more.tokens[:4]] == [
        t.tolist() for t in train.tokens[:4]
    ]


def test_completions_refuse_other_settings(target, data):
    model, tokenizer = target
    _, _, prompts, folder = data
    with pytest.raises(ValueError, match="max_tokens") as e:
        C.build_completions(
            model,
            tokenizer,
            prompts[:6],
            folder,
            "train",
            max_tokens=9,
            shard_size=4,
            progress=False,
        )
    assert "\n" not in str(e.value)


def test_training_steps_reduce_the_loss(target, data):
    model, tokenizer = target
    train, _, _, _ = data
    trainer = D.DraftTrainer(model, tokenizer, train, train, _config())
    before = trainer.evaluate()["heldout_loss"]
    for _ in range(12):
        trainer.train_step()
    after = trainer.evaluate()
    assert after["heldout_loss"] < 0.7 * before, (before, after["heldout_loss"])
    assert after["alpha"] > trainer.evals[0]["alpha"]


def _without_laws(data: C.Completions) -> C.Completions:
    """The same sequences as ``--labels written`` reads them: zero-width laws."""
    return replace(
        data,
        law_ids=[ids[:, :0] for ids in data.law_ids],
        law_logp=[lp[:, :0] for lp in data.law_logp],
        features=None,
        feature_layers=(),
    )


def test_the_written_label_loss_is_the_hard_term_of_the_laws_loss(target, data):
    """Both paths share one rule: without laws only the written token's term is
    left, the loss of the laws path at soft weight 0, and at any soft weight
    the laws loss is the mix of its soft term and the written-label loss."""
    model, tokenizer = target
    train = data[0]
    trainer = D.DraftTrainer(model, tokenizer, train, train, _config())
    index = list(range(len(train)))

    def loss(data, soft_weight):
        batch = make_batch(data, index, trainer.to_draft, 768, prompt_weight=0.3)
        value, _ = D.draft_loss(trainer.draft, *batch.arrays(), soft_weight=soft_weight)
        return float(value.item())

    written = loss(_without_laws(train), 0.0)
    assert loss(_without_laws(train), 0.5) == written  # no laws: no soft term
    assert loss(train, 0.0) == written
    soft = loss(train, 1.0)
    assert abs(soft - written) > 1e-3  # the soft term is a different loss
    assert loss(train, 0.25) == pytest.approx(0.25 * soft + 0.75 * written, rel=1e-5)


def test_feature_regression_pulls_the_drafts_hidden_state_to_the_targets(target, data):
    model, tokenizer = target
    train = data[0]

    def distance(trainer):
        batch = make_batch(
            train, list(range(len(train))), trainer.to_draft, 768, features=True
        )
        h = D.supervised_hidden(
            trainer.draft, mx.array(batch.tokens), mx.array(batch.rows)
        )
        real = int(batch.completion.sum())
        return float(mx.abs(h[:real] - mx.array(batch.features[:real])).mean())

    runs = {}
    for weight in (0.0, 10.0):
        trainer = D.DraftTrainer(
            model, tokenizer, train, train, _config(feature_weight=weight)
        )
        before = distance(trainer)
        for _ in range(12):
            trainer.train_step()
        runs[weight] = distance(trainer)
    assert runs[10.0] < 0.8 * runs[0.0], (before, runs)


def test_resume_continues_from_the_checkpoint_step(target, data, tmp_path):
    model, tokenizer = target
    train, heldout, _, _ = data
    straight = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    for _ in range(12):
        straight.train_step()
    first = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    for _ in range(6):
        first.train_step()
    first.save_checkpoint(tmp_path)  # the run is killed here
    resumed = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    assert resumed.load_checkpoint(tmp_path) and resumed.step == 6
    while resumed.step < 12:
        resumed.train_step()
    for name, value in straight.draft.trainable_state().items():
        other = resumed.draft.trainable_state()[name]
        assert mx.allclose(value, other, atol=1e-5).item(), name
    with pytest.raises(ValueError, match="draft_vocab") as e:
        D.DraftTrainer(
            model, tokenizer, train, heldout, _config(draft_vocab=100)
        ).load_checkpoint(tmp_path)
    assert "\n" not in str(e.value)


def test_warm_start_copies_a_trained_drafts_layers_and_shared_rows(
    target, data, trained
):
    model, tokenizer = target
    train, heldout, _, _ = data
    old = distilled.load_draft(str(trained), model)
    # Another vocabulary size: some rows are shared, some are new.
    config = _config(draft_vocab=260, init_from=str(trained))
    warm = D.DraftTrainer(model, tokenizer, train, heldout, config).draft
    cold = D.DraftTrainer(model, tokenizer, train, heldout, _config(draft_vocab=260))
    for name, value in old.trainable_state().items():
        if not name.startswith("lm_head."):
            assert mx.array_equal(warm.trainable_state()[name], value).item(), name
    old_row = {t: i for i, t in enumerate(np.array(old.lm_head.token_ids).tolist())}
    new_ids = np.array(warm.lm_head.token_ids).tolist()
    shared = [i for i, t in enumerate(new_ids) if t in old_row]
    fresh = [i for i, t in enumerate(new_ids) if t not in old_row]
    assert shared and fresh
    rows = np.array(warm.lm_head.weight)
    expected = np.array(old.lm_head.weight)[[old_row[new_ids[i]] for i in shared]]
    assert np.array_equal(rows[shared], expected)
    # New rows start as the target's output rows, as a cold start's do.
    start = distilled.build_draft(model, new_ids, cold.layers)
    assert np.array_equal(rows[fresh], np.array(start.lm_head.weight)[fresh])
    # The same size keeps the trained vocabulary, whatever the new data's counts.
    size = len(old_row)
    same = D.DraftTrainer(
        model,
        tokenizer,
        heldout,
        heldout,
        _config(draft_vocab=size, init_from=str(trained)),
    ).draft
    assert np.array(same.lm_head.token_ids).tolist() == sorted(old_row)
    assert np.array_equal(np.array(same.lm_head.weight), np.array(old.lm_head.weight))


def test_a_draft_grown_by_layers_starts_as_the_trained_one_and_trains_them(
    target, data, trained
):
    """``--layers 0,1`` from a draft of layer 1: the trained layer keeps its
    place and the new one starts as an identity, so the outputs are unchanged."""
    model, tokenizer = target
    train, heldout, _, _ = data
    old = distilled.load_draft(str(trained), model, like_target=False)
    trainer = D.DraftTrainer(
        model,
        tokenizer,
        train,
        heldout,
        _config(layers=[0, 1], init_from=str(trained)),
    )
    grown = trainer.draft
    tokens = mx.array(train.tokens[0][None])
    assert mx.allclose(grown(tokens), old(tokens), atol=1e-5).item()
    state, before = grown.trainable_state(), old.trainable_state()
    for name, value in before.items():
        if name.startswith("model.layers.0."):
            moved = name.replace("model.layers.0.", "model.layers.1.")
            assert mx.array_equal(state[moved], value).item(), name
    silent = [k for k in state if k.endswith(("o_proj.weight", "down_proj.weight"))]
    assert {k.split(".")[2] for k in silent} == {"0", "1"}
    for name in silent:
        assert (mx.abs(state[name]).max().item() == 0) == (".1." not in name), name
    for _ in range(3):
        trainer.train_step()
    learned = grown.trainable_state()["model.layers.0.mlp.down_proj.weight"]
    assert mx.abs(learned).max().item() > 0
    assert trainer.record()["grown_from_layers"] == [1]
    with pytest.raises(
        ValueError, match=r"target layers \[1\]; --layers \[0, 0\]"
    ) as e:
        D.DraftTrainer(
            model,
            tokenizer,
            train,
            heldout,
            _config(layers=[0, 0], init_from=str(trained)),
        )
    assert "\n" not in str(e.value)


def test_grown_layers_train_at_their_own_rate_and_resume(
    target, data, trained, tmp_path
):
    """The added layer trains at ``grown_lr``, the kept one at ``lr``; a
    checkpoint holds both optimizers' states, and a resumed run goes on alike."""
    model, tokenizer = target
    train, heldout, _, _ = data
    config = _config(layers=[0, 1], init_from=str(trained), lr=1e-7, grown_lr=1e-2)

    def trainer():
        return D.DraftTrainer(model, tokenizer, train, heldout, config)

    grower = trainer()
    assert grower.new_layers == [0]
    before = dict(grower.draft.trainable_state())
    for _ in range(3):
        grower.train_step()
    after = grower.draft.trainable_state()

    def moved(prefix):
        return max(
            mx.abs(after[k] - before[k]).max().item()
            for k in after
            if k.startswith(prefix)
        )

    assert moved("model.layers.1.") < 1e-5  # the trained layer: lr 1e-7
    assert moved("model.layers.0.") > 1e-3  # the new layer: grown_lr 1e-2
    grower.save_checkpoint(tmp_path)
    # Resumed as it was started, and with its --init-from gone since.
    gone = replace(config, init_from="")
    for resumed in (trainer(), D.DraftTrainer(model, tokenizer, train, heldout, gone)):
        assert resumed.load_checkpoint(tmp_path) and resumed.step == grower.step
        assert resumed.new_layers == [0]
        mine = dict(tree_flatten(resumed.optimizer.state))
        theirs = dict(tree_flatten(grower.optimizer.state))
        assert mine.keys() == theirs.keys()
        for name, value in theirs.items():
            assert mx.array_equal(mine[name], value).item(), name
        resumed.train_step()  # the restored state fits its optimizers


def test_a_warm_start_may_move_its_layers_without_growing(target, data, trained):
    """The same layer count at other target layers: copied by position, none new."""
    model, tokenizer = target
    train, heldout, _, _ = data
    config = _config(layers=[0], init_from=str(trained))
    moved = D.DraftTrainer(model, tokenizer, train, heldout, config)
    assert moved.new_layers == [] and moved.grown_from is None
    old = distilled.load_draft(str(trained), model, like_target=False)
    mine, theirs = moved.draft.trainable_state(), old.trainable_state()
    name = "model.layers.0.mlp.down_proj.weight"
    assert mx.array_equal(mine[name], theirs[name]).item()


def test_train_draft_resumes_after_an_interruption(target, data, tmp_path, monkeypatch):
    model, tokenizer = target
    train, heldout, _, _ = data
    real = D.DraftTrainer.train_step

    def dying(self):
        if self.step == 7:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(D.DraftTrainer, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        D.train_draft(
            model, tokenizer, train, heldout, _config(), tmp_path, progress=False
        )
    monkeypatch.setattr(D.DraftTrainer, "train_step", real)
    lines = []
    trainer = D.train_draft(
        model,
        tokenizer,
        train,
        heldout,
        _config(),
        tmp_path,
        progress=False,
        log=lines.append,
    )
    assert lines[0] == "resumed from step 6" and trainer.step == 12
    assert [e["step"] for e in trainer.evals] == [0, 6, 12]


def test_ctrl_c_pauses_after_the_step_and_the_run_goes_on_unchanged(
    target, data, tmp_path, monkeypatch
):
    """The first Ctrl-C lets the step finish and writes a checkpoint; the same
    call again ends with the weights of a run never paused."""
    model, tokenizer = target
    train, heldout, _, _ = data
    straight = D.train_draft(
        model, tokenizer, train, heldout, _config(), tmp_path / "a", progress=False
    )
    real = D.DraftTrainer.train_step

    def pressed_during_step_8(self):
        if self.step == 7:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            signal.raise_signal(signal.SIGINT)
        return real(self)

    monkeypatch.setattr(D.DraftTrainer, "train_step", pressed_during_step_8)
    with pytest.raises(TrainingPaused) as paused:
        D.train_draft(
            model, tokenizer, train, heldout, _config(), tmp_path / "b", progress=False
        )
    assert paused.value.step == 8
    assert read_state(tmp_path / "b")["step"] == 8
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.setattr(D.DraftTrainer, "train_step", real)
    lines = []
    resumed = D.train_draft(
        model,
        tokenizer,
        train,
        heldout,
        _config(),
        tmp_path / "b",
        progress=False,
        log=lines.append,
    )
    assert lines[0] == "resumed from step 8" and resumed.step == 12
    assert [e["step"] for e in resumed.evals] == [0, 6, 12]
    for name, value in straight.draft.trainable_state().items():
        other = resumed.draft.trainable_state()[name]
        assert mx.allclose(value, other, atol=1e-5).item(), name


def test_a_checkpoint_killed_while_written_keeps_the_previous_one(
    target, data, tmp_path, monkeypatch
):
    """Killed after the new weights are written but before the state is: the
    previous checkpoint loads whole (its step with its weights)."""
    model, tokenizer = target
    train, heldout, _, _ = data
    trainer = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    trainer.train_step()
    trainer.save_checkpoint(tmp_path)
    at_step_1 = dict(trainer.draft.trainable_state())
    trainer.train_step()
    real = Path.write_text

    def dies_writing_the_state(self, *args, **kwargs):
        if self.name.startswith("state.json"):
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", dies_writing_the_state)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(tmp_path)
    monkeypatch.setattr(Path, "write_text", real)
    resumed = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    assert resumed.load_checkpoint(tmp_path) and resumed.step == 1
    for name, value in at_step_1.items():
        assert mx.array_equal(value, resumed.draft.trainable_state()[name]), name
    # Killed between the two renames: the previous checkpoint, kept aside, loads.
    trainer.save_checkpoint(tmp_path)
    (tmp_path / "checkpoints").rename(tmp_path / "checkpoints.old")
    again = D.DraftTrainer(model, tokenizer, train, heldout, _config())
    assert again.load_checkpoint(tmp_path) and again.step == 2


def test_written_draft_loads_via_draft_model_and_decodes_greedy_identically(
    target, trained, data
):
    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    assert isinstance(draft, distilled.DistilledDraft)
    config = json.loads((trained / "config.json").read_text())
    assert config["mlx_spec_head"]["kind"] == "draft"
    assert config["draft"]["draft_vocab_size"] == 200
    # A greedy training prompt: the draft has fit its answer, so drafts get accepted.
    prompt = C.encode_prompt(tokenizer, data[2][0])
    plain = [
        r.token
        for r in stream_generate(
            model, tokenizer, prompt, speculative="none", max_tokens=40
        )
    ]
    for method in ("draft", "tree"):
        # Fixed sizes: an adaptive chain may keep to plain rounds on this CPU.
        stream = stream_generate(
            model,
            tokenizer,
            prompt,
            draft_model=draft,
            speculative=method,
            max_tokens=40,
            adaptive=False,
        )
        assert [r.token for r in stream] == plain, method
        assert stream.stats.accepted_tokens > 0


@pytest.mark.parametrize("method", ["draft", "tree"])
def test_greedy_drafts_of_a_distilled_draft_are_chosen_over_its_vocabulary_subset(
    target, trained, data, monkeypatch, method
):
    """Greedy chain drafts and tree children are the draft's best tokens among
    its subset, as target ids (ranked over the subset's columns, then mapped
    back), best first."""
    from mlx_spec.drafters.model import ModelDrafter
    from mlx_spec.drafters.tree import TreeDrafter

    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    subset = set(draft.lm_head.token_ids.tolist())
    proposals = []
    cls = TreeDrafter if method == "tree" else ModelDrafter
    original = cls.propose

    def recording(self, state, budget):
        before = self.draft.offset
        full = self.draft(mx.array(self.pending(state), mx.uint32))[-1]
        self.draft.trim_to(before)
        proposal = original(self, state, budget)
        proposals.append((proposal.tokens.tolist(), mx.argmax(full).item()))
        return proposal

    monkeypatch.setattr(cls, "propose", recording)
    prompt = C.encode_prompt(tokenizer, data[2][0])
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        draft_model=draft,
        speculative=method,
        max_tokens=24,
        adaptive=False,
    )
    list(stream)
    assert stream.stats.accepted_tokens > 0
    assert len(proposals) > 3
    for tokens, best in proposals:
        assert set(tokens) <= subset
        assert tokens[0] == best


def test_the_batch_server_drafts_over_the_vocabulary_subset(
    target, trained, data, monkeypatch
):
    """Batches draft over the draft's subset (no scatter to the full vocabulary
    per draft step; a sampled row's law is widened once per round) and greedy
    rows stay identical to plain decoding."""
    import mlx_lm

    from mlx_spec.sampling import SamplingParams
    from mlx_spec.serve.batch import SeqSpec, SpecBatchGenerator

    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    # Full-width logits built while drafting (a prefill's are never evaluated).
    full_width, drafting = [], []
    scatter = distilled.VocabHead.__call__
    draft_step = SpecBatchGenerator._draft

    def recording_scatter(self, h):
        if drafting:
            full_width.append(h.shape)
        return scatter(self, h)

    def recording_draft(self, seqs, steps):
        drafting.append(True)
        try:
            return draft_step(self, seqs, steps)
        finally:
            drafting.clear()

    monkeypatch.setattr(distilled.VocabHead, "__call__", recording_scatter)
    monkeypatch.setattr(SpecBatchGenerator, "_draft", recording_draft)
    prompts = [C.encode_prompt(tokenizer, data[2][i]) for i in (2, 3)]
    config = SpecConfig(method="draft", max_tokens=24, adaptive=False)

    def serve(params=None):
        gen = SpecBatchGenerator(model, draft)
        uids = [gen.insert(SeqSpec(list(p), config, params)) for p in prompts]
        tokens = {uid: [] for uid in uids}
        kinds = []
        while gen.has_work:
            for out in gen.next():
                tokens[out.uid] += out.tokens
                kinds += out.kinds
        return [tokens[uid] for uid in uids], kinds, gen

    outputs, kinds, gen = serve()
    for prompt, tokens in zip(prompts, outputs):
        ref = mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=24)
        assert tokens == [r.token for r in ref]
    assert gen.draft_subset is draft.lm_head
    assert "accepted" in kinds
    assert full_width == []
    serve(SamplingParams(temp=0.7))  # a sampled batch draws over the subset too
    assert full_width == []


def test_mlx_lm_speculative_decoding_runs_the_draft_unchanged(target, trained, data):
    import mlx_lm

    from mlx_spec.costs import weight_bytes

    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    prompt = C.encode_prompt(tokenizer, data[2][6])
    plain = [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=30)
    ]
    spec = list(
        mlx_lm.stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=30,
            draft_model=draft,
            num_draft_tokens=3,
        )
    )
    assert [r.token for r in spec] == plain
    assert any(r.from_draft for r in spec)
    # Its step cost counts its own weights, not the shared embedding table.
    own = sum(v.nbytes for v in draft.trainable_state().values())
    assert weight_bytes(draft) == own < weight_bytes(model)


def test_draft_proposes_only_its_vocabulary(target, trained):
    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    logits = draft(mx.array([[1, 2, 3]]))
    allowed = np.zeros(logits.shape[-1], bool)
    allowed[np.array(draft.lm_head.token_ids)] = True
    finite = np.isfinite(np.array(logits[0]))
    assert (finite == allowed[None]).all()


def test_draft_written_as_mlx_lm_checkpoint_gives_the_same_subset_logits(
    target, trained, checkpoints, tmp_path
):
    """For mlx_lm.server --draft-model, which loads only mlx-lm checkpoints."""
    import mlx_lm

    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    out = distilled.save_as_mlx_lm(draft, checkpoints["llama"], tmp_path / "plain")
    plain, plain_tokenizer = mlx_lm.load(str(out))
    assert plain_tokenizer.vocab_size == tokenizer.vocab_size
    inputs = mx.array([[1, 2, 3, 4]])
    ids = draft.lm_head.token_ids
    ours, theirs = draft(inputs), plain(inputs)
    assert mx.allclose(ours[..., ids], theirs[..., ids], atol=1e-5).item()
    outside = np.ones(theirs.shape[-1], bool)
    outside[np.array(ids)] = False
    assert (np.array(theirs[0])[:, outside] == 0).all()


@pytest.fixture(scope="module")
def quantized(checkpoints, trained, tmp_path_factory):
    """The tiny target as mlx-lm quantizes it (4-bit blocks, 8-bit vocabulary
    layers), and the trained draft's directory re-pointed at that target."""
    import mlx_lm

    from mlx_spec.fingerprint import model_fingerprint
    from mlx_spec.testing import quantized_checkpoint

    root = tmp_path_factory.mktemp("quantized")
    target_dir = quantized_checkpoint(checkpoints["llama"], root / "target")
    model, tokenizer = mlx_lm.load(str(target_dir))
    draft_dir = root / "draft"
    shutil.copytree(trained, draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    config["target"] = model_fingerprint(model)
    (draft_dir / "config.json").write_text(json.dumps(config))
    return model, tokenizer, target_dir, draft_dir


def test_a_draft_next_to_a_quantized_target_takes_its_quantization(
    target, trained, quantized
):
    """Its blocks as the target's blocks, its head as the target's output layer;
    fewer bytes a step than in float, and decoding stays exact."""
    from mlx_lm.generate import stream_generate as plain

    from mlx_spec.costs import weight_bytes

    model, tokenizer, _, draft_dir = quantized
    draft = load_draft(str(draft_dir), model, tokenizer)
    assert linear_quantizations(draft.model) == {(4, 32)}
    assert draft.lm_head.quantization == (32, 8, "affine")
    float_draft = distilled.load_draft(draft_dir, model, like_target=False)
    assert float_draft.lm_head.quantization is None
    assert weight_bytes(draft) < 0.5 * weight_bytes(float_draft)
    prompt = tokenizer.encode("def fibonacci(n):")
    expected = [r.token for r in plain(model, tokenizer, prompt, max_tokens=24)]
    for method in ("draft", "tree"):
        stream = stream_generate(
            model,
            tokenizer,
            prompt,
            draft_model=draft,
            speculative=method,
            max_tokens=24,
        )
        assert [r.token for r in stream] == expected, method
    # A float draft keeps float layers next to a float target.
    float_target, _ = target
    assert (
        load_draft(str(trained), float_target, tokenizer).lm_head.quantization is None
    )


def test_a_quantized_draft_written_as_mlx_lm_checkpoint_gives_the_same_subset_logits(
    quantized, tmp_path
):
    import mlx_lm

    model, tokenizer, target_dir, draft_dir = quantized
    draft = load_draft(str(draft_dir), model, tokenizer)
    out = distilled.save_as_mlx_lm(draft, target_dir, tmp_path / "plain")
    plain, _ = mlx_lm.load(str(out))
    inputs = mx.array([[1, 2, 3, 4]])
    ids = draft.lm_head.token_ids
    assert mx.allclose(
        draft(inputs)[..., ids], plain(inputs)[..., ids], atol=1e-4
    ).item()


def test_warm_start_next_to_a_quantized_target_copies_the_float_layers(quantized, data):
    """Training (here --init-from) reads the draft's float weights, not the
    quantized copy that decoding next to such a target uses."""
    model, tokenizer, _, draft_dir = quantized
    train, heldout, _, _ = data
    old = distilled.load_draft(draft_dir, model, like_target=False)
    config = _config(init_from=str(draft_dir))
    warm = D.DraftTrainer(
        model, tokenizer, train, heldout, config
    ).draft.trainable_state()
    body = [k for k in old.trainable_state() if not k.startswith("lm_head.")]
    assert any(".mlp." in k for k in body)
    for name in body:
        value = old.trainable_state()[name].astype(mx.float32)
        assert mx.array_equal(warm[name], value).item(), name


def _sampled_stream_follows_law(model, tokenizer, draft, seed: int) -> List[int]:
    """240 tokens drafted and sampled at temp 1: checks they follow ``model``'s
    law (randomized PIT chi-square, standardised log-likelihood) and returns them."""
    ids = tokenizer.encode("def fibonacci(n):")
    temp, n = 1.0, 240
    mx.random.seed(seed)
    stats = SpecStats()
    config = SpecConfig(method="draft", max_tokens=n, temp=temp, adaptive=False)
    events = speculative_events(mx.array(ids), model, draft, config=config, stats=stats)
    out = [e.token for e in events]
    assert len(out) == n and stats.accepted_tokens > 10
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits.astype(mx.float32), axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)
    return out


def test_sampled_stream_with_a_quantized_draft_follows_the_quantized_target_law(
    quantized,
):
    """Rejection sampling on the law of a draft quantized like its target."""
    model, tokenizer, _, draft_dir = quantized
    draft = load_draft(str(draft_dir), model, tokenizer)
    assert draft.lm_head.quantization is not None
    _sampled_stream_follows_law(model, tokenizer, draft, seed=6)


def test_sampled_stream_with_the_draft_follows_target_law(target, trained):
    model, tokenizer = target
    draft = load_draft(str(trained), model, tokenizer)
    out = _sampled_stream_follows_law(model, tokenizer, draft, seed=5)
    outside = set(out) - set(draft.lm_head.token_ids.tolist())
    assert outside  # tokens the draft can never propose were emitted too


VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]


@pytest.mark.parametrize(
    "params",
    [
        dict(temp=0.7),
        dict(temp=1.0, top_k=2),
        dict(temp=0.8, top_k=6),  # more than the subset holds
        dict(temp=1.0, top_p=0.6),
        dict(temp=0.9, min_p=0.3, min_tokens_to_keep=5),
    ],
)
def test_a_law_drawn_over_the_subset_widens_to_the_full_width_law(params):
    """Drafting over a subset's columns (``subset_choice``) and widening the law
    gives exactly the law ``choose`` would draw from at the target's width,
    where the other columns are ``-inf``: the filters only see mass."""
    from mlx_spec.drafters.base import RoundState, subset_choice
    from mlx_spec.sampling import SamplingParams, normalize, processed_logprobs

    head = distilled.VocabHead(4, [0, 2, 5, 7], 8)
    mx.random.seed(1)
    head.weight = mx.random.normal((4, 4))
    h = mx.random.normal((1, 4))
    law_params = SamplingParams(**params)
    state = RoundState([0], 0, None, params=law_params)
    _, small_law = subset_choice(state, head.subset_logits(h))
    widened = np.array(head.widen(small_law))
    full = np.array(processed_logprobs(normalize(head(h)), law_params))
    assert np.array_equal(np.isinf(widened), np.isinf(full))
    finite = ~np.isinf(full)
    assert np.allclose(widened[finite], full[finite], atol=1e-6)


def _subset_pair_and_law():
    """A tiny target, a draft whose vocabulary is {0, 2, 5, 7} of its 8 tokens,
    and the target's exact joint law of the first three tokens (temp 1)."""
    model = tiny_llama(VOCAB, num_layers=2)
    draft = distilled.build_draft(model, [0, 2, 5, 7], [0])
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    probs = np.array(
        mx.softmax(model(mx.array([PROMPT + list(p) for p in pairs]))[:, -3:], -1)
    )
    law = np.empty((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        law[a, b, :] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return model, draft, law.reshape(-1)


def test_subset_draft_first_three_tokens_follow_exact_law():
    """Rejection sampling with a draft whose law is zero on half the vocabulary.

    The draft proposes only tokens {0, 2, 5, 7}; the other four must still
    appear as often as the target's law says (chi-square over all 512
    three-token openings).
    """
    model, draft, law = _subset_pair_and_law()
    mx.random.seed(11)
    runs, counts, accepted = 300, np.zeros(VOCAB**3), 0
    config = SpecConfig(
        method="draft", max_tokens=3, temp=1.0, adaptive=False, num_draft_tokens=3
    )
    for _ in range(runs):
        stats = SpecStats()
        a, b, c = (
            e.token
            for e in speculative_events(
                mx.array(PROMPT), model, draft, config=config, stats=stats
            )
        )
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        accepted += stats.accepted_tokens
    assert accepted > runs // 3
    assert_counts_follow_law(counts, law)
    pairs = counts.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1)  # the first two tokens
    assert_counts_follow_law(pairs, law.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1))


def test_the_batch_server_with_a_subset_draft_samples_the_exact_law():
    """Batched sampled rows draft over the subset's columns and widen the law
    for rejection sampling: the first three tokens of each row still follow
    the target's joint law."""
    from mlx_spec.sampling import SamplingParams
    from mlx_spec.serve.batch import SeqSpec, SpecBatchGenerator

    model, draft, law = _subset_pair_and_law()
    mx.random.seed(12)
    config = SpecConfig(
        method="draft", max_tokens=3, adaptive=False, num_draft_tokens=3
    )
    params = SamplingParams(temp=1.0)
    counts, accepted = np.zeros(VOCAB**3), 0
    for _ in range(200):
        gen = SpecBatchGenerator(model, draft)
        uids = [gen.insert(SeqSpec(list(PROMPT), config, params)) for _ in range(4)]
        tokens = {uid: [] for uid in uids}
        while gen.has_work:
            for out in gen.next():
                tokens[out.uid] += out.tokens
                accepted += out.kinds.count("accepted")
        for a, b, c in tokens.values():
            counts[(a * VOCAB + b) * VOCAB + c] += 1
    assert gen.draft_subset is draft.lm_head
    assert accepted > 200
    assert_counts_follow_law(counts, law)
    # The first two tokens (64 openings) with 800 samples: a sharper check.
    pairs = counts.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1)
    assert_counts_follow_law(pairs, law.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1))


def test_another_target_is_refused_in_one_line(trained, load_model):
    other, other_tokenizer = load_model("llama-near")
    with pytest.raises(ValueError, match="another target") as e:
        load_draft(str(trained), other, other_tokenizer)
    assert "\n" not in str(e.value)


def test_replay_chains_counts_rounds_positions_and_tokens():
    # γ=2: two rounds accept both drafts and add the target's token (3 tokens
    # each), the last round has one token left: 7 tokens in 3 target forwards.
    m = [np.array([True, True, False, True, True, True, True])]
    r = D.replay_chains(m, 2)
    assert r["tokens_per_forward"] == round(7 / 3, 4)
    assert r["by_position"] == [1.0, 1.0]
    r1 = D.replay_chains([np.array([False, True, False])], 1)
    # γ=1: a rejected round (1 token), then an accepted one (2 tokens).
    assert r1["by_position"] == [0.5] and r1["tokens_per_forward"] == 1.5


def test_default_layers_are_the_targets_first_and_last_blocks():
    """The default --layers (0 and -1) fits a target of any depth (it named block 29)."""
    model, *_ = _subset_pair_and_law()
    assert list(D.DEFAULT_LAYERS) == [0, -1]
    assert distilled.target_layer_indices(model, D.DEFAULT_LAYERS) == [0, 1]
    draft = distilled.build_draft(model, [0, 2, 5, 7], D.DEFAULT_LAYERS)
    last = dict(tree_flatten(model.layers[1].parameters()))
    copied = dict(tree_flatten(draft.layers[1].parameters()))
    assert all(mx.array_equal(copied[k], last[k]) for k in last)
    with pytest.raises(ValueError, match=r"draft layers \[0, 2\] must be indices"):
        distilled.build_draft(model, [0, 2, 5, 7], [0, 2])
