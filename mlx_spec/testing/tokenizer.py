"""The tiny byte-level BPE tokenizer of the test checkpoints.

Trained in about 0.2 s on Python's own standard library sources, with
ChatML special tokens and chat template.
"""

from __future__ import annotations

import functools
import json
import sysconfig
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
TOKENIZER_VARIANTS = {"default": 512, "other": 384}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS_CHARS = 400_000


def _corpus(variant: str) -> list[str]:
    """Training text: stdlib ``*.py`` files, sorted (reversed for "other")."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"), reverse=variant == "other")
    texts, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= _CORPUS_CHARS:
            break
    return texts


@functools.lru_cache(maxsize=None)
def _tokenizer_json(vocab_size: int, variant: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(variant), trainer)
    return tokenizer.to_str()


def build_tokenizer(
    out_dir: str | Path, *, vocab_size: int | None = None, variant: str = "default"
) -> Path:
    """Train (memoised per process) and write a byte-level BPE tokenizer.

    Special tokens come first: ``<|endoftext|>`` = 0 (the EOS token),
    ``<|im_start|>`` = 1, ``<|im_end|>`` = 2. A ChatML chat template is
    included. Encoding adds no BOS/EOS.

    Args:
        out_dir: Directory to write ``tokenizer.json`` and
            ``tokenizer_config.json`` into (created if missing).
        vocab_size: Vocabulary size. Default: ``512`` for ``"default"``,
            ``384`` for ``"other"``.
        variant: ``"default"`` or ``"other"``; "other" is trained on different
            text and so has a different vocabulary. Default: ``"default"``.

    Returns:
        ``out_dir`` as a ``Path``.
    """
    if variant not in TOKENIZER_VARIANTS:
        raise ValueError(
            f"variant must be one of {sorted(TOKENIZER_VARIANTS)}, got {variant!r}"
        )
    vocab_size = vocab_size or TOKENIZER_VARIANTS[variant]
    if not 256 + len(SPECIAL_TOKENS) <= vocab_size <= 4096:
        raise ValueError(f"vocab_size must be in [259, 4096], got {vocab_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(
        _tokenizer_json(vocab_size, variant), encoding="utf-8"
    )
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2), encoding="utf-8"
    )
    return out_dir


def tokenizer_rows(tokenizer_dir: Path) -> int:
    """Rows a model needs for the tokenizer in ``tokenizer_dir``: its largest id + 1."""
    content = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(content["model"]["vocab"].values())
    ids += [t["id"] for t in content.get("added_tokens", [])]
    return max(ids) + 1
