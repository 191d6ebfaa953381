"""Grow a corpus: the target answers new prompts, by continuous batching, into new shards.

The target writes by continuous batching in lanes (:mod:`.lanes`): rows
that finish make room for new prompts, so long answers do not idle the
batch, and rows of different ages do not pad each other. Only token ids are kept, so nothing else is asked of the
model. Finished sequences are written as one new shard every
``shard_seconds`` (atomically: a kill loses only what was not yet written),
so a long run in the background adds shards as it goes and a new run
continues after the prompts already stored.

Prompts come from :func:`mlx_spec.train.corpus_prompts.prompt_stream`, plus
follow-ups to the corpus's own finished conversations (``multiturn``) and
requests the target writes itself (``self``).
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from .corpus import Corpus, CorpusFull, Record, prompt_hash
from .corpus_prompts import (
    follow_up_text,
    is_code_family,
    prompt_stream,
    source_split,
    turn_suffix,
)
from .lanes import LaneDecoder
from .prompt import Prompt, split_of

DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_TOKENS = 512
DEFAULT_SHARD_SECONDS = 600.0
# Temperatures and their shares; 0 is greedy.
DEFAULT_TEMPS = {0.0: 0.6, 0.7: 0.3, 1.0: 0.1}
# Share of follow-ups (multiturn) among the prompts of a run.
DEFAULT_FOLLOW_UP_SHARE = 0.15
# Turns a conversation may reach through follow-ups.
MAX_TURNS = 3
MIN_PARENT_TOKENS = 8
# Fewest finished sequences in a shard written on time (the last one of a run
# may hold fewer): the first rows of a run finish one by one.
MIN_SHARD_SEQUENCES = 16
# Rows waiting to enter the batch, as a multiple of the batch size.
QUEUE_FACTOR = 2


@dataclass
class Job:
    """A prompt to answer: its ids and what is stored with them."""

    ids: List[int]
    prompt_set: str
    hash: int
    heldout: bool
    temp: float
    turns: int = 1


def temp_of(hash_: int, temps: Dict[float, float]) -> float:
    """A prompt's sampling temperature, fixed by its hash (shares ``temps``)."""
    u = random.Random(hash_).random() * sum(temps.values())
    for temp, share in sorted(temps.items()):
        if u < share:
            return float(temp)
        u -= share
    return float(max(temps))


def encode_messages(tokenizer, messages) -> List[int]:
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True
            )
        )
    return list(tokenizer.encode(messages[-1]["content"]))


def template_jobs(
    tokenizer, prompts: Sequence[Prompt], known: set, temps: Dict[float, float]
) -> Iterator[Job]:
    """Jobs of the prompts not yet in the corpus (``known``: stored hashes)."""
    for p in prompts:
        h = prompt_hash(p.messages)
        if h in known:
            continue
        source = p.source or p.text
        yield Job(
            encode_messages(tokenizer, p.messages),
            p.prompt_set,
            h,
            source_split(source),
            temp_of(h, temps),
        )


def follow_up_jobs(
    tokenizer, corpus: Corpus, known: set, temps: Dict[float, float]
) -> List[Job]:
    """A follow-up request to each finished stored conversation not yet followed.

    The new prompt is the stored prompt and completion, then the template's
    next user turn: the conversation exactly as a chat would send it back.
    Its split is its parent's.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    between, after = turn_suffix(tokenizer)
    jobs = []
    stops = set(int(t) for t in tokenizer.eos_token_ids)
    for shard in corpus.shards():
        turns = shard.meta.get("turns", {})
        for seq in shard.sequences():
            depth = int(turns.get(str(seq.hash), 1))
            if not seq.stopped or depth >= MAX_TURNS:
                continue
            if len(seq.completion) < MIN_PARENT_TOKENS:
                continue
            text = follow_up_text(seq.hash, is_code_family(seq.prompt_set))
            h = prompt_hash(
                [
                    {"role": "parent", "content": str(seq.hash)},
                    {"role": "user", "content": text},
                ]
            )
            if h in known:
                continue
            answer = [int(t) for t in seq.completion if int(t) not in stops]
            suffix = tokenizer.encode(between + text + after, add_special_tokens=False)
            ids = [int(t) for t in seq.prompt] + answer + list(suffix)
            jobs.append(
                Job(ids, "multiturn", h, seq.heldout, temp_of(h, temps), depth + 1)
            )
    return jobs


def self_jobs(
    model, tokenizer, count: int, known: set, temps: Dict[float, float], seed: int
) -> List[Job]:
    """``count`` requests the target writes itself (see :mod:`.self_instruct`)."""
    if count <= 0:
        return []
    import mlx.core as mx

    from .self_instruct import sample_requests

    mx.random.seed(seed)
    jobs = []
    for text in sample_requests(model, tokenizer, count):
        messages = ({"role": "user", "content": text},)
        h = prompt_hash(messages)
        if h not in known:
            ids = encode_messages(tokenizer, messages)
            heldout = split_of(text) == "heldout"
            jobs.append(Job(ids, "self", h, heldout, temp_of(h, temps)))
    return jobs


def interleave(
    first: Iterable[Job], second: Sequence[Job], share: float
) -> Iterator[Job]:
    """``second`` spread evenly through ``first`` at ``share`` of the total, then the rest."""
    j = 0
    for i, job in enumerate(first):
        while j < len(second) and (j + 1) * (1 - share) <= (i + 1) * share:
            yield second[j]
            j += 1
        yield job
    yield from second[j:]


class Grower:
    """Answer jobs by continuous batching and write a shard every ``shard_seconds``.

    Args:
        model, tokenizer: The target.
        corpus: Where the shards go (its manifest already written).
        batch_size: Rows decoded together.
        max_tokens: Longest completion.
        shard_seconds: Seconds between shards.
        min_shard_sequences: Fewest finished sequences in a shard written on
          time (a run's last shard may hold fewer).
        run: This run's name (stored in each shard).
        log: Called with one line per shard.
    """

    def __init__(
        self,
        model,
        tokenizer,
        corpus: Corpus,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        shard_seconds: float = DEFAULT_SHARD_SECONDS,
        min_shard_sequences: int = MIN_SHARD_SEQUENCES,
        run: str = "",
        log: Callable[[str], None] = print,
    ):
        self.model, self.tokenizer, self.corpus = model, tokenizer, corpus
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.shard_seconds, self.run, self.log = shard_seconds, run, log
        self.min_shard_sequences = min_shard_sequences
        self.done: List[Record] = []
        self.turns: Dict[str, int] = {}
        self.made = 0  # completion tokens written to shards by this run
        self.decoded = 0  # tokens decoded since the last shard, unfinished rows too
        self.started = time.perf_counter()
        self.last_shard = self.started
        # This process's CPU time: a paused or crowded run's rate stays readable.
        self.last_cpu = time.process_time()

    def grow(self, jobs: Iterator[Job], tokens: Optional[int] = None) -> int:
        """Answer ``jobs`` until they run out or ``tokens`` completion tokens are stored.

        Returns:
            Completion tokens stored by this call.
        """
        stop_set = {int(t) for t in self.tokenizer.eos_token_ids}
        gen = LaneDecoder(self.model, self.batch_size, stop_set)
        live: Dict[int, Job] = {}
        out: Dict[int, List[int]] = {}
        jobs = iter(jobs)
        exhausted = False
        pending_tokens = 0
        try:
            while True:
                goal_met = tokens is not None and self.made + pending_tokens >= tokens
                while (
                    not exhausted
                    and not goal_met
                    and len(live) < QUEUE_FACTOR * self.batch_size
                ):
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    uid = gen.insert(job.ids, self.max_tokens, job.temp)
                    live[uid], out[uid] = job, []
                if not live:
                    break
                responses = gen.next_generated() or []
                self.decoded += len(responses)
                for r in responses:
                    out[r.uid].append(int(r.token))
                    if r.finish_reason is None:
                        continue
                    job = live.pop(r.uid)
                    completion = out.pop(r.uid)
                    self._finish(job, completion, completion[-1] in stop_set)
                    pending_tokens += len(completion)
                due = time.perf_counter() - self.last_shard >= self.shard_seconds
                if due and len(self.done) >= self.min_shard_sequences:
                    self.made += self.flush()
                    pending_tokens = 0
        except KeyboardInterrupt:  # keep what is finished, then stop
            self.made += self.flush()
            raise
        finally:
            gen.close()
        self.made += self.flush()
        return self.made

    def _finish(self, job: Job, completion: List[int], stopped: bool):
        self.done.append(
            Record(
                prompt=np.array(job.ids, np.uint16),
                completion=np.array(completion, np.uint16),
                temp=job.temp,
                prompt_set=job.prompt_set,
                hash=job.hash,
                heldout=job.heldout,
                stopped=stopped,
            )
        )
        if job.turns > 1:
            self.turns[str(job.hash)] = job.turns

    def flush(self) -> int:
        """Write the finished sequences as one shard; return their completion tokens."""
        if not self.done:
            return 0
        now, cpu = time.perf_counter(), time.process_time()
        tokens = sum(len(r.completion) for r in self.done)
        meta = {
            "run": self.run,
            "seconds": round(now - self.last_shard, 2),
            "cpu_seconds": round(cpu - self.last_cpu, 2),
            "decoded_tokens": self.decoded,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "written": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "turns": {h: t for h, t in self.turns.items()},
        }
        try:
            path = self.corpus.append(self.done, meta)
        except CorpusFull:
            self.done, self.turns = [], {}
            raise
        except ValueError:  # every sequence was already stored
            self.done, self.turns = [], {}
            self.last_shard, self.last_cpu = now, cpu
            return 0
        rate = self.decoded / max(now - self.last_shard, 1e-9) * 3600
        self.log(
            f"{path.name}: {len(self.done)} sequences, {tokens} completion tokens; "
            f"decoding {rate:,.0f} tokens/hour"
        )
        self.done, self.turns, self.decoded = [], {}, 0
        self.last_shard, self.last_cpu = now, cpu
        return tokens


def measure_batch(
    model,
    tokenizer,
    prompts: Sequence[List[int]],
    batch_size: int,
    seconds: float,
    *,
    warmup: float = 0.0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temps: Dict[float, float] = DEFAULT_TEMPS,
    clock: Callable[[], float] = time.perf_counter,
) -> Dict:
    """Speed of the grow's own decoding at ``batch_size``: ``prompts`` (cycled)
    are answered as ``grow`` answers them, finished rows are replaced at once,
    and the timer runs for ``seconds`` once every row of the first batch is
    decoding and ``warmup`` seconds have passed. Prefills of the rows that
    join are timed too.

    ``clock`` gives wall time in seconds.

    Returns:
        ``batch_size``, ``tokens`` (completion tokens decoded while timed),
        ``seconds``, ``tokens_per_s`` (wall) and ``tokens_per_cpu_s`` (per
        second of this process's CPU time, which a shared machine disturbs
        less).
    """
    gen = LaneDecoder(model, batch_size, set(int(t) for t in tokenizer.eos_token_ids))
    feed = itertools.cycle(enumerate(prompts))

    def step() -> int:
        while len(gen.queue) + gen.live < QUEUE_FACTOR * batch_size:
            i, ids = next(feed)
            gen.insert(ids, max_tokens, temp_of(i, temps))
        return len(gen.next_generated())

    try:
        start = clock()
        step()  # the first batch prefilled and decoding
        while clock() - start < warmup:
            step()
        tokens, tic, cpu = 0, clock(), time.process_time()
        while clock() - tic < seconds:
            tokens += step()
        wall, cpu = clock() - tic, time.process_time() - cpu
    finally:
        gen.close()
    return {
        "batch_size": batch_size,
        "tokens": tokens,
        "seconds": round(wall, 1),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens_per_cpu_s": round(tokens / max(cpu, 1e-9), 1),
    }


def best_batch(rows: Sequence[Dict]) -> int:
    """The batch size of the most tokens per CPU second."""
    return max(rows, key=lambda r: r["tokens_per_cpu_s"])["batch_size"]
