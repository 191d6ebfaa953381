"""``auto``'s measured cost model and its per-round choice of arm and size.

The choice is simulated with scripted arms and a fake clock: each round
costs what a synthetic machine says and accepts what a synthetic drafter
does, so no test reads real time.
"""

import random
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from law_checks import CHI2_9_999, stream_statistics
from mlx_lm.generate import generate_step

from mlx_spec import SpecConfig, stream_generate
from mlx_spec.costs import MeasuredCosts


def cpu_like(arm, forwards, width):
    """A 1-token step of 60 ms, +6 ms per verified token, draft steps of 9 ms."""
    switch = 0.004 if arm else 0.0
    return 0.060 + 0.006 * (width - 1) + 0.009 * forwards + switch


def metal_like(arm, forwards, width):
    """Verifying 8 tokens costs about one: 20 ms flat, draft steps of 3 ms."""
    switch = 0.001 if arm else 0.0
    return 0.020 + 0.0001 * (width - 1) + 0.003 * forwards + switch


def test_measured_costs_recover_each_part_from_round_times():
    """Plain, lookup, chain and tree rounds together separate the 1-token step,
    the verification slope and each arm's draft step and switch cost."""
    truth = dict(step=0.050, slope=0.004, draft=0.007, switch=0.003, lookup=0.001)
    costs = MeasuredCosts({"draft": 0.2, "lookup": 0.0})
    rng = random.Random(0)
    for _ in range(300):
        kind = rng.choice(["plain", "lookup", "draft", "tree"])
        if kind == "plain":
            costs.observe(None, 0, 1, truth["step"])
            continue
        if kind == "lookup":
            g = rng.randint(1, 8)
            t = truth["step"] + truth["slope"] * g + truth["lookup"]
            costs.observe("lookup", 0, g + 1, t)
            continue
        # A tree verifies more nodes than it runs draft forwards.
        forwards = rng.randint(1, 6)
        width = forwards + 1 if kind == "draft" else 2 * forwards + 1
        t = truth["step"] + truth["slope"] * (width - 1)
        costs.observe("draft", forwards, width, t + truth["draft"] * forwards + 0.003)
    assert costs.step_time() == pytest.approx(truth["step"], rel=0.02)
    assert costs.verify_time(8) == pytest.approx(0.050 + 7 * 0.004, rel=0.02)
    assert costs.draft_step_time("draft") == pytest.approx(truth["draft"], rel=0.05)
    report = costs.report()
    assert report["verify_by_width"][8] == pytest.approx(0.078 / 0.050, rel=0.02)
    assert report["draft_step"] == {"draft": pytest.approx(0.14, rel=0.1)}
    assert report["rounds"] == 300


def test_measured_costs_price_catch_up_per_token_not_per_drafting_round():
    """A draft that sat rounds out reads the tokens it missed in its next
    first forward: the fit books that per caught-up token, so a steady
    drafting round (which catches up on none) is priced without it."""
    truth = dict(step=0.050, slope=0.004, draft=0.007, catch_up=0.004)
    costs = MeasuredCosts({"draft": 0.2})
    rng = random.Random(0)
    behind = 0  # tokens the draft has not read
    for _ in range(300):
        if rng.random() < 0.4:  # a plain round: the draft falls behind
            costs.observe(None, 0, 1, truth["step"])
            behind += 1
            continue
        g = rng.randint(1, 4)
        t = truth["step"] + truth["slope"] * g + truth["draft"] * g
        costs.observe("draft", g, g + 1, t + truth["catch_up"] * behind, behind)
        behind = rng.randint(0, 1)  # steady: 1 after a round that kept all
    steady = [truth["step"] + (truth["slope"] + truth["draft"]) * g for g in range(5)]
    assert costs.chain_times("draft", 1, 4) == pytest.approx(steady, rel=0.03)
    report = costs.report()
    assert report["switch"]["draft"] == pytest.approx(0.0, abs=0.02)
    assert report["catch_up"]["draft"] == pytest.approx(0.08, rel=0.1)


def test_measured_costs_start_from_the_fixed_model_and_follow_a_flat_gpu():
    """Before rounds of several widths are seen, widths are priced like the
    fixed model scaled to the first round; where verifying 8 tokens costs
    about one, the measured slope goes to about zero."""
    from mlx_spec.costs import VERIFY_SLOPE

    costs = MeasuredCosts({"draft": 0.1})
    costs.observe(None, 0, 1, 0.020)
    assert costs.verify_time(5) == pytest.approx(0.020 * (1 + 4 * VERIFY_SLOPE))
    assert costs.draft_step_time("draft") == pytest.approx(0.002)
    for g in [1, 2, 4, 6, 8] * 20:
        costs.observe(None, 0, 1, metal_like(None, 0, 1))
        costs.observe("draft", g, g + 1, metal_like("draft", g, g + 1))
    # A chain's widths grow with its forwards: a few rounds timed after
    # drafting tell the draft step from the verification slope.
    for g in (1, 4):
        costs.observe_drafts("draft", g, 0.003 * g)
    assert costs.report()["verify_by_width"][8] < 1.1
    assert costs.draft_step_time("draft") == pytest.approx(0.003, rel=0.15)


def _drafting_rounds(costs, truth, rounds, rng):
    """``rounds`` of auto's drafting arms (chain with its drafting timed now and
    then, tree and lookup), each with a fixed switch cost."""
    for i in range(rounds):
        kind = rng.choice(["draft", "lookup", "tree"])
        if kind == "lookup":
            g = rng.randint(2, 8)
            t = truth["step"] + truth["slope"] * g + truth["switch"]
            costs.observe("lookup", 0, g + 1, t)
            continue
        forwards = rng.randint(1, 4)
        width = forwards + 1 if kind == "draft" else 2 * forwards + 1
        if kind == "draft" and i % 8 == 0:
            costs.observe_drafts("draft", forwards, truth["draft"] * forwards)
        t = truth["step"] + truth["slope"] * (width - 1) + truth["switch"]
        costs.observe(kind, forwards, width, t + truth["draft"] * forwards)


def test_measured_costs_price_a_plain_round_by_its_mean_not_the_first_one():
    """On a CPU a plain round queued ahead runs its forward in the round that
    queued it (``mx.async_eval`` returns once most of it ran): the first round
    costs two steps and the second almost none. The prior is set in units of
    the plain rounds' mean, so the fitted step, slope and draft step read as
    the machine's (a prior twice too large held the step up and the rest down)."""
    truth = dict(step=0.050, slope=0.004, draft=0.0045, switch=0.006)
    costs = MeasuredCosts({"draft": 0.09, "tree": 0.09, "lookup": 0.0})
    costs.observe(None, 0, 1, 2 * truth["step"])
    costs.observe(None, 0, 1, 0.0)
    _drafting_rounds(costs, truth, 80, random.Random(0))
    report = costs.report()
    assert costs.step_time() == pytest.approx(truth["step"], rel=0.03)
    assert report["verify_by_width"][8] == pytest.approx(1 + 7 * 0.08, rel=0.03)
    assert report["draft_step"]["draft"] == pytest.approx(0.09, rel=0.1)


def test_measured_costs_keep_plain_rounds_while_auto_drafts():
    """Each kind of round forgets only its own evidence: hundreds of drafting
    rounds after the plain ones leave the step where plain rounds put it
    and each arm's switch apart from it (forgotten with every round, the
    step would take a share of the switches, which price plain rounds
    dearer than they are)."""
    truth = dict(step=0.050, slope=0.004, draft=0.0045, switch=0.010)
    costs = MeasuredCosts({"draft": 0.09, "tree": 0.09, "lookup": 0.0})
    for _ in range(16):
        costs.observe(None, 0, 1, truth["step"])
    _drafting_rounds(costs, truth, 400, random.Random(1))
    assert costs.step_time() == pytest.approx(truth["step"], rel=0.02)
    switch = costs.report()["switch"]
    assert switch == pytest.approx({a: 0.2 for a in switch}, abs=0.04)


class _Arm:
    is_tree = False

    def __init__(self, name, step_cost):
        self.name, self.step_cost = name, step_cost


class _Tree(_Arm):
    is_tree = True


class _NoMatch(_Arm):
    """Lookup without matches: every round it runs is a plain one."""

    def __init__(self):
        super().__init__("lookup", 0.0)

    def will_draft(self, seq):
        return False


def simulate(machine, acceptance, rounds=300, tree=False, seed=0, monkeypatch=None):
    """Run ``rounds`` planned rounds on a fake clock; return ``[(arm, size, accepted)]``.

    ``acceptance(round)`` is the chance that each draft token is accepted
    given the ones before it; ``machine(arm, forwards, width)`` a round's time.
    """
    from mlx_spec import planner as planner_mod
    from mlx_spec.drafters.auto import AutoDrafter

    arms = {"draft": _Arm("draft", 0.1), "lookup": _NoMatch()}
    if tree:
        arms["tree"] = _Tree("tree", 0.1)
    auto = AutoDrafter(arms, None)
    clock = [0.0]
    monkeypatch.setattr(planner_mod.time, "perf_counter", lambda: clock[0])
    planner = planner_mod.RoundPlanner(SpecConfig(method="auto"), auto, timed=True)
    rng = random.Random(seed)
    log = []
    for r in range(rounds):
        is_tree, size = planner.begin_round([1, 2, 3])
        name = auto.current
        drafted = 0 if name == "plain" else size
        # A tree's nodes spread over about half as many depths.
        depth = (drafted + 1) // 2 if is_tree else drafted
        accepted = 0
        while accepted < depth and rng.random() < acceptance(r):
            accepted += 1
        forwards = depth if name != "plain" else 0
        proposal = SimpleNamespace(size=drafted, forwards=forwards, setup_time=0.0)
        cost = machine(name if drafted else None, forwards, drafted + 1)
        if planner.times_drafts(proposal):
            planner.drafts_took(proposal, cost - machine(None, 0, drafted + 1))
        planner.end_round(size, proposal, accepted)
        clock[0] += cost
        log.append((name, drafted, accepted))
    return log, planner


def speed(log, machine):
    """Tokens per second of a simulated run, relative to plain rounds."""
    seconds = sum(machine(n if s else None, s, s + 1) for n, s, _ in log)
    return sum(a + 1 for _, _, a in log) / seconds * machine(None, 0, 1)


def test_auto_runs_plain_rounds_when_acceptance_is_low(monkeypatch):
    for seed in range(3):
        log, _ = simulate(
            cpu_like, lambda r: 0.1, tree=True, seed=seed, monkeypatch=monkeypatch
        )
        drafting = [(name, size) for name, size, _ in log if name != "plain"]
        assert len(drafting) <= 0.12 * len(log), drafting  # retries, now and then
        assert all(size <= 2 for name, size in drafting if name == "draft")
        assert speed(log, cpu_like) > 0.98


def measured_cpu(arm, forwards, width):
    """The costs auto measured on a 2-core CPU: a 60 ms step, each verified
    token 0.09 of it and a draft step 0.117 (verifying 2/4/8: 1.09/1.27/1.63)."""
    return 0.060 + 0.0054 * (width - 1) + 0.0070 * forwards


def test_auto_keeps_drafting_one_token_where_that_pays(monkeypatch):
    """At 35% acceptance a one-token draft earns 1.35 tokens for 1.21 steps
    (1.12x): auto drafts most rounds, gains most of it, and no long chains."""
    shares, speeds = [], []
    for seed in range(4):
        log, _ = simulate(
            measured_cpu, lambda r: 0.35, seed=seed, monkeypatch=monkeypatch
        )
        shares.append(np.mean([name == "draft" for name, _, _ in log[30:]]))
        speeds.append(speed(log, measured_cpu))
        assert max(size for _, size, _ in log) <= 3
    assert np.mean(shares) > 0.7, shares
    assert np.mean(speeds) > 1.07, speeds


def test_auto_falls_back_to_plain_where_one_token_loses(monkeypatch):
    """At 10% acceptance a one-token draft earns 1.1 tokens for 1.21 steps:
    auto runs plain rounds, retrying the draft now and then."""
    for seed in range(4):
        log, _ = simulate(
            measured_cpu, lambda r: 0.1, seed=seed, monkeypatch=monkeypatch
        )
        assert np.mean([name == "plain" for name, _, _ in log[30:]]) > 0.8
        assert speed(log, measured_cpu) > 0.98


def test_auto_speculates_longer_chains_when_acceptance_is_high(monkeypatch):
    log, _ = simulate(cpu_like, lambda r: 0.9, monkeypatch=monkeypatch)
    later = log[20:]
    draft_sizes = [size for name, size, _ in later if name == "draft"]
    assert len(draft_sizes) >= 0.95 * len(later)
    assert np.mean(draft_sizes) >= 4


def test_auto_prices_by_the_measured_machine(monkeypatch):
    """60% of drafts accepted: where verifying 8 tokens costs about one, and
    a draft step little, drafting pays; on a machine where each verified
    token and draft step costs half a step, plain rounds win."""

    def dear(arm, forwards, width):
        return 0.060 + 0.030 * (width - 1) + 0.030 * forwards + (0.004 if arm else 0)

    def share(machine, seed):
        log, _ = simulate(machine, lambda r: 0.6, seed=seed, monkeypatch=monkeypatch)
        return np.mean([name == "draft" for name, _, _ in log[20:]])

    assert np.mean([share(metal_like, seed) for seed in range(4)]) > 0.9
    assert np.mean([share(dear, seed) for seed in range(4)]) < 0.05


def test_auto_retries_a_losing_draft_rarely_and_keeps_it_once_it_pays(monkeypatch):
    """A draft left out for low acceptance comes back as the rounds it sits
    out age that evidence: about every 30 rounds while nearly every draft is
    rejected (each retry one token); once it pays again, a retry finds it
    within a few dozen rounds and it stays."""
    turn = 400
    for seed in range(3):
        log, _ = simulate(
            cpu_like,
            lambda r: 0.02 if r < turn else 0.95,
            rounds=700,
            seed=seed,
            monkeypatch=monkeypatch,
        )
        retries = [r for r, (name, _, _) in enumerate(log[:turn]) if name == "draft"]
        assert all(size == 1 for name, size, _ in log[:turn] if name == "draft")
        assert 5 <= len(retries) <= 25, retries
        assert np.median(np.diff(retries)) >= 20
        back = next(r for r in range(turn, len(log)) if log[r][0] == "draft")
        assert back - turn <= 60
        assert np.mean([name == "draft" for name, _, _ in log[turn + 100 :]]) > 0.9


@pytest.fixture
def switching(monkeypatch):
    """auto switching arm every round (plain, draft and tree in turn, and
    lookup's match every fourth round), whatever the timings."""
    from mlx_spec.drafters import auto as auto_mod

    picks = iter(range(10**6))

    def every_arm_in_turn(self):
        self.probing = False
        return self.choices[next(picks) % len(self.choices)]

    def every_fourth_round(self, seq):
        return self.rounds % 4 == 3 and self.lookup.will_draft(seq)

    monkeypatch.setattr(auto_mod.AutoDrafter, "_pick", every_arm_in_turn)
    monkeypatch.setattr(auto_mod.AutoDrafter, "_lookup_drafts", every_fourth_round)


def test_auto_switching_every_round_is_greedy_identical(load_model, switching):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("x = [1, 2, 3, 4]\ny = [1, 2, 3, 4]\nz = [1,")
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        expected = [t for t, _ in generate_step(mx.array(ids), model, max_tokens=48)]
        stream = stream_generate(
            model, tokenizer, ids, draft_model=draft, max_tokens=48, speculative="auto"
        )
        got = [r.token for r in stream]
    finally:
        tokenizer.eos_token_ids = saved
    assert got == expected
    assert set(stream.stats.auto_rounds) == {"plain", "draft", "tree", "lookup"}
    assert min(stream.stats.auto_rounds[k] for k in ("plain", "draft", "tree")) >= 3


def test_auto_switching_every_round_samples_the_target_law(load_model, switching):
    """Every sampled token follows the target's law given its prefix while
    the proposal changes each round: randomized PIT of a long stream."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):\n    return fibonacci(n - 1)")
    temp, n = 1.3, 240
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        stream = stream_generate(
            model,
            tokenizer,
            ids,
            draft_model=draft,
            max_tokens=n,
            speculative="auto",
            temp=temp,
            seed=7,
        )
        out = [r.token for r in stream]
    finally:
        tokenizer.eos_token_ids = saved
    assert len(out) == n and stream.stats.auto_rounds["draft"] >= 10
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


def test_engine_reports_the_cost_model_it_measured(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    stream = stream_generate(
        model, tokenizer, ids, draft_model=draft, max_tokens=24, speculative="auto"
    )
    for _ in stream:
        pass
    report = stream.stats.cost_model
    assert stream.stats.rounds - 1 <= report["rounds"] <= stream.stats.rounds
    assert report["verify_by_width"][1] == 1.0 and report["step_s"] > 0
    assert set(report["draft_step"]) <= {"draft", "tree"}


class _Priced:
    """A planner's estimates: the best other choice earns ``best`` tokens per
    unit of cost, and a chain round costs ``1 + slope`` per drafted token."""

    def __init__(self, best, slope=0.085):
        self.best, self.slope = best, slope

    def plain_rate(self):
        return 1.0

    def arm_rate(self, arm):
        return self.best

    def round_cost(self, arm, gamma):
        return 1.0 + self.slope * gamma


def test_auto_copies_a_match_only_when_it_beats_the_best_other_choice():
    """Lookup preempts the other arms only where its match, at the length that
    pays most, is expected to earn more than the best of them: a fresh 1-token
    match (its first token seldom accepted in prose) does not beat a draft
    earning 1.17 tokens per forward, a fresh 3-token match does."""
    from mlx_spec.drafters.auto import AutoDrafter
    from mlx_spec.drafters.lookup import LookupDrafter

    def auto_with(best):
        lookup = LookupDrafter(ngram_min=1, ngram_max=3)
        lookup.chain_only()
        config = SpecConfig(method="auto")
        auto = AutoDrafter({"draft": _Arm("draft", 0.1), "lookup": lookup}, config)
        auto.use_estimates(_Priced(best))
        auto.tries["plain"] = 1  # plain rounds measured
        return auto

    one_token = [1, 2, 3, 4, 5, 2]  # "2" seen once
    three_tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # "1 2 3" seen once
    assert auto_with(1.17).select(one_token).name == "draft"
    auto = auto_with(1.17)
    assert auto.select(three_tokens).name == "lookup" and auto.sizes_itself
    # With only plain rounds to beat, the 1-token match pays for a short copy.
    assert auto_with(1.0).select(one_token).name == "lookup"


def test_the_planner_lets_a_lookup_round_of_auto_size_its_own_draft():
    """A lookup round of auto may draft up to the longest chain; the match's
    own estimates (not one pooled over every match length) cut it."""
    from mlx_spec.drafters.auto import AutoDrafter
    from mlx_spec.drafters.lookup import LookupDrafter
    from mlx_spec.planner import RoundPlanner

    config = SpecConfig(method="auto")
    lookup = LookupDrafter(ngram_min=1, ngram_max=3)
    lookup.chain_only()
    auto = AutoDrafter({"draft": _Arm("draft", 0.1), "lookup": lookup}, config)
    planner = RoundPlanner(config, auto, timed=False)
    assert planner.plan([1, 2, 3, 4, 5, 6, 1, 2, 3]) == (False, 8)
    assert auto.current == "lookup" and config.max_draft_tokens == 8


def test_a_match_drafts_the_length_its_acceptance_by_depth_and_costs_pay_for():
    """The draft length maximises expected tokens over the round's cost, from
    the match length's acceptance by depth: shorter where verifying a token
    is dear, and shorter once its copies are seen to stop early."""
    from mlx_spec.drafters.lookup import MatchRates

    def length(slope, runs=()):
        rates = MatchRates(max_len=8)
        rates.costs = [1.0 + slope * g for g in range(9)]
        for accepted in runs:
            rates.observe(3, accepted, 8)
        return rates.worth_length(3)

    assert length(0.085) == 8  # a fresh 3-token match usually runs on
    assert 1 < length(0.3) < length(0.085)
    # Copies of a 3-token match that stop after their first token.
    assert length(0.085, runs=[1] * 10) <= 2 < length(0.085)
    # A 1-token match starts from a lower prior than a 3-token one.
    rates = MatchRates()
    assert rates.rate(1) < rates.rate(2) < rates.rate(3)


def test_a_draft_proposal_counts_the_tokens_its_first_forward_caught_up_on():
    """A draft that sat rounds out reads every token it missed in its first
    forward; the proposal says how many beyond one, for the cost model."""
    from mlx_spec.drafters.base import RoundState
    from mlx_spec.drafters.model import ModelDrafter

    class Draft:
        offset = 5  # the draft's cache holds the first 5 tokens

        def mark(self):
            pass

        def __call__(self, inputs):
            self.read = getattr(self, "read", []) + [inputs.size]
            return mx.zeros((inputs.size, 8))

    def choose(logits, tokens):
        return mx.argmax(logits, axis=-1).astype(mx.uint32), None

    draft = Draft()
    drafter = ModelDrafter(draft, vocab_size=8, step_cost=0.1)
    proposal = drafter.propose(RoundState(list(range(9)), 0, choose), 3)
    assert draft.read == [4, 1, 1] and proposal.forwards == 3
    assert proposal.caught_up == 3
