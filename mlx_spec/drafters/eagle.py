"""``--speculative eagle`` / ``eagle-chain``: an EAGLE head drafts from the target's features.

The head (:class:`~mlx_spec.drafters.heads.EagleHead`) keeps a KV cache of
*pairs* ``(f_t, x_{t+1})``: the target's feature at position ``t`` and the
token that followed. Pair ``j`` sits at slot and rope position ``j``
(counted from this call's prompt). Its output at the last pair predicts the
feature of the pending token, hence the first draft token; fed its own
output and that token, it drafts the next, and so on (EAGLE-1).

No target forward is added: the engine captures the features of every
target forward (prompt prefill and verification, see
:mod:`mlx_spec.features`) and hands the rows of the accepted tokens to
:meth:`EagleContext.add_features`. The next round first feeds those pairs
(one head forward), then drafts. Draft entries never stay in the head's
cache: each commit trims it back to the pairs built from true features.

Trees (EAGLE-2): the dynamic tree of :class:`~mlx_spec.drafters.tree.TreeDrafter`
(or a static one), each level expanded by one head forward over the
level's nodes with their ancestors' entries visible (an explicit mask on
the head's own attention). Chains under sampling draw each token from the
head's processed law, which the engine's rejection sampling uses; tree
children are the head's top-k (point masses), both exact.
"""

from typing import List

import mlx.core as mx

from ..costs import DRAFT_LATENCY, target_bytes, weight_bytes
from ..sampling import normalize
from .base import (
    Proposal,
    RoundState,
    check_no_drafter_cache,
    empty_proposal,
    subset_choice,
)
from .fit import check_drafter, drafter_kind
from .heads import LoadedHead
from .pairs import FeaturePairs
from .tree import TreeDrafter, _StaticShape


class EagleContext(FeaturePairs):
    """The head's cache of pairs and the target features it has not read yet.

    Shared by the chain and tree drafters of one generation (``auto``).
    """

    def __init__(self, head: LoadedHead):
        super().__init__(head)
        self.vocab = head.vocab  # this call's: plus the context's tokens

    def add_tokens(self, tokens):
        """Let the head propose ``tokens`` too (the prompt's: names, code to copy)."""
        self.vocab = self.vocab.with_tokens(tokens)

    def feed(self, feats: mx.array, tokens: mx.array, state: RoundState) -> mx.array:
        m, start = feats.shape[0], self.cache.offset
        positions = mx.arange(self.fed, self.fed + m)[None]
        slots = mx.arange(start + m)[None, :]
        mask = slots <= (start + mx.arange(m))[:, None]  # (m, S + m) causal
        out, _ = self.module(
            self.module.project(feats)[None],
            self.head.embed(tokens)[None],
            positions,
            mask,
            cache=self.cache,
        )
        return out

    def step(self, g: mx.array, token: mx.array, position: int) -> mx.array:
        """One draft step on the pair ``(g, token)`` at ``position``: ``(1, 1, H)``."""
        out, _ = self.module(
            g,
            self.head.embed(token.reshape(1, 1)),
            mx.array([[position]]),
            None,
            self.cache,
        )
        return out


class EagleDrafter(TreeDrafter):
    """Chains or trees from an EAGLE head (see the module docstring).

    Args:
        context: The head and its cache (:class:`EagleContext`).
        vocab_size: Width of the target's logits.
        tree: Propose trees (else chains).
        top_k, depth, choices: Tree shape, as for ``--speculative tree``.
    """

    def __init__(
        self,
        context: EagleContext,
        vocab_size: int,
        *,
        tree: bool,
        top_k: int,
        depth: int,
        choices=None,
        step_cost: float = DRAFT_LATENCY,
    ):
        self.context = context
        self.head = context.head
        self.vocab_size = vocab_size
        self.is_tree = tree
        self.name = "eagle" if tree else "eagle-chain"
        self.note = None
        self.top_k, self.depth = top_k, depth
        self.choices = list(choices) if choices else None
        self.static = _StaticShape(self.choices) if self.choices else None
        self.feature_layers = tuple(self.head.args.feature_layers)
        self.step_cost = step_cost
        self.p_min = 0.0

    def add_features(self, features, rows):
        self.context.add_features(features, rows)

    def chain_only(self):
        """Propose chains (logits processors need one history per position)."""
        self.is_tree = False
        self.name = "eagle-chain"

    def prefill(self, tokens, step_size: int):
        """The prompt's tokens join the draft vocabulary (its features come later)."""
        self.context.add_tokens(tokens.tolist())

    def add_history(self, tokens):
        self.context.add_tokens(tokens)

    def _logits(self, g: mx.array) -> mx.array:
        return self.context.vocab.logits(g.reshape(-1, g.shape[-1]))

    def propose(self, state: RoundState, size: int) -> Proposal:
        g = self.context.catch_up(state)
        if g is None:
            return empty_proposal()
        self._root = g
        if self.is_tree:
            return super().propose(state, size)
        return self._chain(state, size, g)

    def _chain(self, state: RoundState, gamma: int, g: mx.array) -> Proposal:
        tokens, laws = [], []
        position = self.context.fed
        vocab = self.context.vocab
        for i in range(gamma):
            if state.subset_choice_ok:  # over the draft vocabulary's columns
                small = vocab.small_logits(g.reshape(1, -1))
                column, law = subset_choice(state, small)
                token = vocab.to_target(column)
            else:
                token, law = state.choose(self._logits(g), tokens)
            mx.async_eval(token)
            tokens.append(token)
            laws.append(law)
            if i + 1 < gamma:
                g = self.context.step(g, token, position + i)
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        columns = None  # a law over the draft vocabulary's columns
        if logprobs is not None and state.subset_choice_ok:
            columns = vocab.all_ids
        return Proposal(
            mx.concatenate(tokens), logprobs, forwards=len(tokens), columns=columns
        )

    # Tree hooks of TreeDrafter: the root's and each level's draft logprobs,
    # over the draft vocabulary only (children are ranked there, not at 49k wide).
    def _draft_logprobs(self, g: mx.array) -> mx.array:
        return normalize(self.context.vocab.small_logits(g.reshape(-1, g.shape[-1])))

    def _column_ids(self):
        # The draft vocabulary, with this call's tokens.
        return self.context.vocab.all_ids

    def _root_logprobs(self, state: RoundState) -> mx.array:
        self._tree_prefix = self.context.cache.offset
        self._node_feats = self._root.reshape(1, -1)  # row 0: the root's output
        return self._draft_logprobs(self._root)

    def _level_logprobs(self, fed, start: int) -> mx.array:
        """Expand fed nodes ``start..``: one head forward over them, ``(n, C)``."""
        prefix = self._tree_prefix
        tokens, parents = fed.tokens[start:], fed.parents[start:]
        n = tokens.shape[0]
        parent_out = self._node_feats[parents + 1]  # parent -1: the root's output
        mask = mx.concatenate(
            [mx.ones((n, prefix), mx.bool_), fed.ancestor_mask[start:]], axis=1
        )
        positions = (self.context.fed + fed.depth[start:])[None]
        out, _ = self.context.module(
            parent_out[None],
            self.head.embed(tokens)[None],
            positions,
            mask,
            cache=self.context.cache,
        )
        g = out[0]
        self._node_feats = mx.concatenate([self._node_feats, g])
        return self._draft_logprobs(g)

    def commit(self, state, proposal, num_accepted: int, path=None):
        self.context.rewind()

    def caches(self) -> List:
        return []  # the head's cache is rebuilt from each call's prompt

    def sync(self, seq, base: int):
        """Nothing to keep in the caller's prompt cache."""

    def release(self):
        self.context.rewind()


def head_step_cost(head: LoadedHead, target) -> float:
    """Modelled cost of a head step: bytes read relative to a target step, plus latency."""
    read = weight_bytes(head.module)
    vocab = head.vocab
    if vocab.layer is not None:
        read += weight_bytes(vocab.layer)
    else:
        from ..features import output_layer

        read += weight_bytes(output_layer(target))
    return DRAFT_LATENCY + read / max(target_bytes(target), 1)


def _check_head(draft_model, method: str, kind: str, target) -> LoadedHead:
    check_drafter(method, drafter_kind(draft_model))
    if draft_model.target is not target.model:
        raise ValueError(
            f"the {kind} head was loaded for another model object; load it with "
            "mlx_spec.load_head(path, model) for the model you generate with."
        )
    return draft_model


def _make(config, target, draft_model, cache, vocab_size, tree: bool, method: str):
    from ..attention.tree import prepare_tree_model, tree_unsupported

    head = _check_head(draft_model, method, "eagle", target)
    check_no_drafter_cache(cache, method)
    note = None
    if tree:
        reason = tree_unsupported(target.model, target.cache)
        if reason is None:
            prepare_tree_model(target.model)
        else:
            tree, note = False, f"tree verified as chains ({reason.rstrip('.')})"
    drafter = EagleDrafter(
        EagleContext(head),
        vocab_size,
        tree=tree,
        top_k=config.tree_top_k,
        depth=config.tree_depth,
        choices=config.tree_choices,
        step_cost=head_step_cost(head, target.model),
    )
    drafter.note = note
    return drafter


def make_eagle_arms(config, target, draft_model, cache, kv, vocab_size):
    """``auto``'s head arms: the tree and the chain, sharing one head cache."""
    tree = _make(config, target, draft_model, cache, vocab_size, True, "eagle")
    arms = {tree.name: tree}
    if tree.is_tree:
        chain = _make(
            config, target, draft_model, cache, vocab_size, False, "eagle-chain"
        )
        chain.context = tree.context
        arms[chain.name] = chain
    return arms


def make_eagle_drafter(config, target, draft_model, cache, kv, vocab_size):
    """``--speculative eagle``: EAGLE-2 dynamic trees (chains where trees cannot run)."""
    return _make(config, target, draft_model, cache, vocab_size, True, "eagle")


def make_eagle_chain_drafter(config, target, draft_model, cache, kv, vocab_size):
    """``--speculative eagle-chain``: chains drawn from the head's law."""
    return _make(config, target, draft_model, cache, vocab_size, False, "eagle-chain")
