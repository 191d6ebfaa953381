"""GGUF import of each supported family, and of every tensor type gguf-py reads.

Each family's tiny random mlx-lm model is written as a GGUF with gguf-py's
writer, following llama.cpp's conventions for that family (its names and
metadata keys, the llama Q/K row permutation, Gemma's ``1 + w`` norms, phi3's
fused projections), then converted back. The reference is the model with
every matrix replaced by its quantize-dequantize round trip, so a float32
conversion gives the same logits exactly. Tensor types without a quantizer in
gguf-py (K- and I-quants) are checked on random valid blocks against
gguf-py's own dequantization.
"""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_checks import add_tokenizer, logits, reference_checkpoint, write_file

from mlx_spec.convert import ConversionError, convert_gguf, quants

gguf = pytest.importorskip("gguf")

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
# Test checkpoint family -> general.architecture llama.cpp writes.
GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
}
# mlx-lm name inside a layer -> llama.cpp's, written out apart from the
# converter's own tables.
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GEMMA3_LAYER = {
    **_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm"}


def gguf_name(family: str, name: str) -> str:
    module, suffix = name.rsplit(".", 1)
    if module == "lm_head":
        return f"output.{suffix}"
    if module.startswith("model.layers."):
        _, _, layer, rest = module.split(".", 3)
        table = _GEMMA3_LAYER if family == "gemma3" else _LAYER
        return f"blk.{layer}.{table[rest]}.{suffix}"
    return f"{_GLOBAL[module]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's (2, d/2) rows written as (d/2, 2)."""
    shape = w.shape
    return (
        w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def round_trip(w: np.ndarray, qtype: str) -> np.ndarray:
    if w.ndim == 1 or qtype == "F32":
        return w
    kind = gguf.GGMLQuantizationType[qtype]
    return gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind)


def source_model(
    checkpoints, family: str, tmp: Path, variant: str = ""
) -> tuple[Path, dict, dict]:
    """The family's tiny checkpoint as mlx-lm loads it, with random norms.

    Args:
        variant: ``""`` or ``"-near"`` (a perturbed copy: a draft).

    Returns:
        ``(directory, config, weights)``; gemma3 is its text model
        (``gemma3_text``), as a text-only GGUF holds it.
    """
    src = checkpoints[family + variant]
    config = json.loads((src / "config.json").read_text())
    weights = {
        k: np.array(v) for k, v in mx.load(str(src / "model.safetensors")).items()
    }
    if family == "gemma3":
        config = dict(config["text_config"], model_type="gemma3_text")
        weights = {k.removeprefix("language_model."): v for k, v in weights.items()}
    rng = np.random.default_rng(7)
    for name, w in weights.items():
        if name.endswith("norm.weight"):  # random scales exercise the norm handling
            weights[name] = (w + 0.3 * rng.standard_normal(w.shape)).astype(np.float32)
    out = tmp / f"{family}{variant}-source"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    return out, config, weights


def write_family_gguf(
    family: str, config: dict, weights: dict, checkpoint: Path, path: Path, qtype: str
) -> dict:
    """Write the model as llama.cpp would; return the reference weights."""
    arch = GGUF_ARCH[family]
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(head_dim)
    if family == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
        pattern = config["sliding_window_pattern"]
        layers = range(config["num_hidden_layers"])
        writer.add_sliding_window_pattern([(i + 1) % pattern != 0 for i in layers])
    writer.add_file_type(0)
    add_tokenizer(writer, checkpoint)
    reference = {}
    for name, w in weights.items():
        kind = qtype if w.ndim == 2 else "F32"
        reference[name] = round_trip(w, kind)
        if family == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)  # llama.cpp stores Gemma's 1 + w
        if GGUF_ARCH[family] == "llama" and name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, heads)
        elif GGUF_ARCH[family] == "llama" and name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, kv_heads)
        if kind == "F32":
            writer.add_tensor(gguf_name(family, name), w.astype(np.float32))
        else:
            ggml = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(
                gguf_name(family, name), gguf.quants.quantize(w, ggml), raw_dtype=ggml
            )
    write_file(writer)
    return reference


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    """(family, qtype[, variant]) -> (reference checkpoint, GGUF path); built once."""
    root = tmp_path_factory.mktemp("families")
    cache = {}

    def build(family: str, qtype: str, variant: str = ""):
        key = (family, qtype, variant)
        if key not in cache:
            tmp = root / f"{family}{variant}-{qtype}"
            tmp.mkdir()
            source, config, weights = source_model(checkpoints, family, tmp, variant)
            path = tmp / "m.gguf"
            reference = write_family_gguf(family, config, weights, source, path, qtype)
            ref = reference_checkpoint(source, tmp / "ref", reference, config)
            cache[key] = (ref, path)
        return cache[key]

    return build


# --------------------------------------------------------------------------- #
# Each family: float32 exactly, keep-quantized within the scales' rounding
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_float32_conversion_of_each_family_gives_the_reference_logits_exactly(
    converted, tmp_path, family, qtype
):
    ref, path = converted(family, qtype)
    out = convert_gguf(path, tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    expected_type = "gemma3_text" if family == "gemma3" else GGUF_ARCH[family]
    assert config["model_type"] == expected_type
    expected, got = logits(ref), logits(out)
    assert mx.array_equal(expected, got).item(), mx.abs(expected - got).max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_quantized_of_each_family_matches_the_reference_logits(
    converted, tmp_path, family
):
    import mlx_lm

    ref, path = converted(family, "Q4_0")
    out = convert_gguf(path, tmp_path / "out", dtype="keep-quantized")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4}
    model, _ = mlx_lm.load(str(out))
    assert model.model.layers[0].mlp.down_proj.bits == 4
    expected, got = logits(ref), logits(out)
    scale = mx.abs(expected).max().item()
    # float16 scales: the embedding lookup (and so the activations) is float16.
    assert mx.abs(expected - got).max().item() < 1e-2 * scale


def test_gemma3_config_keeps_its_window_pattern_and_query_scale(converted, tmp_path):
    ref, path = converted("gemma3", "F32")
    out = convert_gguf(path, tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    own = json.loads((ref / "config.json").read_text())
    for key in ("sliding_window", "sliding_window_pattern", "query_pre_attn_scalar"):
        assert config[key] == own[key], key
    assert config["rope_local_base_freq"] == 10000.0


def test_gemma3_norms_without_the_minus_one_give_other_logits(
    converted, tmp_path, monkeypatch
):
    """The exact-logits test above would catch norms left at 1 + w."""
    from mlx_spec.convert import families

    ref, path = converted("gemma3", "F32")
    gemma = families.FAMILIES["gemma3"]
    monkeypatch.setitem(
        families.FAMILIES,
        "gemma3",
        families.Family(**{**gemma.__dict__, "norms_plus_one": False}),
    )
    out = convert_gguf(path, tmp_path / "out", dtype="float32")
    assert mx.abs(logits(ref) - logits(out)).max().item() > 1e-2


# --------------------------------------------------------------------------- #
# Speculation on converted models
# --------------------------------------------------------------------------- #


def generate_text(argv: list[str], capsys) -> str:
    from mlx_spec.cli.generate import main

    prompt = ["--prompt", "def fibonacci(n):", "--ignore-chat-template"]
    main(argv + prompt + ["--max-tokens", "16", "--verbose", "False"])
    return capsys.readouterr().out


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_models_speculate_with_auto_and_with_a_converted_draft(
    converted, tmp_path, family, capsys
):
    """Greedy text is plain decoding's, with --speculative auto and with a
    converted draft of the same family (its tokenizer passes the check)."""
    _, path = converted(family, "Q8_0")
    _, draft_path = converted(family, "Q8_0", "-near")
    target = convert_gguf(path, tmp_path / "target", dtype="float32")
    draft = convert_gguf(draft_path, tmp_path / "draft", dtype="float32")
    model = ["--model", str(target)]
    plain = generate_text(model + ["--speculative", "none"], capsys)
    assert len(plain.strip()) > 0
    assert generate_text(model + ["--speculative", "auto"], capsys) == plain
    stats = tmp_path / "stats.json"
    with_draft = model + ["--draft-model", str(draft), "--speculative", "draft"]
    assert generate_text(with_draft + ["--stats-json", str(stats)], capsys) == plain
    assert json.loads(stats.read_text())["draft_tokens"] > 0  # the draft ran


# --------------------------------------------------------------------------- #
# Every tensor type gguf-py reads, on random valid blocks
# --------------------------------------------------------------------------- #


def readable_types() -> list[str]:
    """Quantized types gguf-py dequantizes (floats and integers left out)."""
    out = []
    for qtype in gguf.GGMLQuantizationType:
        if (
            qtype.name in ("F32", "F16", "F64")
            or qtype.name.startswith("I")
            and qtype.name[1:].isdigit()
        ):
            continue
        _, size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros((1, size), np.uint8), qtype)
        except NotImplementedError:
            continue
        out.append(qtype.name)
    return out


READABLE = readable_types()


def random_blocks(qtype: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes of a ``(rows, cols)`` tensor whose values are all finite.

    Blocks whose float16/float8 scales came out huge or NaN are drawn again.
    """
    kind = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for _ in range(200):
        with np.errstate(all="ignore"):
            values = gguf.quants.dequantize(blocks, kind)
        bad = ~np.all(np.isfinite(values) & (np.abs(values) < 1e3), axis=-1)
        if not bad.any():
            return blocks.reshape(rows, -1)
        blocks[bad] = rng.integers(0, 256, (bad.sum(), size), dtype=np.uint8)
    raise AssertionError(f"no finite {qtype} blocks")


def test_gguf_py_reads_k_and_i_quants():
    """The types the converter takes without a quantizer here."""
    for name in (
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_XS",
        "IQ4_NL",
        "IQ2_XXS",
        "BF16",
    ):
        assert name in READABLE, name


CHUNK = 1 << 16  # values per chunk of rows in the memory tests (256 KB of float32)


def traced_peak(function, *args):
    """``(result, peak bytes numpy allocated)`` of one call (tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    try:
        result = function(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K", "IQ4_XS"])
def test_dequantizing_a_large_tensor_holds_little_beside_its_output(qtype, monkeypatch):
    """Row chunks: the peak is the float32 output plus a few chunks, not
    gguf-py's intermediates of the whole tensor; values stay gguf-py's."""
    monkeypatch.setattr(quants, "CHUNK_VALUES", CHUNK)
    rows, cols = 512, 1024
    raw = random_blocks(qtype, rows, cols, seed=11)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    got, peak = traced_peak(quants.dequantize, raw, qtype, (rows, cols))
    assert np.array_equal(got, expected)
    assert peak < got.nbytes + 6 * 4 * CHUNK, peak / got.nbytes


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q5_K"])
def test_repacking_a_large_tensor_holds_little_beside_its_output(qtype, monkeypatch):
    rows, cols = 512, 1024
    raw = random_blocks(qtype, rows, cols, seed=12)
    whole = quants.to_mlx_quantized(raw, qtype, (rows, cols))
    monkeypatch.setattr(quants, "CHUNK_VALUES", CHUNK)
    chunked, peak = traced_peak(quants.to_mlx_quantized, raw, qtype, (rows, cols))
    for a, b in zip(whole, chunked):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    output = sum(a.nbytes for a in chunked)
    assert peak < output + 6 * 4 * CHUNK, peak / output


def test_requantizing_a_large_matrix_holds_little_beside_its_output(monkeypatch):
    values = np.random.default_rng(13).standard_normal((512, 1024), np.float32)
    *whole, whole_error = quants.requantize(values)
    monkeypatch.setattr(quants, "CHUNK_VALUES", CHUNK)
    held = mx.get_active_memory()  # arrays earlier tests keep (the peak starts there)
    mx.reset_peak_memory()
    (*chunked, error), peak = traced_peak(quants.requantize, values)
    for a, b in zip(whole, chunked):
        assert np.array_equal(a, b)
    assert error == whole_error
    output = sum(a.nbytes for a in chunked)
    assert peak < output + 6 * 4 * CHUNK, peak / output  # numpy
    assert mx.get_peak_memory() - held < 16 * 4 * CHUNK  # MLX


def test_the_weights_file_is_written_without_a_copy_of_each_array(tmp_path):
    from mlx_spec.convert.safetensors_stream import SafetensorsWriter

    array = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    with SafetensorsWriter(tmp_path / "w.safetensors", ["w"]) as writer:
        _, peak = traced_peak(writer.add, "w", array)
    assert peak < array.nbytes / 4, peak / array.nbytes
    loaded = mx.load(str(tmp_path / "w.safetensors"))["w"]
    assert np.array_equal(np.array(loaded), array)


@pytest.fixture(scope="module")
def random_types_gguf(checkpoints, tmp_path_factory):
    """A 256-wide llama whose matrices hold random blocks of every readable type.

    Returns:
        ``(path, gguf name -> type, gguf name -> (mlx-lm name, gguf-py's
        float32 values))``.
    """
    from mlx_spec.testing import make_checkpoint

    root = tmp_path_factory.mktemp("random-types")
    source = make_checkpoint(
        root / "src",
        "llama",
        hidden_size=256,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
    )
    config = json.loads((source / "config.json").read_text())
    weights = {
        k: np.array(v) for k, v in mx.load(str(source / "model.safetensors")).items()
    }
    matrices = [n for n, w in weights.items() if w.ndim == 2]
    assert len(matrices) >= len(READABLE)
    path = root / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(256)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    add_tokenizer(writer, source)
    types, values = {}, {}
    for i, name in enumerate(sorted(weights)):
        w = weights[name]
        target = gguf_name("llama", name)
        if w.ndim == 1:
            writer.add_tensor(target, w)
            continue
        qtype = READABLE[matrices.index(name) % len(READABLE)]
        raw = random_blocks(qtype, *w.shape, seed=i)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(target, raw, raw_dtype=kind)
        types[target] = qtype
        values[target] = (name, gguf.quants.dequantize(raw, kind))
    write_file(writer)
    return path, types, values


def unpermuted(name: str, values: np.ndarray) -> np.ndarray:
    """gguf-py's values in mlx-lm's row order (tiny llama: 2 heads, 1 KV head)."""
    if ".attn_q." in name or ".attn_k." in name:
        heads = 2 if ".attn_q." in name else 1
        n = values.shape[0]
        order = np.arange(n).reshape(heads, n // heads // 2, 2).transpose(0, 2, 1)
        return values[order.reshape(-1)]
    return values


def test_float32_conversion_of_every_type_equals_gguf_py_bit_for_bit(
    random_types_gguf, tmp_path
):
    path, types, values = random_types_gguf
    out = convert_gguf(path, tmp_path / "out", dtype="float32")
    weights = mx.load(str(out / "model.safetensors"))
    assert set(types.values()) == set(READABLE)
    for name, (mlx_name, expected) in values.items():
        got = np.array(weights[mlx_name])
        assert np.array_equal(got, unpermuted(name, expected)), (name, types[name])


def test_keep_quantized_is_exact_for_mapped_types_and_requantizes_the_rest(
    random_types_gguf, tmp_path
):
    import mlx_lm

    path, types, values = random_types_gguf
    notes = []
    out = convert_gguf(path, tmp_path / "out", dtype="keep-quantized", log=notes.append)
    weights = mx.load(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    quantization = config["quantization"]
    record = json.loads((out / "mlx_spec_convert.json").read_text())
    for name, (mlx_name, expected) in values.items():
        module = mlx_name.rsplit(".", 1)[0]
        kind = types[name]
        expected = unpermuted(name, expected)
        if kind == "BF16":  # kept as stored
            got = np.array(weights[f"{module}.weight"].astype(mx.float32))
            assert np.array_equal(got, expected)
            continue
        bits = quantization.get(module, quantization)["bits"]
        got = np.array(
            mx.dequantize(
                weights[f"{module}.weight"],
                weights[f"{module}.scales"].astype(mx.float32),
                weights[f"{module}.biases"].astype(mx.float32),
                group_size=32,
                bits=bits,
            )
        )
        if kind in quants.EXACT_BITS:
            assert bits == quants.EXACT_BITS[kind], kind
            assert np.array_equal(got, expected), kind
            assert module not in record.get("requantized", {})
        else:
            assert bits == 8, kind
            error = np.abs(got - expected).max() / np.abs(expected).max()
            assert error == pytest.approx(
                record["requantized"][module], rel=1e-3, abs=1e-7
            )
            # One 8-bit step of a group spanning at most twice the largest value.
            assert error <= 2 / 255 * (1 + 1e-5), kind
    assert notes and notes[0].startswith("requantized ")
    mlx_lm.load(str(out))  # mixed 4/5/8-bit layers load


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


def test_phi3_longrope_is_refused_by_name(converted, tmp_path):
    ref, path = converted("phi3", "F32")
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "long.gguf"), "phi3")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.add_tensor("rope_factors_long.weight", np.ones(8, np.float32))
    write_file(writer)
    with pytest.raises(ConversionError, match="Phi-3 LongRoPE"):
        convert_gguf(tmp_path / "long.gguf", tmp_path / "out")
