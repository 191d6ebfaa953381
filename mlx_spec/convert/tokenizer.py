"""A Hugging Face tokenizer (``tokenizer.json`` + ``tokenizer_config.json``)
rebuilt from a GGUF file's ``tokenizer.*`` metadata, with ``tokenizers``.

Two kinds of vocabulary (``tokenizer.ggml.model``) are rebuilt:

- ``gpt2``: byte-level BPE (Llama 3, Qwen 2/2.5/3, SmolLM, ...). The GGUF
  stores the vocabulary, the merges and, by name only, the pre-tokenizer
  (``tokenizer.ggml.pre``). :data:`PRE_TOKENIZERS` maps each name known here
  to the split llama.cpp applies under that name (llama-vocab.cpp): GPT-2's
  regex; every digit alone then GPT-2's (``smollm``, ``starcoder``); Llama 3's
  regex, digits in runs of up to 3 (``llama-bpe``); Qwen2's, the same with
  each digit alone and NFC-normalized text (``qwen2``, also Qwen 2.5 and 3).
  The regex decides where merges may cross, so a wrong one changes ids.
  Llama 3 also takes a word the vocabulary holds whole, without merging.
- ``llama``: SentencePiece BPE (Llama 2, Mistral 7B, Gemma 3, Phi-3). The GGUF
  stores each piece's score instead of merges; a piece's merges are its
  splits into two pieces, ranked by its score, as SentencePiece applies them
  (and as transformers' converter derives them). Spaces become ``▁``, a
  ``▁`` is prepended to each run of text when ``tokenizer.ggml.add_space_prefix``
  says so (llama.cpp does it after each special token too), and characters
  without a piece fall back to ``<0xXX>`` byte pieces.

Tokens of type 3 (control) and 2 (unknown) become special added tokens,
type 4 (user-defined) plain added tokens, so both are matched whole in text,
as llama.cpp does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# llama.cpp's token types (llama_token_type).
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
SPIECE_SPACE = "\u2581"

# Llama 3's split: contractions, letters, digits in runs of 1-3, punctuation.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's: Llama 3's with every digit alone.
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre -> how text is split before BPE. "digits" = each digit
# alone, then GPT-2's regex (llama.cpp groups these names under one regex).
PRE_TOKENIZERS = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "qwen2": "qwen2",
}
TOKENIZER_MODELS = ("gpt2", "llama")
# Tokens llama.cpp ends generation on by their text besides EOS/EOT/EOM
# (llama-vocab.cpp): the end of a turn in each family's chat template.
END_OF_GENERATION = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)


class TokenizerConversionError(ValueError):
    """The GGUF's tokenizer cannot be rebuilt (one-line message)."""


def _pre_tokenizer(name: str):
    from tokenizers import Regex, pre_tokenizers

    kind = PRE_TOKENIZERS.get(name)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "gpt2":
        return byte_level
    if kind == "digits":
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    if kind in ("llama3", "qwen2"):
        regex = _LLAMA3_SPLIT if kind == "llama3" else _QWEN2_SPLIT
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
        no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, no_regex])
    raise TokenizerConversionError(
        f"unsupported GGUF pre-tokenizer {name!r} (tokenizer.ggml.pre); "
        f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
    )


def _check_vocabulary(metadata: dict) -> tuple[list[str], list[int]]:
    model = metadata.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        kind = {"bert": " (WordPiece)", "t5": " (Unigram)"}.get(model, "")
        raise TokenizerConversionError(
            f"unsupported GGUF tokenizer model {model!r}{kind}; supported: 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    needed = "merges" if model == "gpt2" else "scores"
    if not tokens or f"tokenizer.ggml.{needed}" not in metadata:
        raise TokenizerConversionError(
            f"the GGUF has no tokenizer.ggml.tokens or tokenizer.ggml.{needed}"
        )
    token_types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise TokenizerConversionError(
            f"tokenizer.ggml.token_type has {len(token_types)} entries for "
            f"{len(tokens)} tokens"
        )
    return list(tokens), list(token_types)


def _token(tokens: list[str], metadata: dict, key: str) -> str | None:
    """The token text of ``tokenizer.ggml.<key>``, or ``None``."""
    index = metadata.get(f"tokenizer.ggml.{key}")
    if index is None or not 0 <= int(index) < len(tokens):
        return None
    return tokens[int(index)]


def _llama3(metadata: dict) -> bool:
    """A Llama 3 vocabulary: llama.cpp takes a word it holds whole, without
    merging (``ignore_merges``), and adds BOS by default."""
    pre = metadata.get("tokenizer.ggml.pre", "default")
    return PRE_TOKENIZERS.get(pre) == "llama3"


def end_of_generation_ids(metadata: dict) -> list[int]:
    """The ids that end generation, as llama.cpp counts them: EOS, then in id
    order ``tokenizer.ggml.eot_token_id``/``eom_token_id`` and the tokens of
    :data:`END_OF_GENERATION` in the vocabulary."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    ids = {
        int(metadata[f"tokenizer.ggml.{key}_token_id"])
        for key in ("eot", "eom")
        if f"tokenizer.ggml.{key}_token_id" in metadata
    }
    ids |= {i for i, token in enumerate(tokens) if token in END_OF_GENERATION}
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    first = [] if eos is None else [int(eos)]
    ordered = first + sorted(ids - set(first))
    return [i for i in ordered if 0 <= i < len(tokens)]


def _add_bos(metadata: dict) -> bool:
    """``tokenizer.ggml.add_bos_token``; llama.cpp's default is per model:
    SentencePiece and Llama 3 vocabularies add BOS."""
    default = metadata.get("tokenizer.ggml.model") == "llama" or _llama3(metadata)
    return bool(metadata.get("tokenizer.ggml.add_bos_token", default))


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple]:
    """The BPE merges a SentencePiece vocabulary applies, best first.

    Every piece that splits into two pieces of the vocabulary is reachable by
    merging them; SentencePiece merges the pair whose result scores highest.

    Args:
        tokens: The pieces, by id.
        scores: Their scores, by id.

    Returns:
        ``(left, right)`` pairs sorted by the merged piece's score (higher
        first), ties by the ids of the merged piece, left and right.
    """
    ids = {}
    for index, token in enumerate(tokens):
        ids.setdefault(token, index)
    ranked = []
    for piece, index in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[index], index, ids[left], ids[right]))
    ranked.sort()
    return [(tokens[l], tokens[r]) for _, _, l, r in ranked]


def _sentencepiece(metadata: dict, tokens: list[str], token_types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    scores = metadata["tokenizer.ggml.scores"]
    unk = _token(tokens, metadata, "unknown_token_id")
    if unk is None:
        unk = next((t for t, k in zip(tokens, token_types) if k == 2), None)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=sentencepiece_merges(tokens, scores),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Replace(" ", SPIECE_SPACE)]
    if prefix:
        steps.insert(0, normalizers.Prepend(SPIECE_SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback()]
    decode.append(decoders.Fuse())
    if prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode)
    return tokenizer


def _byte_level_bpe(metadata: dict, tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    pre = metadata.get("tokenizer.ggml.pre", "default")
    pre_tokenizer = _pre_tokenizer(pre)
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # a duplicate keeps its first id
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=_llama3(metadata),
        )
    )
    if PRE_TOKENIZERS[pre] == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def build_tokenizer(metadata: dict):
    """The ``tokenizers.Tokenizer`` a GGUF's metadata describes.

    Args:
        metadata: GGUF metadata.

    Returns:
        A ``tokenizers.Tokenizer``: byte-level BPE or SentencePiece BPE over
        the file's vocabulary, token ids equal to the GGUF's, control tokens
        special.

    Raises:
        TokenizerConversionError: Another kind of vocabulary, or an unknown
            pre-tokenizer.
    """
    from tokenizers import AddedToken

    tokens, token_types = _check_vocabulary(metadata)
    byte_level = metadata["tokenizer.ggml.model"] == "gpt2"
    if byte_level:
        tokenizer = _byte_level_bpe(metadata, tokens)
    else:
        tokenizer = _sentencepiece(metadata, tokens, token_types)
    special_types = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, token_types)
        if kind in special_types
    ]
    user_defined = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, token_types)
        if kind == TOKEN_TYPE_USER_DEFINED
    ]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user_defined)
    bos = _token(tokens, metadata, "bos_token_id")
    add_bos = _add_bos(metadata)
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    eos = _token(tokens, metadata, "eos_token_id")
    if (add_bos and bos is not None) or (add_eos and eos is not None):
        tokenizer.post_processor = _template(
            tokenizer,
            bos if add_bos else None,
            eos if add_eos else None,
            byte_level=byte_level,
        )
    return tokenizer


def _template(tokenizer, bos: str | None, eos: str | None, *, byte_level: bool):
    """A post-processor adding BOS and/or EOS around each sequence."""
    from tokenizers import processors

    def sequence(piece: str, type_id: int) -> str:
        parts = [t for t in (bos, piece, eos) if t is not None]
        return " ".join(f"{part}:{type_id}" for part in parts)

    ends = dict.fromkeys(t for t in (bos, eos) if t is not None)
    single = sequence("$A", 0)
    template = processors.TemplateProcessing(
        single=single,
        pair=f"{single} {sequence('$B', 1)}",
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in ends],
    )
    if not byte_level:
        return template
    return processors.Sequence([processors.ByteLevel(trim_offsets=False), template])


def tokenizer_config(metadata: dict) -> dict:
    """The ``tokenizer_config.json`` for a GGUF's tokenizer.

    Args:
        metadata: GGUF metadata.

    Returns:
        BOS/EOS/UNK/PAD tokens, the BOS/EOS flags, the chat template (when
        the file has one) and ``model_max_length`` from the context length.
    """
    tokens, token_types = _check_vocabulary(metadata)
    arch = metadata.get("general.architecture", "")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(tokens, metadata, "bos_token_id"),
        "eos_token": _token(tokens, metadata, "eos_token_id"),
        "unk_token": _token(tokens, metadata, "unknown_token_id"),
        "pad_token": _token(tokens, metadata, "padding_token_id"),
        "add_bos_token": _add_bos(metadata),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(metadata.get(f"{arch}.context_length", 1 << 20)),
    }
    specials = [
        t
        for t, kind in zip(tokens, token_types)
        if kind == TOKEN_TYPE_CONTROL
        and t not in (config["bos_token"], config["eos_token"], config["unk_token"])
        and t != config["pad_token"]
    ]
    if specials:
        config["additional_special_tokens"] = specials
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


# Hugging Face tokenizer files copied by copy_tokenizer, when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def copy_tokenizer(source: str | Path, out_dir: str | Path, metadata: dict) -> None:
    """Copy a Hugging Face tokenizer into ``out_dir`` (instead of rebuilding it).

    The GGUF's chat template is added to ``tokenizer_config.json`` when the
    copied files bring none.

    Args:
        source: Directory holding ``tokenizer.json`` or ``tokenizer.model``
            (and usually ``tokenizer_config.json``).
        out_dir: An existing directory.
        metadata: GGUF metadata.

    Raises:
        TokenizerConversionError: ``source`` holds no tokenizer.
    """
    source, out_dir = Path(source), Path(out_dir)
    if not any((source / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
        raise TokenizerConversionError(
            f"tokenizer directory '{source}' holds no tokenizer.json or "
            "tokenizer.model"
        )
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out_dir / name)
    template = metadata.get("tokenizer.chat_template")
    has_template = any(
        (out_dir / n).is_file() for n in ("chat_template.jinja", "chat_template.json")
    )
    config_path = out_dir / "tokenizer_config.json"
    config = (
        json.loads(config_path.read_text(encoding="utf-8"))
        if config_path.is_file()
        else {}
    )
    if template and not has_template and "chat_template" not in config:
        config["chat_template"] = template
        config_path.write_text(
            json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def write_tokenizer(metadata: dict, out_dir: str | Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``.

    Args:
        metadata: GGUF metadata.
        out_dir: An existing directory.
    """
    out_dir = Path(out_dir)
    config = tokenizer_config(metadata)
    build_tokenizer(metadata).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
