"""Held-out acceptance of a head, chain and tree, from the ranks of the target's tokens.

For a round starting at ``j``, ``ranks[j, s - 1]`` is the rank (0 = first) of
the target's greedy token among the head's candidates for draft ``s``, given
the target's tokens before it (EAGLE: its unrolled step ``s``; Medusa: head
``s``); ``TOP_RANKS`` past its first ``TOP_RANKS`` candidates, ``-1`` past the
sequence. A chain accepts drafts ``1..s`` iff ranks ``1..s`` are all 0. A
static tree of index paths accepts them iff the path ``ranks[:s]`` is one of
its nodes, since the node on the target's path is the one those ranks were
read at. So on text the target wrote greedily both are exact, not estimates.

A round's row holds ``-1`` only past its sequence, and the rounds of a
sequence are consecutive rows (as :func:`mlx_spec.train.eagle.step_ranks`
and :func:`mlx_spec.train.medusa.rank_hits` write them), each reaching no
further than the one before it: :func:`sequence_ids` reads the sequences
back from that. The tree's τ is cross-fitted over two halves of them.
"""

import heapq
from typing import Dict, List, Sequence, Tuple

import numpy as np

TOP_RANKS = 10  # candidates ranked per draft (the tree's widest node)


def chain_runs(ranks: np.ndarray) -> np.ndarray:
    """``(N, D)`` ranks -> ``(N, D)`` bool: drafts ``1..s`` all accepted."""
    return np.cumprod(ranks == 0, axis=1).astype(bool)


def tree_depths(ranks: np.ndarray, choices: Sequence[Tuple[int, ...]]) -> np.ndarray:
    """``(N,)`` accepted depth of each round under the static tree ``choices``.

    ``choices`` holds every prefix of its paths (as :func:`calibrated_choices`
    makes them), so the accepted depth is the longest prefix of a round's
    ranks that is a node.
    """
    nodes = set(map(tuple, choices))
    depths = np.zeros(ranks.shape[0], np.int64)
    for n, row in enumerate(ranks.tolist()):
        s = 0
        while s < len(row) and tuple(row[: s + 1]) in nodes:
            s += 1
        depths[n] = s
    return depths


def rank_accuracy(ranks: np.ndarray) -> np.ndarray:
    """``(D, TOP_RANKS)``: how often draft ``s``'s rank-``r`` candidate is the target's."""
    D = ranks.shape[1]
    acc = np.zeros((D, TOP_RANKS))
    for s in range(D):
        col = ranks[:, s]
        col = col[col >= 0]
        if col.size:
            for r in range(TOP_RANKS):
                acc[s, r] = float((col == r).mean())
    return acc


def calibrated_choices(acc: np.ndarray, size: int) -> List[Tuple[int, ...]]:
    """The ``size`` index paths of highest ``prod_l acc[l, c_l]`` (Medusa's trees).

    A path's value never exceeds its parent's, so taking the best paths
    one by one (a best-first search) keeps every prefix in the tree.
    """
    K, R = acc.shape
    heap = [(-acc[0, r], (r,)) for r in range(R)]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < size:
        value, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < K:
            for r in range(R):
                heapq.heappush(heap, (value * acc[len(path), r], path + (r,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def sequence_ids(ranks: np.ndarray) -> np.ndarray:
    """``(N,)`` the sequence of each round, numbered from 0 in row order.

    A round that reaches further than the round before it (more drafts
    before ``-1``) starts a sequence. A sequence whose first round reaches no
    further than the previous sequence's last joins it, so two rounds given
    different numbers are always of different sequences.
    """
    reach = (ranks >= 0).sum(axis=1)
    starts = np.concatenate([[True], reach[1:] > reach[:-1]])[: len(reach)]
    return np.cumsum(starts) - 1


def cross_fitted_tree_depths(ranks: np.ndarray, tree_size: int) -> np.ndarray:
    """``(N,)`` accepted depth of each round under a tree not fitted to its sequence.

    The sequences split into two halves (even and odd numbers of
    :func:`sequence_ids`; the first and second half of the rounds if there
    is one sequence); each half's rounds are replayed on the tree of
    ``tree_size`` nodes calibrated on the other half.
    """
    ids = sequence_ids(ranks)
    second = ids % 2 == 1
    if not second.any():
        second = np.arange(len(ids)) >= len(ids) // 2
    depths = np.zeros(len(ids), np.int64)
    for part in (second, ~second):
        if part.any():
            choices = calibrated_choices(rank_accuracy(ranks[~part]), tree_size)
            depths[part] = tree_depths(ranks[part], choices)
    return depths


def summarize(ranks: np.ndarray, tree_size: int) -> Dict[str, object]:
    """Acceptance by depth, chain τ, and τ of a static tree of ``tree_size`` nodes.

    ``tree_choices`` is the tree calibrated on all the ranks (Medusa's stored
    tree); its τ is measured on sequences it was not calibrated on
    (:func:`cross_fitted_tree_depths`), since a tree scored on the text it
    was fitted to looks better than it drafts. τ counts the bonus token.
    """
    if ranks.size == 0:
        return {"rounds": 0, "accept_by_depth": [], "tokens_per_round": 1.0}
    runs = chain_runs(ranks)
    by_depth = runs.mean(axis=0)
    # P(depth d accepted | depth d - 1 accepted): what each extra step adds.
    reached = np.concatenate([[1.0], by_depth[:-1]])
    conditional = np.where(reached > 0, by_depth / np.maximum(reached, 1e-12), 0.0)
    acc = rank_accuracy(ranks)
    choices = calibrated_choices(acc, tree_size)
    return {
        "rounds": int(ranks.shape[0]),
        "accept_by_depth": [round(float(a), 4) for a in by_depth],
        "conditional_by_depth": [round(float(a), 4) for a in conditional],
        "tokens_per_round": round(1.0 + float(runs.sum(axis=1).mean()), 4),
        "rank_accuracy": np.round(acc, 4).tolist(),
        "tree_choices": [list(c) for c in choices],
        "tree_nodes": len(choices),
        "tree_tokens_per_round": round(
            1.0 + float(cross_fitted_tree_depths(ranks, tree_size).mean()), 4
        ),
        "tree_fit": "cross-fitted",
    }
