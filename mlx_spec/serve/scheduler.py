"""``mlx_spec.server``'s generation thread: which request runs when.

Batchable requests decode together in a :class:`SpecBatchGenerator`; a
request that arrives at an idle server runs alone (:class:`SoloRun`) until
another arrives, and the others run alone once the batch has drained.

Sharded (under ``mlx.launch``, tensor-parallel or ``--pipeline`` stages),
rank 0 takes the HTTP requests and every rank runs this loop in lockstep:
rank 0 shares each request and each step's hang-ups (mlx_lm's ``all_sum``
of pickled bytes), and every decision after that depends only on shared data
(requests, the target's logits, which every rank gets whole, a shared seed,
rank 0's round costs for the single-sequence engine's adaptive control), so
every rank runs the same steps and so the same collectives; an error in a
step ends the group. Requests are scheduled as on one machine: one the batch
cannot take (a tree, a head, a hybrid model's recurrent caches) runs alone.
"""

import dataclasses
import gc
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional

import mlx.core as mx
import mlx_lm.server as lm_server

from .. import mlx_lm_private as lm_private
from ..chat_text import LiteralText
from ..config import plan_method
from ..distributed import shared_seed, tokens_per_poll
from ..loading import tokenizer_size
from ..stats import SpecStats
from .batch import BATCH_METHODS, SeqSpec, SpecBatchGenerator
from .batch_cache import pair_unbatchable
from .index import CrossRequestIndex
from .requests import (
    RequestError,
    SpecCompletionRequest,
    check_request_method,
    config_of,
    token_prompt,
)
from .solo import (
    KEEPALIVE_SECONDS,
    SoloRun,
    check_request_context,
    client_left,
    log_sent_tokens,
    request_sampler,
)

# Why a batchable request ran on the single-sequence engine.
ALONE_NOTE = "no other request was running (single-sequence engine)"


@dataclass
class _BatchClient:
    """A batched request's connection to its client."""

    rqueue: Any
    request: Any
    ctx: Any
    args: Any
    cache_model: Any
    detokenizer: Any
    matcher: Any
    before: int = 0  # tokens sent before the request joined the batch
    tokens: list = field(default_factory=list)  # the tokens sent

    @property
    def sent(self) -> int:
        return len(self.tokens)


class SpecResponseGenerator(lm_server.ResponseGenerator):
    """mlx_lm's request queue and generation thread, serving with mlx_spec.

    Batchable requests decode together in a :class:`SpecBatchGenerator`;
    the others run alone (:meth:`_serve_single`) once the batch has drained,
    in arrival order, as mlx_lm's server does.
    """

    keepalive_seconds: float = KEEPALIVE_SECONDS

    def __init__(self, model_provider, prompt_cache, index=None):
        # Set before mlx_lm starts the generation thread.
        self.index: Optional[CrossRequestIndex] = index
        self._batch: Optional[SpecBatchGenerator] = None
        self._batch_key = None
        self._clients: Dict[int, _BatchClient] = {}
        self._model_reasons: Dict[Any, Optional[str]] = {}
        self._solo: Optional[SoloRun] = None
        super().__init__(model_provider, prompt_cache)

    def _tokenize(self, tokenizer, request, args):
        """mlx_lm's, with message text literal and invalid Unicode repaired,
        and text prompts given as token ids (checked against the vocabulary)."""
        if request.request_type == "text" and isinstance(request.prompt, list):
            prompt = token_prompt(request.prompt, tokenizer_size(tokenizer))
            return prompt, [prompt], ["assistant"], "normal", None
        return super()._tokenize(LiteralText(tokenizer), request, args)

    # ------------------------------------------------------------------ #
    # The generation thread

    @property
    def _lockstep(self) -> bool:
        """Several processes run this loop in step (under ``mlx.launch``)."""
        return lm_private.is_distributed(self)

    def _share_request(self, request):
        """mlx_lm's, without the client's connection (rank 0 keeps its own)."""
        if not lm_private.is_distributed(self):
            return request
        if request is None or not isinstance(request[1], SpecCompletionRequest):
            return super()._share_request(request)
        rqueue, spec_request, args = request
        bare = dataclasses.replace(spec_request, client_gone=None)
        super()._share_request((rqueue, bare, args))
        return request

    def _generate(self):
        provider = self.model_provider
        provider.load_default()
        if self._lockstep:  # every rank samples alike
            mx.random.seed(shared_seed(None))
        pending = deque()  # requests in arrival order
        while not lm_private.stopping(self):
            request = None
            if self._hears_requests:
                request = lm_private.next_request(
                    self, timeout=None if self._busy or pending else 0.1
                )
            while request is not None:
                pending.append(request)
                request = lm_private.next_request(self)
            while pending:
                rqueue, request, args = pending[0]
                try:
                    key = self._model_key(args)
                    reason = self._unbatchable(request, args, key)
                except Exception as e:
                    pending.popleft()
                    self._fail(rqueue, request, e)
                    continue
                if reason is None and (not self._busy or key == self._batch_key):
                    pending.popleft()
                    alone = not (
                        self._busy or pending or self._drafts_from_index(request)
                    )
                    self._admit(rqueue, request, args, key, alone)
                    continue
                if self._busy:
                    break  # a request that runs alone waits for the batch to drain
                pending.popleft()
                self._serve_alone((rqueue, request, args), reason)
            if self._solo is not None:
                if self._solo.step():
                    self._solo = None
            elif self._batch is not None and self._batch.has_work:
                self._step()
        if self._solo is not None:
            self._solo.handoff()
            self._fail(self._solo.rqueue, None, RuntimeError("the server stopped"))
        self._fail_all(RuntimeError("the server is shutting down"))
        provider.reset()
        del self.prompt_cache
        gc.collect()

    @property
    def _hears_requests(self) -> bool:
        """Whether this turn takes new requests: while one runs alone, sharded,
        once in POLL_TOKENS of its tokens (each take is a collective, and they
        wait for it anyway)."""
        solo = self._solo
        return solo is None or solo.sent % tokens_per_poll() == 0

    def _drafts_from_index(self, request) -> bool:
        """Whether a request would draft from the cross-request index.

        Those run in the batch even alone: the single-sequence engine only
        looks up the request's own context.
        """
        if self.index is None or len(self.index) == 0:
            return False
        if getattr(request, "isolation", False):
            return False
        return config_of(request).method in ("lookup", "auto")

    @property
    def _busy(self) -> bool:
        """A request is decoding (alone, or in the batch)."""
        batch = self._batch
        return self._solo is not None or (batch is not None and batch.has_work)

    def _model_key(self, args):
        """The model key ``args`` asks for, as ``ModelProvider.load`` maps it.

        A request's ``adapters`` apply to the default model too (mlx_lm's map
        drops them there); without them the default model keeps ``--adapter-path``.
        """
        return lm_private.requested_model_key(self.model_provider, args.model)

    def _unbatchable(self, request, args, key) -> Optional[str]:
        """Why a request runs alone, or ``None`` if it joins the batch."""
        cli = self.cli_args
        if not getattr(cli, "batching", True):
            return "batching is off (--no-batching)"
        if cli.kv_bits is not None:
            return "quantized KV caches (--kv-bits) are not batched"
        if key != self.model_provider.model_key:
            if self._batch is not None and self._batch.has_work:
                return "it asks for another model"
            self.model_provider.load(*key)
        reason = self._models_reason()
        if reason is not None:
            return reason
        config = config_of(request)
        if config.method not in BATCH_METHODS:
            return f"method '{config.method}' is not batched"
        if config.lookup_candidates > 1:
            return "lookup trees (lookup_candidates > 1) are not batched"
        if config.draft_p_min > 0:
            return "draft_p_min is not batched"
        if lm_private.logits_processors(args):
            return "logits processors (penalties, logit_bias) are not batched"
        sampling = args.sampling
        if sampling.xtc_probability > 0:
            return "the XTC sampler is not batched"
        if args.seed is not None and sampling.temperature > 0:
            return "a seeded sampled request runs alone (reproducible)"
        if any(lm_private.image_parts(getattr(request, "messages", None) or [])):
            return "requests with images run alone"
        return None

    def _models_reason(self) -> Optional[str]:
        """Why the loaded models cannot batch (logged once per model), or ``None``."""
        provider = self.model_provider
        if provider.model_key in self._model_reasons:
            return self._model_reasons[provider.model_key]
        reason = pair_unbatchable(provider.model, provider.draft_model)
        if reason is not None:
            reason = f"the model cannot batch: {reason}"
            logging.info("Serving one request at a time: %s.", reason)
        self._model_reasons[provider.model_key] = reason
        return reason

    def _fail(self, rqueue, request, error: Exception):
        if isinstance(request, SpecCompletionRequest) and isinstance(error, ValueError):
            request.error = error
        rqueue.put(error)

    def _serve_alone(self, request, reason: Optional[str]):
        rqueue, request, args = request
        if isinstance(request, SpecCompletionRequest):
            request.serving = {"batched": False, "batch_note": reason}
        try:
            self.model_provider.load(*self._model_key(args))
        except Exception as e:
            self._fail(rqueue, request, e)
            return
        self._serve_single((rqueue, request, args), None)

    # ------------------------------------------------------------------ #
    # Batched requests

    def _admit(self, rqueue, request, args, key, alone: bool = False):
        """Start a batchable request: alone on an idle server, else in the batch.

        A request running alone moves into the batch first (:meth:`_handoff`).
        """
        if alone:
            try:
                run = SoloRun(self, rqueue, request, args)
            except Exception as e:
                self._fail(rqueue, request, e)
                return
            if isinstance(request, SpecCompletionRequest):
                request.serving = {"batched": False, "batch_note": ALONE_NOTE}
            if self._batch is not None and self._batch_key != key:
                self._batch = None  # idle, and built for another model
            self._solo, self._batch_key = run, key
            if run.step():
                self._solo = None
            return
        if self._solo is not None:
            self._handoff()
        provider = self.model_provider
        try:
            config = config_of(request)
            method, uses_draft = plan_method(config.method, provider.draft_model)
            check_request_method(method, provider.draft_model)
            tokenizer = provider.tokenizer
            prompt, _, _, initial_state, vision = lm_private.tokenize(
                self, tokenizer, request, args
            )
            if vision is not None:
                raise RequestError("images are not supported by mlx_spec.server.")
            check_request_context(provider.model, len(prompt), args.max_tokens)
            stop_sequences, text_sm = lm_private.stop_state_machine(
                self, provider.model_key, tokenizer, args.stop_words
            )
            self._ensure_batch(key)
            cache_model = (provider.model_key, uses_draft)
            cache, rest = self.prompt_cache.fetch_nearest_cache(cache_model, prompt)
            cached = len(prompt) - len(rest) if cache is not None else 0
            sampler = request_sampler(args, tokenizer)
            config = replace(config, max_tokens=args.max_tokens)
            stats = SpecStats()
            uid = self._batch.insert(
                SeqSpec(
                    prompt,
                    config,
                    params=sampler.sampling_params,
                    cache=cache,
                    cached=cached,
                    stop_tokens=frozenset(tokenizer.eos_token_ids),
                    isolation=getattr(request, "isolation", False),
                    top_logprobs=args.top_logprobs,
                ),
                stats,
            )
        except Exception as e:
            self._fail(rqueue, request, e)
            return
        if isinstance(request, SpecCompletionRequest):
            request.stats = stats
        ctx = lm_server.GenerationContext(
            has_thinking=tokenizer.has_thinking,
            has_tool_calling=tokenizer.has_tool_calling,
            tool_parser=tokenizer.tool_parser,
            text_sm=text_sm,
            initial_state=initial_state,
            prompt=prompt,
            prompt_cache_count=cached,
        )
        rqueue.put(ctx)
        rqueue.put((0, len(prompt) - min(cached, len(prompt) - 1)))
        self._clients[uid] = _BatchClient(
            rqueue,
            request,
            ctx,
            args,
            cache_model,
            tokenizer.detokenizer,
            stop_sequences.matcher(),
        )
        limit = getattr(self.cli_args, "prompt_cache_bytes", None)
        if limit is not None:
            self.prompt_cache.trim_to(n_bytes=limit - self._batch_nbytes())

    def _ensure_batch(self, key):
        provider = self.model_provider
        # A reload of the same key gives new model objects: drop the old batch.
        stale = self._batch is not None and self._batch.model is not provider.model
        if self._batch is None or self._batch_key != key or stale:
            self._batch = SpecBatchGenerator(
                provider.model,
                provider.draft_model,
                index=self.index,
                prefill_step_size=self.cli_args.prefill_step_size,
                max_batch=self.cli_args.decode_concurrency,
            )
            self._batch_key = key

    def _handoff(self):
        """Move the request running alone into the batch, at a token boundary."""
        run, self._solo = self._solo, None
        state = run.handoff()
        tokens = state["tokens"]
        args = run.args
        try:
            self._ensure_batch(self._batch_key)
            config = replace(run.config, max_tokens=args.max_tokens - run.sent)
            uid = self._batch.insert(
                SeqSpec(
                    tokens,
                    config,
                    params=run.sampler.sampling_params,
                    cache=state["cache"],
                    cached=len(tokens),
                    stop_tokens=frozenset(run.tokenizer.eos_token_ids),
                    isolation=getattr(run.request, "isolation", False),
                    top_logprobs=args.top_logprobs,
                    index_from=run.cached,
                ),
                run.stats,
            )
        except Exception as e:
            self._fail(run.rqueue, run.request, e)
            return
        self._clients[uid] = _BatchClient(
            run.rqueue,
            run.request,
            run.ctx,
            args,
            run.cache_model,
            state["detokenizer"],
            state["matcher"],
            before=run.sent,
            tokens=tokens[len(run.prompt) :],
        )

    def _batch_nbytes(self) -> int:
        batch = self._batch
        total = batch.target.nbytes if batch is not None else 0
        if batch is not None and batch.draft is not None:
            total += batch.draft.nbytes
        return total

    def _step(self):
        """Drop disconnected clients, run one batch step, send what it made."""
        batch = self._batch
        gone = [u for u, c in self._clients.items() if client_left(c.ctx, c.request)]
        if self._lockstep:  # rank 0's clients
            gone = lm_private.share_object(self, gone) or []
        for uid in gone:
            client = self._clients[uid]
            self._finish(uid, batch.remove(uid, client.sent - client.before))
        try:
            outputs = batch.next()
        except Exception as e:
            logging.exception("batch step failed")
            self._fail_all(e)
            self._batch, self._batch_key = None, None
            if self._lockstep:  # the ranks may differ now: end the group
                raise
            return
        for out in outputs:
            client = self._clients.get(out.uid)
            if client is None:
                continue
            if out.progress is not None:
                if not client.before:  # not for a request already streaming
                    client.rqueue.put(out.progress)
                continue
            if self._send(out, client):
                if out.finish_reason is None:  # a stop word or a disconnect
                    kept = client.sent - client.before
                    self._finish(out.uid, batch.remove(out.uid, kept))
                else:
                    self._finish(out.uid, (out.cache, out.cache_tokens))

    def _send(self, out, client: _BatchClient) -> bool:
        """Queue ``out``'s tokens as mlx_lm responses; True once the client is done."""
        tokenizer = self.model_provider.tokenizer
        detokenizer = client.detokenizer
        last = len(out.tokens) - 1
        for i, token in enumerate(out.tokens):
            finish_reason = out.finish_reason if i == last else None
            if finish_reason == "stop":
                detokenizer.finalize()
            else:
                detokenizer.add_token(token)
                if finish_reason == "length":
                    detokenizer.finalize()
            if client.matcher.advance(token):
                finish_reason = "stop"
            top = ()
            if out.rows is not None:
                top = lm_private.top_logprobs(
                    out.rows[i], client.args.top_logprobs, tokenizer
                )
            if finish_reason is not None:
                self._set_serving(out, client)
            client.rqueue.put(
                lm_server.Response(
                    detokenizer.last_segment,
                    token,
                    out.logprobs[i],
                    finish_reason,
                    top,
                )
            )
            client.tokens.append(token)
            if finish_reason is not None:
                return True
            # Sharded, a hang-up is seen at the next step, on every rank.
            if not self._lockstep and client_left(client.ctx, client.request):
                return True
        return False

    def _set_serving(self, out, client: _BatchClient):
        info = out.info
        if info is None and self._batch is not None:
            info = self._batch.info(out.uid)
        if info is not None and isinstance(client.request, SpecCompletionRequest):
            client.request.serving = dict(info, tokens_before_batching=client.before)

    def _finish(self, uid: int, cached):
        """End a client: close its stream and keep its cache for later prompts."""
        client = self._clients.pop(uid, None)
        if client is None:
            return
        log_sent_tokens(client.tokens)
        if cached is not None:
            cache, tokens = cached
            if cache is not None and tokens:
                self.prompt_cache.insert_cache(client.cache_model, list(tokens), cache)
        client.rqueue.put(None)  # last: a finished response is already cached

    def _fail_all(self, error: Exception):
        for client in self._clients.values():
            client.rqueue.put(error)
        self._clients.clear()

    # ------------------------------------------------------------------ #
    # Requests served alone

    def _serve_single(self, request, stream):
        """Serve one request alone, to the end (the caller waits)."""
        rqueue, request, args = request
        try:
            run = SoloRun(self, rqueue, request, args)
        except Exception as e:
            self._fail(rqueue, request, e)
            return
        while not run.step():
            pass
