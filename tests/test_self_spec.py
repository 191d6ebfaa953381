"""Self-speculation: greedy identity, exact law, shared caches, layer search."""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from law_checks import CHI2_9_999, stream_statistics
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from mlx_spec import SpecConfig, SpecStats, make_sampler, speculative_generate_step
from mlx_spec.costs import best_gamma, expected_speedup
from mlx_spec.drafters.base import Proposal, RoundState
from mlx_spec.drafters.registry import FACTORIES as DRAFTER_FACTORIES
from mlx_spec.drafters.self_spec import (
    CHECK_ROUNDS,
    ON_PIPELINE_STAGES,
    SelfDrafter,
    _masked_forward_ready,
    agreement,
    agreement_stepwise,
    block_influence,
    candidate_sets,
    choose_skipped_layers,
    context_influence,
    make_self_drafter,
    running_layers,
)
from mlx_spec.models import CachedModel, KVSettings
from mlx_spec.testing import ARCHITECTURES, make_checkpoint

PROMPTS = ["def fibonacci(n):", "class Parser:\n    def __init__(self"]
DEEP_LAYERS = 6


@pytest.fixture(scope="session")
def deep(tmp_path_factory):
    """``deep(arch) -> (model, tokenizer)``: 6-layer test checkpoints, loaded once."""
    root = tmp_path_factory.mktemp("deep")
    loaded = {}

    def load(arch):
        if arch not in loaded:
            seed = 11 + ARCHITECTURES.index(arch)
            path = make_checkpoint(root / arch, arch, num_layers=DEEP_LAYERS, seed=seed)
            loaded[arch] = mlx_lm.load(str(path))
        return loaded[arch]

    return load


def plain_tokens(model, ids, max_tokens, **kwargs):
    return [
        t
        for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens, **kwargs)
    ]


def self_tokens(model, ids, max_tokens, stats=None, gamma=4, **kwargs):
    config = SpecConfig(
        method="self", max_tokens=max_tokens, num_draft_tokens=gamma, adaptive=False
    )
    steps = speculative_generate_step(
        mx.array(ids), model, config=config, stats=stats, **kwargs
    )
    return [t for t, _, _ in steps]


@pytest.fixture
def fixed_skip(monkeypatch):
    """``fixed_skip(layers)``: make ``--speculative self`` skip exactly ``layers``."""
    built = []

    def fix(layers):
        def factory(config, target, draft_model, cache, kv, vocab_size):
            drafter = make_self_drafter(
                config, target, draft_model, cache, kv, vocab_size
            )
            drafter.set_skipped(layers)
            built.append(drafter)
            return drafter

        monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)
        return built

    return fix


@pytest.fixture
def always_draft(monkeypatch):
    """Make ``--speculative self`` draft even when its search says it does not pay
    (random test models have low acceptance)."""

    def factory(config, target, draft_model, cache, kv, vocab_size):
        drafter = make_self_drafter(config, target, draft_model, cache, kv, vocab_size)
        drafter.min_speedup = 0.0
        return drafter

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)


def greedy_choose(logits, drafted):
    return mx.argmax(logits, axis=-1), None


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_identity_across_architectures(deep, load_model, always_draft, arch):
    runs = [(deep(arch), PROMPTS[0], (1, 6)), (load_model(arch), PROMPTS[1], (3,))]
    for (model, tokenizer), prompt, gammas in runs:
        ids = tokenizer.encode(prompt)
        expected = plain_tokens(model, ids, 24)
        for gamma in gammas:
            stats = SpecStats()
            assert self_tokens(model, ids, 24, stats, gamma) == expected, (
                prompt,
                gamma,
            )
            assert stats.draft_tokens > 0


@pytest.mark.parametrize("skipped", [[0], [5], [1, 2, 3], [0, 2, 4]])
def test_greedy_identity_for_any_skipped_set(deep, fixed_skip, skipped):
    model, tokenizer = deep("llama")
    ids = tokenizer.encode(PROMPTS[1])
    built = fixed_skip(skipped)
    for max_tokens in (1, 9, 30):
        assert self_tokens(model, ids, max_tokens, gamma=5) == plain_tokens(
            model, ids, max_tokens
        )
    assert built[-1].skipped == skipped


def test_retuning_on_the_output_stays_exact(deep, monkeypatch):
    model, tokenizer = deep("qwen2")
    built = []

    def factory(config, target, draft_model, cache, kv, vocab_size):
        built.append(
            SelfDrafter(
                target, vocab_size, gammas=(3,), retune_after=10, min_speedup=0.0
            )
        )
        return built[-1]

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)
    ids = tokenizer.encode(PROMPTS[0])
    stats = SpecStats()
    assert self_tokens(model, ids, 40, stats, gamma=3) == plain_tokens(model, ids, 40)
    assert built[0].search["retuned_at"] >= 10
    assert stats.skipped_layers == built[0].skipped


def test_no_draft_when_no_skip_set_pays(deep, monkeypatch):
    model, tokenizer = deep("gemma")

    def factory(config, target, draft_model, cache, kv, vocab_size):
        return SelfDrafter(target, vocab_size, min_speedup=100.0)

    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)
    ids = tokenizer.encode(PROMPTS[0])
    stats = SpecStats()
    assert self_tokens(model, ids, 12, stats) == plain_tokens(model, ids, 12)
    assert stats.draft_tokens == 0 and stats.target_forwards == 12
    assert stats.skipped_layers == []


def test_every_call_searches_afresh(deep, monkeypatch):
    from mlx_spec.drafters import self_spec

    model, tokenizer = deep("llama")
    calls = []
    search = self_spec.choose_skipped_layers

    def counting(*args):
        calls.append(1)
        return search(*args)

    monkeypatch.setattr(self_spec, "choose_skipped_layers", counting)
    ids = tokenizer.encode(PROMPTS[0])
    stats = [SpecStats(), SpecStats()]
    for s in stats:
        assert self_tokens(model, ids, 12, s) == plain_tokens(model, ids, 12)
    # No state survives a call, so equal calls search and decide alike.
    assert len(calls) == 2 and stats[0].skipped_layers == stats[1].skipped_layers


def test_drafting_stops_when_measured_acceptance_does_not_pay(deep, monkeypatch):
    from mlx_spec.drafters import self_spec

    model, tokenizer = deep("qwen3")
    # A search that overestimates: random blocks are far from identities.
    estimate = {"searched": True, "alpha": 1.0, "cost": 0.5, "speedup": 3.0}
    monkeypatch.setattr(
        self_spec, "choose_skipped_layers", lambda *args: ([1, 2, 3], dict(estimate))
    )
    ids = tokenizer.encode(PROMPTS[0])
    stats = SpecStats()
    assert self_tokens(model, ids, 40, stats, 4) == plain_tokens(model, ids, 40)
    assert len(stats.drafted_per_round) == self_spec.CHECK_ROUNDS
    assert stats.skipped_layers == []


def test_lazy_draft_reads_its_own_cache_entries(deep):
    """The verify forward overwrites the slots the draft wrote; the draft,
    evaluated only afterwards, must still see its own entries."""
    model, tokenizer = deep("qwen3")
    ids = tokenizer.encode(PROMPTS[0])
    kept, gamma = [0, 2, 5], 5
    target = CachedModel(model, None, KVSettings(), "target model")
    target.prefill(mx.array(ids[:-1]), 512)
    drafter = SelfDrafter(target, 512, skipped=[1, 3, 4])
    proposal = drafter.propose(RoundState(ids, 0, greedy_choose), gamma)
    assert [c.offset for c in target.cache] == [len(ids) - 1] * DEEP_LAYERS
    logits = target(mx.concatenate([mx.array(ids[-1:], mx.uint32), proposal.tokens]))
    mx.eval(logits, proposal.tokens)

    # Reference, eagerly: full-model prefix caches, then the kept blocks alone.
    cache = make_prompt_cache(model)
    model(mx.array([ids[:-1]]), cache=cache)
    kept_cache = [cache[i] for i in kept]
    token, expected = ids[-1], []
    with running_layers(model, [model.layers[i] for i in kept]):
        for _ in range(gamma):
            token = mx.argmax(
                model(mx.array([[token]]), cache=kept_cache)[0, -1]
            ).item()
            expected.append(token)
    assert proposal.tokens.tolist() == expected
    # The verify forward saw the full model's prefix at every layer.
    fresh = model(mx.array([ids + expected]))[0, len(ids) - 1 :]
    assert mx.abs(fresh - logits).max().item() < 1e-4


def _identity_blocks(model, blocks):
    """Zero the output projections of ``blocks``: they become exact identities."""
    for i in blocks:
        layer = model.layers[i]
        attn_out = getattr(layer.self_attn, "o_proj")
        attn_out.weight = mx.zeros_like(attn_out.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)


@pytest.mark.parametrize("arch", ["llama", "gemma", "phi3"])
def test_identity_blocks_are_found_and_drafts_all_accepted(tmp_path, arch):
    path = make_checkpoint(tmp_path / arch, arch, num_layers=DEEP_LAYERS, seed=3)
    model, tokenizer = mlx_lm.load(str(path))
    _identity_blocks(model, [2, 4])
    ids = tokenizer.encode(PROMPTS[1])
    skipped, report = choose_skipped_layers(model, mx.array(ids), [4])
    assert skipped == [2, 4] and report["alpha"] == 1.0
    stats = SpecStats()
    assert self_tokens(model, ids, 21, stats, gamma=4) == plain_tokens(model, ids, 21)
    # Skipping identities drafts exactly the target's tokens: all accepted.
    assert stats.accepted_tokens == stats.draft_tokens == 16
    assert stats.target_forwards == 5


def test_cache_in_sync_after_early_close_and_reuse(deep, always_draft):
    model, tokenizer = deep("mistral")
    first, second = tokenizer.encode(PROMPTS[0]), tokenizer.encode("\n\nclass A:")
    cache = make_prompt_cache(model)
    config = SpecConfig(method="self", max_tokens=50, num_draft_tokens=4)
    steps = speculative_generate_step(
        mx.array(first), model, config=config, prompt_cache=cache
    )
    turn1 = [t for _, (t, _, _) in zip(range(7), steps)]
    steps.close()
    assert turn1 == plain_tokens(model, first, 7)
    assert [c.offset for c in cache] == [len(first) + 7] * DEEP_LAYERS
    config = SpecConfig(method="self", max_tokens=12, num_draft_tokens=4)
    turn2 = [
        t
        for t, _, _ in speculative_generate_step(
            mx.array(second), model, config=config, prompt_cache=cache
        )
    ]
    assert turn2 == plain_tokens(model, first + turn1 + second, 12)
    assert len(cache) == DEEP_LAYERS


@pytest.mark.parametrize(
    "knobs",
    [dict(), dict(adaptive=False), dict(draft_p_min=0.2)],
    ids=["adaptive", "fixed", "p-min"],
)
def test_sampled_stream_follows_target_law(deep, fixed_skip, knobs):
    """Every sampled token, accepted or recovered, follows the target's exact law
    given its prefix (randomized PIT of a long stream, chi-square)."""
    model, tokenizer = deep("llama")
    ids = tokenizer.encode("The quick brown fox")
    fixed_skip([2, 3])
    temp, n = 1.5, 200
    mx.random.seed(0)
    stats = SpecStats()
    config = SpecConfig(method="self", max_tokens=n, num_draft_tokens=3, **knobs)
    steps = speculative_generate_step(
        mx.array(ids), model, config=config, sampler=make_sampler(temp), stats=stats
    )
    out = [t for t, _, _ in steps]
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits.astype(mx.float32), axis=-1), dtype=np.float64)
    assert (
        0 < stats.accepted_tokens < stats.draft_tokens
    )  # accepted and recovered tokens
    assert laws.max(axis=1).mean() < 0.95  # the laws are not point masses
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


def test_candidate_sets_exhaustive_when_small_else_by_influence():
    small = candidate_sets([1, 2, 3], [0.0] * 5, 2)
    assert small == [(1,), (2,), (3,), (1, 2), (1, 3), (2, 3)]
    influence = [1.0] * 32
    influence[7], influence[20], influence[9] = 0.1, 0.2, 0.3
    large = candidate_sets(list(range(1, 31)), influence, 16)
    # k = 3, 5, 8, 11, 13, 16 least influential; ties go to the later block.
    assert large[0] == (7, 9, 20) and large[1] == (7, 9, 20, 29, 30)
    assert [len(s) for s in large] == [3, 5, 8, 11, 13, 16]


def test_speedup_model():
    # Tokens per round over 1 + γ·step + 0.1·γ (the engine's static round cost).
    assert expected_speedup(1.0, 4, 0.0) == pytest.approx(5 / 1.4)
    assert expected_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3.4)
    assert expected_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.7)
    # Cheap drafts favour long chains; dear ones short chains or none.
    assert (
        best_gamma(0.9, 0.05, range(1, 17))[0] > best_gamma(0.9, 0.5, range(1, 17))[0]
    )
    assert best_gamma(0.9, 0.5, range(1, 17)) == max(
        ((g, expected_speedup(0.9, g, 0.5)) for g in range(1, 17)), key=lambda p: p[1]
    )
    assert best_gamma(0.3, 0.5, range(1, 17))[1] < 1
    assert best_gamma(0.9, 0.5, [4]) == (4, expected_speedup(0.9, 4, 0.5))


def full_model_cache(deep, arch):
    """``(model, tokens, cache, greedy)``: a full forward of a repeated prompt."""
    model, tokenizer = deep(arch)
    tokens = mx.array(tokenizer.encode(PROMPTS[1] + " " + PROMPTS[0]) * 2)
    cache = make_prompt_cache(model)
    _, greedy = block_influence(model, tokens, cache)
    mx.eval(greedy, [c.state for c in cache])
    return model, tokens, cache, greedy


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "phi3"])
def test_batched_agreement_matches_step_by_step(deep, arch):
    """One masked forward of the kept blocks scores the same positions as one
    forward per position, and leaves the search cache as it found it."""
    model, tokens, cache, greedy = full_model_cache(deep, arch)
    before = [mx.array(c.state[0][..., : c.offset, :]) for c in cache]
    for kept in ([0, 2, 5], [0, 1, 2, 3, 5], [4]):
        for positions in (12, tokens.size):
            batched = agreement(model, kept, tokens, greedy, cache, positions).item()
            stepwise = agreement_stepwise(model, kept, tokens, greedy, cache, positions)
            assert batched == stepwise.item(), (kept, positions)
    # Caches tree attention cannot read fall back to the step-by-step forwards.
    assert _masked_forward_ready(model, cache)
    assert not _masked_forward_ready(model, [RotatingKVCache(max_size=8)])
    # Every block kept reproduces the full model's own argmax everywhere.
    assert (
        agreement(model, list(range(DEEP_LAYERS)), tokens, greedy, cache, 12).item()
        == 1
    )
    assert [c.offset for c in cache] == [tokens.size] * DEEP_LAYERS
    for c, keys in zip(cache, before):
        assert mx.array_equal(c.state[0][..., : c.offset, :], keys)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "phi3"])
def test_search_in_context_reruns_the_targets_last_tokens(deep, arch):
    """On the target's own cache the search re-runs the last tokens against
    the whole context: the same greedy tokens and agreement as the full model
    and as one forward per position, and the cache is left as it was."""
    model, tokens, cache, greedy = full_model_cache(deep, arch)
    before = [mx.array(c.state[0][..., : c.offset, :]) for c in cache]
    tail = tokens[-12:]
    influence, tail_greedy = context_influence(model, cache, tail)
    assert influence.shape == (DEEP_LAYERS,)
    assert tail_greedy.tolist() == greedy[-12:].tolist()
    for kept in ([0, 2, 5], [0, 1, 2, 3, 5], [4]):
        in_context = agreement(model, kept, tail, tail_greedy, cache, 12).item()
        stepwise = agreement_stepwise(model, kept, tokens, greedy, cache, 12)
        assert in_context == stepwise.item(), kept
    skipped, report = choose_skipped_layers(model, tokens, [2], cache)
    assert report["in_context"] and len(report["scored"]) > 1
    assert [c.offset for c in cache] == [tokens.size] * DEEP_LAYERS
    for c, keys in zip(cache, before):
        assert mx.array_equal(c.state[0][..., : c.offset, :], keys)
    # A cache tree attention cannot read: the window is searched on its own.
    _, alone = choose_skipped_layers(model, tokens, [2], [RotatingKVCache(8)] * 6)
    assert not alone["in_context"]


def _checked_drafter(deep, gammas, accepted_per_round, drafted=4):
    """A searched drafter after :data:`CHECK_ROUNDS` rounds of ``drafted``
    tokens with ``accepted_per_round`` accepted each."""
    model, _ = deep("llama")
    target = CachedModel(model, None, KVSettings(), "target model")
    drafter = SelfDrafter(target, 512, gammas=gammas)
    drafter._adopt(dict(skipped=[2, 3], alpha=1.0, cost=0.5, speedup=2.0))
    proposal = Proposal(mx.zeros((drafted,), mx.uint32), None, forwards=drafted)
    for _ in range(CHECK_ROUNDS):
        drafter.commit(None, proposal, accepted_per_round)
    return drafter


def test_check_uses_per_token_acceptance_at_the_best_length(deep):
    # 1 of 4 accepted each round: 2 tokens tested (the 2nd rejected), alpha 1/2.
    low = _checked_drafter(deep, range(1, 9), 1)
    assert low.search["realized_alpha"] == 0.5 and low.acceptance_estimate == 0.5
    assert low.search["realized_speedup"] == best_gamma(0.5, 0.5, range(1, 9))[1] < 1
    assert not low.drafting
    # 3 of 4: alpha 3/4, which pays at γ = 1 though not at the 4 drafted.
    high = _checked_drafter(deep, range(1, 9), 3)
    assert high.search["realized_alpha"] == 0.75
    assert high.search["realized_gamma"] == 1 and high.drafting
    assert not _checked_drafter(deep, (4,), 3).drafting  # fixed γ = 4 does not pay
    # All accepted: every draft token tested passed.
    assert _checked_drafter(deep, (4,), 4).search["realized_alpha"] == 1.0


def test_bad_knobs_get_one_line_errors(load_model, deep):
    model, _ = deep("llama")
    target = CachedModel(model, None, KVSettings(), "target model")
    for skipped in ([6], [-1], list(range(6))):
        with pytest.raises(ValueError, match="skipped layers") as err:
            SelfDrafter(target, 512, skipped=skipped)
        assert "\n" not in str(err.value)
    one_layer, _ = load_model("llama-unrelated")
    with pytest.raises(ValueError, match="at least 2 layers"):
        self_tokens(one_layer, [1, 2, 3], 4)
    with pytest.raises(ValueError, match="keeps no draft cache"):
        self_tokens(model, [1, 2, 3], 4, prompt_cache=make_prompt_cache(model) * 2)


class _Stage:
    """Rank 0 of 2 pipeline stages, for mlx-lm's ``pipeline()``."""

    def rank(self):
        return 0

    def size(self):
        return 2


def test_a_pipeline_stage_refuses_self_and_auto_drafts_without_it(tmp_path):
    # Stage 0 of a 4-block qwen2 holds blocks 2 and 3, stage 1 blocks 0 and 1:
    # each would search its own blocks alone, and auto built a self arm there.
    from mlx_spec.drafters.auto import make_auto_drafter

    path = make_checkpoint(tmp_path / "q", "qwen2", num_layers=4, seed=3)
    model, _ = mlx_lm.load(str(path))
    model.model.pipeline(_Stage())
    target = CachedModel(model, None, KVSettings(), "target model")
    with pytest.raises(ValueError) as error:
        SelfDrafter(target, 512)
    assert str(error.value) == ON_PIPELINE_STAGES
    auto = make_auto_drafter(SpecConfig(method="auto"), target, None, None, None, 512)
    assert set(auto.arms) == {"lookup"}


def test_quantized_kv_cache_greedy_identity(tmp_path, always_draft):
    # Quantisation groups need a head dimension of at least 32.
    path = make_checkpoint(
        tmp_path / "q", "qwen3", hidden_size=128, num_layers=4, seed=5
    )
    model, tokenizer = mlx_lm.load(str(path))
    ids = tokenizer.encode(PROMPTS[0])
    kv = dict(kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    stats = SpecStats()
    assert self_tokens(model, ids, 20, stats, 3, **kv) == plain_tokens(
        model, ids, 20, **kv
    )
    assert stats.draft_tokens > 0


def test_logits_processors_applied_per_position(deep, always_draft):
    from mlx_lm.sample_utils import make_logits_processors

    model, tokenizer = deep("phi3")
    ids = tokenizer.encode(PROMPTS[1])
    processors = make_logits_processors(
        repetition_penalty=1.5, repetition_context_size=8
    )
    expected = plain_tokens(model, ids, 20, logits_processors=processors)
    assert expected != plain_tokens(model, ids, 20)  # the penalty changes the output
    got = self_tokens(model, ids, 20, None, 3, logits_processors=processors)
    assert got == expected


def test_plain_rounds_are_queued_and_stay_exact(deep, monkeypatch):
    """Rounds known to draft nothing queue their target step before the
    previous round's sync (no propose call); output, caches and the sampled
    stream are as without queueing."""
    model, tokenizer = deep("llama")
    calls = []
    propose = SelfDrafter.propose

    def counting(self, state, gamma):
        calls.append(len(state.seq))
        return propose(self, state, gamma)

    def factory(config, target, draft_model, cache, kv, vocab_size):
        return SelfDrafter(target, vocab_size, retune_after=10, min_speedup=100.0)

    monkeypatch.setattr(SelfDrafter, "propose", counting)
    monkeypatch.setitem(DRAFTER_FACTORIES, "self", factory)
    ids = tokenizer.encode(PROMPTS[0])
    stats = SpecStats()
    assert self_tokens(model, ids, 30, stats) == plain_tokens(model, ids, 30)
    assert stats.draft_tokens == 0 and stats.target_forwards == 30
    # Proposals only in the first round and the re-tune's round.
    assert calls == [len(ids), len(ids) + 10]

    cache = make_prompt_cache(model)
    config = SpecConfig(method="self", max_tokens=50)
    steps = speculative_generate_step(
        mx.array(ids), model, config=config, prompt_cache=cache
    )
    first = [t for _, (t, _, _) in zip(range(7), steps)]
    steps.close()  # a queued step is pending
    assert [c.offset for c in cache] == [len(ids) + 7] * DEEP_LAYERS
    more = speculative_generate_step(
        mx.array(tokenizer.encode("\n")), model, config=config, prompt_cache=cache
    )
    assert [t for t, _, _ in more][:12] == plain_tokens(
        model, ids + first + tokenizer.encode("\n"), 12
    )

    sampled = []
    for profile in (False, True):  # profiling syncs twice a round: no queueing
        mx.random.seed(5)
        config = SpecConfig(method="self", max_tokens=25, profile=profile)
        steps = speculative_generate_step(
            mx.array(ids), model, config=config, sampler=make_sampler(1.5)
        )
        sampled.append([t for t, _, _ in steps])
    assert sampled[0] == sampled[1]
