"""A request that ``mlx_spec.server`` serves alone, with
:func:`mlx_spec.stream_generate`, and the keepalives of its prefill."""

import logging
import threading
from dataclasses import replace

import mlx.core as mx
import mlx_lm.server as lm_server
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from .. import mlx_lm_private as lm_private
from ..config import plan_method
from ..distributed import flag_from_rank0, rank, sharded_group
from ..generation import history_kwargs, stream_generate
from ..limits import GenerationCancelled, check_context
from ..sampling import make_sampler, top_p_or_off
from .requests import (
    RequestError,
    SpecCompletionRequest,
    check_logit_bias_ids,
    check_request_method,
    config_of,
)

# Seconds between ``: keepalive`` comments while a streamed prompt is processed.
KEEPALIVE_SECONDS = 5.0


def client_left(ctx, request) -> bool:
    """Whether a request's client has gone; a hang-up stops its context too."""
    if lm_private.should_stop(ctx):
        return True
    gone = getattr(request, "client_gone", None)
    if gone is not None and gone():
        ctx.stop()
        return True
    return False


def check_request_context(model, prompt_tokens: int, max_tokens: int):
    """A 400 (``RequestError``) for a prompt plus ``max_tokens`` beyond the
    model's context window, before any prefill."""
    try:
        check_context(model, prompt_tokens, max_tokens)
    except ValueError as e:
        raise RequestError(str(e)) from None


def log_sent_tokens(tokens):
    """At DEBUG, a finished request's tokens, on every rank: sharded, the
    ranks' lines must be the same (they decode in lockstep)."""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.debug("rank %d sent %d tokens: %s", rank(), len(tokens), tokens)


def request_sampler(args, tokenizer):
    """A sampler that declares its law (exact rejection sampling), or XTC's."""
    sampling = args.sampling
    if sampling.xtc_probability > 0:
        return lm_private.xtc_sampler(args, tokenizer)
    top_p = top_p_or_off(sampling.top_p)
    return make_sampler(sampling.temperature, top_p, sampling.min_p, 1, sampling.top_k)


class PrefillKeepalive:
    """Progress messages on a request's queue until its first token.

    mlx_lm's handler turns each ``(processed, total)`` on the queue into a
    ``: keepalive processed/total`` SSE comment (streams only), so clients
    and proxies do not time out during a long prefill. One is sent at once,
    then one every ``interval`` seconds, and ``(total, total)`` at the end.
    """

    def __init__(self, rqueue, total: int, interval: float = KEEPALIVE_SECONDS):
        self.rqueue = rqueue
        self.total = total
        self.interval = interval
        self.processed = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.rqueue.put((self.processed, self.total))
        self._thread.start()

    def progress(self, processed: int, total: int):
        """``prompt_progress_callback``: remember how far the prefill got."""
        self.processed = min(processed, self.total)

    def _run(self):
        while not self._done.wait(self.interval):
            self.rqueue.put((self.processed, self.total))

    def stop(self):
        """Stop the messages (idempotent); nothing is queued after this returns."""
        if self._done.is_set():
            return
        self._done.set()
        self._thread.join()
        self.rqueue.put((self.total, self.total))


class SoloRun:
    """A request served alone by :func:`mlx_spec.stream_generate`, token by token.

    Requests that cannot batch run this way to the end. A batchable request
    that arrives at an idle server runs this way too (every method arm of
    the single-sequence engine, its wall-time adaptive control, pipelined
    plain steps) until another request arrives: :meth:`handoff` then closes
    the generation at a token boundary, which leaves the prompt cache
    holding exactly the prompt and the tokens sent, and the request goes on
    in the batch from there.
    """

    def __init__(self, owner, rqueue, request, args):
        self.owner = owner
        self.rqueue, self.request, self.args = rqueue, request, args
        provider = owner.model_provider
        model, tokenizer = provider.model, provider.tokenizer
        self.tokenizer = tokenizer
        # Out-of-range ids would index past the logits (and crash the process).
        vocab_size = getattr(getattr(model, "args", None), "vocab_size", None)
        check_logit_bias_ids(args.logits.logit_bias, vocab_size)
        method, uses_draft = plan_method(
            config_of(request).method, provider.draft_model
        )
        check_request_method(method, provider.draft_model)
        self.config = replace(config_of(request), max_tokens=args.max_tokens)
        draft_model = provider.draft_model if uses_draft else None

        prompt, _, _, initial_state, vision = lm_private.tokenize(
            owner, tokenizer, request, args
        )
        if vision is not None:
            raise RequestError("images are not supported by mlx_spec.server.")
        check_request_context(model, len(prompt), args.max_tokens)
        stop_sequences, text_sm = lm_private.stop_state_machine(
            owner, provider.model_key, tokenizer, args.stop_words
        )

        # Caches with and without the draft's layers are kept apart.
        self.cache_model = (provider.model_key, uses_draft)
        cache, rest = owner.prompt_cache.fetch_nearest_cache(self.cache_model, prompt)
        if cache is None:
            cache = make_prompt_cache(model)
            if uses_draft:
                cache += make_prompt_cache(draft_model)
        if not rest:  # the whole prompt is cached: recompute its last token
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]

        if args.seed is not None:
            mx.random.seed(args.seed)
        cached = prompt[: len(prompt) - len(rest)]
        self.keepalive = PrefillKeepalive(rqueue, len(rest), owner.keepalive_seconds)
        self.sampler = request_sampler(args, tokenizer)
        self.responses = stream_generate(
            model,
            tokenizer,
            rest,
            draft_model=draft_model,
            config=self.config,
            sampler=self.sampler,
            logits_processors=lm_private.logits_processors(args),
            prompt_cache=cache,
            prefill_step_size=owner.cli_args.prefill_step_size,
            kv_bits=owner.cli_args.kv_bits,
            kv_group_size=owner.cli_args.kv_group_size,
            quantized_kv_start=owner.cli_args.quantized_kv_start,
            prompt_progress_callback=self.keepalive.progress,
            should_stop=self._stopped,
            **history_kwargs(stream_generate, cached),
        )
        self.cache = cache
        self.stats = self.responses.stats
        if isinstance(request, SpecCompletionRequest):
            request.stats = self.stats
        self.ctx = lm_server.GenerationContext(
            has_thinking=tokenizer.has_thinking,
            has_tool_calling=tokenizer.has_tool_calling,
            tool_parser=tokenizer.tool_parser,
            text_sm=text_sm,
            initial_state=initial_state,
            prompt=prompt,
            prompt_cache_count=len(cached),
        )
        rqueue.put(self.ctx)
        self.prompt = prompt
        self.cached = len(cached)
        self.stop_sequences = stop_sequences
        self.matcher = stop_sequences.matcher()
        self.tokens = list(prompt)
        self.done = False
        self.keepalive.start()

    def _stopped(self) -> bool:
        """Whether the client left (its context was stopped, or it hung up).

        Sharded, rank 0's client, polled by the stream: every rank stops alike.
        """
        ctx = getattr(self, "ctx", None)
        left = ctx is not None and client_left(ctx, self.request)
        group = sharded_group() if lm_private.is_distributed(self.owner) else None
        return flag_from_rank0(left, group)

    @property
    def sent(self) -> int:
        return len(self.tokens) - len(self.prompt)

    def step(self) -> bool:
        """Send the next token; True (and the stream closed) once it is the last."""
        try:
            gen = next(self.responses, None)
            self.keepalive.stop()
            if gen is None:
                return self._close()
            finish_reason = gen.finish_reason
            if self.matcher.advance(gen.token):
                finish_reason = "stop"
            self.rqueue.put(
                lm_server.Response(
                    gen.text,
                    gen.token,
                    gen.logprobs[gen.token].item(),
                    finish_reason,
                    lm_private.top_logprobs(
                        gen.logprobs, self.args.top_logprobs, self.tokenizer
                    ),
                )
            )
            self.tokens.append(gen.token)
            if finish_reason is not None:  # the stream stops for a client that left
                return self._close()
            return False
        except GenerationCancelled:  # the client left
            if self.sent:
                return self._close()  # the cache holds the tokens sent
            self.keepalive.stop()
            self.responses.close()  # stopped in the prompt: keep no cache
            self.done = True
            self.rqueue.put(None)
            return True
        except Exception as e:
            self.keepalive.stop()
            self.responses.close()
            self.done = True
            self.owner._fail(self.rqueue, self.request, e)
            return True

    def _close(self) -> bool:
        self.keepalive.stop()
        self.responses.close()  # rewinds the caches to the prompt plus the tokens sent
        self.done = True
        owner = self.owner
        owner.prompt_cache.insert_cache(self.cache_model, self.tokens, self.cache)
        log_sent_tokens(self.tokens[len(self.prompt) :])
        if owner.index is not None and not getattr(self.request, "isolation", False):
            owner.index.add(self.tokens[self.cached :])
        self.rqueue.put(None)  # last: a finished response is already indexed
        return True

    def handoff(self) -> dict:
        """Stop here; return what the batch needs to go on with this request."""
        self.keepalive.stop()
        self.responses.close()  # the cache holds self.tokens exactly
        self.done = True
        detokenizer = self.tokenizer.detokenizer
        matcher = self.stop_sequences.matcher()
        for token in self.tokens[len(self.prompt) :]:
            detokenizer.add_token(token)
            matcher.advance(token)
        _ = detokenizer.last_segment  # already sent
        return {
            "tokens": list(self.tokens),
            "cache": self.cache,
            "detokenizer": detokenizer,
            "matcher": matcher,
        }
