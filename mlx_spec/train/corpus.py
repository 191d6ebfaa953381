"""A distillation corpus that lasts: the target's completions as token ids, in append-only shards.

Everything a drafter learns from (the target's laws, its hidden states) is a
function of the target and the token ids, so only the ids are kept; the rest
is recomputed by one batched prefill (:mod:`mlx_spec.train.corpus_data`).
The ids are small enough to commit next to the drafters they train:

- ``corpus.json``: the manifest (format, the target's fingerprint, the cap);
- ``shard-00000.npz.xz``, ...: one per chunk of a run, written atomically
  and never rewritten, so the git history grows by new shards only. A
  shard is an ``.npz`` of ``uint16`` ids and a few per-sequence columns,
  compressed with LZMA (under a byte a token, prompts included; the card gives the figure);
- ``README.md``: the card (sizes, breakdown, throughput of each run).

Each sequence has a prompt hash (of its chat messages): a prompt already in
the corpus is never generated again, and its split (``heldout`` or not) is
stored with it and decided by its source (see
:func:`mlx_spec.train.prompts.split_of`), so the held-out split never trains.

Typical use::

    corpus = Corpus("models/smollm2-135m-corpus")
    for seq in corpus.sequences(split="train"):
        seq.prompt, seq.completion  # uint16 ids
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

FORMAT = "mlx-spec-corpus"
VERSION = 1
MANIFEST = "corpus.json"
SHARD_GLOB = "shard-[0-9][0-9][0-9][0-9][0-9].npz.xz"
DEFAULT_CAP_BYTES = 25_000_000
# Largest vocabulary whose ids fit in uint16.
MAX_VOCAB = 1 << 16
_COLUMNS = (
    "prompt_lengths",
    "completion_lengths",
    "temps",
    "prompt_sets",
    "hashes",
    "heldout",
    "stopped",
)


class CorpusFull(Exception):
    """The next shard would take the corpus past its size cap."""


def prompt_hash(messages: Sequence[Dict[str, str]]) -> int:
    """A 63-bit hash of a conversation's messages (roles and contents, in order)."""
    text = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


@dataclass
class Record:
    """One stored completion.

    Attributes:
        prompt: ``(P,)`` uint16 prompt ids (chat template applied).
        completion: ``(C,)`` uint16 completion ids (the stop token last if it stopped).
        temp: Sampling temperature (``0`` = greedy).
        prompt_set: The prompt family (``chat``, ``code``, ``multiturn``, ...).
        hash: The prompt hash (:func:`prompt_hash`).
        heldout: Held out from training.
        stopped: The completion ended with a stop token (not the length limit).
    """

    prompt: np.ndarray
    completion: np.ndarray
    temp: float
    prompt_set: str
    hash: int
    heldout: bool
    stopped: bool

    @property
    def tokens(self) -> np.ndarray:
        """``(P + C,)`` int32 prompt then completion."""
        return np.concatenate([self.prompt, self.completion]).astype(np.int32)


@dataclass
class Shard:
    """A shard's sequences (column arrays) and its metadata (a dict)."""

    tokens: np.ndarray  # (sum of P + C,) uint16, sequence after sequence
    prompt_lengths: np.ndarray  # (N,) int32
    completion_lengths: np.ndarray  # (N,) int32
    temps: np.ndarray  # (N,) float32
    prompt_sets: np.ndarray  # (N,) str
    hashes: np.ndarray  # (N,) int64
    heldout: np.ndarray  # (N,) bool
    stopped: np.ndarray  # (N,) bool
    meta: Dict

    def __len__(self) -> int:
        return len(self.hashes)

    @property
    def completion_tokens(self) -> int:
        return int(self.completion_lengths.sum())

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt_lengths.sum())

    @classmethod
    def from_sequences(cls, sequences: Sequence[Record], meta: Dict) -> "Shard":
        if not sequences:
            raise ValueError("a shard needs at least one sequence.")
        parts = [p for s in sequences for p in (s.prompt, s.completion)]
        tokens = np.concatenate(parts).astype(np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= MAX_VOCAB):
            raise ValueError(f"token ids must lie in [0, {MAX_VOCAB}) to be stored.")
        return cls(
            tokens=tokens.astype(np.uint16),
            prompt_lengths=np.array([len(s.prompt) for s in sequences], np.int32),
            completion_lengths=np.array(
                [len(s.completion) for s in sequences], np.int32
            ),
            temps=np.array([s.temp for s in sequences], np.float32),
            prompt_sets=np.array([s.prompt_set for s in sequences], np.str_),
            hashes=np.array([s.hash for s in sequences], np.int64),
            heldout=np.array([s.heldout for s in sequences], bool),
            stopped=np.array([s.stopped for s in sequences], bool),
            meta=dict(meta),
        )

    def sequences(self) -> Iterator[Record]:
        ends = np.cumsum(self.prompt_lengths + self.completion_lengths)
        starts = ends - self.prompt_lengths - self.completion_lengths
        for i, lo in enumerate(starts):
            cut = lo + self.prompt_lengths[i]
            yield Record(
                prompt=self.tokens[lo:cut],
                completion=self.tokens[cut : ends[i]],
                temp=round(float(self.temps[i]), 6),
                prompt_set=str(self.prompt_sets[i]),
                hash=int(self.hashes[i]),
                heldout=bool(self.heldout[i]),
                stopped=bool(self.stopped[i]),
            )

    def to_bytes(self) -> bytes:
        """The shard as LZMA-compressed ``.npz`` bytes."""
        raw = io.BytesIO()
        columns = {name: getattr(self, name) for name in _COLUMNS}
        meta = np.array(json.dumps(self.meta, sort_keys=True))
        np.savez(raw, tokens=self.tokens, meta=meta, **columns)
        return lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Shard":
        with np.load(io.BytesIO(lzma.decompress(data)), allow_pickle=False) as npz:
            columns = {name: npz[name] for name in _COLUMNS}
            return cls(
                tokens=npz["tokens"], meta=json.loads(str(npz["meta"])), **columns
            )


class Corpus:
    """An append-only folder of shards (see the module docstring).

    Args:
        folder: The corpus folder (need not exist until :meth:`append`).
        cap_bytes: Most bytes the shards may take in all. Default: the
          manifest's cap, else :data:`DEFAULT_CAP_BYTES`.
    """

    def __init__(self, folder, cap_bytes: Optional[int] = None):
        self.folder = Path(folder)
        manifest = self.manifest()
        saved_cap = manifest.get("cap_bytes") if manifest else None
        self.cap_bytes = int(cap_bytes or saved_cap or DEFAULT_CAP_BYTES)

    # -- manifest ------------------------------------------------------- #
    def existing_manifest(self) -> Dict:
        """:meth:`manifest`, or a one-line ``ValueError`` if the folder holds no corpus."""
        manifest = self.manifest()
        if manifest is None:
            raise ValueError(
                f"'{self.folder}' holds no corpus (no {MANIFEST}); grow one with: "
                f"mlx_spec corpus grow --model MODEL --out {self.folder}"
            )
        return manifest

    def manifest(self) -> Optional[Dict]:
        path = self.folder / MANIFEST
        if not path.exists():
            return None
        try:  # ValueError: bad JSON or bad UTF-8
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"'{path}' is not a corpus manifest ({e}).") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"'{path}' is not an {FORMAT} manifest.")
        if int(data.get("version", 0)) > VERSION:
            raise ValueError(
                f"'{path}' has corpus format version {data['version']}; this mlx-spec "
                f"reads up to {VERSION}: upgrade mlx-spec."
            )
        return data

    def create(self, target: Dict, tokenizer: Dict, model: str = ""):
        """Write the manifest once (``target``: fingerprint; ``tokenizer``: size, stops;
        ``model``: the target's name)."""
        if self.manifest() is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {
            "format": FORMAT,
            "version": VERSION,
            "cap_bytes": self.cap_bytes,
            "model": model,
            "tokenizer": tokenizer,
            "target": target,
        }
        _write_atomic(
            self.folder / MANIFEST, (json.dumps(data, indent=2) + "\n").encode()
        )

    # -- shards --------------------------------------------------------- #
    def shard_paths(self) -> List[Path]:
        return sorted(self.folder.glob(SHARD_GLOB))

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.shard_paths())

    def shards(self) -> Iterator[Shard]:
        for path in self.shard_paths():
            yield read_shard(path)

    def hashes(self) -> set:
        """Prompt hashes of every stored sequence."""
        return {int(h) for shard in self.shards() for h in shard.hashes}

    def sequences(self, split: Optional[str] = None) -> Iterator[Record]:
        """Stored sequences in shard order; ``split``: ``"train"``, ``"heldout"`` or all."""
        if split not in (None, "train", "heldout"):
            raise ValueError(f"split must be train or heldout, got {split!r}.")
        for shard in self.shards():
            for seq in shard.sequences():
                if split is None or seq.heldout == (split == "heldout"):
                    yield seq

    def append(self, sequences: Sequence[Record], meta: Dict) -> Path:
        """Write ``sequences`` as the next shard (atomically); return its path.

        Sequences whose prompt hash is already stored (or repeated) are dropped.

        Raises:
            CorpusFull: The shard would take the corpus past its cap.
            ValueError: No manifest yet (call :meth:`create`), or nothing new.
        """
        if self.manifest() is None:
            raise ValueError(f"'{self.folder}' has no {MANIFEST}; create it first.")
        known = self.hashes()
        fresh = []
        for seq in sequences:
            if seq.hash not in known:
                known.add(seq.hash)
                fresh.append(seq)
        if not fresh:
            raise ValueError("every sequence is already in the corpus.")
        data = Shard.from_sequences(fresh, meta).to_bytes()
        used = self.size_bytes()
        if used + len(data) > self.cap_bytes:
            raise CorpusFull(
                f"the corpus in '{self.folder}' holds {used / 1e6:.1f} MB; a shard of "
                f"{len(data) / 1e6:.2f} MB more would pass its {self.cap_bytes / 1e6:.0f}"
                " MB cap."
            )
        paths = self.shard_paths()
        number = int(paths[-1].name[6:11]) + 1 if paths else 0
        path = self.folder / f"shard-{number:05d}.npz.xz"
        _write_atomic(path, data, exclusive=True)
        return path

    def summary(self) -> Dict:
        """Counts for the card: sequences, tokens and bytes, by prompt set and split."""
        out = {"sequences": 0, "prompt_tokens": 0, "completion_tokens": 0}
        by_set: Dict[str, Dict[str, int]] = {}
        splits = {"train": 0, "heldout": 0}
        temps: Dict[str, int] = {}
        runs: Dict[str, Dict] = {}
        for shard in self.shards():
            out["sequences"] += len(shard)
            out["prompt_tokens"] += shard.prompt_tokens
            out["completion_tokens"] += shard.completion_tokens
            for seq_set, c, held, t in zip(
                shard.prompt_sets, shard.completion_lengths, shard.heldout, shard.temps
            ):
                row = by_set.setdefault(str(seq_set), {"sequences": 0, "tokens": 0})
                row["sequences"] += 1
                row["tokens"] += int(c)
                splits["heldout" if held else "train"] += int(c)
                key = f"{float(t):g}"
                temps[key] = temps.get(key, 0) + int(c)
            run = shard.meta.get("run", "")
            r = runs.setdefault(run, {"shards": 0, "tokens": 0, "seconds": 0.0})
            r["shards"] += 1
            r["tokens"] += shard.completion_tokens
            # Throughput counts every decoded token (unfinished rows too) when known.
            r["decoded"] = r.get("decoded", 0) + shard.meta.get(
                "decoded_tokens", shard.completion_tokens
            )
            r["seconds"] += float(shard.meta.get("seconds", 0.0))
            if "cpu_seconds" in shard.meta:  # shards written since CPU time was kept
                r["cpu_seconds"] = r.get("cpu_seconds", 0.0) + shard.meta["cpu_seconds"]
                r["cpu_decoded"] = (
                    r.get("cpu_decoded", 0) + shard.meta["decoded_tokens"]
                )
            for k in ("batch_size", "max_tokens", "started"):
                if k in shard.meta:
                    r[k] = shard.meta[k]
        out.update(
            bytes=self.size_bytes(),
            shards=len(self.shard_paths()),
            by_set=by_set,
            split_tokens=splits,
            temp_tokens=temps,
            runs=runs,
        )
        return out


def read_shard(path) -> Shard:
    """One shard file; a damaged one is named in one line."""
    path = Path(path)
    try:
        return Shard.from_bytes(path.read_bytes())
    except (OSError, lzma.LZMAError, ValueError, KeyError, EOFError) as e:
        raise ValueError(
            f"corpus shard '{path}' is damaged ({type(e).__name__}); restore it from "
            "git or delete it."
        ) from None


def _write_atomic(path: Path, data: bytes, exclusive: bool = False):
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if exclusive and path.exists():
        tmp.unlink()
        raise FileExistsError(f"'{path}' exists; shards are never rewritten.")
    os.replace(tmp, path)


def split_counts(sequences: Iterable[Record]) -> Dict[str, int]:
    """Completion tokens by split."""
    out = {"train": 0, "heldout": 0}
    for s in sequences:
        out["heldout" if s.heldout else "train"] += len(s.completion)
    return out
