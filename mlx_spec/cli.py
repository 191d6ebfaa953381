"""The ``mlx_spec`` command family: ``mlx_spec generate|server|chat|bench|doctor``.

Like the ``mlx_lm`` umbrella, the first argument picks a subcommand whose
``main()`` then parses the rest. Each subcommand is also its own console
script (``mlx_spec.generate``, ``mlx_spec.server``, ...).

This module also holds :func:`add_speculative_options`, the speculative
flags every command shares.
"""

from . import ensure_fast_blas

ensure_fast_blas()

import argparse
import importlib
import sys
from typing import Dict, List, Optional

from .config import (
    DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN,
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_TREE_BUDGET,
    DEFAULT_TREE_DEPTH,
    DEFAULT_TREE_TOP_K,
    METHODS,
)

# Subcommand -> "module:function", imported only when chosen.
SUBCOMMANDS = {
    "generate": "mlx_spec.generate:main",
    "server": "mlx_spec.server:main",
    "chat": "mlx_spec.chat:main",
    "bench": "mlx_spec.cli:bench_main",
    "doctor": "mlx_spec.doctor:main",
}
BENCH_ENTRY = "benchmarks.run:main"

# SpecConfig fields that the method options below set (sampling lives elsewhere).
METHOD_OPTIONS = (
    "num_draft_tokens",
    "tree_budget",
    "tree_top_k",
    "tree_depth",
    "tree_choices",
    "ngram_min",
    "ngram_max",
    "adaptive",
)


def add_speculative_options(
    parser: argparse.ArgumentParser,
    *,
    speculative_default: Optional[str] = None,
    num_draft_tokens: bool = True,
) -> argparse._ArgumentGroup:
    """Add ``--speculative`` and every method's options to ``parser``.

    Args:
        parser: The parser to extend.
        speculative_default: Default of ``--speculative``. Default: ``None``
          (``draft`` when a draft model is given, else ``none``).
        num_draft_tokens: Also add ``--num-draft-tokens`` (leave it out when
          the parser already has mlx_lm's flag). Default: ``True``.

    Returns:
        The argument group that holds the options.
    """
    group = parser.add_argument_group("speculative decoding")
    if not any(a.dest == "speculative" for a in parser._actions):
        group.add_argument(
            "--speculative",
            choices=METHODS,
            default=speculative_default,
            metavar="METHOD",
            help=f"Speculative method, one of: {', '.join(METHODS)}. "
            "Default: draft when a draft model is given, else none.",
        )
    if num_draft_tokens:
        group.add_argument(
            "--num-draft-tokens",
            type=int,
            default=DEFAULT_NUM_DRAFT_TOKENS,
            help=f"Draft tokens per round, 1 to 64 (default: {DEFAULT_NUM_DRAFT_TOKENS}).",
        )
    group.add_argument(
        "--tree-budget",
        type=int,
        default=DEFAULT_TREE_BUDGET,
        help=f"tree: maximum tree nodes verified per round (default: {DEFAULT_TREE_BUDGET}).",
    )
    group.add_argument(
        "--tree-top-k",
        type=int,
        default=DEFAULT_TREE_TOP_K,
        help=f"tree: children per node, 1 to 16 (default: {DEFAULT_TREE_TOP_K}).",
    )
    group.add_argument(
        "--tree-depth",
        type=int,
        default=DEFAULT_TREE_DEPTH,
        help=f"tree: maximum tree depth (default: {DEFAULT_TREE_DEPTH}).",
    )
    group.add_argument(
        "--tree-choices",
        default=None,
        metavar="JSON",
        help='tree: a static tree as index paths, e.g. "[[0], [1], [0, 0]]" (default: None).',
    )
    group.add_argument(
        "--ngram-min",
        type=int,
        default=DEFAULT_NGRAM_MIN,
        help=f"lookup: shortest n-gram to match (default: {DEFAULT_NGRAM_MIN}).",
    )
    group.add_argument(
        "--ngram-max",
        type=int,
        default=DEFAULT_NGRAM_MAX,
        help=f"lookup: longest n-gram to match (default: {DEFAULT_NGRAM_MAX}).",
    )
    group.add_argument(
        "--adaptive",
        action="store_true",
        help="Choose the draft length or tree size per round (default: off).",
    )
    return group


def method_options(args: argparse.Namespace) -> Dict[str, object]:
    """The :data:`METHOD_OPTIONS` found in parsed ``args``."""
    return {name: getattr(args, name) for name in METHOD_OPTIONS if hasattr(args, name)}


def _load(entry: str):
    module, function = entry.split(":")
    return getattr(importlib.import_module(module), function)


def bench_main(argv: Optional[List[str]] = None):
    """Run the benchmark harness (``benchmarks/run.py``)."""
    try:
        bench = _load(BENCH_ENTRY)
    except ImportError as e:
        sys.exit(
            f"mlx_spec bench: error: the benchmark harness is not available ({e}); "
            "run it from a source checkout that has benchmarks/."
        )
    return bench(argv) if argv is not None else bench()


def _usage() -> str:
    lines = ["usage: mlx_spec {" + ",".join(SUBCOMMANDS) + "} ...", ""]
    lines.append("Exact speculative decoding for MLX / mlx-lm. Subcommands:")
    described = {
        "generate": "generate text (a superset of mlx_lm.generate)",
        "server": "OpenAI-compatible HTTP server (a superset of mlx_lm.server)",
        "chat": "interactive terminal chat (like mlx_lm.chat)",
        "bench": "benchmarks of the speculative methods",
        "doctor": "check the platform, the mlx device and the BLAS in use",
    }
    for name in SUBCOMMANDS:
        lines.append(f"  {name:10s}{described[name]}")
    lines.append("")
    lines.append(
        "Pass --help to a subcommand for its options, e.g. mlx_spec generate --help"
    )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None):
    """Dispatch ``mlx_spec SUBCOMMAND [ARGS...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from . import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(_usage(), file=sys.stderr)
        sys.exit(f"mlx_spec: error: unknown subcommand '{name}'")
    # Subcommands parse sys.argv; make it look like their own console script.
    sys.argv = [f"mlx_spec {name}", *rest]
    return _load(SUBCOMMANDS[name])(rest)


if __name__ == "__main__":
    sys.exit(main())
