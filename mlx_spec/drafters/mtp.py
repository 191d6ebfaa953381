"""``--speculative mtp``: the checkpoint's own MTP layer drafts chains.

The MTP module (:mod:`mlx_spec.mtp`) keeps a KV cache of *pairs*
``(h_t, x_{t+1})``: the target's final normed hidden state at position
``t`` and the token that followed. Its output at the last pair predicts
the token after the pending one, i.e. the first draft token; fed its own
output and that token, it drafts the next, and so on (the model cards'
chained use of one MTP layer).

No target forward is added: the engine captures the target's features
from every forward it runs anyway (the prompt's prefill and each
verification, see :mod:`mlx_spec.features`) and hands over the rows of
the accepted tokens. The next round first feeds those pairs (one MTP
forward), then drafts. Draft entries never stay in the MTP cache: each
commit trims it back to the pairs built from the target's features. The
cache covers this call's prompt and output (not earlier turns of a reused
prompt cache), like the EAGLE head's.

Chains only: the target families with MTP layers (hybrid linear-attention
Qwen models, MLA DeepSeek) verify trees as chains anyway. Under sampling
each draft is drawn from the MTP's processed law and the engine's
rejection sampling keeps the target's law exact.
"""

from typing import List

import mlx.core as mx

from ..costs import DRAFT_LATENCY, target_bytes, weight_bytes
from ..features import FINAL, output_layer
from ..mtp import MTPHead
from .base import Proposal, RoundState, check_no_drafter_cache, empty_proposal
from .fit import check_drafter, drafter_kind
from .pairs import FeaturePairs


class MTPContext(FeaturePairs):
    """The MTP cache of pairs and the target features it has not read yet.

    Pair ``j`` sits at cache slot (and rope position) ``j``.
    """

    def feed(self, feats: mx.array, tokens: mx.array, state: RoundState) -> mx.array:
        emb = self.head.embed(tokens)
        if self.module.mask_first and state.base + self.fed == 0:
            # DeepSeek's MTP zeroes the embedding at absolute position 0.
            emb = mx.concatenate([mx.zeros_like(emb[:1]), emb[1:]])
        return self.module(feats[None], emb[None], self.cache)

    def step(self, g: mx.array, token: mx.array) -> mx.array:
        """One draft step on the pair ``(g, token)``: ``(1, 1, H)``."""
        return self.module(g, self.head.embed(token.reshape(1, 1)), self.cache)


class MTPDrafter:
    """Chains from a checkpoint's MTP layer (see the module docstring).

    Args:
        context: The MTP module and its cache (:class:`MTPContext`).
        step_cost: Modelled cost of one MTP step relative to a target step.
    """

    name = "mtp"
    is_tree = False
    feature_layers = (FINAL,)

    def __init__(self, context: MTPContext, step_cost: float = DRAFT_LATENCY):
        self.context = context
        self.step_cost = step_cost
        self.note = None

    def add_features(self, features, rows):
        self.context.add_features(features, rows)

    def prefill(self, tokens, step_size: int):
        """Nothing to do: the prompt's features arrive after the target's prefill."""

    def chain_only(self):
        """Already chains."""

    def propose(self, state: RoundState, size: int) -> Proposal:
        g = self.context.catch_up(state)
        if g is None or size < 1:
            return empty_proposal()
        tokens, laws = [], []
        for i in range(size):
            logits = self.context.head.logits(g.reshape(1, -1))
            token, law = state.choose(logits, tokens)
            mx.async_eval(token)
            tokens.append(token)
            laws.append(law)
            if i + 1 < size:
                g = self.context.step(g, token)
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        return Proposal(mx.concatenate(tokens), logprobs, forwards=len(tokens))

    def commit(self, state, proposal, num_accepted: int, path=None):
        self.context.rewind()

    def caches(self) -> List:
        return []  # the MTP cache is rebuilt from each call's prompt

    def sync(self, seq, base: int):
        """Nothing to keep in the caller's prompt cache."""

    def release(self):
        self.context.rewind()


def mtp_step_cost(head: MTPHead, target) -> float:
    """Modelled cost of an MTP step: bytes read relative to a target step, plus latency."""
    read = weight_bytes(head.module) + weight_bytes(output_layer(target))
    return DRAFT_LATENCY + read / max(target_bytes(target), 1)


def check_mtp_head(draft_model, target) -> MTPHead:
    """The MTP head passed as ``draft_model``, checked against the target."""
    check_drafter("mtp", drafter_kind(draft_model))
    if draft_model.target is not target.model:
        raise ValueError(
            "the MTP layer was loaded for another model object; load it with "
            "mlx_spec.load_mtp(path, model) for the model you generate with."
        )
    return draft_model


def make_mtp_drafter(config, target, draft_model, cache, kv, vocab_size):
    """``--speculative mtp``: chains from the checkpoint's MTP layer."""
    head = check_mtp_head(draft_model, target)
    check_no_drafter_cache(cache, "mtp")
    return MTPDrafter(MTPContext(head), step_cost=mtp_step_cost(head, target.model))
