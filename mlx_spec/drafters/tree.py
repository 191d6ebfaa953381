"""Draft token trees from a draft model (``--speculative tree``).

Dynamic trees (EAGLE-2 style): grow level by level, each level expanded in
one draft forward with tree attention. At every level the ``top_k`` most
promising frontier nodes (by cumulative draft log-probability) get their
``top_k`` best children. The best ``budget`` nodes of every candidate seen
(by cumulative draft log-probability) are what the target verifies; the
candidate pool is cut back to them whenever it grows past a small multiple
of the budget, so its size stays bounded.
Everything is built lazily on device.

Static trees (Medusa "choices"): a fixed list of index paths, where path
``(0, 1)`` is the second-best child of the best first token. Their shape is
laid out once, so a round only gathers tokens.

Children are the draft's top-k, chosen without looking at the target, so
:func:`mlx_spec.acceptance.tree_accept` is exact for greedy and sampling.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from ..attention.tree import (
    Tree,
    commit_path,
    prepare_tree_model,
    tree_forward,
    tree_unsupported,
)
from ..models import CachedModel
from ..sampling import normalize
from .base import Proposal, RoundState, align_vocab
from .model import ModelDrafter, make_model_drafter

# The candidate pool is cut back to the best ``budget`` nodes whenever it
# exceeds ``POOL_CAP * budget`` (cutting is exact: a node outside the best
# ``budget`` never re-enters, and neither do its descendants).
POOL_CAP = 4


@dataclass
class TreeProposal(Proposal):
    """A :class:`Proposal` that also carries its draft :class:`Tree`.

    Attributes:
        tree: the ``N`` proposed nodes (``tokens`` and ``parents`` match it),
            so the verifier reuses its ancestor mask instead of rebuilding it.
    """

    tree: Optional[Tree] = None


def top_children(logprobs: mx.array, k: int) -> Tuple[mx.array, mx.array]:
    """The ``k`` best tokens per row, best first: ``(R, V) -> (R, k), (R, k)``.

    A partial sort (``argpartition``) then a sort of just the ``k`` winners.
    """
    k = min(k, logprobs.shape[-1])
    best = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, best, axis=-1)
    order = mx.argsort(-values, axis=-1)
    return mx.take_along_axis(best, order, -1), mx.take_along_axis(values, order, -1)


def select_budget(
    scores: mx.array, budget: int, valid: Optional[mx.array] = None
) -> mx.array:
    """Indices of the ``budget`` best nodes, ascending.

    Nodes are ranked by ``valid`` first, then ``scores`` (higher first), then
    index (lower first): a strict total order, so the result is deterministic
    even with tied or ``-inf`` scores. When every child scores at most its
    parent and parents precede children, the result is closed under
    ancestors.

    Args:
        scores: ``(n,)`` cumulative draft log-probabilities.
        budget: number of nodes to keep.
        valid: optional ``(n,)`` bool; invalid nodes rank after all valid ones.

    Returns:
        ``(min(budget, n),)`` int32 node indices in ascending order.
    """
    n = scores.shape[0]
    index = mx.arange(n, dtype=mx.int32)
    if budget >= n:
        return index
    s_i, s_j = scores[:, None], scores[None, :]
    ahead = (s_j > s_i) | ((s_j == s_i) & (index[None, :] < index[:, None]))
    if valid is not None:  # [i, j]: node j ranks ahead of node i
        v_i, v_j = valid[:, None], valid[None, :]
        ahead = (v_j & ~v_i) | ((v_j == v_i) & ahead)
    rank = ahead.astype(mx.int32).sum(axis=1)  # a permutation of 0..n-1
    keys = mx.where(rank < budget, index, index + n)
    return mx.argsort(keys)[:budget].astype(mx.int32)


class _StaticShape:
    """A static tree's layout, computed once from its choices.

    Nodes are numbered as in ``choices``. Level ``l`` (1-based) holds the
    paths of length ``l``; the draft is fed the nodes of levels
    ``1..depth-1`` in level order (its cache slots).
    """

    def __init__(self, choices: Sequence[Tuple[int, ...]]):
        choices = [tuple(c) for c in choices]
        index = {path: i for i, path in enumerate(choices)}
        self.parents = [index[c[:-1]] if len(c) > 1 else -1 for c in choices]
        self.depth = max(len(c) for c in choices)
        self.width = max(c[-1] for c in choices) + 1
        levels = [
            [i for i, c in enumerate(choices) if len(c) == level]
            for level in range(1, self.depth + 1)
        ]
        level_order = [i for members in levels for i in members]
        slot = {node: s for s, node in enumerate(level_order)}
        fed_count = len(level_order) - len(levels[-1])
        # Per level: (row of the parent among the previous level, child rank).
        self.gather = []
        for level, members in enumerate(levels):
            start = self._start(levels, level - 1) if level else 0
            rows = [slot[self.parents[i]] - start if level else 0 for i in members]
            cols = [choices[i][-1] for i in members]
            self.gather.append((mx.array(rows), mx.array(cols)))
        order = [level_order.index(i) for i in range(len(choices))]
        self.order = None if order == list(range(len(order))) else mx.array(order)
        self.fed_slots = mx.array(
            [slot[i] if slot[i] < fed_count else -1 for i in range(len(choices))],
            mx.int32,
        )
        # The proposal's tree, and per level the draft's fed tree before it
        # (nodes of the earlier levels), structure only.
        self.tree = Tree.from_parents([0] * len(choices), self.parents)
        fed_parents = [
            slot[self.parents[i]] if self.parents[i] >= 0 else -1
            for i in level_order[:fed_count]
        ]
        self.fed = []
        if fed_count:
            fed = Tree.from_parents([0] * fed_count, fed_parents)
            for level in range(1, self.depth):
                start, end = self._start(levels, level - 1), self._start(levels, level)
                structure = (
                    fed.parents[:end],
                    fed.depth[:end],
                    fed.ancestor_mask[:end, :end],
                )
                self.fed.append((start, structure))
        mx.eval(self.tree.ancestor_mask, [s for _, s in self.fed])

    @staticmethod
    def _start(levels: List[List[int]], level: int) -> int:
        """Slot of the first node of ``level`` (0-based) in level order."""
        return sum(len(m) for m in levels[:level])


class TreeDrafter(ModelDrafter):
    """Grows a token tree with a draft model, one forward per level."""

    name = "tree"
    is_tree = True
    # Every round drafts: a tree's size is a budget, and the heads built on
    # this class read the target's features of each round.
    drafts_nothing = None

    def __init__(
        self,
        draft: CachedModel,
        vocab_size: int,
        *,
        top_k: int,
        depth: int,
        choices: Optional[Sequence[Tuple[int, ...]]] = None,
    ):
        super().__init__(draft, vocab_size)
        prepare_tree_model(draft.model)
        self.top_k = top_k
        self.depth = depth
        self.choices = list(choices) if choices else None
        self.static = _StaticShape(self.choices) if self.choices else None
        self._tree_prefix = 0
        self._caught_up = 0  # tokens beyond one the last root forward read

    def _root_logprobs(self, state: RoundState) -> mx.array:
        """Feed the pending tokens; return the draft's logprobs at the root ``(1, C)``."""
        pending = self.pending(state)
        self._caught_up = len(pending) - 1
        inputs = mx.array(pending, mx.uint32)
        logits = self._last_logits(inputs, self._subset)
        self._tree_prefix = self.draft.offset
        return normalize(logits)

    def _level_logprobs(self, fed: Tree, start: int) -> mx.array:
        cache = self.draft.cache
        if self._subset is None:
            logits = tree_forward(self.draft.model, cache, fed, start=start)
            return normalize(align_vocab(logits, self.vocab_size))
        hidden = tree_forward(self.draft.model.model, cache, fed, start=start)
        return normalize(self._subset.subset_logits(hidden))

    def _column_ids(self) -> Optional[mx.array]:
        """``(C,)`` target id of each column of the hooks' logprobs (``None``: the
        columns are the ids); a distilled draft covers a vocabulary subset."""
        return None if self._subset is None else self._subset.token_ids

    def _children(self, logprobs: mx.array, k: int) -> Tuple[mx.array, mx.array]:
        """The ``k`` best children per row: ``(R, C) -> (R, k)`` token ids and logprobs."""
        columns, values = top_children(logprobs, k)
        ids = self._column_ids()
        if ids is None:
            return columns, values
        return ids[columns].astype(columns.dtype), values

    def propose(self, state: RoundState, budget: int) -> Proposal:
        self._caught_up = 0  # set by a root forward that catches up
        root = self._root_logprobs(state)
        if self.static is not None:
            proposal = self._static(root)
        else:
            proposal = self._dynamic(root, budget)
        proposal.caught_up = self._caught_up
        return proposal

    def _dynamic(self, root: mx.array, budget: int) -> Proposal:
        k = self.top_k
        width = min(k, budget)  # frontier nodes past the budget cannot be kept
        # Nor levels past the budget: each costs a draft forward.
        depth = min(self.depth, budget)
        tokens, scores = self._children(root, width)
        pool = Tree.from_parents(tokens[0], [-1] * width)  # the best nodes so far
        scores = scores[0]
        valid = mx.ones((width,), mx.bool_)  # False: its parent was cut
        # Pool node -> its slot among the draft's fed tree nodes (-1: not fed).
        fed_slot = mx.arange(width, dtype=mx.int32)
        if depth == 1:
            fed_slot = mx.full((width,), -1, mx.int32)
        fed = pool  # nodes fed to the draft, in cache order
        frontier = mx.arange(width, dtype=mx.int32)  # pool index, -1 once cut
        frontier_scores, start = scores, 0
        for level in range(2, depth + 1):
            children, child_lp = self._children(self._level_logprobs(fed, start), k)
            mx.async_eval(children, child_lp)
            child_lp = mx.minimum(child_lp, 0.0)  # never outscore the parent
            cand_scores = (frontier_scores[:, None] + child_lp).reshape(-1)  # (w*k,)
            cand_tokens = children.reshape(-1)
            cand_valid = mx.repeat(frontier >= 0, k)
            first_new = pool.size
            pool = pool.grow(cand_tokens, mx.repeat(frontier, k))
            scores = mx.concatenate([scores, cand_scores])
            valid = mx.concatenate([valid, cand_valid])
            slots = mx.full((width * k,), -1, mx.int32)
            if level < depth:
                best = mx.argpartition(-cand_scores, kth=width - 1)[:width]
                best = best.astype(mx.int32)
                start = fed.size
                fed = fed.grow(cand_tokens[best], start - width + best // k)
                slots[best] = start + mx.arange(width, dtype=mx.int32)
                frontier = mx.where(cand_valid[best], first_new + best, -1)
                frontier_scores = cand_scores[best]
            fed_slot = mx.concatenate([fed_slot, slots])
            if pool.size > POOL_CAP * budget:  # cut back to the best ``budget``
                keep = select_budget(scores, budget, valid)
                remap = mx.full((pool.size,), -1, mx.int32)
                remap[keep] = mx.arange(budget, dtype=mx.int32)
                frontier = mx.where(frontier >= 0, remap[mx.maximum(frontier, 0)], -1)
                pool = pool.subtree(keep)
                scores, valid, fed_slot = scores[keep], valid[keep], fed_slot[keep]
        if pool.size > budget:
            keep = select_budget(scores, budget, valid)
            pool, fed_slot = pool.subtree(keep), fed_slot[keep]
        return TreeProposal(
            pool.tokens,
            None,
            forwards=depth,
            parents=pool.parents,
            sync_data=fed_slot,
            tree=pool,
        )

    def _static(self, root: mx.array) -> Proposal:
        shape = self.static
        ranked, _ = self._children(root, shape.width)
        levels = []
        for level, (rows, cols) in enumerate(shape.gather):
            if level > 0:
                start, structure = shape.fed[level - 1]
                fed = Tree(mx.concatenate(levels), *structure)
                ranked, _ = self._children(
                    self._level_logprobs(fed, start), shape.width
                )
            levels.append(ranked[rows, cols])
            mx.async_eval(levels[-1])
        tokens = mx.concatenate(levels)
        if shape.order is not None:
            tokens = tokens[shape.order]
        tree = Tree(
            tokens, shape.tree.parents, shape.tree.depth, shape.tree.ancestor_mask
        )
        return TreeProposal(
            tokens,
            None,
            forwards=shape.depth,
            parents=shape.parents,
            sync_data=shape.fed_slots,
            tree=tree,
        )

    def commit(
        self, state: RoundState, proposal: Proposal, num_accepted: int, path=None
    ):
        if proposal.size == 0:
            return  # no tree was grown (the call's last token): nothing to keep
        # Keep the accepted nodes the draft has already seen, contiguous.
        slots = proposal.sync_values or []
        kept: List[int] = []
        for node in path or []:
            if slots[node] < 0:
                break
            kept.append(slots[node])
        commit_path(self.draft.cache, self._tree_prefix, kept)


def make_tree_drafter(config, target, draft_model, cache, kv, vocab_size):
    """Drafter factory for ``--speculative tree``.

    Where tree attention cannot run (recurrent or sliding-window layers in the
    target or the draft, or another architecture), the draft proposes chains
    instead, verified exactly as ``--speculative draft`` does, and
    ``note`` says so.
    """
    base = make_model_drafter(config, target, draft_model, cache, kv, vocab_size)
    reason = tree_unsupported(target.model, target.cache) or tree_unsupported(
        draft_model, base.draft.cache
    )
    if reason is not None:
        base.note = f"tree verified as chains ({reason.rstrip('.')})"
        return base
    prepare_tree_model(target.model)
    drafter = TreeDrafter(
        base.draft,
        vocab_size,
        top_k=config.tree_top_k,
        depth=config.tree_depth,
        choices=config.tree_choices,
    )
    drafter.step_cost = base.step_cost  # one level forward ~ one draft step
    return drafter
