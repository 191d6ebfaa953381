"""The target's own completions of training prompts: self-distillation data.

The target answers each prompt (through its chat template), greedily or
sampled at a temperature, in batches. At every position of every sequence,
prompt and completion alike, we keep what a drafter learns from:

- the target's top ``K`` law of the next token (ids and log-probabilities at
  temperature 1, best first): the soft labels of distillation;
- the target's features there (:mod:`mlx_spec.features`, by default the
  final hidden state), stored as float16: what draft heads read.

Both come from the forwards that generate the text, so no second pass of
the target is needed. The loop is mlx-lm's batched decoding taken apart:
each prompt is prefilled alone and the caches are joined into one batch
cache (:func:`mlx_spec.train.lanes.prefill_alone`: exact laws and features
without padding), rows that finish leave it with ``filter``, and each row
samples at its own temperature. mlx-lm's ``BatchGenerator``
returns neither hidden states nor prompt logits, so it is not used here.

On disk the data is a folder of shards (``<name>-00000.npz``, ...) and a
manifest (``<name>.json``) of the settings and the target. A shard is
written atomically once its prompts are done and records a digest of what
it was made from, so an interrupted run continues where it stopped and a
longer prompt list (see :func:`mlx_spec.train.prompts.mixed_prompts`) only
adds shards; a manifest that disagrees with the requested settings is
refused rather than mixed.
"""

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from ..features import FINAL, FeatureCapture, maybe_capturing
from .lanes import prefill_alone
from .prompt import Prompt

DEFAULT_TOP_K = 8
DEFAULT_MAX_TOKENS = 160
DEFAULT_BATCH_SIZE = 64
DEFAULT_SHARD_SIZE = 256
DEFAULT_SAMPLED_SHARE = 0.25
DEFAULT_SAMPLED_TEMP = 0.7
DEFAULT_FEATURE_LAYERS = (FINAL,)
MANIFEST_FORMAT = "mlx-spec-completions"
MANIFEST_VERSION = 2


@dataclass
class Completions:
    """Sequences the target wrote, with its laws and features (numpy, host memory).

    Attributes:
        tokens: ``(T_i,)`` int32: the prompt (chat template applied), then
          the completion (ending with the stop token if it stopped).
        starts: Index of each sequence's first completion token.
        temps: Sampling temperature of each completion (``0`` = greedy).
        prompt_sets: The prompt set of each sequence.
        law_ids: ``(T_i, K)`` int32: row ``t`` holds the top-K of the
          target's law over token ``t + 1``, best first (the last row is the
          law after the sequence). ``K = 0``: no laws, the written tokens
          alone (``--labels written``).
        law_logp: ``(T_i, K)`` float16 their log-probabilities.
        features: ``(T_i, F)`` float16 target features at each position, or
          ``None`` if not kept.
        feature_layers: The feature layers of ``features`` (see
          :mod:`mlx_spec.features`).
        seconds: Wall time spent generating them (summed over shards).
    """

    tokens: List[np.ndarray] = field(default_factory=list)
    starts: List[int] = field(default_factory=list)
    temps: List[float] = field(default_factory=list)
    prompt_sets: List[str] = field(default_factory=list)
    law_ids: List[np.ndarray] = field(default_factory=list)
    law_logp: List[np.ndarray] = field(default_factory=list)
    features: Optional[List[np.ndarray]] = None
    feature_layers: Tuple[int, ...] = ()
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def completion_tokens(self) -> int:
        return int(sum(len(t) - s for t, s in zip(self.tokens, self.starts)))

    @property
    def prompt_tokens(self) -> int:
        return int(sum(self.starts))

    # Views by part: the laws over completion tokens, and over prompt tokens.
    @property
    def teacher_ids(self) -> List[np.ndarray]:
        """``(T_i - start_i, K)``: row ``j`` is the law over completion token ``j``."""
        return [ids[s - 1 : len(t) - 1] for ids, s, t in self._rows(self.law_ids)]

    @property
    def teacher_logp(self) -> List[np.ndarray]:
        return [lp[s - 1 : len(t) - 1] for lp, s, t in self._rows(self.law_logp)]

    @property
    def prompt_ids(self) -> List[np.ndarray]:
        """``(start_i - 1, K)``: row ``p`` is the law over prompt token ``p + 1``."""
        return [ids[: s - 1] for ids, s, _ in self._rows(self.law_ids)]

    def _rows(self, laws):
        return zip(laws, self.starts, self.tokens)

    def extend(self, other: "Completions"):
        first = not self.tokens
        has_features = first or self.features is not None
        same = first or self.feature_layers == other.feature_layers
        for name in _LISTS:
            getattr(self, name).extend(getattr(other, name))
        self.seconds += other.seconds
        if has_features and same and other.features is not None:
            self.features = (self.features or []) + list(other.features)
            self.feature_layers = other.feature_layers
        else:
            self.features = None
            self.feature_layers = ()

    def with_features(self, layers: Sequence[int]) -> Optional["Completions"]:
        """The same sequences whose features are only ``layers``, in that order.

        Returns ``None`` when a layer was not kept (or no features were).
        """
        layers = tuple(int(i) for i in layers)
        if layers == self.feature_layers:
            return self
        if self.features is None or not set(layers) <= set(self.feature_layers):
            return None
        width = self.features[0].shape[1] // len(self.feature_layers)
        columns = np.concatenate(
            [
                np.arange(width) + width * self.feature_layers.index(layer)
                for layer in layers
            ]
        )
        lists = {name: getattr(self, name) for name in _LISTS}
        features = [f[:, columns] for f in self.features]
        return Completions(**lists, features=features, feature_layers=layers)

    def subset(self, index: Sequence[int]) -> "Completions":
        lists = {name: [getattr(self, name)[i] for i in index] for name in _LISTS}
        if self.features is not None:
            lists["features"] = [self.features[i] for i in index]
            lists["feature_layers"] = self.feature_layers
        return Completions(**lists)

    def save(self, path, digest: str = ""):
        """One ``.npz`` file (sequences concatenated, with their lengths).

        ``digest`` names what the shard was made from (see :func:`shard_digest`).
        """
        extra = {}
        if self.features is not None:
            extra["features"] = np.concatenate(self.features).astype(np.float16)
            extra["feature_layers"] = np.array(self.feature_layers, np.int64)
        np.savez(
            path,
            lengths=np.array([len(t) for t in self.tokens], np.int64),
            starts=np.array(self.starts, np.int64),
            temps=np.array(self.temps, np.float32),
            prompt_sets=np.array(self.prompt_sets, dtype=np.str_),
            tokens=np.concatenate(self.tokens).astype(np.int32),
            law_ids=np.concatenate(self.law_ids).astype(np.int32),
            law_logp=np.concatenate(self.law_logp).astype(np.float16),
            seconds=np.float64(self.seconds),
            digest=np.array(digest),
            **extra,
        )

    @classmethod
    def load(cls, path, features: bool = True) -> "Completions":
        """A shard (its features too, if it has them and ``features``)."""
        with np.load(path) as data:
            cuts = np.cumsum(data["lengths"])[:-1]

            def split(name):
                return np.split(data[name], cuts)

            kept = features and "features" in data
            return cls(
                split("tokens"),
                [int(s) for s in data["starts"]],
                [round(float(t), 6) for t in data["temps"]],
                [str(s) for s in data["prompt_sets"]],
                split("law_ids"),
                split("law_logp"),
                split("features") if kept else None,
                tuple(int(i) for i in data["feature_layers"]) if kept else (),
                float(data["seconds"]),
            )


_LISTS = ("tokens", "starts", "temps", "prompt_sets", "law_ids", "law_logp")


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


def top_laws(logits: mx.array, k: int) -> Tuple[mx.array, mx.array]:
    """Top-``k`` ids (int32) and log-probabilities (float16), best first, of ``(..., V)`` logits."""
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    top = mx.argpartition(-logp, kth=k - 1, axis=-1)[..., :k]
    values = mx.take_along_axis(logp, top, axis=-1)
    order = mx.argsort(-values, axis=-1)
    top = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
    return top, mx.take_along_axis(values, order, axis=-1).astype(mx.float16)


def _sample(logits: mx.array, temps: mx.array, sampled: bool = True) -> mx.array:
    """Per-row next tokens ``(B,)``: argmax where ``temps`` is 0, else a draw at that temperature.

    ``sampled=False`` says no row samples: the draw over the whole vocabulary
    (as costly as the output layer's softmax on a CPU) is skipped.
    """
    greedy = mx.argmax(logits, axis=-1)
    if not sampled:
        return greedy
    scale = 1.0 / mx.maximum(temps, 1e-6)[:, None]
    drawn = mx.random.categorical(logits * scale, axis=-1)
    return mx.where(temps > 0, drawn, greedy)


@dataclass
class _Row:
    """One sequence being generated: host copies of what its forwards gave."""

    tokens: List[int]
    start: int
    temp: float
    ids: List[np.ndarray] = field(default_factory=list)
    logp: List[np.ndarray] = field(default_factory=list)
    features: List[np.ndarray] = field(default_factory=list)


def _forward(model, inputs, cache, capture, k):
    """One forward's last logits ``(B, V)``, top-k laws ``(B, L, K)`` x2 and features ``(B, L, F)``."""
    with maybe_capturing(capture):
        logits = model(inputs, cache=cache)
    feats = capture.take(batched=True).astype(mx.float16) if capture else None
    ids, logp = top_laws(logits, k)
    return logits[:, -1], ids, logp, feats


def generate_batch(
    model,
    prompts: Sequence[Sequence[int]],
    temps: Sequence[float],
    *,
    max_tokens: int,
    top_k: int,
    stop_tokens: Sequence[int],
    feature_layers: Optional[Sequence[int]] = DEFAULT_FEATURE_LAYERS,
    progress: Optional[Callable[[int], None]] = None,
) -> List[_Row]:
    """Complete ``prompts`` together; every position's law (and features) kept.

    Args:
        model: The target (an mlx-lm model).
        prompts: Token ids of each prompt.
        temps: Each prompt's sampling temperature (``0`` = greedy).
        max_tokens: Completion length limit.
        top_k: Size of the kept top of each law.
        stop_tokens: Tokens that end a completion (kept as its last token).
        feature_layers: Features to keep (see :mod:`mlx_spec.features`), or
          ``None`` for none.
        progress: Called with the number of tokens of each decoding step.

    Returns:
        One :class:`_Row` per prompt, in order; its laws and features cover
        every position, the last token's included.
    """
    capture = FeatureCapture(model, feature_layers) if feature_layers else None
    stops = set(int(t) for t in stop_tokens)
    rows = [_Row(list(p), len(p), float(t)) for p, t in zip(prompts, temps)]
    last = [None] * len(rows)

    def keep(r, outputs):  # a prefill chunk's laws and features, to the host
        logits, ids, logp, feats = outputs
        rows[r].ids.append(np.array(ids[0]))
        rows[r].logp.append(np.array(logp[0]))
        if feats is not None:
            rows[r].features.append(np.array(feats[0]))
        last[r] = logits

    # Prefilled alone: no padding, exact laws over the prompt.
    batch_cache = prefill_alone(
        model,
        [r.tokens for r in rows],
        forward=lambda tokens, cache: _forward(model, tokens, cache, capture, top_k),
        on_chunk=keep,
    )
    active = list(range(len(rows)))
    row_temps = mx.array([r.temp for r in rows])
    sampled = any(r.temp > 0 for r in rows)
    y = _sample(mx.concatenate(last, axis=0), row_temps, sampled)
    while active:
        # Feed each active row's newest token: its law and features come out.
        y_host = np.array(y).tolist()
        for r, token in zip(active, y_host):
            rows[r].tokens.append(int(token))
        logits, ids, logp, feats = _forward(
            model, y[:, None], batch_cache, capture, top_k
        )
        y = _sample(logits, row_temps, sampled)
        mx.eval(y, ids, logp, feats)
        ids, logp = np.array(ids[:, 0]), np.array(logp[:, 0])
        feats = None if feats is None else np.array(feats[:, 0])
        keep = []
        for j, r in enumerate(active):
            row = rows[r]
            row.ids.append(ids[j : j + 1])
            row.logp.append(logp[j : j + 1])
            if feats is not None:
                row.features.append(feats[j : j + 1])
            made = len(row.tokens) - row.start
            if row.tokens[-1] not in stops and made < max_tokens:
                keep.append(j)
        if progress is not None:
            progress(len(active))
        if len(keep) < len(active):
            if keep:
                index = mx.array(keep)
                for c in batch_cache:
                    c.filter(index)
                y, row_temps = y[index], row_temps[index]
            active = [active[j] for j in keep]
            mx.clear_cache()
    return rows


def stream_completions(
    model,
    tokenizer,
    chunks: Sequence[Tuple[Sequence[Prompt], Sequence[float]]],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = DEFAULT_BATCH_SIZE,
    feature_layers: Optional[Sequence[int]] = DEFAULT_FEATURE_LAYERS,
    seeds: Optional[Sequence[int]] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> Iterator[Tuple[int, Completions]]:
    """The target's completions of several chunks of prompts, by batched generation.

    A chunk's prompts are sorted by length into batches of ``batch_size``,
    so a batch pads its keys little, greedy ones apart from sampled ones, so
    a greedy batch draws nothing.

    Args:
        model: The target (an mlx-lm model).
        tokenizer: Its tokenizer (mlx-lm ``TokenizerWrapper``).
        chunks: ``(prompts, temps)`` pairs; ``temps`` is each prompt's
          temperature (``0`` = greedy).
        max_tokens: Completion length limit.
        top_k: Size of the kept top of each law.
        batch_size: Sequences decoded together.
        feature_layers: Features kept at every position, or ``None``.
        seeds: Random seed of each chunk's sampled completions.
        progress: Called with the number of tokens of each generation step.

    Yields:
        ``(chunk index, Completions in the chunk's prompt order)``, as each
        chunk finishes.
    """
    stops = list(tokenizer.eos_token_ids)
    for c, (prompts, temps) in enumerate(chunks):
        if seeds is not None:
            mx.random.seed(seeds[c])
        ids = [encode_prompt(tokenizer, p) for p in prompts]
        order = sorted(
            range(len(prompts)), key=lambda i: (temps[i] > 0, len(ids[i]), i)
        )
        done: Dict[int, _Row] = {}
        for lo in range(0, len(order), batch_size):
            part = order[lo : lo + batch_size]
            rows = generate_batch(
                model,
                [ids[i] for i in part],
                [temps[i] for i in part],
                max_tokens=max_tokens,
                top_k=top_k,
                stop_tokens=stops,
                feature_layers=feature_layers,
                progress=progress,
            )
            done.update(zip(part, rows))
        yield c, _assemble(
            prompts, [done[i] for i in range(len(prompts))], feature_layers
        )


def _assemble(prompts, rows: List[_Row], feature_layers) -> Completions:
    data = Completions(features=[] if feature_layers else None)
    data.feature_layers = tuple(feature_layers or ())
    for prompt, row in zip(prompts, rows):
        data.tokens.append(np.array(row.tokens, np.int32))
        data.starts.append(row.start)
        data.temps.append(row.temp)
        data.prompt_sets.append(prompt.prompt_set)
        data.law_ids.append(np.concatenate(row.ids).astype(np.int32))
        data.law_logp.append(np.concatenate(row.logp).astype(np.float16))
        if feature_layers:
            data.features.append(np.concatenate(row.features).astype(np.float16))
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
    feature_layers: Optional[Sequence[int]] = DEFAULT_FEATURE_LAYERS,
    features: bool = True,
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
        feature_layers: Features kept at every position (``None``: none).
        features: Read the features back too (they are kept on disk anyway).
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
        "feature_layers": list(feature_layers or []),
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
        feature_layers=feature_layers,
        seeds=[seed + i // shard_size for i, _, _ in todo],
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
    data = Completions()
    for path in paths:
        data.extend(Completions.load(path, features))
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
