"""Decoding lanes for the corpus: rows that start together decode together.

mlx-lm's ``BatchGenerator`` keeps every row in one padded cache. A row that
joins is left-padded to the longest live row, every row attends over that
width, and each join or finish copies the whole cache. The corpus's answers
run from 1 to 512 tokens. So at batch 64 that width is mostly padding: a
mean of about 925 slots for rows of about 300 tokens. One such copy of a
30-layer cache at 64 rows took 0.95 s on a CPU, about one decoding step.

Here rows are admitted in groups of similar prompt length, and each group is
a *lane* with its own cache. A lane never takes new rows, so its width is its
own rows' length. Finished rows stay in place until enough of them have
finished, and then one ``filter`` removes them all. When there are too many
lanes, the two oldest are merged; their rows are the long-running ones.

Each prompt is prefilled alone in the model's own caches, and a lane's rows
are joined by the caches' own ``merge`` into mlx-lm's batch caches. So no
padding is ever computed, and any model that mlx-lm batches decodes here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Set, Tuple

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_top_p

# Fewest free rows that open a new lane, as a share of the batch size.
LANE_SHARE = 0.25
MAX_LANES = 4
# Rows of a lane that may have finished before it is compacted: this share of
# its rows, or any after this many steps.
DEAD_SHARE = 0.25
COMPACT_STEPS = 16
PREFILL_STEP = 512


class Token(NamedTuple):
    """One decoded token of row ``uid``; ``finish_reason``: ``None``, ``"stop"`` or ``"length"``."""

    uid: int
    token: int
    finish_reason: Optional[str]


@dataclass
class Row:
    uid: int
    ids: List[int]
    max_tokens: int
    temp: float
    top_p: float = 1.0
    made: int = 0
    done: bool = False


@dataclass
class Lane:
    """Rows decoding together.

    Attributes:
        rows: The rows, finished ones too until the next compaction.
        cache: The model's layer caches, batch ``len(rows)``.
        tokens: ``(len(rows),)`` each row's next input token.
        temps: ``(len(rows),)`` float32 sampling temperatures (0: greedy).
        top_ps: ``(len(rows),)`` float32 nucleus masses (1: the whole vocabulary).
    """

    rows: List[Row]
    cache: list
    tokens: mx.array
    temps: mx.array
    top_ps: mx.array
    since_compact: int = field(default=0)

    @property
    def dead(self) -> int:
        return sum(r.done for r in self.rows)

    @property
    def nucleus(self) -> Optional[mx.array]:
        """``top_ps`` if a row samples from a nucleus, else None (nothing to filter)."""
        return self.top_ps if any(r.top_p < 1 for r in self.rows) else None


def sample_rows(
    logits: mx.array, temps: mx.array, top_ps: Optional[mx.array] = None
) -> mx.array:
    """One token per row: argmax where ``temps`` is 0, else a draw from
    ``softmax(logits / temp)`` over the row's nucleus: the fewest most likely
    tokens of ``softmax(logits)`` holding ``top_p`` of its mass (mlx-lm's
    ``make_sampler(temp, top_p)`` law; ``top_p`` 1 keeps every token).

    Args:
        logits: ``(n, V)``.
        temps: ``(n,)``.
        top_ps: ``(n,)`` in ``(0, 1]``, or None: every row keeps every token
          (and no sort is done).

    Returns:
        ``(n,)`` token ids.
    """
    greedy = mx.argmax(logits, axis=-1)
    if top_ps is not None:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        kept = apply_top_p(logprobs, top_ps[:, None])
        # At 1 mlx-lm's filter would drop tail tokens by float rounding.
        logits = mx.where(top_ps[:, None] < 1, kept, logprobs)
    scale = 1.0 / mx.maximum(temps, 1e-6)
    hot = mx.random.categorical(logits * scale[:, None])
    return mx.where(temps > 0, hot, greedy)


def prefill_alone(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    step_size: int = PREFILL_STEP,
    forward: Optional[Callable[[mx.array, List[Any]], Tuple[Any, ...]]] = None,
    on_chunk: Optional[Callable[[int, Tuple[Any, ...]], None]] = None,
) -> List[Any]:
    """Prefill each prompt alone in its own prompt cache, then join the caches.

    A prompt read alone computes no padding, so its cache (and whatever
    ``forward`` returns) is exactly that of the prompt by itself. The rows'
    caches are joined by their own ``merge`` into mlx-lm's batch caches.

    Args:
        model: An mlx-lm model.
        prompts: Token ids of each row; an empty prompt leaves its row's
          cache empty.
        step_size: Most tokens per forward. Default: ``512``.
        forward: ``forward(tokens, cache) -> outputs`` feeds one chunk,
          ``tokens`` of shape ``(1, l)``, ``l <= step_size``, into ``cache``;
          ``outputs`` (a tuple of arrays, ``None`` among them allowed) is
          evaluated with the cache. Default: the model's call, returning
          ``()`` (the logits are never computed).
        on_chunk: ``on_chunk(row, outputs)``, called after each chunk is
          evaluated, with ``row`` the index of its prompt.

    Returns:
        The batch cache, one per layer: batch ``len(prompts)``, row ``i``
        holding ``prompts[i]``.
    """

    def feed(tokens, cache):  # the cache is all that is kept
        model(tokens, cache=cache)
        return ()

    forward = forward or feed
    per_row = []
    for row, ids in enumerate(prompts):
        cache = make_prompt_cache(model)
        prompt = mx.array(ids)[None]
        for start in range(0, prompt.shape[1], step_size):
            outputs = forward(prompt[:, start : start + step_size], cache)
            mx.eval(outputs, [c.state for c in cache])
            if on_chunk is not None:
                on_chunk(row, outputs)
        per_row.append(cache)
    joined = [
        per_row[0][i].merge([c[i] for c in per_row]) for i in range(len(per_row[0]))
    ]
    mx.eval([c.state for c in joined])
    mx.clear_cache()
    return joined


def pick_window(lengths: Sequence[int], oldest: int, size: int) -> List[int]:
    """Indices of ``size`` rows of the closest lengths, ``oldest`` among them.

    Keeping the oldest queued row in the window means that every row is
    admitted at last, whatever its length.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    at = order.index(oldest)
    starts = range(max(0, at - size + 1), min(at, len(order) - size) + 1)
    best = min(starts, key=lambda s: lengths[order[s + size - 1]] - lengths[order[s]])
    return order[best : best + size]


class LaneDecoder:
    """Continuous batching by lanes: ``insert`` rows, call ``next_generated``.

    Args:
        model: The target.
        batch_size: Most rows decoding at once, over all lanes.
        stop_tokens: Ids that end a row (kept as its last token).
        lane_size: Fewest free rows that open a new lane (default: a quarter
          of the batch).
        max_lanes: Lanes decoding at once; the two oldest merge beyond it.
    """

    def __init__(
        self,
        model,
        batch_size: int,
        stop_tokens: Set[int],
        lane_size: Optional[int] = None,
        max_lanes: int = MAX_LANES,
        prefill_step: int = PREFILL_STEP,
    ):
        if batch_size < 1 or max_lanes < 2:
            raise ValueError("a lane decoder needs batch_size >= 1 and max_lanes >= 2.")
        self.model, self.batch_size = model, batch_size
        self.stop_tokens = set(int(t) for t in stop_tokens)
        self.lane_size = lane_size or max(1, round(batch_size * LANE_SHARE))
        self.max_lanes, self.prefill_step = max_lanes, prefill_step
        self.queue: List[Row] = []
        self.lanes: List[Lane] = []
        self._uids = 0

    def insert(
        self, ids: Sequence[int], max_tokens: int, temp: float, top_p: float = 1.0
    ) -> int:
        """Queue a prompt; return its uid. Its tokens are drawn at ``temp``
        from its ``top_p`` nucleus (:func:`sample_rows`)."""
        if not ids or max_tokens < 1:
            raise ValueError("a row needs a prompt and max_tokens >= 1.")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        self._uids += 1
        row = Row(self._uids, list(ids), max_tokens, float(temp), float(top_p))
        self.queue.append(row)
        return self._uids

    @property
    def live(self) -> int:
        return sum(len(lane.rows) - lane.dead for lane in self.lanes)

    def next_generated(self) -> List[Token]:
        """Decode one token for every live row (admitting rows first)."""
        self._admit()
        if not self.lanes:
            return []
        for lane in self.lanes:
            logits = self.model(lane.tokens[:, None], cache=lane.cache)[:, -1, :]
            lane.tokens = sample_rows(logits, lane.temps, lane.nucleus)
        mx.eval([lane.tokens for lane in self.lanes])
        out = []
        for lane in self.lanes:
            for row, token in zip(lane.rows, lane.tokens.tolist()):
                if row.done:
                    continue
                row.made += 1
                reason = None
                if token in self.stop_tokens:
                    reason = "stop"
                elif row.made >= row.max_tokens:
                    reason = "length"
                row.done = reason is not None
                out.append(Token(row.uid, token, reason))
        self._compact()
        return out

    def close(self):
        self.lanes, self.queue = [], []
        mx.clear_cache()

    def _admit(self):
        free = self.batch_size - self.live
        want = min(free, len(self.queue))
        if want < 1 or (want < self.lane_size and self.live and want < len(self.queue)):
            return
        if len(self.lanes) >= self.max_lanes:
            self._merge_oldest()
        lengths = [len(r.ids) for r in self.queue]
        oldest = min(range(len(self.queue)), key=lambda i: self.queue[i].uid)
        chosen = set(pick_window(lengths, oldest, want))
        rows = [r for i, r in enumerate(self.queue) if i in chosen]
        self.queue = [r for i, r in enumerate(self.queue) if i not in chosen]
        self.lanes.append(self._prefill(rows))

    def _prefill(self, rows: List[Row]) -> Lane:
        """A lane of ``rows`` with all but each prompt's last token in its cache.

        Each prompt is prefilled alone (:func:`prefill_alone`): on a CPU as
        fast per token as a batch, and no padding is computed.
        """
        joined = prefill_alone(
            self.model, [r.ids[:-1] for r in rows], step_size=self.prefill_step
        )
        return Lane(
            rows,
            joined,
            mx.array([r.ids[-1] for r in rows]),
            mx.array([r.temp for r in rows], mx.float32),
            mx.array([r.top_p for r in rows], mx.float32),
        )

    def _compact(self):
        """Drop finished lanes; filter the finished rows out of the others now and then."""
        kept = []
        for lane in self.lanes:
            lane.since_compact += 1
            dead = lane.dead
            if dead == len(lane.rows):
                continue
            if dead and (
                dead >= DEAD_SHARE * len(lane.rows)
                or lane.since_compact >= COMPACT_STEPS
            ):
                _filter(lane)
            kept.append(lane)
        if len(kept) < len(self.lanes):
            mx.clear_cache()
        self.lanes = kept

    def _merge_oldest(self):
        first, second = self.lanes[0], self.lanes[1]
        for lane in (first, second):
            if lane.dead:
                _filter(lane)
        for a, b in zip(first.cache, second.cache):
            a.extend(b)
        first.rows += second.rows
        first.tokens = mx.concatenate([first.tokens, second.tokens])
        first.temps = mx.concatenate([first.temps, second.temps])
        first.top_ps = mx.concatenate([first.top_ps, second.top_ps])
        del self.lanes[1]


def _filter(lane: Lane):
    keep = [i for i, r in enumerate(lane.rows) if not r.done]
    for c in lane.cache:
        c.filter(keep)
    index = mx.array(keep)
    lane.rows = [lane.rows[i] for i in keep]
    lane.tokens, lane.temps = lane.tokens[index], lane.temps[index]
    lane.top_ps = lane.top_ps[index]
    lane.since_compact = 0
