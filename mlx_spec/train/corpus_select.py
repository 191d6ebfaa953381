"""Which corpus shards a run trains on: the first ones, or unseen ones first with replay.

A corpus grows by appended shards (:mod:`mlx_spec.train.corpus`), and a
drafter warm-starts run after run. ``--corpus-select first`` takes the first
shards in order up to ``--corpus-tokens``; ``newest`` takes the shards the
warm-start drafter has not trained on yet (oldest of them first, so runs
sweep forward without gaps), then fills the rest of the budget with a
seeded random sample of the shards it has seen (replay, against
forgetting). Only the chosen shards are prefilled, so a run costs its
budget, not the corpus.

What a drafter has seen is read from its learning curve: each point since
selections were recorded names its shards as ranges of shard numbers
(``"0-48,55"``); an older point took the first shards up to its
``corpus_tokens``, which are found again from the append-only shards.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

import numpy as np

SELECTIONS = ("first", "newest")
# Where a newest selection is kept for a resumed run (in OUT/data, git-ignored).
SELECTION_FILE = "corpus-selection.json"


def ranges_text(numbers: Iterable[int]) -> str:
    """Shard numbers as ranges: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    parts: List[str] = []
    run: List[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            parts.append(_range(run))
        run = [n]
    if run:
        parts.append(_range(run))
    return ",".join(parts)


def _range(run: List[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_ranges(text: str) -> Set[int]:
    """The shard numbers of :func:`ranges_text`'s ``text`` (``ValueError`` if malformed)."""
    out: Set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def seen_shards(curve: Sequence[Dict], train_tokens: Dict[int, int]) -> Set[int]:
    """The shards the runs of a learning ``curve`` trained on.

    Args:
        curve: The learning-curve points, oldest first.
        train_tokens: Shard number -> its training completion tokens, for
          every shard of the corpus.

    Returns:
        Shard numbers: those a point names, and for an older point without
        names the first shards whose training tokens reach its ``corpus_tokens``.
    """
    seen: Set[int] = set()
    for point in curve:
        if "shards" in point:
            seen |= parse_ranges(point["shards"])
        else:  # before selections were recorded, a run read the first shards
            seen |= set(first_shards(train_tokens, point.get("corpus_tokens", 0)))
    return seen


def first_shards(train_tokens: Dict[int, int], budget: Optional[int]) -> List[int]:
    """The first shards in order until their training tokens reach ``budget``
    (the last may pass it; ``None``: every shard)."""
    chosen, total = [], 0
    for n in sorted(train_tokens):
        if budget is not None and total >= budget:
            break
        chosen.append(n)
        total += train_tokens[n]
    return chosen


@dataclass
class Selection:
    """The shards a run trains on and where they come from.

    Attributes:
        mode: ``"first"`` or ``"newest"``.
        shards: The chosen shard numbers, ascending.
        new: Those the warm-start drafter had not trained on.
        replay: Those it had, sampled again.
        tokens: Training completion tokens of each chosen shard.
        seen_before: Distinct training tokens the drafter had seen.
    """

    mode: str
    shards: List[int]
    new: List[int] = field(default_factory=list)
    replay: List[int] = field(default_factory=list)
    tokens: Dict[int, int] = field(default_factory=dict)
    seen_before: int = 0

    @property
    def new_tokens(self) -> int:
        return sum(self.tokens[n] for n in self.new)

    @property
    def replay_tokens(self) -> int:
        return sum(self.tokens[n] for n in self.replay)

    def record(self, budget: Optional[int], seed: int) -> Dict:
        """The selection as the drafter's record keeps it (and its curve point)."""
        out = {
            "mode": self.mode,
            "budget": budget,
            "shards": ranges_text(self.shards),
            "new_shards": len(self.new),
            "new_tokens": self.new_tokens,
            "replay_shards": len(self.replay),
            "replay_tokens": self.replay_tokens,
            "seen_tokens": self.seen_before + self.new_tokens,
        }
        if self.mode == "newest":
            out["seed"] = seed
        return out


def select_shards(
    train_tokens: Dict[int, int],
    mode: str,
    budget: Optional[int],
    *,
    seen: Set[int] = frozenset(),
    seed: int = 0,
) -> Selection:
    """Choose the shards a run trains on.

    Args:
        train_tokens: Shard number -> training completion tokens, every shard.
        mode: ``"first"``: the first shards up to ``budget``. ``"newest"``:
          the shards not in ``seen`` in order up to ``budget``, then a
          random sample (seeded by ``seed``) of those in ``seen``.
        budget: Training completion tokens; shards are taken whole until
          the total reaches it, so the last may pass it (``None``: all).
        seen: Shard numbers the warm-start drafter trained on.
        seed: Seed of the replay sample, drawn with the number of shards
          seen, so successive warm starts with one seed replay other shards.
    """
    if mode not in SELECTIONS:
        raise ValueError(
            f"the corpus selection must be one of {SELECTIONS}, got {mode!r}."
        )
    useful = {n: t for n, t in train_tokens.items() if t > 0}
    seen_before = sum(t for n, t in useful.items() if n in seen)
    if mode == "first":
        shards = first_shards(useful, budget)
        new = [n for n in shards if n not in seen]
        replay = [n for n in shards if n in seen]
    else:
        new = first_shards({n: t for n, t in useful.items() if n not in seen}, budget)
        total = sum(useful[n] for n in new)
        old = sorted(n for n in useful if n in seen)
        replay = []
        for i in np.random.default_rng([seed, len(old)]).permutation(len(old)):
            if budget is not None and total >= budget:
                break
            replay.append(old[i])
            total += useful[old[i]]
        shards = sorted(new + replay)
    return Selection(
        mode=mode,
        shards=sorted(shards),
        new=sorted(new),
        replay=sorted(replay),
        tokens={n: useful[n] for n in shards},
        seen_before=seen_before,
    )


def saved_selection(path: Path, key: Dict, present: Set[int]) -> Optional[Selection]:
    """The selection a run in progress made, if ``path`` holds one for ``key``.

    A run resumed after the corpus grew keeps the shards it began with;
    ``None`` if the file is missing or unreadable, was made for other options,
    or names a shard no longer in ``present``.
    """
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        if saved["key"] != key:
            return None
        new, replay = parse_ranges(saved["new"]), parse_ranges(saved["replay"])
        tokens = {int(n): int(t) for n, t in saved["tokens"].items()}
        seen_before = int(saved["seen_before"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (new | replay) <= present:
        return None
    return Selection(
        mode=key["mode"],
        shards=sorted(new | replay),
        new=sorted(new),
        replay=sorted(replay),
        tokens=tokens,
        seen_before=seen_before,
    )


def save_selection(path: Path, key: Dict, selection: Selection):
    """Keep ``selection`` beside the run (read back by :func:`saved_selection`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "key": key,
        "new": ranges_text(selection.new),
        "replay": ranges_text(selection.replay),
        "tokens": {str(n): t for n, t in selection.tokens.items()},
        "seen_before": selection.seen_before,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    tmp.replace(path)
