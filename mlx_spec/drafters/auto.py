"""``--speculative auto``: pick the best method online.

With a draft model the arms are the draft chain, the draft tree, prompt
lookup alone, and prompt lookup falling back to the draft chain when the
context has no strong match (:class:`LookupThenDraft`); with a head, its
arms (EAGLE tree and chain, Medusa, or the checkpoint's MTP layer) and
prompt lookup; without either,
prompt lookup and self-speculation. Each round uses one arm; an arm's
worth is its tokens per unit of cost (an exponential moving average of
emitted tokens over the round's cost). Prompt lookup, which costs no more
than a plain step, is tried first; each other arm gets one warm-up round,
and an occasional round explores, but never right after a round that kept
all its drafts (no arm could have done better there), so a long run of
lookup hits is not interrupted. The cost is wall time under greedy decoding and
a fixed cost model when sampling (so a seed always gives the same text); see
``planner.RoundPlanner``. Every arm is exact on its own and the choice
depends only on past rounds, so the output stays exact.
"""

import random
from typing import Dict, List, Optional

from ..models import CachedModel
from .base import Proposal, RoundState
from .lookup import make_lookup_drafter
from .model import make_model_drafter

EXPLORE = 0.05
WARMUP_ROUNDS = 1
EMA = 0.3
SEED = 0


class AutoDrafter:
    """Chooses one drafter per round by measured tokens per second."""

    name = "auto"
    is_tree = False

    def __init__(self, arms: Dict[str, object], config, seed: int = SEED):
        # Lookup first: a round without a match is a plain step, so trying it costs nothing.
        self.arms = dict(sorted(arms.items(), key=lambda item: item[0] != "lookup"))
        self.config = config
        self.rate: Dict[str, Optional[float]] = {name: None for name in arms}
        self.tries: Dict[str, int] = {name: 0 for name in arms}
        self.rng = random.Random(seed)
        self.current: Optional[str] = None
        self.kept_all = False  # the last round accepted every draft it made
        self.chosen: List[str] = []

    def _pick(self) -> str:
        if self.kept_all:
            return self.current
        for name in self.arms:
            if self.tries[name] < WARMUP_ROUNDS:
                return name
        best = max(self.arms, key=lambda name: self.rate[name] or 0.0)
        if len(self.arms) > 1 and self.rng.random() < EXPLORE:
            # Explore the others in proportion to their measured worth.
            others = [name for name in self.arms if name != best]
            weights = [max(self.rate[name] or 0.0, 1e-9) for name in others]
            return self.rng.choices(others, weights)[0]
        return best

    def prefill(self, tokens, step_size: int):
        # The chain and tree arms share one draft cache: prefill it once.
        done = set()
        for arm in self.arms.values():
            shared = id(getattr(arm, "draft", arm))
            if shared not in done:
                done.add(shared)
                arm.prefill(tokens, step_size)

    def select(self):
        """Choose this round's arm (the engine sizes its proposal)."""
        self.current = self._pick()
        self.chosen.append(self.current)
        return self.arms[self.current]

    def propose(self, state: RoundState, size: int) -> Proposal:
        if self.current is None:
            self.select()
        return self.arms[self.current].propose(state, size)

    def commit(self, state, proposal, num_accepted: int, path=None):
        self.arms[self.current].commit(state, proposal, num_accepted, path)

    def chain_only(self):
        """Drop tree proposals (logits processors need a chain)."""
        self.arms = {name: arm for name, arm in self.arms.items() if not arm.is_tree}
        for arm in self.arms.values():
            if hasattr(arm, "chain_only"):
                arm.chain_only()
        self.rate = {name: None for name in self.arms}
        self.tries = {name: 0 for name in self.arms}

    def observe(self, emitted: int, cost: float, drafted: int = 0):
        """Feed back one round: tokens emitted, its cost (seconds or units) and
        the number of tokens it drafted."""
        name = self.current
        self.tries[name] += 1
        self.kept_all = drafted > 0 and emitted == drafted + 1
        rate = emitted / max(cost, 1e-9)
        old = self.rate[name]
        self.rate[name] = rate if old is None else (1 - EMA) * old + EMA * rate

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
        counts = {name: self.chosen.count(name) for name in self.arms}
        stats.auto_rounds = counts
        for arm in self.arms.values():
            if hasattr(arm, "report"):
                arm.report(stats)


class LookupThenDraft:
    """Prompt lookup when the context has a strong match, else the draft model.

    A round proposes lookup's continuation (free to draft) when its n-gram
    match is at least ``min_match`` tokens long, and the draft model's
    chain otherwise. The draft cache catches up on skipped tokens the next
    time it drafts.
    """

    name = "lookup+draft"
    is_tree = False

    def __init__(self, lookup, chain, min_match: int = 2):
        self.lookup = lookup
        self.chain = chain
        self.min_match = min_match
        self.used = chain

    @property
    def draft(self):
        """The draft model's cache, shared with the other model arms."""
        return self.chain.draft

    @property
    def step_cost(self) -> float:
        return self.used.step_cost

    def prefill(self, tokens, step_size: int):
        self.chain.prefill(tokens, step_size)

    def propose(self, state: RoundState, gamma: int) -> Proposal:
        proposal = self.lookup.propose(state, gamma)
        if proposal.size and self.lookup.index.last_match_len >= self.min_match:
            self.used = self.lookup
            return proposal
        self.used = self.chain
        return self.chain.propose(state, gamma)

    def commit(self, state, proposal, num_accepted: int, path=None):
        self.used.commit(state, proposal, num_accepted, path)

    def add_history(self, tokens):
        self.lookup.add_history(tokens)

    def chain_only(self):
        self.lookup.chain_only()

    def caches(self) -> List:
        return self.chain.caches()

    def sync(self, seq, base: int):
        self.chain.sync(seq, base)

    def release(self):
        self.chain.release()


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
        arms["lookup+draft"] = LookupThenDraft(lookup, chain)
        # Lookup alone: a round without a match is a plain step, so auto has
        # an arm that costs no more than plain decoding when the draft is weak.
        alone = make_lookup_drafter(config, target, None, None, kv, vocab_size)
        alone.chain_only()
        arms["lookup"] = alone
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
    from .medusa import make_medusa_drafter

    return {"medusa": make_medusa_drafter(config, target, head, cache, kv, vocab_size)}
