"""Tests for the adaptive draft-length / tree-budget controller."""

import math
import random
import statistics

import mlx.core as mx
import pytest

from mlx_spec.adaptive import (
    AdaptiveController,
    expected_tokens,
)


def accepted_count(rng, gamma, p):
    """Chain with i.i.d. per-token acceptance ``p``: accepted prefix length."""
    k = 0
    while k < gamma and rng.random() < p:
        k += 1
    return k


def run_chain(ctl, rounds, p, *, rng, t_draft=0.01, verify=lambda w: 1.0 + 0.02 * w):
    """Simulate ``rounds`` chain rounds; ``p`` may be a function of the round."""
    chosen = []
    for r in range(rounds):
        gamma = ctl.choose()
        assert ctl.gamma_min <= gamma <= ctl.gamma_max
        prob = p(r) if callable(p) else p
        k = accepted_count(rng, gamma, prob)
        ctl.update(gamma, k, gamma * t_draft, verify(gamma + 1))
        chosen.append(gamma)
    return chosen


def test_expected_tokens_formula():
    assert expected_tokens([]) == [1.0]
    e = expected_tokens([0.5, 0.5, 1.0])
    assert e == pytest.approx([1.0, 1.5, 1.75, 2.0])


def test_initial_choice_is_init_gamma_clamped():
    assert AdaptiveController(init_gamma=5).choose() == 5
    assert AdaptiveController(gamma_max=3, init_gamma=5).choose() == 3
    assert AdaptiveController(gamma_min=2, init_gamma=0).choose() == 2


@pytest.mark.parametrize("seed", range(10))
def test_bounds_hold_under_adversarial_updates(seed):
    rng = random.Random(seed)
    ctl = AdaptiveController(
        gamma_min=rng.randint(0, 3),
        gamma_max=rng.randint(3, 20),
        ema=rng.choice([0.05, 0.5, 1.0]),
        explore=rng.choice([0.0, 0.3, 1.0]),
        seed=seed,
    )
    for _ in range(300):
        gamma = ctl.choose()
        assert ctl.gamma_min <= gamma <= ctl.gamma_max
        # Ignore the choice: drafts longer than gamma_max, zero or huge times.
        drafted = rng.choice([0, gamma, rng.randint(0, 80)])
        accepted = rng.randint(0, drafted)
        times = [0.0, 1e-9, rng.random(), 1e6]
        ctl.update(
            drafted,
            accepted,
            rng.choice(times),
            rng.choice(times),
            rng.choice([None, rng.randint(1, 100)]),
        )
        assert all(0.0 <= a <= 1.0 for a in ctl.acceptance())
        assert all(math.isfinite(r) for r in ctl.expected_rates())


def test_grows_with_high_acceptance_and_cheap_drafts():
    ctl = AdaptiveController(gamma_min=1, gamma_max=12, init_gamma=2)
    chosen = run_chain(ctl, 150, 0.95, rng=random.Random(0))
    assert statistics.median(chosen[-50:]) >= 10
    assert ctl.state()["acceptance"][0] > 0.8


def test_shrinks_to_minimum_with_low_acceptance():
    ctl = AdaptiveController(gamma_min=1, gamma_max=12, init_gamma=8)
    chosen = run_chain(ctl, 150, 0.1, rng=random.Random(0))
    assert statistics.median(chosen[-50:]) == 1


def test_gamma_zero_allowed_when_drafting_does_not_pay():
    # Acceptance 0 and expensive drafts: plain decoding wins.
    ctl = AdaptiveController(gamma_min=0, gamma_max=8, explore=0.0)
    run_chain(ctl, 30, 0.0, rng=random.Random(0), t_draft=0.5)
    assert ctl.choose() == 0


def test_an_arm_left_out_drifts_back_to_its_prior():
    """Rounds an arm sits out (rest) age its evidence, so its acceptance
    returns to the prior and it is tried again: slowly when many rounds said
    it loses, fast when few did; a round it runs does not."""
    ctls = {}
    for rounds in (3, 60):
        ctl = AdaptiveController(gamma_max=8, prior_acceptance=0.6, ema=0.05)
        run_chain(ctl, rounds, 0.0, rng=random.Random(0))
        ctls[rounds] = ctl
    assert ctls[60].acceptance()[0] < 0.1
    for ctl in ctls.values():
        for _ in range(10):
            ctl.rest()
    few, many = ctls[3].acceptance()[0], ctls[60].acceptance()[0]
    assert few > 0.3 and many < 0.12
    for _ in range(300):
        ctls[60].rest()
    assert ctls[60].acceptance()[0] == pytest.approx(0.6, abs=0.01)


def test_two_rejected_rounds_do_not_sink_the_acceptance_estimate():
    """Depth 1 is a Beta posterior: the prior counts as a tenth of the window's
    rounds and does not decay, so two unlucky rounds of a 20-round window
    leave the estimate near the prior's pull, not at the cost of a draft."""
    ctl = AdaptiveController(gamma_max=8, prior_acceptance=0.6, ema=0.05)
    for _ in range(2):
        ctl.update(1, 0, 0.0, 1.2, 2)
    assert ctl.acceptance()[0] == pytest.approx(2 * 0.6 / (2 + 0.95 + 1), rel=0.01)
    for _ in range(200):  # many rounds at 0.3: the evidence outweighs the prior
        ctl.update(1, 1, 0.0, 1.2, 2)
        for _ in range(2):
            ctl.update(1, 0, 0.0, 1.2, 2)
    assert ctl.acceptance()[0] == pytest.approx(0.34, abs=0.02)


def test_a_lucky_round_does_not_lengthen_chains_at_low_acceptance():
    """Deeper depths lean on the depth above as much as depth 1 on its prior:
    one round accepting two drafts at a conditional acceptance near 0.3 does
    not make the controller draft more than one token."""
    ctl = AdaptiveController(gamma_max=12, prior_acceptance=0.6, ema=0.05, explore=0)
    # Verification as measured on a CPU: +0.09 a token, a draft step 0.12.
    ctl.pricer = lambda g: [1.0 + 0.09 * k + 0.12 * k for k in range(g + 1)]
    rng = random.Random(0)
    for r in range(60):
        ctl.update(1, int(rng.random() < 0.3), 0.0, 1.2, 2)
    ctl.update(2, 2, 0.0, 1.4, 3)
    ctl.update(3, 2, 0.0, 1.6, 4)
    assert ctl.acceptance()[1] < 0.7
    assert ctl.choose() == 1


def first_round_reaching(chosen, start, predicate):
    for r in range(start, len(chosen)):
        if predicate(chosen[r]):
            return r - start
    return math.inf


def test_reacts_when_acceptance_drops_mid_stream():
    ctl = AdaptiveController(gamma_min=1, gamma_max=12)
    chosen = run_chain(
        ctl, 300, lambda r: 0.95 if r < 150 else 0.1, rng=random.Random(1)
    )
    assert statistics.median(chosen[100:150]) >= 10
    assert first_round_reaching(chosen, 150, lambda g: g <= 2) <= 20
    assert statistics.median(chosen[-50:]) == 1


def test_reacts_when_acceptance_recovers_mid_stream():
    ctl = AdaptiveController(gamma_min=1, gamma_max=12)
    chosen = run_chain(
        ctl, 300, lambda r: 0.1 if r < 150 else 0.95, rng=random.Random(2)
    )
    assert statistics.median(chosen[100:150]) == 1
    assert first_round_reaching(chosen, 150, lambda g: g >= 8) <= 40
    assert statistics.median(chosen[-50:]) >= 10


def test_steep_verify_cost_picks_shorter_drafts():
    flat = AdaptiveController(gamma_max=12)
    steep = AdaptiveController(gamma_max=12)
    chosen_flat = run_chain(flat, 200, 0.8, rng=random.Random(3))
    chosen_steep = run_chain(
        steep, 200, 0.8, rng=random.Random(3), verify=lambda w: 1.0 + 0.5 * w
    )
    assert statistics.median(chosen_steep[-50:]) < statistics.median(chosen_flat[-50:])
    assert statistics.median(chosen_steep[-50:]) <= 3


def test_expensive_drafts_pick_shorter_drafts():
    cheap = AdaptiveController(gamma_max=12)
    costly = AdaptiveController(gamma_max=12)
    chosen_cheap = run_chain(cheap, 200, 0.8, rng=random.Random(4), t_draft=0.01)
    chosen_costly = run_chain(costly, 200, 0.8, rng=random.Random(4), t_draft=0.4)
    assert statistics.median(chosen_costly[-50:]) < statistics.median(
        chosen_cheap[-50:]
    )


def test_verify_cost_fit_extrapolates_unseen_widths():
    ctl = AdaptiveController()
    ctl.update(1, 1, 0.0, 1.5, 2)
    ctl.update(3, 3, 0.0, 2.5, 4)
    assert ctl.verify_time(3) == pytest.approx(2.0)
    assert ctl.verify_time(10) == pytest.approx(5.5)
    # One width only: the assumed relative slope.
    single = AdaptiveController(verify_slope=0.1)
    single.update(1, 1, 0.0, 1.1, 2)
    assert single.verify_time(11) == pytest.approx(2.0)


def simulate_tree(ctl, rounds, *, rng, p, verify):
    """Synthetic tree: a budget-b tree has per-depth acceptance 1-(1-p)^k."""
    chosen = []
    for _ in range(rounds):
        budget = ctl.choose_budget()
        assert budget in ctl.tree_budgets
        branching = max(1, int(math.log2(budget)))
        depth = max(1, budget // branching)
        accepted = accepted_count(rng, depth, 1 - (1 - p) ** branching)
        ctl.update_tree(budget, accepted, 0.01 * depth, verify(budget + 1))
        chosen.append(budget)
    return chosen


def test_tree_budget_follows_cost_and_acceptance():
    budgets = (4, 8, 16, 32, 64)
    flat = AdaptiveController(tree_budgets=budgets, explore=0.1)
    chosen = simulate_tree(
        flat, 300, rng=random.Random(5), p=0.7, verify=lambda w: 1.0 + 0.001 * w
    )
    assert statistics.median(chosen[-50:]) >= 32
    steep = AdaptiveController(tree_budgets=budgets, explore=0.1)
    chosen = simulate_tree(
        steep, 300, rng=random.Random(5), p=0.7, verify=lambda w: 1.0 + 0.3 * w
    )
    assert statistics.median(chosen[-50:]) <= 8
    assert set(steep.state()["tree_tokens"]) == set(budgets)


def test_tree_budget_grows_without_waiting_for_exploration():
    """Where wide verification is nearly free (a GPU), a tree that starts small
    must reach its best budget in a few dozen rounds: the next budget up is
    priced by extrapolating the measured gain, not only when an exploring
    round (5%) lands there. Where it is dear (a CPU), it stays small."""
    budgets = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # the engine's set, start 4

    def first_round_at(budget, verify, seed):
        ctl = AdaptiveController(tree_budgets=budgets, init_budget=4)
        chosen = simulate_tree(ctl, 150, rng=random.Random(seed), p=0.7, verify=verify)
        return next((i for i, b in enumerate(chosen) if b >= budget), None), chosen

    for seed in range(4):
        reached, chosen = first_round_at(48, lambda w: 1.0 + 0.001 * w, seed)
        assert reached is not None and reached < 60, (seed, reached)
        assert statistics.median(chosen[-50:]) >= 32
        _, chosen = first_round_at(64, lambda w: 1.0 + 0.3 * w, seed)
        assert statistics.median(chosen[-50:]) <= 4


def test_tree_initial_budget_and_errors():
    ctl = AdaptiveController(tree_budgets=[16, 4, 8, 8])
    assert ctl.tree_budgets == [4, 8, 16]
    assert ctl.choose_budget() == 8
    with pytest.raises(ValueError, match="budget"):
        ctl.update_tree(5, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="tree_budgets"):
        AdaptiveController().choose_budget()
    with pytest.raises(ValueError, match="init_budget"):
        AdaptiveController(tree_budgets=[4], init_budget=5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(gamma_max=0), "gamma_max"),
        (dict(gamma_max=65), "gamma_max"),
        (dict(gamma_min=5, gamma_max=4), "gamma_min"),
        (dict(gamma_min=-1), "gamma_min"),
        (dict(init_gamma=-1), "init_gamma"),
        (dict(ema=0.0), "ema"),
        (dict(ema=1.5), "ema"),
        (dict(prior_acceptance=1.1), "prior_acceptance"),
        (dict(explore=-0.1), "explore"),
        (dict(explore=float("nan")), "explore"),
        (dict(verify_slope=-1), "verify_slope"),
        (dict(tree_budgets=[4, 0]), "tree_budgets"),
        (dict(tree_budgets=[]), "tree_budgets"),
    ],
)
def test_knob_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveController(**kwargs)


@pytest.mark.parametrize(
    "args, field",
    [
        ((2, 3, 0.0, 1.0), "num_accepted"),
        ((-1, 0, 0.0, 1.0), "num_drafted"),
        ((2, 1, -1.0, 1.0), "draft_time"),
        ((2, 1, 0.0, float("inf")), "verify_time"),
        ((2, 1, 0.0, 1.0, 0), "verify_width"),
    ],
)
def test_update_errors_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveController().update(*args)


def test_round_without_drafts_keeps_acceptance():
    ctl = AdaptiveController()
    for _ in range(5):
        ctl.update(4, 4, 0.0, 1.0)
    before = ctl.acceptance()
    for _ in range(50):
        ctl.update(0, 0, 0.0, 0.9)
    assert ctl.acceptance() == before
    # Plain rounds are priced on their own, not on the drafting rounds' line.
    assert ctl.state()["plain_time"] == pytest.approx(0.9)
    assert 1 not in ctl.state()["verify_time"]


def test_plain_rounds_priced_on_their_own():
    """Drafting rounds pay a fixed overhead a plain round does not: the line
    through them overprices width 1, so γ 0 wins only once it is measured."""
    ctl = AdaptiveController(gamma_min=0, gamma_max=4, explore=0.0)
    for gamma in (1, 2, 3, 1, 2, 3):  # the first draft token is always accepted
        ctl.update(gamma, 1, 0.0, 1.0 + 0.8 + 0.5 * gamma, gamma + 1)
    assert ctl.choose() == 1  # the line prices width 1 at 1.8, γ 1 at 2.3
    for _ in range(3):
        ctl.update(0, 0, 0.0, 1.0, 1)
    assert ctl.state()["plain_time"] == pytest.approx(1.0)
    assert ctl.choose() == 0
