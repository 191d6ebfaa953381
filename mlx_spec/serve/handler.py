"""``mlx_spec.server``'s HTTP side: mlx_lm's handler with the speculative
request fields, their checks, and the statistics in responses."""

import io
import json
import logging
import select
import socket
import sys
from http.server import ThreadingHTTPServer
from typing import Optional

import mlx_lm.server as lm_server

from ..config import SpecConfig
from ..limits import context_window
from .requests import (
    POST_PATHS,
    STATS_FIELD,
    RequestError,
    SpecCompletionRequest,
    body_error,
    check_adapters,
    check_request_fields,
    check_request_values,
    check_served_paths,
    public_name,
    request_config,
    request_isolation,
    stats_payload,
)


class SpecAPIHandler(lm_server.APIHandler):
    """mlx_lm's handler with speculative request fields and statistics."""

    _spec_request: Optional[SpecCompletionRequest] = None
    _config: Optional[SpecConfig] = None
    _isolation: bool = False
    _model_echo: Optional[str] = None

    def do_POST(self):
        self._spec_request = None
        self._config = None
        self._isolation = False
        self._model_echo = None
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
        limit = getattr(self.response_generator.cli_args, "max_request_bytes", None)
        if limit is not None and int(length) > limit:
            self.close_connection = True  # the body is left unread
            self._refuse(
                f"the request body is {int(length)} bytes, more than this server's "
                f"limit of {limit} (--max-request-bytes).",
                413,
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
        cli_args = self.response_generator.cli_args
        # First: whether a path exists must not show in the answer.
        served = check_served_paths(self.body, cli_args)
        self._model_echo = self.requested_model
        if served["model"]:
            self.requested_model = "default_model"
        if served["draft_model"]:
            self.requested_draft_model = "default_model"
        if served["adapters"] and self.adapter is not None:
            self.adapter = None  # the served one: the default model's
        check_request_values(self.body)  # before mlx_lm converts logit_bias
        check_adapters(self.adapter)
        super().validate_model_parameters()
        check_max_tokens(self.max_tokens, cli_args, self.response_generator)
        check_request_fields(self.body, chat=self.path != "/v1/completions")
        body = dict(self.body)
        body["num_draft_tokens"] = self.num_draft_tokens
        self._config = request_config(body, self.response_generator.cli_args)
        self._isolation = request_isolation(body)

    def _with_speculation(self, request) -> SpecCompletionRequest:
        values = {name: getattr(request, name) for name in request.__dataclass_fields__}
        self._spec_request = SpecCompletionRequest(
            **values,
            config=self._config,
            isolation=self._isolation,
            client_gone=self._client_gone,
        )
        return self._spec_request

    def _client_gone(self) -> bool:
        """Whether the client hung up (end of stream or reset), without reading.

        Polled by the generation thread, so a request whose client left stops
        within a round, streamed or not, and during its prefill.
        """
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            if not ready:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset, or already closed
            return True

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
        if self._model_echo is not None:
            response["model"] = self._model_echo
        if not self.stream or finish_reason is not None:
            response[STATS_FIELD] = self._stats()
        return response

    def completion_usage_response(self, *args, **kwargs):
        response = super().completion_usage_response(*args, **kwargs)
        if self._model_echo is not None:
            response["model"] = self._model_echo
        response[STATS_FIELD] = self._stats()
        return response

    def handle_models_request(self):
        """``/v1/models``: the served model and draft (no Hugging Face cache scan)."""
        cli_args = self.response_generator.cli_args
        models = []
        for path, role in ((cli_args.model, "model"), (cli_args.draft_model, "draft")):
            if path is None:
                continue
            models.append(
                {
                    "id": public_name(path),
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


def max_tokens_limit(cli_args, generator) -> Optional[int]:
    """The most tokens a request may ask for: ``--max-tokens-limit``, else the
    served model's context window (``None`` if neither is known)."""
    limit = getattr(cli_args, "max_tokens_limit", None)
    if limit:
        return limit
    model = generator.model_provider.model
    return context_window(model) if model is not None else None


def check_max_tokens(max_tokens: int, cli_args, generator) -> None:
    """A 400 for ``max_tokens`` beyond the server's limit (before any work)."""
    limit = max_tokens_limit(cli_args, generator)
    if limit is not None and max_tokens > limit:
        raise RequestError(
            f"max_tokens={max_tokens} is out of range: at most {limit} on this "
            "server (--max-tokens-limit, or the model's context window)."
        )


class SpecHTTPServer(ThreadingHTTPServer):
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
