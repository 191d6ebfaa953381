"""``mlx_spec train-draft --kind eagle|eagle3|medusa``: options and the run of a head training.

The run, given the target and self-distilled sequences (prompt + the
target's own completion, token ids):

1. teacher data: the features and top-K next-token laws the completions
   kept while they were written, or, for other feature layers, one
   teacher-forced pass of the target, cached by chunk in ``OUT/data`` so a
   resumed run skips what it has;
2. training (:func:`mlx_spec.train.heads.train_head`) with a progress bar,
   held-out acceptance and checkpoints in ``OUT/checkpoints``;
3. the head directory ``OUT`` (``config.json`` + ``head.safetensors``),
   which ``--draft-model OUT`` loads as the right kind of drafter, and a
   model card ``OUT/README.md`` (:func:`mlx_spec.train.card.head_card`).

An EAGLE head reads EAGLE-3's low, middle and high blocks of the target
unless ``--feature-layers`` says otherwise (:func:`eagle3_blocks`); a Medusa
head reads the final hidden state. ``--kind eagle3`` trains a head in
EAGLE-3's architecture on the same data (it drafts as an ``eagle`` head and
``mlx_spec export`` writes it in speculators' format for vLLM and SGLang).
"""

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np

from ..features import FINAL, eagle3_blocks, feature_owner
from . import eagle as eagle_train
from .card import head_card
from .corpus_data import heldout_budget
from .head_data import HeadData, from_completions, teacher_data
from .heads import (
    DEFAULT_DRAFT_VOCAB,
    DEFAULT_EVAL_EVERY,
    DEFAULT_HELDOUT,
    HeadTrainConfig,
    train_head,
)

HEAD_KINDS = ("eagle", "eagle3", "medusa")
EAGLE_KINDS = ("eagle", "eagle3")
TEACHER_DIR = "data"
TEACHER_CHUNK = 64
# The recipes of the shipped heads: each trains in under 90 minutes on a
# 2-core CPU (float32), about 2 hours with the default data. eagle3 takes
# eagle's until a measured recipe replaces it.
DEFAULT_STEPS = {"eagle": 1600, "eagle3": 1600, "medusa": 600}
DEFAULT_LR = {"eagle": 1e-3, "eagle3": 1e-3, "medusa": 2e-3}
DEFAULT_WINDOWS = {"eagle": 6, "eagle3": 6, "medusa": 8}  # per step
DEFAULT_WINDOW_TOKENS = {"eagle": 160, "eagle3": 160, "medusa": 192}


def add_head_arguments(parser: argparse.ArgumentParser):
    """Add the options of head kinds (``--kind eagle|eagle3|medusa``) that ``parser`` lacks."""
    existing = {a.dest for a in parser._actions}
    group = parser.add_argument_group("draft heads (--kind eagle|eagle3|medusa)")

    def add(flag, **kwargs):
        if flag.lstrip("-").replace("-", "_") not in existing:
            group.add_argument(flag, **kwargs)

    add(
        "--draft-vocab",
        type=int,
        default=DEFAULT_DRAFT_VOCAB,
        help="Heads propose only the N tokens the target writes most often "
        f"(a smaller output layer); 0 = the whole vocabulary (default: {DEFAULT_DRAFT_VOCAB}).",
    )
    add(
        "--window",
        type=int,
        help="Heads: tokens per training window (default: "
        + per_kind(DEFAULT_WINDOW_TOKENS)
        + ").",
    )
    add(
        "--batch-size",
        type=int,
        help=f"Heads: windows per step (default: {per_kind(DEFAULT_WINDOWS)}).",
    )
    add(
        "--eval-every",
        type=int,
        default=DEFAULT_EVAL_EVERY,
        help=f"Steps between held-out evaluations (default: {DEFAULT_EVAL_EVERY}).",
    )
    add(
        "--feature-layers",
        help="EAGLE: target features read, comma-separated block indices, "
        f"{FINAL} = the final normed hidden state (not for eagle3) (default: "
        "EAGLE-3's low, middle "
        "and high blocks, 2, L // 2 and L - 3 of a target with L blocks, e.g. "
        "2,15,27 of 30; moved inward on targets under 8 blocks).",
    )
    add(
        "--train-steps",
        type=int,
        default=3,
        help="EAGLE: draft steps unrolled in training, EAGLE-3's training-time "
        "test (default: 3).",
    )
    add(
        "--num-heads",
        type=int,
        default=4,
        help="Medusa: heads, i.e. tokens predicted ahead (default: 4).",
    )
    return group


def per_kind(values: dict) -> str:
    return ", ".join(f"{kind} {value}" for kind, value in values.items())


def _int_list(text: str, name: str) -> List[int]:
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--{name} must be comma-separated integers, got {text!r}."
        ) from None


def _arg(args, name: str, default):
    value = getattr(args, name, None)
    return default if value is None else value


def head_feature_layers(args, kind: str, num_layers: Optional[int]) -> List[int]:
    """The target features a head of ``kind`` reads (one-line errors).

    EAGLE: ``--feature-layers``, else :func:`eagle3_blocks` of the target's
    ``num_layers`` blocks. Medusa: the final hidden state, the only feature
    its drafter reads.
    """
    text = _arg(args, "feature_layers", None)
    layers = None if text is None else _int_list(text, "feature-layers")
    if kind == "medusa":
        if layers not in (None, [FINAL]):
            raise ValueError(
                f"--feature-layers is for --kind eagle; Medusa heads read the final "
                f"hidden state ({FINAL})."
            )
        return [FINAL]
    if kind == "eagle3" and layers is not None and FINAL in layers:
        raise ValueError(
            f"--kind eagle3 fuses target blocks: pass --feature-layers without "
            f"{FINAL} (the final normed state), e.g. the default low, middle and "
            "high blocks."
        )
    if layers is not None:
        return layers
    if num_layers is None:
        raise ValueError(
            "EAGLE's default --feature-layers need the target's block count."
        )
    return eagle3_blocks(num_layers)


def head_config(args, kind: str, num_layers: Optional[int] = None) -> HeadTrainConfig:
    """A :class:`HeadTrainConfig` from parsed arguments (one-line errors).

    ``--steps``, ``--lr``, ``--batch-size`` and ``--window`` left unset
    (``None``) take the kind's defaults (the shipped heads' recipes);
    ``--feature-layers`` left unset takes :func:`head_feature_layers`' default
    for a target of ``num_layers`` blocks (left empty without ``num_layers``,
    which checks the options before the target loads).
    """
    if (
        num_layers is None
        and kind in EAGLE_KINDS
        and _arg(args, "feature_layers", None) is None
    ):
        layers = []  # EAGLE-3's blocks, once the target's block count is known
    else:
        layers = head_feature_layers(args, kind, num_layers)
    config = HeadTrainConfig(
        kind=kind,
        steps=int(_arg(args, "steps", DEFAULT_STEPS[kind])),
        batch_size=int(_arg(args, "batch_size", DEFAULT_WINDOWS[kind])),
        window=int(_arg(args, "window", DEFAULT_WINDOW_TOKENS[kind])),
        lr=float(_arg(args, "lr", DEFAULT_LR[kind])),
        draft_vocab=int(_arg(args, "draft_vocab", DEFAULT_DRAFT_VOCAB)),
        heldout=int(_arg(args, "heldout", DEFAULT_HELDOUT)),
        eval_every=int(_arg(args, "eval_every", DEFAULT_EVAL_EVERY)),
        checkpoint_every=int(_arg(args, "eval_every", DEFAULT_EVAL_EVERY)),
        seed=int(_arg(args, "seed", 0)),
        feature_layers=layers,
        train_steps=int(_arg(args, "train_steps", 3)),
        prompt_weight=float(_arg(args, "prompt_weight", 0.0)),
        precision=str(_arg(args, "precision", "auto")),
        feature_weight=float(
            _arg(args, "feature_weight", eagle_train.DEFAULT_FEATURE_WEIGHT)
        ),
        num_heads=int(_arg(args, "num_heads", 4)),
        init_from=_arg(args, "init_from", "") or "",
        heldout_tokens=heldout_budget(args),
    )
    return config


def _digest(sequences, starts, layers) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(list(layers)).encode())
    for seq, start in zip(sequences, starts):
        digest.update(np.asarray(seq, np.int32).tobytes())
        digest.update(str(start).encode())
    return digest.hexdigest()[:20]


def cached_teacher_data(
    model,
    sequences,
    starts,
    out_dir,
    feature_layers: Sequence[int],
    log: Optional[Callable[[str], None]] = None,
    laws: Optional[tuple] = None,
    chunk: Optional[int] = None,
) -> HeadData:
    """Teacher data for ``sequences``, kept in ``OUT/data/teacher-*.npz`` by chunk.

    Each chunk of ``chunk`` sequences is computed once (named by a hash of
    its sequences), so a resumed run, or one with more sequences appended,
    only runs the target over what is new. ``laws`` are the target's laws
    at every position when already known (see
    :func:`mlx_spec.train.head_data.teacher_data`).
    """
    chunk = chunk or TEACHER_CHUNK
    folder = Path(out_dir) / TEACHER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    parts, todo = [], []
    for i in range(0, len(sequences), chunk):
        key = _digest(sequences[i : i + chunk], starts[i : i + chunk], feature_layers)
        path = folder / f"teacher-{key}.npz"
        parts.append(path)
        if not path.exists():
            todo.append((i, path))
    if todo:
        from tqdm import tqdm

        total = sum(len(s) for i, _ in todo for s in sequences[i : i + chunk])
        tic = time.perf_counter()
        with tqdm(total=total, desc="teacher pass", unit="tok") as bar:
            for i, path in todo:
                part_laws = None
                if laws is not None:
                    part_laws = (laws[0][i : i + chunk], laws[1][i : i + chunk])
                data = teacher_data(
                    model,
                    sequences[i : i + chunk],
                    starts[i : i + chunk],
                    feature_layers=feature_layers,
                    progress=bar.update,
                    laws=part_laws,
                )
                tmp = path.with_suffix(".tmp.npz")
                data.save(tmp)
                tmp.replace(path)
        if log:
            log(f"teacher pass: {total} tokens in {time.perf_counter() - tic:.0f} s")
    elif log:
        log(f"teacher data: reusing {len(parts)} chunks in {folder}")
    data = HeadData([], [], [], [], [])
    for path in parts:
        part = HeadData.load(path)
        for name in ("tokens", "starts", "features", "teacher_ids", "teacher_logp"):
            getattr(data, name).extend(getattr(part, name))
    return data


def run_head_training(
    args,
    kind: str,
    model,
    train,
    heldout,
    *,
    command: str = "",
    data_info: Optional[dict] = None,
    log: Callable[[str], None] = print,
):
    """Train a head of ``kind`` for ``model`` on self-distilled sequences.

    Args:
        args: Parsed ``train-draft`` arguments (see :func:`add_head_arguments`).
        kind: ``"eagle"``, ``"eagle3"`` or ``"medusa"``.
        model: The target.
        train, heldout: Training and held-out sequences: objects with
          ``tokens`` (token ids of each) and ``starts`` (first completion
          token of each), e.g. :class:`mlx_spec.train.completions.Completions`,
          whose features are used as they are when they include the head's
          feature layers (otherwise one teacher-forced pass makes them).
        command: The reproducing command, for the card.
        data_info: What the data is, for the card and config.
        log: Where progress lines go.
    """
    config = head_config(args, kind, len(feature_owner(model).layers))
    out = Path(args.out)
    heldout_index = list(
        range(len(train.tokens), len(train.tokens) + len(heldout.tokens))
    )
    data = HeadData([], [], [], [], [])
    for part in (
        train,
        heldout,
    ):  # chunked apart: more training data keeps held-out chunks
        kept = None
        if hasattr(part, "with_features"):  # completions that kept features
            kept = part.with_features(config.feature_layers)
        if kept is not None:
            got = from_completions(kept)
        else:
            laws = None
            if hasattr(part, "law_ids"):
                laws = (list(part.law_ids), list(part.law_logp))
            seqs = [np.asarray(t, np.int32).tolist() for t in part.tokens]
            got = cached_teacher_data(
                model, seqs, list(part.starts), out, config.feature_layers, log, laws
            )
        for name in ("tokens", "starts", "features", "teacher_ids", "teacher_logp"):
            getattr(data, name).extend(getattr(got, name))
    log(
        f"{kind}: {len(data)} sequences, {data.num_tokens} tokens; "
        f"{config.steps} steps of {config.batch_size} x {config.window} tokens"
    )
    extra = {"command": command, "data": data_info or {}}
    if config.init_from:
        extra["origin"] = warm_start_origin(config.init_from)
    trainer = train_head(
        model,
        data,
        config,
        out,
        resume=getattr(args, "resume", True),
        progress=not getattr(args, "no_progress", False),
        log=log,
        extra=extra,
        heldout_index=heldout_index or None,
    )
    write_card(out, command)
    log(f"wrote the {kind} head to {out} (use it with --draft-model {out})")
    return trainer


def warm_start_origin(init_from) -> dict:
    """The run a chain of warm starts began with: its recipe and command."""
    from ..drafters.heads import read_head_config

    config = read_head_config(init_from) or {}
    return config.get("origin") or {
        "recipe": config.get("training", {}).get("config", {}),
        "command": config.get("command", ""),
    }


def write_card(out, command: str):
    """Write ``OUT/README.md`` from the head's ``config.json`` (see :func:`head_card`)."""
    from ..drafters.heads import read_head_config

    card = head_card(read_head_config(out), command)
    (Path(out) / "README.md").write_text(card, encoding="utf-8")
