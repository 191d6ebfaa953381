"""``stream_generate`` and ``generate``, as in ``mlx_lm.generate``.

The same arguments and the same ``GenerationResponse`` objects, plus
``speculative=`` and the speculation statistics. The ``mlx_spec.generate``
command lives in :mod:`mlx_spec.cli.generate`.
"""

import inspect
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import (
    DEFAULT_QUANTIZED_KV_START,
    GenerationResponse,
    generate_step,
    generation_stream,
    wired_limit,
)
from mlx_lm.models.cache import (
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from .caches.owners import claim, own, spoil
from .chat_text import repair_text
from .config import DEFAULT_NUM_DRAFT_TOKENS, SpecConfig, check_generation_options
from .distributed import tokens_per_poll
from .engine import TARGET, speculative_events
from .limits import GenerationCancelled, stopping_progress
from .loading import tokenizer_size
from .models import cache_offset
from .stats import SpecStats
from .validation import spec_config

DEFAULT_MAX_TOKENS = 256
DEFAULT_PROMPT = "def fibonacci(n):\n"
# The keyword that gives the engine the tokens already in the prompt cache
# (the n-gram index of prompt lookup reads the whole conversation).
HISTORY_KEY = "history_tokens"


@dataclass
class SpecResponse(GenerationResponse):
    """An mlx_lm ``GenerationResponse`` with where the token came from.

    Attributes:
        kind: ``"accepted"``, ``"recovered"``, ``"bonus"`` or ``"target"``.
        round: Index of the verification round that emitted the token.
        rejected: For a recovered token, the draft tokens it replaced.
        stats: The generation's :class:`SpecStats` (filled in as it runs).
    """

    kind: str = TARGET
    round: int = 0
    rejected: List[int] = field(default_factory=list)
    stats: Optional[SpecStats] = None


class SpecStream:
    """The iterator ``stream_generate`` returns; ``.stats`` holds the counters."""

    def __init__(self, responses: Iterator[SpecResponse], stats: SpecStats):
        self._responses = responses
        self.stats = stats

    def __iter__(self):
        return self

    def __next__(self) -> SpecResponse:
        return next(self._responses)

    def close(self):
        self._responses.close()


def _encode(tokenizer, prompt) -> mx.array:
    if isinstance(prompt, mx.array):
        return prompt
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty; give some text to continue.")
        prompt = repair_text(prompt)  # invalid UTF-8 from argv: U+FFFD
        add_special = tokenizer.bos_token is None or not prompt.startswith(
            tokenizer.bos_token
        )
        prompt = tokenizer.encode(prompt, add_special_tokens=add_special)
    return mx.array(prompt)


STREAM_ORDER = "model, tokenizer, prompt, max_tokens, draft_model"


def _check_positional(value, name: str, order: str = STREAM_ORDER) -> None:
    """A one-line ``TypeError`` for a model passed where mlx-lm's order puts ``name``."""
    if isinstance(value, nn.Module):
        raise TypeError(
            f"{name} got a model: the arguments follow mlx-lm's order ({order}, "
            "...); pass the draft model as draft_model=."
        )


def stream_generate(
    model: nn.Module,
    tokenizer: Any,
    prompt: Union[str, mx.array, List[int]],
    max_tokens: int = DEFAULT_MAX_TOKENS,
    draft_model: Optional[nn.Module] = None,
    *,
    speculative: Optional[str] = None,
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    seed: Optional[int] = None,
    sampler: Optional[Callable] = None,
    logits_processors: Optional[List[Callable]] = None,
    prompt_cache: Optional[List[Any]] = None,
    max_kv_size: Optional[int] = None,
    prefill_step_size: int = 512,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    profile: bool = False,
    history_tokens: Optional[List[int]] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    config: Optional[SpecConfig] = None,
    **method_options,
) -> SpecStream:
    """Generate text, yielding mlx_lm ``GenerationResponse`` objects.

    The arguments come in ``mlx_lm.stream_generate``'s order (``model,
    tokenizer, prompt, max_tokens, draft_model``); the rest are keywords.

    Args:
        model: The target model (any mlx_lm model).
        tokenizer: Its tokenizer.
        prompt: Text or token ids.
        max_tokens: Maximum number of generated tokens. Default: ``256``.
        draft_model: An optional draft model with the same tokenizer.
        speculative: ``"none"``, ``"draft"``, ``"tree"``, ``"lookup"``,
          ``"self"`` or ``"auto"``. Default: ``"auto"``, which picks among
          the methods this call can use (with or without a draft model).
        num_draft_tokens: Draft tokens per round (1 to 64). Default: ``4``.
        temp, top_p, top_k, min_p, min_tokens_to_keep: Sampling law, as in
          ``mlx_lm.sample_utils.make_sampler``. Default: greedy.
        seed: Seed for reproducible sampling. Default: ``None``.
        sampler: An explicit sampler (overrides the sampling arguments).
        logits_processors: mlx_lm logits processors.
        prompt_cache: Prompt cache to reuse across calls: for speculative
          methods, ``make_prompt_cache(model) + make_prompt_cache(draft_model)``.
        max_kv_size: Bound the KV cache (a rotating cache); plain decoding only:
          its 4 kept sink tokens are masked differently by mlx-lm in
          multi-token forwards, so verification cannot match plain decoding.
        prefill_step_size: Prompt tokens per prefill chunk. Default: ``512``.
        kv_bits, kv_group_size, quantized_kv_start: KV-cache quantisation.
        profile: Split the time of each round into drafting and verification
          (adds one sync per round). Default: ``False``.
        history_tokens: The tokens ``prompt_cache`` already holds (earlier
          turns of a conversation), so prompt lookup can match them too.
        prompt_progress_callback: ``f(processed, total)`` called as the
          prompt is processed, as in mlx_lm.
        should_stop: Polled after each prefill chunk and each token yielded
          (sharded, where it must be a collective, after every
          :data:`~mlx_spec.distributed.POLL_TOKENS`-th token only); once
          it returns true the stream raises
          :class:`~mlx_spec.limits.GenerationCancelled` (a server passes
          "the client left"). ``prompt_cache`` then holds the prompt and the
          tokens yielded; stopped during the prompt, what it held before
          (a recurrent cache that cannot go back is refused if reused).
        config: A config checked already (see :func:`mlx_spec.validation.spec_config`);
          it replaces ``speculative``, the sampling arguments, ``max_tokens``,
          ``seed``, ``profile`` and the method options.
        method_options: Further :class:`SpecConfig` fields of later methods.

    Returns:
        SpecStream: iterates over :class:`SpecResponse` (a
        ``GenerationResponse``); its ``stats`` attribute and each response's
        ``stats`` hold the :class:`SpecStats`.

    A stream left suspended (the caller broke out of its loop without
    ``close()``) is closed by the next call given the same ``prompt_cache``,
    so that call continues from exactly the prompt and the tokens yielded.
    """
    _check_positional(max_tokens, "max_tokens")
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    check_generation_options(
        seed=seed,
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        quantized_kv_start=quantized_kv_start,
        prefill_step_size=prefill_step_size,
        max_kv_size=max_kv_size,
    )
    if config is None:
        config = spec_config(
            speculative,
            draft_model,
            num_draft_tokens=num_draft_tokens,
            temp=temp,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            min_tokens_to_keep=min_tokens_to_keep,
            max_tokens=max_tokens,
            seed=seed,
            profile=profile,
            **method_options,
        )
    method, max_tokens = config.method, config.max_tokens
    prompt = _encode(tokenizer, prompt)
    if prompt.size == 0:
        raise ValueError("the prompt is empty; give some text to continue.")
    claim(prompt_cache)  # close a suspended stream on these caches first
    if config.seed is not None:
        mx.random.seed(config.seed)
    stats = SpecStats(method=method, num_draft_tokens=config.num_draft_tokens)
    progress = stopping_progress(should_stop, prompt_progress_callback)

    if method == "none":
        if sampler is None:
            law = config.sampling_params  # temp 0 below representable
            sampler = mlx_lm_make_sampler(
                law.temp, law.top_p, law.min_p, law.min_tokens_to_keep, top_k=law.top_k
            )
        steps = generate_step(
            prompt,
            model,
            max_tokens=max_tokens,
            sampler=sampler,
            logits_processors=logits_processors,
            prompt_cache=prompt_cache,
            max_kv_size=max_kv_size,
            prefill_step_size=prefill_step_size,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
            quantized_kv_start=quantized_kv_start,
            prompt_progress_callback=progress,
        )
        events = _plain_events(steps, stats, prompt.size, prompt_cache)
    else:
        if prompt_cache is None and max_kv_size is not None:
            # As in mlx_lm; the engine refuses it by name (see max_kv_size above).
            prompt_cache = make_prompt_cache(model, max_kv_size)
            if draft_model is not None:
                prompt_cache += make_prompt_cache(draft_model, max_kv_size)
        events = speculative_events(
            prompt,
            model,
            draft_model,
            sampler=sampler,
            logits_processors=logits_processors,
            prompt_cache=prompt_cache,
            prefill_step_size=prefill_step_size,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
            quantized_kv_start=quantized_kv_start,
            config=config,
            stats=stats,
            tokenizer_size=tokenizer_size(tokenizer),
            history_tokens=history_tokens,
            prompt_progress_callback=progress,
        )
    responses = _responses(
        events, tokenizer, prompt.size, max_tokens, stats, model, should_stop
    )
    stream = SpecStream(responses, stats)
    own(prompt_cache, stream)
    return stream


def _plain_events(steps, stats: SpecStats, prompt_size: int, prompt_cache):
    """Plain mlx_lm decoding, seen as events (one target forward per token)."""
    from .engine import TokenEvent

    tic = time.perf_counter()
    before = cache_offset(prompt_cache) if prompt_cache else None
    try:
        first = next(steps, None)
    except GenerationCancelled:  # stopped during the prompt: drop what it fed
        _drop_prompt(prompt_cache, before)
        raise
    if first is None:
        return
    for n, (token, logprobs) in enumerate(itertools.chain([first], steps)):
        if n == 0:
            stats.prompt_tokens = prompt_size
            stats.prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()
        stats.generated_tokens = n + 1
        stats.target_forwards = n + 1
        stats.rounds = n + 1
        stats.generation_time = time.perf_counter() - tic
        yield TokenEvent(int(token), logprobs, False, TARGET, n)


def _drop_prompt(prompt_cache, before: Optional[int]) -> None:
    """Rewind ``prompt_cache`` to ``before`` tokens, or mark it spoilt."""
    if not prompt_cache:
        return
    now = cache_offset(prompt_cache)
    if before is not None and now is not None and can_trim_prompt_cache(prompt_cache):
        trim_prompt_cache(prompt_cache, now - before)
    else:
        spoil(prompt_cache)


def _responses(events, tokenizer, prompt_size, max_tokens, stats, model, should_stop):
    """Turn token events into responses, as mlx_lm's ``stream_generate`` does."""
    detokenizer = tokenizer.detokenizer
    every = tokens_per_poll()
    with wired_limit(model, [generation_stream]):
        try:
            event = None
            for n, event in enumerate(events):
                if event.token in tokenizer.eos_token_ids:
                    break
                detokenizer.add_token(event.token)
                if n + 1 == max_tokens:
                    break
                yield _response(
                    detokenizer.last_segment, event, stats, prompt_size, None
                )
                polls = should_stop is not None and (n + 1) % every == 0
                if polls and should_stop():
                    raise GenerationCancelled(f"stopped after {n + 1} tokens")
            if event is None:
                return
            detokenizer.finalize()
            reason = "stop" if event.token in tokenizer.eos_token_ids else "length"
            yield _response(detokenizer.last_segment, event, stats, prompt_size, reason)
        finally:
            events.close()


def _response(text, event, stats, prompt_size, finish_reason) -> SpecResponse:
    return SpecResponse(
        text=text,
        token=event.token,
        logprobs=event.logprobs,
        from_draft=event.from_draft,
        prompt_tokens=prompt_size,
        prompt_tps=stats.prompt_tps,
        generation_tokens=stats.generated_tokens,
        generation_tps=stats.generation_tps,
        peak_memory=mx.get_peak_memory() / 1e9,
        finish_reason=finish_reason,
        kind=event.kind,
        round=event.round,
        rejected=event.rejected,
        stats=stats,
    )


def generate(
    model: nn.Module,
    tokenizer: Any,
    prompt: Union[str, List[int]],
    verbose: bool = False,
    **kwargs,
) -> str:
    """Generate a complete response; ``kwargs`` (``draft_model``,
    ``max_tokens``, ...) go to :func:`stream_generate`.

    The arguments come in ``mlx_lm.generate``'s order. With ``verbose=True``
    prints the text and timings in mlx_lm's format, followed by a line of
    speculation statistics.
    """
    _check_positional(verbose, "verbose")
    stream = stream_generate(model, tokenizer, prompt, **kwargs)
    return collect_text(stream, verbose)


def collect_text(stream: SpecStream, verbose: bool) -> str:
    """Gather the text; with ``verbose`` print it as mlx_lm.generate does."""
    if verbose:
        print("=" * 10)
    text, response = "", None
    for response in stream:
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose:
        print()
        print("=" * 10)
        if not text:
            print("No text generated for this prompt")
        if response is not None:
            print(
                f"Prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec"
            )
            print(
                f"Generation: {response.generation_tokens} tokens, "
                f"{response.generation_tps:.3f} tokens-per-sec"
            )
            print(f"Peak memory: {response.peak_memory:.3f} GB")
            print(stream.stats.summary())
    return text


def history_kwargs(generate_fn: Callable, history: Sequence[int]) -> Dict[str, Any]:
    """``{"history_tokens": history}`` if ``generate_fn`` takes that keyword.

    Chat and server pass only the uncached suffix of a conversation as the
    prompt; ``history`` is what the prompt cache already holds, so the
    n-gram index of prompt lookup can match the earlier turns too. An
    engine without the keyword gets nothing (its index sees the suffix only).

    Args:
        generate_fn: The ``stream_generate`` about to be called.
        history: Token ids already in the prompt cache, oldest first.
    """
    try:
        parameters = inspect.signature(generate_fn).parameters
    except (TypeError, ValueError):
        return {}
    if HISTORY_KEY not in parameters or not history:
        return {}
    return {HISTORY_KEY: list(history)}
