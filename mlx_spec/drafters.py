"""Drafters: everything that proposes tokens for the target to verify.

A drafter has one small interface (as vLLM's proposers do):

- ``prefill(tokens)`` sees the new prompt tokens;
- ``propose(round, gamma)`` returns a :class:`Proposal`, lazily evaluated;
- ``commit(round, num_accepted)`` keeps what the accepted tokens made valid;
- ``sync(seq_tokens)`` brings any cache up to date when generation ends.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

import mlx.core as mx

from .models import CachedModel, KVSettings, cache_offset


@dataclass
class Proposal:
    """Draft tokens for one round.

    Attributes:
        tokens: Proposed tokens, shape ``(γ,)``.
        logprobs: The processed law each token was drawn from, ``(γ, V)``;
          ``None`` for deterministic proposals (point masses).
        forwards: Draft-model forward passes spent.
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

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class RoundState:
    """What a drafter may read about the sequence at the start of a round.

    Attributes:
        seq: Every token of this call (prompt and generated); the last one
          is the pending input of the target.
        base: Cache offset before this call's prompt (earlier turns).
        choose: Maps processed-by-processors logprobs ``(1, V)`` and the draft
          history to ``(token (1,), law (1, V) or None)``.
    """

    seq: List[int]
    base: int
    choose: Callable


# A fixed cost model, in units of one 1-token target forward; the engine uses
# it instead of wall time when sampling, so a seed always gives the same text.
VERIFY_SLOPE = 0.1  # each extra verified token adds 10% of a 1-token forward
DRAFT_LATENCY = 0.05  # a draft forward's fixed cost (launch and dispatch)


def static_round_cost(step_cost: float, forwards: int, width: int) -> float:
    """Modelled cost of a round: draft forwards plus one verify of ``width``."""
    return forwards * step_cost + 1.0 + VERIFY_SLOPE * (width - 1)


def expected_speedup(alpha: float, gamma: int, step_cost: float) -> float:
    """Tokens per round over its modelled cost, for γ drafts each accepted
    (independently) with rate ``alpha``."""
    tokens = sum(alpha**i for i in range(gamma + 1))
    return tokens / static_round_cost(step_cost, gamma, gamma + 1)


def best_gamma(
    alpha: float, step_cost: float, gammas: Sequence[int]
) -> Tuple[int, float]:
    """The draft length in ``gammas`` with the highest expected speedup, and it."""
    scored = ((g, expected_speedup(alpha, g, step_cost)) for g in gammas)
    return max(scored, key=lambda pair: pair[1])


def weight_bytes(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def model_step_cost(draft_model, target_model) -> float:
    """A draft forward's modelled cost: weight bytes read, relative, plus latency."""
    ratio = weight_bytes(draft_model) / max(weight_bytes(target_model), 1)
    return DRAFT_LATENCY + ratio


def confident(logits: mx.array, p_min: float) -> bool:
    """Whether the draft's top probability in ``logits`` ``(1, V)`` is >= ``p_min``.

    Like llama.cpp's ``--draft-p-min``; it costs one host sync, so ``p_min``
    0 (off) skips it.
    """
    if p_min <= 0:
        return True
    return mx.exp(logits.max() - mx.logsumexp(logits)).item() >= p_min


def align_vocab(logits: mx.array, vocab_size: int) -> mx.array:
    """Cut or pad (with ``-inf``) the last axis to ``vocab_size``."""
    width = logits.shape[-1]
    if width == vocab_size:
        return logits
    if width > vocab_size:
        return logits[..., :vocab_size]
    pad = mx.full((*logits.shape[:-1], vocab_size - width), -mx.inf, logits.dtype)
    return mx.concatenate([logits, pad], axis=-1)


class ModelDrafter:
    """A small draft model run autoregressively, γ steps per round.

    With ``p_min > 0`` drafting stops early once the draft's top probability
    falls below ``p_min`` (like llama.cpp's ``--draft-p-min``); that check
    costs one host sync per draft token, so it is off by default.
    """

    name = "draft"

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

    def prefill(self, tokens: mx.array, step_size: int):
        self.draft.prefill(tokens, step_size)

    def pending(self, state: RoundState) -> List[int]:
        """Tokens of ``seq`` the draft cache has not seen yet (1 or 2)."""
        return state.seq[self.draft.offset - state.base :]

    def propose(self, state: RoundState, gamma: int) -> Proposal:
        inputs = mx.array(self.pending(state), mx.uint32)
        tokens, laws = [], []
        for i in range(gamma):
            logits = align_vocab(self.draft(inputs)[-1:], self.vocab_size)
            token, law = state.choose(logits, tokens)
            mx.async_eval(token)
            tokens.append(token)
            laws.append(law)
            inputs = token
            if i + 1 < gamma and not confident(logits, self.p_min):
                break
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        return Proposal(mx.concatenate(tokens), logprobs, forwards=len(tokens))

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


def _make_model_drafter(config, target, draft_model, cache, kv, vocab_size):
    if draft_model is None:
        raise ValueError(
            f"speculative method '{config.method}' needs a draft model (--draft-model)."
        )
    if cache is not None:
        if not cache:
            raise ValueError(
                "prompt_cache holds only the target's caches; build it as "
                "make_prompt_cache(model) + make_prompt_cache(draft_model)."
            )
        if cache_offset(cache) != target.offset:
            raise ValueError(
                f"prompt_cache is inconsistent: the target caches hold {target.offset} "
                f"tokens and the draft caches {cache_offset(cache)}."
            )
    draft = CachedModel(draft_model, cache, kv, "draft model")
    return ModelDrafter(
        draft,
        vocab_size,
        p_min=config.draft_p_min,
        step_cost=model_step_cost(draft_model, target.model),
    )


# method name -> factory(config, target, draft_model, cache, kv, vocab_size).
# ``cache`` is the part of the caller's prompt_cache after the target's layers.
DRAFTER_FACTORIES = {"draft": _make_model_drafter}


def _make_tree_drafter(*args):
    from .tree_drafter import make_tree_drafter

    return make_tree_drafter(*args)


DRAFTER_FACTORIES["tree"] = _make_tree_drafter


def make_drafter(
    config,
    target: CachedModel,
    draft_model,
    cache: Optional[List],
    kv: KVSettings,
    vocab_size: int,
):
    """Build the drafter of ``config.method``."""
    if config.method == "none":
        raise ValueError(
            "method 'none' is plain decoding, which speculative_generate_step does "
            "not run; use mlx_spec.stream_generate or mlx_lm's generate_step."
        )
    try:
        factory = DRAFTER_FACTORIES[config.method]
    except KeyError:
        available = ", ".join(["none", *DRAFTER_FACTORIES])
        raise ValueError(
            f"speculative method '{config.method}' is not available; use one of: {available}."
        ) from None
    return factory(config, target, draft_model, cache, kv, vocab_size)


def _make_lookup_drafter(config, target, draft_model, cache, kv, vocab_size):
    from .lookup import make_lookup_drafter

    return make_lookup_drafter(config, target, draft_model, cache, kv, vocab_size)


def _make_self_drafter(config, target, draft_model, cache, kv, vocab_size):
    from .self_spec import make_self_drafter

    return make_self_drafter(config, target, draft_model, cache, kv, vocab_size)


def _make_auto_drafter(*args):
    from .auto import make_auto_drafter

    return make_auto_drafter(*args)


DRAFTER_FACTORIES["auto"] = _make_auto_drafter
DRAFTER_FACTORIES["lookup"] = _make_lookup_drafter
DRAFTER_FACTORIES["self"] = _make_self_drafter
