"""The fixed cost model of a round, in units of one 1-token target forward.

The engine prices rounds with it instead of wall time when sampling, so a
seed always gives the same text; drafters use it to pick a draft length.
"""

from typing import Sequence, Tuple

VERIFY_SLOPE = 0.1  # each extra verified token adds 10% of a 1-token forward
DRAFT_LATENCY = 0.05  # a draft forward's fixed cost (launch and dispatch)


def static_round_cost(step_cost: float, forwards: int, width: int) -> float:
    """Modelled cost of a round: draft forwards plus one verify of ``width``."""
    return forwards * step_cost + 1.0 + VERIFY_SLOPE * (width - 1)


def chain_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens of a round verifying ``gamma`` drafts: ``sum alpha**i``."""
    return sum(alpha**i for i in range(gamma + 1))


def expected_speedup(alpha: float, gamma: int, step_cost: float) -> float:
    """Tokens per round over its modelled cost, for γ drafts each accepted
    (independently) with rate ``alpha``."""
    return chain_tokens(alpha, gamma) / static_round_cost(step_cost, gamma, gamma + 1)


def best_gamma(
    alpha: float, step_cost: float, gammas: Sequence[int]
) -> Tuple[int, float]:
    """The draft length in ``gammas`` with the highest expected speedup, and it."""
    scored = ((g, expected_speedup(alpha, g, step_cost)) for g in gammas)
    return max(scored, key=lambda pair: pair[1])


def weight_bytes(model) -> int:
    """Bytes of a model's parameters (what one forward reads).

    A model that shares a large table it only indexes (a distilled draft on
    its target's embedding) says what it reads with ``read_bytes()``.
    """
    from mlx.utils import tree_flatten

    if hasattr(model, "read_bytes"):
        return int(model.read_bytes())
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def model_step_cost(draft_model, target_model) -> float:
    """A draft forward's modelled cost: weight bytes read, relative, plus latency."""
    ratio = weight_bytes(draft_model) / max(weight_bytes(target_model), 1)
    return DRAFT_LATENCY + ratio
