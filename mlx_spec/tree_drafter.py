"""Draft token trees from a draft model (``--speculative tree``).

Dynamic trees (EAGLE-2 style): grow level by level, each level expanded in
one draft forward with tree attention. At every level the ``top_k`` most
promising frontier nodes (by cumulative draft log-probability) get their
``top_k`` best children; at the end the best ``budget`` nodes of everything
seen are sent to the target. Everything is built lazily on device.

Static trees (Medusa "choices"): a fixed list of index paths, where path
``(0, 1)`` is the second-best child of the best first token.

Children are the draft's top-k, chosen without looking at the target, so
:func:`mlx_spec.acceptance.tree_accept` is exact for greedy and sampling.
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from .drafters import ModelDrafter, Proposal, RoundState, align_vocab
from .models import CachedModel
from .sampling import normalize
from .tree import Tree, commit_path, prepare_tree_model, tree_forward

# Keeps ancestors ahead of equally scored descendants in the top-budget cut.
DEPTH_TIE_BREAK = 1e-6


def top_children(logprobs: mx.array, k: int) -> Tuple[mx.array, mx.array]:
    """The ``k`` best tokens per row, best first: ``(R, V) -> (R, k), (R, k)``."""
    tokens = mx.argsort(-logprobs, axis=-1)[:, :k]
    return tokens, mx.take_along_axis(logprobs, tokens, axis=-1)


def select_budget(scores: mx.array, depth: mx.array, budget: int) -> mx.array:
    """Indices of the ``budget`` best-scored nodes, ascending (ancestor-closed)."""
    n = scores.shape[0]
    if budget >= n:
        return mx.arange(n, dtype=mx.int32)
    ranked = scores - DEPTH_TIE_BREAK * depth.astype(scores.dtype)
    best = mx.argpartition(-ranked, kth=budget - 1)[:budget]
    return mx.sort(best).astype(mx.int32)


class TreeDrafter(ModelDrafter):
    """Grows a token tree with a draft model, one forward per level."""

    name = "tree"
    is_tree = True

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
        self._tree_prefix = 0

    def _root_logprobs(self, state: RoundState) -> mx.array:
        """Feed the pending tokens; return the draft's logprobs at the root ``(1, V)``."""
        logits = self.draft(mx.array(self.pending(state), mx.uint32))[-1:]
        self._tree_prefix = self.draft.offset
        return normalize(align_vocab(logits, self.vocab_size))

    def _level_logprobs(self, fed: Tree, start: int) -> mx.array:
        logits = tree_forward(self.draft.model, self.draft.cache, fed, start=start)
        return normalize(align_vocab(logits, self.vocab_size))

    def propose(self, state: RoundState, budget: int) -> Proposal:
        root = self._root_logprobs(state)
        if self.choices is not None:
            return self._static(root)
        return self._dynamic(root, budget)

    def _dynamic(self, root: mx.array, budget: int) -> Proposal:
        k = self.top_k
        tokens, scores = top_children(root, k)
        tokens, scores = tokens[0], scores[0]
        pool = Tree.from_parents(tokens, [-1] * k)  # every candidate seen so far
        pool_scores = [scores]
        # Pool node -> its slot among the draft's fed tree nodes (-1: not fed).
        fed_index = [
            (
                mx.arange(k, dtype=mx.int32)
                if self.depth > 1
                else mx.full((k,), -1, mx.int32)
            )
        ]
        fed = pool  # nodes fed to the draft, in cache order
        frontier, frontier_scores, start = mx.arange(k, dtype=mx.int32), scores, 0
        for level in range(2, self.depth + 1):
            children, child_lp = top_children(self._level_logprobs(fed, start), k)
            cand_scores = (frontier_scores[:, None] + child_lp).reshape(-1)  # (k*k,)
            cand_tokens = children.reshape(-1)
            first_new = pool.size
            pool = pool.grow(cand_tokens, mx.repeat(frontier, k))
            pool_scores.append(cand_scores)
            if level == self.depth:
                fed_index.append(mx.full((k * k,), -1, mx.int32))
                break
            best = mx.argpartition(-cand_scores, kth=k - 1)[:k].astype(mx.int32)
            start = fed.size
            fed = fed.grow(cand_tokens[best], start - k + best // k)
            slots = mx.full((k * k,), -1, mx.int32)
            slots[best] = start + mx.arange(k, dtype=mx.int32)
            fed_index.append(slots)
            frontier, frontier_scores = first_new + best, cand_scores[best]
        keep = select_budget(mx.concatenate(pool_scores), pool.depth, budget)
        chosen = pool.subtree(keep)
        return Proposal(
            chosen.tokens,
            None,
            forwards=self.depth,
            parents=chosen.parents,
            sync_data=mx.concatenate(fed_index)[keep],
        )

    def _static(self, root: mx.array) -> Proposal:
        choices = self.choices
        index = {path: i for i, path in enumerate(choices)}
        parents = [index[c[:-1]] if len(c) > 1 else -1 for c in choices]
        widest = max(c[-1] for c in choices) + 1
        ranked, _ = top_children(root, widest)
        tokens = [None] * len(choices)
        level_start = 0
        fed = None
        for level in range(1, max(len(c) for c in choices) + 1):
            members = [i for i, c in enumerate(choices) if len(c) == level]
            if level > 1:
                prev = [i for i, c in enumerate(choices) if len(c) == level - 1]
                fed_tokens = mx.stack([tokens[i] for i in prev])
                fed_parents = [parents[i] for i in prev]
                fed = (
                    Tree.from_parents(fed_tokens, fed_parents)
                    if fed is None
                    else fed.grow(fed_tokens, fed_parents)
                )
                ranked, _ = top_children(self._level_logprobs(fed, level_start), widest)
                level_start = fed.size
                rows = {node: r for r, node in enumerate(prev)}
            for i in members:
                row = 0 if level == 1 else rows[parents[i]]
                tokens[i] = ranked[row, choices[i][-1]]
        depth_max = max(len(c) for c in choices)
        fed_slots = [i if len(c) < depth_max else -1 for i, c in enumerate(choices)]
        return Proposal(
            mx.stack(tokens),
            None,
            forwards=depth_max,
            parents=parents,
            sync_data=mx.array(fed_slots, mx.int32),
        )

    def commit(
        self, state: RoundState, proposal: Proposal, num_accepted: int, path=None
    ):
        # Keep the accepted nodes the draft has already seen, contiguous.
        slots = proposal.sync_values or []
        kept: List[int] = []
        for node in path or []:
            if slots[node] < 0:
                break
            kept.append(slots[node])
        commit_path(self.draft.cache, self._tree_prefix, kept)


def make_tree_drafter(config, target, draft_model, cache, kv, vocab_size):
    from .drafters import _make_model_drafter

    prepare_tree_model(target.model)
    base = _make_model_drafter(config, target, draft_model, cache, kv, vocab_size)
    return TreeDrafter(
        base.draft,
        vocab_size,
        top_k=config.tree_top_k,
        depth=config.tree_depth,
        choices=config.tree_choices,
    )
