"""``mlx_spec.server``: mlx_lm's OpenAI-compatible server with speculative methods.

Built on ``mlx_lm.server`` itself: its flags, its HTTP handler (chat and
text completions, SSE streaming, stop words, tool calls, logprobs), its
model provider and its prompt cache. What changes:

- every flag of ``mlx_lm.server`` plus ``--speculative METHOD`` and each
  method's options; with no ``--model`` the embedded default pair is served;
- concurrent requests decode together, with speculation
  (:mod:`mlx_spec.serve.batch`): one batched target forward verifies every
  sequence's drafts, and each sequence's cache keeps only its own accepted
  tokens; a request whose method or options cannot be batched (``tree``,
  ``self``, lookup trees, logits processors, a seeded sampled request,
  XTC, ``draft_p_min``) is served alone by :func:`mlx_spec.stream_generate`
  once the batch has drained, and its ``speculative_stats`` say why;
- lookup and ``auto`` also draft from the server's earlier requests (a
  bounded, memory-capped index, :mod:`mlx_spec.serve.index`), unless a
  request sets ``"speculative_isolation": true``;
- per-request JSON fields ``speculative``, ``num_draft_tokens``,
  ``tree_budget``, ``tree_top_k``, ``tree_depth``, ``tree_choices``,
  ``ngram_min``, ``ngram_max``, ``adaptive`` and ``speculative_isolation``;
  a bad value gets HTTP 400 with ``{"error": "..."}``, and so does a
  method that needs a drafter the server lacks, or a body that is not a
  UTF-8 JSON object;
- mlx_lm's ``adapters`` field (an adapter directory) applies to the default
  model too (mlx_lm's server uses it only with an explicit ``model``);
- responses carry the speculation statistics in ``speculative_stats``
  (the final chunk of a stream); ``usage`` keeps OpenAI's shape;
- the models are loaded (and a draft's tokenizer checked against the
  target's) before the server answers anything, so a bad path is a
  one-line error at startup, never a server that hangs;
- streaming requests get ``: keepalive`` SSE comments while their prompt
  is processed, as mlx_lm's do.
"""

from .._blas import ensure_fast_blas

ensure_fast_blas()

import argparse
import gc
import io
import json
import logging
import math
import socket
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional

import mlx.core as mx
import mlx_lm.server as lm_server
from mlx_lm.models.cache import (
    LRUPromptCache,
    make_prompt_cache,
    trim_prompt_cache,
)

from ..chat_text import LiteralText
from ..config import (
    DEFAULT_NUM_DRAFT_TOKENS,
    MAX_SEED,
    METHODS,
    SpecConfig,
    plan_method,
)
from ..mtp import load_mtp
from ..generation import history_kwargs, stream_generate
from ..loading import (
    METHOD_KINDS,
    check_draft_given,
    check_drafter_kind,
    default_model_pair,
    draft_source,
    drafter_kind,
    load_draft,
    load_model,
)
from ..options import (
    add_speculative_options,
    check_sampling_options,
    method_option_fields,
    method_options,
    one_line_errors,
)
from ..sampling import make_sampler, top_p_or_off
from ..stats import SpecStats
from .batch import BATCH_METHODS, SeqSpec, SpecBatchGenerator
from .batch_cache import pair_unbatchable
from .index import DEFAULT_MAX_TOKENS as DEFAULT_INDEX_TOKENS
from .index import CrossRequestIndex, cap_range

# Statistics left out of responses (per-round lists grow with the output).
_STATS_LISTS = ("accepted_per_round", "drafted_per_round", "tree_sizes")
STATS_FIELD = "speculative_stats"
# Why a batchable request ran on the single-sequence engine.
ALONE_NOTE = "no other request was running (single-sequence engine)"
# The request field that keeps a request out of the cross-request index.
ISOLATION_FIELD = "speculative_isolation"
# Seconds between ``: keepalive`` comments while a streamed prompt is processed.
KEEPALIVE_SECONDS = 5.0
PORT_RANGE = (1, 65535)


class RequestError(ValueError):
    """A request the server refuses (sent back as HTTP 400)."""


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


class _ParserCaptured(Exception):
    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


class _CapturingParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        raise _ParserCaptured(self)


_capture_lock = threading.Lock()


def mlx_lm_server_parser() -> argparse.ArgumentParser:
    """The argument parser of the installed ``mlx_lm.server``.

    ``mlx_lm.server.main()`` builds its parser inline, so it is run with an
    ``argparse`` whose ``parse_args`` stops it right there (before it loads
    anything). The flags therefore follow the installed mlx-lm version.
    """
    shim = types.ModuleType("argparse")
    shim.__dict__.update(argparse.__dict__)
    shim.ArgumentParser = _CapturingParser
    with _capture_lock:
        saved = lm_server.argparse
        lm_server.argparse = shim
        try:
            lm_server.main()
        except _ParserCaptured as captured:
            parser = captured.parser
        finally:
            lm_server.argparse = saved
    parser.__class__ = argparse.ArgumentParser
    return parser


def setup_arg_parser() -> argparse.ArgumentParser:
    """mlx_lm.server's parser plus ``--speculative`` and the method options."""
    parser = one_line_errors(mlx_lm_server_parser())
    parser.prog = "mlx_spec.server"
    parser.description = (
        "OpenAI-compatible HTTP server with exact speculative decoding "
        "(a superset of mlx_lm.server)."
    )
    for action in parser._actions:
        if action.dest == "model":
            action.help = (
                "The path to the MLX model weights, tokenizer and config. "
                "Default: the embedded default pair (with its draft)."
            )
        elif action.dest == "draft_model":
            action.help = (
                "A draft model for the draft/tree methods. Default: the embedded "
                "draft when --model is not given."
            )
        elif action.dest == "num_draft_tokens":
            action.default = DEFAULT_NUM_DRAFT_TOKENS
            action.help = (
                f"Draft tokens per round, 1 to 64; requests may override it "
                f"(default: {DEFAULT_NUM_DRAFT_TOKENS})."
            )
        elif action.dest == "host":
            action.default = "127.0.0.1"
            action.help = "Host for the HTTP server (default: 127.0.0.1)."
    add_speculative_options(parser)
    group = parser.add_argument_group("batching")
    group.add_argument(
        "--batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Decode concurrent requests together with speculation (default: on); "
        "--no-batching serves one request at a time.",
    )
    group.add_argument(
        "--cross-request-tokens",
        type=int,
        default=DEFAULT_INDEX_TOKENS,
        help="Tokens of earlier requests that lookup and auto may draft from "
        f"(a memory cap; 0 turns it off; default: {DEFAULT_INDEX_TOKENS}).",
    )
    return parser


def check_port(port: int) -> int:
    """The ``--port`` value, or a one-line ``ValueError`` naming the range."""
    low, high = PORT_RANGE
    if not low <= port <= high:
        raise ValueError(
            f"--port={port} is out of range: an integer from {low} to {high}."
        )
    return port


def resolve_model_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in the default pair and check the speculative options (``ValueError``)."""
    if args.model is None:
        args.model, draft = default_model_pair(args.speculative)
        args.draft_model = args.draft_model or draft
    method, _ = plan_method(args.speculative, args.draft_model)
    check_draft_given(method, args.draft_model)
    check_drafter_kind(method, args.draft_model)
    SpecConfig(method=method, **method_options(args))
    check_request_defaults(args)
    return args


def check_request_defaults(args: argparse.Namespace) -> None:
    """The server-wide values requests fall back on, checked at start-up.

    Otherwise a bad one would be reported to every client as its own error.
    """
    check_sampling_options(args)
    checks = [
        ("max-tokens", args.max_tokens, args.max_tokens >= 1, "an integer >= 1"),
        (
            "decode-concurrency",
            args.decode_concurrency,
            args.decode_concurrency >= 1,
            "an integer >= 1",
        ),
        (
            "prompt-concurrency",
            args.prompt_concurrency,
            args.prompt_concurrency >= 1,
            "an integer >= 1",
        ),
    ]
    tokens = getattr(args, "cross_request_tokens", 0)
    low, high = cap_range()
    checks.append(
        (
            "cross-request-tokens",
            tokens,
            tokens == 0 or low <= tokens <= high,
            f"0 (off) or an integer from {low} to {high}",
        )
    )
    for flag, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"--{flag}={value} is out of range: {allowed}.")


# --------------------------------------------------------------------------- #
# Requests
# --------------------------------------------------------------------------- #


@dataclass
class SpecCompletionRequest(lm_server.CompletionRequest):
    """mlx_lm's request plus its speculative options and, once served, stats."""

    speculation: Dict[str, Any] = field(default_factory=dict)
    isolation: bool = False
    stats: Any = None
    serving: Optional[dict] = None
    error: Optional[Exception] = None


def _check_type(name: str, value, default):
    """Request fields take the JSON type of their ``SpecConfig`` default."""
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        kind = "a number"
    else:
        return
    if not ok:
        raise RequestError(f"{name} must be {kind}, got {value!r}.")


def request_speculation(body: dict, cli_args: argparse.Namespace) -> Dict[str, Any]:
    """The speculative options of a request (body fields over server flags).

    Raises:
        RequestError: A field has a bad type or value.
    """
    options = {"speculative": body.get("speculative", cli_args.speculative)}
    if options["speculative"] is not None and not isinstance(
        options["speculative"], str
    ):
        raise RequestError(
            f"speculative must be a string, got {options['speculative']!r}."
        )
    for f in method_option_fields():
        value = body.get(f.name, getattr(cli_args, f.name, f.default))
        _check_type(f.name, value, f.default)
        options[f.name] = value
    try:
        SpecConfig(
            method=options["speculative"] or "draft", **method_options_of(options)
        )
    except (ValueError, TypeError) as e:
        raise RequestError(str(e)) from None
    return options


def method_options_of(options: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in options.items() if k != "speculative"}


def request_isolation(body: dict) -> bool:
    """The ``speculative_isolation`` field (``RequestError`` unless a bool)."""
    value = body.get(ISOLATION_FIELD, False)
    if not isinstance(value, bool):
        raise RequestError(f"{ISOLATION_FIELD} must be true or false, got {value!r}.")
    return value


# The drafter each method needs (``METHOD_KINDS``, plus a checkpoint's MTP layer).
_NEEDED_DRAFTER = dict(METHOD_KINDS, mtp="mtp")
_DRAFTER_NAMES = {
    None: "no drafter",
    "draft": "a draft model",
    "eagle": "a trained eagle head",
    "medusa": "a trained medusa head",
    "mtp": "the model's MTP layer",
}


def runnable_methods(draft_model) -> List[str]:
    """The ``speculative`` values a server holding ``draft_model`` can run."""
    kind = drafter_kind(draft_model)
    return [m for m in METHODS if _NEEDED_DRAFTER.get(m) in (None, kind)]


def check_request_method(method: str, draft_model) -> None:
    """A one-line :class:`RequestError` when ``method`` needs a drafter the server lacks.

    It names the request value, what is missing, what the client may ask
    instead and how the operator enables the method.
    """
    needed = _NEEDED_DRAFTER.get(method)
    has = drafter_kind(draft_model)
    if needed is None or needed == has:
        return
    lacks = f"which this server was not started with (it has {_DRAFTER_NAMES[has]})"
    enable = "; to serve it, start the server with --draft-model DIR"
    if needed == "mtp":
        enable = "; to serve it, start the server with --speculative mtp"
    elif needed != "draft":
        enable += f" holding one (mlx_spec train-draft --kind {needed})"
    raise RequestError(
        f"speculative={method!r} needs {_DRAFTER_NAMES[needed]}, {lacks}; ask for "
        f"one of {', '.join(runnable_methods(draft_model))} instead{enable}."
    )


def stats_payload(stats, serving: Optional[dict] = None) -> Optional[dict]:
    """The JSON ``speculative_stats`` of a :class:`SpecStats` (lists left out).

    ``serving`` (batched or alone, and why) is merged in.
    """
    if stats is None:
        return None
    out = stats.as_dict()
    for name in _STATS_LISTS:
        out.pop(name, None)
    if serving:
        out.update(serving)
    return out


# --------------------------------------------------------------------------- #
# Model provider and generation
# --------------------------------------------------------------------------- #


class SpecModelProvider(lm_server.ModelProvider):
    """mlx_lm's provider with one-line load errors and a checked draft.

    A distributed (``--pipeline``) load is mlx_lm's and serves one request at
    a time. A draft whose tokenizer differs from the target's is refused
    (``ValueError``) rather than merely warned about.
    """

    def _load(self, model_path, adapter_path=None, draft_model_path=None):
        if self.is_distributed:  # mlx_lm's sharded load (it refuses drafts)
            super()._load(model_path, adapter_path, draft_model_path)
            self.is_batchable = False
            return
        self.reset()
        gc.collect()
        mx.clear_cache()
        model, tokenizer, config = load_model(
            model_path,
            "model",
            adapter_path=adapter_path,
            tokenizer_config=self._tokenizer_config,
            return_config=True,
            trust_remote_code=self.cli_args.trust_remote_code,
        )
        if self.cli_args.use_default_chat_template and tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        draft_model = None
        source = draft_source(
            self.cli_args.speculative, model_path, draft_model_path, model
        )
        if source is not None and source[0] == "mtp":
            draft_model = load_mtp(source[1], model)  # a checkpoint's MTP layer
        elif draft_model_path is not None:  # a model, or a head bound to this target
            draft_model = load_draft(
                draft_model_path,
                model,
                tokenizer,
                trust_remote_code=self.cli_args.trust_remote_code,
            )
        self.model_key = (model_path, adapter_path, draft_model_path)
        self.model = model
        self.tokenizer = tokenizer
        self.processor = lm_server.load_processor(model, config)
        self.draft_model = draft_model
        self.is_batchable = False


def _sampler(args, tokenizer):
    """A sampler that declares its law (exact rejection sampling), or XTC's."""
    sampling = args.sampling
    if sampling.xtc_probability > 0:
        return lm_server._make_sampler(args, tokenizer)
    top_p = top_p_or_off(sampling.top_p)
    return make_sampler(sampling.temperature, top_p, sampling.min_p, 1, sampling.top_k)


class _PrefillKeepalive:
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
    sent: int = 0  # tokens sent
    before: int = 0  # of which sent before the request joined the batch


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
        self._solo: Optional[_SoloRun] = None
        super().__init__(model_provider, prompt_cache)

    def _tokenize(self, tokenizer, request, args):
        """mlx_lm's, with message text literal and invalid Unicode repaired."""
        return super()._tokenize(LiteralText(tokenizer), request, args)

    # ------------------------------------------------------------------ #
    # The generation thread

    def _generate(self):
        provider = self.model_provider
        provider.load_default()
        pending = deque()  # requests in arrival order
        while not self._stop:
            request = self._next_request(timeout=None if self._busy or pending else 0.1)
            while request is not None:
                pending.append(request)
                request = self._next_request()
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

    def _drafts_from_index(self, request) -> bool:
        """Whether a request would draft from the cross-request index.

        Those run in the batch even alone: the single-sequence engine only
        looks up the request's own context.
        """
        if self.index is None or len(self.index) == 0:
            return False
        if getattr(request, "isolation", False):
            return False
        speculation = getattr(request, "speculation", None) or {}
        method, _ = plan_method(
            speculation.get("speculative"), self.model_provider.draft_model
        )
        return method in ("lookup", "auto")

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
        p, m = self.model_provider, args.model
        adapter = m.adapter if m.adapter is not None else p._adapter_map.get(m.model)
        model = p._model_map.get(m.model, m.model)
        draft = p._draft_model_map.get(m.draft, m.draft)
        return (model, adapter, draft)

    def _unbatchable(self, request, args, key) -> Optional[str]:
        """Why a request runs alone, or ``None`` if it joins the batch."""
        cli = self.cli_args
        if not getattr(cli, "batching", True):
            return "batching is off (--no-batching)"
        if self._is_distributed:
            return "distributed serving runs one request at a time"
        if cli.kv_bits is not None:
            return "quantized KV caches (--kv-bits) are not batched"
        if key != self.model_provider.model_key:
            if self._batch is not None and self._batch.has_work:
                return "it asks for another model"
            self.model_provider.load(*key)
        reason = self._models_reason()
        if reason is not None:
            return reason
        speculation = getattr(request, "speculation", None) or {}
        method, _ = plan_method(
            speculation.get("speculative"), self.model_provider.draft_model
        )
        if method not in BATCH_METHODS:
            return f"method '{method}' is not batched"
        if speculation.get("lookup_candidates", 1) > 1:
            return "lookup trees (lookup_candidates > 1) are not batched"
        if speculation.get("draft_p_min", 0.0) > 0:
            return "draft_p_min is not batched"
        if lm_server._make_logits_processors(args):
            return "logits processors (penalties, logit_bias) are not batched"
        sampling = args.sampling
        if sampling.xtc_probability > 0:
            return "the XTC sampler is not batched"
        if args.seed is not None and sampling.temperature > 0:
            return "a seeded sampled request runs alone (reproducible)"
        if any(lm_server._image_parts(getattr(request, "messages", None) or [])):
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
                run = _SoloRun(self, rqueue, request, args)
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
            speculation = getattr(request, "speculation", None) or {}
            method, uses_draft = plan_method(
                speculation.get("speculative"), provider.draft_model
            )
            check_request_method(method, provider.draft_model)
            tokenizer = provider.tokenizer
            prompt, _, _, initial_state, vision = self._tokenize(
                tokenizer, request, args
            )
            if vision is not None:
                raise RequestError("images are not supported by mlx_spec.server.")
            stop_sequences, text_sm = self._make_state_machine(
                provider.model_key, tokenizer, args.stop_words
            )
            self._ensure_batch(key)
            cache_model = (provider.model_key, uses_draft)
            cache, rest = self.prompt_cache.fetch_nearest_cache(cache_model, prompt)
            cached = len(prompt) - len(rest) if cache is not None else 0
            sampler = _sampler(args, tokenizer)
            config = SpecConfig(
                method=method,
                max_tokens=args.max_tokens,
                **method_options_of(speculation),
            )
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
            config = SpecConfig(
                method=run.method,
                max_tokens=args.max_tokens - run.sent,
                **method_options_of(run.speculation),
            )
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
            sent=run.sent,
            before=run.sent,
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
        for uid, client in list(self._clients.items()):
            if client.ctx._should_stop:
                self._finish(uid, batch.remove(uid, client.sent - client.before))
        try:
            outputs = batch.next()
        except Exception as e:
            logging.exception("batch step failed")
            self._fail_all(e)
            self._batch, self._batch_key = None, None
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
                top = lm_server._format_top_logprobs(
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
            client.sent += 1
            if finish_reason is not None or client.ctx._should_stop:
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
            run = _SoloRun(self, rqueue, request, args)
        except Exception as e:
            self._fail(rqueue, request, e)
            return
        while not run.step():
            pass


class _SoloRun:
    """A request served alone by :func:`mlx_spec.stream_generate`, token by token.

    Requests that cannot batch run this way to the end. A batchable request
    that arrives at an idle server runs this way too (every method arm of
    the single-sequence engine, its wall-time adaptive control, pipelined
    plain steps) until another request arrives: :meth:`handoff` then closes
    the generation at a token boundary, which leaves the prompt cache
    holding exactly the prompt and the tokens sent, and the request goes on
    in the batch from there.
    """

    def __init__(self, owner: SpecResponseGenerator, rqueue, request, args):
        self.owner = owner
        self.rqueue, self.request, self.args = rqueue, request, args
        provider = owner.model_provider
        model, tokenizer = provider.model, provider.tokenizer
        self.tokenizer = tokenizer
        # Out-of-range ids would index past the logits (and crash the process).
        vocab_size = getattr(getattr(model, "args", None), "vocab_size", None)
        check_logit_bias_ids(args.logits.logit_bias, vocab_size)
        self.speculation = getattr(request, "speculation", None) or {}
        method, uses_draft = plan_method(
            self.speculation.get("speculative"), provider.draft_model
        )
        check_request_method(method, provider.draft_model)
        self.method = method
        draft_model = provider.draft_model if uses_draft else None

        prompt, _, _, initial_state, vision = owner._tokenize(tokenizer, request, args)
        if vision is not None:
            raise RequestError("images are not supported by mlx_spec.server.")
        stop_sequences, text_sm = owner._make_state_machine(
            provider.model_key, tokenizer, args.stop_words
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
        self.keepalive = _PrefillKeepalive(rqueue, len(rest), owner.keepalive_seconds)
        self.sampler = _sampler(args, tokenizer)
        self.responses = stream_generate(
            model,
            tokenizer,
            rest,
            draft_model,
            speculative=method,
            max_tokens=args.max_tokens,
            sampler=self.sampler,
            logits_processors=lm_server._make_logits_processors(args),
            prompt_cache=cache,
            prefill_step_size=owner.cli_args.prefill_step_size,
            kv_bits=owner.cli_args.kv_bits,
            kv_group_size=owner.cli_args.kv_group_size,
            quantized_kv_start=owner.cli_args.quantized_kv_start,
            prompt_progress_callback=self.keepalive.progress,
            **history_kwargs(stream_generate, cached),
            **method_options_of(self.speculation),
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
                    lm_server._format_top_logprobs(
                        gen.logprobs, self.args.top_logprobs, self.tokenizer
                    ),
                )
            )
            self.tokens.append(gen.token)
            if self.ctx._should_stop or finish_reason is not None:
                return self._close()
            return False
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


# --------------------------------------------------------------------------- #
# HTTP
# --------------------------------------------------------------------------- #


# Numeric fields mlx_lm checks by type and range, which NaN and infinity pass.
FINITE_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "xtc_probability",
    "xtc_threshold",
)


def check_request_values(body: dict) -> None:
    """One-line ``ValueError`` (a 400) for values that would break mlx_lm's own
    checks or the process: non-finite numbers, a malformed ``logit_bias``, a
    seed mx.random.seed cannot take, malformed ``stream_options``."""
    for name in FINITE_FIELDS:
        value = body.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name}={value} must be a finite number.")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise ValueError("logit_bias must be an object of token id to number.")
        for token, value in bias.items():
            if not str(token).isdigit():
                raise ValueError(f"logit_bias key {token!r} is not a token id (>= 0).")
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value):
                raise ValueError(
                    f"logit_bias[{token}]={value!r} must be a finite number."
                )
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(
                f"seed={seed} is out of range: an integer from 0 to 2**64 - 1."
            )
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, dict)
        and isinstance(options.get("include_usage", False), bool)
    ):
        raise ValueError(
            'stream_options must be an object such as {"include_usage": true}.'
        )


# The paths mlx_lm's handler answers POST requests on (others get its 404).
POST_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")
# JSON names of the values ``json.loads`` returns.
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def body_error(raw: bytes) -> Optional[str]:
    """Why a POST body is not a UTF-8 JSON object (one line), or ``None``."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError
        return f"request body is not valid UTF-8 JSON: {e}."
    except RecursionError:
        return "request body is not valid UTF-8 JSON: it is nested too deeply."
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), "a number")
        return f"request body must be a JSON object of request fields, got {kind}."
    return None


# What an mlx_lm adapter directory holds (``mlx_lm.tuner.utils.load_adapters``).
ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")


def check_adapters(adapters) -> None:
    """One-line ``ValueError`` (a 400) unless ``adapters`` is absent or names
    an adapter directory on the server."""
    if adapters is None:
        return
    if not isinstance(adapters, str) or not adapters:
        raise ValueError(
            f"adapters must be the path of an adapter directory, got {adapters!r}."
        )
    path = Path(adapters)
    if not path.is_dir():
        raise ValueError(f"adapters={adapters!r}: no such directory on the server.")
    missing = [name for name in ADAPTER_FILES if not (path / name).is_file()]
    if missing:
        raise ValueError(
            f"adapters={adapters!r} is not an adapter directory "
            f"(no {' or '.join(missing)} in it); mlx_lm.lora writes one."
        )


def check_logit_bias_ids(logit_bias, vocab_size: Optional[int]) -> None:
    """A :class:`RequestError` for a biased token id outside the model's vocabulary."""
    if not logit_bias or not vocab_size:
        return
    for token in logit_bias:
        if not 0 <= int(token) < vocab_size:
            raise RequestError(
                f"logit_bias token {token} is out of range: ids go from 0 to "
                f"{vocab_size - 1} for this model."
            )


def check_request_fields(body: dict, chat: bool) -> None:
    """One-line ``ValueError`` (a 400) for request fields mlx_lm reads unchecked."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ValueError(f"n={n!r} is not supported: the server returns one choice.")
    stop = body.get("stop")
    words = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (
        isinstance(words, list) and all(isinstance(w, str) for w in words)
    ):
        raise ValueError("stop must be a string or a list of strings.")
    prompt = body.get("prompt")
    if not chat and "prompt" in body and not isinstance(prompt, str):
        raise ValueError("prompt must be a string.")
    messages = body.get("messages")
    if not chat or messages is None:
        return  # a missing list gets mlx_lm's own error
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of {role, content} objects.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string role.")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(
                f"messages[{i}].content must be a string or a list of parts."
            )
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(
                    f"messages[{i}].content parts must be objects with a type, "
                    'such as {"type": "text", "text": "..."}.'
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise ValueError(
                    f'messages[{i}].content: a "text" part needs a string text.'
                )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise ValueError(f"messages[{i}].tool_calls must be a list.")


class SpecAPIHandler(lm_server.APIHandler):
    """mlx_lm's handler with speculative request fields and statistics."""

    _spec_request: Optional[SpecCompletionRequest] = None
    _speculation: Optional[Dict[str, Any]] = None
    _isolation: bool = False

    def do_POST(self):
        self._spec_request = None
        self._speculation = None
        self._isolation = False
        if self.path not in POST_PATHS or self.headers.get("Content-Length") is None:
            return super().do_POST()  # mlx_lm's 404 and 411
        raw = self._checked_body()
        if raw is None:
            return  # refused with a 400
        # mlx_lm reads the body itself: it gets the bytes already read.
        connection, self.rfile = self.rfile, io.BytesIO(raw)
        try:
            super().do_POST()
        finally:
            self.rfile = connection

    def _checked_body(self) -> Optional[bytes]:
        """The POST body, or ``None`` once a 400 has said why it is not a JSON object.

        mlx_lm drops the connection on a body that is not UTF-8, and waits
        for the client to hang up on a negative Content-Length.
        """
        length = self.headers["Content-Length"]
        if not length.strip().isdecimal():
            self._refuse(
                f"Content-Length must be a non-negative integer, got {length!r}."
            )
            return None
        raw = self.rfile.read(int(length))
        error = body_error(raw)
        if error is not None:
            self._refuse(error)
            return None
        return raw

    def _refuse(self, message: str, status: int = 400):
        """Answer ``{"error": message}`` with ``status``."""
        body = json.dumps({"error": message}).encode()
        self._set_completion_headers(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def validate_model_parameters(self) -> None:
        check_request_values(self.body)  # before mlx_lm converts logit_bias
        check_adapters(self.body.get("adapters"))
        super().validate_model_parameters()
        check_request_fields(self.body, chat=self.path != "/v1/completions")
        body = dict(self.body)
        body["num_draft_tokens"] = self.num_draft_tokens
        self._speculation = request_speculation(body, self.response_generator.cli_args)
        self._isolation = request_isolation(body)

    def _with_speculation(self, request) -> SpecCompletionRequest:
        values = {name: getattr(request, name) for name in request.__dataclass_fields__}
        self._spec_request = SpecCompletionRequest(
            **values, speculation=self._speculation or {}, isolation=self._isolation
        )
        return self._spec_request

    def handle_chat_completions(self):
        return self._with_speculation(super().handle_chat_completions())

    def handle_text_completions(self):
        return self._with_speculation(super().handle_text_completions())

    def _set_completion_headers(self, status_code: int = 200):
        # mlx_lm answers 404 to any error raised before generation starts;
        # a request the server refuses is the client's error.
        if status_code == 404 and self._spec_request is not None:
            if self._spec_request.error is not None:
                status_code = 400
        super()._set_completion_headers(status_code)

    def _stats(self) -> Optional[dict]:
        request = self._spec_request
        if request is None:
            return None
        return stats_payload(request.stats, request.serving)

    def generate_response(self, text, finish_reason, *args, **kwargs) -> dict:
        response = super().generate_response(text, finish_reason, *args, **kwargs)
        if not self.stream or finish_reason is not None:
            response[STATS_FIELD] = self._stats()
        return response

    def completion_usage_response(self, *args, **kwargs):
        response = super().completion_usage_response(*args, **kwargs)
        response[STATS_FIELD] = self._stats()
        return response

    def handle_models_request(self):
        """``/v1/models``: the served model and draft (no Hugging Face cache scan)."""
        cli_args = self.response_generator.cli_args
        models = []
        for path, role in ((cli_args.model, "model"), (cli_args.draft_model, "draft")):
            if path is None:
                continue
            model_id = str(Path(path).resolve()) if Path(path).exists() else path
            models.append(
                {
                    "id": model_id,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "mlx_spec",
                    "role": role,
                }
            )
        body = json.dumps({"object": "list", "data": models}).encode()
        self._set_completion_headers(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def log_message(self, format, *args):
        logging.info("%s - %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    """mlx_lm's threading HTTP server; a client that hangs up is not an error."""

    daemon_threads = True

    def __init__(self, address, handler, family):
        self.address_family = family
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            logging.info("client %s disconnected", client_address[0])
            return
        super().handle_error(request, client_address)


class SpecServer:
    """A running server: HTTP thread pool plus mlx_lm's generation thread.

    Example::

        server = SpecServer(args)      # args from setup_arg_parser()
        server.start()                 # serve in a background thread
        ...
        server.stop()
    """

    def __init__(self, args: argparse.Namespace):
        """Bind the port and load the models (``ValueError``/``OSError`` on failure).

        ``args.port`` 0 picks a free port (see :attr:`port`).
        """
        self.args = resolve_model_args(args)
        family, _, _, _, address = socket.getaddrinfo(
            self.args.host,
            self.args.port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )[0]
        fingerprint = lm_server.get_system_fingerprint()
        # Bind first: a busy port fails before the generation thread starts.
        self.httpd = _HTTPServer(
            address,
            lambda *a, **k: SpecAPIHandler(
                self.generator, *a, system_fingerprint=fingerprint, **k
            ),
            family,
        )
        cache_limits = {"max_size": self.args.prompt_cache_size}
        if getattr(self.args, "prompt_cache_bytes", None) is not None:
            cache_limits["max_bytes"] = self.args.prompt_cache_bytes
        try:
            # Load before the generation thread starts: a bad path or a
            # mismatched draft fails here, in one line, not in that thread.
            self.provider = SpecModelProvider(self.args)
            self.provider.load_default()
        except BaseException:
            self.httpd.server_close()
            raise
        tokens = getattr(self.args, "cross_request_tokens", 0)
        self.index = CrossRequestIndex(tokens) if tokens else None
        self.generator = SpecResponseGenerator(
            self.provider, LRUPromptCache(**cache_limits), self.index
        )
        self._thread: Optional[threading.Thread] = None

    @property
    def method(self) -> str:
        """The method a request that names none runs (as ``plan_method`` resolves it)."""
        return plan_method(self.args.speculative, self.provider.draft_model)[0]

    def describe(self) -> str:
        """The startup log line: address, models and the method actually used."""
        return (
            f"mlx_spec.server at {self.url} (model {self.args.model}, "
            f"draft {self.args.draft_model}, speculative {self.method})"
        )

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.args.host}:{self.port}"

    def wait_ready(self, timeout: float = 120.0):
        """Block until the models are loaded (or the generation thread died)."""
        deadline = time.monotonic() + timeout
        while self.provider.model is None:
            if not self.generator.generation_available():
                raise RuntimeError("the generation thread died while loading the model")
            if time.monotonic() > deadline:
                raise TimeoutError("the model did not load in time")
            time.sleep(0.05)

    def start(self) -> "SpecServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self):
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()
        self.generator.stop_and_join()


def main(argv: Optional[List[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), None),
        format="%(asctime)s - %(levelname)s - %(message)s",
    )
    try:
        check_port(args.port)
        server = SpecServer(args)
    except (ValueError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    try:
        server.wait_ready()
    except (RuntimeError, TimeoutError) as e:
        server.stop()
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    logging.info(server.describe())
    server.serve_forever()


if __name__ == "__main__":
    main()
