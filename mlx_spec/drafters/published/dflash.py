"""DFlash block drafters, as speculators and the DFlash authors publish them.

A DFlash drafter predicts a whole block of tokens in one forward. Its
context is the target's hidden states: the outputs of a few target blocks
at every position before the pending token, fused by ``fc`` and normed by
``hidden_norm``. Each layer attends from the block's positions to the
context (keys and values projected from the fused states) and, with no
causal mask, to the whole block. The block's input is the pending token
followed by ``block_size - 1`` mask tokens; the output at slot ``i``
scores the token ``i`` places after the pending one. So one forward drafts
a chain of ``block_size - 1`` tokens, each from its own law.

The context's keys and values are cached per layer and grow by the
accepted rows of each verification; the block's own entries are never
stored, so nothing needs rolling back.
"""

from types import SimpleNamespace
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ...costs import DRAFT_LATENCY, target_bytes, weight_bytes
from ...features import embed, feature_logits
from ..base import Proposal, RoundState, check_no_drafter_cache, empty_proposal
from ..fit import check_drafter, drafter_kind
from ..pairs import FeaturePairs
from .layers import DecoderLayer, LayerCaches


class BlockLayer(DecoderLayer):
    """A DFlash decoder layer: queries from the block, keys and values from the
    cached context and the block."""

    def add_context(self, context: mx.array, positions: mx.array, cache):
        """Append the keys and values of fused context states ``(1, m, H)``."""
        k, v = self.self_attn.keys_values(context, positions)
        cache.update_and_fetch(k, v)

    def __call__(self, x: mx.array, positions: mx.array, cache) -> mx.array:
        """The block ``x`` ``(1, B, H)`` over the cached context: ``(1, B, H)``."""
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = attn.queries(h, positions)
        k, v = attn.keys_values(h, positions)
        if cache is not None and cache.offset > 0:
            n = cache.offset
            k = mx.concatenate([cache.keys[..., :n, :], k], axis=2)
            v = mx.concatenate([cache.values[..., :n, :], v], axis=2)
        h = x + attn.attend(q, k, v, None)  # the block sees all its slots
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHead(nn.Module):
    """A DFlash drafter's weights (see the module docstring).

    Args:
        args: ``shape`` (:class:`LayerShape`), ``target_hidden_size``,
          ``num_aux``, ``feature_layers``, ``block_size``, ``mask_token_id``,
          ``draft_vocab_size`` (``None``: the target's own output layer),
          ``logit_scale`` and ``softcap`` (the authors' optional output
          scaling), ``own_embedding``.
    """

    def __init__(self, args: SimpleNamespace):
        super().__init__()
        self.args = args
        shape = args.shape
        H, eps = shape.hidden_size, shape.rms_norm_eps
        self.fc = nn.Linear(args.num_aux * args.target_hidden_size, H, bias=False)
        self.hidden_norm = nn.RMSNorm(H, eps=eps)
        self.layers = [BlockLayer(shape) for _ in range(shape.num_layers)]
        self.norm = nn.RMSNorm(H, eps=eps)
        if args.draft_vocab_size is not None:
            self.lm_head = nn.Linear(H, args.draft_vocab_size, bias=False)
        if args.own_embedding:
            self.embed_tokens = nn.Embedding(shape.vocab_size, H)

    def head_cache(self) -> LayerCaches:
        return LayerCaches(len(self.layers))

    def add_context(self, features: mx.array, start: int, cache: LayerCaches):
        """Append target features ``(m, A * Ht)`` of positions ``start..`` to
        ``cache``; return the fused context ``(1, m, H)``."""
        context = self.hidden_norm(self.fc(features))[None]
        positions = mx.arange(start, start + features.shape[0])[None]
        for layer, layer_cache in zip(self.layers, cache.layers):
            layer.add_context(context, positions, layer_cache)
        return context

    def block(self, embeddings: mx.array, start: int, cache) -> mx.array:
        """Normed outputs ``(1, B, H)`` of a block of embeddings ``(1, B, H)``
        at positions ``start..``, over the cached context."""
        positions = mx.arange(start, start + embeddings.shape[1])[None]
        caches = cache.layers if cache is not None else [None] * len(self.layers)
        h = embeddings
        for layer, layer_cache in zip(self.layers, caches):
            h = layer(h, positions, layer_cache)
        return self.norm(h)


class DFlashDraft:
    """A DFlash drafter bound to its target: what ``--draft-model DIR`` yields.

    Attributes:
        kind: ``"dflash"``.
        module: The :class:`DFlashHead`.
        ids: ``(C,)`` target id of each draft column, or ``None``.
        target: The target model.
    """

    is_head = True
    kind = "dflash"

    def __init__(self, module: DFlashHead, ids, vocab_size: int, target, config, path):
        self.module = module
        self.ids = None if ids is None else ids.astype(mx.int32)
        self.vocab_size = vocab_size
        self.target = target
        self.config = config
        self.path = path

    @property
    def args(self) -> SimpleNamespace:
        return self.module.args

    def embed(self, tokens: mx.array) -> mx.array:
        if "embed_tokens" in self.module:
            return self.module.embed_tokens(tokens)
        return embed(self.target, tokens)

    def logits(self, h: mx.array) -> mx.array:
        """Normed outputs ``(R, H)`` -> target-width logits ``(R, V)``."""
        if "lm_head" in self.module:
            small = self.module.lm_head(h)
        else:
            small = feature_logits(self.target, h)
        args = self.module.args
        if args.logit_scale != 1.0:
            small = small * args.logit_scale
        if args.softcap:
            small = mx.tanh(small / args.softcap) * args.softcap
        if self.ids is None:
            return small
        full = mx.full((small.shape[0], self.vocab_size), -mx.inf, small.dtype)
        full[:, self.ids] = small
        return full

    def parameters(self):
        return self.module.parameters()

    def make_cache(self) -> List:
        return []


class DFlashContext(FeaturePairs):
    """The drafter's cached context: the fused target features of every token
    before the pending one, at positions ``0..fed-1``.

    Its caches only ever hold context rows (a block's entries are never
    stored), so rewinding trims nothing.
    """

    def feed(self, feats: mx.array, tokens: mx.array, state: RoundState) -> mx.array:
        return self.module.add_context(feats, self.fed, self.cache)


class DFlashDrafter:
    """Chains of up to ``block_size - 1`` tokens from one DFlash forward.

    Args:
        draft: The :class:`DFlashDraft`.
        step_cost: Modelled cost of one block forward relative to a target step.
    """

    name = "dflash"
    is_tree = False

    def __init__(self, draft: DFlashDraft, step_cost: float = DRAFT_LATENCY):
        self.draft = draft
        self.module = draft.module
        self.context = DFlashContext(draft)
        self.feature_layers = tuple(draft.args.feature_layers)
        self.step_cost = step_cost
        self.note = None

    def add_features(self, features: mx.array, rows: Optional[List[int]]):
        self.context.add_features(features, rows)

    def prefill(self, tokens, step_size: int):
        """Nothing to do: the prompt's features arrive after the target's prefill."""

    def chain_only(self):
        """Already chains."""

    def propose(self, state: RoundState, size: int) -> Proposal:
        if self.context.catch_up(state) is None:
            return empty_proposal()
        start = self.context.fed  # context rows: every token before the pending one
        args = self.module.args
        size = min(size, args.block_size - 1)
        if size < 1:
            return empty_proposal()
        # Always the whole block, as trained: its slots all see each other.
        block = [state.seq[-1]] + [args.mask_token_id] * (args.block_size - 1)
        embedded = self.draft.embed(mx.array([block]))
        h = self.module.block(embedded, start, self.context.cache)
        logits = self.draft.logits(h[0, 1 : size + 1])
        tokens, laws = [], []
        for i in range(size):
            token, law = state.choose(logits[i : i + 1], tokens)
            tokens.append(token)
            laws.append(law)
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        return Proposal(mx.concatenate(tokens), logprobs, forwards=1)

    def commit(self, state, proposal, num_accepted: int, path=None):
        """Nothing to undo: the block's entries were never cached."""
        self.context.rewind()

    def caches(self) -> List:
        return []

    def sync(self, seq, base: int):
        """Nothing to keep in the caller's prompt cache."""

    def release(self):
        """Nothing to release."""


def dflash_step_cost(draft: DFlashDraft, target) -> float:
    """Modelled cost of a block forward: bytes read relative to a target step, plus latency."""
    from ...features import output_layer

    read = weight_bytes(draft.module)
    if "lm_head" not in draft.module:
        read += weight_bytes(output_layer(target))
    return DRAFT_LATENCY + read / max(target_bytes(target), 1)


def make_dflash_drafter(config, target, draft_model, cache, kv, vocab_size):
    """``--speculative dflash``: block drafts from a DFlash drafter."""
    check_drafter("dflash", drafter_kind(draft_model))
    if draft_model.target is not target.model:
        raise ValueError(
            "the DFlash drafter was loaded for another model object; load it with "
            "mlx_spec.load_published(path, model) for the model you generate with."
        )
    check_no_drafter_cache(cache, "dflash")
    return DFlashDrafter(draft_model, dflash_step_cost(draft_model, target.model))
