"""The speculative flags every command shares (``--speculative``, ``--tree-budget``, ...).

One flag per method option of :class:`~mlx_spec.config.SpecConfig`, so new
options of later methods become flags (and server request fields) without
further changes; and :func:`one_line_errors`, which every command's parser
uses. This module imports only the configuration, so every command can use it.
"""

import argparse
import dataclasses
import functools
from typing import Dict, List, Optional

from .config import (
    MAX_DRAFT_TOKENS,
    MAX_TREE_BUDGET,
    MAX_TREE_TOP_K,
    METHODS,
    SpecConfig,
    resolve_method,
)

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
    "num_draft_tokens": f"Draft tokens per round, 1 to {MAX_DRAFT_TOKENS}",
    "tree_budget": "tree: tree nodes verified per round (adaptive: a drafted tree "
    "starts at 4 at most and grows up to 4x this where it pays)",
    "tree_top_k": f"tree: children per node, 1 to {MAX_TREE_TOP_K}",
    "tree_depth": "tree: maximum tree depth",
    "tree_choices": "tree: a static tree as JSON index paths of child ranks "
    f'0-{MAX_TREE_TOP_K - 1}, e.g. "[[0], [1], [0, 0]]" (at most {MAX_TREE_BUDGET} '
    f"nodes, {MAX_DRAFT_TOKENS} deep)",
    "ngram_min": "lookup: shortest n-gram to match",
    "ngram_max": "lookup: longest n-gram to match",
    "lookup_candidates": "lookup: matches verified together as one token tree (1 = a chain)",
    "adaptive": "Choose the draft length or tree size per round from measured "
    "acceptance and costs",
    "draft_p_min": "Stop drafting when the draft's top probability drops below it, "
    "like llama.cpp's --draft-p-min (one host sync per draft step; 0 = off)",
}


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str):
        message = " ".join(str(message).splitlines())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_value(self, action, arg_string):
        # argparse reports a type's ValueError alone; mlx_lm's parse_size
        # raises decimal.InvalidOperation (a traceback for --prompt-cache-bytes x).
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            raise
        except Exception:
            raise argparse.ArgumentError(
                action, f"invalid value: {arg_string!r}"
            ) from None


@functools.lru_cache(maxsize=None)
def _one_line_class(cls: type) -> type:
    if issubclass(cls, OneLineErrorParser):
        return cls
    if cls is argparse.ArgumentParser:
        return OneLineErrorParser
    return type(f"OneLine{cls.__name__}", (OneLineErrorParser, cls), {})


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` report bad input as ``PROG: error: MESSAGE (see PROG --help)``.

    One line on stderr and exit code 2, for argparse's own errors and
    ``parser.error()`` calls alike; ``--help`` is unchanged. Subcommand
    parsers, those added already and those added later, do the same.

    Returns:
        ``parser`` itself, now a :class:`OneLineErrorParser`.
    """
    parser.__class__ = _one_line_class(type(parser))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action._parser_class = _one_line_class(action._parser_class)
            for subparser in action.choices.values():
                one_line_errors(subparser)
    return parser


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
            f"(default: {speculative_default or resolve_method(None)}).",
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
