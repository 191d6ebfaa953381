"""The target's own completions of training prompts: self-distillation data.

The target answers each prompt (through its chat template) with mlx-lm's
``BatchGenerator``, greedily or sampled at a temperature, and at every
completion token we keep its top ``K`` next-token law (ids and
log-probabilities at temperature 1, best first). The tokens are what greedy
acceptance measures; the laws are the soft labels of distillation.

On disk the data is a folder of shards (``<name>-00000.npz``, ...) and a
manifest (``<name>.json``) of the settings and the target. A shard is
written atomically once its prompts are done and records a digest of what
it was made from, so an interrupted run continues where it stopped and a
longer prompt list (see :func:`mlx_spec.train.prompts.mixed_prompts`) only
adds shards; a manifest that disagrees with the requested settings is
refused rather than mixed.

Later kinds of drafter (draft heads) add what they need to these sequences,
e.g. the target's hidden states from one teacher-forced forward
(:func:`mlx_spec.train.head_data.teacher_data` takes ``tokens`` and
``starts`` as they are here).
"""

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from .prompts import Prompt

DEFAULT_TOP_K = 8
DEFAULT_MAX_TOKENS = 160
DEFAULT_BATCH_SIZE = 64
DEFAULT_SHARD_SIZE = 64
DEFAULT_SAMPLED_SHARE = 0.25
DEFAULT_SAMPLED_TEMP = 0.7
MANIFEST_FORMAT = "mlx-spec-completions"
MANIFEST_VERSION = 1


@dataclass
class Completions:
    """Sequences the target wrote, with its laws (numpy, host memory).

    Attributes:
        tokens: ``(T_i,)`` int32: the prompt (chat template applied), then
          the completion (ending with the stop token if it stopped).
        starts: Index of each sequence's first completion token.
        temps: Sampling temperature of each completion (``0`` = greedy).
        prompt_sets: The prompt set of each sequence.
        teacher_ids: ``(T_i - start_i, K)`` int32: row ``j`` holds the top-K
          of the target's law over completion token ``j``, best first.
        teacher_logp: ``(T_i - start_i, K)`` float16 their log-probabilities.
        seconds: Wall time spent generating them (summed over shards).
        prompt_ids: Optional ``(start_i - 1, K)`` int32: row ``p`` holds the
          top-K of the target's law over prompt token ``p + 1`` (from one
          teacher-forced forward, :func:`add_prompt_laws`); ``None`` if absent.
        prompt_logp: Optional ``(start_i - 1, K)`` float16 their log-probabilities.
    """

    tokens: List[np.ndarray] = field(default_factory=list)
    starts: List[int] = field(default_factory=list)
    temps: List[float] = field(default_factory=list)
    prompt_sets: List[str] = field(default_factory=list)
    teacher_ids: List[np.ndarray] = field(default_factory=list)
    teacher_logp: List[np.ndarray] = field(default_factory=list)
    seconds: float = 0.0
    prompt_ids: Optional[List[np.ndarray]] = None
    prompt_logp: Optional[List[np.ndarray]] = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def completion_tokens(self) -> int:
        return int(sum(len(t) - s for t, s in zip(self.tokens, self.starts)))

    @property
    def prompt_tokens(self) -> int:
        return int(sum(self.starts))

    def extend(self, other: "Completions"):
        has_laws = self.prompt_ids is not None or not self.tokens
        for name in _LISTS:
            getattr(self, name).extend(getattr(other, name))
        self.seconds += other.seconds
        if has_laws and other.prompt_ids is not None:
            self.prompt_ids = (self.prompt_ids or []) + list(other.prompt_ids)
            self.prompt_logp = (self.prompt_logp or []) + list(other.prompt_logp)
        else:
            self.prompt_ids = self.prompt_logp = None

    def subset(self, index: Sequence[int]) -> "Completions":
        lists = {name: [getattr(self, name)[i] for i in index] for name in _LISTS}
        if self.prompt_ids is not None:
            lists["prompt_ids"] = [self.prompt_ids[i] for i in index]
            lists["prompt_logp"] = [self.prompt_logp[i] for i in index]
        return Completions(**lists)

    def save(self, path, digest: str = ""):
        """One ``.npz`` file (sequences concatenated, with their lengths).

        ``digest`` names what the shard was made from (see :func:`shard_digest`).
        """
        lengths = np.array([len(t) for t in self.tokens], np.int64)
        np.savez(
            path,
            lengths=lengths,
            starts=np.array(self.starts, np.int64),
            temps=np.array(self.temps, np.float32),
            prompt_sets=np.array(self.prompt_sets, dtype=np.str_),
            tokens=np.concatenate(self.tokens).astype(np.int32),
            teacher_ids=np.concatenate(self.teacher_ids).astype(np.int32),
            teacher_logp=np.concatenate(self.teacher_logp).astype(np.float16),
            seconds=np.float64(self.seconds),
            digest=np.array(digest),
        )

    @classmethod
    def load(cls, path) -> "Completions":
        """A shard, with its prompt laws if a matching ``.laws.npz`` is beside it."""
        data = np.load(path)
        lengths = data["lengths"]
        starts = data["starts"]
        rows = lengths - starts
        tokens = np.split(data["tokens"], np.cumsum(lengths)[:-1])
        cuts = np.cumsum(rows)[:-1]
        out = cls(
            tokens,
            [int(s) for s in starts],
            [round(float(t), 6) for t in data["temps"]],
            [str(s) for s in data["prompt_sets"]],
            np.split(data["teacher_ids"], cuts),
            np.split(data["teacher_logp"], cuts),
            float(data["seconds"]) if "seconds" in data else 0.0,
        )
        laws = laws_path(path)
        digest = str(data["digest"]) if "digest" in data else None
        if laws.exists() and _stored_digest(laws) == digest:
            with np.load(laws) as extra:
                cuts = np.cumsum(np.maximum(starts - 1, 0))[:-1]
                out.prompt_ids = np.split(extra["prompt_ids"], cuts)
                out.prompt_logp = np.split(extra["prompt_logp"], cuts)
        return out


_LISTS = ("tokens", "starts", "temps", "prompt_sets", "teacher_ids", "teacher_logp")


def encode_prompt(tokenizer, prompt: Prompt) -> List[int]:
    """Token ids of ``prompt`` through the tokenizer's chat template."""
    messages = [dict(m) for m in prompt.messages]
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return list(tokenizer.encode(messages[-1]["content"]))


def sampled_temps(count: int, share: float, temp: float) -> List[float]:
    """``temp`` for an evenly spread ``share`` of ``count`` prompts, else ``0``."""
    return [
        temp if int((i + 1) * share) > int(i * share) else 0.0 for i in range(count)
    ]


def _top_k(logprobs: List[mx.array], k: int):
    """Top-``k`` ids and values of each row, best first: ``(n, k)`` numpy arrays."""
    return _top_k_rows(mx.stack(logprobs), k)


def _top_k_rows(lp: mx.array, k: int):
    """:func:`_top_k` of a ``(n, V)`` array of logits or log-probabilities."""
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    top = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(lp, top, axis=-1)
    order = mx.argsort(-values, axis=-1)
    top = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
    values = mx.take_along_axis(values, order, axis=-1).astype(mx.float16)
    mx.eval(top, values)
    return np.array(top), np.array(values)


def stream_completions(
    model,
    tokenizer,
    chunks: Sequence[Tuple[Sequence[Prompt], Sequence[float]]],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Optional[Callable[[int], None]] = None,
) -> Iterator[Tuple[int, Completions]]:
    """The target's completions of several chunks of prompts, by batched generation.

    All chunks share one ``BatchGenerator``, so the decode batch stays full
    across chunk boundaries (a chunk's last sequences do not decode alone).

    Args:
        model: The target (an mlx-lm model).
        tokenizer: Its tokenizer (mlx-lm ``TokenizerWrapper``).
        chunks: ``(prompts, temps)`` pairs; ``temps`` is each prompt's
          temperature (``0`` = greedy).
        max_tokens: Completion length limit.
        top_k: Size of the kept top of each law.
        batch_size: Sequences decoded together.
        progress: Called with the number of tokens of each generation step.

    Yields:
        ``(chunk index, Completions in the chunk's prompt order)``, as each
        chunk finishes.
    """
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    samplers = {}
    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
    )
    try:
        owner, ids, remaining = {}, [], []
        for c, (prompts, temps) in enumerate(chunks):
            ids.append([encode_prompt(tokenizer, p) for p in prompts])
            remaining.append(len(prompts))
            for t in temps:
                samplers.setdefault(t, make_sampler(temp=t))
            # Shortest first: prefill batches pad to their longest prompt.
            order = sorted(range(len(prompts)), key=lambda i: (len(ids[c][i]), i))
            uids = gen.insert(
                [ids[c][i] for i in order],
                [max_tokens] * len(order),
                samplers=[samplers[temps[i]] for i in order],
            )
            owner.update({u: (c, i) for u, i in zip(uids, order)})
        out = {u: ([], [], []) for u in owner}
        while responses := gen.next_generated():
            top, values = _top_k([r.logprobs for r in responses], top_k)
            for row, r in enumerate(responses):
                tokens, tops, vals = out[r.uid]
                tokens.append(r.token)
                tops.append(top[row])
                vals.append(values[row])
                if r.finish_reason is not None:
                    c = owner[r.uid][0]
                    remaining[c] -= 1
                    if remaining[c] == 0:
                        yield c, _assemble(chunks[c], ids[c], c, owner, out)
            if progress is not None:
                progress(len(responses))
    finally:
        gen.close()


def _assemble(chunk, ids, c, owner, out) -> Completions:
    prompts, temps = chunk
    by_index = {i: u for u, (cc, i) in owner.items() if cc == c}
    data = Completions()
    for i, (prompt, prompt_ids, temp) in enumerate(zip(prompts, ids, temps)):
        tokens, tops, vals = out.pop(by_index[i])
        data.tokens.append(np.array(prompt_ids + tokens, np.int32))
        data.starts.append(len(prompt_ids))
        data.temps.append(float(temp))
        data.prompt_sets.append(prompt.prompt_set)
        data.teacher_ids.append(np.stack(tops).astype(np.int32))
        data.teacher_logp.append(np.stack(vals).astype(np.float16))
    return data


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    temps: Sequence[float],
    **options,
) -> Completions:
    """The target's completions of ``prompts`` (see :func:`stream_completions`)."""
    for _, data in stream_completions(model, tokenizer, [(prompts, temps)], **options):
        return data
    return Completions()


def shard_digest(prompts: Sequence[Prompt], temps: Sequence[float], seed: int) -> str:
    """sha256 of what a shard is made from: its prompts, temperatures and seed."""
    h = hashlib.sha256(json.dumps([list(temps), seed]).encode())
    for p in prompts:
        h.update(json.dumps(p.as_dict(), sort_keys=True).encode("utf-8"))
    return h.hexdigest()


def _stored_digest(path: Path) -> Optional[str]:
    try:
        with np.load(path) as data:
            return str(data["digest"]) if "digest" in data else None
    except (OSError, ValueError):
        return None  # unreadable: made again


def laws_path(shard) -> Path:
    """Where a shard's prompt laws are kept (``<shard>.laws.npz``)."""
    shard = Path(shard)
    return shard.with_name(shard.name.replace(".npz", ".laws.npz"))


def prompt_laws(
    model,
    prompts: Sequence[np.ndarray],
    *,
    top_k: int = DEFAULT_TOP_K,
    batch_tokens: int = 2048,
    progress: Optional[Callable[[int], None]] = None,
) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The target's top-K laws over each prompt's tokens, by teacher forcing.

    Args:
        model: The target.
        prompts: Token ids of each prompt, ``(P_i,)``.
        top_k: Size of the kept top of each law.
        batch_tokens: Padded tokens per forward.
        progress: Called with the tokens of each forward.

    Returns:
        Per prompt ``(ids, logp)``, each ``(P_i - 1, K)``: the law over token
        ``p + 1`` at position ``p``, best first.
    """
    lengths = [len(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: lengths[i])
    out: List[Optional[Tuple[np.ndarray, np.ndarray]]] = [None] * len(prompts)
    batch: List[int] = []

    def run(batch):
        width = max(lengths[i] for i in batch)
        ids = np.zeros((len(batch), width), np.int32)
        for row, i in enumerate(batch):
            ids[row, : lengths[i]] = prompts[i]
        logits = model(mx.array(ids))
        rows = logits.reshape(-1, logits.shape[-1])
        top, values = _top_k_rows(rows, top_k)
        top = top.reshape(len(batch), width, top_k)
        values = values.reshape(len(batch), width, top_k)
        for row, i in enumerate(batch):
            n = max(lengths[i] - 1, 0)
            out[i] = (top[row, :n], values[row, :n])
        if progress is not None:
            progress(sum(lengths[i] for i in batch))
        mx.clear_cache()

    for i in order:
        if (
            batch
            and max(lengths[j] for j in batch + [i]) * (len(batch) + 1) > batch_tokens
        ):
            run(batch)
            batch = []
        batch.append(i)
    if batch:
        run(batch)
    return out


def add_prompt_laws(
    model,
    paths: Sequence[Path],
    *,
    top_k: int = DEFAULT_TOP_K,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
):
    """Write each shard's prompt laws (``.laws.npz``) where they are missing."""
    todo = []
    for path in paths:
        digest = _stored_digest(path)
        if _stored_digest(laws_path(path)) != digest:
            todo.append((path, digest))
    if not todo:
        return
    bar = None
    shards = [Completions.load(path) for path, _ in todo]
    if progress:
        from tqdm import tqdm

        total = sum(d.prompt_tokens for d in shards)
        bar = tqdm(total=total, desc="prompt laws", unit="tok")
    tic = time.perf_counter()
    for (path, digest), data in zip(todo, shards):
        prompts = [t[:s] for t, s in zip(data.tokens, data.starts)]
        laws = prompt_laws(
            model, prompts, top_k=top_k, progress=bar.update if bar else None
        )
        tmp = laws_path(path).with_suffix(".tmp.npz")
        np.savez(
            tmp,
            prompt_ids=np.concatenate([l[0] for l in laws]).astype(np.int32),
            prompt_logp=np.concatenate([l[1] for l in laws]).astype(np.float16),
            digest=np.array(digest),
        )
        tmp.replace(laws_path(path))
    if bar is not None:
        bar.close()
    if log is not None:
        log(f"prompt laws of {len(todo)} shards in {time.perf_counter() - tic:.0f} s")


def build_completions(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    folder,
    name: str,
    *,
    sampled_share: float = DEFAULT_SAMPLED_SHARE,
    sampled_temp: float = DEFAULT_SAMPLED_TEMP,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = DEFAULT_BATCH_SIZE,
    shard_size: int = DEFAULT_SHARD_SIZE,
    seed: int = 0,
    target: Optional[Dict] = None,
    with_prompt_laws: bool = False,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
) -> Completions:
    """Generate (or resume) the completions of ``prompts`` into ``folder``.

    Args:
        model, tokenizer: The target.
        prompts: The prompts, in a fixed order.
        folder: Where the shards and the manifest go (created if needed).
        name: Prefix of the files (``"train"``, ``"heldout"``).
        sampled_share: Share of prompts answered at ``sampled_temp``.
        sampled_temp: Temperature of the sampled completions. Default: ``0.7``.
        max_tokens, top_k, batch_size: See :func:`generate_completions`.
        shard_size: Prompts per shard (the unit of resumption).
        seed: Seed of the sampled completions (shard ``i`` uses ``seed + i``).
        target: A record of the target (e.g. its fingerprint) for the manifest.
        with_prompt_laws: Also keep the target's laws over the prompt tokens
          (one teacher-forced forward per shard, :func:`add_prompt_laws`).
        progress: Show a progress bar (tqdm).
        log: Called with one line per finished shard.

    Returns:
        All the completions, read back from the shards.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    temps = sampled_temps(len(prompts), sampled_share, sampled_temp)
    settings = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "sampled_share": sampled_share,
        "sampled_temp": sampled_temp,
        "max_tokens": max_tokens,
        "top_k": top_k,
        "shard_size": shard_size,
        "target": target,
    }
    _check_manifest(folder / f"{name}.json", settings)
    shards = range(0, len(prompts), shard_size)
    paths = [folder / f"{name}-{i // shard_size:05d}.npz" for i in shards]
    # A shard is kept if it was made from the same prompts (a longer prompt
    # list only adds shards; a changed last shard is made again).
    digests = [
        shard_digest(
            prompts[i : i + shard_size],
            temps[i : i + shard_size],
            seed + i // shard_size,
        )
        for i in shards
    ]
    todo = [
        (i, p, d)
        for i, p, d in zip(shards, paths, digests)
        if not p.exists() or _stored_digest(p) != d
    ]
    bar = None
    if progress and todo:
        from tqdm import tqdm

        done = len(prompts) - sum(len(prompts[i : i + shard_size]) for i, _, _ in todo)
        bar = tqdm(
            total=len(prompts), initial=done, desc=f"generate {name}", unit="prompt"
        )
    tokens_made, tic = 0, time.perf_counter()

    def count(n):
        nonlocal tokens_made
        tokens_made += n
        if bar is not None:
            rate = tokens_made / (time.perf_counter() - tic)
            bar.set_postfix(tok_s=round(rate, 1), refresh=False)

    if todo:
        # One generator for every missing shard; shard i's sampled completions
        # depend on the seed and on which shards are generated together.
        mx.random.seed(seed + todo[0][0] // shard_size)
    chunks = [
        (prompts[i : i + shard_size], temps[i : i + shard_size]) for i, _, _ in todo
    ]
    started = time.perf_counter()
    stream = stream_completions(
        model,
        tokenizer,
        chunks,
        max_tokens=max_tokens,
        top_k=top_k,
        batch_size=batch_size,
        progress=count,
    )
    for c, data in stream:
        _, path, digest = todo[c]
        now = time.perf_counter()
        data.seconds, started = now - started, now
        tmp = path.with_suffix(".tmp.npz")
        data.save(tmp, digest)
        tmp.replace(path)
        if bar is not None:
            bar.update(len(chunks[c][0]))
        if log is not None:
            log(
                f"{path.name}: {len(chunks[c][0])} prompts, {data.completion_tokens} "
                f"tokens, {tokens_made / (time.perf_counter() - tic):.1f} tok/s"
            )
    if bar is not None:
        bar.close()
    if with_prompt_laws:
        add_prompt_laws(model, paths, top_k=top_k, progress=progress, log=log)
    data = Completions()
    for path in paths:
        data.extend(Completions.load(path))
    return data


def _check_manifest(path: Path, settings: Dict):
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        differ = [k for k in settings if saved.get(k) != settings[k]]
        if differ:
            raise ValueError(
                f"the completions in '{path.parent}' were made with other "
                f"{', '.join(differ)}; delete that folder or use the same options "
                "and target."
            )
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_completions(folder, name: str) -> Completions:
    """Every shard of ``name`` in ``folder``, in order."""
    data = Completions()
    for path in sorted(Path(folder).glob(f"{name}-[0-9]*.npz")):
        if ".tmp" not in path.name:
            data.extend(Completions.load(path))
    return data
