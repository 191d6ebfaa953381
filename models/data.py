"""Corpus, tokenizer and token streams for the default model pair.

The corpus is the Python standard library that ships with the interpreter
running this script (``sysconfig.get_paths()["stdlib"]``):

* every ``*.py`` file under it, in sorted path order;
* minus ``site-packages`` and every test directory (``test``, ``tests``,
  ``idle_test``): they are half of the bytes and mostly fixtures, and the
  pair is meant to complete library code;
* minus files that are not valid UTF-8.

A fixed list of top-level modules (``HELDOUT_MODULES``) is held out for
evaluation; the tokenizer never sees them either. Files are joined with the
EOS token ``<|endoftext|>`` between them.
"""

import json
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

EOS_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 4096
SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
HELDOUT_MODULES = (
    "bisect",
    "calendar",
    "csv",
    "difflib",
    "fractions",
    "graphlib",
    "heapq",
    "json",
    "pprint",
    "shlex",
    "statistics",
    "string",
    "textwrap",
    "tomllib",
    "uuid",
)


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def top_level_module(rel: Path) -> str:
    """``json/decoder.py`` -> ``json``; ``csv.py`` -> ``csv``."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def list_files(root: Path | None = None) -> list[Path]:
    """Sorted relative paths of the corpus files (see module docstring)."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                found.append(Path(dirpath, name).relative_to(root))
    return sorted(found)


def read_texts(root: Path | None = None) -> tuple[list[str], list[str], dict]:
    """Read the corpus and split it into (train, heldout) texts plus a manifest."""
    root = root or stdlib_root()
    train, heldout, skipped = [], [], []
    train_files, heldout_files = [], []
    for rel in list_files(root):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            skipped.append(str(rel))
            continue
        if top_level_module(rel) in HELDOUT_MODULES:
            heldout.append(text)
            heldout_files.append(str(rel))
        else:
            train.append(text)
            train_files.append(str(rel))
    manifest = {
        "python_version": sys.version.split()[0],
        "python_implementation": sys.implementation.name,
        "stdlib_root": str(root),
        "skip_dirs": sorted(SKIP_DIRS),
        "heldout_modules": list(HELDOUT_MODULES),
        "train_files": len(train_files),
        "heldout_files": heldout_files,
        "skipped_non_utf8": skipped,
        "train_chars": sum(map(len, train)),
        "heldout_chars": sum(map(len, heldout)),
    }
    return train, heldout, manifest


def train_tokenizer(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Byte-level BPE (GPT-2 style pre-tokenizer, no prefix space) on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def save_tokenizer(tok, out_dir: Path) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (no chat template)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "pad_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """Token ids of ``text0 EOS text1 EOS ...`` as one uint16 array of shape (n,)."""
    eos = tok.token_to_id(EOS_TOKEN)
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def prepare(data_dir: Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> dict:
    """Build (or reuse) tokenizer and token streams in ``data_dir``.

    Writes ``tokenizer.json``, ``tokenizer_config.json``, ``train.npy``,
    ``heldout.npy`` and ``manifest.json``. Deterministic for a given stdlib.
    """
    from tokenizers import Tokenizer

    data_dir = Path(data_dir)
    manifest_path = data_dir / "manifest.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    train, heldout, manifest = read_texts()
    tok = train_tokenizer(train, vocab_size)
    save_tokenizer(tok, data_dir)
    tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    train_ids = encode_stream(tok, train)
    heldout_ids = encode_stream(tok, heldout)
    np.save(data_dir / "train.npy", train_ids)
    np.save(data_dir / "heldout.npy", heldout_ids)
    manifest.update(
        vocab_size=tok.get_vocab_size(),
        train_tokens=int(train_ids.size),
        heldout_tokens=int(heldout_ids.size),
    )
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load_stream(data_dir: Path, split: str) -> np.ndarray:
    """The uint16 token stream of ``split`` ("train" or "heldout")."""
    return np.load(Path(data_dir) / f"{split}.npy")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/stdlib-corpus")
    m = prepare(out)
    print(
        {k: v for k, v in m.items() if k not in ("heldout_files", "skipped_non_utf8")}
    )
