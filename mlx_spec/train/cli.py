"""``mlx_spec train-draft``: train a drafter for a target, with MLX, in one command.

Stages, each resumed where it stopped when the command is run again:

1. prompts: the built-in set (:mod:`.prompts`) or ``--prompts FILE``;
2. the target's completions of them, with its laws and features
   (:mod:`.completions`), in ``OUT/data`` or ``--data DIR``;
3. training (``--kind draft``: :mod:`.draft`; ``--kind eagle|medusa``:
   :mod:`.head_command` on the same completions), resumed from checkpoints;
4. ``--kind draft``: measurement with mlx-spec's engine and the model card
   (``OUT/README.md``).

Example::

    mlx_spec train-draft --model models/smollm2-135m-instruct --kind draft \\
        --out models/smollm2-135m-draft
"""

import argparse
import json
import os
import platform
import resource
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from ..features import FINAL, feature_owner
from ..options import one_line_errors
from ..outdir import check_out_dir, check_outside
from . import completions as C
from . import draft as D
from . import head_command as H
from .checkpoint import TrainingPaused, checkpoint_dir, read_state
from .eagle import DEFAULT_FEATURE_WEIGHT as DEFAULT_EAGLE_FEATURE_WEIGHT
from .precision import PRECISIONS
from .prompts import load_prompt_file, mixed_prompts, prompt_counts, split_of

KINDS = ("draft", "eagle", "medusa")
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
        help="With --corpus: use only its first shards, up to about N completion "
        "tokens (a point of the learning curve; default: all).",
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
        help="Make (or extend) the completions in OUT/data, then stop.",
    )
    g.add_argument(
        "--keep-features",
        metavar="LAYERS",
        help="Target features kept at every position of the data: comma-separated "
        f"block indices, {FINAL} = the final normed hidden state; a head whose "
        "--feature-layers are among them needs no second pass of the target, and "
        "the data grows by one hidden state per position for each one kept "
        "(default: what the data folder holds, else what this run reads: an EAGLE "
        f"head's --feature-layers, else {FINAL}).",
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
        help=f"Tokens the drafter may propose (draft: {D.DEFAULT_DRAFT_VOCAB}).",
    )
    g.add_argument(
        "--layers",
        default=",".join(map(str, D.DEFAULT_LAYERS)),
        help="Target layers the draft starts from (comma-separated; negative from the end).",
    )
    g.add_argument(
        "--soft-weight",
        type=float,
        default=D.DEFAULT_SOFT_WEIGHT,
        help="Draft: weight of the soft (teacher law) loss against the written "
        f"token's (default: {D.DEFAULT_SOFT_WEIGHT}).",
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
        "the same --layers count; its shared vocabulary rows are kept).",
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
    H.add_head_arguments(p)  # the options of --kind eagle|medusa it lacks
    return p


def _log(message: str):
    print(f"[train-draft] {message}", file=sys.stderr, flush=True)


def _ints(text: str, name: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--{name} must be comma-separated integers, got '{text}'."
        ) from None


def _check_args(args):
    for name in (
        "num_prompts",
        "max_tokens",
        "gen_batch",
        "top_k",
        "steps",
        "batch_tokens",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1.")
    if not 0 <= args.sampled_share <= 1:
        raise ValueError("--sampled-share must be between 0 and 1.")
    if not 0 <= args.soft_weight <= 1:
        raise ValueError("--soft-weight must be between 0 and 1.")
    if args.prompt_weight < 0:
        raise ValueError("--prompt-weight must be at least 0.")
    if args.feature_weight is not None and args.feature_weight < 0:
        raise ValueError("--feature-weight must be at least 0.")
    if args.self_instruct < 0:
        raise ValueError("--self-instruct must be at least 0.")
    if args.init_from and not Path(args.init_from).is_dir():
        raise ValueError(f"--init-from directory '{args.init_from}' does not exist.")
    if args.corpus and not (Path(args.corpus) / "corpus.json").is_file():
        raise ValueError(
            f"--corpus '{args.corpus}' holds no corpus (no corpus.json); grow one "
            "with mlx_spec corpus grow."
        )
    if args.corpus_tokens is not None and not args.corpus:
        raise ValueError("--corpus-tokens needs --corpus.")
    if args.corpus_tokens is not None and args.corpus_tokens < 1:
        raise ValueError("--corpus-tokens must be at least 1.")
    if args.prompts and not Path(args.prompts).is_file():
        raise ValueError(f"--prompts file '{args.prompts}' does not exist.")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr={args.lr} is out of range: a number > 0.")
    if Path(args.model).expanduser().is_dir():
        check_outside(args.out, args.model, flag="--out", what="the target model")
    check_out_dir(args.out, force=args.force, ours=is_train_draft_folder)
    if args.init_from:
        check_init_from(args.init_from, args.kind)
    # Head options are checked before any model or data loads.
    if args.kind == "draft" and args.feature_layers is not None:
        raise ValueError(
            "--feature-layers is for --kind eagle; a draft model reads no target "
            "features (--keep-features chooses what the data keeps)."
        )
    if args.kind != "draft":
        H.head_config(args, args.kind)


def is_train_draft_folder(out: Path) -> bool:
    """Whether ``out`` holds a run of train-draft (resumed in place, not refused)."""
    from ..loading import drafter_dir_kind

    data = out / "data"
    made = any((data / name).is_file() for name in ("train.json", "heldout.json"))
    return made or checkpoint_dir(out) is not None or drafter_dir_kind(out) is not None


def check_init_from(path: str, kind: str):
    """``--init-from`` must be a drafter that train-draft wrote for ``kind``."""
    from ..drafters.heads import HEAD_KEY, read_head_config

    config = read_head_config(path)
    got = config[HEAD_KEY].get("kind") if config else None
    if got != kind:
        what = f"the {got} drafter" if got else "no drafter written by train-draft"
        raise ValueError(
            f"--init-from {path} holds {what}; pass a directory that "
            f"`mlx_spec train-draft --kind {kind}` wrote."
        )


def kept_feature_layers(args, model, data_dir: Path) -> List[int]:
    """The features the data keeps: ``--keep-features``, else the folder's, else the run's.

    A new folder keeps what this run reads (:func:`read_feature_layers`), so
    its head needs no teacher-forced pass; a folder already made keeps its
    own, which the completions it adds must match.
    """
    from ..features import check_feature_layers

    if args.keep_features:
        layers = _ints(args.keep_features, "keep-features")
    else:
        layers = _saved_feature_layers(data_dir) or read_feature_layers(args, model)
    return list(check_feature_layers(model, layers))


def _saved_feature_layers(data_dir: Path) -> List[int]:
    """The features a data folder keeps, from its manifests (none if it has none)."""
    for name in ("train.json", "heldout.json"):  # held-out data is made first
        manifest = data_dir / name
        if manifest.exists():
            saved = json.loads(manifest.read_text(encoding="utf-8"))
            return list(saved.get("feature_layers") or [])
    return []


def read_feature_layers(args, model) -> List[int]:
    """The target features this run's drafter reads: a head's, else the final state."""
    if args.kind == "draft":
        return [FINAL]
    return H.head_feature_layers(args, args.kind, len(feature_owner(model).layers))


def choose_prompts(args):
    """Training and held-out prompts (built-in, or a file split by a hash of each text)."""
    if args.prompts:
        rows = load_prompt_file(args.prompts)
        train = [p for p in rows if split_of(p.text) == "train"]
        heldout = [p for p in rows if split_of(p.text) == "heldout"]
        if not heldout and len(train) > 1:
            heldout = train[-1:]
            train = train[:-1]
        return train[: args.num_prompts], heldout[: args.heldout_prompts]
    train = mixed_prompts(args.num_prompts, "train", seed=args.seed)
    heldout = mixed_prompts(args.heldout_prompts, "heldout", seed=args.seed)
    return train, heldout


def _cpu_share(wall: float, cpu: float) -> str:
    cores = os.cpu_count() or 1
    return f"{cpu / max(wall, 1e-9) / cores:.0%} of {cores} cores"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# Options that change only what the run shows, left out of the recorded command.
DISPLAY_OPTIONS = ("--no-progress",)


def command_line(argv: List[str]) -> str:
    """The reproducing command: the subcommand plus the options given."""
    kept = [a for a in argv if a not in DISPLAY_OPTIONS]
    return " ".join(["mlx_spec train-draft", *(shlex.quote(a) for a in kept)])


def _or(value, default):
    return default if value is None else value


def draft_config(args, layers: List[int]) -> "D.DraftTrainConfig":
    """The draft's training options: the arguments, defaults where left unset."""
    return D.DraftTrainConfig(
        steps=_or(args.steps, D.DEFAULT_STEPS),
        batch_tokens=args.batch_tokens,
        lr=_or(args.lr, D.DEFAULT_LR),
        draft_vocab=_or(args.draft_vocab, D.DEFAULT_DRAFT_VOCAB),
        layers=layers,
        soft_weight=args.soft_weight,
        prompt_weight=args.prompt_weight,
        feature_weight=_or(args.feature_weight, D.DEFAULT_FEATURE_WEIGHT),
        precision=args.precision,
        eval_every=args.eval_every,
        checkpoint_every=args.eval_every,
        seed=args.seed,
        compile=not args.no_compile,
        init_from=args.init_from or "",
    )


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
)


def given_options(argv: List[str]) -> set:
    """The options ``argv`` names, as argument names (the rest keep defaults)."""
    parser = setup_arg_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def draft_layers(args, num_layers: int) -> List[int]:
    """``--layers`` as indices of the target's ``num_layers`` blocks (one-line errors)."""
    layers = [i + num_layers if i < 0 else i for i in _ints(args.layers, "layers")]
    if args.kind == "draft" and (
        not layers or not all(0 <= i < num_layers for i in layers)
    ):
        raise ValueError(
            f"draft layers {layers} must be indices of the target's {num_layers} "
            "layers (negative counts from the end)."
        )
    return layers


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
    for name in RESUMED_OPTIONS:
        if name in given or name not in saved or saved[name] == current.get(name):
            continue
        value = saved[name]
        if name == "init_from" and not Path(value).is_dir():
            continue  # gone since; the checkpoint holds the weights anyway
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        setattr(args, name, text if isinstance(value, list) else value)
        # One word: a value such as "-1,5" would read as an option.
        words.append(f"--{name.replace('_', '-')}={text}")
    return words


def corpus_stage(args, model, out: Path):
    """Training data from a corpus (see :mod:`.corpus_data`).

    Returns:
        ``(train, heldout, data record, held-out prompt ids for the engine)``.
    """
    from .corpus import Corpus
    from .corpus_data import corpus_completions

    corpus = Corpus(args.corpus)
    if args.kind == "draft":
        layers = [FINAL]
    else:
        layers = H.head_feature_layers(
            args, args.kind, len(feature_owner(model).layers)
        )
    options = dict(feature_layers=layers, top_k=args.top_k, cache=args.cache, log=_log)
    train = corpus_completions(
        model, corpus, "train", max_tokens=args.corpus_tokens, **options
    )
    heldout = corpus_completions(model, corpus, "heldout", **options)
    if not len(train) or not len(heldout):
        raise ValueError(
            f"the corpus in '{args.corpus}' has {len(train)} training and "
            f"{len(heldout)} held-out sequences; grow it until it has both."
        )
    _log(
        f"corpus: {len(train)} train ({train.completion_tokens} tokens), "
        f"{len(heldout)} held out ({heldout.completion_tokens} tokens)"
    )
    record = {
        "corpus": Path(args.corpus).name,
        "train_prompts": len(train),
        "train_sets": _counts(train.prompt_sets),
        "train_prompt_tokens": train.prompt_tokens,
        "train_completion_tokens": train.completion_tokens,
        "heldout_prompts": len(heldout),
        "heldout_completion_tokens": heldout.completion_tokens,
        "top_k": args.top_k,
        "learning_curve": prior_curve(args, out),
    }
    chat = [
        t[:s].tolist()
        for t, s, p in zip(heldout.tokens, heldout.starts, heldout.prompt_sets)
        if p in ("chat", "long", "self")
    ] or [t[:s].tolist() for t, s in zip(heldout.tokens, heldout.starts)]
    return train, heldout, record, chat


def _counts(names) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


def prior_curve(args, out: Path) -> List[Dict]:
    """The learning curve so far: that of ``--init-from``, else of ``--out``'s drafter."""
    for folder in (args.init_from, out):
        path = Path(folder) / "config.json" if folder else None
        if path is not None and path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            return list(config.get("data", {}).get("learning_curve", []))
    return []


def learning_point(kind: str, record: Dict, last_eval: Dict, steps: int) -> Dict:
    """One point of the learning curve: corpus tokens trained on, held-out acceptance."""
    point = {
        "corpus_tokens": record["train_completion_tokens"],
        "heldout_tokens": record["heldout_completion_tokens"],
        "steps": steps,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    names = {
        "draft": ("alpha", "best_tokens_per_forward", "best_gamma"),
        "eagle": ("accept_by_depth", "conditional_by_depth", "tokens_per_round"),
        "medusa": ("tree_tokens_per_round",),
    }[kind]
    point.update({n: last_eval[n] for n in names if n in last_eval})
    return point


def add_learning_point(out: Path, point: Dict):
    """Append ``point`` to the learning curve in ``OUT/config.json``."""
    from ..drafters.heads import CONFIG_FILE

    path = out / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    data = config.setdefault("data", {})
    data["learning_curve"] = list(data.get("learning_curve", [])) + [point]
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def completions_stage(args, model, tokenizer, data_dir: Path, timing: Dict):
    """Stages 1-2: prompts and the target's completions (with laws and features).

    Returns:
        ``(train, heldout, data record, held-out prompt ids for the engine)``.
    """
    from ..fingerprint import model_fingerprint

    progress = not args.no_progress
    train_prompts, heldout_prompts = choose_prompts(args)
    if args.self_instruct:
        from .self_instruct import self_instruct_prompts

        # After the other prompts, so their completions already made are kept.
        own_train, own_heldout = self_instruct_prompts(
            model,
            tokenizer,
            args.self_instruct,
            data_dir / "self-instruct.jsonl",
            seed=args.seed,
            progress=progress,
            log=_log,
        )
        train_prompts += own_train
        heldout_prompts += own_heldout
    if not train_prompts or not heldout_prompts:
        raise ValueError("need at least one training and one held-out prompt.")
    _log(
        f"prompts: train {prompt_counts(train_prompts)}, held out {prompt_counts(heldout_prompts)}"
    )

    # Stage 2: the target's completions (resumed shard by shard).
    tic, cpu = time.perf_counter(), _cpu_seconds()
    common = dict(
        sampled_share=args.sampled_share,
        sampled_temp=args.sampled_temp,
        max_tokens=args.max_tokens,
        top_k=args.top_k,
        batch_size=args.gen_batch,
        seed=args.seed,
        target=model_fingerprint(model),
        features=args.kind != "draft" or bool(args.feature_weight),
        feature_layers=kept_feature_layers(args, model, data_dir),
        progress=progress,
        log=_log,
    )
    # The held-out set is small: made first, so a partial run can be measured.
    heldout = C.build_completions(
        model,
        tokenizer,
        heldout_prompts,
        data_dir,
        "heldout",
        **{**common, "sampled_share": 0.0},
    )
    train = C.build_completions(
        model, tokenizer, train_prompts, data_dir, "train", **common
    )
    timing["data"] = _stage(tic, cpu)
    _log(
        f"completions: {len(train)} train ({train.completion_tokens} tokens), "
        f"{len(heldout)} held out ({heldout.completion_tokens} tokens)"
    )
    data_record = {
        "train_prompts": len(train),
        "train_sets": prompt_counts(train_prompts),
        "train_prompt_tokens": train.prompt_tokens,
        "train_completion_tokens": train.completion_tokens,
        "generation_minutes": round((train.seconds + heldout.seconds) / 60, 1),
        "heldout_prompts": len(heldout),
        "heldout_completion_tokens": heldout.completion_tokens,
        "sampled_share": args.sampled_share,
        "sampled_temp": args.sampled_temp,
        "max_tokens": args.max_tokens,
        "top_k": args.top_k,
        "prompt_file": os.path.basename(args.prompts) if args.prompts else None,
        "self_instruct": args.self_instruct,
    }
    return train, heldout, data_record, eval_prompt_ids(tokenizer, heldout_prompts)


def run(args, argv: List[str]) -> int:
    _check_args(args)
    _ints(args.layers, "layers")  # fails before the target loads
    import mlx.core as mx  # noqa: F401  (after mlx_spec set up BLAS)

    from ..loading import load_model

    model, tokenizer = load_model(args.model, "model")
    out = Path(args.out)
    restored = resume_options(args, argv, model)
    if restored:
        argv = [*argv, *restored]  # the card's command reproduces the run
        _log(f"options of the checkpoint in {out} kept: {' '.join(restored)}")
    layers = draft_layers(args, len(model.layers))
    data_dir = Path(args.data) if args.data else out / "data"
    progress = not args.no_progress
    timing: Dict[str, Dict] = {}
    if args.corpus:
        train, heldout, data_record, eval_ids = corpus_stage(args, model, out)
    else:
        train, heldout, data_record, eval_ids = completions_stage(
            args, model, tokenizer, data_dir, timing
        )
    if args.data_only:
        return 0
    if args.kind != "draft":
        info = {**data_record, "model": args.model}
        trainer = H.run_head_training(
            args,
            args.kind,
            model,
            train,
            heldout,
            command=command_line(argv),
            data_info=info,
            log=_log,
        )
        if args.corpus and trainer.evals:
            point = learning_point(
                args.kind, data_record, trainer.evals[-1], trainer.step
            )
            add_learning_point(out, point)
            H.write_card(out, command_line(argv))
        return 0

    # Stage 3: training (resumed from the last checkpoint).
    config = draft_config(args, layers)
    if config.feature_weight > 0:  # the draft regresses on the final hidden state
        train, heldout = (part.with_features([FINAL]) for part in (train, heldout))
        if train is None or heldout is None:
            raise ValueError(
                f"--feature-weight needs the final hidden state ({FINAL}) among the "
                f"data's kept features; pass --keep-features with {FINAL} in it."
            )
    earlier_timing = saved_timing(out)  # the config is rewritten by training
    tic, cpu = time.perf_counter(), _cpu_seconds()
    extra = {
        "name": out.name,
        "target_path": args.model,
        "data": data_record,
        "command": command_line(argv),
    }
    trainer = D.train_draft(
        model,
        tokenizer,
        train,
        heldout,
        config,
        out,
        progress=progress,
        log=_log,
        extra=extra,
    )
    if trainer.step > trainer.start_step:
        timing["train"] = _stage(tic, cpu)
    elif "train" in earlier_timing:  # nothing left to train: keep the run that did
        timing["train"] = earlier_timing["train"]

    # Stage 4: measurement with the engine, then the card.
    evaluation = None
    if not args.skip_eval:
        tic, cpu = time.perf_counter(), _cpu_seconds()
        evaluation = measure(args, model, tokenizer, out, eval_ids)
        timing["eval"] = _stage(tic, cpu)
    last = trainer.evals[-1] if trainer.evals else {}
    if args.corpus and last:
        add_learning_point(
            out, learning_point("draft", data_record, last, trainer.step)
        )
    write_card(out, extra, evaluation, timing)
    _log(
        f"done: {out} (held-out α {last.get('alpha')}, best tokens/forward "
        f"{last.get('best_tokens_per_forward')} at γ {last.get('best_gamma')})"
    )
    return 0


def _stage(tic: float, cpu: float) -> Dict:
    wall = time.perf_counter() - tic
    used = _cpu_seconds() - cpu
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(used, 1),
        "share": _cpu_share(wall, used),
    }


def eval_prompt_ids(tokenizer, heldout_prompts) -> List[List[int]]:
    """Token ids of the held-out chat prompts (all held-out prompts if none is chat)."""
    chat = [p for p in heldout_prompts if p.prompt_set == "chat"] or list(
        heldout_prompts
    )
    return [C.encode_prompt(tokenizer, p) for p in chat]


def measure(args, model, tokenizer, out: Path, eval_ids: List[List[int]]) -> Dict:
    """Acceptance, speed ratio and end-to-end speed-up with the engine (held-out chat)."""
    from ..drafters.distilled import load_draft
    from .evaluate import end_to_end, engine_acceptance, step_time_ratio

    draft = load_draft(out, model)
    ids = eval_ids[: args.eval_prompts]
    gammas = _ints(args.eval_gammas, "eval-gammas")
    _log(f"measuring with the engine on {len(ids)} held-out chat prompts")
    greedy = engine_acceptance(
        model, tokenizer, draft, ids, gammas, max_tokens=args.eval_max_tokens
    )
    best = max(greedy, key=lambda r: r["tokens_per_forward"])
    sampled = engine_acceptance(
        model,
        tokenizer,
        draft,
        ids,
        [best["gamma"]],
        max_tokens=args.eval_max_tokens,
        temp=0.7,
    )
    ratio = step_time_ratio(model, draft)
    e2e = end_to_end(
        model,
        tokenizer,
        draft,
        ids,
        gamma=best["gamma"],
        max_tokens=args.eval_max_tokens,
    )
    return {
        "prompts": len(ids),
        "max_tokens": args.eval_max_tokens,
        "greedy": greedy,
        "sampled": sampled,
        "step_ratio": ratio,
        "end_to_end": e2e,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
    }


def saved_timing(out: Path) -> Dict:
    """The stage times recorded by an earlier run in ``out`` (empty if none)."""
    from ..drafters.heads import CONFIG_FILE

    try:
        config = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    timing = config.get("timing", {})
    return {name: t for name, t in timing.items() if name != "summary"}


def write_card(out: Path, extra: Dict, evaluation: Optional[Dict], timing: Dict):
    """Add the evaluation and timing to ``config.json`` and write ``README.md``."""
    from ..drafters.heads import CONFIG_FILE
    from .card import model_card

    path = out / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    stages = ", ".join(
        f"{name} {t['wall_s'] / 60:.1f} min ({t['share']})"
        for name, t in timing.items()
    )
    config["timing"] = {**timing, "summary": stages or "-"}
    if evaluation is not None:
        config["evaluation"] = evaluation
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    text = model_card(config, extra["command"], evaluation)
    (out / "README.md").write_text(text, encoding="utf-8")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``mlx_spec train-draft`` and ``python -m mlx_spec.train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = setup_arg_parser().parse_args(argv)
    try:
        return run(args, argv)
    except ValueError as e:  # bad options
        print(f"mlx_spec train-draft: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # an unusable path, a full disk
        sys.exit(f"mlx_spec train-draft: error: {e}")
    except TrainingPaused as paused:
        sys.exit(
            f"mlx_spec train-draft: paused after step {paused.step} (checkpoint in "
            f"{paused.path}); run the same command again to go on."
        )
    except KeyboardInterrupt:
        sys.exit(
            "mlx_spec train-draft: interrupted; run the same command again to resume."
        )
