"""register()/unregister(): mlx_lm's own functions routed through mlx-spec."""

import importlib
import sys
import types

import mlx.core as mx
import mlx_lm
import mlx_lm.chat
import mlx_lm.server
import pytest
from mlx_lm.generate import GenerationResponse
from mlx_lm.models.cache import make_prompt_cache

import mlx_spec
from mlx_spec import integration
from mlx_spec.config import METHODS, plan_method
from mlx_spec.generation import HISTORY_KEY, history_kwargs
from mlx_spec.sampling import SamplingParams

lm_generate = importlib.import_module("mlx_lm.generate")
lm_sample_utils = importlib.import_module("mlx_lm.sample_utils")

PROMPTS = ("def fibonacci(n):", "import os\nimport sys\n")
MAX_TOKENS = 24
# What a call with a draft model and no speculative= runs.
DEFAULT_METHOD = plan_method(None, draft_model=object())[0]

ORIGINALS = {
    "stream_generate": lm_generate.stream_generate,
    "generate": lm_generate.generate,
    "batch_generate": lm_generate.batch_generate,
    "make_sampler": lm_sample_utils.make_sampler,
}
# (module, attribute) pairs that register() must patch.
PATCHED_NAMES = [
    (mlx_lm, "stream_generate"),
    (mlx_lm, "generate"),
    (lm_generate, "stream_generate"),
    (lm_generate, "generate"),
    (mlx_lm, "batch_generate"),
    (lm_generate, "batch_generate"),
    (lm_generate, "make_sampler"),
    (lm_sample_utils, "make_sampler"),
    (mlx_lm.server, "stream_generate"),
    (mlx_lm.server, "make_sampler"),
    (mlx_lm.chat, "stream_generate"),
    (mlx_lm.chat, "make_sampler"),
]


@pytest.fixture
def registered():
    mlx_spec.register()
    yield
    mlx_spec.unregister()


@pytest.fixture(scope="module")
def pair(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    return model, tokenizer, draft


@pytest.fixture(scope="module")
def references(pair):
    """Unpatched greedy mlx_lm decoding (no draft) of each prompt."""
    assert not integration.is_registered()
    model, tokenizer, _ = pair
    return {
        p: [
            r.token
            for r in ORIGINALS["stream_generate"](
                model, tokenizer, p, max_tokens=MAX_TOKENS
            )
        ]
        for p in PROMPTS
    }


def _tokens(responses):
    return [r.token for r in responses]


def test_register_patches_every_name_and_unregister_restores_identity():
    mlx_spec.register()
    mlx_spec.register()  # idempotent
    try:
        for module, name in PATCHED_NAMES:
            assert getattr(module, name) is getattr(integration, name), (module, name)
    finally:
        mlx_spec.unregister()
    mlx_spec.unregister()  # idempotent
    for module, name in PATCHED_NAMES:
        assert getattr(module, name) is ORIGINALS[name], (module, name)


def test_module_imported_after_register_is_restored_too():
    mlx_spec.register()
    try:
        late = types.ModuleType("late_user_script")
        exec("from mlx_lm import generate, stream_generate", late.__dict__)
        sys.modules[late.__name__] = late
        assert late.stream_generate is integration.stream_generate
    finally:
        mlx_spec.unregister()
        sys.modules.pop("late_user_script", None)
    assert late.stream_generate is ORIGINALS["stream_generate"]
    assert late.generate is ORIGINALS["generate"]


@pytest.mark.parametrize("num_draft_tokens", [1, 3, 5])
def test_registered_stream_generate_with_draft_equals_unpatched_greedy(
    registered, pair, references, num_draft_tokens
):
    model, tokenizer, draft = pair

    def speculate(prompt, **kwargs):
        return list(
            mlx_lm.stream_generate(
                model,
                tokenizer,
                prompt,
                max_tokens=MAX_TOKENS,
                draft_model=draft,
                num_draft_tokens=num_draft_tokens,
                **kwargs,
            )
        )

    for prompt in PROMPTS:
        responses = speculate(prompt)
        assert _tokens(responses) == references[prompt]
        assert all(isinstance(r, GenerationResponse) for r in responses)
        # auto drafts with the model at least in its warm-up round (this
        # same-size draft does not pay, so it may keep to plain rounds after).
        assert responses[-1].stats.draft_tokens > 0
        assert responses[-1].stats.auto_rounds["draft"] >= 1
        assert responses[-1].finish_reason == "length"
        assert responses[-1].stats.method == DEFAULT_METHOD
        # The adaptive chain may keep to plain rounds after its first (γ 0);
        # a fixed one drafts every round.
        chain = speculate(prompt, speculative="draft")
        assert _tokens(chain) == references[prompt]
        assert chain[-1].stats.draft_tokens > 0
        fixed = speculate(prompt, speculative="draft", adaptive=False)
        assert _tokens(fixed) == references[prompt]
        assert any(r.from_draft for r in fixed)


def test_registered_generate_equals_unpatched_and_our_api(registered, pair, references):
    model, tokenizer, draft = pair
    prompt = PROMPTS[0]
    plain = ORIGINALS["generate"](model, tokenizer, prompt, max_tokens=MAX_TOKENS)
    routed = mlx_lm.generate(
        model, tokenizer, prompt, max_tokens=MAX_TOKENS, draft_model=draft
    )
    ours = mlx_spec.generate(
        model, tokenizer, prompt, draft_model=draft, max_tokens=MAX_TOKENS
    )
    assert routed == plain == ours
    # mlx_lm's own speculative loop agrees too (greedy).
    unpatched_spec = ORIGINALS["generate"](
        model, tokenizer, prompt, max_tokens=MAX_TOKENS, draft_model=draft
    )
    assert unpatched_spec == plain


def test_registered_verbose_generate_prints_stats_line(registered, pair, capsys):
    model, tokenizer, draft = pair
    mlx_lm.generate(
        model, tokenizer, PROMPTS[0], verbose=True, max_tokens=8, draft_model=draft
    )
    out = capsys.readouterr().out
    assert out.startswith("==========")
    assert "Generation: 8 tokens" in out
    assert f"Speculation: {DEFAULT_METHOD}" in out


# Methods that draft with a trained head or the model's own MTP layer; their
# greedy identity is tested with real heads in test_heads.py and test_mtp.py.
HEAD_METHODS = ("eagle", "eagle-chain", "medusa", "mtp", "dflash")


@pytest.mark.parametrize("method", HEAD_METHODS)
def test_head_methods_without_their_head_are_refused_in_one_line(
    registered, pair, method
):
    model, tokenizer, _ = pair
    with pytest.raises(ValueError) as err:
        list(
            mlx_lm.stream_generate(
                model, tokenizer, PROMPTS[1], max_tokens=4, speculative=method
            )
        )
    message = str(err.value)
    assert "\n" not in message and f"--speculative {method}" in message


@pytest.mark.parametrize("method", [m for m in METHODS if m not in HEAD_METHODS])
def test_every_method_through_mlx_lm_equals_greedy(
    registered, pair, references, method
):
    model, tokenizer, draft = pair
    prompt = PROMPTS[1]
    # Methods without a draft model are asked for by the keyword alone.
    draft = draft if method in ("draft", "tree", "auto") else None
    try:
        responses = list(
            mlx_lm.stream_generate(
                model,
                tokenizer,
                prompt,
                max_tokens=MAX_TOKENS,
                draft_model=draft,
                speculative=method,
            )
        )
    except ValueError as e:
        if "not available" in str(e):
            pytest.skip(f"method {method} is not implemented yet")
        raise
    assert _tokens(responses) == references[prompt]


def test_speculative_keyword_without_draft_is_routed(registered, pair, references):
    model, tokenizer, _ = pair
    responses = list(
        mlx_lm.stream_generate(
            model, tokenizer, PROMPTS[0], max_tokens=MAX_TOKENS, speculative="none"
        )
    )
    assert _tokens(responses) == references[PROMPTS[0]]
    assert responses[-1].stats.method == "none"


def test_non_speculative_calls_run_the_original(registered, pair, references):
    model, tokenizer, _ = pair
    gen = mlx_lm.stream_generate(model, tokenizer, PROMPTS[0], max_tokens=MAX_TOKENS)
    assert gen.gi_code is ORIGINALS["stream_generate"].__code__
    responses = list(gen)
    assert _tokens(responses) == references[PROMPTS[0]]
    assert type(responses[-1]) is GenerationResponse
    assert not hasattr(responses[-1], "stats")


def test_prompt_cache_across_calls_matches_one_shot(registered, pair):
    model, tokenizer, draft = pair
    first, second = tokenizer.encode(PROMPTS[0]), tokenizer.encode(PROMPTS[1])
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    turn1 = _tokens(
        mlx_lm.stream_generate(
            model, tokenizer, first, max_tokens=8, draft_model=draft, prompt_cache=cache
        )
    )
    turn2 = _tokens(
        mlx_lm.stream_generate(
            model,
            tokenizer,
            second,
            max_tokens=8,
            draft_model=draft,
            prompt_cache=cache,
        )
    )
    one_shot = _tokens(
        ORIGINALS["stream_generate"](
            model, tokenizer, first + turn1 + second, max_tokens=8
        )
    )
    assert turn2 == one_shot


def test_make_sampler_is_tagged_and_keeps_its_law(registered):
    sampler = lm_sample_utils.make_sampler(0.7, top_p=0.9, top_k=5)
    assert sampler.sampling_params == SamplingParams(
        temp=0.7, top_p=0.9, min_p=0.0, top_k=5, min_tokens_to_keep=1
    )
    logits = mx.random.normal((1, 64))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.random.seed(3)
    ours = [sampler(logprobs).item() for _ in range(8)]
    mx.random.seed(3)
    original = ORIGINALS["make_sampler"](0.7, top_p=0.9, top_k=5)
    theirs = [original(logprobs).item() for _ in range(8)]
    assert ours == theirs

    greedy = lm_sample_utils.make_sampler(0.0)
    assert greedy.sampling_params.greedy
    assert greedy(logprobs).item() == mx.argmax(logprobs, axis=-1).item()
    # top_p=0 means "off" in mlx_lm, 1.0 in SamplingParams.
    assert lm_sample_utils.make_sampler(0.5).sampling_params.top_p == 1.0


def test_xtc_samplers_stay_opaque(registered):
    sampler = lm_sample_utils.make_sampler(0.7, xtc_probability=0.5, xtc_threshold=0.1)
    assert not hasattr(sampler, "sampling_params")


def test_sampled_registered_call_is_reproducible(registered, pair):
    model, tokenizer, draft = pair
    sampler = mlx_lm.sample_utils.make_sampler(0.8, top_p=0.95)
    runs = []
    for _ in range(2):
        mx.random.seed(11)
        runs.append(
            _tokens(
                mlx_lm.stream_generate(
                    model,
                    tokenizer,
                    PROMPTS[0],
                    max_tokens=16,
                    draft_model=draft,
                    sampler=sampler,
                )
            )
        )
    assert runs[0] == runs[1]


def test_unregistered_mlx_lm_rejects_speculative_keyword(pair):
    model, tokenizer, _ = pair
    assert not integration.is_registered()
    with pytest.raises(TypeError):
        list(mlx_lm.stream_generate(model, tokenizer, "x", speculative="none"))


def test_unmodified_mlx_lm_server_speculates_after_register(
    checkpoints, pair, references
):
    """mlx_lm's own server with a draft model, routed through mlx-spec."""
    import argparse
    import json
    import threading
    import urllib.request
    from http.server import ThreadingHTTPServer

    from mlx_lm.models.cache import LRUPromptCache

    args = argparse.Namespace(
        model=str(checkpoints["llama"]),
        draft_model=str(checkpoints["llama-near"]),
        adapter_path=None,
        num_draft_tokens=3,
        trust_remote_code=False,
        chat_template="",
        use_default_chat_template=False,
        chat_template_args={},
        temp=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        max_tokens=MAX_TOKENS,
        decode_concurrency=4,
        prompt_concurrency=2,
        prefill_step_size=512,
        prompt_cache_size=4,
        prompt_cache_bytes=None,
        kv_bits=None,
        kv_group_size=64,
        quantized_kv_start=0,
        pipeline=False,
        allowed_origins=["*"],
    )
    calls = []
    mlx_spec.register()
    spy = integration._spec_stream

    def counting(*a, **k):
        calls.append(k.get("draft_model") if "draft_model" in k else a[4])
        return spy(*a, **k)

    integration._spec_stream = counting
    generator = mlx_lm.server.ResponseGenerator(
        mlx_lm.server.ModelProvider(args), LRUPromptCache(4)
    )
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", 0),
        lambda *a, **k: mlx_lm.server.APIHandler(
            generator, *a, system_fingerprint="test", **k
        ),
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions",
            data=json.dumps({"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            body = json.loads(response.read())
    finally:
        httpd.shutdown()
        httpd.server_close()
        generator.stop_and_join()
        integration._spec_stream = spy
        mlx_spec.unregister()
    tokenizer = pair[1]
    assert body["choices"][0]["text"] == tokenizer.decode(references[PROMPTS[0]])
    assert len(calls) == 1 and calls[0] is not None


def test_registered_stream_generate_takes_mlx_lm_positional_arguments(
    registered, pair, references
):
    """mlx_lm's order: model, tokenizer, prompt, max_tokens, draft_model, stream."""
    model, tokenizer, draft = pair
    prompt = PROMPTS[0]
    stream = lm_generate.generation_stream
    routed = mlx_lm.stream_generate(
        model, tokenizer, prompt, MAX_TOKENS, draft, stream, num_draft_tokens=2
    )
    assert _tokens(routed) == references[prompt]
    plain = mlx_lm.stream_generate(model, tokenizer, prompt, MAX_TOKENS, None, stream)
    assert _tokens(plain) == references[prompt]


def test_registered_stream_generate_binds_arguments_like_mlx_lm(registered, pair):
    model, tokenizer, draft = pair
    stream = lm_generate.generation_stream
    with pytest.raises(TypeError):  # stream given twice
        mlx_lm.stream_generate(model, tokenizer, "x", 4, draft, stream, stream=stream)
    with pytest.raises(TypeError):  # one positional too many
        mlx_lm.stream_generate(model, tokenizer, "x", 4, draft, stream, None)


def test_greedy_samplers_are_one_tagged_object(registered):
    """mlx_lm's BatchGenerator samples a batch in one call only when rows share
    a sampler by identity, as its own greedy_sampler always does."""
    samplers = [
        lm_sample_utils.make_sampler(0.0),
        mlx_lm.server.make_sampler(0.0, top_p=0.9, top_k=5),
        lm_sample_utils.make_sampler(0, xtc_probability=0.5),
    ]
    assert all(s is samplers[0] for s in samplers)
    assert samplers[0] is integration.greedy_sampler
    assert samplers[0].sampling_params.greedy
    logprobs = mx.log(mx.array([[0.1, 0.6, 0.3]]))
    assert samplers[0](logprobs).item() == 1
    # Sampled laws still get a sampler of their own.
    assert lm_sample_utils.make_sampler(0.7) is not lm_sample_utils.make_sampler(0.7)


def test_history_kwargs_only_for_engines_that_take_history():
    def with_history(prompt, history_tokens=None):
        pass

    def without(prompt, **kwargs):
        pass

    assert history_kwargs(with_history, (1, 2, 3)) == {HISTORY_KEY: [1, 2, 3]}
    assert history_kwargs(with_history, []) == {}
    assert history_kwargs(without, [1, 2]) == {}


def test_registered_batch_generate_speculates_and_equals_unpatched(
    registered, pair, references
):
    model, tokenizer, draft = pair
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    out = mlx_lm.batch_generate(
        model,
        tokenizer,
        prompts,
        max_tokens=MAX_TOKENS,
        draft_model=draft,
        sampler=mlx_lm.sample_utils.make_sampler(0.0),
        completion_batch_size=8,
        return_token_ids=True,
    )
    assert isinstance(out, mlx_spec.SpecBatchResponse) and out.batched
    for p, tokens in zip(PROMPTS, out.token_ids):
        assert tokens == references[p][: len(tokens)]
    plain = mlx_lm.batch_generate(model, tokenizer, prompts, max_tokens=MAX_TOKENS)
    assert not isinstance(plain, mlx_spec.SpecBatchResponse)
    assert plain.texts == out.texts


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_caches=[None, None]), "prompt_caches"),
        (dict(logits_processors=[lambda t, x: x]), "logits_processors"),
        (dict(sampler=lambda x: mx.argmax(x, -1)), "make_sampler"),
    ],
)
def test_registered_batch_generate_refuses_what_it_cannot_honour(
    registered, pair, kwargs, message
):
    model, tokenizer, _ = pair
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    with pytest.raises(ValueError, match=message):
        mlx_lm.batch_generate(model, tokenizer, prompts, speculative="lookup", **kwargs)
