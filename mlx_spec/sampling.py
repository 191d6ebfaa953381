"""The sampling law that acceptance must preserve.

``mlx_lm.sample_utils.make_sampler`` filters the log-probabilities (top-p,
min-p, top-k, in that order, all on the temperature-1 values) and then draws
``categorical(filtered / temp)``. :func:`processed_logprobs` returns the
log of exactly that distribution, so rejection sampling can compare the
target's law p with the draft's law q token by token.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .limits import greedy_limit

Sampler = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class SamplingParams:
    """The parameters of one ``make_sampler`` law (``temp == 0`` is greedy)."""

    temp: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    min_tokens_to_keep: int = 1

    def __post_init__(self):
        # A temperature too small to represent samples as its limit, greedy.
        object.__setattr__(self, "temp", greedy_limit(self.temp))

    @property
    def greedy(self) -> bool:
        return self.temp == 0


def top_p_or_off(top_p: float) -> float:
    """mlx_lm's ``top_p``: 0 and 1 both turn top-p off (returned as 1.0)."""
    return top_p if 0 < top_p < 1 else 1.0


def normalize(logits: mx.array) -> mx.array:
    """Log-softmax over the last axis, as mlx_lm does it."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def sampling_logits(logprobs: mx.array, params: SamplingParams) -> mx.array:
    """What ``make_sampler``'s categorical draws from: the filtered logprobs
    over the temperature, unnormalised (a draw needs no normalisation).

    Args:
        logprobs: Normalised log-probabilities, shape ``(..., V)``; with top-p
          off, logits (normalised only up to a per-row constant) will do.
        params: A non-greedy sampling law.

    Returns:
        Logits of the same shape; filtered tokens get ``-inf``.
    """
    vocab = logprobs.shape[-1]
    if 0 < params.top_p < 1.0:
        logprobs = apply_top_p(logprobs, params.top_p)
    if params.min_p != 0.0:
        # Keeping more tokens than there are columns keeps them all (a draft's
        # vocabulary subset can be that narrow).
        keep = min(params.min_tokens_to_keep, vocab)
        logprobs = apply_min_p(logprobs, params.min_p, keep)
    if 0 < params.top_k < vocab:
        logprobs = apply_top_k(logprobs, params.top_k)
    return logprobs * (1.0 / params.temp)


def processed_logprobs(logprobs: mx.array, params: SamplingParams) -> mx.array:
    """Log-probabilities of the distribution ``make_sampler`` draws from.

    Args:
        logprobs: Normalised log-probabilities, shape ``(..., V)``.
        params: A non-greedy sampling law.

    Returns:
        Normalised log-probabilities of the same shape; filtered tokens get
        ``-inf``.
    """
    return normalize(sampling_logits(logprobs, params))


def filter_input(logits: mx.array, params: SamplingParams) -> mx.array:
    """``logits`` ``(..., V)`` as the filters may read them: normalised if top-p
    (which reads probabilities) is on, else as they are (the other filters
    and the temperature commute with a per-row shift)."""
    return normalize(logits) if 0 < params.top_p < 1.0 else logits


def law_of_logits(logits: mx.array, params: SamplingParams) -> mx.array:
    """:func:`processed_logprobs` of ``normalize(logits)``, normalising once
    unless top-p is on.

    Args:
        logits: ``(..., V)`` logits, or logprobs (any per-row shift).
        params: A non-greedy sampling law.
    """
    return processed_logprobs(filter_input(logits, params), params)


def make_sampler(
    temp: float = 0.0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
) -> Sampler:
    """A sampler with the law of ``mlx_lm.sample_utils.make_sampler``.

    The returned function carries its :class:`SamplingParams` as
    ``sampler.sampling_params``, which lets speculative decoding use exact
    rejection sampling instead of the weaker sample-and-match rule.
    """
    params = SamplingParams(temp, top_p, min_p, top_k, min_tokens_to_keep)

    def sampler(logprobs: mx.array) -> mx.array:
        if params.greedy:
            return mx.argmax(logprobs, axis=-1)
        return mx.random.categorical(sampling_logits(logprobs, params))

    sampler.sampling_params = params
    return sampler


def sampling_params_of(sampler: Optional[Sampler]) -> Optional[SamplingParams]:
    """The law a sampler declares, or ``None`` for an opaque callable.

    mlx_lm's own ``greedy_sampler`` (what its ``make_sampler(0.0)`` returns)
    is recognised as greedy.
    """
    from mlx_lm.sample_utils import greedy_sampler

    if sampler is greedy_sampler:
        return SamplingParams()
    return getattr(sampler, "sampling_params", None)
