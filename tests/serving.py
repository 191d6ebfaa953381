"""Test servers: ``mlx_spec.server`` in this process on a free loopback port."""

import json
import urllib.error
import urllib.request

from mlx_spec.serve.cli import setup_arg_parser
from mlx_spec.serve.server import SpecServer


def start_server(*flags: str, max_tokens: int = 16, quiet: bool = True):
    """A started and ready :class:`SpecServer` with ``flags``; stop it when done.

    Args:
        flags: Its command-line flags (``--model`` and the like).
        max_tokens: ``--max-tokens``. Default: ``16``.
        quiet: Log only critical records. Default: ``True``.
    """
    argv = [*flags, "--port", "0", "--max-tokens", str(max_tokens)]
    if quiet:
        argv += ["--log-level", "CRITICAL"]
    server = SpecServer(setup_arg_parser().parse_args(argv)).start()
    server.wait_ready()
    return server


def post(server, body, *, path: str = "/v1/completions", timeout: float = 120):
    """POST ``body`` (a dict, or raw bytes) to ``server``; return ``(status, JSON answer)``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
