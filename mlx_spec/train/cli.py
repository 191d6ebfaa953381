"""``mlx_spec train-draft``: train a drafter for a target, with MLX, in one command.

Stages, each resumed where it stopped when the command is run again:

1. prompts: the built-in set (:mod:`.prompts`) or ``--prompts FILE``;
2. the target's completions of them, with its laws and features
   (:mod:`.completions`), in ``OUT/data`` or ``--data DIR``;
3. training (``--kind draft``: :mod:`.draft`; ``--kind eagle|eagle3|medusa``:
   :mod:`.head_command` on the same completions), resumed from checkpoints;
4. ``--kind draft``: measurement with mlx-spec's engine and the model card
   (``OUT/README.md``).

Example::

    mlx_spec train-draft --model models/smollm2-135m-instruct --kind draft \\
        --out models/smollm2-135m-draft
"""

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from mlx_spec_entry import exit_interrupted

from ..features import FINAL
from . import draft as D
from . import head_command as H
from .checkpoint import TrainingPaused
from .cli_options import (
    check_args,
    command_line,
    draft_config,
    draft_layers,
    int_list,
    resume_options,
    setup_arg_parser,
)
from .stages import (
    add_learning_point,
    completions_stage,
    corpus_stage,
    cpu_seconds,
    learning_point,
    log,
    stage_time,
)


def run(args, argv: List[str]) -> int:
    check_args(args)
    int_list(args.layers, "layers")  # fails before the target loads
    import mlx.core as mx  # noqa: F401  (after mlx_spec set up BLAS)

    from ..loading import load_model

    model, tokenizer = load_model(args.model, "model")
    out = Path(args.out)
    restored = resume_options(args, argv, model)
    if restored:
        argv = [*argv, *restored]  # the card's command reproduces the run
        log(f"options of the checkpoint in {out} kept: {' '.join(restored)}")
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
            log=log,
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
    tic, cpu = time.perf_counter(), cpu_seconds()
    extra = {
        "name": out.name,
        "target_path": args.model,
        "data": data_record,
        "command": command_line(argv),
    }
    if config.init_from:  # the recipe of the run the chain of warm starts began with
        extra["origin"] = H.warm_start_origin(config.init_from)
    trainer = D.train_draft(
        model,
        tokenizer,
        train,
        heldout,
        config,
        out,
        progress=progress,
        log=log,
        extra=extra,
    )
    if trainer.step > trainer.start_step:
        timing["train"] = stage_time(tic, cpu)
    elif "train" in earlier_timing:  # nothing left to train: keep the run that did
        timing["train"] = earlier_timing["train"]

    # Stage 4: measurement with the engine, then the card.
    evaluation = None
    if not args.skip_eval:
        tic, cpu = time.perf_counter(), cpu_seconds()
        evaluation = measure(args, model, tokenizer, out, eval_ids)
        timing["eval"] = stage_time(tic, cpu)
    last = trainer.evals[-1] if trainer.evals else {}
    if args.corpus and last:
        add_learning_point(
            out, learning_point("draft", data_record, last, trainer.step)
        )
    write_card(out, extra, evaluation, timing)
    log(
        f"done: {out} (held-out α {last.get('alpha')}, best tokens/forward "
        f"{last.get('best_tokens_per_forward')} at γ {last.get('best_gamma')})"
    )
    return 0


def measure(args, model, tokenizer, out: Path, eval_ids: List[List[int]]) -> Dict:
    """Acceptance, speed ratio and end-to-end speed-up with the engine (held-out chat)."""
    from ..drafters.distilled import load_draft
    from .evaluate import end_to_end, engine_acceptance, step_time_ratio

    draft = load_draft(out, model)
    ids = eval_ids[: args.eval_prompts]
    gammas = int_list(args.eval_gammas, "eval-gammas")
    log(f"measuring with the engine on {len(ids)} held-out chat prompts")
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
        exit_interrupted(
            f"mlx_spec train-draft: paused after step {paused.step} (checkpoint in "
            f"{paused.path}); run the same command again to go on."
        )
    except KeyboardInterrupt:
        exit_interrupted(
            "mlx_spec train-draft: interrupted; run the same command again to resume."
        )
