"""``--speculative auto``: pick the best method online.

Prompt lookup drafts for free, so a round whose context has a match worth
proposing (see :class:`~mlx_spec.drafters.lookup.MatchRates`) copies it;
while lookup rounds earn less than the best other choice, only a match
whose first token is usually accepted counts.
Every other round is one of the remaining arms or a plain step (``plain``):
with a draft model the draft chain and the draft tree; with a head, its arms
(EAGLE tree and chain, Medusa, or the checkpoint's MTP layer); without
either, self-speculation. Each of those gets one warm-up round (a tree arm
once a chain arm has beaten plain rounds), then the best measured worth
wins: tokens per unit of cost, the exponentially decayed sum of emitted
tokens over that of the rounds' cost. An occasional round explores, but
never right after a round that kept all its drafts (no arm could have done
better there), and an arm left out for a while gets another round (after
twice as long each time that round leaves it behind). The
cost is wall time under greedy decoding and a fixed cost model when
sampling (so a seed always gives the same text);
see ``planner.RoundPlanner``. Every arm is exact on its own and the choice
depends only on past rounds and the context, so the output stays exact.
"""

import random
from typing import Dict, List, Optional, Tuple

from ..models import CachedModel
from .base import Proposal, RoundState
from .lookup import MIN_ACCEPTANCE, make_lookup_drafter
from .model import make_model_drafter

EXPLORE = 0.05
WARMUP_ROUNDS = 1
# An arm left out this many rounds gets one more: its worth may have changed
# since (a single unlucky warm-up round would otherwise keep it out for good).
REPROBE_AFTER = 16
# Each re-probe that leaves its arm behind doubles that arm's wait, up to
# this; an arm that leads again waits REPROBE_AFTER.
MAX_REPROBE_AFTER = 256
# While lookup rounds earn less than the best other choice, a match length is
# proposed only if its first token is accepted at least this often.
LOSING_LOOKUP_BAR = 0.5
EMA = 0.3
SEED = 0
LOOKUP, PLAIN = "lookup", "plain"


class AutoDrafter:
    """Chooses one drafter per round: lookup on a match, else by measured worth.

    Args:
        arms: Drafters by name; an arm named ``"lookup"`` drafts whenever its
          context has a match worth proposing, and runs the plain rounds.
        config: The :class:`~mlx_spec.config.SpecConfig`.
    """

    name = "auto"
    is_tree = False

    def __init__(self, arms: Dict[str, object], config, seed: int = SEED):
        self.arms = dict(arms)
        self.lookup = self.arms.get(LOOKUP)
        # The choices of a round without a match: plain first (it costs nothing extra).
        others = [name for name in self.arms if name != LOOKUP]
        self.choices = ([PLAIN] if self.lookup is not None else []) + others
        self.config = config
        self.rate: Dict[str, Optional[float]] = {}
        self.tries: Dict[str, int] = {}
        self.totals: Dict[str, Tuple[float, float]] = {}  # decayed (tokens, cost)
        self.rounds = 0
        self.last_round: Dict[str, int] = {}  # the round each arm last ran
        self.wait: Dict[str, int] = {}  # rounds an arm left out waits for a re-probe
        self.reprobing = False  # this round re-probes its arm
        self.rng = random.Random(seed)
        self.current: Optional[str] = None
        self.kept_all = False  # the last round accepted every draft it made
        self.chosen: List[str] = []
        self.picked: Optional[str] = None  # a pick made before its round (plain_next)

    def _arm(self, name: str):
        return self.lookup if name in (LOOKUP, PLAIN) else self.arms[name]

    def _pick(self) -> str:
        """The arm of a round without a lookup match."""
        self.reprobing = False
        if self.kept_all and self.current in self.choices:
            return self.current
        for name in self.choices:
            if self.tries.get(name, 0) < WARMUP_ROUNDS and self._worth_trying(name):
                return name
        for name in self.choices:
            waited = self.rounds - self.last_round.get(name, 0)
            stale = waited >= self.wait.get(name, REPROBE_AFTER)
            if REPROBE_AFTER and stale and self._worth_trying(name):
                self.reprobing = True
                return name
        best = max(self.choices, key=lambda name: self.rate.get(name) or 0.0)
        if len(self.choices) > 1 and self.rng.random() < EXPLORE:
            # Explore the others in proportion to their measured worth.
            others = [name for name in self.choices if name != best]
            weights = [max(self.rate.get(name) or 0.0, 1e-9) for name in others]
            return self.rng.choices(others, weights)[0]
        return best

    def _worth_trying(self, name: str) -> bool:
        """A tree grows from a chain's drafts and verifies more tokens: it is
        tried once some chain arm has beaten plain rounds."""
        if not self._arm(name).is_tree or PLAIN not in self.choices:
            return True
        chains = [c for c in self.choices if c != PLAIN and not self._arm(c).is_tree]
        best = max((self.rate.get(c) or 0.0 for c in chains), default=0.0)
        return best > (self.rate.get(PLAIN) or 0.0)

    def _lookup_drafts(self, seq: List[int]) -> bool:
        """Whether lookup has a match worth proposing on ``seq``: a stricter one
        while its measured worth is below the best other choice's."""
        rates = getattr(self.lookup, "rates", None)
        if rates is not None:
            worth = self.rate.get(LOOKUP)
            best = max((self.rate.get(name) or 0.0) for name in self.choices)
            losing = worth is not None and worth < best
            rates.min_acceptance = LOSING_LOOKUP_BAR if losing else MIN_ACCEPTANCE
        return self.lookup.will_draft(seq)

    def select(self, seq: Optional[List[int]] = None):
        """Choose this round's arm for the context ``seq`` (the engine sizes its proposal)."""
        picked, self.picked = self.picked, None
        if self.lookup is not None and seq is not None and self._lookup_drafts(seq):
            self.current = LOOKUP
        else:
            self.current = picked or self._pick()
        self.chosen.append(self.current)
        return self._arm(self.current)

    @property
    def plain_arm(self):
        """The drafter of a plain round (lookup, drafting nothing)."""
        return self.lookup

    def plain_next(self, seq: List[int]) -> bool:
        """After a plain round on ``seq``: whether the next round is plain too,
        decided before its token is read, so the engine can queue its step.

        Yes when lookup has no match worth proposing on ``seq`` and the pick
        of a round without a match is a plain round; a match found on the new
        token then drafts a round later.
        """
        if self.current != PLAIN or self.lookup is None:
            return False
        if self._lookup_drafts(seq):
            return False
        self.picked = self._pick()
        if self.picked != PLAIN:
            return False  # the next round drafts with this pick (or lookup)
        self.picked = None
        self.current = PLAIN
        self.chosen.append(PLAIN)
        return True

    def prefill(self, tokens, step_size: int):
        # The chain and tree arms share one draft cache: prefill it once.
        done = set()
        for arm in self.arms.values():
            shared = id(getattr(arm, "draft", arm))
            if shared not in done:
                done.add(shared)
                arm.prefill(tokens, step_size)

    def propose(self, state: RoundState, size: int) -> Proposal:
        if self.current is None:
            self.select(state.seq)
        return self._arm(self.current).propose(state, size)

    def commit(self, state, proposal, num_accepted: int, path=None):
        self._arm(self.current).commit(state, proposal, num_accepted, path)

    def chain_only(self):
        """Drop tree proposals (logits processors need a chain)."""
        self.arms = {name: arm for name, arm in self.arms.items() if not arm.is_tree}
        for arm in self.arms.values():
            if hasattr(arm, "chain_only"):
                arm.chain_only()
        self.choices = [c for c in self.choices if c == PLAIN or c in self.arms]
        self.rate, self.tries, self.totals = {}, {}, {}
        self.last_round, self.wait = {}, {}

    def observe(self, emitted: int, cost: float, drafted: int = 0):
        """Feed back one round: tokens emitted, its cost (seconds or units) and
        the number of tokens it drafted."""
        name = self.current
        self.tries[name] = self.tries.get(name, 0) + 1
        self.rounds += 1
        self.last_round[name] = self.rounds
        self.kept_all = drafted > 0 and emitted == drafted + 1
        # Worth is decayed tokens over decayed cost, not an average of per-round
        # rates: a queued plain step moves time between neighbouring rounds.
        tokens, spent = self.totals.get(name, (0.0, 0.0))
        keep = 1 - EMA
        tokens, spent = keep * tokens + emitted, keep * spent + cost
        self.totals[name] = (tokens, spent)
        self.rate[name] = tokens / max(spent, 1e-9)
        self._update_wait(name)

    def _update_wait(self, name: str):
        """Back off re-probing an arm that stays behind; reset it once it leads."""
        others = [self.rate.get(c) or 0.0 for c in self.choices if c != name]
        if self.rate[name] >= max(others, default=0.0):
            self.wait.pop(name, None)
        elif self.reprobing and name != LOOKUP:
            wait = 2 * self.wait.get(name, REPROBE_AFTER)
            self.wait[name] = min(wait, MAX_REPROBE_AFTER)
        self.reprobing = False

    def add_history(self, tokens):
        for arm in self.arms.values():
            if hasattr(arm, "add_history"):
                arm.add_history(tokens)

    @property
    def feature_layers(self):
        """The target features the head arms read (one head: one set), if any."""
        for arm in self.arms.values():
            if getattr(arm, "feature_layers", None):
                return arm.feature_layers
        return None

    def add_features(self, features, rows):
        # Head arms read every round's features, whichever arm drafted it.
        seen = set()
        for arm in self.arms.values():
            shared = id(getattr(arm, "context", arm))
            if hasattr(arm, "add_features") and shared not in seen:
                seen.add(shared)
                arm.add_features(features, rows)

    def caches(self) -> List:
        # Model-based arms share one draft cache: report it once.
        seen, out = set(), []
        for arm in self.arms.values():
            for c in arm.caches():
                if id(c) not in seen:
                    seen.add(id(c))
                    out.append(c)
        return out

    def sync(self, seq, base: int):
        for arm in self.arms.values():
            arm.sync(seq, base)  # idempotent, so a shared cache is fine

    def release(self):
        for arm in self.arms.values():
            if hasattr(arm, "release"):
                arm.release()

    def report(self, stats):
        names = ([LOOKUP] if self.lookup is not None else []) + self.choices
        counts = {name: self.chosen.count(name) for name in names}
        stats.auto_rounds = counts
        for arm in self.arms.values():
            if hasattr(arm, "report"):
                arm.report(stats)


def make_auto_drafter(config, target: CachedModel, draft_model, cache, kv, vocab_size):
    arms: Dict[str, object] = {}
    if getattr(draft_model, "is_head", False):
        arms.update(_head_arms(config, target, draft_model, cache, kv, vocab_size))
        lookup = make_lookup_drafter(config, target, None, None, kv, vocab_size)
        lookup.chain_only()
        arms["lookup"] = lookup
    elif draft_model is not None:
        from ..attention.tree import prepare_tree_model, tree_unsupported
        from .tree import TreeDrafter

        chain = make_model_drafter(config, target, draft_model, cache, kv, vocab_size)
        arms["draft"] = chain
        tree_ok = tree_unsupported(target.model, target.cache) is None
        tree_ok = tree_ok and tree_unsupported(draft_model, chain.draft.cache) is None
        if tree_ok:
            prepare_tree_model(target.model)
            arms["tree"] = TreeDrafter(
                chain.draft,
                vocab_size,
                top_k=config.tree_top_k,
                depth=config.tree_depth,
                choices=config.tree_choices,
            )
            arms["tree"].step_cost = chain.step_cost
        lookup = make_lookup_drafter(config, target, None, None, kv, vocab_size)
        lookup.chain_only()
        arms["lookup"] = lookup
    else:
        from .self_spec import make_self_drafter

        arms["lookup"] = make_lookup_drafter(
            config, target, None, cache, kv, vocab_size
        )
        if len(target.model.layers) >= 2:
            arms["self"] = make_self_drafter(
                config, target, None, cache, kv, vocab_size
            )
    return AutoDrafter(arms, config)


def _head_arms(config, target, head, cache, kv, vocab_size) -> Dict[str, object]:
    """A head's arms: EAGLE tree and chain, Medusa, or the checkpoint's MTP layer."""
    if head.kind == "mtp":
        from .mtp import make_mtp_drafter

        return {"mtp": make_mtp_drafter(config, target, head, cache, kv, vocab_size)}
    if head.kind == "eagle":
        from .eagle import make_eagle_arms

        return make_eagle_arms(config, target, head, cache, kv, vocab_size)
    if head.kind == "dflash":
        from .published.dflash import make_dflash_drafter

        return {
            "dflash": make_dflash_drafter(config, target, head, cache, kv, vocab_size)
        }
    from .medusa import make_medusa_drafter

    return {"medusa": make_medusa_drafter(config, target, head, cache, kv, vocab_size)}
