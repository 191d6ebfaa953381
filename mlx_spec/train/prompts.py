"""The built-in training prompts: chat, code, editing and extraction tasks.

Every prompt is generated, never handwritten one by one: chat requests come
from templates filled with topic lists, and the code, editing and extraction
tasks are built from the Python standard library installed on this machine
(function names, signatures, docstrings and short function bodies, read
with :mod:`ast`, nothing imported). The benchmark prompt sets are written
separately by hand; these stay distinct from them.

Each source item (a chat topic, a stdlib module) belongs to one split, chosen
by a hash of its name: the held-out prompts share no topic or module with
the training prompts, so acceptance measured on them is honest.

Typical use::

    from mlx_spec.train.prompts import builtin_prompts, mixed_prompts
    pool = builtin_prompts("train")          # every training prompt
    batch = mixed_prompts(2000, "train")     # a seeded mix of the four sets
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import Dict, List, Optional, Sequence

from ..loading import read_json_lines_file
from .chat_prompts import chat_prompts
from .prompt import Prompt, split_of
from .stdlib_prompts import code_prompts, edit_prompts, extract_prompts

PROMPT_SETS = ("chat", "code", "editing", "summarize")
SPLITS = ("train", "heldout")
# Default share of each prompt set in a mix (chat matters most: it is the goal).
DEFAULT_SHARES = {"chat": 0.4, "code": 0.25, "editing": 0.2, "summarize": 0.15}


# --------------------------------------------------------------------------- #
# Chat: templates x topic lists
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Code, edits and passages from the standard library (parsed, not imported)
# --------------------------------------------------------------------------- #


_BUILDERS = {
    "chat": lru_cache(maxsize=1)(chat_prompts),
    "code": lru_cache(maxsize=1)(code_prompts),
    "editing": lru_cache(maxsize=1)(edit_prompts),
    "summarize": lru_cache(maxsize=1)(extract_prompts),
}


def builtin_prompts(
    split: str = "train", sets: Sequence[str] = PROMPT_SETS
) -> List[Prompt]:
    """Every built-in prompt of ``split`` in ``sets``, in a fixed order.

    Args:
        split: ``"train"`` or ``"heldout"``. Default: ``"train"``.
        sets: Prompt sets to include. Default: all of :data:`PROMPT_SETS`.

    Returns:
        The prompts; the same on every call with the same Python installed.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}.")
    unknown = [s for s in sets if s not in _BUILDERS]
    if unknown:
        raise ValueError(
            f"unknown prompt set(s) {unknown}; use any of {', '.join(PROMPT_SETS)}."
        )
    return [p for s in sets for p in _BUILDERS[s]() if split_of(p.source) == split]


def mixed_prompts(
    count: int,
    split: str = "train",
    *,
    seed: int = 0,
    shares: Optional[Dict[str, float]] = None,
) -> List[Prompt]:
    """A seeded mix of ``count`` prompts, the sets interleaved by ``shares``.

    Each set's pool is shuffled with the seed, and the sets take turns in
    proportion to their shares (the set furthest behind its share goes
    next), so the first ``n`` prompts of a longer mix are the mix of ``n``:
    asking for more prompts only adds prompts at the end.

    Args:
        count: Number of prompts (fewer if the pools run out).
        split: ``"train"`` or ``"heldout"``. Default: ``"train"``.
        seed: Shuffling seed. Default: ``0``.
        shares: Prompt set -> weight. Default: :data:`DEFAULT_SHARES`.
    """
    shares = dict(DEFAULT_SHARES if shares is None else shares)
    total = sum(shares.values())
    pools = {}
    for name in sorted(shares):
        pool = list(builtin_prompts(split, (name,)))
        random.Random(f"{seed}:{name}").shuffle(pool)
        pools[name] = pool
    taken = {name: 0 for name in pools}
    picked: List[Prompt] = []
    while len(picked) < count:
        open_sets = [n for n in sorted(pools) if taken[n] < len(pools[n])]
        if not open_sets:
            break
        turn = len(picked) + 1
        name = max(open_sets, key=lambda n: turn * shares[n] / total - taken[n])
        picked.append(pools[name][taken[name]])
        taken[name] += 1
    return picked


def _is_messages(value) -> bool:
    """A chat: a non-empty list of ``{"role": str, "content": str}`` objects."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )


def load_prompt_file(path: str) -> List[Prompt]:
    """Prompts from a JSON-lines file: ``prompt_set`` and ``prompt`` or ``messages``.

    The format is the one ``mlx_spec.bench.run --prompts FILE`` reads.

    Raises:
        ValueError: One line naming the file (and the line) and what is wrong.
    """
    lines = read_json_lines_file(path, "--prompts")
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg}).") from None
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise ValueError(
                f"{path}:{number}: each line needs 'prompt' (text) or 'messages'."
            )
        if "messages" in row and not _is_messages(row["messages"]):
            raise ValueError(
                f"{path}:{number}: 'messages' must be a non-empty list of "
                '{"role": ..., "content": ...} objects.'
            )
        if "messages" in row:
            messages = tuple(dict(m) for m in row["messages"])
        else:
            messages = ({"role": "user", "content": str(row["prompt"])},)
        prompt_set = str(row.get("prompt_set", "file"))
        prompts.append(Prompt(prompt_set, messages, f"file:{number}"))
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    return prompts


def prompt_counts(prompts: Sequence[Prompt]) -> Dict[str, int]:
    """Prompt set -> number of prompts."""
    counts: Dict[str, int] = {}
    for p in prompts:
        counts[p.prompt_set] = counts.get(p.prompt_set, 0) + 1
    return counts
