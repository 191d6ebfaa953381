"""Measuring a trained draft with mlx-spec's own engine, as the model card reports it.

- :func:`engine_acceptance`: acceptance by draft position and tokens per
  target forward at fixed draft lengths (adaptive control off), from the
  engine's round counters (``stream.stats``), for a draft model or, with
  ``method="eagle-chain"``, a head;
- :func:`step_time_ratio`: one draft step over one target step, measured
  interleaved in one run at a given context length;
- :func:`end_to_end`: tokens/s of ``--speculative draft`` against plain
  decoding (``none``), interleaved prompt by prompt in one run.
"""

import statistics
import time
from typing import Dict, List, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..generation import stream_generate


def _rounds_by_position(stats, gamma: int):
    """Per draft position: rounds that reached it and rounds that accepted it."""
    reached = [0] * gamma
    accepted = [0] * gamma
    for drafted, ok in zip(stats.drafted_per_round, stats.accepted_per_round):
        for i in range(min(ok + 1, drafted)):
            reached[i] += 1
        for i in range(ok):
            accepted[i] += 1
    return reached, accepted


def engine_acceptance(
    model,
    tokenizer,
    draft,
    prompts: Sequence[List[int]],
    gammas: Sequence[int],
    *,
    max_tokens: int = 128,
    temp: float = 0.0,
    seed: int = 0,
    method: str = "draft",
) -> List[Dict]:
    """Acceptance of ``--speculative METHOD`` at each fixed draft length γ.

    Args:
        model, tokenizer, draft: The pair.
        prompts: Prompt token ids (chat template applied).
        gammas: Draft lengths to measure.
        max_tokens: Tokens generated per prompt.
        temp: Sampling temperature (``0`` = greedy).
        seed: Seed of sampled runs.
        method: A chain method: ``draft`` (default), or ``eagle-chain`` for a head.

    Returns:
        One dict per γ: ``acceptance`` (accepted / drafted, as
        ``SpecStats.acceptance_rate``), ``by_position`` (acceptance of draft
        position ``i`` given the round reached it), ``alpha`` (accepted /
        reached over all positions) and ``tokens_per_forward``.
    """
    out = []
    for gamma in gammas:
        reached, accepted = [0] * gamma, [0] * gamma
        drafted = ok = generated = forwards = 0
        for i, ids in enumerate(prompts):
            stream = stream_generate(
                model,
                tokenizer,
                ids,
                draft_model=draft,
                speculative=method,
                num_draft_tokens=gamma,
                max_tokens=max_tokens,
                temp=temp,
                seed=seed + i if temp > 0 else None,
                adaptive=False,
            )
            for _ in stream:
                pass
            stats = stream.stats
            r, a = _rounds_by_position(stats, gamma)
            reached = [x + y for x, y in zip(reached, r)]
            accepted = [x + y for x, y in zip(accepted, a)]
            drafted += stats.draft_tokens
            ok += stats.accepted_tokens
            generated += stats.generated_tokens
            forwards += stats.target_forwards
        out.append(
            {
                "gamma": gamma,
                "temp": temp,
                "acceptance": round(ok / max(drafted, 1), 4),
                "alpha": round(sum(accepted) / max(sum(reached), 1), 4),
                "by_position": [
                    round(a / r, 4) if r else None for a, r in zip(accepted, reached)
                ],
                "tokens_per_forward": round(generated / max(forwards, 1), 4),
                "generated_tokens": generated,
            }
        )
    return out


def _step_time(model, cache, token: mx.array, steps: int) -> float:
    """Median seconds of one single-token forward (argmax evaluated), cache restored."""
    times = []
    for _ in range(steps):
        tic = time.perf_counter()
        y = mx.argmax(model(token, cache=cache)[:, -1], axis=-1)
        mx.eval(y)
        times.append(time.perf_counter() - tic)
        for c in cache:
            c.trim(1)
    return statistics.median(times)


def step_time_ratio(
    model, draft, *, context: int = 200, rounds: int = 20, steps: int = 4
) -> Dict:
    """One draft step over one target step, at ``context`` tokens, in one run.

    Target and draft steps alternate (``steps`` of each per round, as a
    round of speculative decoding alternates them), so both see the same
    machine load; the ratio of the medians is reported.
    """
    tokens = mx.array([[(7 * i + 3) % 1000 + 10 for i in range(context)]])
    caches = {}
    for name, m in (("target", model), ("draft", draft)):
        caches[name] = make_prompt_cache(m)
        mx.eval(m(tokens, cache=caches[name]))
    token = mx.array([[42]])
    for name, m in (("target", model), ("draft", draft)):
        _step_time(m, caches[name], token, 2)  # warm-up
    target_times, draft_times = [], []
    for _ in range(rounds):
        target_times.append(_step_time(model, caches["target"], token, steps))
        draft_times.append(_step_time(draft, caches["draft"], token, steps))
    t, d = statistics.median(target_times), statistics.median(draft_times)
    return {
        "context": context,
        "target_ms": round(1e3 * t, 2),
        "draft_ms": round(1e3 * d, 2),
        "ratio": round(d / t, 4),
    }


def end_to_end(
    model,
    tokenizer,
    draft,
    prompts: Sequence[List[int]],
    *,
    gamma: int,
    max_tokens: int = 128,
    adaptive: bool = False,
) -> Dict:
    """Greedy tokens/s of ``draft`` (γ) and of plain decoding, prompt by prompt in one run.

    Returns:
        ``none_tps`` and ``draft_tps`` (decode tokens over decode time, summed
        over prompts), their ``speedup``, and whether every output was identical.
    """
    totals = {"none": [0, 0.0], "draft": [0, 0.0]}
    identical = True
    for ids in prompts:
        outputs = {}
        for method in ("none", "draft"):
            options = {} if method == "none" else {"adaptive": adaptive}
            stream = stream_generate(
                model,
                tokenizer,
                ids,
                draft_model=draft if method == "draft" else None,
                speculative=method,
                num_draft_tokens=gamma,
                max_tokens=max_tokens,
                **options,
            )
            tokens = [r.token for r in stream]
            stats = stream.stats
            totals[method][0] += stats.generated_tokens
            totals[method][1] += stats.generation_time
            outputs[method] = tokens
        identical = identical and outputs["none"] == outputs["draft"]
    none_tps = totals["none"][0] / max(totals["none"][1], 1e-9)
    draft_tps = totals["draft"][0] / max(totals["draft"][1], 1e-9)
    return {
        "gamma": gamma,
        "adaptive": adaptive,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "none_tps": round(none_tps, 2),
        "draft_tps": round(draft_tps, 2),
        "speedup": round(draft_tps / max(none_tps, 1e-9), 3),
        "identical": identical,
    }
