"""Greedy checks of a model: its top-1/top-2 gaps and a draft's agreement."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "The quick brown fox",
    "class Parser:\n    def __init__(self",
)


def _encode(tokenizer, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    return list(prompt)


def greedy_continuation(
    model, prompt_ids: Sequence[int], steps: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens and per-step top-1/top-2 logit gaps, using a KV cache.

    Args:
        model: An mlx-lm model.
        prompt_ids: Prompt token ids.
        steps: Number of tokens to generate.

    Returns:
        ``(tokens, gaps)``: two lists of length ``steps``.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt_ids)[None], cache=cache)[0, -1]
    tokens, gaps = [], []
    for _ in range(steps):
        row = np.array(logits.astype(mx.float32))
        second, first = np.partition(row, -2)[-2:]
        tokens.append(int(row.argmax()))
        gaps.append(float(first - second))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, gaps


def min_top2_gap(
    model, tokenizer, prompts: Iterable[str | Sequence[int]] = PROMPTS, steps: int = 32
) -> float:
    """Smallest top-1 minus top-2 logit over greedy decoding of ``prompts``.

    Args:
        model: An mlx-lm model.
        tokenizer: Its tokenizer (used to encode string prompts).
        prompts: Prompts (strings or token id lists). Default: :data:`PROMPTS`.
        steps: Greedy steps per prompt. Default: ``32``.

    Returns:
        The minimum gap over all prompts and steps.
    """
    return min(
        min(greedy_continuation(model, _encode(tokenizer, p), steps)[1])
        for p in prompts
    )


def greedy_agreement(
    target,
    draft,
    tokenizer,
    prompts: Iterable[str | Sequence[int]] = PROMPTS,
    steps: int = 32,
) -> float:
    """Fraction of positions where the draft's argmax equals the target's.

    Teacher forcing: the target decodes ``steps`` greedy tokens per prompt,
    then the draft reads prompt + continuation in one pass; position ``i``
    agrees when the draft's argmax predicts continuation token ``i``. This
    is the per-token greedy acceptance rate of speculative decoding.

    Args:
        target: The target mlx-lm model.
        draft: A draft model sharing the tokenizer (its head may be padded).
        tokenizer: The shared tokenizer.
        prompts: Prompts (strings or token id lists). Default: :data:`PROMPTS`.
        steps: Continuation length per prompt. Default: ``32``.

    Returns:
        Agreement in ``[0, 1]``.
    """
    import mlx.core as mx

    hits = total = 0
    for prompt in prompts:
        ids = _encode(tokenizer, prompt)
        tokens, _ = greedy_continuation(target, ids, steps)
        logits = draft(mx.array(ids + tokens[:-1])[None])[0, len(ids) - 1 :]
        predicted = np.array(mx.argmax(logits, axis=-1)).tolist()
        hits += sum(p == t for p, t in zip(predicted, tokens))
        total += len(tokens)
    return hits / total
