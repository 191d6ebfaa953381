"""Held-out acceptance from rank matrices, and the unrolled EAGLE loss it trains.

The figures of :func:`rounds.summarize` are checked on small rank matrices
against counts written out in the test; the loss of :func:`eagle.eagle_loss`
against each unrolled step's loss recomputed in numpy.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlx_spec.testing import greedy_continuation, tiny_llama
from mlx_spec.train import eagle as eagle_train
from mlx_spec.train import medusa as medusa_train
from mlx_spec.train import rounds
from mlx_spec.train.head_data import teacher_data
from mlx_spec.train.heads import EVAL_DEPTH, HeadTrainConfig, HeadTrainer

VOCAB = 8
PROMPT = 5


def _accepted(row, nodes):
    """Drafts a round accepts: its longest prefix of ranks that is a node."""
    s = 0
    while s < len(row) and tuple(row[: s + 1]) in nodes:
        s += 1
    return s


# Four sequences of three rounds, two drafts each, laid out as step_ranks
# writes them: a sequence's last round has no second draft (-1).
HALF_A = [  # sequences 0 and 2
    [[0, 0], [0, 1], [1, -1]],
    [[0, 0], [0, 1], [0, -1]],
]
HALF_B = [  # sequences 1 and 3
    [[0, 0], [1, 0], [0, -1]],
    [[1, 0], [0, 0], [rounds.TOP_RANKS, -1]],
]


def _hand_matrix():
    a, b = HALF_A, HALF_B
    return np.array(a[0] + b[0] + a[1] + b[1])


def test_summarize_gives_the_acceptance_counted_by_hand():
    ranks = _hand_matrix()
    rows = ranks.tolist()
    n = len(rows)
    # Rounds whose first d drafts are all the argmax (rank 0).
    zeros = [sum(all(r[i] == 0 for i in range(d)) for r in rows) for d in (0, 1, 2)]
    assert zeros == [12, 8, 4]
    # Tree of 3 nodes fitted on half A: depth 1 is rank 0 five times in six,
    # depth 2 ranks 0 and 1 twice each, so (0,) 5/6, (0, 0) and (0, 1) 5/12.
    tree_a = {(0,), (0, 0), (0, 1)}
    # On half B: depth 1 is rank 0 three times in six, rank 1 twice; depth 2
    # always rank 0, so (0,) and (0, 0) 1/2, then (1,) 1/3.
    tree_b = {(0,), (0, 0), (1,)}
    a_rows = [r for seq in HALF_A for r in seq]
    b_rows = [r for seq in HALF_B for r in seq]
    cross = sum(_accepted(r, tree_b) for r in a_rows)
    cross += sum(_accepted(r, tree_a) for r in b_rows)
    summary = rounds.summarize(ranks, 3)
    assert summary["rounds"] == n
    assert summary["accept_by_depth"] == [
        round(zeros[1] / n, 4),
        round(zeros[2] / n, 4),
    ]
    assert summary["accept_by_depth"][0] == round(8 / 12, 4)
    assert summary["conditional_by_depth"] == [
        round(zeros[1] / zeros[0], 4),
        round(zeros[2] / zeros[1], 4),
    ]
    assert summary["tokens_per_round"] == round(1 + (zeros[1] + zeros[2]) / n, 4)
    assert summary["tree_tokens_per_round"] == round(1 + cross / n, 4)
    # The stored tree is the one fitted on all rounds: depth 1 rank 0 8/12 and
    # rank 1 3/12, depth 2 rank 0 6/8, so (0,) 2/3, (0, 0) 1/2, (1,) 1/4.
    assert summary["tree_choices"] == [[0], [1], [0, 0]]


def test_the_tree_tau_is_measured_on_sequences_the_tree_was_not_fitted_to():
    """Each sequence puts the target's token at its own rank: a one-node tree
    fitted to all of them (rank 1, the commoner) accepts 3 rounds in 5 on the
    same text, but a tree fitted to one sequence accepts nothing of the other."""
    ranks = np.array([[1, 0], [1, 0], [1, -1], [2, 0], [2, -1]])
    assert rounds.sequence_ids(ranks).tolist() == [0, 0, 0, 1, 1]
    in_sample = 1 + rounds.tree_depths(ranks, [(1,)]).mean()
    assert in_sample == pytest.approx(1.6)
    summary = rounds.summarize(ranks, 1)
    assert summary["tree_choices"] == [[1]]
    assert summary["tree_tokens_per_round"] == 1.0
    # The chain figures are those of the same rounds, as before.
    assert summary["tokens_per_round"] == 1.0 and summary["accept_by_depth"] == [0, 0]


def test_one_sequence_is_cross_fitted_over_its_first_and_second_half():
    ranks = np.array([[3, 0], [3, 0], [4, 0], [4, -1]])
    assert rounds.sequence_ids(ranks).tolist() == [0, 0, 0, 0]
    # Fitted on all four rounds, a one-node tree (3,) would accept two.
    assert rounds.cross_fitted_tree_depths(ranks, 1).tolist() == [0, 0, 0, 0]


# --------------------------------------------------------------------------- #
# On a tiny target: the rounds' sequences, and the unrolled loss
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(VOCAB)


@pytest.fixture(scope="module")
def data(tiny):
    rng = np.random.default_rng(3)
    sequences = []
    for n in (12, 20, 9, 16, 14, 11, 18, 10):
        prompt = rng.integers(0, VOCAB, size=PROMPT).tolist()
        sequences.append(prompt + greedy_continuation(tiny, prompt, n)[0])
    return teacher_data(tiny, sequences, [PROMPT] * len(sequences))


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_sequence_ids_read_back_the_held_out_sequences_of_the_ranks(tiny, data, kind):
    config = HeadTrainConfig(kind=kind, draft_vocab=0, heldout=len(data))
    trainer = HeadTrainer(tiny, data, config, heldout_index=range(len(data)))
    batch = eagle_train.make_batch(
        data, trainer.eval_index, trainer.to_draft, 1 << 30, np.random.default_rng(0)
    )
    if kind == "eagle":
        ranks = eagle_train.step_ranks(
            trainer.head, trainer.embed_fn, trainer.logits_fn(), batch, EVAL_DEPTH
        )
        valid = batch.valid_np[:, 1:]  # a round per supervised query
    else:
        ranks = medusa_train.rank_hits(
            trainer.head, trainer.vocab_weight, trainer.draft_ids_mx, batch
        )
        valid = batch.valid_np  # a round per supervised position
    expected = np.nonzero(valid)[0]  # the batch row (sequence) of each round
    assert rounds.sequence_ids(ranks).tolist() == expected.tolist()


def _trainer(tiny, data):
    """A random EAGLE head, and a batch of all sequences whose prompt positions
    weigh half as much as completions (so every query from 0 is supervised)."""
    config = HeadTrainConfig(kind="eagle", draft_vocab=0, prompt_weight=0.5)
    trainer = HeadTrainer(tiny, data, config, heldout_index=[])
    batch = trainer.batch(list(range(len(data))))
    assert batch.valid_np[:, :3].all() and len(set(batch.valid_np.sum(1))) > 1
    return trainer, batch


def _loss(trainer, batch, steps, feature_weight=0.5):
    loss, accs = eagle_train.eagle_loss(
        trainer.head,
        trainer.embed_fn,
        trainer.logits_fn(),
        batch,
        steps=steps,
        feature_weight=feature_weight,
        final_feature=True,
    )
    return float(loss.item()), np.array(accs)


def _step_losses(trainer, batch, steps, feature_weight):
    """Each unrolled step's loss and accuracy, in numpy: the weighted mean over
    the queries ``q >= s - 1`` whose next position is supervised of the
    cross-entropy to the teacher's law plus the feature regression."""
    outs = eagle_train.unrolled_outputs(
        trainer.head, trainer.embed_fn, None, batch, steps
    )
    vocab = np.array(trainer.vocab_weight)
    ids = np.array(batch.teacher_ids)[:, 1:]
    p = np.array(batch.teacher_p)[:, 1:]
    feats = np.array(batch.features)[:, 1:]
    weight = np.array(batch.weight)[:, 1:]
    losses, accs = [], []
    for s, (g, _) in enumerate(outs, start=1):
        g = np.array(g).astype(np.float64)
        logits = g @ vocab.T
        logq = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        picked = np.take_along_axis(logq, np.maximum(ids, 0), axis=-1)
        ce = -(np.where(ids >= 0, p, 0.0) * picked).sum(-1)
        diff = np.abs(g - feats)
        reg = np.where(diff < 1, 0.5 * diff**2, diff - 0.5).mean(-1)
        w = weight.copy()
        w[:, : s - 1] = 0  # no step-s query before s - 1
        losses.append((w * (ce + feature_weight * reg)).sum() / w.sum())
        hit = logits.argmax(-1) == ids[..., 0]
        accs.append(hit[w > 0].mean())
    return losses, accs


def test_the_unrolled_loss_is_the_decayed_mean_of_every_steps_loss(tiny, data):
    trainer, batch = _trainer(tiny, data)
    one, accs_one = _loss(trainer, batch, 1)
    three, accs_three = _loss(trainer, batch, 3)
    assert accs_one.shape == (1,) and accs_three.shape == (3,)
    losses, accs = _step_losses(trainer, batch, 3, 0.5)
    assert len(set(np.round(losses, 3))) == 3  # the steps' losses differ
    assert one == pytest.approx(losses[0], rel=1e-4)
    assert three != pytest.approx(one, rel=1e-3)
    decay = [eagle_train.STEP_DECAY**s for s in range(3)]
    assert three == pytest.approx(np.dot(decay, losses) / sum(decay), rel=1e-4)
    assert accs_three == pytest.approx(accs, abs=1e-6)


def test_a_steps_unsupervised_queries_do_not_reach_its_loss(tiny, data, monkeypatch):
    """Step ``s`` has no query before ``s - 1`` (its input would be a draft
    from before the window), and padding and each sequence's last position
    are not supervised: whatever the head outputs there, the loss is the same."""
    trainer, batch = _trainer(tiny, data)
    clean = _loss(trainer, batch, 3)
    real = eagle_train.unrolled_outputs
    supervised = batch.valid_np[:, 1:]

    def garbled(where):
        def outputs(*args, **kwargs):
            outs = real(*args, **kwargs)
            rng = np.random.default_rng(1)
            changed = []
            for s, (g, logits) in enumerate(outs, start=1):
                mask = where(s)[..., None]
                noise = mx.array(100 * rng.standard_normal(g.shape).astype(np.float32))
                changed.append((mx.where(mx.array(mask), noise, g), logits))
            return changed

        return outputs

    def unsupervised(s):
        mask = ~supervised
        mask[:, : s - 1] = True
        return mask

    monkeypatch.setattr(eagle_train, "unrolled_outputs", garbled(unsupervised))
    loss, accs = _loss(trainer, batch, 3)
    assert loss == pytest.approx(clean[0], rel=1e-5)
    assert accs == pytest.approx(clean[1], abs=1e-6)
    # Garbling one supervised query of step 3 does reach it.
    b, q = np.argwhere(supervised[:, 2:])[0]

    def one_query(s):
        mask = np.zeros_like(supervised)
        mask[b, q + 2] = s == 3
        return mask

    monkeypatch.setattr(eagle_train, "unrolled_outputs", garbled(one_query))
    assert _loss(trainer, batch, 3)[0] != pytest.approx(clean[0], rel=1e-3)


def test_a_head_card_says_how_its_tree_tau_was_measured():
    """Evaluations from before cross-fitting scored the tree on its own text:
    their cards keep the old words."""
    from mlx_spec.train.card import head_card

    def card(last):
        config = {"training": {"config": {"kind": "eagle"}, "evals": [last]}}
        return head_card(config, "mlx_spec train-draft --kind eagle")

    summary = {**rounds.summarize(_hand_matrix(), 3), "step": 1}
    cross = "with the tree fitted to the other half): " + str(
        summary["tree_tokens_per_round"]
    )
    assert cross in card(summary)
    old = {k: v for k, v in summary.items() if k != "tree_fit"}
    assert "fitted to them: " in card(old) and "other half" not in card(old)
