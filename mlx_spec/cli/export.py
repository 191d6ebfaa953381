"""``mlx_spec export``: write a trained head in a format other engines load.

A head that ``mlx_spec train-draft --kind eagle3`` trained becomes a
speculators EAGLE-3 folder (``config.json`` + ``model.safetensors``), which
vLLM and SGLang load, and mlx-spec too (``--draft-model FOLDER``)::

    mlx_spec export --head models/my-eagle3 --model models/smollm2-135m-instruct \\
        --out exported/my-eagle3 --verifier HuggingFaceTB/SmolLM2-135M-Instruct
"""

import argparse
from pathlib import Path
from typing import List, Optional

from mlx_spec_entry import guarded

from ..options import one_line_errors

FORMATS = ("speculators-eagle3",)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx_spec export",
        description="Write a head trained by mlx_spec train-draft --kind eagle3 in "
        "speculators' EAGLE-3 format (vLLM, SGLang).",
    )
    one_line_errors(p)
    p.add_argument("--head", required=True, help="The head directory to export.")
    p.add_argument(
        "--model", required=True, help="The target it was trained for (path or repo)."
    )
    p.add_argument("--out", required=True, help="The folder to write.")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=FORMATS[0],
        help=f"The format to write (default: {FORMATS[0]}).",
    )
    p.add_argument(
        "--verifier",
        help="The target's name recorded in the folder for vLLM users, e.g. its "
        "Hugging Face repo id (default: --model when it is a repo id; none for a "
        "local folder, whose path means nothing elsewhere).",
    )
    p.add_argument(
        "--force", action="store_true", help="Replace a non-empty --out folder."
    )
    return p


def verifier_name(args) -> Optional[str]:
    """``--verifier``, else ``--model`` if it names a repo rather than a local folder."""
    if args.verifier:
        return args.verifier
    return None if Path(args.model).expanduser().exists() else args.model


def main(argv: Optional[List[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    from ..drafters.published.export import eagle3_head_config, export_eagle3
    from ..loading import load_model
    from ..outdir import check_out_dir, check_outside, staged_dir

    try:
        check_out_dir(args.out, force=args.force)
        check_outside(args.out, args.head, flag="--out", what="the head")
        eagle3_head_config(args.head)  # before the target loads and --out is made
        model, _ = load_model(args.model)
        with staged_dir(args.out) as staged:
            export_eagle3(args.head, model, staged, verifier=verifier_name(args))
    except ValueError as e:
        parser.error(str(e))
    print(
        f"wrote {args.out} (speculators EAGLE-3; load it with --draft-model {args.out})"
    )
    return 0


if __name__ == "__main__":
    guarded(main)
