"""Tokenizers rebuilt from GGUF metadata (mlx_spec.convert.tokenizer).

SentencePiece vocabularies are checked against SentencePiece itself: a small
BPE model with byte fallback is trained here (no download) the way Llama 2
(``▁`` prefix) and Gemma (none) are configured, written as llama.cpp writes
a SentencePiece vocabulary (pieces, scores, token types), rebuilt, and must
give SentencePiece's ids on multilingual and code text. Byte-level BPE
pre-tokenizers are checked by the splits their regexes make.
"""

import io
import json

import mlx.core as mx
import numpy as np
import pytest
from gguf_checks import gguf_name, write_file

from mlx_spec.convert import convert_gguf
from mlx_spec.convert.tokenizer import (
    build_tokenizer,
    end_of_generation_ids,
    tokenizer_config,
)

spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts "
    "tokens and the target verifies them.\n"
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + "
    "fibonacci(n - 2)\n"
    "class Parser:\n    def __init__(self, text):\n        self.text = text\n"
    "Le renard brun rapide saute par-dessus le chien paresseux. Ça va, merci !\n"
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße.\n"
    "El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está?\n"
    'for i in range(10):\n    print(f"{i}: {i * i}")\n'
) * 20
SAMPLES = {
    "english": "Hello world, how are you today?",
    "code": "def add(a, b):\n    return a + b  # sum\n\n\tx = [1, 2, 3]\n",
    "accents": "naïve café — Größe ¿Dónde? ünïcödé",
    # Scripts the training text never had: byte fallback throughout.
    "unseen scripts": "Привет, мир! 你好世界 مرحبا 東京 🚀",
    "spaces": "  leading and  double  spaces, trailing ",
}
USER_DEFINED = "<start_of_turn>"


def train_sentencepiece(add_dummy_prefix: bool):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=model,
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        character_coverage=1.0,
        user_defined_symbols=[USER_DEFINED],
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_metadata(sp, add_space_prefix: bool) -> dict:
    """The ``tokenizer.*`` metadata llama.cpp writes for a SentencePiece model."""
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]

    def kind(i):
        if sp.is_unknown(i):
            return 2
        if sp.is_control(i):
            return 3
        if sp.is_byte(i):
            return 6
        return 4 if tokens[i] == USER_DEFINED else 1

    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


@pytest.mark.parametrize("prefix", [True, False], ids=["llama2-prefix", "gemma-none"])
@pytest.mark.parametrize("sample", SAMPLES)
def test_sentencepiece_rebuild_gives_sentencepiece_ids(prefix, sample):
    sp = train_sentencepiece(prefix)
    tokenizer = build_tokenizer(sentencepiece_metadata(sp, prefix))
    text = SAMPLES[sample]
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == sp.encode(text)
    assert tokenizer.decode(ids) == text
    if sample == "unseen scripts":
        assert any(sp.is_byte(i) for i in ids)  # the byte fallback was used


def test_sentencepiece_special_tokens_and_bos():
    sp = train_sentencepiece(True)
    metadata = sentencepiece_metadata(sp, True)
    tokenizer = build_tokenizer(metadata)
    text = f"{USER_DEFINED}user\nHi</s>"
    ids = tokenizer.encode(text).ids
    assert ids[0] == sp.bos_id()  # llama.cpp adds BOS for SentencePiece
    assert ids[1] == sp.piece_to_id(USER_DEFINED)  # matched whole
    assert sp.eos_id() in ids  # </s> is a control token, matched whole
    assert tokenizer_config(metadata)["add_bos_token"] is True


def test_qwen2_and_llama3_pre_tokenizers_split_digits_as_llama_cpp():
    """Qwen2 splits each digit, Llama 3 runs of up to three (llama-vocab.cpp);
    Qwen2 also composes accents (NFC)."""
    words = ["Ġ", "a", "b", "1", "2", "3", "4", "5", "6", "7", "é", "Ã", "©"]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": words,
        "tokenizer.ggml.merges": [],
    }

    def split(pre: str, text: str) -> list[str]:
        tokenizer = build_tokenizer({**metadata, "tokenizer.ggml.pre": pre})
        if tokenizer.normalizer is not None:
            text = tokenizer.normalizer.normalize_str(text)
        return [p for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    assert split("qwen2", "ab 1234567") == ["ab", "Ġ", *"1234567"]
    assert split("llama-bpe", "ab 1234567") == ["ab", "Ġ", "123", "456", "7"]
    assert split("qwen2", "e\u0301") == ["Ã©"]  # é composed, then bytes
    assert split("llama-bpe", "e\u0301") != ["Ã©"]


def test_llama3_pre_tokenizer_takes_a_word_of_the_vocabulary_whole():
    """Llama 3 (llama-bpe) ignores merges for a word the vocabulary holds, as
    llama.cpp and its Hugging Face tokenizer do; GPT-2's merges it."""
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "c", "ab", "abc"],
        "tokenizer.ggml.merges": ["a b"],  # "abc" has no merge path
    }

    def ids(pre: str) -> list[int]:
        tokenizer = build_tokenizer({**metadata, "tokenizer.ggml.pre": pre})
        return tokenizer.encode("abc", add_special_tokens=False).ids

    assert ids("llama-bpe") == [4]
    assert ids("gpt2") == [3, 2]


def test_llama3_vocabulary_adds_bos_unless_the_file_says_not():
    """llama.cpp's default for the llama-bpe pre-tokenizer is to add BOS."""
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": ["<s>", "a"],
        "tokenizer.ggml.token_type": [3, 1],
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": 0,
    }
    assert build_tokenizer(metadata).encode("a").ids == [0, 1]
    assert tokenizer_config(metadata)["add_bos_token"] is True
    no_bos = {**metadata, "tokenizer.ggml.add_bos_token": False}
    assert build_tokenizer(no_bos).encode("a").ids == [1]


def test_end_of_turn_tokens_end_generation_as_in_llama_cpp():
    """EOS, the file's EOT/EOM ids and the end-of-turn tokens llama.cpp knows by
    name (Gemma's <end_of_turn>, Llama 3's <|eot_id|>, ...) all stop."""
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "<eos>", "<end_of_turn>", "a", "<x>"],
        "tokenizer.ggml.token_type": [2, 3, 3, 3, 1, 3],
        "tokenizer.ggml.scores": [0.0] * 6,
        "tokenizer.ggml.eos_token_id": 2,
    }
    assert end_of_generation_ids(metadata) == [2, 3]
    assert end_of_generation_ids({**metadata, "tokenizer.ggml.eom_token_id": 5}) == [
        2,
        3,
        5,
    ]
    assert end_of_generation_ids({**metadata, "tokenizer.ggml.eos_token_id": 3}) == [3]


def test_sentencepiece_gguf_converts_to_a_tokenizer_mlx_lm_loads(checkpoints, tmp_path):
    """A llama GGUF with a SentencePiece vocabulary, end to end."""
    import mlx_lm

    sp = train_sentencepiece(True)
    source = checkpoints["llama"]
    config = json.loads((source / "config.json").read_text())
    weights = mx.load(str(source / "model.safetensors"))
    metadata = sentencepiece_metadata(sp, True)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_scores(metadata["tokenizer.ggml.scores"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_space_prefix(True)
    writer.add_chat_template(
        "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]"
        "{% endfor %}"
    )
    for name, w in weights.items():
        writer.add_tensor(gguf_name(name), np.array(w))
    write_file(writer)
    out = convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float32")
    _, tokenizer = mlx_lm.load(str(out))
    for text in SAMPLES.values():
        assert tokenizer.encode(text) == [sp.bos_id()] + sp.encode(text)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    # As llama.cpp: text after a special token gets the "▁" prefix too.
    assert chat == [sp.bos_id()] + sp.encode("[INST] Hi [/INST]")
