"""Training data from a corpus: its ids, and what one batched prefill derives from them.

The corpus (:mod:`mlx_spec.train.corpus`) keeps token ids only. The target's
top-K laws (the soft labels) and its features (what heads read) at every
position come from one teacher-forced, batched forward over the stored
sequences (:func:`mlx_spec.train.head_data.teacher_data`), never from
decoding again. They are cached outside git, one file per shard, split and
setting, in ``$MLX_SPEC_CACHE/corpus`` (default ``~/.cache/mlx_spec``): a shard
is never rewritten, so its file stays valid, and a grown corpus only costs
the prefill of its new shards. Shards are prefilled a group at a time, their
rows sorted by length across the group, so little of a batch is padding. A
file serves every request whose features are among those it holds: a draft
model (laws only) reuses an EAGLE head's prefill. A draft trained on the
written tokens alone (``--labels written``) reads the shards and runs no
prefill: greedy rows' tokens are the target's argmax and sampled rows' are
draws from its law. A held-out budget
(:func:`heldout_set`, the ``--heldout-tokens`` of train-draft and of the
studies that replay its evaluation) takes the first held-out sequences in
shard order: a fixed evaluation set however much the corpus grows, which
reads only the shards it holds. A training run reads
the shards :mod:`mlx_spec.train.corpus_select` chose, and prefills only those.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Dict, List, Optional, Sequence

import numpy as np

from .completions import Completions
from .corpus import Corpus, Record, Shard
from .head_data import DEFAULT_TEACHER_TOP_K, HeadData, teacher_data

CACHE_FOLDER = "corpus"
# Completion tokens of the fixed held-out set (:func:`heldout_set`).
DEFAULT_HELDOUT_TOKENS = 40_000
# The rule of --heldout-tokens, for the help of every command that takes it.
HELDOUT_TOKENS_HELP = (
    "the corpus's first held-out sequences in shard order whose completion "
    "tokens total at most N; shards are only appended, so runs on a grown corpus "
    f"are measured on the same sequences (default: {DEFAULT_HELDOUT_TOKENS}; a "
    "corpus with fewer held-out tokens gives all)"
)
# Prompt and completion tokens of the shards prefilled together (see _prefill_groups).
PREFILL_GROUP_TOKENS = 65_536


def default_cache() -> Path:
    from ..home import cache_dir

    return cache_dir() / CACHE_FOLDER


def _key(target: Dict, shard: Path, split: str, top_k: int) -> str:
    """Names the laws of a shard's split: target, shard contents, split and top-k."""
    h = hashlib.sha256(json.dumps(target.get("stats", []), sort_keys=True).encode())
    h.update(shard.read_bytes())
    h.update(json.dumps([split, top_k]).encode())
    return h.hexdigest()[:24]


def _layers_tag(layers: Sequence[int]) -> str:
    """The feature layers in a cache file's name: ``f2_15_27``, ``f-1``; ``f`` for none."""
    return "f" + "_".join(str(int(i)) for i in layers)


def _cached(folder: Path, stem: str, layers: Sequence[int]):
    """A cached file of ``stem`` holding every layer of ``layers``, and its layers."""
    for path in sorted(folder.glob(f"{stem}-f*.npz")):
        tag = path.stem[len(stem) + 2 :]
        try:
            held = [int(i) for i in tag.split("_")] if tag else []
        except ValueError:
            continue
        if set(layers) <= set(held):
            return path, held
    return None, None


def _select(part: HeadData, held: Sequence[int], layers: Sequence[int]) -> HeadData:
    """``part`` with only the features of ``layers`` (non-empty), in that order."""
    if list(held) == list(layers):
        return part
    width = part.features[0].shape[1] // len(held)
    columns = np.concatenate([np.arange(width) + width * held.index(i) for i in layers])
    part.features = [f[:, columns] for f in part.features]
    return part


def corpus_completions(
    model,
    corpus: Corpus,
    split: str,
    *,
    feature_layers: Sequence[int] = (-1,),
    store_layers: Optional[Sequence[int]] = None,
    top_k: int = DEFAULT_TEACHER_TOP_K,
    cache: Optional[Path] = None,
    token_budget: Optional[int] = None,
    shards: Optional[Collection[int]] = None,
    log: Optional[Callable[[str], None]] = None,
    laws: bool = True,
) -> Completions:
    """A split of the corpus as :class:`Completions` with the target's laws and features.

    Args:
        model: The target (its fingerprint must match the corpus's).
        corpus: The corpus.
        split: ``"train"`` or ``"heldout"``.
        feature_layers: Features kept at every position (none: laws only).
        store_layers: Features a new prefill writes to the cache, a superset of
          ``feature_layers`` (default: those), so one prefill serves several drafters.
        top_k: Size of the kept top of each law.
        cache: Folder of the derived data. Default: :func:`default_cache`.
        token_budget: Use only the first sequences in shard order whose
          completion tokens total at most this many (``None``: all). Shards
          are appended and never rewritten, so a budget the corpus fills
          always gives the same sequences. A shard is prefilled (and cached)
          whole, and shards past the budget are not read.
        shards: Use only the shards of these numbers (``shard-NNNNN``;
          ``None``: all); the others are neither read nor prefilled.
        log: Called with one line when a prefill runs.
        laws: Take the laws (and features) from the target's prefill. Without,
          no target forward runs and nothing is cached: the written tokens
          alone, with zero-width ``(T_i, 0)`` laws (``feature_layers`` empty).

    Returns:
        The split's sequences, in shard order.
    """
    from ..fingerprint import fingerprint_mismatch

    manifest = corpus.existing_manifest()
    why = fingerprint_mismatch(manifest["target"], model)
    if why:
        raise ValueError(
            f"the corpus in '{corpus.folder}' was written by another target ({why})."
        )
    layers = tuple(feature_layers)
    store = tuple(layers if store_layers is None else store_layers)
    if not set(layers) <= set(store):
        raise ValueError(
            f"the features to store ({list(store)}) must include those read ({list(layers)})."
        )
    if not laws and store:
        raise ValueError(
            f"features ({list(store)}) come from the target's prefill; ask for laws too."
        )
    paths = corpus.shard_paths()
    if shards is not None:
        paths = [p for p in paths if shard_number(p) in shards]
    plan = _plan(paths, split, token_budget)
    if laws:
        folder = Path(cache) if cache else default_cache()
        stems = [
            f"{p.path.name.split('.')[0]}-{split}-{_key(manifest['target'], p.path, split, top_k)}"
            for p in plan
        ]
        parts = _prefilled(model, plan, stems, folder, split, layers, store, top_k, log)
    else:
        parts = [_written(item) for item in plan]
    data = Completions(features=[] if layers else None, feature_layers=layers)
    for item, part in zip(plan, parts):
        temps = [round(float(t), 6) for t in item.shard.temps[item.keep]]
        sets = [str(s) for s in item.shard.prompt_sets[item.keep]]
        for i in range(item.take):
            data.tokens.append(part.tokens[i])
            data.starts.append(part.starts[i])
            data.law_ids.append(part.teacher_ids[i])
            data.law_logp.append(part.teacher_logp[i])
            if layers:
                data.features.append(part.features[i])
            data.temps.append(temps[i])
            data.prompt_sets.append(sets[i])
    return data


def _prefilled(model, plan, stems, folder: Path, split, layers, store, top_k, log):
    """Each planned shard's laws and features ``layers``: from the cache, else
    prefilled (a group at a time) and cached with the features ``store``."""
    folder.mkdir(parents=True, exist_ok=True)
    parts: List[Optional[HeadData]] = []
    for stem in stems:
        cached, held = _cached(folder, stem, layers)
        part = None
        if cached is not None:
            part = HeadData.load(cached, features=bool(layers))
            part = _select(part, held, layers) if layers else part
        parts.append(part)
    todo = [i for i, part in enumerate(parts) if part is None]
    for group in _prefill_groups([plan[i] for i in todo]):
        made = _prefill(model, [plan[todo[i]] for i in group], store, top_k)
        for i, part in zip(group, made):
            j = todo[i]
            path = folder / f"{stems[j]}-{_layers_tag(store)}.npz"
            tmp = path.with_name(f".{path.stem}.tmp.npz")
            part.save(tmp)
            tmp.replace(path)
            parts[j] = _select(part, store, layers) if layers else part
            if log is not None:
                log(
                    f"prefilled {plan[j].path.name} ({split}): {part.num_tokens} tokens"
                )
    return parts


def _written(item: "_Planned") -> HeadData:
    """A planned shard's sequences without the target: zero-width laws and features."""
    records = item.records[: item.take]
    tokens = [r.tokens for r in records]

    def empty(dtype):
        return [np.zeros((len(t), 0), dtype) for t in tokens]

    starts = [len(r.prompt) for r in records]
    return HeadData(
        tokens, starts, empty(np.float16), empty(np.int32), empty(np.float16)
    )


def heldout_budget(args) -> Optional[int]:
    """The held-out budget of a train-draft run: ``--heldout-tokens``, else
    :data:`DEFAULT_HELDOUT_TOKENS`; ``None`` without ``--corpus``."""
    if not getattr(args, "corpus", None):
        return None
    given = getattr(args, "heldout_tokens", None)
    return DEFAULT_HELDOUT_TOKENS if given is None else given


def heldout_set(model, corpus: Corpus, budget: int, **options) -> Completions:
    """The fixed held-out set of ``--heldout-tokens budget``, as train-draft measures on.

    The corpus's first held-out sequences in shard order whose completion
    tokens total at most ``budget`` (all of them if fewer): the same
    sequences however much the corpus grows. Shards past the budget are not
    read.

    Args:
        model, corpus: As :func:`corpus_completions`.
        budget: Completion tokens, at least 1.
        options: Of :func:`corpus_completions` (features, cache, log).

    Raises:
        ValueError: One line: ``budget`` is below the first held-out
          sequence (checked before any prefill).
    """
    heldout = corpus_completions(
        model, corpus, "heldout", token_budget=budget, **options
    )
    first = None if len(heldout) else next(corpus.sequences("heldout"), None)
    if first is not None:
        raise ValueError(
            f"--heldout-tokens {budget} is less than the corpus's first held-out "
            f"sequence ({len(first.completion)} completion tokens); raise it."
        )
    return heldout


def shard_number(path: Path) -> int:
    """The number of a shard file ``shard-NNNNN.npz.xz``."""
    return int(path.name[6:11])


@dataclass
class _Planned:
    """A shard to read: its split's rows (``keep``) and how many of them to take."""

    path: Path
    shard: Shard
    keep: np.ndarray  # (N,) bool: the rows of the split
    take: int

    @property
    def records(self) -> List[Record]:
        return [r for r, k in zip(self.shard.sequences(), self.keep) if k]

    @property
    def prefill_tokens(self) -> int:
        lengths = self.shard.prompt_lengths + self.shard.completion_lengths
        return int(lengths[self.keep].sum())


def _plan(paths, split, token_budget) -> List[_Planned]:
    """The shards of ``paths`` a split reads within its budget, in order."""
    plan, made = [], 0
    for path in paths:
        shard = _read(path)
        keep = shard.heldout == (split == "heldout")
        lengths = shard.completion_lengths[keep]  # (N,) of this split
        take = len(lengths)
        if token_budget is not None:
            take = sequences_within(lengths, token_budget - made)
        if take == 0:
            if len(lengths):  # the next sequence passes the budget
                break
            continue
        plan.append(_Planned(path, shard, keep, take))
        made += int(lengths[:take].sum())
        if take < len(lengths):
            break
    return plan


def _prefill_groups(plan: Sequence[_Planned]) -> List[List[int]]:
    """Shards prefilled together: consecutive ones of about :data:`PREFILL_GROUP_TOKENS`.

    Rows are sorted by length across a group's shards, which pads far less
    than within one shard; a group is cached when done, so a stopped prefill
    loses at most one group.
    """
    groups: List[List[int]] = []
    total = PREFILL_GROUP_TOKENS
    for i, item in enumerate(plan):
        if total >= PREFILL_GROUP_TOKENS:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += item.prefill_tokens
    return groups


def _prefill(model, items: Sequence[_Planned], store, top_k) -> List[HeadData]:
    """One batched prefill of the shards ``items`` (their split's rows); one part each."""
    records = [r for item in items for r in item.records]
    data = teacher_data(
        model,
        [r.tokens.tolist() for r in records],
        [len(r.prompt) for r in records],
        feature_layers=store,
        top_k=top_k,
    )
    parts, lo = [], 0
    for item in items:
        n = int(item.keep.sum())
        parts.append(data.subset(range(lo, lo + n)))
        lo += n
    return parts


def sequences_within(lengths: Sequence[int], budget: int) -> int:
    """How many leading sequences of completion ``lengths`` total at most ``budget``."""
    return int(np.searchsorted(np.cumsum(lengths), budget, side="right"))


def _read(path: Path):
    from .corpus import read_shard

    return read_shard(path)


def corpus_tokens(corpus: Corpus, split: str = "train") -> int:
    """Completion tokens of a split: the x axis of a learning curve."""
    return sum(
        int(s.completion_lengths[s.heldout == (split == "heldout")].sum())
        for s in corpus.shards()
    )


def shard_train_tokens(corpus: Corpus) -> Dict[int, int]:
    """Shard number -> its training completion tokens, for every shard."""
    return {
        shard_number(path): int(s.completion_lengths[~s.heldout].sum())
        for path, s in ((p, _read(p)) for p in corpus.shard_paths())
    }
