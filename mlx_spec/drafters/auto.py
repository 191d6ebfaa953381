"""``--speculative auto``: pick the drafter and its size each round.

Prompt lookup drafts without a forward, so a round whose context has a match
copies it when the match is expected to earn more than the best other
choice: its acceptance by depth for its match length
(:class:`~mlx_spec.drafters.lookup.MatchRates`) over the measured cost of
verifying it, at the length that earns most, which it drafts. Every other
round is a plain step (``plain``) or one of the remaining arms: with a draft
model the draft chain and the draft tree; with a head, its arms (EAGLE tree
and chain, Medusa, or the checkpoint's MTP layer); without either,
self-speculation. Each is priced by its expected tokens per unit of
cost at its best size: expected accepted tokens from the arm's acceptance
by depth, over the round's cost from one cost model fitted to every
round's measured cost (:class:`~mlx_spec.costs.MeasuredCosts`: a draft
step per arm, verification by width). The best wins, so auto falls back to
plain rounds as soon as no arm pays. The first round is plain (it prices
plain rounds, against which every arm is priced), and a plain round is
measured again after ``PROBE_AFTER`` rounds behind an arm, twice as long
after each one that stays behind. An arm's first round drafts one token. A
chain arm that sits a round out ages its acceptance evidence
(:meth:`~mlx_spec.adaptive.AdaptiveController.rest`), so one left out for
low acceptance comes back, the later the more rounds said it loses; a tree
left behind is probed after ``PROBE_AFTER`` rounds, twice as long after each
probe whose draft is rejected. The cost is wall time under greedy decoding
and the fixed cost model when sampling (so a seed always gives the same text); see
``planner.RoundPlanner``. Every arm is exact on its own and the choice
depends only on past rounds and the context, so the output stays exact.
"""

from typing import Dict, List, Optional

from ..models import CachedModel
from .base import Proposal, RoundState
from .lookup import make_lookup_drafter
from .model import make_model_drafter

# A tree left behind is probed again after this many rounds; each probe whose
# draft is rejected doubles its wait, up to MAX_PROBE_AFTER, and an arm that
# leads again waits PROBE_AFTER. Plain rounds behind a drafting arm are
# measured again on the same schedule (a chain left behind comes back as its
# idle rounds age its evidence, see AdaptiveController.rest).
PROBE_AFTER = 16
MAX_PROBE_AFTER = 512
# A tree's first round waits until a chain arm has run this many rounds in a
# row (and is expected to beat plain rounds on what they measured, not on its
# prior: a chain back from a rest for a round or two does not count).
TREE_AFTER = 4
LOOKUP, PLAIN = "lookup", "plain"


class AutoDrafter:
    """Chooses one drafter per round: lookup on a match, else the best expected rate.

    Args:
        arms: Drafters by name; an arm named ``"lookup"`` drafts whenever its
          context has a match worth proposing (it then sizes its own draft),
          and runs the plain rounds.
        config: The :class:`~mlx_spec.config.SpecConfig`.
    """

    name = "auto"
    is_tree = False

    def __init__(self, arms: Dict[str, object], config):
        self.arms = dict(arms)
        self.lookup = self.arms.get(LOOKUP)
        # The choices of a round without a match: plain first (it costs nothing extra).
        others = [name for name in self.arms if name != LOOKUP]
        self.choices = ([PLAIN] if self.lookup is not None else []) + others
        self.config = config
        self.estimates = None  # the planner: plain_rate, arm_rate, round_cost
        self._rates = None  # (rounds, expected_rates()) as last priced
        self.tries: Dict[str, int] = {}
        self.rounds = 0
        self.last_round: Dict[str, int] = {}  # the round each arm last ran
        self.streak = (None, 0)  # the arm of the last rounds, and how many in a row
        self.wait: Dict[str, int] = {}  # rounds an arm left behind waits for a probe
        self.probing = False  # this round probes its arm with one drafted token
        self.current: Optional[str] = None
        self.kept_all = False  # the last round accepted every draft it made
        self.chosen: List[str] = []
        self.picked: Optional[str] = None  # a pick made before its round (plain_next)

    def use_estimates(self, estimates):
        """Price the choices with ``estimates``: ``plain_rate()``,
        ``arm_rate(arm)`` (``None`` while unpriced) and ``round_cost(arm, gamma)``,
        tokens per unit of cost and costs from one measured cost model."""
        self.estimates = estimates

    def _arm(self, name: str):
        return self.lookup if name in (LOOKUP, PLAIN) else self.arms[name]

    def expected_rates(self) -> Dict[str, Optional[float]]:
        """Expected tokens per unit of cost of each choice at its best size
        (they change only when a round is recorded: kept until the next)."""
        if self.estimates is None:
            raise ValueError("auto needs the engine's estimates (use_estimates)")
        if self._rates is None or self._rates[0] != self.rounds:
            self._rates = (self.rounds, self._price_choices())
        return self._rates[1]

    def _price_choices(self) -> Dict[str, Optional[float]]:
        return {
            name: (
                self.estimates.plain_rate()
                if name == PLAIN
                else self.estimates.arm_rate(self.arms[name])
            )
            for name in self.choices
        }

    def _pick(self) -> str:
        """The arm of a round without a lookup match.

        The best expected rate wins (plain rounds as soon as no arm beats
        them); the first round is plain, and plain rounds are measured again
        now and then; a chain's first round drafts one token, so trying
        costs little; a chain left behind returns as its evidence ages, a
        tree left behind is probed; a tree, unpriced until it runs, gets its
        first round once a chain that ran TREE_AFTER rounds in a row beats
        plain rounds.
        """
        self.probing = False
        if self.kept_all and self.current in self.choices:
            return self.current
        if PLAIN in self.choices and not self.tries.get(PLAIN):
            return PLAIN  # the first round prices plain rounds, which price every arm
        rates = self.expected_rates()
        priced = {name: r for name, r in rates.items() if r is not None}
        best = max(priced, key=priced.get) if priced else self.choices[0]
        for name in self.choices:
            if name == PLAIN or self.tries.get(name, 0) > 0:
                continue
            if rates[name] is not None or self._worth_trying(name, rates):
                self.probing = True
                return name
        for name in self.choices:
            if name in (PLAIN, best) or not self.tries.get(name):
                continue
            if not self._arm(name).is_tree:
                continue  # a chain comes back as its idle rounds age its evidence
            waited = self.rounds - self.last_round.get(name, 0)
            if waited >= self.wait.get(name, PROBE_AFTER):
                self.probing = True
                return name
        if best != PLAIN and PLAIN in self.choices:
            # Plain rounds price every arm: measure one now and then, as
            # rarely as drafting keeps beating them.
            waited = self.rounds - self.last_round.get(PLAIN, 0)
            if waited >= self.wait.get(PLAIN, PROBE_AFTER):
                return PLAIN
        return best

    def idle_arms(self) -> List:
        """The arms this round's choice passed over (a lookup round passes
        over none: it ran on a match, not for want of a better arm)."""
        if self.current == LOOKUP:
            return []
        names = [c for c in self.choices if c not in (PLAIN, self.current)]
        return [self.arms[name] for name in names]

    def _worth_trying(self, name: str, rates) -> bool:
        """A tree grows from a chain's drafts and verifies more tokens: it is
        tried once a chain arm that has run TREE_AFTER rounds in a row is
        expected to beat plain rounds."""
        if PLAIN not in rates:
            return True
        chain, streak = self.streak
        if chain in (None, PLAIN, LOOKUP) or self._arm(chain).is_tree:
            return False
        return streak >= TREE_AFTER and (rates.get(chain) or 0.0) > rates[PLAIN]

    @property
    def sizes_itself(self) -> bool:
        """Whether this round's arm picks its own draft length (lookup, by its
        match's length), up to the planner's largest."""
        return self.current == LOOKUP

    def _lookup_drafts(self, seq: List[int]) -> bool:
        """Whether lookup has a match on ``seq`` expected to earn more than the
        best other choice, with its rounds priced by the measured costs."""
        rates = getattr(self.lookup, "rates", None)
        if rates is not None and self.estimates is not None:
            longest = self.config.max_draft_tokens
            cost = self.estimates.round_cost
            rates.costs = [cost(self.lookup, g) for g in range(longest + 1)]
            rates.bar = max(r for r in self.expected_rates().values() if r is not None)
        return self.lookup.will_draft(seq)

    def select(self, seq: Optional[List[int]] = None):
        """Choose this round's arm for the context ``seq`` (the engine sizes its proposal)."""
        picked, self.picked = self.picked, None
        if self.lookup is not None and seq is not None and self._lookup_drafts(seq):
            self.current, self.probing = LOOKUP, False
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
        self._rates = None

    def observe(self, emitted: int, cost: float, drafted: int = 0):
        """Feed back one round: tokens emitted, its cost (seconds or units) and
        the number of tokens it drafted (the planner has priced it already)."""
        name = self.current
        self.tries[name] = self.tries.get(name, 0) + 1
        self.rounds += 1
        self.last_round[name] = self.rounds
        self.kept_all = drafted > 0 and emitted == drafted + 1
        last, streak = self.streak
        self.streak = (name, streak + 1 if name == last else 1)
        self._update_wait(name, accepted=emitted > 1)

    def _update_wait(self, name: str, accepted: bool):
        """Back off probing an arm that stays behind: each probe whose draft
        is rejected doubles its wait (each plain round measured behind an arm
        doubles plain's); reset it once the arm leads."""
        if name == LOOKUP:
            return
        rates = self.expected_rates()
        if name == PLAIN:
            best = max((r for r in rates.values() if r is not None), default=0.0)
            if rates[PLAIN] >= best:
                self.wait.pop(PLAIN, None)
            else:
                wait = self.wait.get(PLAIN, PROBE_AFTER // 2)
                self.wait[PLAIN] = min(2 * wait, MAX_PROBE_AFTER)
            return
        mine = rates.get(name)
        others = [r for c, r in rates.items() if c != name and r is not None]
        if mine is not None and mine >= max(others, default=0.0):
            self.wait.pop(name, None)
        elif name not in self.wait:
            self.wait[name] = PROBE_AFTER
        elif self.probing and not accepted:
            self.wait[name] = min(2 * self.wait[name], MAX_PROBE_AFTER)
        self.probing = False

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
        from .self_spec import make_self_drafter, self_unsupported

        arms["lookup"] = make_lookup_drafter(
            config, target, None, cache, kv, vocab_size
        )
        if self_unsupported(target.model) is None:  # not on pipeline stages
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
