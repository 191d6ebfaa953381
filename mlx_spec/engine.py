"""The speculative generation loop.

Each round: the drafter proposes γ tokens (lazily, async-evaluated), the
target scores ``[last, d_1..d_γ]`` in one forward, acceptance runs on
device, and the host syncs once to read ``(num_accepted, next_token,
drafts)``. Both caches are then rewound to the accepted tokens. A round
that drafts nothing, followed by another known to draft nothing (self
paused), queues that next target step on its lazy token before the sync,
as mlx_lm's plain decoding does. Under greedy decoding an arm's first few
drafting rounds, then one in 16, also sync after drafting, so the measured
cost model (:class:`~mlx_spec.costs.MeasuredCosts`) can tell its draft step
from verification.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START, generation_stream

from .attention.tree import commit_path
from .caches.owners import spoil
from .config import SpecConfig
from .drafters.base import RoundState, empty_proposal
from .drafters.registry import make_drafter
from .features import FeatureCapture, maybe_capturing
from .models import CachedModel, KVSettings, cache_offset, num_caches, output_size
from .planner import RoundPlanner
from .sampling import sampling_params_of
from .stats import SpecStats
from .verify import (  # noqa: F401 (the token kinds are the engine's API too)
    ACCEPTED,
    BONUS,
    RECOVERED,
    TARGET,
    Law,
    LogitsProcessor,
    emitted_logprobs,
    process_logits,
    token_kind,
    verify_chain,
    verify_tree,
)


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


def _validate_vocab(model, draft_model, tokenizer_size: Optional[int]):
    """Check the draft can be compared with the target; return the target width."""
    target_width = output_size(model)
    if draft_model is None or getattr(draft_model, "is_head", False):
        return target_width  # a head proposes through the target's own output layer
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
          ``max_tokens`` when given. Without one the draft length is fixed,
          as in ``mlx_lm``.
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
    history_tokens: Optional[List[int]] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
) -> Generator[TokenEvent, None, None]:
    """Validate eagerly, then return the generator of :class:`TokenEvent`."""
    if config is None:  # mlx_lm's semantics: a fixed draft length
        config = SpecConfig(
            method="draft",
            num_draft_tokens=num_draft_tokens,
            max_tokens=max_tokens,
            adaptive=False,
        )
    if isinstance(prompt, (list, tuple)):
        prompt = mx.array(prompt)
    if prompt.size == 0:
        raise ValueError("the prompt is empty; give at least one token.")
    if prefill_step_size < 1:
        raise ValueError(
            f"prefill_step_size={prefill_step_size} is out of range: an integer >= 1."
        )

    kv = KVSettings(kv_bits, kv_group_size, quantized_kv_start)
    num_target_caches = num_caches(model)
    target_cache = (
        prompt_cache[:num_target_caches] if prompt_cache is not None else None
    )
    drafter_cache = (
        prompt_cache[num_target_caches:] if prompt_cache is not None else None
    )
    target = CachedModel(model, target_cache, kv, "target model")
    if not target.length_known:
        # Recurrent layers only keep a state: take the length from what knows it.
        known = cache_offset(drafter_cache) if drafter_cache else None
        target.assume_length(len(history_tokens) if history_tokens else known or 0)
    vocab_size = _validate_vocab(model, draft_model, tokenizer_size)
    drafter = make_drafter(config, target, draft_model, drafter_cache, kv, vocab_size)
    if history_tokens:
        if len(history_tokens) != target.offset:
            raise ValueError(
                f"history_tokens holds {len(history_tokens)} tokens but prompt_cache "
                f"holds {target.offset}; pass exactly the tokens already in the cache."
            )
        if hasattr(drafter, "add_history"):
            drafter.add_history(list(history_tokens))
    params = sampling_params_of(sampler)
    if sampler is None:
        params = config.sampling_params
    law = Law(params, sampler)
    if logits_processors and hasattr(drafter, "chain_only"):
        drafter.chain_only()  # processors need one token history per position
    if logits_processors and getattr(drafter, "is_tree", False):
        raise ValueError(
            f"logits_processors are not supported by the '{config.method}' method yet; "
            "use --speculative draft."
        )
    stats = stats if stats is not None else SpecStats()
    stats.method = config.method
    stats.num_draft_tokens = config.num_draft_tokens
    stats.note = getattr(drafter, "note", None)
    # Evaluated here: the generator may run in another thread, which has no
    # stream for this thread's lazy arrays.
    prompt = prompt.astype(mx.uint32)
    mx.eval(prompt)
    return _generate(
        prompt,
        target,
        drafter,
        law,
        config,
        logits_processors or [],
        prefill_step_size,
        stats,
        prompt_cache,
        prompt_progress_callback,
    )


def _generate(
    prompt,
    target,
    drafter,
    law,
    config,
    processors,
    prefill_step_size,
    stats,
    prompt_cache,
    progress=None,
):
    base = target.offset
    seq: List[int] = prompt.tolist()
    # Drafters that read the target's hidden states get them from its own forwards.
    layers = getattr(drafter, "feature_layers", None)
    capture = FeatureCapture(target.model, layers) if layers else None
    history = prompt if processors else None
    caller_owns_cache = prompt_cache is not None
    greedy = law.mode == "greedy"
    # Drafters may draw over their own vocabulary subset from this law.
    params = law.params if law.mode == "rejection" and not processors else None
    planner = RoundPlanner(config, drafter, timed=greedy)
    generated = 0
    round_index = 0

    def choose(logits, drafted):
        if not processors:
            return law.draft_choice(logits)
        hist = mx.concatenate([history, *drafted]) if drafted else history
        return law.draft_choice(process_logits(logits, hist, processors))

    prefilled = False
    with mx.stream(generation_stream):
        try:
            tic = time.perf_counter()
            total = int(prompt.size)
            report = progress and (lambda done, _: progress(done, total))
            with maybe_capturing(capture):
                target.prefill(prompt[:-1], prefill_step_size, report)
            # After the target's (which reports progress and can stop): a
            # draft model's prefill is the short one.
            drafter.prefill(prompt[:-1], prefill_step_size)
            prefilled = True
            features = capture.take() if capture is not None else None
            if features is not None:
                drafter.add_features(features, None)
            if progress is not None:
                progress(total, total)
            stats.prompt_tokens = int(prompt.size)
            stats.prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()

            queued = None  # a plain round's successor, built before its sync
            while generated < config.max_tokens:
                remaining = config.max_tokens - generated
                is_tree, size = planner.begin_round(seq)
                state = RoundState(seq, base, choose, greedy and not processors, params)
                round_tic = time.perf_counter()
                prefix_len = base + len(seq) - 1
                target.mark()  # the round may rewind back to here (a queued step's after it)
                if queued is not None:
                    (proposal, verified), queued = queued, None
                    verify_tic = round_tic
                else:
                    proposal = empty_proposal()
                    if remaining > 1:
                        proposal = drafter.propose(
                            state, size if is_tree else min(size, remaining - 1)
                        )
                    timed_drafts = planner.times_drafts(proposal)
                    if config.profile or timed_drafts:
                        mx.eval(proposal.tokens, proposal.logprobs)
                        draft_time = time.perf_counter() - round_tic
                        if timed_drafts:
                            planner.drafts_took(proposal, draft_time)
                    if config.profile:
                        stats.draft_time = (stats.draft_time or 0.0) + draft_time
                    verify_tic = time.perf_counter()
                    root = mx.array(seq[-1:], mx.uint32)
                    with maybe_capturing(capture):
                        if proposal.parents is None:
                            verified = verify_chain(
                                target, root, proposal, law, processors, history
                            )
                        else:
                            verified = verify_tree(target, root, proposal, law)
                packed, scores, decode = verified
                # A plain round emits row 0: its logprobs are queued with its
                # step, ahead of any step queued after it (as mlx_lm does).
                logprobs = None
                if proposal.size == 0:
                    logprobs = emitted_logprobs(scores, [0])
                    mx.async_eval(logprobs)
                extra = proposal.sync_data
                if extra is not None:
                    packed = mx.concatenate(
                        [packed.astype(mx.int32), extra.astype(mx.int32)]
                    )
                elif (
                    proposal.size == 0
                    and remaining > 1
                    and not (processors or config.profile or capture is not None)
                    and planner.group is None  # sharded: no overlapping collectives
                    and planner.queues_plain_round(seq)
                ):
                    # Two plain rounds in a row: queue the next target step on
                    # this round's lazy token before syncing, as mlx_lm does.
                    empty = empty_proposal()
                    step = verify_chain(target, packed[1:2], empty, law, None, None)
                    mx.async_eval(step[0], step[1])
                    queued = (empty, step)

                # The round's single host sync.
                sync_tic = time.perf_counter()
                mx.eval(packed)
                values = packed.tolist()
                if extra is not None:
                    values, proposal.sync_values = (
                        values[: -extra.size],
                        values[-extra.size :],
                    )
                done = time.perf_counter()
                if config.profile:
                    stats.verify_time = (stats.verify_time or 0.0) + done - verify_tic
                else:
                    stats.sync_time += done - sync_tic

                result = decode(values)
                n, drafted = result.num_accepted, proposal.size
                if logprobs is None:  # the emitted rows, while the next round is built
                    logprobs = emitted_logprobs(scores, result.rows)
                    mx.async_eval(logprobs)
                # The accepted rows' features, for the next round.
                if capture is not None:
                    drafter.add_features(capture.take(), result.rows)
                if proposal.parents is None:
                    # With a step queued, nothing was drafted and it holds the next slot.
                    if queued is None:
                        target.trim_to(prefix_len + 1 + n)
                else:
                    commit_path(
                        target.cache,
                        prefix_len,
                        [0] + [i + 1 for i in result.path],
                        kv_bits=target.kv.kv_bits,
                        kv_group_size=target.kv.kv_group_size,
                        quantized_kv_start=target.kv.quantized_kv_start,
                    )
                drafter.commit(state, proposal, n, result.path)
                planner.end_round(size, proposal, n)
                tree = proposal.parents is not None
                stats.add_round(drafted, n, proposal.forwards, tree)

                if processors:
                    history = mx.concatenate(
                        [history, mx.array(result.emitted, mx.uint32)]
                    )
                for i, tok in enumerate(result.emitted):
                    kind = token_kind(i, n, drafted, result.bonus)
                    rejected = result.rejected if kind == RECOVERED else []
                    seq.append(tok)
                    generated += 1
                    stats.generated_tokens = generated
                    stats.generation_time = time.perf_counter() - tic
                    row = logprobs[i]
                    yield TokenEvent(tok, row, i < n, kind, round_index, rejected)
                    if generated == config.max_tokens:
                        break
                round_index += 1
                if round_index % 256 == 0:
                    mx.clear_cache()
        finally:
            if planner.costs.rounds:
                stats.cost_model = planner.costs.report()
            if hasattr(drafter, "report"):
                drafter.report(stats)
            if prefilled:
                _finish(target, drafter, seq, base, caller_owns_cache, prompt_cache)
            else:  # stopped during the prompt: feeding the rest would undo the stop
                _drop_prompt(target, drafter, base, caller_owns_cache, prompt_cache)


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
    target.release()
    if hasattr(drafter, "release"):
        drafter.release()


def _drop_prompt(target, drafter, base, caller_owns_cache, prompt_cache):
    """After a prefill cut short: rewind the caches to what they held before
    the call, or mark them spoilt if a layer cannot go back that far."""
    try:
        target.trim_to(base)
        drafter.sync([], base)
    except ValueError:  # recurrent state: only a mark could restore it
        if caller_owns_cache:
            spoil(prompt_cache)
    if caller_owns_cache:
        prompt_cache[:] = target.cache + drafter.caches()
    target.release()
    if hasattr(drafter, "release"):
        drafter.release()
