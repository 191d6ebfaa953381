"""The options of ``mlx_spec train-draft``: its parser, their checks, and the
options a resumed run takes from its checkpoint.
"""

import argparse
import math
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List

from ..config import MAX_SEED, OptionError, check_size, flag_name
from ..features import FINAL, feature_owner
from ..options import one_line_errors
from ..outdir import check_out_dir, check_outside
from ..validation import check_gammas
from . import completions as C
from . import draft as D
from . import head_command as H
from .checkpoint import checkpoint_dir, read_state
from .corpus import Corpus
from .corpus_data import HELDOUT_TOKENS_HELP, heldout_budget
from .corpus_select import SELECTION_FILE, SELECTIONS
from .eagle import DEFAULT_FEATURE_WEIGHT as DEFAULT_EAGLE_FEATURE_WEIGHT
from .precision import PRECISIONS
from .prompts import load_prompt_file

KINDS = ("draft", "eagle", "eagle3", "medusa")
LABELS = ("laws", "written")
DEFAULT_NUM_PROMPTS = 1600
DEFAULT_HELDOUT_PROMPTS = 48
DEFAULT_EVAL_PROMPTS = 8
DEFAULT_EVAL_TOKENS = 128
DEFAULT_EVAL_GAMMAS = "1,2,3,4,5,6"


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx_spec train-draft",
        description="Train a drafter for a target model by self-distillation, with MLX.",
    )
    one_line_errors(p)
    p.add_argument("--model", required=True, help="The target model (path or repo).")
    p.add_argument("--kind", choices=KINDS, default="draft", help="What to train.")
    p.add_argument("--out", required=True, help="Output directory of the drafter.")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into --out even if it holds files that train-draft did not write",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--prompts", help="JSON-lines prompt file (default: built-in prompts)."
    )
    g.add_argument(
        "--self-instruct",
        type=int,
        default=0,
        metavar="N",
        help="Also N requests written by the target itself from its chat template's "
        "empty user turn (varied prompts without a dataset; kept in the data folder).",
    )
    g.add_argument(
        "--num-prompts",
        type=int,
        default=DEFAULT_NUM_PROMPTS,
        help=f"Training prompts the target answers (default: {DEFAULT_NUM_PROMPTS}).",
    )
    g.add_argument(
        "--heldout-prompts",
        type=int,
        default=DEFAULT_HELDOUT_PROMPTS,
        help=f"Held-out prompts (default: {DEFAULT_HELDOUT_PROMPTS}).",
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=C.DEFAULT_MAX_TOKENS,
        help=f"Longest completion (default: {C.DEFAULT_MAX_TOKENS}).",
    )
    g.add_argument(
        "--sampled-share",
        type=float,
        default=C.DEFAULT_SAMPLED_SHARE,
        help="Share of training completions sampled at --sampled-temp, the rest "
        f"greedy (default: {C.DEFAULT_SAMPLED_SHARE}).",
    )
    g.add_argument("--sampled-temp", type=float, default=C.DEFAULT_SAMPLED_TEMP)
    g.add_argument(
        "--gen-batch",
        type=int,
        default=C.DEFAULT_BATCH_SIZE,
        help=f"Sequences generated together (default: {C.DEFAULT_BATCH_SIZE}).",
    )
    g.add_argument(
        "--data",
        metavar="DIR",
        help="Where the completions are kept (default: OUT/data); drafters of "
        "several kinds can share one folder.",
    )
    g.add_argument(
        "--corpus",
        metavar="DIR",
        help="Train on a committed corpus (`mlx_spec corpus grow`) instead of new "
        "completions: its train split trains, its held-out split measures; the "
        "target's laws and features come from one prefill, cached outside git.",
    )
    g.add_argument(
        "--corpus-tokens",
        type=int,
        metavar="N",
        help="With --corpus: train on whole shards up to about N completion tokens, "
        "the first ones or as --corpus-select says (a point of the learning curve; "
        "default: all).",
    )
    g.add_argument(
        "--corpus-select",
        choices=SELECTIONS,
        help="With --corpus and --corpus-tokens N: which shards fill the budget. "
        "first: the first shards in order. newest: first the shards the "
        "--init-from drafter has not trained on (its learning curve says which), "
        "then a random sample of those it has, seeded by --seed (replay, so it "
        "does not forget); only the chosen shards are prefilled (default: first).",
    )
    g.add_argument(
        "--heldout-tokens",
        type=int,
        metavar="N",
        help=f"With --corpus: measure on {HELDOUT_TOKENS_HELP}.",
    )
    g.add_argument(
        "--labels",
        choices=LABELS,
        default="laws",
        help="With --corpus and --kind draft: what the draft learns from. laws: the "
        "target's top-K laws (soft labels) and the written tokens, from one prefill of "
        "the target over the chosen sequences (cached outside git); written: the "
        "written tokens alone, with no forward of the target (greedy rows' tokens are "
        "its argmax, sampled rows' are draws from its law), so no --soft-weight, "
        "--feature-weight, --rollout-steps or --keep-features (default: laws).",
    )
    g.add_argument(
        "--cache",
        metavar="DIR",
        help="With --corpus: where the prefilled laws and features are kept "
        "(default: $MLX_SPEC_CACHE/corpus, else ~/.cache/mlx_spec/corpus).",
    )
    g.add_argument(
        "--data-only",
        action="store_true",
        help="Make (or extend) the completions in OUT/data, or with --corpus its cached prefill, then stop.",
    )
    g.add_argument(
        "--keep-features",
        metavar="LAYERS",
        help="Target features kept at every position of the data: comma-separated "
        f"block indices, {FINAL} = the final normed hidden state; a head whose "
        "--feature-layers are among them needs no second pass of the target, and "
        "the data grows by one hidden state per position for each one kept "
        "(default: what the data folder holds, else what this run reads: an EAGLE "
        f"head's --feature-layers, else {FINAL}). With --corpus: what a new prefill "
        "caches, so that one prefill serves several drafters (with --data-only: "
        "prefill and stop).",
    )
    g.add_argument(
        "--top-k",
        type=int,
        default=C.DEFAULT_TOP_K,
        help=f"Size of the kept top of the target's laws (default: {C.DEFAULT_TOP_K}).",
    )
    g = p.add_argument_group("training")
    g.add_argument(
        "--steps",
        type=int,
        help=f"Optimizer steps (draft {D.DEFAULT_STEPS}, {H.per_kind(H.DEFAULT_STEPS)}).",
    )
    g.add_argument(
        "--batch-tokens",
        type=int,
        default=D.DEFAULT_BATCH_TOKENS,
        help=f"Draft: padded tokens per step (default: {D.DEFAULT_BATCH_TOKENS}).",
    )
    g.add_argument(
        "--lr",
        type=float,
        help=f"Peak learning rate (draft {D.DEFAULT_LR}, {H.per_kind(H.DEFAULT_LR)}).",
    )
    g.add_argument(
        "--draft-vocab",
        type=int,
        help=f"Tokens the drafter may propose (draft: {D.DEFAULT_DRAFT_VOCAB}; "
        f"heads: {H.DEFAULT_DRAFT_VOCAB}, 0 for the whole vocabulary).",
    )
    g.add_argument(
        "--layers",
        default=",".join(map(str, D.DEFAULT_LAYERS)),
        help="Target layers the draft starts from (comma-separated; negative from the end).",
    )
    g.add_argument(
        "--soft-weight",
        type=float,
        help="Draft: weight of the soft (teacher law) loss against the written "
        f"token's (default: {D.DEFAULT_SOFT_WEIGHT}; 0 with --labels written).",
    )
    g.add_argument(
        "--prompt-weight",
        type=float,
        default=D.DEFAULT_PROMPT_WEIGHT,
        help="Weight of positions whose next token is a prompt token (the "
        "target's laws there are kept too), relative to completion tokens; "
        f"0 skips them (default: {D.DEFAULT_PROMPT_WEIGHT}).",
    )
    g.add_argument(
        "--feature-weight",
        type=float,
        help="Weight of the regression of the drafter's hidden state on the "
        f"target's final one (draft: {D.DEFAULT_FEATURE_WEIGHT}; eagle: "
        f"{DEFAULT_EAGLE_FEATURE_WEIGHT}).",
    )
    g.add_argument(
        "--eval-every",
        type=int,
        default=D.DEFAULT_EVAL_EVERY,
        help=f"Steps between held-out evaluations and checkpoints "
        f"(default: {D.DEFAULT_EVAL_EVERY}).",
    )
    g.add_argument(
        "--init-from",
        metavar="DIR",
        help="Start from this trained drafter of the same kind and shape (a draft: "
        "the same --layers count, or more --layers that hold its layers in order, "
        "the new ones starting as identities; its shared vocabulary rows are kept).",
    )
    g.add_argument(
        "--grown-lr",
        type=float,
        help="Draft: peak learning rate of the layers that --layers adds to the "
        "--init-from draft; they start as identities, so they train at a "
        f"from-scratch rate (default: {D.DEFAULT_LR}).",
    )
    g.add_argument(
        "--rollout-steps",
        type=int,
        metavar="K",
        help="Draft: on a share of the steps (--rollout-share) the draft writes K "
        "tokens from its own law after random completion positions (about one in "
        "8), packed beside the batch's sequences; the target scores them in one "
        "forward, and the draft also trains on the positions that read its own "
        "tokens, as at inference (default: "
        f"{D.DEFAULT_ROLLOUT_STEPS}, teacher forcing only).",
    )
    g.add_argument(
        "--rollout-share",
        type=float,
        metavar="P",
        help="Draft: share of the steps that roll out, spread evenly (default: "
        f"{D.DEFAULT_ROLLOUT_SHARE}).",
    )
    g.add_argument(
        "--rollout-temp",
        type=float,
        metavar="T",
        help="Draft: temperature of the rollouts; 0 is greedy (default: "
        f"{D.DEFAULT_ROLLOUT_TEMP}).",
    )
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="Compute dtype of training (weights stay float32); auto: bfloat16 "
        "on Apple silicon, float32 on a CPU (default: auto).",
    )
    g.add_argument("--seed", type=int, default=0, help="Seed of data and order.")
    g.add_argument(
        "--no-compile", action="store_true", help="Do not mx.compile the step."
    )
    g = p.add_argument_group("evaluation")
    g.add_argument(
        "--eval-prompts",
        type=int,
        default=DEFAULT_EVAL_PROMPTS,
        help=f"Held-out chat prompts run through the engine (default: {DEFAULT_EVAL_PROMPTS}).",
    )
    g.add_argument(
        "--eval-max-tokens",
        type=int,
        default=DEFAULT_EVAL_TOKENS,
        help=f"Tokens generated per evaluation prompt (default: {DEFAULT_EVAL_TOKENS}).",
    )
    g.add_argument(
        "--eval-gammas",
        default=DEFAULT_EVAL_GAMMAS,
        help=f"Draft lengths measured (default: {DEFAULT_EVAL_GAMMAS}).",
    )
    g.add_argument("--skip-eval", action="store_true", help="No engine measurement.")
    p.add_argument("--no-progress", action="store_true", help="No progress bars.")
    H.add_head_arguments(p)  # the options of --kind eagle|eagle3|medusa it lacks
    return p


def int_list(text: str, name: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--{name} must be comma-separated integers, got '{text}'."
        ) from None


# Integer flags and their lowest value (the highest: what mlx indexes with).
INT_LOWEST = {
    "self_instruct": 0,
    "num_prompts": 1,
    "max_tokens": 1,
    "gen_batch": 1,
    "top_k": 1,
    "steps": 1,
    "batch_tokens": 1,
    "heldout_prompts": 1,
    "heldout_tokens": 1,
    "draft_vocab": 1,
    "eval_every": 1,  # 0 was a ZeroDivisionError at the first step
    "eval_prompts": 1,
    "eval_max_tokens": 1,
    "corpus_tokens": 1,
    "rollout_steps": 0,
    "batch_size": 1,
    "window": 8,
}
# Head flags with a small range of their own: (lowest, highest).
INT_RANGES = {"train_steps": (1, 8), "num_heads": (1, 8)}
# Float flags that must be finite and at least 0.
NON_NEGATIVE = ("sampled_temp", "prompt_weight", "feature_weight")


def check_numbers(args) -> None:
    """Every number flag in its range (``ValueError`` naming the flag)."""
    for name, lowest in INT_LOWEST.items():
        value = getattr(args, name, None)
        if name == "draft_vocab" and args.kind != "draft":
            lowest = 0  # a head's 0 keeps the whole vocabulary
        if value is not None:
            check_size(flag_name(name), value, lowest)
    for name, (lowest, highest) in INT_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not lowest <= value <= highest:
            raise OptionError(
                flag_name(name), value, f"an integer from {lowest} to {highest}"
            )
    for name in NON_NEGATIVE:
        value = getattr(args, name, None)
        if value is not None and not 0 <= value < math.inf:
            raise OptionError(flag_name(name), value, "a finite number >= 0")
    if not 0 <= args.seed <= MAX_SEED:
        raise OptionError("--seed", args.seed, "an integer from 0 to 2**64 - 1")
    # Measured after training: a bad γ was refused only then (2**70: a traceback).
    gammas = int_list(args.eval_gammas, "eval-gammas")
    if not gammas:
        raise ValueError("--eval-gammas is empty; pass draft lengths such as 1,2,4.")
    check_gammas(gammas, "--eval-gammas")


def check_args(args):
    check_numbers(args)
    if not 0 <= args.sampled_share <= 1:
        raise ValueError("--sampled-share must be between 0 and 1.")
    if args.soft_weight is not None and not 0 <= args.soft_weight <= 1:
        raise ValueError("--soft-weight must be between 0 and 1.")
    if args.feature_weight is not None and args.feature_weight < 0:
        raise ValueError("--feature-weight must be at least 0.")
    check_rollout_args(args)
    check_labels(args)
    if args.init_from and not Path(args.init_from).is_dir():
        raise ValueError(f"--init-from directory '{args.init_from}' does not exist.")
    if args.corpus:
        try:
            Corpus(args.corpus).existing_manifest()
        except ValueError as e:
            raise ValueError(f"--corpus {e}") from None
    if args.corpus_tokens is not None and not args.corpus:
        raise ValueError("--corpus-tokens needs --corpus.")
    if args.heldout_tokens is not None and not args.corpus:
        raise ValueError(
            "--heldout-tokens needs --corpus (without it, --heldout-prompts sets "
            "the held-out prompts)."
        )
    check_corpus_select(args)
    if args.prompts:  # read now: a bad line stops the run before the model loads
        load_prompt_file(args.prompts)
    for flag, lr in (("--lr", args.lr), ("--grown-lr", args.grown_lr)):
        if lr is not None and not 0 < lr < math.inf:
            raise ValueError(f"{flag}={lr} is out of range: a number > 0.")
    if Path(args.model).expanduser().is_dir():
        for flag, folder in (("--out", args.out), ("--data", args.data)):
            if folder is not None:
                check_outside(folder, args.model, flag=flag, what="the target model")
        if args.cache is not None:
            check_outside(
                args.cache, args.model, flag="--cache", what="the target model"
            )
    check_out_dir(args.out, force=args.force, ours=is_train_draft_folder)
    if args.data:  # completions of earlier runs are shared, a user's files are not
        check_out_dir(args.data, force=args.force, flag="--data", ours=is_data_folder)
    if args.cache:  # a folder of derived data, shared by runs
        check_out_dir(args.cache, force=True, flag="--cache")
    if args.init_from:
        check_init_from(args.init_from, args.kind)
    check_grown_lr(args)
    # Head options are checked before any model or data loads.
    if args.kind == "draft" and args.feature_layers is not None:
        raise ValueError(
            "--feature-layers is for --kind eagle; a draft model reads no target "
            "features (--keep-features chooses what the data keeps)."
        )
    if args.kind != "draft":
        H.head_config(args, args.kind)


def check_corpus_select(args):
    """``--corpus-select``: with --corpus; ``newest`` with a budget and a drafter to extend."""
    if args.corpus_select is None:
        return
    if not args.corpus:
        raise ValueError("--corpus-select needs --corpus.")
    if args.corpus_select == "newest" and args.corpus_tokens is None:
        raise ValueError(
            "--corpus-select newest needs --corpus-tokens N, the run's budget: shards "
            "not trained on yet first, then replayed ones up to N."
        )
    if args.corpus_select == "newest" and not args.init_from:
        raise ValueError(
            "--corpus-select newest needs --init-from DIR, the drafter whose learning "
            "curve says which shards it has trained on."
        )


def check_labels(args):
    """``--labels written``: a draft on a corpus, and no option that needs a
    forward of the target (its laws or features)."""
    if args.labels == "laws":
        return
    if not args.corpus:
        raise ValueError(
            "--labels written needs --corpus DIR (the completions train-draft writes "
            "itself come with the target's laws at no extra cost)."
        )
    if args.kind != "draft":
        raise ValueError(
            f"--labels written is for --kind draft; a {args.kind} head reads the "
            "target's features, which only its prefill gives (pass --labels laws)."
        )
    needs = (
        ("--soft-weight", args.soft_weight, "the target's laws"),
        ("--feature-weight", args.feature_weight, "the target's final hidden state"),
        (
            "--rollout-steps",
            args.rollout_steps,
            "the target's laws at the draft's tokens",
        ),
        ("--keep-features", args.keep_features, "a prefill of the target"),
    )
    for flag, value, what in needs:
        if value:  # None, 0 and 0.0 need nothing
            raise ValueError(
                f"{flag} {value} needs {what}, which --labels written does not compute "
                "(it trains on the written tokens alone); leave it out, or pass "
                "--labels laws."
            )


def check_rollout_args(args):
    """The rollout options: for --kind draft, in range, the share and temperature with K."""
    given = [
        name
        for name in ("rollout_steps", "rollout_share", "rollout_temp")
        if getattr(args, name) is not None
    ]
    if given and args.kind != "draft":
        flag = given[0].replace("_", "-")
        raise ValueError(f"--{flag} is for --kind draft (a head has its own unroll).")
    if args.rollout_share is not None and not 0 < args.rollout_share <= 1:
        raise ValueError(
            f"--rollout-share must be more than 0 and at most 1, got {args.rollout_share}."
        )
    if args.rollout_temp is not None and not args.rollout_temp >= 0:
        raise ValueError(
            f"--rollout-temp must be at least 0 (0: greedy), got {args.rollout_temp}."
        )
    if not args.rollout_steps and (
        args.rollout_share is not None or args.rollout_temp is not None
    ):
        raise ValueError(
            "--rollout-share and --rollout-temp need --rollout-steps K with K >= 1."
        )


def is_data_folder(data: Path) -> bool:
    """Whether ``data`` holds completions train-draft wrote (extended in place)."""
    return any(
        (data / name).is_file()
        for name in ("train.json", "heldout.json", SELECTION_FILE)
    )


def is_train_draft_folder(out: Path) -> bool:
    """Whether ``out`` holds a run of train-draft (resumed in place, not refused)."""
    from ..loading import drafter_dir_kind

    made = is_data_folder(out / "data")
    return made or checkpoint_dir(out) is not None or drafter_dir_kind(out) is not None


def check_init_from(path: str, kind: str):
    """``--init-from`` must be a drafter that train-draft wrote for ``kind``."""
    from ..drafters.heads import head_architecture, read_head_config

    config = read_head_config(path)
    got = head_architecture(config) if config else None
    if got != kind:
        what = f"the {got} drafter" if got else "no drafter written by train-draft"
        raise ValueError(
            f"--init-from {path} holds {what}; pass a directory that "
            f"`mlx_spec train-draft --kind {kind}` wrote."
        )


def check_grown_lr(args):
    """``--grown-lr`` only with a draft that ``--layers`` grows from its ``--init-from``
    draft (its other layers train at ``--lr``); else one-line ``ValueError``."""
    if args.grown_lr is None:
        return
    if not (args.kind == "draft" and args.init_from):
        raise ValueError(
            "--grown-lr is for the layers a draft adds to its --init-from draft; "
            "pass --kind draft --init-from DIR with more --layers, or leave it out."
        )
    from ..drafters.heads import read_head_config

    trained = read_head_config(args.init_from)["draft"]["init_layers"]
    layers = int_list(args.layers, "layers")
    if len(layers) <= len(trained):
        raise ValueError(
            f"--grown-lr is for the layers --layers adds to the --init-from draft, and "
            f"--layers {args.layers} adds none ({len(layers)} layers; that draft has "
            f"{len(trained)}); pass more --layers, or leave --grown-lr out."
        )


# Options that change only what the run shows, left out of the recorded command.
DISPLAY_OPTIONS = ("--no-progress",)


def command_line(argv: List[str]) -> str:
    """The reproducing command: the subcommand plus the options given."""
    kept = [a for a in argv if a not in DISPLAY_OPTIONS]
    return " ".join(["mlx_spec train-draft", *(shlex.quote(a) for a in kept)])


def _or(value, default):
    return default if value is None else value


def draft_reads_features(args) -> bool:
    """A draft needs the target's final state only to regress on it (``--feature-weight``)."""
    return _or(args.feature_weight, D.DEFAULT_FEATURE_WEIGHT) > 0


def draft_config(args, layers: List[int]) -> "D.DraftTrainConfig":
    """The draft's training options: the arguments, defaults where left unset."""
    return D.DraftTrainConfig(
        steps=_or(args.steps, D.DEFAULT_STEPS),
        batch_tokens=args.batch_tokens,
        lr=_or(args.lr, D.DEFAULT_LR),
        draft_vocab=_or(args.draft_vocab, D.DEFAULT_DRAFT_VOCAB),
        layers=layers,
        soft_weight=_or(args.soft_weight, default_soft_weight(args.labels)),
        prompt_weight=args.prompt_weight,
        feature_weight=_or(args.feature_weight, D.DEFAULT_FEATURE_WEIGHT),
        precision=args.precision,
        eval_every=args.eval_every,
        checkpoint_every=args.eval_every,
        seed=args.seed,
        compile=not args.no_compile,
        init_from=args.init_from or "",
        grown_lr=_or(args.grown_lr, D.DEFAULT_LR),
        rollout_steps=_or(args.rollout_steps, D.DEFAULT_ROLLOUT_STEPS),
        rollout_share=_or(args.rollout_share, D.DEFAULT_ROLLOUT_SHARE),
        rollout_temp=_or(args.rollout_temp, D.DEFAULT_ROLLOUT_TEMP),
        heldout_tokens=heldout_budget(args),
        labels=args.labels,
    )


def default_soft_weight(labels: str) -> float:
    """The soft loss's weight left unset: none without laws to learn from."""
    return 0.0 if labels == "written" else D.DEFAULT_SOFT_WEIGHT


# Training options that a resumed run takes from its checkpoint when the
# command line leaves them unset (the names of both the config and the option).
RESUMED_OPTIONS = (
    "steps",
    "lr",
    "batch_tokens",
    "draft_vocab",
    "layers",
    "soft_weight",
    "prompt_weight",
    "feature_weight",
    "precision",
    "eval_every",
    "seed",
    "batch_size",
    "window",
    "feature_layers",
    "train_steps",
    "num_heads",
    "init_from",
    "grown_lr",
    "rollout_steps",
    "rollout_share",
    "rollout_temp",
    "heldout_tokens",
)


def given_options(argv: List[str]) -> set:
    """The options ``argv`` names, as argument names (the rest keep defaults)."""
    parser = setup_arg_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def draft_layers(args, num_layers: int) -> List[int]:
    """``--layers`` as indices of the target's ``num_layers`` blocks (one-line errors)."""
    layers = [i + num_layers if i < 0 else i for i in int_list(args.layers, "layers")]
    if args.kind == "draft" and (
        not layers or not all(0 <= i < num_layers for i in layers)
    ):
        raise ValueError(
            f"draft layers {layers} must be indices of the target's {num_layers} "
            "layers (negative counts from the end)."
        )
    return layers


def check_resumed_option(
    flag: str, new, old, out: str, *, was: str, whose: str, fix: str
):
    """One-line ``ValueError`` when ``flag new`` differs from the ``old`` of the run
    checkpointed in ``out``; ``was`` names ``old``, ``whose`` says what hangs on it
    and ``fix`` what to pass instead."""
    if new != old:
        raise ValueError(
            f"{flag} {new} differs from the {was} of the run checkpointed in '{out}', "
            f"whose {whose}; pass {fix}, or choose a new --out."
        )


def check_heldout_tokens(args, saved: Dict, given: set):
    """A resumed run measures on its checkpoint's held-out set: a different
    ``--heldout-tokens`` given is refused (left out, the saved one is kept)."""
    old, new = saved.get("heldout_tokens"), heldout_budget(args)
    if "heldout_tokens" in given and None not in (old, new):
        check_resumed_option(
            "--heldout-tokens",
            new,
            old,
            args.out,
            was=str(old),
            whose="learning-curve points are measured on that held-out set",
            fix=f"--heldout-tokens {old} (or leave it out)",
        )


def check_resumed_labels(args, saved: Dict):
    """A resumed run keeps its checkpoint's labels (a run from before
    ``--labels`` learned from the laws): other labels are refused."""
    old = saved.get("labels", "laws")
    if args.kind == "draft":
        check_resumed_option(
            "--labels",
            args.labels,
            old,
            args.out,
            was=f"--labels {old}",
            whose="loss and learning-curve points are of those labels",
            fix=f"--labels {old}",
        )


def resume_options(args, argv: List[str], model) -> List[str]:
    """Set the training options of the run checkpointed in ``--out`` that ``argv`` leaves unset.

    So the same command resumes a run with its own options, even after the
    defaults changed. Only options whose saved value differs from what this
    command would use are set. Returns them as command-line words.
    """
    state = read_state(args.out)
    if state is None or state["config"].get("kind", "draft") != args.kind:
        return []  # nothing to resume, or another kind (refused when it loads)
    if args.kind == "draft":
        current = asdict(draft_config(args, draft_layers(args, len(model.layers))))
    else:
        blocks = len(feature_owner(model).layers)
        current = asdict(H.head_config(args, args.kind, blocks))
    saved, given, words = state["config"], given_options(argv), []
    check_heldout_tokens(args, saved, given)
    check_resumed_labels(args, saved)
    for name in RESUMED_OPTIONS:
        if name in given or name not in saved or saved[name] == current.get(name):
            continue
        value = saved[name]
        if name == "init_from" and not Path(value).is_dir():
            continue  # gone since; the checkpoint holds the weights anyway
        if name == "heldout_tokens" and (value is None or not args.corpus):
            continue  # a run without a corpus: its data differ anyway
        if name == "grown_lr" and not args.init_from:
            continue  # no layers to grow
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        setattr(args, name, text if isinstance(value, list) else value)
        # One word: a value such as "-1,5" would read as an option.
        words.append(f"--{name.replace('_', '-')}={text}")
    return words
