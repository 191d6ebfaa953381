"""A request's row in continuous batching: what it asks for (:class:`SeqSpec`),
what each step gives back (:class:`SeqOutput`), and its state between rounds
(:class:`Row`), with one adaptive controller per arm, made and fed as the
single-sequence engine's planner does (:mod:`mlx_spec.planner`)."""

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import mlx.core as mx

from ..adaptive import AdaptiveController
from ..config import SpecConfig
from ..drafters.lookup import MatchRates
from ..drafters.ngram import NGramIndex
from ..planner import chain_controller
from ..sampling import SamplingParams
from ..stats import SpecStats


@dataclass
class SeqSpec:
    """One request, as the batch needs it.

    Attributes:
        prompt: Every prompt token (those in ``cache`` included).
        config: The method (``config.method``: ``"none"``, ``"lookup"``,
          ``"draft"`` or ``"auto"``) and its options; ``config.max_tokens``
          bounds the output.
        params: The sampling law (``None``: greedy).
        cache: A prompt cache (target caches, then the draft's for a method
          that uses the draft model) holding ``prompt[:cached]``.
        cached: Prompt tokens ``cache`` holds.
        stop_tokens: Tokens that end the output (EOS).
        isolation: Neither read nor add to the cross-request index.
        top_logprobs: Keep each token's logprobs row for the caller.
        index_from: Tokens of ``prompt`` the cross-request index has seen
          (served from the prompt cache); default: ``cached``.
    """

    prompt: List[int]
    config: SpecConfig
    params: Optional[SamplingParams] = None
    cache: Optional[List[Any]] = None
    cached: int = 0
    stop_tokens: FrozenSet[int] = frozenset()
    isolation: bool = False
    top_logprobs: int = 0
    index_from: Optional[int] = None

    @property
    def method(self) -> str:
        return self.config.method


@dataclass
class SeqOutput:
    """What one step produced for one request.

    Attributes:
        uid: The request.
        progress: ``(processed, total)`` prompt tokens (prefill steps only).
        tokens: Tokens emitted this round, in order.
        logprobs: The target's log-probability of each.
        kinds: ``"accepted"``, ``"recovered"``, ``"bonus"`` or ``"target"``.
        rows: Each token's full logprobs ``(V,)`` (``top_logprobs`` only).
        finish_reason: ``"stop"`` (EOS, the last token) or ``"length"``.
        cache, cache_tokens: For a finished request, its prompt cache and
          the tokens it holds (to store in the prompt cache).
        info: For a finished request, :func:`seq_info`.
    """

    uid: int
    progress: Optional[Tuple[int, int]] = None
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    kinds: List[str] = field(default_factory=list)
    rows: Optional[List[mx.array]] = None
    finish_reason: Optional[str] = None
    cache: Optional[List[Any]] = None
    cache_tokens: Optional[List[int]] = None
    info: Optional[dict] = None


class Row:
    """A request's state inside the batch."""

    def __init__(
        self, uid, spec: SeqSpec, uses_draft, stats: SpecStats, draft_step, price
    ):
        self.uid = uid
        self.spec = spec
        self.config = spec.config
        self.uses_draft = uses_draft
        self.seq: List[int] = list(spec.prompt)
        self.prompt_size = len(spec.prompt)
        self.generated = 0
        self.stats = stats
        # A request that ran alone before: its counts go on from there.
        self.base_generated = stats.generated_tokens
        self.base_time = stats.generation_time
        self.single: Optional[List[Any]] = None  # prompt cache during prefill
        self.prefilled = 0
        self.held = 0  # prompt tokens its prompt cache held
        self.draft_len = 0  # tokens its draft-batch row holds
        self.local = NGramIndex(
            ngram_min=spec.config.ngram_min, ngram_max=spec.config.ngram_max
        )
        self.controllers: Dict[str, AdaptiveController] = {}
        self.rates = MatchRates()  # lookup's first-token acceptance by match length
        self.match = 0  # this round's lookup match length
        self.draft_step = draft_step  # a draft-model step, in target forwards
        self.price = price  # a batch round's cost (RowPlanner.price)
        self.batch = 1  # rows in its current round
        self.started = 0.0
        self.batch_rows = 0  # sum of batch sizes over its rounds
        self.cross_drafted = 0
        self.cross_accepted = 0
        # This round's plan.
        self.arm: Optional[str] = None
        self.size = 0
        self.proposal: List[int] = []
        self.from_index = False
        self.cap = 0  # drafts it can verify this round

    def controller(self, arm: str) -> AdaptiveController:
        """The arm's controller, made as the single-sequence planner makes
        one, priced as its batch's rounds are (:meth:`round_cost`). No arm
        pauses by itself (γ >= 1): plain rounds are the batch's choice (its
        width, or draft-model rows sitting out), as they are ``auto``'s alone."""
        if arm not in self.controllers:
            step = self.draft_step if arm == "draft" else 0.0
            alone = self.spec.method != "auto"
            controller = chain_controller(self.config, step, pauses=False, alone=alone)
            controller.pricer = lambda most: [
                self.round_cost(arm, gamma) for gamma in range(most + 1)
            ]
            self.controllers[arm] = controller
        return self.controllers[arm]

    def round_cost(self, arm: str, gamma: int) -> float:
        """A round of its batch where every row verifies ``gamma`` drafts of
        ``arm`` (0: a plain round)."""
        steps = gamma if arm == "draft" else 0
        return self.price(arm if gamma else None, steps, self.batch, gamma + 1)

    def record(self, accepted: int):
        """Feed this round's outcome to its arm's controller, with its
        expected cost (the pricer, not the clock, sets its γ)."""
        if self.arm is None:
            return  # a plain round tells the arms nothing
        if self.arm == "lookup":
            self.rates.observe(self.match, accepted, self.size)
        cost = self.round_cost(self.arm, self.size)
        self.controller(self.arm).update(self.size, accepted, 0.0, cost, draft_steps=0)


def seq_info(s: Row) -> dict:
    rounds = max(s.stats.rounds, 1)
    return {
        "batched": True,
        "mean_batch_size": s.batch_rows / rounds,
        "cross_request_drafted": s.cross_drafted,
        "cross_request_accepted": s.cross_accepted,
        "isolation": s.spec.isolation,
    }
