"""Held-out acceptance from rank matrices.

The figures of :func:`rounds.summarize` are checked on small rank matrices
against counts written out in the test.
"""

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
# On a tiny target: the sequences of the rounds
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
