"""The draft-model engine: greedy identity, caches, sampling statistics."""

import math

import mlx.core as mx
import numpy as np
import pytest
from law_checks import assert_counts_follow_law
from mlx_lm.generate import GenerationResponse, generate_step
from mlx_lm.generate import stream_generate as mlx_lm_stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors

import mlx_spec
from mlx_spec import SpecStats, speculative_generate_step, stream_generate
from mlx_spec.sampling import SamplingParams, processed_logprobs

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Parser:\n    def __init__(self",
]


def plain_tokens(model, prompt, max_tokens, **kwargs):
    return [
        t
        for t, _ in generate_step(
            mx.array(prompt), model, max_tokens=max_tokens, **kwargs
        )
    ]


def spec_tokens(model, draft, prompt, max_tokens, gamma, **kwargs):
    steps = speculative_generate_step(
        mx.array(prompt),
        model,
        draft,
        num_draft_tokens=gamma,
        max_tokens=max_tokens,
        **kwargs,
    )
    return [t for t, _, _ in steps]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identity_across_architectures(load_model, arch):
    model, tokenizer = load_model(arch)
    draft, _ = load_model(f"{arch}-near")
    for prompt in PROMPTS[:2]:
        ids = tokenizer.encode(prompt)
        expected = plain_tokens(model, ids, 24)
        for gamma in (1, 2, 4, 8):
            assert spec_tokens(model, draft, ids, 24, gamma) == expected, (
                prompt,
                gamma,
            )


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 13])
def test_max_tokens_mid_round(load_model, max_tokens):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[2])
    expected = plain_tokens(model, ids, max_tokens)
    got = spec_tokens(model, draft, ids, max_tokens, 4)
    assert got == expected and len(got) == max_tokens


def test_self_draft_accepts_everything(load_model):
    model, tokenizer = load_model("qwen2")
    stats = SpecStats()
    ids = tokenizer.encode(PROMPTS[0])
    got = spec_tokens(model, model, ids, 20, 4, stats=stats)
    assert got == plain_tokens(model, ids, 20)
    assert stats.acceptance_rate == 1.0
    assert stats.accepted_per_round[:3] == [4, 4, 4]
    assert stats.tokens_per_target_forward == pytest.approx(20 / stats.target_forwards)


def test_unrelated_draft_is_still_exact(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-unrelated")
    ids = tokenizer.encode(PROMPTS[1])
    assert spec_tokens(model, draft, ids, 30, 3) == plain_tokens(model, ids, 30)


def test_padded_vocabularies_work(load_model):
    model, tokenizer = load_model("qwen2-padded")
    draft, _ = load_model("qwen2-padded-near")
    ids = tokenizer.encode(PROMPTS[0])
    assert spec_tokens(
        model, draft, ids, 20, 4, tokenizer_size=len(tokenizer)
    ) == plain_tokens(model, ids, 20)


def test_stream_generate_matches_mlx_lm_text_and_eos_mid_round(load_model):
    model, tokenizer = load_model("mistral")
    draft, _ = load_model("mistral-near")
    prompt = PROMPTS[0]
    saved = set(tokenizer.eos_token_ids)
    try:
        tokenizer.eos_token_ids = set()
        reference = [
            r.token
            for r in mlx_lm_stream_generate(model, tokenizer, prompt, max_tokens=30)
        ]
        # Make a token from the middle of the output the end-of-sequence token.
        tokenizer.eos_token_ids = {reference[9]}
        ref = list(mlx_lm_stream_generate(model, tokenizer, prompt, max_tokens=30))
        for gamma in (2, 4, 8):
            ours = list(
                stream_generate(
                    model,
                    tokenizer,
                    prompt,
                    draft_model=draft,
                    num_draft_tokens=gamma,
                    max_tokens=30,
                )
            )
            assert [r.token for r in ours] == [r.token for r in ref]
            assert "".join(r.text for r in ours) == "".join(r.text for r in ref)
            assert ours[-1].finish_reason == ref[-1].finish_reason == "stop"
            assert isinstance(ours[-1], GenerationResponse)
            assert ours[-1].stats.generated_tokens >= len(ours)
    finally:
        tokenizer.eos_token_ids = saved


def test_arguments_follow_mlx_lms_order(load_model):
    """``max_tokens`` is the fourth argument, as in ``mlx_lm.stream_generate``;
    a draft model passed there (the order of old) is refused in one line."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ours = [r.token for r in stream_generate(model, tokenizer, PROMPTS[1], 7, draft)]
    ref = [r.token for r in mlx_lm_stream_generate(model, tokenizer, PROMPTS[1], 7)]
    assert ours == ref
    with pytest.raises(TypeError, match="pass the draft model as draft_model="):
        stream_generate(model, tokenizer, PROMPTS[1], draft)
    with pytest.raises(TypeError, match="pass the draft model as draft_model="):
        mlx_spec.generate(model, tokenizer, PROMPTS[1], draft)


def test_logits_processors_applied_per_position(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[1])
    processors = make_logits_processors(
        repetition_penalty=1.5, repetition_context_size=8
    )
    expected = plain_tokens(model, ids, 30, logits_processors=processors)
    assert expected != plain_tokens(model, ids, 30)  # the penalty changes the output
    for gamma in (1, 3, 6):
        assert (
            spec_tokens(model, draft, ids, 30, gamma, logits_processors=processors)
            == expected
        )


def test_quantized_kv_cache_greedy_identity(tmp_path):
    from mlx_lm import load

    from mlx_spec.testing import make_checkpoint

    # Quantisation groups need a head dimension of at least 32.
    target_dir = make_checkpoint(tmp_path / "t", "qwen3", hidden_size=128, seed=5)
    draft_dir = make_checkpoint(
        tmp_path / "d", "qwen3", hidden_size=128, base=target_dir, noise=0.05
    )
    model, tokenizer = load(str(target_dir))
    draft, _ = load(str(draft_dir))
    ids = tokenizer.encode(PROMPTS[0])
    kv = dict(kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    expected = plain_tokens(model, ids, 20, **kv)
    assert spec_tokens(model, draft, ids, 20, 3, **kv) == expected


def _next_logits(model, cache, token):
    return model(mx.array([[token]]), cache=cache)[0, -1]


def _check_cache_holds(model, cache, tokens):
    """The cache must give the same next-token logits as a fresh prefill of tokens."""
    fresh = make_prompt_cache(model)
    model(mx.array([tokens[:-1]]), cache=fresh)
    expected = _next_logits(model, fresh, tokens[-1])
    assert cache[0].offset == len(tokens)
    for c in cache:
        c.trim(1)
    got = _next_logits(model, cache, tokens[-1])
    assert mx.abs(got - expected).max().item() < 1e-4


@pytest.mark.parametrize("stop_after", [1, 3, 6, 17])
def test_cache_consistent_after_early_close(load_model, stop_after):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[0])
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    steps = speculative_generate_step(
        mx.array(ids),
        model,
        draft,
        num_draft_tokens=5,
        max_tokens=100,
        prompt_cache=cache,
    )
    got = []
    for token, _, _ in steps:
        got.append(token)
        if len(got) == stop_after:
            break
    steps.close()
    assert got == plain_tokens(model, ids, stop_after)
    n = len(model.layers)
    _check_cache_holds(model, cache[:n], ids + got)
    _check_cache_holds(draft, cache[n:], ids + got)


def test_multi_turn_prompt_cache_reuse(load_model):
    model, tokenizer = load_model("phi3")
    draft, _ = load_model("phi3-near")
    first, second = tokenizer.encode(PROMPTS[0]), tokenizer.encode("\n\nclass A:")
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    turn1 = spec_tokens(model, draft, first, 12, 4, prompt_cache=cache)
    turn2 = spec_tokens(model, draft, second, 12, 4, prompt_cache=cache)
    assert turn1 == plain_tokens(model, first, 12)
    assert turn2 == plain_tokens(model, first + turn1 + second, 12)


@pytest.mark.parametrize("temp", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_round_normalises_only_the_rows_it_reads(load_model, monkeypatch, temp):
    """The target's logits are normalised for the tokens a round emits (their
    logprobs are yielded), never for rejected positions. Sampling adds the
    rows acceptance reads: the target's law at each drafted position and the
    draft's law of each draft token (the recovered token's row is a softmax)."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    rows, logsumexp = [], mx.logsumexp

    def spy(a, *args, **kwargs):
        rows.append(a.size // a.shape[-1])
        return logsumexp(a, *args, **kwargs)

    monkeypatch.setattr(mx, "logsumexp", spy)
    stats = SpecStats()
    mx.random.seed(0)
    sampler = mlx_spec.make_sampler(temp)
    ids = tokenizer.encode(PROMPTS[1])
    spec_tokens(model, draft, ids, 40, 4, stats=stats, sampler=sampler)
    assert stats.accepted_tokens < stats.draft_tokens  # some rows were rejected
    emitted = stats.accepted_tokens + stats.rounds
    read = 0 if temp == 0 else 2 * stats.draft_tokens
    assert sum(rows) == emitted + read


def test_seed_makes_sampling_reproducible(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")

    def run(seed):
        return [
            r.token
            for r in stream_generate(
                model,
                tokenizer,
                PROMPTS[0],
                draft_model=draft,
                temp=0.8,
                top_p=0.95,
                max_tokens=20,
                seed=seed,
            )
        ]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_top_p_zero_is_off_in_the_python_api(load_model):
    """top_p=0 turns top-p off, as in mlx_lm's make_sampler: the same draws as top_p=1."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")

    def run(top_p):
        responses = stream_generate(
            model,
            tokenizer,
            PROMPTS[0],
            draft_model=draft,
            temp=0.8,
            top_p=top_p,
            max_tokens=16,
            seed=5,
        )
        return [r.token for r in responses]

    assert run(0.0) == run(1.0)
    assert run(0.0) != run(0.05)  # a real cut changes the draws


def test_sampled_first_token_follows_target_law(load_model):
    """Chi-square of the first emitted token against the exact target law, and
    the first draft token's acceptance frequency against sum(min(p, q))."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("The quick brown fox")
    params = SamplingParams(temp=1.0)
    sampler = mlx_spec.make_sampler(1.0)

    def law(m):
        logits = m(mx.array([ids]))[0, -1:]
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return np.exp(np.array(processed_logprobs(lp, params)[0], dtype=np.float64))

    p, q = law(model), law(draft)
    mx.random.seed(0)
    runs = 600
    counts, accepted = np.zeros(p.size), 0
    for _ in range(runs):
        stats = SpecStats()
        steps = speculative_generate_step(
            mx.array(ids),
            model,
            draft,
            num_draft_tokens=1,
            max_tokens=2,
            sampler=sampler,
            stats=stats,
        )
        token, _, _ = next(steps)
        steps.close()
        counts[token] += 1
        accepted += stats.accepted_per_round[0]
    assert_counts_follow_law(counts, p)
    overlap = np.minimum(p, q).sum()
    assert 0.05 < overlap < 0.99
    rate = accepted / runs
    assert abs(rate - overlap) < 4 * math.sqrt(overlap * (1 - overlap) / runs)


def test_opaque_sampler_uses_sample_and_match(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[0])
    greedy = lambda logprobs: mx.argmax(
        logprobs, axis=-1
    )  # noqa: E731 (no sampling_params)
    assert spec_tokens(model, draft, ids, 16, 3, sampler=greedy) == plain_tokens(
        model, ids, 16
    )


def test_mlx_lm_greedy_sampler_is_recognised_as_greedy():
    from mlx_lm.sample_utils import make_sampler as lm_make_sampler

    from mlx_spec.sampling import sampling_params_of

    assert sampling_params_of(lm_make_sampler(0.0)).greedy
    assert sampling_params_of(lm_make_sampler(0.7)) is None  # opaque: match mode


@pytest.mark.parametrize("method", ["none", "draft"])
def test_prompt_progress_is_reported_per_chunk(load_model, method):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[0] * 3)
    calls = []
    stream = stream_generate(
        model,
        tokenizer,
        ids,
        draft_model=draft,
        speculative=method,
        max_tokens=2,
        prefill_step_size=4,
        prompt_progress_callback=lambda done, total: calls.append((done, total)),
    )
    list(stream)
    assert calls[-1] == (len(ids), len(ids))
    assert len(calls) >= (len(ids) - 1) // 4
    assert all(total == len(ids) for _, total in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_method_none_in_the_step_api_names_the_plain_decoding_entry_points(
    load_model,
):
    model, tokenizer = load_model("llama")
    config = mlx_spec.SpecConfig(method="none", max_tokens=4)
    prompt = mx.array(tokenizer.encode("x = 1"))
    with pytest.raises(ValueError, match="method 'none' is plain decoding") as e:
        next(speculative_generate_step(prompt, model, None, config=config))
    assert "\n" not in str(e.value)
