"""The speculative generation loop.

Each round: the drafter proposes γ tokens (lazily, async-evaluated), the
target scores ``[last, d_1..d_γ]`` in one forward, acceptance runs on
device, and the host syncs once to read ``(num_accepted, next_token,
drafts)``. Both caches are then rewound to the accepted tokens.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START, generation_stream

from .acceptance import match_accept, rejection_accept
from .config import SpecConfig
from .drafters import Proposal, RoundState, make_drafter
from .models import CachedModel, KVSettings, output_size
from .sampling import SamplingParams, normalize, processed_logprobs, sampling_params_of
from .stats import SpecStats

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

ACCEPTED, RECOVERED, BONUS, TARGET = "accepted", "recovered", "bonus", "target"


@dataclass
class TokenEvent:
    """One emitted token with where it came from.

    ``kind`` is ``"accepted"`` (a draft token the target kept),
    ``"recovered"`` (the target's token after a rejection), ``"bonus"``
    (the target's token after all drafts were accepted) or ``"target"``
    (a plain target step with no draft).
    """

    token: int
    logprobs: mx.array
    from_draft: bool
    kind: str
    round: int
    rejected: List[int] = field(default_factory=list)


class Law:
    """How tokens are chosen: greedy, exact rejection sampling, or sample-and-match.

    Exact rejection sampling needs the sampler's law; an opaque ``sampler``
    callable falls back to sample-and-match, which is also exact.
    """

    def __init__(self, params: Optional[SamplingParams], sampler: Optional[Callable]):
        self.params = params
        self.sampler = sampler
        if params is not None and params.greedy:
            self.mode = "greedy"
        elif params is not None:
            self.mode = "rejection"
        else:
            self.mode = "match"

    def draft_choice(self, logprobs: mx.array) -> Tuple[mx.array, Optional[mx.array]]:
        """Pick a draft token from ``logprobs`` ``(1, V)``; return it and its law."""
        if self.mode == "greedy":
            return mx.argmax(logprobs, axis=-1), None
        if self.mode == "rejection":
            law = processed_logprobs(logprobs, self.params)
            return mx.random.categorical(law), law
        return self.sampler(logprobs), None

    def accept(self, proposal: Proposal, target_logprobs: mx.array):
        """Return ``(num_accepted, next_token)`` on device.

        Args:
            proposal: The round's draft tokens ``(γ,)`` and their law.
            target_logprobs: The target's logprobs ``(γ + 1, V)``.
        """
        drafts = proposal.tokens
        if self.mode == "greedy":
            return match_accept(drafts, mx.argmax(target_logprobs, axis=-1))
        if self.mode == "match":
            return match_accept(drafts, self.sampler(target_logprobs))
        law = processed_logprobs(target_logprobs, self.params)
        if proposal.size == 0:
            return mx.array(0, mx.int32), mx.random.categorical(law[0])
        return rejection_accept(drafts, law, proposal.logprobs)


def _process(
    logits: mx.array, history: Optional[mx.array], processors: List[LogitsProcessor]
) -> mx.array:
    """Apply logits processors row by row (each row has its own history)."""
    if not processors:
        return normalize(logits)
    rows = []
    for i in range(logits.shape[0]):
        row = logits[i : i + 1]
        for processor in processors:
            row = processor(history[: history.shape[0] - logits.shape[0] + 1 + i], row)
        rows.append(row)
    return normalize(mx.concatenate(rows, axis=0))


def _validate_vocab(model, draft_model, tokenizer_size: Optional[int]):
    """Check the draft can be compared with the target; return the target width."""
    target_width = output_size(model)
    if draft_model is None:
        return target_width
    draft_width = output_size(draft_model)
    needed = tokenizer_size if tokenizer_size is not None else target_width
    if draft_width < needed:
        raise ValueError(
            f"the draft model emits {draft_width} logits but the tokenizer has "
            f"{needed} tokens; use a draft that shares the target's tokenizer."
        )
    return target_width


def speculative_generate_step(
    prompt: mx.array,
    model: nn.Module,
    draft_model: Optional[nn.Module] = None,
    *,
    num_draft_tokens: int = 4,
    max_tokens: int = 256,
    sampler: Optional[Callable] = None,
    logits_processors: Optional[List[LogitsProcessor]] = None,
    prompt_cache: Optional[List[Any]] = None,
    prefill_step_size: int = 512,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    config: Optional[SpecConfig] = None,
    stats: Optional[SpecStats] = None,
    tokenizer_size: Optional[int] = None,
) -> Generator[Tuple[int, mx.array, bool], None, None]:
    """A generator of ``(token, logprobs, from_draft)``, like mlx_lm's.

    Args:
        prompt: The prompt tokens, shape ``(L,)``.
        model: The target model.
        draft_model: The draft model (same tokenizer).
        num_draft_tokens: Draft tokens per round. Default: ``4``.
        max_tokens: Maximum number of tokens. Default: ``256``.
        sampler: A sampler; one from :func:`mlx_spec.make_sampler` (or
          ``mlx_lm``'s, after :func:`mlx_spec.register`) allows exact rejection
          sampling; any other callable uses sample-and-match. Default: greedy.
        logits_processors: mlx_lm logits processors, applied per position.
        prompt_cache: Target caches followed by draft caches (trimmable);
          updated in place. On return it holds the prompt and every yielded
          token, as mlx_lm's plain decoding leaves it.
        prefill_step_size: Prompt tokens per prefill chunk. Default: ``512``.
        kv_bits, kv_group_size, quantized_kv_start: KV-cache quantisation,
          as in ``mlx_lm.generate``.
        config: A :class:`SpecConfig`; overrides ``num_draft_tokens`` and
          ``max_tokens`` when given.
        stats: A :class:`SpecStats` to fill in place.
        tokenizer_size: The tokenizer's vocabulary size, to check the draft.

    Yields:
        Tuple[int, mx.array, bool]: One token, the target's log-probabilities
          for it ``(V,)``, and whether the draft proposed it.
    """
    events = speculative_events(
        prompt,
        model,
        draft_model,
        num_draft_tokens=num_draft_tokens,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=logits_processors,
        prompt_cache=prompt_cache,
        prefill_step_size=prefill_step_size,
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        quantized_kv_start=quantized_kv_start,
        config=config,
        stats=stats,
        tokenizer_size=tokenizer_size,
    )
    return ((e.token, e.logprobs, e.from_draft) for e in events)


def speculative_events(
    prompt,
    model,
    draft_model=None,
    *,
    num_draft_tokens: int = 4,
    max_tokens: int = 256,
    sampler=None,
    logits_processors=None,
    prompt_cache=None,
    prefill_step_size: int = 512,
    kv_bits=None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    config: Optional[SpecConfig] = None,
    stats: Optional[SpecStats] = None,
    tokenizer_size: Optional[int] = None,
) -> Generator[TokenEvent, None, None]:
    """Validate eagerly, then return the generator of :class:`TokenEvent`."""
    if config is None:
        config = SpecConfig(
            method="draft", num_draft_tokens=num_draft_tokens, max_tokens=max_tokens
        )
    if isinstance(prompt, (list, tuple)):
        prompt = mx.array(prompt)
    if prompt.size == 0:
        raise ValueError("the prompt is empty; give at least one token.")
    if prefill_step_size < 1:
        raise ValueError(f"prefill_step_size={prefill_step_size} is out of range: an integer >= 1.")

    kv = KVSettings(kv_bits, kv_group_size, quantized_kv_start)
    num_target_layers = len(model.layers)
    target_cache = prompt_cache[:num_target_layers] if prompt_cache is not None else None
    drafter_cache = prompt_cache[num_target_layers:] if prompt_cache is not None else None
    target = CachedModel(model, target_cache, kv, "target model")
    vocab_size = _validate_vocab(model, draft_model, tokenizer_size)
    drafter = make_drafter(config, target, draft_model, drafter_cache, kv, vocab_size)
    params = sampling_params_of(sampler)
    if sampler is None:
        params = SamplingParams(
            config.temp, config.top_p, config.min_p, config.top_k, config.min_tokens_to_keep
        )
    law = Law(params, sampler)
    stats = stats if stats is not None else SpecStats()
    stats.method = config.method
    stats.num_draft_tokens = config.num_draft_tokens
    return _generate(
        prompt.astype(mx.uint32),
        target,
        drafter,
        law,
        config,
        logits_processors or [],
        prefill_step_size,
        stats,
        prompt_cache,
    )


def _generate(prompt, target, drafter, law, config, processors, prefill_step_size, stats,
              prompt_cache):
    base = target.offset
    seq: List[int] = prompt.tolist()
    history = prompt if processors else None
    caller_owns_cache = prompt_cache is not None
    generated = 0
    round_index = 0

    with mx.stream(generation_stream):
        try:
            tic = time.perf_counter()
            drafter.prefill(prompt[:-1], prefill_step_size)
            target.prefill(prompt[:-1], prefill_step_size)
            stats.prompt_tokens = int(prompt.size)
            stats.prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()

            def choose(logits, drafted):
                hist = None
                if processors:
                    hist = mx.concatenate([history, *drafted]) if drafted else history
                return law.draft_choice(_process(logits, hist, processors))

            while generated < config.max_tokens:
                gamma = min(config.num_draft_tokens, config.max_tokens - generated - 1)
                state = RoundState(seq, base, choose)
                round_tic = time.perf_counter()
                if gamma > 0:
                    proposal = drafter.propose(state, gamma)
                else:
                    proposal = Proposal(mx.array([], mx.uint32), None)
                if config.profile:
                    mx.eval(proposal.tokens, proposal.logprobs)
                    stats.draft_time = (stats.draft_time or 0.0) + time.perf_counter() - round_tic
                verify_tic = time.perf_counter()

                inputs = mx.concatenate([mx.array(seq[-1:], mx.uint32), proposal.tokens])
                logits = target(inputs)
                verify_history = None
                if processors:
                    verify_history = mx.concatenate([history, proposal.tokens])
                target_logprobs = _process(logits, verify_history, processors)
                num_accepted, next_token = law.accept(proposal, target_logprobs)

                # The round's single host sync.
                packed = mx.concatenate(
                    [num_accepted.reshape(1).astype(mx.uint32),
                     next_token.reshape(1).astype(mx.uint32), proposal.tokens]
                )
                sync_tic = time.perf_counter()
                mx.eval(packed, target_logprobs)
                values = packed.tolist()
                done = time.perf_counter()
                if config.profile:
                    stats.verify_time = (stats.verify_time or 0.0) + done - verify_tic
                else:
                    stats.sync_time += done - sync_tic

                n, token, drafts = values[0], values[1], values[2:]
                target.trim_to(base + len(seq) + n)
                drafter.commit(state, proposal, n)
                stats.rounds += 1
                stats.target_forwards += 1
                stats.draft_forwards += proposal.forwards
                stats.draft_tokens += gamma
                stats.accepted_tokens += n
                if gamma > 0:
                    stats.accepted_per_round.append(n)
                    stats.drafted_per_round.append(gamma)

                emitted = drafts[:n] + [token]
                if processors:
                    history = mx.concatenate([history, mx.array(emitted, mx.uint32)])
                for i, tok in enumerate(emitted):
                    if i < n:
                        kind, rejected = ACCEPTED, []
                    elif gamma == 0:
                        kind, rejected = TARGET, []
                    elif n == gamma:
                        kind, rejected = BONUS, []
                    else:
                        kind, rejected = RECOVERED, drafts[n:]
                    seq.append(tok)
                    generated += 1
                    stats.generated_tokens = generated
                    stats.generation_time = time.perf_counter() - tic
                    yield TokenEvent(tok, target_logprobs[i], i < n, kind, round_index, rejected)
                round_index += 1
                if round_index % 256 == 0:
                    mx.clear_cache()
        finally:
            _finish(target, drafter, seq, base, caller_owns_cache, prompt_cache)


def _finish(target, drafter, seq, base, caller_owns_cache, prompt_cache):
    """Leave the caches holding exactly the prompt and the yielded tokens."""
    target.trim_to(base + len(seq))
    if caller_owns_cache:
        missing = seq[target.offset - base :]
        if missing:
            target(mx.array(missing, mx.uint32))
            mx.eval([c.state for c in target.cache])
        drafter.sync(seq, base)
        prompt_cache[:] = target.cache + drafter.caches()
