"""Tokenizers rebuilt from GGUF metadata against llama.cpp's expected token ids.

llama.cpp keeps vocabulary-only GGUFs with test texts and the ids each
family's original (Hugging Face) tokenizer gives them:
``models/ggml-vocab-<name>.gguf`` with ``.gguf.inp`` (texts separated by
``__ggml_vocab_test__`` lines) and ``.gguf.out`` (ids, one text per line).
This rebuilds each vocabulary with :func:`mlx_spec.convert.tokenizer.build_tokenizer`
and counts the texts whose ids agree (no BOS/EOS added, as llama.cpp's
``test-tokenizer-0`` does). Vocabularies the converter refuses are listed
with the reason.

    python -m benchmarks.gguf_vocab LLAMA_CPP/models [--show 3]

The files are not part of this repository; any llama.cpp checkout (or the
``vendor/llama.cpp`` of the ``llama-cpp-python`` sdist) has them. Exits 1 if
a rebuilt vocabulary disagrees on any text.
"""

import argparse
import json
import sys
from pathlib import Path

from mlx_spec.convert.gguf_file import GGUFFile
from mlx_spec.convert.tokenizer import TokenizerConversionError, build_tokenizer

SEPARATOR = "\n__ggml_vocab_test__\n"


def read_cases(vocab: Path) -> list:
    """``(text, expected ids)`` pairs of a vocabulary's test files."""
    texts = Path(f"{vocab}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = Path(f"{vocab}.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


def check_vocabulary(vocab: Path, show: int = 3) -> dict:
    """One vocabulary's row: its kind, and the texts whose ids agree."""
    metadata = GGUFFile(vocab).metadata
    row = {
        "vocabulary": vocab.name,
        "model": metadata.get("tokenizer.ggml.model"),
        "pre": metadata.get("tokenizer.ggml.pre"),
    }
    try:
        tokenizer = build_tokenizer(metadata)
    except TokenizerConversionError as e:
        return {**row, "refused": str(e)}
    cases = read_cases(vocab)
    wrong = []
    for text, expected in cases:
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != expected:
            wrong.append({"text": text, "expected": expected, "got": got})
    return {
        **row,
        "agree": len(cases) - len(wrong),
        "texts": len(cases),
        "wrong": wrong[:show],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gguf_vocab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("models", help="llama.cpp's models/ folder")
    parser.add_argument(
        "--show", type=int, default=3, help="disagreements shown per vocabulary"
    )
    args = parser.parse_args(argv)
    vocabs = sorted(
        p
        for p in Path(args.models).glob("ggml-vocab-*.gguf")
        if Path(f"{p}.out").is_file()
    )
    if not vocabs:
        sys.exit(
            f"benchmarks.gguf_vocab: error: no ggml-vocab-*.gguf with tests in {args.models}"
        )
    rows = [check_vocabulary(v, args.show) for v in vocabs]
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    print("\n| vocabulary | model | pre-tokenizer | texts with llama.cpp's ids |")
    print("|---|---|---|---|")
    for row in rows:
        result = f"{row['agree']}/{row['texts']}" if "agree" in row else "refused"
        print(f"| {row['vocabulary']} | {row['model']} | {row['pre']} | {result} |")
    return 1 if any(r.get("wrong") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
