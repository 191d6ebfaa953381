"""The shipped default pair in models/ loads with mlx_lm and generates greedily."""

import json
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / "models"
TARGET = MODELS / "stdlib-llama-target"
DRAFT = MODELS / "stdlib-llama-draft"
PAIR = (TARGET, DRAFT)
MAX_PAIR_BYTES = 80 * 1024 * 1024
CODE = 'def f(x):\n\tif x:\n        return "héllo"  # ok\n\n\n    \nclass A(B): pass\n'

pytestmark = pytest.mark.skipif(
    not all((p / "model.safetensors").exists() for p in PAIR),
    reason="default model pair not present in models/",
)


@pytest.fixture(scope="module")
def pair():
    from mlx_lm import load

    return {p.name: load(str(p)) for p in PAIR}


def test_pair_is_llama_with_hf_layout():
    for path in PAIR:
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ):
            assert (path / name).is_file(), path / name
        assert json.loads((path / "config.json").read_text())["model_type"] == "llama"


def test_pair_fits_size_budget():
    total = sum(f.stat().st_size for p in PAIR for f in p.iterdir() if f.is_file())
    assert total <= MAX_PAIR_BYTES


def test_pair_shares_tokenizer(pair):
    assert (TARGET / "tokenizer.json").read_bytes() == (
        DRAFT / "tokenizer.json"
    ).read_bytes()
    (target, t_tok), (draft, d_tok) = pair[TARGET.name], pair[DRAFT.name]
    assert t_tok.eos_token_ids == d_tok.eos_token_ids
    assert t_tok.convert_tokens_to_ids("<|endoftext|>") in t_tok.eos_token_ids
    assert target.args.vocab_size == draft.args.vocab_size == len(t_tok.get_vocab())


def test_tokenizer_round_trips_code(pair):
    _, tok = pair[TARGET.name]
    ids = tok.encode(CODE)
    assert tok.decode(ids) == CODE
    assert tok.chat_template is None


@pytest.mark.parametrize("name", [TARGET.name, DRAFT.name])
def test_greedy_generate_matches_argmax_loop(pair, name):
    import mlx.core as mx
    from mlx_lm import generate

    model, tok = pair[name]
    prompt = "def add(a, b):"
    text = generate(model, tok, prompt, max_tokens=12)
    ids = tok.encode(prompt)
    expected = []
    for _ in range(12):
        nxt = mx.argmax(model(mx.array([ids + expected]))[0, -1]).item()
        if nxt in tok.eos_token_ids:
            break
        expected.append(nxt)
    assert text == tok.decode(expected)


GREEDY_PROMPTS = (
    "def median(data):\n    data = sorted(data)\n    n = len(data)\n",
    "class Fraction:\n    def __init__(self, numerator=0, denominator=None):\n",
    "The module provides functions for calculating mathematical statistics of",
)
GREEDY_TOKENS = 40


@pytest.fixture(scope="module")
def plain_greedy(pair):
    """Plain mlx_lm greedy tokens of the target for each prompt."""
    from mlx_lm.generate import stream_generate

    model, tok = pair[TARGET.name]
    out = {}
    for prompt in GREEDY_PROMPTS:
        out[prompt] = [
            int(r.token)
            for r in stream_generate(model, tok, prompt, max_tokens=GREEDY_TOKENS)
            if r.finish_reason != "stop"
        ]
    return out


@pytest.mark.parametrize("method", ["none", "draft", "tree", "lookup", "self", "auto"])
def test_every_method_is_greedy_identical_to_mlx_lm(pair, plain_greedy, method):
    from mlx_spec import stream_generate
    from mlx_spec.config import METHODS

    if method not in METHODS:
        pytest.skip(f"method {method} is not in this build")
    model, tok = pair[TARGET.name]
    draft, _ = pair[DRAFT.name]
    for prompt, expected in plain_greedy.items():
        try:
            stream = stream_generate(
                model, tok, prompt, draft, speculative=method, max_tokens=GREEDY_TOKENS
            )
            tokens = [int(r.token) for r in stream if r.finish_reason != "stop"]
        except ValueError:  # a draft-free method that refuses a draft model
            stream = stream_generate(
                model, tok, prompt, None, speculative=method, max_tokens=GREEDY_TOKENS
            )
            tokens = [int(r.token) for r in stream if r.finish_reason != "stop"]
        assert tokens == expected, (method, prompt)
