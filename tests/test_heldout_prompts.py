"""The held-out evaluation prompts (benchmarks/heldout.jsonl): fresh requests
that neither the drafters' training prompts nor the built-in benchmark
suites hold, for measuring ``auto`` against plain decoding."""

from pathlib import Path

import pytest

from mlx_spec.bench.prompts import by_set, load_prompt_file, prompt_suite

HELDOUT = Path(__file__).resolve().parent.parent / "benchmarks" / "heldout.jsonl"


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def test_heldout_prompts_cover_four_kinds_of_work_three_each():
    sets = by_set(load_prompt_file(str(HELDOUT)))
    assert sorted(sets) == ["chat", "code", "editing", "extraction"]
    assert all(len(prompts) == 3 for prompts in sets.values())


def test_heldout_prompts_are_neither_training_nor_benchmark_prompts():
    training = pytest.importorskip("mlx_spec.train.prompts")
    seen = [
        _normal(m["content"])
        for split in training.SPLITS
        for p in training.builtin_prompts(split)
        for m in p.messages
    ]
    seen += [_normal(p.user_text()) for p in prompt_suite(chat=True)]
    seen += [_normal(p.user_text()) for p in prompt_suite(chat=False)]
    assert seen
    for prompt in load_prompt_file(str(HELDOUT)):
        mine = _normal(prompt.user_text())
        # No shared request, nor a shared passage of 40 characters or more.
        pieces = {mine[i : i + 40] for i in range(0, max(len(mine) - 40, 1), 20)}
        clashes = [t for t in seen if any(piece in t for piece in pieces)]
        assert not clashes, (prompt.name, clashes[:1])
