"""``--speculative draft``: a small draft model run autoregressively, γ steps per round."""

from typing import List

import mlx.core as mx

from ..costs import DRAFT_LATENCY, model_step_cost
from ..models import CachedModel, cache_offset
from .base import (
    Proposal,
    RoundState,
    align_vocab,
    confident,
    empty_proposal,
    subset_choice,
    vocab_subset,
)
from .fit import check_drafter, drafter_kind


class ModelDrafter:
    """A small draft model run autoregressively, γ steps per round.

    With ``p_min > 0`` drafting stops early once the draft's top probability
    falls below ``p_min`` (like llama.cpp's ``--draft-p-min``); that check
    costs one host sync per draft token, so it is off by default.
    """

    name = "draft"
    note = None  # set when a tree request falls back to this chain drafter
    # After plain rounds the draft catches up on the tokens it missed, in the
    # first forward of its next round.
    catches_up = True

    def __init__(
        self,
        draft: CachedModel,
        vocab_size: int,
        p_min: float = 0.0,
        step_cost: float = DRAFT_LATENCY,
    ):
        self.draft = draft
        self.vocab_size = vocab_size
        self.p_min = p_min
        self.step_cost = step_cost
        # Greedy drafts and tree children of a distilled draft are chosen over
        # its vocabulary subset's columns, not at the target's width.
        self._subset = vocab_subset(getattr(draft, "model", None))

    def prefill(self, tokens: mx.array, step_size: int):
        self.draft.prefill(tokens, step_size)

    def pending(self, state: RoundState) -> List[int]:
        """Tokens of ``seq`` the draft cache has not seen yet (1 or 2 while it
        drafts every round, more after rounds it sat out)."""
        return state.seq[self.draft.offset - state.base :]

    def _last_logits(self, inputs: mx.array, subset=None) -> mx.array:
        """Feed ``inputs`` ``(L,)``: the last one's logits, ``(1, C)`` over
        ``subset``'s columns (the draft's vocabulary subset) or ``(1, V)``."""
        if subset is None:
            return align_vocab(self.draft(inputs)[-1:], self.vocab_size)
        return self.draft(inputs, head=subset.subset_logits)[-1:]

    def drafts_nothing(self, gamma: int, seq_len: int) -> bool:
        """A γ-0 round is a plain step, whatever the context (see :meth:`propose`)."""
        return gamma < 1

    def propose(self, state: RoundState, gamma: int) -> Proposal:
        if gamma < 1:
            return empty_proposal()  # a plain round: the draft cache waits
        self.draft.mark()  # commit may rewind back to here
        pending = self.pending(state)
        inputs = mx.array(pending, mx.uint32)
        tokens, laws = [], []
        subset = self._subset if state.subset_choice_ok else None
        for i in range(gamma):
            logits = self._last_logits(inputs, subset)
            if subset is None:
                token, law = state.choose(logits, tokens)
            else:
                column, law = subset_choice(state, logits)
                token = subset.to_target(column)
            mx.async_eval(token)
            tokens.append(token)
            laws.append(law)
            inputs = token
            if i + 1 < gamma and not confident(logits, self.p_min):
                break
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        columns = None if logprobs is None or subset is None else subset.token_ids
        return Proposal(
            mx.concatenate(tokens),
            logprobs,
            forwards=len(tokens),
            columns=columns,
            caught_up=len(pending) - 1,
        )

    is_tree = False

    def commit(
        self, state: RoundState, proposal: Proposal, num_accepted: int, path=None
    ):
        # The draft cache holds seq + d_1..d_{γ-1}; d_1..d_n stay valid.
        keep = len(state.seq) + min(num_accepted, max(proposal.size - 1, 0))
        self.draft.trim_to(state.base + keep)

    def caches(self) -> List:
        """The caches this drafter keeps in the caller's ``prompt_cache``."""
        return self.draft.cache

    def sync(self, seq: List[int], base: int):
        """Make the draft cache hold exactly ``seq`` (used when generation ends)."""
        self.draft.trim_to(base + len(seq))
        missing = seq[self.draft.offset - base :]
        if missing:
            self.draft(mx.array(missing, mx.uint32))
            mx.eval([c.state for c in self.draft.cache])

    def release(self):
        """Stop journaling the draft cache (generation ended)."""
        self.draft.release()


def make_model_drafter(config, target, draft_model, cache, kv, vocab_size):
    check_drafter(config.method, drafter_kind(draft_model))
    if cache is not None:
        if not cache:
            raise ValueError(
                "prompt_cache holds only the target's caches; build it as "
                "make_prompt_cache(model) + make_prompt_cache(draft_model)."
            )
        held = cache_offset(cache)  # None: recurrent layers only, non-empty
        if held is not None and held != target.offset:
            raise ValueError(
                f"prompt_cache is inconsistent: the target caches hold {target.offset} "
                f"tokens and the draft caches {held}."
            )
    draft = CachedModel(draft_model, cache, kv, "draft model")
    draft.assume_length(target.offset)
    return ModelDrafter(
        draft,
        vocab_size,
        p_min=config.draft_p_min,
        step_cost=model_step_cost(draft_model, target.model),
    )
