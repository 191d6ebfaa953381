"""The training loop of draft heads (``mlx_spec train-draft --kind eagle|eagle3|medusa``).

Given teacher data (:mod:`mlx_spec.train.head_data`), it trains the head
with AdamW (warm-up, cosine decay, gradient clipping), shows a progress bar
with the loss, the draft accuracy and the greedy acceptance measured on
held-out sequences, writes a checkpoint every ``checkpoint_every`` steps
(and resumes from it), and finally writes the head directory that
``--draft-model DIR`` loads.

Held-out acceptance is the acceptance of greedy drafting, computed exactly
from the teacher data: for EAGLE the unrolled steps reproduce what the head
sees when drafting (see :mod:`mlx_spec.train.eagle`, EAGLE-3-shaped heads
too), so a chain from
round start ``j`` accepts ``s`` tokens iff its first ``s`` drafts equal the
target's greedy tokens; for Medusa, iff heads ``1..s`` put the target's
token first. From the same ranks comes the τ of a static tree of
``tree_size`` nodes (see :mod:`mlx_spec.train.rounds`).
"""

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..drafters.heads import WEIGHTS_FILE as HEAD_WEIGHTS
from ..drafters.heads import (
    build_head,
    head_architecture,
    head_args,
    read_head_config,
    save_head,
)
from ..features import embed, feature_owner, output_layer
from ..fingerprint import model_fingerprint
from . import eagle as eagle_train
from . import medusa as medusa_train
from . import rounds
from .checkpoint import (
    STATE_FILE,
    checkpoint_dir,
    train_steps,
    write_checkpoint,
)
from .head_data import HeadData, coverage, draft_vocabulary, token_counts, token_rows
from .precision import compute_dtype, computing_in
from .schedule import peak_schedule

# Defaults of HeadTrainConfig used as a library; train-draft's per-kind
# defaults are the shipped heads' recipes (head_command.DEFAULT_STEPS, ...).
DEFAULT_STEPS = 2000
DEFAULT_BATCH_SIZE = 8
DEFAULT_WINDOW = 256
DEFAULT_LR = 1e-3
DEFAULT_DRAFT_VOCAB = 8192
DEFAULT_EVAL_EVERY = 250
DEFAULT_HELDOUT = 24
EVAL_DEPTH = 6
MEDUSA_TREE_SIZE = 24


@dataclass
class HeadTrainConfig:
    """Options of one head training (all recorded in the head's config).

    Args:
        kind: ``"eagle"``, ``"eagle3"`` (EAGLE-3's architecture, its own
          norm and output layer, exportable to speculators) or ``"medusa"``.
        steps: Optimizer steps.
        batch_size: Windows per step.
        window: Tokens per window.
        lr: Peak learning rate (AdamW, linear warm-up, cosine decay).
        draft_vocab: Size of the draft vocabulary (most frequent target
          tokens on the training completions); ``0`` keeps the full vocabulary.
        heldout: Sequences kept out of training to measure acceptance.
        eval_every: Steps between held-out evaluations.
        checkpoint_every: Steps between checkpoints.
        seed: Seed of the data order and the head's initialisation.
        feature_layers: EAGLE: the target features read (see mlx_spec.features).
        train_steps: EAGLE: draft steps unrolled in training (EAGLE-3's
          training-time test).
        feature_weight: EAGLE: weight of the feature regression.
        prompt_weight: Weight of positions whose next token is a prompt
          token (the data's laws cover them too), relative to completions.
        precision: Compute dtype of the training forwards (see
          :mod:`mlx_spec.train.precision`); weights stay float32.
        num_heads: Medusa: heads (tokens predicted ahead).
        tree_size: Nodes of the static tree calibrated on the held-out
          evaluation: the τ (tree) it reports, and a Medusa head's stored tree.
        init_from: A trained head directory of the same kind and shape to
          start from (its draft vocabulary may differ: the rows are the
          target's frozen output rows).
        heldout_tokens: With a corpus, the budget of the fixed held-out set
          the evaluations measure on (:func:`.corpus_data.heldout_set`);
          ``None`` without one.
    """

    kind: str = "eagle"
    steps: int = DEFAULT_STEPS
    batch_size: int = DEFAULT_BATCH_SIZE
    window: int = DEFAULT_WINDOW
    lr: float = DEFAULT_LR
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    heldout: int = DEFAULT_HELDOUT
    eval_every: int = DEFAULT_EVAL_EVERY
    checkpoint_every: int = 250
    seed: int = 0
    feature_layers: List[int] = field(default_factory=lambda: [-1])
    train_steps: int = eagle_train.DEFAULT_TRAIN_STEPS
    feature_weight: float = eagle_train.DEFAULT_FEATURE_WEIGHT
    prompt_weight: float = 0.0
    precision: str = "auto"
    num_heads: int = 4
    tree_size: int = MEDUSA_TREE_SIZE
    init_from: str = ""
    heldout_tokens: Optional[int] = None


def output_weight(model: nn.Module, ids: Optional[np.ndarray]) -> mx.array:
    """The target's output layer rows ``ids`` as a float32 ``(k, H)`` matrix (frozen)."""
    layer = output_layer(model)
    idx = None if ids is None else mx.array(ids)
    if getattr(layer, "scales", None) is not None:
        w, s = layer.weight, layer.scales
        b = layer.get("biases")
        if idx is not None:
            w, s, b = w[idx], s[idx], None if b is None else b[idx]
        weight = mx.dequantize(w, s, b, group_size=layer.group_size, bits=layer.bits)
    else:
        weight = layer.weight if idx is None else layer.weight[idx]
    weight = weight.astype(mx.float32)
    mx.eval(weight)
    return weight


def warm_start_head(head: nn.Module, kind: str, path):
    """Load a trained head's weights from ``path`` into ``head`` (float32).

    Raises:
        ValueError: ``path`` holds another kind of head or another shape.
    """
    config = read_head_config(path)
    found = None if config is None else head_architecture(config)
    if found != kind:
        raise ValueError(
            f"--init-from '{path}' holds no {kind} head (found: {found or 'none'}); "
            f"pass a trained {kind} head directory."
        )
    weights = mx.load(str(Path(path) / HEAD_WEIGHTS))
    weights.pop("draft_vocab", None)
    mine = dict(tree_flatten(head.parameters()))
    if {k: v.shape for k, v in weights.items()} != {
        k: v.shape for k, v in mine.items()
    }:
        raise ValueError(
            f"the {kind} head in '{path}' has another shape than this one "
            "(pass the same --feature-layers / --num-heads)."
        )
    head.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()])


def start_from_target(head: nn.Module, model: nn.Module, vocab_weight: mx.array):
    """An EAGLE-3 head starts scoring as the target does: its output layer is
    the target's rows of the draft vocabulary ``(k, H)``, its final norm the
    target's (as speculators initialises them)."""
    head.lm_head.weight = vocab_weight.astype(mx.float32)
    norm = feature_owner(model).norm
    if isinstance(norm, nn.RMSNorm):  # not gemma's, which scales by 1 + weight
        head.norm.weight = norm.weight.astype(mx.float32)


def split_heldout(n: int, heldout: int, seed: int):
    """Deterministic train / held-out split of ``n`` sequences."""
    order = np.random.default_rng(seed).permutation(n)
    heldout = min(heldout, max(n // 5, 1)) if n > 1 else 0
    return sorted(order[heldout:].tolist()), sorted(order[:heldout].tolist())


class HeadTrainer:
    """One head's training state: module, optimizer, data, evaluation."""

    def __init__(
        self,
        model: nn.Module,
        data: HeadData,
        config: HeadTrainConfig,
        heldout_index: Optional[Sequence[int]] = None,
    ):
        self.model = model
        self.config = config
        if heldout_index is None:
            self.train_index, self.eval_index = split_heldout(
                len(data), config.heldout, config.seed
            )
        else:
            held = set(int(i) for i in heldout_index)
            self.eval_index = sorted(held)
            self.train_index = [i for i in range(len(data)) if i not in held]
        self.data = data
        self.vocab_size = int(feature_owner(model).embed_tokens.weight.shape[0])
        self.counts = token_counts(data.subset(self.train_index), self.vocab_size)
        draft_ids = None
        if config.draft_vocab and config.draft_vocab < self.vocab_size:
            draft_ids = draft_vocabulary(self.counts, config.draft_vocab)
        self.set_draft_vocab(draft_ids)
        mx.random.seed(config.seed)
        options = {}
        if config.kind in ("eagle", "eagle3"):
            options["feature_layers"] = config.feature_layers
        else:
            options["num_heads"] = config.num_heads
        if config.kind == "eagle3":
            options["draft_vocab_size"] = int(self.vocab_weight.shape[0])
        self.head = build_head(config.kind, head_args(config.kind, model, **options))
        if config.kind == "eagle3":
            start_from_target(self.head, model, self.vocab_weight)
        if config.init_from:
            warm_start_head(self.head, config.kind, config.init_from)
        mx.eval(self.head.parameters())
        self.embed_fn = lambda tokens: mx.stop_gradient(embed(model, tokens))
        self.dtype = compute_dtype(config.precision)
        schedule = peak_schedule(config.lr, 100, config.steps, floor=0.05)
        self.optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
        self.step = 0
        self.rng = np.random.default_rng(config.seed)
        self.history: List[Dict] = []
        self.evals: List[Dict] = []
        self.tokens_seen = 0
        self.train_time = 0.0
        self._grad = nn.value_and_grad(self.head, self._loss)

    def set_draft_vocab(self, draft_ids: Optional[np.ndarray]):
        """Use ``draft_ids`` (target ids, ascending; ``None`` = all) as the draft vocabulary."""
        self.draft_ids = draft_ids
        ids = draft_ids if draft_ids is not None else np.arange(self.vocab_size)
        self.coverage = coverage(self.counts, ids)
        self.to_draft = token_rows(ids, self.vocab_size)
        self.draft_ids_mx = mx.array(ids.astype(np.int32))
        self.vocab_weight = output_weight(self.model, draft_ids)

    def logits_fn(self, dtype=mx.float32):
        """Head outputs -> draft logits: an EAGLE-3 head's own output layer,
        else the target's frozen rows."""
        if self.config.kind == "eagle3":
            return self.head.logits
        return eagle_train.frozen_rows(self.vocab_weight.astype(dtype))

    def _loss(self, batch):
        dtype = self.dtype
        batch = replace(batch, features=batch.features.astype(dtype))
        weight = self.vocab_weight.astype(dtype)
        with computing_in(self.head, dtype):
            if self.config.kind in ("eagle", "eagle3"):
                final = eagle_train.final_only(self.config.feature_layers)
                return eagle_train.eagle_loss(
                    self.head,
                    lambda tokens: self.embed_fn(tokens).astype(dtype),
                    self.logits_fn(dtype),
                    batch,
                    steps=self.config.train_steps,
                    feature_weight=self.config.feature_weight,
                    final_feature=final and self.config.kind == "eagle",
                )
            return medusa_train.medusa_loss(self.head, weight, batch)

    def batch(self, index: Sequence[int]):
        return eagle_train.make_batch(
            self.data,
            index,
            self.to_draft,
            self.config.window,
            self.rng,
            self.config.prompt_weight,
        )

    def train_step(self) -> Dict:
        """One optimizer step on a random batch; returns its loss and accuracies."""
        index = self.rng.choice(self.train_index, size=self.config.batch_size)
        batch = self.batch(index.tolist())
        tic = time.perf_counter()
        (loss, accs), grads = self._grad(batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        self.optimizer.update(self.head, grads)
        mx.eval(self.head.parameters(), self.optimizer.state, loss, accs)
        self.train_time += time.perf_counter() - tic
        self.step += 1
        self.tokens_seen += int(np.array(batch.valid).sum())
        record = {
            "step": self.step,
            "loss": round(float(loss.item()), 4),
            "acc": [round(float(a), 4) for a in np.array(accs)],
        }
        self.history.append(record)
        return record

    def evaluate(self) -> Dict:
        """Greedy acceptance on the held-out sequences (see the module docstring)."""
        if not self.eval_index:
            return {}
        rng_state = self.rng.bit_generator.state
        ranks = []
        for i in range(0, len(self.eval_index), self.config.batch_size):
            index = self.eval_index[i : i + self.config.batch_size]
            batch = eagle_train.make_batch(
                self.data, index, self.to_draft, 1 << 30, np.random.default_rng(0)
            )
            if self.config.kind in ("eagle", "eagle3"):
                ranks.append(
                    eagle_train.step_ranks(
                        self.head, self.embed_fn, self.logits_fn(), batch, EVAL_DEPTH
                    )
                )
            else:
                ranks.append(
                    medusa_train.rank_hits(
                        self.head, self.vocab_weight, self.draft_ids_mx, batch
                    )
                )
        self.rng.bit_generator.state = rng_state
        summary = rounds.summarize(np.concatenate(ranks), self.config.tree_size)
        summary["step"] = self.step
        self.evals.append(summary)
        return summary

    # Checkpoints: the head, the optimizer state and the loop's counters.
    def save_checkpoint(self, out_dir: Path) -> Path:
        tensors = {
            "head.safetensors": dict(tree_flatten(self.head.parameters())),
            "optimizer.safetensors": dict(tree_flatten(self.optimizer.state)),
        }
        arrays = {}
        if self.draft_ids is not None:  # fixed for the run, even if data grows
            arrays["draft_vocab.npy"] = self.draft_ids
        meta = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_time": self.train_time,
            "history": self.history,
            "evals": self.evals,
            "rng": self.rng.bit_generator.state,
            "config": asdict(self.config),
        }
        return write_checkpoint(out_dir, tensors, meta, arrays)

    def load_checkpoint(self, out_dir: Path) -> bool:
        """Resume from ``out_dir``'s checkpoint if there is one; True if resumed."""
        path = checkpoint_dir(out_dir)
        if path is None:
            return False
        meta = json.loads((path / STATE_FILE).read_text())
        saved = meta["config"]
        mine = asdict(self.config)
        differ = [
            k
            for k in ("kind", "draft_vocab", "feature_layers", "num_heads", "seed")
            if saved.get(k) != mine.get(k)
        ]
        if differ:
            raise ValueError(
                f"the checkpoint in '{out_dir}' was trained with other {', '.join(differ)}; "
                "use another --out directory or the same options."
            )
        if (path / "draft_vocab.npy").exists():
            self.set_draft_vocab(np.load(path / "draft_vocab.npy"))
        self.head.load_weights(list(mx.load(str(path / "head.safetensors")).items()))
        state = mx.load(str(path / "optimizer.safetensors"))
        self.optimizer.state = tree_unflatten(list(state.items()))
        self.step = meta["step"]
        self.tokens_seen = meta["tokens_seen"]
        self.train_time = meta["train_time"]
        self.history = meta["history"]
        self.evals = meta["evals"]
        self.rng.bit_generator.state = meta["rng"]
        mx.eval(self.head.parameters(), self.optimizer.state)
        return True

    def save_head(self, out_dir, extra: Optional[Dict] = None):
        """Write the final head directory (float16 weights + config)."""
        record = {
            "training": {
                "config": asdict(self.config),
                "steps": self.step,
                "tokens_seen": self.tokens_seen,
                "train_seconds": round(self.train_time, 1),
                "train_sequences": len(self.train_index),
                "heldout_sequences": len(self.eval_index),
                "train_tokens": int(
                    sum(len(self.data.tokens[i]) for i in self.train_index)
                ),
                "draft_vocab_coverage": round(self.coverage, 4),
                "final_loss": self.history[-1]["loss"] if self.history else None,
                "evals": self.evals,
            }
        }
        if self.config.kind == "medusa" and self.evals:
            record["tree_choices"] = self.evals[-1].get("tree_choices")
        record.update(extra or {})
        ids = None if self.draft_ids is None else mx.array(self.draft_ids)
        save_head(
            out_dir,
            self.config.kind,
            self.head,
            target_fingerprint=model_fingerprint(self.model),
            draft_ids=ids,
            extra=record,
        )


def train_head(
    model: nn.Module,
    data: HeadData,
    config: HeadTrainConfig,
    out_dir,
    *,
    resume: bool = True,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    extra: Optional[Dict] = None,
    heldout_index: Optional[Sequence[int]] = None,
) -> HeadTrainer:
    """Train a head on ``data`` and write it to ``out_dir`` (see the module docstring).

    ``heldout_index`` names the sequences kept for evaluation (default: a
    seeded random ``config.heldout`` of them).
    """
    trainer = HeadTrainer(model, data, config, heldout_index)
    out_dir = Path(out_dir)
    if resume and trainer.load_checkpoint(out_dir) and log:
        log(f"resumed from step {trainer.step}")
    train_steps(
        trainer,
        config,
        out_dir,
        desc=f"train {config.kind}",
        postfix=lambda record, last: dict(
            loss=record["loss"],
            acc1=record["acc"][0],
            heldout_tpr=last.get("tokens_per_round", float("nan")),
        ),
        progress=progress,
        log=log,
        unlogged="rank_accuracy",
    )
    if not trainer.evals or trainer.evals[-1].get("step") != trainer.step:
        trainer.evaluate()
    trainer.save_head(out_dir, extra)
    return trainer
