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
import dataclasses
import importlib
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

from .config import METHODS, SpecConfig

# Subcommand -> "module:function", imported only when chosen.
SUBCOMMANDS = {
    "generate": "mlx_spec.generate:main",
    "server": "mlx_spec.server:main",
    "chat": "mlx_spec.chat:main",
    "bench": "mlx_spec.cli:bench_main",
    "doctor": "mlx_spec.doctor:main",
}
BENCH_ENTRY = "benchmarks.run:main"
# The harness flag that carries one extra SpecConfig field as KEY=VALUE (JSON).
BENCH_OPTION_FLAG = "--option"

# SpecConfig fields that are not method options (sampling, length, timing).
GENERAL_FIELDS = (
    "method",
    "temp",
    "top_p",
    "top_k",
    "min_p",
    "min_tokens_to_keep",
    "max_tokens",
    "seed",
    "profile",
)
OPTION_HELP = {
    "num_draft_tokens": "Draft tokens per round, 1 to 64",
    "tree_budget": "tree: maximum tree nodes verified per round",
    "tree_top_k": "tree: children per node, 1 to 16",
    "tree_depth": "tree: maximum tree depth",
    "tree_choices": 'tree: a static tree as JSON index paths, e.g. "[[0], [1], [0, 0]]"',
    "ngram_min": "lookup: shortest n-gram to match",
    "ngram_max": "lookup: longest n-gram to match",
    "lookup_candidates": "lookup: matches verified together as one token tree (1 = a chain)",
    "adaptive": "Choose the draft length or tree size per round from measured "
    "acceptance and costs",
    "draft_p_min": "Stop drafting when the draft's top probability drops below it, "
    "like llama.cpp's --draft-p-min (one host sync per draft step; 0 = off)",
}


def _engine_default_method() -> str:
    """What ``stream_generate`` runs when no method is named."""
    from .generation import resolve_method

    return resolve_method(None, None)


def method_option_fields() -> List[dataclasses.Field]:
    """The :class:`SpecConfig` fields that configure a method (not sampling).

    New fields of later methods show up here, as command-line flags and as
    server request fields, without further changes.
    """
    return [f for f in dataclasses.fields(SpecConfig) if f.name not in GENERAL_FIELDS]


def method_option_names() -> List[str]:
    return [f.name for f in method_option_fields()]


def add_speculative_options(
    parser: argparse.ArgumentParser,
    *,
    speculative_default: Optional[str] = None,
    include_method: bool = True,
) -> argparse._ArgumentGroup:
    """Add ``--speculative`` and every method option that ``parser`` lacks.

    One flag per :func:`method_option_fields` entry (``--num-draft-tokens``,
    ``--tree-budget``, ...), with the :class:`SpecConfig` default; booleans
    get ``--flag/--no-flag``. Flags the parser already has are kept as is.

    Args:
        parser: The parser to extend.
        speculative_default: Default of ``--speculative``. Default: ``None``
          (the best method for the models given).
        include_method: Add ``--speculative`` too. Default: ``True``.

    Returns:
        The argument group that holds the options.
    """
    existing = {action.dest for action in parser._actions}
    group = parser.add_argument_group("speculative decoding")
    if include_method and "speculative" not in existing:
        group.add_argument(
            "--speculative",
            choices=METHODS,
            default=speculative_default,
            metavar="METHOD",
            help=f"Speculative method, one of: {', '.join(METHODS)} "
            f"(default: {speculative_default or _engine_default_method()}).",
        )
    for f in method_option_fields():
        if f.name in existing:
            continue
        flag = "--" + f.name.replace("_", "-")
        text = OPTION_HELP.get(f.name, f.name.replace("_", " ").capitalize())
        if isinstance(f.default, bool):
            state = "on" if f.default else "off"
            group.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=f"{text} (default: {state}).",
            )
        elif isinstance(f.default, (int, float)):
            group.add_argument(
                flag,
                type=type(f.default),
                default=f.default,
                help=f"{text} (default: {f.default}).",
            )
        else:
            group.add_argument(
                flag,
                default=f.default,
                metavar="JSON",
                help=f"{text} (default: {f.default}).",
            )
    return group


def method_options(args: argparse.Namespace) -> Dict[str, object]:
    """The method options found in parsed ``args``, ready for ``SpecConfig``."""
    return {
        name: getattr(args, name)
        for name in method_option_names()
        if hasattr(args, name)
    }


def _load(entry: str):
    module, function = entry.split(":")
    return getattr(importlib.import_module(module), function)


def _bench_prog() -> str:
    """``mlx_spec bench`` from the umbrella, else the console script's name."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith("mlx_spec") else "mlx_spec bench"


def bench_arg_parser(
    harness_parser: argparse.ArgumentParser, prog: str
) -> argparse.ArgumentParser:
    """The harness's parser under ``prog``, plus the speculative method options.

    The method options (``--tree-budget``, ``--ngram-max``, ...) apply to
    every mlx-spec method benchmarked; :func:`bench_argv` hands them to the
    harness as its ``--option KEY=VALUE``.
    """
    harness_parser.prog = prog
    harness_parser.allow_abbrev = False  # flags must reach bench_argv unabbreviated
    add_speculative_options(harness_parser, include_method=False)
    return harness_parser


def bench_argv(
    parser: argparse.ArgumentParser, harness_dests: Sequence[str], argv: List[str]
) -> List[str]:
    """``argv`` for the harness: method options rewritten as ``--option KEY=VALUE``.

    Args:
        parser: The parser from :func:`bench_arg_parser`.
        harness_dests: The destinations the harness's own parser knows.
        argv: The command line given to ``mlx_spec bench``.
    """
    extra = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for action in parser._actions:
        if action.dest in harness_dests or not action.option_strings:
            continue
        kwargs = {"dest": action.dest, "default": argparse.SUPPRESS}
        if isinstance(action, argparse.BooleanOptionalAction):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = action.type
        extra.add_argument(*action.option_strings, **kwargs)
    given, rest = extra.parse_known_args(argv)
    for name, value in vars(given).items():
        rest += [BENCH_OPTION_FLAG, f"{name}={json.dumps(value)}"]
    return rest


def bench_main(argv: Optional[List[str]] = None):
    """Run the benchmark harness (``benchmarks/run.py``)."""
    from .loading import REPO_ROOT

    argv = list(sys.argv[1:] if argv is None else argv)
    # benchmarks/ ships with the source checkout, next to the package.
    if (REPO_ROOT / "benchmarks").is_dir() and str(REPO_ROOT) not in sys.path:
        sys.path.append(str(REPO_ROOT))
    module_name, function = BENCH_ENTRY.split(":")
    try:
        module = importlib.import_module(module_name)
        bench = getattr(module, function)
    except (ImportError, AttributeError) as e:
        sys.exit(
            f"mlx_spec bench: error: the benchmark harness is not available ({e}); "
            "run it from a source checkout that has benchmarks/."
        )
    make_parser = getattr(module, "setup_arg_parser", None)
    if make_parser is not None:
        harness_dests = {a.dest for a in make_parser()._actions}
        parser = bench_arg_parser(make_parser(), _bench_prog())
        parser.parse_args(argv)  # --help and errors under our name
        argv = bench_argv(parser, harness_dests, argv)
    bench(argv)
    return 0


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
    result = _load(SUBCOMMANDS[name])(rest)
    # Console scripts exit with main()'s value: only pass on exit codes.
    return result if isinstance(result, int) else None


if __name__ == "__main__":
    sys.exit(main())
