"""``batch_generate``: mlx_lm's batch API, with speculation in every row.

The prompts decode together in the server's continuous batching engine
(:class:`~mlx_spec.serve.batch.SpecBatchGenerator`): one target forward per
round verifies every row's drafts, and each row's output is exactly what it
would be alone (greedy: plain mlx_lm's tokens). Methods the batch does not
run (trees, heads, self-speculation) and models whose caches have no batched
rollback decode one prompt at a time on the single-sequence engine instead.
"""

import time
from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchResponse, BatchStats
from mlx_lm.tokenizer_utils import TokenizerWrapper

from .config import DEFAULT_NUM_DRAFT_TOKENS, check_generation_options, plan_method
from .generation import _check_positional, _encode, stream_generate
from .models import num_caches
from .serve.batch import BATCH_METHODS, DEFAULT_MAX_BATCH, SeqSpec, SpecBatchGenerator
from .serve.batch_cache import pair_unbatchable
from .stats import SpecStats
from .validation import spec_config

Prompt = Union[str, List[int]]


@dataclass
class SpecBatchResponse(BatchResponse):
    """mlx_lm's ``BatchResponse`` plus each row's speculation statistics.

    Attributes:
        spec_stats: One :class:`SpecStats` per prompt, in order.
        batched: Whether the rows decoded together (else one at a time).
    """

    spec_stats: List[SpecStats] = field(default_factory=list)
    batched: bool = True


# mlx_lm.batch_generate's positional arguments.
BATCH_ORDER = "model, tokenizer, prompts, prompt_caches, max_tokens"


def batch_generate(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    prompt_caches: None = None,
    max_tokens: Union[int, List[int]] = 128,
    *,
    draft_model: Optional[nn.Module] = None,
    speculative: Optional[str] = None,
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    seed: Optional[int] = None,
    verbose: bool = False,
    return_prompt_caches: bool = False,
    return_token_ids: bool = False,
    return_logprobs: bool = False,
    prefill_step_size: int = 512,
    max_batch: int = DEFAULT_MAX_BATCH,
    **method_options,
) -> SpecBatchResponse:
    """Generate a response for every prompt, as ``mlx_lm.batch_generate`` does.

    Args:
        model, tokenizer: The target and its tokenizer.
        prompts: Token lists (as in mlx_lm) or strings.
        prompt_caches: Must be ``None``: rows start from their whole prompts
          (the place of ``mlx_lm.batch_generate``'s argument, so that the
          arguments keep its order).
        draft_model: An optional draft model with the same tokenizer.
        speculative: ``"none"``, ``"lookup"``, ``"draft"`` or ``"auto"``
          decode batched; any other method one prompt at a time. Default:
          ``"auto"``.
        max_tokens: Most tokens per response, one for all or one per prompt.
        num_draft_tokens, temp, top_p, top_k, min_p, min_tokens_to_keep,
          seed, method_options: As for :func:`mlx_spec.stream_generate`.
        verbose: Print progress and the totals, as mlx_lm does.
        return_prompt_caches: Return each row's prompt cache (the target's
          layers) holding its prompt and response.
        return_token_ids, return_logprobs: Return each response's tokens and
          the target's log-probability of each.
        prefill_step_size: Prompt tokens per prefill chunk.
        max_batch: Most rows decoding together.

    Returns:
        SpecBatchResponse: mlx_lm's ``BatchResponse`` (``texts``, ``stats``,
        ``caches``, ``token_ids``, ``logprobs``) plus ``spec_stats``.
    """
    _check_positional(prompt_caches, "prompt_caches", BATCH_ORDER)
    if prompt_caches is not None:
        raise ValueError(
            "batch_generate does not take prompt_caches with speculation; pass the "
            "whole prompts (or call without draft_model and speculative)."
        )
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    method, uses_draft = plan_method(speculative, draft_model)
    limits = _max_tokens_per_prompt(max_tokens, len(prompts))
    options = dict(
        num_draft_tokens=num_draft_tokens,
        temp=temp,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        min_tokens_to_keep=min_tokens_to_keep,
        **method_options,
    )
    config = spec_config(speculative, draft_model, **options)
    configs = [replace(config, max_tokens=n) for n in limits]
    check_generation_options(seed=seed, prefill_step_size=prefill_step_size)
    ids = [_encode(tokenizer, p).tolist() for p in prompts]
    if any(not row for row in ids):
        raise ValueError("a prompt is empty; give each prompt some text or tokens.")
    if seed is not None:
        mx.random.seed(seed)
    drafter = draft_model if uses_draft else None
    reason = _why_not_batched(method, model, drafter)
    keep = (return_prompt_caches, return_logprobs)
    if reason is None:
        params = configs[0].sampling_params
        # A seeded sampled batch is planned by the fixed model, as alone.
        timed = seed is None or params.greedy
        gen = SpecBatchGenerator(
            model,
            drafter,
            prefill_step_size=prefill_step_size,
            max_batch=max_batch,
            timed=timed,
        )
        rows, stats = _batched(gen, tokenizer, ids, configs, params, verbose, keep)
    else:
        run = dict(prefill_step_size=prefill_step_size, **options)
        rows, stats = _one_at_a_time(
            model, tokenizer, ids, drafter, configs, run, verbose, keep
        )
    if verbose:
        _print_totals(stats, reason)
    return SpecBatchResponse(
        texts=[tokenizer.decode(r.tokens) for r in rows],
        stats=stats,
        caches=[r.cache for r in rows] if return_prompt_caches else None,
        token_ids=[r.tokens for r in rows] if return_token_ids else None,
        logprobs=[r.logprobs for r in rows] if return_logprobs else None,
        spec_stats=[r.stats for r in rows],
        batched=reason is None,
    )


@dataclass
class _Row:
    """One prompt's response as it is collected."""

    stats: SpecStats
    prompt: List[int]
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    cache: Optional[List[Any]] = None


def _max_tokens_per_prompt(max_tokens, count: int) -> List[int]:
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        return [max_tokens] * count
    limits = list(max_tokens)
    if len(limits) != count:
        raise ValueError(
            f"max_tokens has {len(limits)} values for {count} prompts; give one "
            "per prompt or a single int."
        )
    return limits


def _why_not_batched(method: str, model, drafter) -> Optional[str]:
    """Why these prompts decode one at a time, or ``None`` if they batch."""
    if method not in BATCH_METHODS:
        return f"speculative={method!r} is not batched (batched: {', '.join(BATCH_METHODS)})"
    return pair_unbatchable(model, drafter)


def _batched(gen, tokenizer, ids, configs, params, verbose, keep):
    """Decode every prompt in one continuous batch."""
    eos = frozenset(tokenizer.eos_token_ids)
    rows, uids = [], {}
    for prompt, config in zip(ids, configs):
        row = _Row(SpecStats(), prompt)
        spec = SeqSpec(
            prompt,
            config,
            params=None if params.greedy else params,
            stop_tokens=eos,
            isolation=True,
        )
        uids[gen.insert(spec, row.stats)] = row
        rows.append(row)
    model, target_layers = gen.model, gen.num_target_caches
    keep_caches, _ = keep
    tic, finished = time.perf_counter(), 0
    gen.prefill_waiting()  # as mlx_lm does: every row decodes from the first round
    while gen.has_work:
        for out in gen.next():
            row = uids[out.uid]
            row.tokens += out.tokens
            row.logprobs += out.logprobs
            if out.finish_reason is None:
                continue
            if out.finish_reason == "stop":  # mlx_lm leaves the EOS token out
                row.tokens, row.logprobs = row.tokens[:-1], row.logprobs[:-1]
            if keep_caches and out.cache is not None:
                held = (out.cache[:target_layers], out.cache_tokens)
                row.cache = _catch_up(model, *held, row.prompt + row.tokens)
            finished += 1
            if verbose:
                print(f"[batch_generate] Finished {finished}/{len(rows)} ...", end="\r")
    return rows, _batch_stats(rows, gen.rounds, time.perf_counter() - tic)


def _one_at_a_time(model, tokenizer, ids, drafter, configs, options, verbose, keep):
    """Decode the prompts one after another on the single-sequence engine."""
    from mlx_lm.models.cache import make_prompt_cache

    keep_caches, keep_logprobs = keep
    rows, tic = [], time.perf_counter()
    for i, (prompt, config) in enumerate(zip(ids, configs)):
        cache = make_prompt_cache(model)
        if drafter is not None:
            cache += make_prompt_cache(drafter)  # empty for a head
        stream = stream_generate(
            model,
            tokenizer,
            prompt,
            draft_model=drafter,
            speculative=config.method,
            max_tokens=config.max_tokens,
            prompt_cache=cache,
            **options,
        )
        row = _Row(stream.stats, prompt)
        for r in stream:
            if r.finish_reason != "stop":  # mlx_lm leaves the EOS token out
                row.tokens.append(r.token)
                if keep_logprobs:
                    row.logprobs.append(r.logprobs[r.token].item())
        if keep_caches:
            row.cache = cache[: num_caches(model)]
        rows.append(row)
        if verbose:
            print(f"[batch_generate] Finished {i + 1}/{len(ids)} ...", end="\r")
    steps = sum(r.stats.target_forwards for r in rows)
    return rows, _batch_stats(rows, steps, time.perf_counter() - tic)


def _catch_up(model, cache: List[Any], held: List[int], tokens: List[int]):
    """Feed ``cache`` (holding ``held``) the rest of ``tokens``: a row leaves the
    batch with the tokens it verified, and may lag its last ones."""
    rest = tokens[len(held) :]
    if rest:
        model(mx.array([rest], mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _batch_stats(rows: List[_Row], steps: int, wall: float) -> BatchStats:
    """mlx_lm's totals; a step is one target forward over the batch."""
    prompt_time = sum(r.stats.prompt_time for r in rows)
    return BatchStats(
        prompt_tokens=sum(r.stats.prompt_tokens for r in rows),
        prompt_time=min(prompt_time, wall),
        generation_tokens=sum(len(r.tokens) for r in rows),
        generation_steps=steps,
        decode_time=max(0.0, wall - prompt_time),
        wall_time=wall,
        peak_memory=mx.get_peak_memory() / 1e9,
    )


def _print_totals(stats: BatchStats, reason: Optional[str]):
    print()
    if reason:
        print(f"[batch_generate] One prompt at a time: {reason}.")
    print(
        f"[batch_generate] Prompt: {stats.prompt_tokens} tokens, "
        f"{stats.prompt_tps:.3f} tokens-per-sec"
    )
    print(
        f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
        f"{stats.generation_tps:.3f} tokens-per-sec"
    )
    print(f"[batch_generate] Peak memory: {stats.peak_memory:.3f} GB")
