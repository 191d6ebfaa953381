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
import logging
import socket
import threading
import time
from typing import List, Optional

import mlx.core as mx
import mlx_lm.server as lm_server
from mlx_lm.models.cache import LRUPromptCache

from mlx_spec_entry import guarded

from .. import mlx_lm_private as lm_private
from ..config import plan_method
from ..distributed import (
    errors_in_one_line,
    exit_in_one_line,
    rank,
    sharded_group,
)
from ..loading import (
    check_sharding_options,
    draft_source,
    load_draft,
    load_model,
    load_sharded_model,
)
from ..mtp import load_mtp
from ..validation import check_chat_template_syntax
from .cli import check_port, host_warning, resolve_model_args, setup_arg_parser
from .handler import SpecAPIHandler, SpecHTTPServer
from .index import CrossRequestIndex
from .scheduler import SpecResponseGenerator


class SpecModelProvider(lm_server.ModelProvider):
    """mlx_lm's provider with one-line load errors and a checked draft.

    Under ``mlx.launch`` the target is sharded over the processes,
    tensor-parallel or in ``--pipeline`` stages
    (:func:`mlx_spec.loading.load_sharded_model`), and the draft model is
    whole on every rank. A draft whose tokenizer
    differs from the target's is refused (``ValueError``) rather than
    merely warned about, and so is a ``--chat-template`` that the loaded
    tokenizer cannot compile.
    """

    def _load(self, model_path, adapter_path=None, draft_model_path=None):
        self._load_models(model_path, adapter_path, draft_model_path)
        template = getattr(self.cli_args, "chat_template", None)
        if template:  # "" is mlx_lm's "none given"
            check_chat_template_syntax(self.tokenizer, template, "--chat-template")

    def _load_models(self, model_path, adapter_path=None, draft_model_path=None):
        self.reset()
        gc.collect()
        mx.clear_cache()
        if self.is_distributed:
            model, tokenizer = load_sharded_model(
                model_path,
                pipeline=self.cli_args.pipeline,
                tokenizer_config=lm_private.tokenizer_config(self),
            )
            config = None
        else:
            model, tokenizer, config = load_model(
                model_path,
                "model",
                adapter_path=adapter_path,
                tokenizer_config=lm_private.tokenizer_config(self),
                return_config=True,
                trust_remote_code=self.cli_args.trust_remote_code,
            )
        if self.cli_args.use_default_chat_template and tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        draft_model = None
        source = draft_source(
            self.cli_args.speculative,
            model_path,
            draft_model_path,
            model,
            self.is_distributed,
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
        # A sharded load has no processor: images are refused anyway.
        self.processor = (
            None if config is None else lm_server.load_processor(model, config)
        )
        self.draft_model = draft_model
        self.is_batchable = False


def check_sharded_flags(args: argparse.Namespace):
    """A one-line ``ValueError`` for flags a sharded server cannot honour, and
    for ``--pipeline`` without ``mlx.launch``
    (:func:`~mlx_spec.loading.check_sharding_options`).

    Each rank loads a request's model from its own disk, so one that lacks
    it would fail while the others wait in the sharded load: requests keep
    the models the group started with (and so bring no adapters). In pipeline
    stages each rank holds its own layers' caches, so a byte limit would
    evict different prompts on each rank and the ranks would leave lockstep.
    """
    sharded = sharded_group() is not None
    check_sharding_options(
        sharded,
        pipeline=args.pipeline,
        adapter_path=getattr(args, "adapter_path", None),
        prog="mlx_spec.server",
    )
    if not sharded:
        return
    if getattr(args, "allow_request_models", None):
        raise ValueError(
            "a sharded server serves the models it was started with (a model "
            "missing on one machine would stall the group); drop "
            "--allow-request-models, or start another group for another model."
        )
    if args.pipeline and getattr(args, "prompt_cache_bytes", None) is not None:
        raise ValueError(
            "--pipeline stages each hold their own layers' caches, so a byte "
            "limit could keep different prompts on each; drop "
            "--prompt-cache-bytes (--prompt-cache-size applies)."
        )


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
        check_sharded_flags(self.args)
        try:
            family, _, _, _, address = socket.getaddrinfo(
                self.args.host,
                self.args.port,
                type=socket.SOCK_STREAM,
                flags=socket.AI_PASSIVE,
            )[0]
        except (OSError, UnicodeError) as e:  # "Name or service not known"
            raise ValueError(f"--host {self.args.host!r} is not an address: {e}")
        fingerprint = lm_server.get_system_fingerprint()
        # Bind first: a busy port fails before the generation thread starts.
        # Under mlx.launch only rank 0 serves HTTP; the others follow it.
        self.httpd = None
        if rank() == 0:
            try:
                self.httpd = SpecHTTPServer(
                    address,
                    lambda *a, **k: SpecAPIHandler(
                        self.generator, *a, system_fingerprint=fingerprint, **k
                    ),
                    family,
                )
            except OSError as e:  # "Address already in use"
                where = f"{self.args.host}:{self.args.port}"
                raise OSError(f"cannot listen on {where} (--host, --port): {e}")
        cache_limits = {"max_size": self.args.prompt_cache_size}
        if getattr(self.args, "prompt_cache_bytes", None) is not None:
            cache_limits["max_bytes"] = self.args.prompt_cache_bytes
        try:
            # Load before the generation thread starts: a bad path or a
            # mismatched draft fails here, in one line, not in that thread.
            self.provider = SpecModelProvider(self.args)
            self.provider.load_default()
        except BaseException:
            if self.httpd is not None:
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
        """Serve until interrupted (see :attr:`failed`).

        Sharded, every rank returns when the generation thread ends (an error
        on any rank ends the group: mlx.launch stops the others once one
        exits with an error).
        """
        try:
            if self.provider.is_distributed:
                if self.httpd is not None:
                    self.start()
                self.generator.join()
            else:
                self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    @property
    def failed(self) -> bool:
        """Whether the generation thread died of an error."""
        return lm_private.generation_failed(self.generator)

    def stop(self):
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        if self.httpd is not None:
            self.httpd.server_close()
        self.generator.stop_and_join()


def main(argv: Optional[List[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    # Only rank 0 logs below warnings, but at DEBUG every rank logs (each
    # request's tokens, to compare the ranks).
    level = args.log_level.upper()
    logging.basicConfig(
        level=level if rank() == 0 or level == "DEBUG" else "WARNING",
        format="%(asctime)s - %(levelname)s - %(message)s",
    )
    # Sharded, each error is said once for the group (rank 0's, or a rank's own).
    with errors_in_one_line(parser, (ValueError, OSError)):
        check_port(args.port)
        server = SpecServer(args)
    try:
        server.wait_ready()
    except (RuntimeError, TimeoutError) as e:
        server.stop()
        exit_in_one_line(parser, e, code=1)
    if rank() == 0:
        warning = host_warning(args.host)
        if warning is not None:
            logging.warning(warning)
        logging.info(server.describe())
    server.serve_forever()
    if server.failed:
        exit_in_one_line(parser, "generation failed; see the log.", code=1)


if __name__ == "__main__":
    guarded(main)
