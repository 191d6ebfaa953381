"""``mlx_spec bench``: the benchmark harness (``mlx_spec/bench/run.py``) under the
package's name, with the speculative method options as flags."""

import argparse
import importlib
import json
import os
import sys
from typing import List, Optional, Sequence

from ..options import add_speculative_options, one_line_errors

BENCH_ENTRY = "mlx_spec.bench.run:main"
# The harness flag that carries one extra SpecConfig field as KEY=VALUE (JSON).
BENCH_OPTION_FLAG = "--option"


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
    return one_line_errors(harness_parser)


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
    """Run the benchmark harness (``mlx_spec/bench/run.py``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    module_name, function = BENCH_ENTRY.split(":")
    prog = _bench_prog()
    try:
        module = importlib.import_module(module_name)
        bench = getattr(module, function)
    except (ImportError, AttributeError) as e:
        sys.exit(f"{prog}: error: the benchmark harness is not available ({e})")
    make_parser = getattr(module, "setup_arg_parser", None)
    if make_parser is not None:
        harness_dests = {a.dest for a in make_parser()._actions}
        parser = bench_arg_parser(make_parser(), prog)
        parser.parse_args(argv)  # --help and errors under our name
        argv = bench_argv(parser, harness_dests, argv)
    bench(argv, prog=prog)  # its errors under our name too
    return 0
