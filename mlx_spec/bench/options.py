"""The command line of ``python -m mlx_spec.bench.run`` and the settings it resolves.

:func:`setup_arg_parser` builds the parser (``mlx_spec bench`` reuses it and
adds the speculative method options); :func:`resolve_settings` turns parsed
arguments into the run's settings, with a one-line ``ValueError`` for a bad
value. The defaults of the full and the ``--quick`` benchmark live here.
"""

import argparse
import json
import os
from pathlib import Path

from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS, check_size
from mlx_spec.drafters.registry import METHODS
from mlx_spec.loading import check_model_path
from mlx_spec.options import method_option_names, one_line_errors
from mlx_spec.outdir import check_named
from mlx_spec.validation import DRAFTER_LATER, check_gammas, spec_config

from .measure import QWEN2_SHAPES
from .prompts import BASE_SETS, CHAT_SETS
from .report import RESULTS_JSON, RESULTS_MD, is_results_json
from .runner import BASELINES, SWEEP_METHODS

DEFAULT_TEMPS = (0.0, 0.7)
DEFAULT_MAX_TOKENS = 128
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1
DEFAULT_SEED = 0
DEFAULT_OUT = "bench_out"
DEFAULT_GAMMA_SWEEP = (1, 2, 3, 4, 6, 8)
# --quick (about 5 minutes on a 2-core CPU): one repeat, no γ sweep unless asked.
QUICK_GAMMA_SWEEP = ()
QUICK_MAX_TOKENS = 48
QUICK_REPEATS = 1
# Answers drawn per prompt at a temperature > 0, each its own block: a sampled
# answer (its length too) depends on its seed, so one draw per set says little.
DEFAULT_DRAWS = 1
# One bare sample: the mean gap of a chain of this many pipelined forwards.
BARE_CHAIN = 5


def _parse_option(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option {text!r}: expected KEY=VALUE.")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.run",
        description="Benchmark mlx-spec methods against mlx_lm and mlx_lm's "
        "speculative decoding, side by side in one process.",
    )
    one_line_errors(parser)
    parser.add_argument(
        "--model",
        default=None,
        help="Target model: an mlx_lm path or hub id. Default: the "
        "embedded default pair (models/), or tiny test checkpoints.",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="Draft model (same tokenizer). Default: the default pair's "
        "draft when --model is not given, else none.",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"Methods to run, from {', '.join(BASELINES + METHODS)}. "
        "Default: the baselines and every mlx-spec method that is available.",
    )
    parser.add_argument(
        "--temps",
        nargs="+",
        type=float,
        default=list(DEFAULT_TEMPS),
        help="Sampling temperatures (0 is greedy). Default: 0 0.7.",
    )
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=DEFAULT_NUM_DRAFT_TOKENS,
        help=f"Draft tokens per round γ. Default: {DEFAULT_NUM_DRAFT_TOKENS}.",
    )
    parser.add_argument(
        "--gamma-sweep",
        nargs="*",
        type=int,
        default=None,
        help=f"Also run {' and '.join(SWEEP_METHODS)} at these γ (no values: "
        f"{' '.join(map(str, DEFAULT_GAMMA_SWEEP))}). Default: that sweep at every "
        "temperature in full mode; none with --quick (given with --quick: at the "
        "first temperature only).",
    )
    parser.add_argument(
        "--no-gamma-sweep",
        action="store_true",
        help="Run every method at --num-draft-tokens only.",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"Tokens per generation. Default: {DEFAULT_MAX_TOKENS} "
        f"({QUICK_MAX_TOKENS} with --quick).",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"Repetitions over the prompt suite. Default: {DEFAULT_REPEATS} "
        f"({QUICK_REPEATS} with --quick).",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=DEFAULT_DRAWS,
        help="Answers drawn per prompt and repeat at each temperature > 0, each "
        f"with its own seed and block. Default: {DEFAULT_DRAWS}.",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"Warm-up generations per method and temp. Default: {DEFAULT_WARMUP}.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"One prompt per set, {QUICK_REPEATS} repeat(s), {QUICK_MAX_TOKENS}-token "
        "generations, no γ sweep unless --gamma-sweep, and method 'none' left out "
        "unless named.",
    )
    parser.add_argument(
        "--prompt-sets",
        nargs="+",
        default=None,
        metavar="SET",
        help=f"Prompt sets to run. Default: all of the suite (chat suite: "
        f"{' '.join(CHAT_SETS)}; base suite: {' '.join(BASE_SETS)}).",
    )
    parser.add_argument(
        "--suite",
        choices=("auto", "chat", "base"),
        default="auto",
        help="Built-in prompt suite: 'chat' (requests sent through the chat "
        "template) or 'base' (raw text to continue). Default: 'auto', the chat "
        "suite when the target has a chat template.",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="Your own prompts instead of the suite: JSON lines with 'prompt_set' "
        "and 'prompt' (text; sent through the chat template when the model has "
        "one) or 'messages' ([{role, content}, ...]); 'name' is optional.",
    )
    parser.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="DIR",
        help="A trained draft head (EAGLE or Medusa, from `mlx_spec train-draft`) "
        "for the methods that need one. Repeatable. Default: the heads in models/ "
        "trained for the default target, when --model is not given.",
    )
    parser.add_argument(
        "--method-draft",
        action="append",
        default=[],
        metavar="METHOD=PATH",
        help="A drafter for one method only (an mlx-lm checkpoint with the "
        "target's tokenizer, or a head), e.g. mlx_lm_speculative=PATH. Repeatable.",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="Skip the profiled pass that splits each round's time into "
        "drafting, verification and host work.",
    )
    parser.add_argument(
        "--option",
        action="append",
        type=_parse_option,
        default=[],
        metavar="KEY=VALUE",
        help="A method option (as the --tree-budget, --ngram-max, ... flags), e.g. "
        "tree_budget=32. Repeatable.",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"Output directory for results.json/.md and charts. "
        f"Default: {DEFAULT_OUT}.",
    )
    parser.add_argument(
        "--cost-curves",
        action="store_true",
        help="Also measure forward time against verified width (1-64) "
        "for random-weight Qwen2.5-0.5B/1.5B shapes (float32, ~8 GB) "
        "and write PROJECTED speedups for them.",
    )
    parser.add_argument(
        "--cost-curves-from",
        default=None,
        metavar="JSON",
        help="Project with cost curves measured earlier (a results.json, or the "
        "output of `python -m mlx_spec.bench.measure`) instead of measuring them.",
    )
    parser.add_argument(
        "--cost-shapes",
        nargs="+",
        default=list(QWEN2_SHAPES),
        choices=list(QWEN2_SHAPES),
        help="Shapes for --cost-curves.",
    )
    parser.add_argument(
        "--forward-repeats",
        type=int,
        default=3,
        help="Bare samples per width taken before the first block (more are "
        "taken after every block). Default: 3.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"Base seed (the same per prompt for all methods). "
        f"Default: {DEFAULT_SEED}.",
    )
    parser.add_argument("--no-charts", action="store_true", help="Skip the PNG charts.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def _default(value, default):
    return default if value is None else value


def resolve_settings(args) -> dict:
    """The run's settings from parsed ``args``; ``ValueError`` names a bad value."""
    quick = args.quick
    sweep = args.gamma_sweep
    if args.no_gamma_sweep:
        sweep = []
    elif sweep is None:
        sweep = list(QUICK_GAMMA_SWEEP if quick else DEFAULT_GAMMA_SWEEP)
    elif not sweep:
        sweep = list(DEFAULT_GAMMA_SWEEP)
    settings = {
        "quick": quick,
        "temps": [float(t) for t in args.temps],
        "num_draft_tokens": args.num_draft_tokens,
        "gamma_sweep": sorted(set(sweep)),
        # --quick sweeps γ at the first temperature only, to stay short.
        "sweep_temps": [float(t) for t in (args.temps[:1] if quick else args.temps)],
        "max_tokens": _default(
            args.max_tokens, QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS
        ),
        "repeats": _default(args.repeats, QUICK_REPEATS if quick else DEFAULT_REPEATS),
        "draws": args.draws,
        "warmup": args.warmup,
        "seed": args.seed,
        "forward_repeats": args.forward_repeats,
        "bare_chain": BARE_CHAIN,
        "method_options": dict(args.option),
        "profile": not args.no_profile,
        # --quick's shortcuts apply to its default method list only.
        "methods_named": bool(getattr(args, "methods", None)),
    }
    for name, value, low in (
        ("--max-tokens", settings["max_tokens"], 1),
        ("--repeats", settings["repeats"], 1),
        ("--draws", settings["draws"], 1),
        ("--warmup", settings["warmup"], 0),
        ("--forward-repeats", settings["forward_repeats"], 1),
    ):
        check_size(name, value, low)  # mlx takes 32-bit sizes (2**70: TypeError)
    for head in getattr(args, "head", None) or ():  # before the target loads
        check_model_path(head, "--head")
    # Each run's config is made as it runs; the ranges are checked here, at once.
    spec_config(
        None,
        DRAFTER_LATER,
        flags=True,
        num_draft_tokens=args.num_draft_tokens,
        seed=args.seed,  # plain mlx_lm runs seed mx.random with it too
    )
    check_gammas(settings["gamma_sweep"], "--gamma-sweep")
    for temp in settings["temps"]:
        spec_config(None, DRAFTER_LATER, flags=True, temp=temp)
    check_method_options(settings["method_options"])
    check_out(args.out)
    return settings


def check_run_lengths(max_tokens: int, repeats: int) -> None:
    """A study's ``--max-tokens`` and ``--repeats``, checked before anything loads.

    Raises:
        ValueError: Naming the flag and its range.
    """
    spec_config(None, DRAFTER_LATER, flags=True, max_tokens=max_tokens)
    check_size("--repeats", repeats)


def check_method_options(options: dict):
    """``--option KEY=VALUE`` pairs must be method options with valid values."""
    fields = set(method_option_names()) - {"num_draft_tokens"}  # its own flag
    for key in options:
        if key not in fields:
            raise ValueError(
                f"--option {key}: not a method option; use one of "
                f"{', '.join(sorted(fields))}."
            )
    try:
        spec_config(None, DRAFTER_LATER, **options)
    except ValueError as e:
        raise ValueError(f"--option: {e}") from None


def check_out(out: str):
    """``--out`` must be a directory, or one that can be made in a writable one."""
    path = Path(check_named(out, "--out")).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory.")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ValueError(f"--out {out} cannot be written ({existing} is not writable).")
    # A run replaces the results of an earlier one, never a user's file of that name.
    mine = [name for name in (RESULTS_JSON, RESULTS_MD) if (path / name).exists()]
    if mine and not is_results_json(path / RESULTS_JSON):
        raise ValueError(
            f"--out {out} holds a {mine[0]} that is not a benchmark's results; "
            "choose another folder."
        )
