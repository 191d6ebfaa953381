"""Rollouts in draft distillation (``train-draft --kind draft --rollout-steps K``):
the draft's own tokens in its context, scored by the target, on a tiny random target."""

import json

import mlx.core as mx
import numpy as np
import pytest
from test_train_draft import _config as draft_config
from test_train_draft import data, target  # noqa: F401 (the draft tests' fixtures)

from mlx_spec.train import completions as C
from mlx_spec.train import draft as D
from mlx_spec.train.card import model_card
from mlx_spec.train.draft_batches import make_batch
from mlx_spec.train.rollout import ROLLOUT_EVERY, is_rollout_step, pack, rollout_cuts


def _config(**kw):
    """The draft tests' recipe with rollouts of 3 tokens on half the steps."""
    return draft_config(**{"rollout_steps": 3, "rollout_share": 0.5, **kw})


def _rollout_rows(batch):
    """Flat positions of the rollout rows (prompt_weight 0: the only non-completion rows)."""
    mask = (batch.weight > 0) & (batch.completion == 0)
    return batch.rows[mask], np.nonzero(mask)[0]


@pytest.mark.parametrize("feature_weight", [0.0, 1.0])
def test_rollout_rows_hold_the_targets_law_on_the_drafts_own_tokens(
    target, data, feature_weight
):
    model, tokenizer = target
    train, heldout, _, _ = data
    if feature_weight:
        train = train.with_features([-1])
    config = _config(prompt_weight=0.0, feature_weight=feature_weight)
    trainer = D.DraftTrainer(model, tokenizer, train, heldout, config)
    for _ in range(2):  # a draft a little away from its initialisation
        trainer.train_step()
    index = trainer.batch_of_step(5)
    batch = trainer.rollout_batch(index, 5)
    flat, at = _rollout_rows(batch)
    width = batch.tokens.shape[1]
    trunk = make_batch(train, index, trainer.to_draft, 768).tokens.shape[1]
    completion = sum(len(train.tokens[i]) - train.starts[i] for i in index)
    assert len(flat) >= 3 * completion / ROLLOUT_EVERY
    ids = np.array(trainer.draft.lm_head.token_ids)
    K = train.law_ids[0].shape[1]
    for r, i in zip(flat, at):
        b, slot = divmod(int(r), width)
        seen = np.nonzero(batch.mask[b, slot])[0]  # the slots this one reads
        drafted = int((seen >= trunk).sum())
        assert 1 <= drafted <= 3 and np.array_equal(
            seen[:-drafted], np.arange(len(seen) - drafted)
        )
        assert np.array_equal(batch.positions[b, seen], np.arange(len(seen)))
        row = mx.array(batch.tokens[b, seen])[None]  # the sequence, unpacked
        # Its last token is the draft's greedy choice after the rest.
        previous = trainer.draft.lm_head.subset_logits(
            trainer.draft.hidden(row[:, :-1])[0, -1]
        )
        assert batch.tokens[b, slot] == ids[int(mx.argmax(previous).item())]
        # Its label is the target's law computed alone on the same sequence.
        top, logp = C.top_laws(model(row)[0, -1], K)
        want = np.array(top)
        assert np.array_equal(batch.soft_ids[i], trainer.to_draft[want])
        np.testing.assert_allclose(
            batch.soft_p[i], np.exp(np.array(logp).astype(np.float32)), atol=2e-3
        )
        assert batch.hard[i] == trainer.to_draft[want[0]]
        assert batch.target[i] == want[0]
        if feature_weight:
            h = model.model(row)[0, -1]
            np.testing.assert_allclose(batch.features[i], np.array(h), atol=1e-4)
    # The trunk's rows read the packed batch as the plain one: same hidden states.
    plain = make_batch(
        train, index, trainer.to_draft, 768, features=bool(feature_weight)
    )
    real = int((plain.weight > 0).sum())
    packed_h = D.supervised_hidden(
        trainer.draft,
        mx.array(batch.tokens),
        mx.array(batch.rows[:real]),
        layout=batch.layout(),
    )
    plain_h = D.supervised_hidden(
        trainer.draft, mx.array(plain.tokens), mx.array(plain.rows[:real])
    )
    assert mx.allclose(packed_h, plain_h, atol=1e-4).item()
    assert np.array_equal(batch.soft_ids[:real], plain.soft_ids[:real])


def test_a_branch_sees_the_trunk_before_its_cut_and_itself():
    trunks = np.array([[11, 12, 13, 14]], np.int32)
    packed = pack(trunks, [np.array([2])], 2)
    assert packed.tokens.shape == (1, 6)
    assert packed.positions.tolist() == [[0, 1, 2, 3, 2, 3]]
    assert np.nonzero(packed.mask[0, 4])[0].tolist() == [0, 1, 4]
    assert np.nonzero(packed.mask[0, 5])[0].tolist() == [0, 1, 4, 5]
    assert np.nonzero(packed.mask[0, 3])[0].tolist() == [0, 1, 2, 3]
    assert packed.slots.tolist() == [[[4, 5]]] and packed.source.tolist() == [[[1, 4]]]
    # A row with fewer cuts gets empty branches that see only themselves.
    packed = pack(np.zeros((2, 4), np.int32), [np.array([2, 3]), np.array([1])], 2)
    assert packed.real.tolist() == [[True, True], [True, False]]
    assert np.nonzero(packed.mask[1, 6])[0].tolist() == [6]


def test_rollout_cuts_are_distinct_completion_positions():
    rng = np.random.default_rng(0)
    for _ in range(50):
        cuts = rollout_cuts(5, 22, 8, rng)
        assert len(cuts) == 3 and len(set(cuts)) == 3
        assert list(cuts) == sorted(cuts) and 5 <= cuts[0] and cuts[-1] <= 21
    assert rollout_cuts(0, 3, 8, rng).tolist() in ([1], [2])
    assert len(rollout_cuts(6, 6, 8, rng)) == 0


def test_rollout_steps_are_an_even_share():
    assert [is_rollout_step(s, 0.25) for s in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    assert all(is_rollout_step(s, 1.0) for s in range(10))
    assert sum(is_rollout_step(s, 0.3) for s in range(100)) == 30


def test_training_with_sampled_rollouts_resumes_to_the_same_weights(
    target, data, tmp_path
):
    model, tokenizer = target
    train, heldout, _, _ = data
    config = _config(rollout_temp=0.8)
    straight = D.DraftTrainer(model, tokenizer, train, heldout, config)
    for _ in range(12):
        straight.train_step()
    assert [r.get("rollout", False) for r in straight.history[:4]] == [
        False,
        True,
        False,
        True,
    ]
    first = D.DraftTrainer(model, tokenizer, train, heldout, config)
    for _ in range(7):
        first.train_step()
    first.save_checkpoint(tmp_path)  # at step 7, before a rollout step
    resumed = D.DraftTrainer(model, tokenizer, train, heldout, config)
    assert resumed.load_checkpoint(tmp_path) and resumed.step == 7
    while resumed.step < 12:
        resumed.train_step()
    for name, value in straight.draft.trainable_state().items():
        other = resumed.draft.trainable_state()[name]
        assert mx.allclose(value, other, atol=1e-5).item(), name
    # Rollouts change training: the weights differ from teacher forcing alone.
    plain = D.DraftTrainer(model, tokenizer, train, heldout, _config(rollout_steps=0))
    for _ in range(12):
        plain.train_step()
    name = "model.layers.0.mlp.down_proj.weight"
    assert not mx.allclose(
        plain.draft.trainable_state()[name], straight.draft.trainable_state()[name]
    ).item()


def test_train_draft_with_rollouts_writes_a_draft_recording_them(
    target, data, tmp_path
):
    model, tokenizer = target
    train, heldout, _, _ = data
    config = _config(steps=4, eval_every=2, checkpoint_every=2)
    trainer = D.train_draft(
        model, tokenizer, train, heldout, config, tmp_path, progress=False
    )
    assert trainer.step == 4 and [e["step"] for e in trainer.evals] == [0, 2, 4]
    written = json.loads((tmp_path / "config.json").read_text())
    recorded = written["training"]["config"]
    assert (recorded["rollout_steps"], recorded["rollout_share"]) == (3, 0.5)
    text = model_card(written, "mlx_spec train-draft ...", None)
    assert (
        "rollouts on 0.50 of the steps: the draft wrote 3 tokens (greedy) after" in text
    )
