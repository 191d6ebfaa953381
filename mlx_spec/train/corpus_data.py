"""Training data from a corpus: its ids, and what one batched prefill derives from them.

The corpus (:mod:`mlx_spec.train.corpus`) keeps token ids only. The target's
top-K laws (the soft labels) and its features (what heads read) at every
position come from one teacher-forced, batched forward over the stored
sequences (:func:`mlx_spec.train.head_data.teacher_data`), never from
decoding again. They are cached outside git, one file per shard, split and
setting, in ``$MLX_SPEC_CACHE/corpus`` (default ``~/.cache/mlx_spec``): a shard
is never rewritten, so its file stays valid, and a grown corpus only costs
the prefill of its new shards. A file serves every request whose features
are among those it holds: a draft model (laws only) reuses an EAGLE head's
prefill. A held-out budget (:func:`corpus_completions`'s ``token_budget``) takes
the first held-out sequences in shard order: a fixed evaluation set however
much the corpus grows, which reads only the cache files of its shards.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from .completions import Completions
from .corpus import Corpus
from .head_data import DEFAULT_TEACHER_TOP_K, HeadData, teacher_data

CACHE_FOLDER = "corpus"


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
    max_tokens: Optional[int] = None,
    token_budget: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
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
        max_tokens: Use only the first shards, up to about this many
          completion tokens (``None``: all).
        token_budget: Use only the first sequences in shard order whose
          completion tokens total at most this many (``None``: all). Shards
          are appended and never rewritten, so a budget the corpus fills
          always gives the same sequences. A shard is prefilled (and cached)
          whole, and shards past the budget are not read.
        log: Called with one line when a prefill runs.

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
    folder = Path(cache) if cache else default_cache()
    folder.mkdir(parents=True, exist_ok=True)
    layers = tuple(feature_layers)
    store = tuple(layers if store_layers is None else store_layers)
    if not set(layers) <= set(store):
        raise ValueError(
            f"the features to store ({list(store)}) must include those read ({list(layers)})."
        )
    data = Completions(features=[] if layers else None, feature_layers=layers)
    made = 0
    for path in corpus.shard_paths():
        if max_tokens is not None and made >= max_tokens:
            break
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
        stem = f"{path.name.split('.')[0]}-{split}-{_key(manifest['target'], path, split, top_k)}"
        cached, held = _cached(folder, stem, feature_layers)
        if cached is not None:
            part = HeadData.load(cached, features=bool(layers))
            if layers:
                part = _select(part, held, layers)
        else:
            cached = folder / f"{stem}-{_layers_tag(store)}.npz"
            records = [r for r, k in zip(shard.sequences(), keep) if k]
            part = teacher_data(
                model,
                [r.tokens.tolist() for r in records],
                [len(r.prompt) for r in records],
                feature_layers=store,
                top_k=top_k,
            )
            tmp = cached.with_name(f".{cached.stem}.tmp.npz")
            part.save(tmp)
            tmp.replace(cached)
            if layers:
                part = _select(part, store, layers)
            if log is not None:
                log(f"prefilled {path.name} ({split}): {part.num_tokens} tokens")
        temps = [round(float(t), 6) for t in shard.temps[keep]]
        sets = [str(s) for s in shard.prompt_sets[keep]]
        for i in range(take):
            data.tokens.append(part.tokens[i])
            data.starts.append(part.starts[i])
            data.law_ids.append(part.teacher_ids[i])
            data.law_logp.append(part.teacher_logp[i])
            if layers:
                data.features.append(part.features[i])
            data.temps.append(temps[i])
            data.prompt_sets.append(sets[i])
            made += len(part.tokens[i]) - part.starts[i]
        if take < len(lengths):
            break
    return data


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
