"""One training prompt, and the split its source belongs to."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

# One source item in HELDOUT_EVERY goes to the held-out split.
HELDOUT_EVERY = 16


@dataclass(frozen=True)
class Prompt:
    """One chat request.

    Attributes:
        prompt_set: ``"chat"``, ``"code"``, ``"editing"``, ``"summarize"`` (the
          benchmark suite's set names), or a prompt file's own label.
        messages: The conversation, ``({"role": ..., "content": ...}, ...)``.
        source: The topic or stdlib module it was built from (decides the split).
    """

    prompt_set: str
    messages: Tuple[Dict[str, str], ...]
    source: str = ""

    @property
    def text(self) -> str:
        """The last user message."""
        return self.messages[-1]["content"]

    def as_dict(self) -> dict:
        return {"prompt_set": self.prompt_set, "messages": list(self.messages)}


def split_of(source: str) -> str:
    """``"heldout"`` for one source in :data:`HELDOUT_EVERY`, else ``"train"``."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "heldout" if digest[0] % HELDOUT_EVERY == 0 else "train"


def user_prompt(prompt_set: str, text: str, source: str) -> Prompt:
    return Prompt(prompt_set, ({"role": "user", "content": text},), source)


def dedupe(prompts: Iterable[Prompt]) -> List[Prompt]:
    seen, out = set(), []
    for p in prompts:
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out
