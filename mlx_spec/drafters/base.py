"""The interface every drafter shares, and what a round tells it.

A drafter has one small interface (as vLLM's proposers do):

- ``prefill(tokens, step_size)`` sees the new prompt tokens;
- ``propose(state, size)`` returns a :class:`Proposal`, lazily evaluated;
- ``commit(state, proposal, num_accepted, path)`` keeps what the accepted
  tokens made valid;
- ``caches()`` lists the caches it keeps in the caller's ``prompt_cache``;
- ``sync(seq, base)`` brings those caches up to date when generation ends.

Optional hooks the engine looks for: ``add_history(tokens)`` (earlier turns),
``release()`` (generation ended: stop journaling the drafter's caches),
``note`` (a line on how the method adapted to the model, for the stats),
``chain_only()`` (logits processors need chains), ``report(stats)``,
``drafts_nothing(size, seq_len)`` (a round it knows drafts nothing),
``acceptance_estimate`` and ``step_cost`` (the adaptive controller's start),
and ``select()`` / ``observe(emitted, cost)`` for a drafter that picks one
of several arms per round (``auto``).
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Tuple, Union

import mlx.core as mx

from ..sampling import SamplingParams, law_of_logits


@dataclass
class Proposal:
    """Draft tokens for one round.

    Attributes:
        tokens: Proposed tokens, shape ``(γ,)``.
        logprobs: The processed law each token was drawn from, ``(γ, V)``,
          or ``(γ, C)`` over ``columns``; ``None`` for deterministic
          proposals (point masses).
        forwards: Draft-model forward passes spent.
        caught_up: Tokens beyond the first that the first of them read.
        parents: ``None`` for a chain; for a tree, ``(N,)`` parent of each
          node in topological order, ``-1`` for children of the root (the
          last accepted token). Tree children must be chosen without the
          target's help (top-k, static shapes, lookup) and be distinct among
          siblings.
    """

    tokens: mx.array
    logprobs: Optional[mx.array]
    forwards: int = 0
    parents: Optional[Union[List[int], mx.array]] = None
    # Optional ``(K,)`` int32 the drafter wants back on the host after the
    # round's sync (e.g. which tree nodes its cache holds): ``sync_values``.
    sync_data: Optional[mx.array] = None
    sync_values: Optional[List[int]] = None
    # Seconds of one-off work in this round (a layer search), which the
    # adaptive controller leaves out of the round's cost.
    setup_time: float = 0.0
    # Tokens beyond the first that the first draft forward read: the draft
    # catching up on tokens it missed (plain rounds, other arms' rounds).
    caught_up: int = 0
    # Optional ``(C,)`` distinct target ids of the columns of ``logprobs``: a
    # draft's law over its vocabulary subset (zero elsewhere), never widened.
    columns: Optional[mx.array] = None

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def empty_proposal() -> Proposal:
    """A round that drafts nothing (a plain target step)."""
    return Proposal(mx.array([], mx.uint32), None)


@dataclass
class RoundState:
    """What a drafter may read about the sequence at the start of a round.

    Attributes:
        seq: Every token of this call (prompt and generated); the last one
          is the pending input of the target.
        base: Cache offset before this call's prompt (earlier turns).
        choose: Maps the draft's logits ``(1, V)`` (or logprobs) and the draft
          history to ``(token (1,), law (1, V) or None)``.
        argmax: ``choose`` is the argmax of the raw logits (greedy decoding,
          no logits processors): a drafter may take it over its own
          vocabulary subset instead.
        params: The law ``choose`` draws from for rejection sampling (no
          logits processors), else ``None``: a drafter may draw over its own
          vocabulary subset instead (see :func:`subset_choice`).
    """

    seq: List[int]
    base: int
    choose: Callable
    argmax: bool = False
    params: Optional[SamplingParams] = None

    @property
    def subset_choice_ok(self) -> bool:
        """Whether :func:`subset_choice` may stand in for ``choose``."""
        return self.argmax or self.params is not None


class Drafter(Protocol):
    """What the engine calls on every drafter (see the module docstring)."""

    name: str
    is_tree: bool
    step_cost: float

    def prefill(self, tokens: mx.array, step_size: int) -> None: ...

    def propose(self, state: RoundState, size: int) -> Proposal: ...

    def commit(
        self,
        state: RoundState,
        proposal: Proposal,
        num_accepted: int,
        path: Optional[List[int]] = None,
    ) -> None: ...

    def caches(self) -> List: ...

    def sync(self, seq: List[int], base: int) -> None: ...


def confident(logits: mx.array, p_min: float) -> bool:
    """Whether the draft's top probability in ``logits`` ``(1, V)`` is >= ``p_min``.

    Like llama.cpp's ``--draft-p-min``; it costs one host sync, so ``p_min``
    0 (off) skips it.
    """
    if p_min <= 0:
        return True
    return mx.exp(logits.max() - mx.logsumexp(logits)).item() >= p_min


def subset_choice(
    state: RoundState, logits: mx.array
) -> Tuple[mx.array, Optional[mx.array]]:
    """``state.choose`` over a draft's vocabulary subset: ``logits`` ``(1, C)``
    holds the subset's columns (the law is zero elsewhere).

    Returns:
        ``(column (1,), law (1, C) or None)``: the argmax (greedy), or a draw
        from ``state.params``'s law, which filters and rescales the subset's
        columns exactly as it would at full width (the other columns carry
        no mass); a proposal carries it with its columns
        (:attr:`Proposal.columns`), never widened to the target's vocabulary.
    """
    if state.argmax:
        return mx.argmax(logits, axis=-1), None
    law = law_of_logits(logits, state.params)
    return mx.random.categorical(law), law


def align_vocab(logits: mx.array, vocab_size: int) -> mx.array:
    """Cut or pad (with ``-inf``) the last axis to ``vocab_size``."""
    width = logits.shape[-1]
    if width == vocab_size:
        return logits
    if width > vocab_size:
        return logits[..., :vocab_size]
    pad = mx.full((*logits.shape[:-1], vocab_size - width), -mx.inf, logits.dtype)
    return mx.concatenate([logits, pad], axis=-1)


def vocab_subset(model):
    """A draft's output layer over a subset of the vocabulary (a distilled
    draft's ``VocabHead``: ``subset_logits``, ``to_target``), or ``None``."""
    head = getattr(model, "lm_head", None)
    return head if hasattr(head, "subset_logits") else None


def check_no_drafter_cache(cache, method: str):
    """Draft-free methods keep no cache of their own in ``prompt_cache``."""
    if cache:
        raise ValueError(
            f"--speculative {method} keeps no draft cache, but prompt_cache holds "
            f"{len(cache)} entries beyond the target's layers; build it as "
            "make_prompt_cache(model)."
        )
