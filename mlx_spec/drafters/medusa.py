"""``--speculative medusa``: Medusa heads propose a token tree from one feature.

Head ``k`` (``k = 1..K``) reads the target's final feature at the last
accepted position (the one that chose the pending token) and predicts the
token ``k`` places after the pending one, through the target's frozen
output layer. All ``K`` heads run as one batched step; their top-k
candidates are combined into a tree, verified with tree attention in one
target forward:

- a static tree (Medusa's "choices": index paths, ``(0, 1)`` = head 2's
  second-best token under head 1's best), from ``--tree-choices``, or with
  ``adaptive=False`` the one calibrated at training time and stored with
  the heads;
- otherwise a dynamic top-k tree: the ``budget`` paths of highest summed
  head log-probability (the dynamic tree of
  :class:`~mlx_spec.drafters.tree.TreeDrafter`, each level read from the
  next head instead of a forward), its budget chosen per round.

The features come from the engine's capture of every target forward (no
extra forward). Children are each head's top-k (point masses), so the
engine's tree acceptance is exact for greedy and sampled decoding. Where
tree attention cannot run, the heads' top-1 tokens form a chain.
"""

from typing import List, Optional

import mlx.core as mx

from ..sampling import normalize
from .base import Proposal, RoundState, check_no_drafter_cache, empty_proposal
from .eagle import _check_head, head_step_cost
from .heads import LoadedHead, static_choices
from .tree import TreeDrafter, _StaticShape


class MedusaDrafter(TreeDrafter):
    """Trees (or chains) from Medusa heads (see the module docstring)."""

    name = "medusa"
    feature_layers = (-1,)

    def __init__(
        self,
        head: LoadedHead,
        vocab_size: int,
        *,
        tree: bool,
        top_k: int,
        depth: int,
        choices=None,
        step_cost: float = 0.0,
    ):
        self.head = head
        self.vocab_size = vocab_size
        self.is_tree = tree
        self.num_heads = head.args.num_heads
        self.top_k, self.depth = top_k, min(depth, self.num_heads)
        self.choices = list(choices) if choices else None
        if self.choices and max(len(c) for c in self.choices) > self.num_heads:
            raise ValueError(
                f"tree_choices are {max(len(c) for c in self.choices)} deep but there "
                f"are {self.num_heads} Medusa heads; use paths of at most that length."
            )
        self.static = _StaticShape(self.choices) if self.choices else None
        self.step_cost = step_cost
        self.note = None
        self.last: Optional[mx.array] = None  # (1, H) the last accepted feature
        self.vocab = head.vocab  # this call's: plus the context's tokens

    def add_features(self, features: mx.array, rows: Optional[List[int]]):
        """Keep the feature of the last accepted position (it chose the pending token)."""
        row = features.shape[0] - 1 if rows is None else rows[-1]
        self.last = features[row : row + 1]

    def chain_only(self):
        self.is_tree = False

    def prefill(self, tokens, step_size: int):
        """The prompt's tokens join the draft vocabulary (its features come later)."""
        self.vocab = self.vocab.with_tokens(tokens.tolist())

    def add_history(self, tokens):
        self.vocab = self.vocab.with_tokens(tokens)

    def _head_logprobs(self) -> mx.array:
        """All heads in one step: ``(K, C)`` logprobs over the draft vocabulary."""
        hidden = self.head.module(self.last)[0]  # (K, H)
        return normalize(self.vocab.small_logits(hidden))

    def _column_ids(self):
        # The draft vocabulary, with this call's tokens.
        return self.vocab.all_ids

    def propose(self, state: RoundState, size: int) -> Proposal:
        if self.last is None:
            return empty_proposal()
        self._levels = self._head_logprobs()
        if not self.is_tree:
            gamma = min(size, self.num_heads)
            tokens = self.vocab.to_target(mx.argmax(self._levels[:gamma], axis=-1))
            return Proposal(tokens, None, forwards=1)
        proposal = super().propose(state, size)
        proposal.forwards = 1  # one batched step of every head
        return proposal

    # Tree hooks of TreeDrafter: level l reads head l; no forward is run.
    def _root_logprobs(self, state: RoundState) -> mx.array:
        self._level = 0
        return self._levels[:1]

    def _level_logprobs(self, fed, start: int) -> mx.array:
        self._level += 1
        row = self._levels[self._level : self._level + 1]
        return mx.broadcast_to(row, (fed.size - start, row.shape[-1]))

    def commit(self, state, proposal, num_accepted: int, path=None):
        """Nothing to rewind: the heads keep no cache."""

    def caches(self) -> List:
        return []

    def sync(self, seq, base: int):
        """Nothing to keep in the caller's prompt cache."""

    def release(self):
        """Nothing to release."""


def make_medusa_drafter(config, target, draft_model, cache, kv, vocab_size):
    """``--speculative medusa``: a static or top-k tree of the heads' candidates."""
    from ..attention.tree import prepare_tree_model, tree_unsupported

    head = _check_head(draft_model, "medusa", "medusa", target)
    check_no_drafter_cache(cache, "medusa")
    # The heads' calibrated static tree is fixed in size; an adaptive run grows
    # a dynamic tree whose budget follows what verification costs here.
    choices = config.tree_choices
    if choices is None and not config.adaptive:
        choices = static_choices(head.config)
    tree, note = True, None
    reason = tree_unsupported(target.model, target.cache)
    if reason is None:
        prepare_tree_model(target.model)
    else:
        tree, note = False, f"tree verified as chains ({reason.rstrip('.')})"
    drafter = MedusaDrafter(
        head,
        vocab_size,
        tree=tree,
        top_k=config.tree_top_k,
        depth=head.args.num_heads,
        choices=choices,
        step_cost=head_step_cost(head, target.model),
    )
    drafter.note = note
    return drafter
