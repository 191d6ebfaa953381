"""Statistics of one speculative generation."""

from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass
class SpecStats:
    """Counters and timings, filled in place by the generation loop.

    Times are seconds. ``draft_time`` and ``verify_time`` are measured only
    when profiling (an extra sync per round separates them); otherwise the
    device work of a round shows up as ``sync_time``, the time the host
    waits at the round's single sync.
    """

    method: str = "draft"
    num_draft_tokens: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prompt_time: float = 0.0
    generation_time: float = 0.0
    sync_time: float = 0.0
    draft_time: Optional[float] = None
    verify_time: Optional[float] = None
    accepted_per_round: List[int] = field(default_factory=list)
    drafted_per_round: List[int] = field(default_factory=list)
    tree_sizes: List[int] = field(default_factory=list)
    # Self-speculation: the blocks the draft skips.
    skipped_layers: Optional[List[int]] = None
    auto_rounds: Optional[dict] = (
        None  # rounds each method ran under --speculative auto
    )
    # The round cost model measured during the run (costs.MeasuredCosts.report).
    cost_model: Optional[dict] = None
    # How the method adapted to the model (e.g. a tree verified as chains).
    note: Optional[str] = None

    def add_round(self, drafted: int, accepted: int, forwards: int, tree=False):
        """Count one round: ``drafted`` draft tokens (tree nodes), ``accepted``
        of them kept, ``forwards`` draft forwards, and one target forward."""
        self.rounds += 1
        self.target_forwards += 1
        self.draft_forwards += forwards
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        if drafted > 0:
            self.accepted_per_round.append(accepted)
            self.drafted_per_round.append(drafted)
            if tree:
                self.tree_sizes.append(drafted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        if not self.target_forwards:
            return 0.0
        return self.generated_tokens / self.target_forwards

    @property
    def generation_tps(self) -> float:
        if self.generation_time <= 0:
            return 0.0
        return self.generated_tokens / self.generation_time

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time > 0 else 0.0

    @property
    def host_time(self) -> float:
        """Time of the generation not spent waiting on the device."""
        device = self.sync_time + (self.draft_time or 0.0) + (self.verify_time or 0.0)
        return max(self.generation_time - device, 0.0)

    @property
    def mean_accepted_depth(self) -> float:
        if not self.accepted_per_round:
            return 0.0
        return sum(self.accepted_per_round) / len(self.accepted_per_round)

    def as_dict(self) -> dict:
        """A JSON-ready dict with the derived rates included."""
        out = asdict(self)
        for name in (
            "acceptance_rate",
            "tokens_per_target_forward",
            "generation_tps",
            "prompt_tps",
            "host_time",
            "mean_accepted_depth",
        ):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        """A one-line human-readable summary."""
        if self.method == "none":
            return f"Speculation: none ({self.generated_tokens} tokens, 1 per target forward)"
        parts = [
            f"Speculation: {self.method}",
            f"{self.rounds} rounds",
            f"{self.accepted_tokens}/{self.draft_tokens} draft tokens accepted "
            f"({100 * self.acceptance_rate:.1f}%)",
            f"{self.tokens_per_target_forward:.2f} tokens per target forward",
        ]
        if self.tree_sizes:
            parts.append(
                f"mean tree size {sum(self.tree_sizes) / len(self.tree_sizes):.1f}, "
                f"mean accepted depth {self.mean_accepted_depth:.2f}"
            )
        if self.note:
            parts.append(self.note)
        if self.draft_time is not None:
            parts.append(
                f"draft {self.draft_time:.2f}s, verify {self.verify_time:.2f}s, "
                f"host {self.host_time:.2f}s"
            )
        return ", ".join(parts)
