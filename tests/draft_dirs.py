"""Untrained distilled drafts of a tiny target, written as train-draft writes them."""

from pathlib import Path
from typing import Sequence

from mlx_spec.drafters.distilled import build_draft, drafter_config, save_draft


def write_draft(target, out, layers: Sequence[int], vocab: int) -> Path:
    """A draft of ``target``'s ``layers`` over its first ``vocab`` ids, in ``out``."""
    draft = build_draft(target, list(range(vocab)), layers)
    save_draft(draft, out, drafter_config(draft, target, layers))
    return Path(out)
