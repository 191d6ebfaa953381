"""Adaptive draft length and ``auto`` in the engine: identity, law, bounds."""

import mlx.core as mx
import numpy as np
import pytest
from law_checks import assert_counts_follow_law
from mlx_lm.generate import generate_step

from mlx_spec import stream_generate

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]


def plain(model, ids, n):
    return [t for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def run(model, tokenizer, ids, draft, n, **kw):
    stream = stream_generate(
        model, tokenizer, ids, draft_model=draft, max_tokens=n, **kw
    )
    tokens = [r.token for r in stream]
    return tokens, stream.stats


@pytest.mark.parametrize("arch", ARCHS)
def test_adaptive_and_auto_greedy_identity(load_model, arch):
    model, tokenizer = load_model(arch)
    draft, _ = load_model(f"{arch}-near")
    ids = tokenizer.encode("import os\nimport sys\n")
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        expected = plain(model, ids, 40)
        for kw in (
            dict(speculative="draft", adaptive=True),
            dict(speculative="tree", adaptive=True),
            dict(speculative="auto"),
        ):
            got, stats = run(model, tokenizer, ids, draft, 40, **kw)
            assert got == expected, kw
        got, stats = run(model, tokenizer, ids, None, 40, speculative="auto")
        assert got == expected
        assert set(stats.auto_rounds) <= {"lookup", "plain", "self"}
    finally:
        tokenizer.eos_token_ids = saved


def test_adaptive_stays_within_bounds(load_model):
    model, tokenizer = load_model("qwen2")
    draft, _ = load_model("qwen2-near")
    ids = tokenizer.encode("def fibonacci(n):")
    _, stats = run(
        model,
        tokenizer,
        ids,
        draft,
        80,
        speculative="draft",
        adaptive=True,
        num_draft_tokens=6,
    )
    assert stats.drafted_per_round
    assert all(1 <= g <= 12 for g in stats.drafted_per_round)


def test_auto_uses_every_arm_and_reports_it(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    _, stats = run(model, tokenizer, ids, draft, 60, speculative="auto")
    assert set(stats.auto_rounds) == {"draft", "tree", "plain", "lookup"}
    assert stats.auto_rounds["draft"] >= 1  # an untried arm gets a first round
    assert sum(stats.auto_rounds.values()) == stats.rounds


@pytest.mark.parametrize(
    "kw",
    [dict(speculative="draft", adaptive=True), dict(speculative="auto")],
    ids=["adaptive", "auto"],
)
def test_sampled_first_tokens_follow_target_law(load_model, kw):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("The quick brown fox")
    logits = model(mx.array([ids]))[0, -1]
    p = np.array(mx.softmax(logits / 1.5), dtype=np.float64)
    mx.random.seed(1)
    runs = 300
    counts = np.zeros(p.size)
    for _ in range(runs):
        stream = stream_generate(
            model, tokenizer, ids, draft_model=draft, max_tokens=3, temp=1.5, **kw
        )
        counts[next(stream).token] += 1
        stream.close()
    assert_counts_follow_law(counts, p)


SAMPLED_SETUPS = {
    "adaptive-draft": (True, dict(speculative="draft")),
    "adaptive-tree": (True, dict(speculative="tree")),
    "auto-with-draft": (True, dict(speculative="auto")),
    "auto-draft-free": (False, dict(speculative="auto")),
    "draft-p-min": (True, dict(speculative="draft", draft_p_min=0.3)),
}


@pytest.mark.parametrize("setup", list(SAMPLED_SETUPS))
def test_sampled_stream_follows_target_law(load_model, setup):
    """Every sampled token, in every round (not just the first), follows the
    target's exact law given its prefix: randomized PIT of a long stream."""
    from law_checks import CHI2_9_999, stream_statistics

    with_draft, kw = SAMPLED_SETUPS[setup]
    model, tokenizer = load_model("llama")
    draft = load_model("llama-near")[0] if with_draft else None
    ids = tokenizer.encode("def fibonacci(n):\n    return fibonacci(n - 1)")
    temp, n = 1.3, 240
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        out, stats = run(model, tokenizer, ids, draft, n, temp=temp, seed=5, **kw)
    finally:
        tokenizer.eos_token_ids = saved
    assert len(out) == n and stats.draft_tokens > 0
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


@pytest.mark.parametrize("with_draft", [True, False], ids=["draft", "draft-free"])
def test_sampling_with_a_seed_ignores_wall_time(load_model, monkeypatch, with_draft):
    """When sampling, adaptive and auto decide from a fixed cost model, so the
    same seed gives the same text however long the rounds take."""
    import random

    from mlx_spec import planner

    model, tokenizer = load_model("llama")
    draft = load_model("llama-near")[0] if with_draft else None
    ids = tokenizer.encode("def fibonacci(n):")
    clock = random.Random(0)
    outputs = []
    for jitter in (0.0, 1.0, 0.001):
        now = [0.0]

        def fake_clock():
            now[0] += clock.random() * jitter + 1e-6
            return now[0]

        monkeypatch.setattr(planner.time, "perf_counter", fake_clock)
        out, stats = run(model, tokenizer, ids, draft, 60, temp=0.9, seed=11)
        outputs.append(out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert stats.auto_rounds and len(stats.auto_rounds) >= 2


def test_auto_sizes_each_arm_with_its_own_controller(load_model, monkeypatch):
    """The tree arm gets node budgets and the chain arms draft lengths."""
    from mlx_spec.drafters.auto import AutoDrafter
    from mlx_spec.planner import RoundPlanner

    # Every arm gets its warm-up, the tree too (the tiny draft is not cheap).
    monkeypatch.setattr(AutoDrafter, "_worth_trying", lambda self, name, rates: True)

    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    sizes = []
    begin = RoundPlanner.begin_round

    def spy(self, seq=None):
        is_tree, size = begin(self, seq)
        sizes.append((self.arm.name, is_tree, size))
        return is_tree, size

    RoundPlanner.begin_round = spy
    try:
        _, stats = run(model, tokenizer, ids, draft, 80, speculative="auto")
    finally:
        RoundPlanner.begin_round = begin
    names = {name for name, _, _ in sizes}
    assert {"draft", "tree", "lookup"} <= names
    first_tree = next(size for name, _, size in sizes if name == "tree")
    assert first_tree == 4  # adaptive trees start small (the default budget is 16)
    for name, is_tree, size in sizes:
        if name == "tree":
            assert is_tree and size in (1, 2, 4, 8, 16, 24, 32, 48, 64)
        elif name == "lookup" and size == 0:
            pass  # a plain round queued before the previous sync
        elif not is_tree:
            assert 1 <= size <= 8, (name, size)


def test_draft_p_min_stops_early_and_stays_exact(load_model):
    model, tokenizer = load_model("qwen2")
    draft, _ = load_model("qwen2-near")
    ids = tokenizer.encode("import os\nimport sys\n")
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        expected = plain(model, ids, 40)
        kw = dict(speculative="draft", adaptive=False, num_draft_tokens=6)
        _, full = run(model, tokenizer, ids, draft, 40, **kw)
        got, early = run(model, tokenizer, ids, draft, 40, draft_p_min=0.9, **kw)
    finally:
        tokenizer.eos_token_ids = saved
    assert got == expected
    assert set(full.drafted_per_round) == {6} or full.drafted_per_round[-1] < 6
    assert min(early.drafted_per_round) < 6
    assert early.draft_tokens < full.draft_tokens


def test_auto_copies_on_a_match_and_drafts_with_the_model_otherwise(load_model):
    """Rounds whose context has a lookup match worth proposing copy it; the
    others draft with the model (or run plain); greedy output is unchanged."""
    from mlx_spec.drafters.lookup import LookupDrafter

    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("x = [1, 2, 3, 4, 5, 6]\ny = [1, 2, 3, 4, 5, 6]\nz = [1, 2,")
    verdicts = {}  # context length -> lookup's verdict
    will_draft = LookupDrafter.will_draft

    def spy(self, seq):
        verdicts[len(seq)] = will_draft(self, seq)
        return verdicts[len(seq)]

    LookupDrafter.will_draft = spy
    tokenizer.eos_token_ids, saved = set(), set(tokenizer.eos_token_ids)
    try:
        expected = plain(model, ids, 40)
        got, stats = run(model, tokenizer, ids, draft, 40, speculative="auto")
    finally:
        LookupDrafter.will_draft = will_draft
        tokenizer.eos_token_ids = saved
    assert got == expected
    # Every lookup round had a match worth proposing on its own context.
    assert 1 <= stats.auto_rounds["lookup"] <= sum(verdicts.values())
    assert stats.auto_rounds["draft"] + stats.auto_rounds["tree"] >= 1


def test_controller_starts_from_the_arms_cost_and_acceptance():
    """A dear drafter's controller prices wider rounds by its draft step, and
    an arm with an acceptance estimate (self) starts at the γ it favours."""
    from types import SimpleNamespace

    from mlx_spec import SpecConfig
    from mlx_spec.costs import VERIFY_SLOPE, best_gamma, static_round_cost
    from mlx_spec.planner import make_controller

    config = SpecConfig(method="self", num_draft_tokens=4)
    assert config.max_draft_tokens == 8
    plain_arm = SimpleNamespace(is_tree=False, step_cost=0.1)
    controller = make_controller(config, plain_arm)
    assert controller.init_gamma == 4 and controller.gamma_max == 8
    assert controller.verify_slope == pytest.approx(VERIFY_SLOPE + 0.1)

    assert controller.gamma_min == 1  # a draft model would have to catch up

    self_arm = SimpleNamespace(
        is_tree=False,
        step_cost=0.3,
        acceptance_estimate=0.85,
        drafts_nothing=lambda gamma, seq_len: gamma < 1,
    )
    controller = make_controller(config, self_arm)
    init, _ = best_gamma(0.85, 0.3, range(1, 9))
    assert init == 3 and controller.init_gamma == init
    assert controller.prior_acceptance == 0.85
    assert controller.gamma_min == 0  # self may pause at no later cost
    # A high estimate starts no longer than the fixed default.
    keen = SimpleNamespace(**{**vars(self_arm), "acceptance_estimate": 0.98})
    assert best_gamma(0.98, 0.3, range(1, 9))[0] > 4
    assert make_controller(config, keen).init_gamma == 4
    # One measured width prices the others like the static round cost, so
    # wide rounds do not look cheap: the draft steps are counted.
    gamma = controller.choose()
    cost = static_round_cost(0.3, gamma, gamma + 1)
    controller.update(gamma, 2, 0.0, cost, gamma + 1, draft_steps=0)
    for wide in (1, 6, 8):
        expected = static_round_cost(0.3, wide, wide + 1)
        assert controller.verify_time(wide + 1) == pytest.approx(expected)
    fixed = make_controller(SpecConfig(method="self", adaptive=False), self_arm)
    assert fixed.gamma_max == 4
