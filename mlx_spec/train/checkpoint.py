"""Training checkpoints written whole or not at all, a Ctrl-C that pauses, and
the step loop of both trainers (:func:`train_steps`).

A checkpoint is the folder ``OUT/checkpoints``: safetensors and numpy files
plus ``state.json``. It is first written beside it and then swapped in by
renames, so a run killed while writing keeps the previous checkpoint.

During training the first Ctrl-C asks for a pause (:class:`PauseOnInterrupt`):
the step in progress finishes, a checkpoint is written and
:class:`TrainingPaused` is raised, so running the same command again loses
no step. A second Ctrl-C stops at once, as Ctrl-C usually does.
"""

import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import mlx.core as mx
import numpy as np

from ..interrupts import SigintCaught

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.json"
_NEW, _OLD = CHECKPOINT_DIR + ".tmp", CHECKPOINT_DIR + ".old"


class TrainingPaused(KeyboardInterrupt):
    """Ctrl-C paused a training after step ``step``, whose checkpoint is written."""

    def __init__(self, step: int, path: Path):
        super().__init__(f"paused after step {step}")
        self.step, self.path = step, path


def checkpoint_dir(out_dir) -> Optional[Path]:
    """The folder holding ``out_dir``'s latest complete checkpoint, or ``None``.

    That is ``OUT/checkpoints``, or the previous one kept aside while a new
    one was being swapped in, if the run died between the two renames.
    """
    for name in (CHECKPOINT_DIR, _OLD):
        path = Path(out_dir) / name
        if (path / STATE_FILE).exists():
            return path
    return None


def read_state(out_dir) -> Optional[Dict]:
    """The ``state.json`` of ``out_dir``'s latest checkpoint, or ``None``."""
    path = checkpoint_dir(out_dir)
    return None if path is None else json.loads((path / STATE_FILE).read_text())


def write_checkpoint(
    out_dir,
    tensors: Dict[str, Dict[str, mx.array]],
    state: Dict,
    arrays: Optional[Dict[str, np.ndarray]] = None,
) -> Path:
    """Write a checkpoint of ``OUT``: safetensors files, ``.npy`` files and the state.

    Args:
        out_dir: The drafter's output folder.
        tensors: File name -> the arrays it holds (``mx.save_safetensors``).
        state: The JSON-serialisable counters and options (``state.json``).
        arrays: File name -> a numpy array (``np.save``).
    """
    out = Path(out_dir)
    final, new, old = out / CHECKPOINT_DIR, out / _NEW, out / _OLD
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    for name, values in tensors.items():
        mx.save_safetensors(str(new / name), values)
    for name, values in (arrays or {}).items():
        np.save(new / name, values)
    (new / STATE_FILE).write_text(json.dumps(state))
    if (final / STATE_FILE).exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    else:  # no checkpoint, or files of one whose writing was cut short
        shutil.rmtree(final, ignore_errors=True)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_or_pause(trainer, out_dir, pause: "PauseOnInterrupt", due: bool):
    """After a step: write ``trainer``'s checkpoint if ``due`` or a pause was
    asked for, then pause (raise :class:`TrainingPaused`) if it was.

    The flag is read once: a Ctrl-C arriving meanwhile waits for the next step.
    """
    stop = pause.requested
    if due or stop:
        path = trainer.save_checkpoint(out_dir)
    if stop:
        raise TrainingPaused(trainer.step, path)


class PauseOnInterrupt(SigintCaught):
    """Within ``with``, the first SIGINT sets :attr:`requested` instead of raising.

    The loop checks ``requested`` after each step. A second SIGINT raises
    ``KeyboardInterrupt`` as usual. Outside the main thread (where Python
    allows no signal handlers), or where SIGINT is ignored (a background
    job), it changes nothing.
    """

    def __init__(
        self, message: str = "pausing after this step (Ctrl-C again to stop now)"
    ):
        super().__init__()
        self.message = message
        self.requested = False

    def caught(self):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{self.message}", file=sys.stderr, flush=True)


def train_steps(
    trainer,
    config,
    out_dir,
    *,
    desc: str,
    postfix: Callable[[Dict, Dict], Dict],
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    unlogged: str = "",
):
    """Run ``trainer``'s steps up to ``config.steps``.

    Every ``config.eval_every`` steps (and at the end) it evaluates on the
    held-out data and logs the summary (without its ``unlogged`` field);
    every ``config.checkpoint_every`` steps it writes a checkpoint; Ctrl-C
    pauses (:func:`checkpoint_or_pause`). The progress bar shows
    ``postfix(step_record, last_evaluation)``.
    """
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.steps, initial=trainer.step, desc=desc, unit="step")
    last = trainer.evals[-1] if trainer.evals else {}
    try:
        with PauseOnInterrupt() as pause:
            while trainer.step < config.steps:
                record = trainer.train_step()
                at_end = trainer.step == config.steps
                if trainer.step % config.eval_every == 0 or at_end:
                    last = trainer.evaluate()
                    if log:
                        log(
                            json.dumps({k: v for k, v in last.items() if k != unlogged})
                        )
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(**postfix(record, last), refresh=False)
                due = trainer.step % config.checkpoint_every == 0 or at_end
                checkpoint_or_pause(trainer, out_dir, pause, due)
    finally:
        if bar is not None:
            bar.close()
