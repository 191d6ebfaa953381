"""``mlx_spec.server``: mlx_lm's OpenAI-compatible server with speculative methods.

Built on ``mlx_lm.server`` itself: its flags, its HTTP handler (chat and
text completions, SSE streaming, stop words, tool calls, logprobs), its
model provider and its prompt cache. What changes:

- every flag of ``mlx_lm.server`` plus ``--speculative METHOD`` and each
  method's options; with no ``--model`` the embedded default pair is served;
- each request is served by :func:`mlx_spec.stream_generate`, one at a time
  from mlx_lm's request queue (never batched), so caches never mix;
- per-request JSON fields ``speculative``, ``num_draft_tokens``,
  ``tree_budget``, ``tree_top_k``, ``tree_depth``, ``tree_choices``,
  ``ngram_min``, ``ngram_max`` and ``adaptive``; a bad value gets HTTP 400
  with ``{"error": "..."}``;
- responses carry the speculation statistics in ``speculative_stats``
  (the final chunk of a stream); ``usage`` keeps OpenAI's shape;
- the models are loaded (and a draft's tokenizer checked against the
  target's) before the server answers anything, so a bad path is a
  one-line error at startup, never a server that hangs;
- streaming requests get ``: keepalive`` SSE comments while their prompt
  is processed, as mlx_lm's do.
"""

from .. import ensure_fast_blas

ensure_fast_blas()

import argparse
import gc
import json
import logging
import socket
import sys
import threading
import time
import types
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

from ..cli.options import (
    add_speculative_options,
    method_option_fields,
    method_options,
)
from ..config import DEFAULT_NUM_DRAFT_TOKENS, SpecConfig
from ..generation import stream_generate
from ..integration import history_kwargs, plan_method
from ..loading import check_draft_tokenizer, default_model_pair, load_model
from ..sampling import make_sampler

# Methods that run a draft model next to the target (their prompt caches
# hold the target's layers followed by the draft's).
DRAFT_METHODS = ("draft", "tree")
# Statistics left out of responses (per-round lists grow with the output).
_STATS_LISTS = ("accepted_per_round", "drafted_per_round", "tree_sizes")
STATS_FIELD = "speculative_stats"
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
    parser = mlx_lm_server_parser()
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
        target, draft = default_model_pair()
        args.model = target
        if args.draft_model is None and args.speculative not in (
            "none",
            "lookup",
            "self",
        ):
            args.draft_model = draft
    method, _ = plan_method(args.speculative, args.draft_model)
    if method in DRAFT_METHODS and args.draft_model is None:
        raise ValueError(f"--speculative {method} needs a --draft-model.")
    SpecConfig(method=method, **method_options(args))
    return args


# --------------------------------------------------------------------------- #
# Requests
# --------------------------------------------------------------------------- #


@dataclass
class SpecCompletionRequest(lm_server.CompletionRequest):
    """mlx_lm's request plus its speculative options and, once served, stats."""

    speculation: Dict[str, Any] = field(default_factory=dict)
    stats: Any = None
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


def stats_payload(stats) -> Optional[dict]:
    """The JSON ``speculative_stats`` of a :class:`SpecStats` (lists left out)."""
    if stats is None:
        return None
    out = stats.as_dict()
    for name in _STATS_LISTS:
        out.pop(name, None)
    return out


# --------------------------------------------------------------------------- #
# Model provider and generation
# --------------------------------------------------------------------------- #


class SpecModelProvider(lm_server.ModelProvider):
    """mlx_lm's provider with one-line load errors and a checked draft.

    Requests are never batched (each runs mlx_spec's loop). A draft whose
    tokenizer differs from the target's is refused (``ValueError``) rather
    than merely warned about.
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
        if draft_model_path is not None:
            draft_model, draft_tokenizer = load_model(
                draft_model_path,
                "draft model",
                trust_remote_code=self.cli_args.trust_remote_code,
            )
            check_draft_tokenizer(tokenizer, draft_tokenizer)
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
    top_p = sampling.top_p if 0 < sampling.top_p < 1 else 1.0
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


class SpecResponseGenerator(lm_server.ResponseGenerator):
    """mlx_lm's request queue and generation thread, serving with mlx_spec."""

    keepalive_seconds: float = KEEPALIVE_SECONDS

    def _serve_single(self, request, stream):
        rqueue, request, args = request
        try:
            self._serve(rqueue, request, args)
        except Exception as e:
            if isinstance(request, SpecCompletionRequest) and isinstance(e, ValueError):
                request.error = e
            rqueue.put(e)

    def _serve(self, rqueue, request, args):
        provider = self.model_provider
        model, tokenizer = provider.model, provider.tokenizer
        speculation = getattr(request, "speculation", None) or {}
        method, uses_draft = plan_method(
            speculation.get("speculative"), provider.draft_model
        )
        if method in DRAFT_METHODS and not uses_draft:
            raise RequestError(
                f"speculative='{method}' needs a draft model; start the server with "
                "--draft-model or choose another method."
            )
        draft_model = provider.draft_model if uses_draft else None

        prompt, _, _, initial_state, vision = self._tokenize(tokenizer, request, args)
        if vision is not None:
            raise RequestError("images are not supported by mlx_spec.server.")
        stop_sequences, text_sm = self._make_state_machine(
            provider.model_key, tokenizer, args.stop_words
        )

        # Caches with and without the draft's layers are kept apart.
        cache_model = (provider.model_key, uses_draft)
        cache, rest = self.prompt_cache.fetch_nearest_cache(cache_model, prompt)
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
        keepalive = _PrefillKeepalive(rqueue, len(rest), self.keepalive_seconds)
        responses = stream_generate(
            model,
            tokenizer,
            rest,
            draft_model,
            speculative=method,
            max_tokens=args.max_tokens,
            sampler=_sampler(args, tokenizer),
            logits_processors=lm_server._make_logits_processors(args),
            prompt_cache=cache,
            prefill_step_size=self.cli_args.prefill_step_size,
            kv_bits=self.cli_args.kv_bits,
            kv_group_size=self.cli_args.kv_group_size,
            quantized_kv_start=self.cli_args.quantized_kv_start,
            prompt_progress_callback=keepalive.progress,
            **history_kwargs(stream_generate, cached),
            **method_options_of(speculation),
        )
        if isinstance(request, SpecCompletionRequest):
            request.stats = responses.stats
        ctx = lm_server.GenerationContext(
            has_thinking=tokenizer.has_thinking,
            has_tool_calling=tokenizer.has_tool_calling,
            tool_parser=tokenizer.tool_parser,
            text_sm=text_sm,
            initial_state=initial_state,
            prompt=prompt,
            prompt_cache_count=len(cached),
        )
        rqueue.put(ctx)

        tokens = list(prompt)
        matcher = stop_sequences.matcher()
        keepalive.start()
        try:
            for gen in responses:
                keepalive.stop()
                finish_reason = gen.finish_reason
                if matcher.advance(gen.token):
                    finish_reason = "stop"
                rqueue.put(
                    lm_server.Response(
                        gen.text,
                        gen.token,
                        gen.logprobs[gen.token].item(),
                        finish_reason,
                        lm_server._format_top_logprobs(
                            gen.logprobs, args.top_logprobs, tokenizer
                        ),
                    )
                )
                tokens.append(gen.token)
                if ctx._should_stop or finish_reason is not None:
                    break
        finally:
            keepalive.stop()
            # Rewinds the caches to the prompt plus the tokens sent.
            responses.close()
        rqueue.put(None)
        self.prompt_cache.insert_cache(cache_model, tokens, cache)


# --------------------------------------------------------------------------- #
# HTTP
# --------------------------------------------------------------------------- #


class SpecAPIHandler(lm_server.APIHandler):
    """mlx_lm's handler with speculative request fields and statistics."""

    _spec_request: Optional[SpecCompletionRequest] = None
    _speculation: Optional[Dict[str, Any]] = None

    def do_POST(self):
        self._spec_request = None
        self._speculation = None
        super().do_POST()

    def validate_model_parameters(self) -> None:
        super().validate_model_parameters()
        body = dict(self.body)
        body["num_draft_tokens"] = self.num_draft_tokens
        self._speculation = request_speculation(body, self.response_generator.cli_args)

    def _with_speculation(self, request) -> SpecCompletionRequest:
        values = {name: getattr(request, name) for name in request.__dataclass_fields__}
        self._spec_request = SpecCompletionRequest(
            **values, speculation=self._speculation or {}
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
        return stats_payload(request.stats) if request is not None else None

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
        self.generator = SpecResponseGenerator(
            self.provider, LRUPromptCache(**cache_limits)
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
