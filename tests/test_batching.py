"""``mlx_spec.batch_generate``: mlx_lm's batch API with speculation per row.

Every row must equal plain mlx_lm decoding of its prompt alone (greedy),
whether the rows decode together or, for methods and models the batch does
not run, one at a time; returned caches continue each conversation exactly.
"""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

import mlx_spec
from mlx_spec import batching

PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "The quick brown fox",
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n",
)
LIMITS = [20, 30, 12, 25]


def _plain(model, tokenizer, ids, n):
    return [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, ids, max_tokens=n)
    ]


def _assert_plain(model, tokenizer, prompts, out, limits):
    for ids, got, n in zip(prompts, out.token_ids, limits):
        ref = _plain(model, tokenizer, ids, n)
        if len(got) < n:  # stopped at EOS, which is left out as in mlx_lm
            assert ref[len(got)] in tokenizer.eos_token_ids
        assert got == ref[: len(got)]


@pytest.mark.parametrize(
    "method, batched",
    [
        ("auto", True),
        ("draft", True),
        ("lookup", True),
        ("none", True),
        ("tree", False),
        ("self", False),
    ],
)
def test_every_row_equals_plain_mlx_lm(load_model, method, batched):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    out = mlx_spec.batch_generate(
        model,
        tokenizer,
        prompts,
        draft_model=draft,
        speculative=method,
        max_tokens=LIMITS,
        return_token_ids=True,
    )
    assert out.batched is batched
    _assert_plain(model, tokenizer, prompts, out, LIMITS)
    assert out.texts == [tokenizer.decode(t) for t in out.token_ids]
    assert out.stats.generation_tokens == sum(map(len, out.token_ids))
    assert [s.method for s in out.spec_stats] == [method] * len(PROMPTS)


def test_the_texts_equal_mlx_lm_batch_generate(load_model):
    model, tokenizer = load_model("qwen3")
    draft, _ = load_model("qwen3-near")
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    ours = mlx_spec.batch_generate(
        model, tokenizer, PROMPTS, draft_model=draft, max_tokens=16
    )
    theirs = mlx_lm.batch_generate(model, tokenizer, prompts, max_tokens=16)
    assert ours.texts == theirs.texts


def test_a_model_without_batched_rollback_runs_one_prompt_at_a_time(load_model, capsys):
    model, tokenizer = load_model("gemma3")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:2]]
    out = mlx_spec.batch_generate(
        model,
        tokenizer,
        prompts,
        speculative="lookup",
        max_tokens=[10, 14],
        return_token_ids=True,
        verbose=True,
    )
    assert not out.batched
    assert "One prompt at a time: its caches" in capsys.readouterr().out
    _assert_plain(model, tokenizer, prompts, out, [10, 14])


@pytest.mark.parametrize("method", ["draft", "tree"])
def test_returned_caches_continue_each_row_exactly(load_model, method):
    """A cache holds the prompt and the response (the target's layers, as
    mlx_lm returns them), so plain decoding goes on from it."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    out = mlx_spec.batch_generate(
        model,
        tokenizer,
        prompts,
        draft_model=draft,
        speculative=method,
        max_tokens=18,
        return_token_ids=True,
        return_prompt_caches=True,
    )
    follow_up = tokenizer.encode(" and then")
    for ids, tokens, cache in zip(prompts, out.token_ids, out.caches):
        assert len(cache) == len(model.layers)
        assert cache[0].offset == len(ids) + len(tokens)
        went_on = _plain_from(model, tokenizer, follow_up, cache, 10)
        assert went_on == _plain(model, tokenizer, ids + tokens + follow_up, 10)


def _plain_from(model, tokenizer, ids, cache, n):
    steps = mlx_lm.stream_generate(
        model, tokenizer, ids, max_tokens=n, prompt_cache=cache
    )
    return [r.token for r in steps]


def test_sampled_rows_repeat_with_a_seed_and_report_the_targets_logprobs(
    load_model, monkeypatch
):
    """A seeded sampled batch is planned by the fixed cost model, not the
    clock, so it repeats; its logprobs are the target's."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    made = []
    original = batching.SpecBatchGenerator

    def generator(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(batching, "SpecBatchGenerator", generator)
    runs = [
        mlx_spec.batch_generate(
            model,
            tokenizer,
            prompts,
            draft_model=draft,
            speculative="draft",
            temp=0.8,
            seed=7,
            max_tokens=16,
            return_token_ids=True,
            return_logprobs=True,
        )
        for _ in range(2)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    assert len(made) == 2 and all(not gen.planner.timed for gen in made)
    assert all(gen.planner.costs.rounds == 0 and gen.rounds for gen in made)
    for ids, tokens, logprobs in zip(prompts, runs[0].token_ids, runs[0].logprobs):
        logits = model(mx.array([ids + tokens]))[0, len(ids) - 1 : -1]
        law = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        expected = np.array(law)[np.arange(len(tokens)), tokens]
        assert np.allclose(logprobs, expected, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=[5, 6]), "max_tokens has 2 values for 3 prompts"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(temp=-1.0), "temp"),
        (dict(speculative="draft"), "needs a --draft-model"),
    ],
)
def test_bad_arguments_name_what_is_wrong(load_model, kwargs, message):
    model, tokenizer = load_model("llama")
    with pytest.raises(ValueError, match=message):
        mlx_spec.batch_generate(model, tokenizer, list(PROMPTS[:3]), **kwargs)


def test_an_empty_prompt_is_refused(load_model):
    model, tokenizer = load_model("llama")
    with pytest.raises(ValueError, match="empty"):
        mlx_spec.batch_generate(model, tokenizer, ["hello", []])


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_head_given_as_draft_decodes_one_prompt_at_a_time(load_model, kind):
    """A head cannot join the batch's draft forward: ``auto`` with one runs
    each prompt alone, exactly (a head was called as a model before)."""
    from mlx_spec.drafters.heads import random_head

    model, tokenizer = load_model("llama")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:2]]
    head = random_head(kind, model, seed=2)
    out = mlx_spec.batch_generate(
        model,
        tokenizer,
        prompts,
        draft_model=head,
        max_tokens=10,
        return_token_ids=True,
    )
    assert not out.batched
    _assert_plain(model, tokenizer, prompts, out, [10, 10])


def test_more_prompts_than_the_batch_holds_prefill_only_what_fits(load_model):
    model, tokenizer = load_model("llama")
    prompts = [tokenizer.encode(p) for p in PROMPTS] * 2
    out = mlx_spec.batch_generate(
        model, tokenizer, prompts, max_batch=3, max_tokens=8, return_token_ids=True
    )
    assert out.batched
    _assert_plain(model, tokenizer, prompts, out, [8] * len(prompts))


@pytest.mark.parametrize("method", ["draft", "tree"])
def test_the_sampling_law_reaches_every_row(load_model, method):
    """top_k=1 leaves one token to sample at any temperature: the rows are
    greedy decoding, batched (draft) or alone (tree)."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    out = mlx_spec.batch_generate(
        model,
        tokenizer,
        prompts,
        draft_model=draft,
        speculative=method,
        temp=0.9,
        top_k=1,
        seed=3,
        max_tokens=12,
        return_token_ids=True,
    )
    _assert_plain(model, tokenizer, prompts, out, [12] * 3)


def test_arguments_follow_mlx_lms_order(load_model):
    """The fourth argument is mlx-lm's prompt_caches: a model there is refused in one line."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    with pytest.raises(TypeError, match="pass the draft model as draft_model="):
        mlx_spec.batch_generate(model, tokenizer, ["hi"], draft)
    out = mlx_spec.batch_generate(model, tokenizer, ["hi"], None, 3, draft_model=draft)
    assert len(out.texts) == 1
