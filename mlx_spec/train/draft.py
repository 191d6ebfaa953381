"""Distilling a draft model from its target (``mlx_spec train-draft --kind draft``).

The draft (:mod:`mlx_spec.drafters.distilled`) starts as a few of the
target's own layers, its final norm and its output rows for the ``k`` most
frequent tokens of the teacher data, on the target's frozen embedding. It
is then trained on the target's completions (:mod:`.completions`) with

    loss = soft_weight * CE(teacher top-K law, q) + (1 - soft_weight) * CE(token, q)
           + feature_weight * smooth_l1(h, f)

over completion positions (and, weighted, prompt positions), where ``q`` is the draft's law over its own
vocabulary; teacher mass outside the draft vocabulary is dropped (the draft
cannot propose those tokens), and so are tokens outside it as hard labels.
``h`` is the draft's final normed hidden state and ``f`` the target's (the
input of the output layer both share), kept with the completions: it carries
the target's whole law, not only its top ``K``.

With ``labels="written"`` the completions hold no laws (``K = 0``, no
prefill of the target; :func:`.corpus_data.corpus_completions`) and the
loss is the written token's alone: greedy rows' tokens are the target's
argmax and sampled rows' are draws from its law, so it is an unbiased
estimate of the soft cross-entropy (sequence-level distillation).

With ``rollout_steps > 0`` a share of the steps also trains on contexts
that hold the draft's own tokens, scored by the target (:mod:`.rollout`).

Held-out greedy acceptance is computed exactly from one teacher-forced
forward: on a greedy completion, a chain drafted from position ``j``
accepts ``s`` tokens iff the draft's argmax equals the next token at
``j .. j + s - 1`` (every accepted token *is* the true prefix of the next
draft step). Rounds are replayed over each held-out completion with a fixed
draft length, which gives the per-position acceptance and the tokens per
target forward the engine would measure (up to float near-ties).
"""

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..attention.tree import prepare_tree_model
from ..drafters.distilled import (
    DistilledDraft,
    build_draft,
    draft_vocabulary,
    drafter_config,
    load_draft,
    save_draft,
    target_layer_indices,
)
from ..drafters.heads import read_head_config
from .checkpoint import (
    STATE_FILE,
    checkpoint_dir,
    train_steps,
    write_checkpoint,
)
from .completions import Completions
from .draft_batches import Batch, append_rows, make_batch, plan_batches
from .head_data import token_rows
from .precision import compute_dtype, computing_in
from .rollout import (
    ROLLOUT_EVERY,
    draft_rollout,
    is_rollout_step,
    pack,
    packed_cache,
    rollout_cuts,
    target_laws_at,
)
from .schedule import peak_schedule

# The shipped draft's recipe: about an hour on a 2-core CPU (float32).
DEFAULT_STEPS = 1000
DEFAULT_BATCH_TOKENS = 4096
DEFAULT_LR = 8e-4
DEFAULT_WARMUP = 100
DEFAULT_DRAFT_VOCAB = 4096  # by measured speed (benchmarks/README.md, draft shapes)
DEFAULT_LAYERS = (0, -1)  # the first and the last block
DEFAULT_SOFT_WEIGHT = 0.5
DEFAULT_PROMPT_WEIGHT = 0.3
DEFAULT_FEATURE_WEIGHT = 0.0
DEFAULT_EVAL_EVERY = 250
DEFAULT_MAX_LENGTH = 768
DEFAULT_ROLLOUT_STEPS = 0  # teacher forcing only
DEFAULT_ROLLOUT_SHARE = 0.25
DEFAULT_ROLLOUT_TEMP = 0.0
EVAL_GAMMAS = (1, 2, 3, 4, 5, 6)
EVAL_POSITIONS = 8


@dataclass
class DraftTrainConfig:
    """Options of one draft training (recorded in the drafter's config).

    Args:
        steps: Optimizer steps.
        batch_tokens: Padded tokens per step.
        lr: Peak learning rate (AdamW, linear warm-up, cosine decay to 10%).
        warmup: Warm-up steps.
        draft_vocab: Size of the draft vocabulary (most frequent target
          tokens in the training completions).
        layers: Target layers the draft starts from, in order.
        soft_weight: Weight of the soft (top-K law) loss; the rest is the
          hard (written token) loss.
        prompt_weight: Weight of prompt positions (where the data has the
          target's laws over the prompt), relative to completion positions.
        feature_weight: Weight of the regression of the draft's final hidden
          state on the target's (needs completions with final features).
        precision: Compute dtype of the training forwards (see
          :mod:`mlx_spec.train.precision`); weights stay float32.
        max_length: Sequences are cut to this many tokens.
        eval_every: Steps between held-out evaluations.
        checkpoint_every: Steps between checkpoints.
        seed: Seed of the data order.
        compile: ``mx.compile`` the training step.
        init_from: A trained draft directory to start from instead of the
          target's layers (its layers, and optionally new ones; shared
          vocabulary rows copied).
        grown_lr: Peak learning rate of the layers a warm start adds (they
          start as identities, so they need a from-scratch rate).
        rollout_steps: Tokens the draft writes from its own law on a rollout
          step, whose positions then train on the target's law there
          (:mod:`.rollout`); ``0``: teacher forcing only.
        rollout_share: Share of the steps that are rollout steps.
        rollout_temp: Temperature of the draft's rollouts (``0``: greedy).
        heldout_tokens: With a corpus, the budget of the fixed held-out set
          the evaluations measure on (:func:`.corpus_data.heldout_set`);
          ``None`` without one.
        labels: ``laws``: the target's top-K laws (soft labels) and the
          written tokens; ``written``: the written tokens alone, from
          completions without laws (see the module docstring).
    """

    steps: int = DEFAULT_STEPS
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    lr: float = DEFAULT_LR
    warmup: int = DEFAULT_WARMUP
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    layers: List[int] = field(default_factory=lambda: list(DEFAULT_LAYERS))
    soft_weight: float = DEFAULT_SOFT_WEIGHT
    prompt_weight: float = DEFAULT_PROMPT_WEIGHT
    feature_weight: float = DEFAULT_FEATURE_WEIGHT
    precision: str = "auto"
    max_length: int = DEFAULT_MAX_LENGTH
    eval_every: int = DEFAULT_EVAL_EVERY
    checkpoint_every: int = DEFAULT_EVAL_EVERY
    seed: int = 0
    compile: bool = True
    init_from: str = ""
    grown_lr: float = DEFAULT_LR
    rollout_steps: int = DEFAULT_ROLLOUT_STEPS
    rollout_share: float = DEFAULT_ROLLOUT_SHARE
    rollout_temp: float = DEFAULT_ROLLOUT_TEMP
    heldout_tokens: Optional[int] = None
    labels: str = "laws"


# Options a resumed run must share with its checkpoint.
_RESUME_KEYS = ("draft_vocab", "layers", "batch_tokens", "max_length", "seed", "steps")


def warm_start(
    draft: DistilledDraft,
    trained: DistilledDraft,
    layers: Sequence[int] = (),
    trained_layers: Sequence[int] = (),
) -> List[int]:
    """Copy a trained draft's layers, norm and shared output rows into ``draft``.

    Rows of tokens that only ``draft``'s vocabulary holds keep their
    initialisation (the target's output rows). A draft grown by layers
    (``layers``, the target indices of ``draft``'s, holding ``trained_layers``
    in order) takes each trained layer at its index; a new layer starts as an
    identity (:func:`silence_layer`), so the grown draft starts as the trained one.

    Returns:
        The position in ``draft`` of each trained layer.

    Raises:
        ValueError: One line: the layers cannot be matched.
    """
    position = list(range(len(trained.layers)))
    if len(trained.layers) != len(draft.layers):
        position = grown_positions(list(layers), list(trained_layers))
        for j in set(range(len(draft.layers))) - set(position):
            silence_layer(draft.layers[j])
    body = {
        _moved_layer_key(k, position): v.astype(mx.float32)
        for k, v in trained.trainable_state().items()
        if not k.startswith("lm_head.")
    }
    draft.load_weights(list(body.items()), strict=False)
    new_ids = np.array(draft.lm_head.token_ids)
    old_ids = np.array(trained.lm_head.token_ids)
    row_of_old = {int(t): i for i, t in enumerate(old_ids)}
    shared = [
        (i, row_of_old[int(t)]) for i, t in enumerate(new_ids) if int(t) in row_of_old
    ]
    if shared:
        new_rows, old_rows = (mx.array(list(c)) for c in zip(*shared))
        weight = draft.lm_head.weight
        weight[new_rows] = trained.lm_head.weight[old_rows].astype(weight.dtype)
        draft.lm_head.weight = weight
    mx.eval(draft.trainable_state())
    return position


def grown_positions(layers: List[int], trained_layers: List[int]) -> List[int]:
    """Where each of ``trained_layers`` sits in ``layers`` (both target indices).

    Raises:
        ValueError: ``layers`` does not hold ``trained_layers`` in order.
    """
    position = [layers.index(i) for i in trained_layers if i in layers]
    if len(position) != len(trained_layers) or position != sorted(position):
        raise ValueError(
            f"--init-from holds a draft of target layers {trained_layers}; --layers "
            f"{layers} must hold them in order (new layers start as identities)."
        )
    return position


def draft_optimizer(config: "DraftTrainConfig", new_layers: Sequence[int]):
    """AdamW at ``config.lr``; layers at ``new_layers`` (positions in the
    draft, added by a warm start) at ``config.grown_lr`` instead."""

    def adamw(peak: float):
        schedule = peak_schedule(peak, config.warmup, config.steps)
        return optim.AdamW(learning_rate=schedule, weight_decay=0.0)

    if not new_layers:
        return adamw(config.lr)
    prefixes = tuple(f"model.layers.{i}." for i in new_layers)
    return optim.MultiOptimizer(
        [adamw(config.grown_lr), adamw(config.lr)],
        [lambda path, _: path.startswith(prefixes)],
    )


def silence_layer(layer: nn.Module):
    """Zero a block's output projections, so that it adds nothing to the residual.

    Raises:
        ValueError: The block has no ``self_attn.o_proj`` or ``mlp.down_proj``.
    """
    names = {"o_proj", "down_proj"}
    flat = dict(tree_flatten(layer.parameters()))
    outputs = [k for k in flat if names & set(k.split(".")[:-1])]
    if not names <= {part for k in outputs for part in k.split(".")}:
        raise ValueError(
            "this target's blocks have no o_proj and down_proj to start a new draft "
            "layer from; pass --layers with as many layers as the --init-from draft."
        )
    layer.update(tree_unflatten([(k, mx.zeros_like(flat[k])) for k in outputs]))


def _moved_layer_key(name: str, position: Sequence[int]) -> str:
    """``model.layers.K.rest`` renamed to the layer's position in a grown draft."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        parts[2] = str(position[int(parts[2])])
    return ".".join(parts)


# --------------------------------------------------------------------------- #
# Loss
# --------------------------------------------------------------------------- #


def supervised_hidden(
    draft: DistilledDraft,
    tokens: mx.array,
    rows: mx.array,
    dtype=None,
    layout: Optional[Tuple[mx.array, mx.array]] = None,
) -> mx.array:
    """The draft's final hidden states at the supervised positions: ``(R, H)``.

    ``dtype``: the compute dtype of the forward (default: the weights').
    ``layout``: ``(positions, mask)`` of a packed batch (see :mod:`.rollout`).
    """
    cache = None if layout is None else packed_cache(draft, *layout)
    h = draft.hidden(tokens, cache=cache, dtype=dtype)  # (B, T, H)
    return h.reshape(-1, h.shape[-1])[rows]


def supervised_logits(
    draft: DistilledDraft, tokens: mx.array, rows: mx.array
) -> mx.array:
    """Draft logits over its vocabulary at the supervised positions: ``(R, k)``."""
    return draft.lm_head.subset_logits(supervised_hidden(draft, tokens, rows))


def draft_loss(
    draft: DistilledDraft,
    tokens,
    rows,
    soft_ids,
    soft_p,
    hard,
    weight,
    completion,
    features=None,
    *,
    soft_weight: float,
    feature_weight: float = 0.0,
    dtype=mx.float32,
    layout: Optional[Tuple[mx.array, mx.array]] = None,
):
    """Weighted mean distillation loss over the supervised rows, and the accuracy.

    ``dtype`` is the compute dtype of the draft's forward (the loss itself is
    float32; see :mod:`mlx_spec.train.precision`). ``layout``: the
    ``(positions, mask)`` of a packed batch with rollout branches. Without
    laws (``K = 0``) the loss is the written token's alone.

    Returns:
        ``(loss, accuracy)`` scalars; accuracy is the share of completion rows
        whose draft argmax is the next token.
    """
    with computing_in(draft, dtype):
        h = supervised_hidden(draft, tokens, rows, dtype, layout)  # (R, H)
        logits = draft.lm_head.subset_logits(h)  # (R, k)
    h, logits = h.astype(mx.float32), logits.astype(mx.float32)
    if soft_ids.shape[-1] == 0:  # no laws (--labels written): the hard term only
        soft_weight = 0.0
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    weights = mx.where(soft_ids >= 0, soft_p, 0.0)
    weights = weights / mx.maximum(weights.sum(axis=-1, keepdims=True), 1e-9)
    gathered = mx.take_along_axis(logq, mx.maximum(soft_ids, 0), axis=-1)
    soft = -(weights * gathered).sum(axis=-1)
    has_hard = hard >= 0
    picked = mx.take_along_axis(logq, mx.maximum(hard, 0)[:, None], axis=-1)[:, 0]
    hard_loss = mx.where(has_hard, -picked, 0.0)
    per_row = soft_weight * soft + (1.0 - soft_weight) * hard_loss
    if features is not None and feature_weight > 0:
        reg = nn.losses.smooth_l1_loss(h, features, reduction="none").mean(-1)
        per_row = per_row + feature_weight * reg
    loss = (per_row * weight).sum() / mx.maximum(weight.sum(), 1e-9)
    correct = (mx.argmax(logits, axis=-1) == hard) & has_hard
    accuracy = (correct * completion).sum() / mx.maximum(completion.sum(), 1.0)
    return loss, accuracy


# --------------------------------------------------------------------------- #
# Held-out acceptance replayed from teacher-forced matches
# --------------------------------------------------------------------------- #


def replay_chains(matches: Sequence[np.ndarray], gamma: int) -> Dict:
    """Replay fixed-γ greedy rounds over each completion's match vector.

    Args:
        matches: Per completion, ``(n,)`` bool: whether the draft's argmax at
          completion position ``j`` (given the true prefix) is token ``j``.
        gamma: Draft tokens per round.

    Returns:
        ``tokens_per_forward`` (emitted tokens per round, i.e. per target
        forward), ``acceptance`` (accepted / drafted) and ``by_position``
        (acceptance of draft position ``i`` given the round reached it).
    """
    reached = np.zeros(gamma, np.int64)
    accepted_at = np.zeros(gamma, np.int64)
    rounds = emitted = drafted = accepted = 0
    for m in matches:
        j, n = 0, len(m)
        while j < n:
            run = 0
            while run < gamma and j + run < n and m[j + run]:
                run += 1
            depth = min(gamma, n - j)  # drafts that could be checked this round
            reached[: min(run + 1, depth)] += 1
            accepted_at[:run] += 1
            drafted += depth
            accepted += run
            step = min(run + 1, n - j)
            emitted += step
            rounds += 1
            j += step
    return {
        "gamma": gamma,
        "tokens_per_forward": round(emitted / max(rounds, 1), 4),
        "acceptance": round(accepted / max(drafted, 1), 4),
        "by_position": [
            round(float(a) / r, 4) if r else None for a, r in zip(accepted_at, reached)
        ],
    }


def greedy_alpha(matches: Sequence[np.ndarray]) -> float:
    """Per-token greedy acceptance: P(draft token == target token | true prefix)."""
    total = sum(len(m) for m in matches)
    return sum(int(m.sum()) for m in matches) / max(total, 1)


def greedy_matches(
    draft: DistilledDraft,
    data: Completions,
    batches: Sequence[Sequence[int]],
    to_draft: np.ndarray,
    max_length: int,
    subsets: Sequence[Optional[np.ndarray]] = (None,),
    owners: Optional[List[int]] = None,
) -> List[List[np.ndarray]]:
    """Teacher-forced greedy matches of ``draft`` on the greedy completions of ``data``.

    One forward per batch serves every subset: a subset restricts the
    draft's argmax to some rows of its vocabulary.

    Args:
        draft: The draft.
        data: Completions (only those of temperature 0 are read).
        batches: Sequence indices per forward (:func:`plan_batches`).
        to_draft: ``(V,)`` target id -> draft row (:func:`token_rows`).
        max_length: Sequences are cut to this many tokens.
        subsets: Per result, ``(k',)`` rows of the draft vocabulary its
          argmax is taken over, or ``None`` for all of them.
        owners: A list that receives, in order, the index in ``data`` of
          each returned completion (sampled and empty ones are skipped).

    Returns:
        Per subset, per greedy completion ``(n,)`` bool: the draft's argmax
        given the true prefix is completion token ``j``.
    """
    # Greedy rows' written tokens are the target's argmax: no laws (nor prefill) needed.
    out: List[List[np.ndarray]] = [[] for _ in subsets]
    ids = np.array(draft.lm_head.token_ids)
    columns = [None if s is None else mx.array(np.asarray(s)) for s in subsets]
    for index in batches:
        index = [i for i in index if data.temps[i] == 0.0]
        if not index:
            continue
        batch = make_batch(data, index, to_draft, max_length)
        tokens, rows = mx.array(batch.tokens), mx.array(batch.rows)
        logits = supervised_logits(draft, tokens, rows)  # (R, k)
        cuts = np.cumsum(batch.counts)[:-1]
        for matches, cols in zip(out, columns):
            if cols is None:
                best = mx.argmax(logits, axis=-1)
            else:
                best = cols[mx.argmax(mx.take(logits, cols, axis=-1), axis=-1)]
            hit = ids[np.array(best)] == batch.target
            parts = np.split(hit[: sum(batch.counts)], cuts)
            matches.extend(m for m in parts if len(m))
        if owners is not None:
            owners.extend(i for i, n in zip(index, batch.counts) if n)
    return out


# --------------------------------------------------------------------------- #
# The trainer
# --------------------------------------------------------------------------- #


class DraftTrainer:
    """One draft's training state: model, optimizer, data order, evaluation."""

    def __init__(
        self,
        target: nn.Module,
        tokenizer,
        train: Completions,
        heldout: Completions,
        config: DraftTrainConfig,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.config = config
        self.train = train
        self.heldout = heldout
        vocab_size = int(target.args.vocab_size)
        counts = dict(enumerate(token_counts(train, vocab_size).tolist()))
        always = sorted(set(int(t) for t in tokenizer.eos_token_ids))
        trained, self.grown_from = None, None
        self.new_layers: List[int] = []  # positions of layers a warm start adds
        if config.init_from:
            trained = load_draft(config.init_from, target, like_target=False)
            # A warm start keeps the vocabulary it learned (the most frequent first
            # if it shrinks); a larger one adds the data's most frequent tokens.
            kept = np.array(trained.lm_head.token_ids).tolist()
            always += sorted(kept, key=lambda t: (-counts[t], t))
        self.token_ids = draft_vocabulary(counts, config.draft_vocab, always)
        ids = np.array(self.token_ids)
        written = np.zeros(vocab_size, np.int64)
        for tokens, start in zip(train.tokens, train.starts):
            np.add.at(written, tokens[start:], 1)
        # Share of the training completions' tokens the draft can propose.
        self.coverage = float(written[ids].sum() / max(written.sum(), 1))
        self.to_draft = token_rows(ids, vocab_size)
        self.layers = target_layer_indices(target, config.layers)
        self.draft = build_draft(target, self.token_ids, self.layers)
        if trained is not None:
            old = read_head_config(config.init_from)["draft"]["init_layers"]
            old = target_layer_indices(target, old)
            kept = warm_start(self.draft, trained, self.layers, old)
            self.grown_from = old if len(old) != len(self.layers) else None
            self.new_layers = [i for i in range(len(self.layers)) if i not in kept]
        if config.rollout_steps > 0:  # packed forwards: per-token rope positions
            prepare_tree_model(self.draft)
            prepare_tree_model(target)
        self.batches = plan_batches(
            [len(t) for t in train.tokens], config.batch_tokens, config.max_length
        )
        self.heldout_batches = plan_batches(
            [len(t) for t in heldout.tokens], config.batch_tokens, config.max_length
        )
        self.optimizer = draft_optimizer(config, self.new_layers)
        self.optimizer.init(self.draft.trainable_parameters())
        self.step = 0
        self.start_step = 0  # the step this run started from (after a resume)
        self.tokens_seen = 0
        self.train_time = 0.0
        self.history: List[Dict] = []
        self.evals: List[Dict] = []
        self._step_fn = self._make_step()
        self._packed_step_fn = self._make_step(packed=True)

    def _loss_weights(self) -> Dict[str, float]:
        return {
            "soft_weight": self.config.soft_weight,
            "feature_weight": self.config.feature_weight,
            "dtype": compute_dtype(self.config.precision),
        }

    @property
    def uses_features(self) -> bool:
        return self.config.feature_weight > 0

    # The compiled update: loss, gradients, clipping, optimizer.
    def _make_step(self, packed: bool = False):
        """The update; ``packed``: its first two inputs are a packed batch's layout."""
        draft, optimizer = self.draft, self.optimizer
        weights = self._loss_weights()

        def loss_fn(model, *batch):
            if packed:
                positions, mask, *batch = batch
                return draft_loss(model, *batch, layout=(positions, mask), **weights)
            return draft_loss(model, *batch, **weights)

        grad_fn = nn.value_and_grad(draft, loss_fn)

        def step(*batch):
            (loss, accuracy), grads = grad_fn(draft, *batch)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(draft, grads)
            return loss, accuracy

        if not self.config.compile:
            return step
        state = [draft.state, optimizer.state]
        return mx.compile(step, inputs=state, outputs=state)

    def batch_of_step(self, step: int) -> List[int]:
        """The batch of optimizer step ``step`` (a seeded shuffle per epoch)."""
        epoch, k = divmod(step, len(self.batches))
        order = np.random.default_rng([self.config.seed, epoch]).permutation(
            len(self.batches)
        )
        return self.batches[order[k]]

    def rollout_due(self, step: int) -> bool:
        c = self.config
        return c.rollout_steps > 0 and is_rollout_step(step, c.rollout_share)

    def rollout_batch(self, index: Sequence[int], step: int) -> Batch:
        """Step ``step``'s batch packed with rollout branches: the draft's tokens
        after random completion positions, and the target's laws there (:mod:`.rollout`).
        """
        c, data = self.config, self.train
        batch = make_batch(
            data,
            index,
            self.to_draft,
            c.max_length,
            c.prompt_weight,
            features=self.uses_features,
        )
        rng = np.random.default_rng([c.seed, step, 1])
        cuts = [
            rollout_cuts(
                data.starts[i],
                min(len(data.tokens[i]), c.max_length),
                ROLLOUT_EVERY,
                rng,
            )
            for i in index
        ]
        if not any(len(row) for row in cuts):
            return batch
        packed = pack(batch.tokens, cuts, c.rollout_steps)
        layout = mx.array(packed.positions), mx.array(packed.mask)
        key = mx.random.key(c.seed * 1_000_003 + step) if c.rollout_temp > 0 else None
        tokens = draft_rollout(
            self.draft,
            mx.array(packed.tokens),
            layout,
            mx.array(packed.slots),
            mx.array(packed.source),
            temp=c.rollout_temp,
            key=key,
        )
        W, N = batch.tokens.shape[1], packed.tokens.shape[1]
        B = len(index)
        branch = (np.arange(B)[:, None, None] * N + packed.slots)[packed.real]
        branch = branch.reshape(
            -1
        )  # (E,) flat slots, row by row, cut by cut, level by level
        K = data.law_ids[index[0]].shape[1]
        ids, logp, feats = target_laws_at(
            self.target, tokens, layout, mx.array(branch), K
        )
        mx.eval(tokens, ids, logp, feats)
        trunk = batch.rows // W * N + batch.rows % W  # the trunk's rows, packed
        batch = replace(
            batch,
            tokens=np.array(tokens),
            rows=trunk.astype(np.int32),
            positions=packed.positions,
            mask=packed.mask,
        )
        ids = np.array(ids)
        return append_rows(
            batch,
            branch,
            ids,
            np.exp(np.array(logp).astype(np.float32)),
            ids[:, 0],
            self.to_draft,
            np.array(feats.astype(mx.float32)) if self.uses_features else None,
        )

    def train_step(self) -> Dict:
        index = self.batch_of_step(self.step)
        rollout = self.rollout_due(self.step)
        if rollout:  # the rollout's forwards count as training time
            tic = time.perf_counter()
            batch = self.rollout_batch(index, self.step)
        else:
            batch = make_batch(
                self.train,
                index,
                self.to_draft,
                self.config.max_length,
                self.config.prompt_weight,
                features=self.uses_features,
            )
            tic = time.perf_counter()
        layout = batch.layout()
        if layout is None:
            loss, accuracy = self._step_fn(*batch.arrays())
        else:
            loss, accuracy = self._packed_step_fn(*layout, *batch.arrays())
        mx.eval(loss, accuracy, self.draft.state, self.optimizer.state)
        self.train_time += time.perf_counter() - tic
        self.step += 1
        self.tokens_seen += int(batch.completion.sum())
        record = {
            "step": self.step,
            "loss": round(float(loss.item()), 4),
            "acc": round(float(accuracy.item()), 4),
        }
        if rollout:
            record["rollout"] = True
        self.history.append(record)
        return record

    def matches(self, data: Completions, batches: List[List[int]]) -> List[np.ndarray]:
        """Per greedy completion ``(n,)`` bool: the draft's argmax (true prefix) is the next token."""
        return greedy_matches(
            self.draft, data, batches, self.to_draft, self.config.max_length
        )[0]

    def evaluate(self) -> Dict:
        """Held-out loss and accuracy, and greedy acceptance replayed per draft length."""
        loss_sum = acc_sum = count = 0.0
        for index in self.heldout_batches:
            batch = make_batch(
                self.heldout,
                index,
                self.to_draft,
                self.config.max_length,
                features=self.uses_features,
            )
            loss, accuracy = draft_loss(
                self.draft, *batch.arrays(), **self._loss_weights()
            )
            n = float(batch.completion.sum())
            loss_sum += float(loss.item()) * n
            acc_sum += float(accuracy.item()) * n
            count += n
        matches = self.matches(self.heldout, self.heldout_batches)
        chains = [replay_chains(matches, g) for g in EVAL_GAMMAS]
        best = max(chains, key=lambda c: c["tokens_per_forward"])
        summary = {
            "step": self.step,
            "heldout_loss": round(loss_sum / max(count, 1), 4),
            "heldout_accuracy": round(acc_sum / max(count, 1), 4),
            "alpha": round(greedy_alpha(matches), 4),
            "chains": chains,
            "best_gamma": best["gamma"],
            "best_tokens_per_forward": best["tokens_per_forward"],
        }
        self.evals.append(summary)
        return summary

    # Checkpoints: the draft's weights, the optimizer state, the counters.
    def save_checkpoint(self, out_dir) -> Path:
        tensors = {
            "draft.safetensors": self.draft.trainable_state(),
            "optimizer.safetensors": dict(tree_flatten(self.optimizer.state)),
        }
        meta = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_time": self.train_time,
            "history": self.history,
            "evals": self.evals,
            "config": asdict(self.config),
            "token_ids_sha": _digest(self.token_ids),
            "new_layers": self.new_layers,
        }
        return write_checkpoint(out_dir, tensors, meta)

    def load_checkpoint(self, out_dir) -> bool:
        """Resume from ``out_dir``'s checkpoint if there is one; True if resumed."""
        path = checkpoint_dir(out_dir)
        if path is None:
            return False
        meta = json.loads((path / STATE_FILE).read_text())
        saved, mine = meta["config"], asdict(self.config)
        differ = [k for k in _RESUME_KEYS if saved.get(k) != mine.get(k)]
        if meta.get("token_ids_sha") != _digest(self.token_ids):
            differ.append("training data")
        if differ:
            raise ValueError(
                f"the checkpoint in '{path}' was made with other {', '.join(differ)}; "
                "use the same options, or delete that folder to start over."
            )
        weights = mx.load(str(path / "draft.safetensors"))
        self.draft.load_weights(list(weights.items()), strict=False)
        # The layers the run grew, as its optimizers hold them (even if its
        # --init-from is gone since; none before the checkpoint recorded them).
        if meta.get("new_layers", []) != self.new_layers:
            self.new_layers = meta.get("new_layers", [])
            self.optimizer = draft_optimizer(self.config, self.new_layers)
        state = mx.load(str(path / "optimizer.safetensors"))
        self.optimizer.state = tree_unflatten(list(state.items()))
        self.step = meta["step"]
        self.tokens_seen = meta["tokens_seen"]
        self.train_time = meta["train_time"]
        self.history = meta["history"]
        self.evals = meta["evals"]
        mx.eval(self.draft.state, self.optimizer.state)
        self._step_fn = self._make_step()
        self._packed_step_fn = self._make_step(packed=True)
        return True

    def record(self) -> Dict:
        """What the drafter's config records about this training."""
        return {
            "config": asdict(self.config),
            "steps": self.step,
            "tokens_seen": self.tokens_seen,
            "train_seconds": round(self.train_time, 1),
            "train_sequences": len(self.train),
            "train_completion_tokens": self.train.completion_tokens,
            "heldout_sequences": len(self.heldout),
            "heldout_completion_tokens": self.heldout.completion_tokens,
            "draft_vocab_coverage": round(self.coverage, 4),
            "final_loss": self.history[-1]["loss"] if self.history else None,
            "evals": self.evals,
            **({"grown_from_layers": self.grown_from} if self.grown_from else {}),
        }

    def save(self, out_dir, extra: Optional[Dict] = None):
        """Write the drafter directory (float16 weights + config.json)."""
        config = drafter_config(
            self.draft,
            self.target,
            self.layers,
            training=self.record(),
            **(extra or {}),
        )
        save_draft(self.draft, out_dir, config)


def token_counts(data: Completions, vocab_size: int) -> np.ndarray:
    """Frequency of each token for the draft vocabulary ``(V,)``.

    Completion tokens count 4, prompt tokens 1 (answers often copy from the
    prompt); unseen tokens keep 0 and are taken by lowest id (BPE merge order).
    """
    counts = np.zeros(vocab_size, np.int64)
    for tokens, start in zip(data.tokens, data.starts):
        np.add.at(counts, tokens[start:], 4)
        np.add.at(counts, tokens[:start], 1)
    return counts


def _digest(ids: Sequence[int]) -> str:
    import hashlib

    return hashlib.sha256(np.asarray(ids, np.int32).tobytes()).hexdigest()[:16]


def train_draft(
    target: nn.Module,
    tokenizer,
    train: Completions,
    heldout: Completions,
    config: DraftTrainConfig,
    out_dir,
    *,
    resume: bool = True,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    extra: Optional[Dict] = None,
) -> DraftTrainer:
    """Train a draft and write it to ``out_dir`` (see the module docstring)."""
    trainer = DraftTrainer(target, tokenizer, train, heldout, config)
    if resume and trainer.load_checkpoint(out_dir) and log:
        log(f"resumed from step {trainer.step}")
    trainer.start_step = trainer.step
    if not trainer.evals:
        trainer.evaluate()  # the starting point, for the card
    train_steps(
        trainer,
        config,
        out_dir,
        desc="train draft",
        postfix=lambda record, last: dict(
            loss=record["loss"],
            acc=record["acc"],
            heldout_alpha=last["alpha"],
            tok_fwd=last["best_tokens_per_forward"],
        ),
        progress=progress,
        log=log,
        unlogged="chains",
    )
    trainer.save(out_dir, extra)
    return trainer
