"""The tiny random test checkpoints of mlx_spec.testing."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_spec.testing import (
    ARCHITECTURES,
    CHECKPOINT_NAMES,
    GAP_FLOOR,
    build_tokenizer,
    greedy_agreement,
    make_checkpoint,
    min_top2_gap,
    named_set,
    tokenizer,
)


def _config(path):
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_every_checkpoint_loads_and_gives_config_sized_logits(
    checkpoints, load_model, name
):
    model, tokenizer = load_model(name)
    config = _config(checkpoints[name])
    ids = tokenizer.encode("def f(x):\n    return x", add_special_tokens=False)
    logits = model(mx.array(ids)[None])
    assert logits.shape == (1, len(ids), config["vocab_size"])
    assert logits.dtype == mx.float32
    assert tokenizer.eos_token_ids == {0, 2}


def test_tokenizer_round_trips_text_and_has_eos_and_chat_template(load_model):
    _, tokenizer = load_model("llama")
    text = "import os\n\tdef héllo(x): return x ✓ 你好 <|endoftext|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert ids[-1] == tokenizer.eos_token_id == 0
    assert len(tokenizer.get_vocab()) == 512
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_build_is_deterministic(tmp_path):
    tokenizer._tokenizer_json.cache_clear()
    first = build_tokenizer(tmp_path / "a") / "tokenizer.json"
    tokenizer._tokenizer_json.cache_clear()
    second = build_tokenizer(tmp_path / "b") / "tokenizer.json"
    assert first.read_bytes() == second.read_bytes()


def test_othertok_draft_has_a_different_vocabulary(load_model):
    _, tokenizer = load_model("llama")
    _, other = load_model("llama-othertok")
    assert len(other.get_vocab()) == 384
    assert other.get_vocab() != tokenizer.get_vocab()


@pytest.mark.parametrize("name", ARCHITECTURES + ("qwen2-padded",))
def test_targets_have_no_greedy_near_ties(load_model, name):
    model, tokenizer = load_model(name)
    assert min_top2_gap(model, tokenizer) >= GAP_FLOOR


def test_min_top2_gap_detects_near_ties_of_a_flat_head(tmp_path, load_model):
    _, tokenizer = load_model("llama")
    import mlx_lm

    path = make_checkpoint(tmp_path / "flat", "llama", head_scale=1e-4)
    model, _ = mlx_lm.load(str(path))
    assert min_top2_gap(model, tokenizer, steps=8) < 1e-4


@pytest.mark.parametrize(
    "target, draft",
    [(a, f"{a}-near") for a in ARCHITECTURES]
    + [("qwen2", "qwen2-padded-near"), ("qwen2-padded", "qwen2-padded-near")],
)
def test_near_drafts_are_accepted_often_but_not_always(load_model, target, draft):
    target_model, tokenizer = load_model(target)
    draft_model, _ = load_model(draft)
    assert 0.2 < greedy_agreement(target_model, draft_model, tokenizer) < 0.98


def test_unrelated_draft_is_rarely_accepted(load_model):
    target, tokenizer = load_model("llama")
    draft, _ = load_model("llama-unrelated")
    assert greedy_agreement(target, draft, tokenizer) < 0.2


def test_padded_heads_have_the_specified_sizes_and_zero_rows(checkpoints, load_model):
    assert _config(checkpoints["qwen2"])["vocab_size"] == 512
    assert _config(checkpoints["qwen2-padded"])["vocab_size"] == 640
    assert _config(checkpoints["qwen2-padded-near"])["vocab_size"] == 576
    weights = mx.load(str(checkpoints["qwen2-padded"] / "model.safetensors"))
    assert weights["lm_head.weight"].shape == (640, 64)
    assert not np.array(weights["lm_head.weight"][512:]).any()


def test_padded_target_matches_its_unpadded_original_on_real_tokens(load_model):
    model, tokenizer = load_model("qwen2")
    padded, _ = load_model("qwen2-padded")
    x = mx.array(tokenizer.encode("class A:", add_special_tokens=False))[None]
    assert mx.allclose(model(x), padded(x)[..., :512], atol=1e-5)


def test_make_checkpoint_is_deterministic(tmp_path):
    a = make_checkpoint(tmp_path / "a", "phi3", seed=3, hidden_size=32)
    b = make_checkpoint(tmp_path / "b", "phi3", seed=3, hidden_size=32)
    c = make_checkpoint(tmp_path / "c", "phi3", seed=4, hidden_size=32)
    weights = (p / "model.safetensors" for p in (a, b, c))
    wa, wb, wc = (f.read_bytes() for f in weights)
    assert wa == wb != wc


def test_make_checkpoint_rejects_an_arch_that_differs_from_base(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="model_type"):
        make_checkpoint(tmp_path / "x", "qwen2", base=checkpoints["llama"])


def _fake_build(root):
    (root / "llama").mkdir()
    return {}


def test_set_is_built_once_and_stale_sets_are_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(named_set, "_build_set", _fake_build)
    root = tmp_path / "set"
    paths = named_set.test_checkpoints(root)
    assert set(paths) == set(CHECKPOINT_NAMES) and paths["llama"].is_dir()
    stamp = root / named_set._STAMP
    mtime = stamp.stat().st_mtime_ns
    named_set.test_checkpoints(root)
    assert stamp.stat().st_mtime_ns == mtime
    stamp.write_text(json.dumps({"version": "stale"}))
    named_set.test_checkpoints(root)
    assert json.loads(stamp.read_text())["version"] == named_set.version_hash()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no temp left


def test_set_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        named_set.test_checkpoints(tmp_path)
