"""Test servers: ``mlx_spec.server`` in this process on a free loopback port,
and models slowed so a test's steps land while a reply or prompt still runs."""

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request

from mlx_spec.serve.cli import setup_arg_parser
from mlx_spec.serve.server import SpecServer

# Seconds a slowed forward sleeps first: a tiny test model on a loaded machine
# could otherwise end a long reply or prompt before the test's next step lands.
SLOW_FORWARD = 0.02


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


class RawStream:
    """A streamed completion over a raw socket: the socket and the bytes read so far."""

    def __init__(self, sock):
        self.sock = sock
        self.received = b""

    def close(self):
        self.sock.close()


def send_raw(server, body: dict) -> socket.socket:
    """POST ``body`` to ``/v1/completions`` over a raw socket, reading nothing
    (so a test can hang up at any point); the caller closes the socket."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def open_stream(server, body: dict, events: int = 1) -> RawStream:
    """:func:`send_raw` of ``body`` streamed; read until ``events`` ``data:`` events came."""
    stream = RawStream(send_raw(server, {**body, "stream": True}))
    try:
        while stream.received.count(b"data:") < events:
            chunk = stream.sock.recv(4096)
            assert chunk, stream.received  # refused, or closed early
            stream.received += chunk
    except BaseException:
        stream.close()
        raise
    return stream


@contextlib.contextmanager
def hooked_forwards(model, before):
    """Within the block, ``before(cache)`` runs first in each forward of
    ``model`` (this object only, whoever calls it; ``cache`` is the one the
    forward is given); its outputs are unchanged."""
    plain = type(model)

    def hooked_call(self, *args, **kwargs):  # (inputs, cache=None, ...)
        before(kwargs.get("cache", args[1] if len(args) > 1 else None))
        return plain.__call__(self, *args, **kwargs)

    model.__class__ = type(
        f"Hooked{plain.__name__}", (plain,), {"__call__": hooked_call}
    )
    try:
        yield model
    finally:
        model.__class__ = plain


def slow_forwards(model, seconds: float = SLOW_FORWARD):
    """Within the block, each forward of ``model`` sleeps ``seconds`` first."""
    return hooked_forwards(model, lambda cache: time.sleep(seconds))


def running(server) -> list:
    """What the generation thread runs: the request alone, or the batch's rows."""
    generator = server.generator
    return [r for r in (generator._solo, *list(generator._clients.values())) if r]


def request_running(server, started=lambda run: True, timeout: float = 60):
    """The first of :func:`running` once ``started(run)`` holds, polled."""
    deadline = time.monotonic() + timeout
    while not (runs := [r for r in running(server) if started(r)]):
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)
    return runs[0]


def hang_up(server, sock, run, timeout: float = 60):
    """Close ``sock`` (``run``'s client) and wait until the server can see it."""
    assert any(r is run for r in running(server)), "it ended before the client left"
    sock.close()
    deadline = time.monotonic() + timeout
    while not run.request.client_gone():
        assert time.monotonic() < deadline, "the server never saw the hang-up"
        time.sleep(0.005)


def idle(server, timeout: float = 60) -> bool:
    """Whether the generation thread runs nothing within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while running(server):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
