"""Fault and load runs of ``mlx_spec.server`` (a subprocess on 127.0.0.1).

``storm``: 8 clients at once, half of them hang up mid-answer (two streamed,
two not); the others must get exactly plain mlx-lm's greedy text, and the
server's CPU must go idle within 2 s of the last hang-up.

``soak``: 500 requests (methods, prompt lengths, streamed or not, one in
ten hung up), with the server's resident memory sampled every 50; it must
stay within 10% of its level after the first 50.

    python -m benchmarks.serve_faults storm [--model DIR]
    python -m benchmarks.serve_faults soak [--model DIR] [--requests 500]

Both print one JSON line of figures and exit 1 if a goal is missed. The
server's CPU time and memory are read from ``/proc`` (Linux) or ``ps``.
"""

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import List, Optional, Tuple

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is in two sentences.",
    "List three uses of the command grep.",
    "def fibonacci(n):\n",
    "The capital of France is",
    "Translate to French: good morning, my friend.",
    "class Stack:\n    def __init__(self):\n",
    "Summarise why the sky is blue.",
]
METHODS = ("auto", "lookup", "none", "draft", "tree")
DRAFT_FREE = ("auto", "lookup", "none")
# Leavers count on: a long answer, still going when they hang up.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,"
IDLE_CORES = 0.05  # below this share of one core the server counts as idle


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usage(pid: int) -> Tuple[float, int]:
    """``(cpu_seconds, rss_bytes)`` of process ``pid``."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        fields = stat.read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return cpu, rss
    out = subprocess.run(
        ["ps", "-o", "time=,rss=", "-p", str(pid)], capture_output=True, text=True
    ).stdout.split()
    minutes, seconds = out[0].split(":")[-2:]
    return int(minutes) * 60 + float(seconds), int(out[1]) * 1024


class Server:
    """``python -m mlx_spec.server`` on a free loopback port."""

    def __init__(self, model: str, draft: Optional[str], max_tokens: int):
        self.port = _free_port()
        argv = [sys.executable, "-m", "mlx_spec", "server", "--model", model]
        argv += ["--draft-model", draft] if draft else []
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--max-tokens", str(max_tokens), "--log-level", "WARNING"]
        self.process = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start")
                time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def usage(self) -> Tuple[float, int]:
        return usage(self.process.pid)

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _open(server: Server, body: dict) -> socket.socket:
    """A raw connection that has sent ``body`` as a completion request."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=600)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _request(server: Server, body: dict, hang_up_after: Optional[int]) -> str:
    """Send a completion; return its text, or hang up after that many chunks
    (0: before any answer, for a request that is not streamed)."""
    sock = _open(server, body)
    received = b""
    try:
        while True:
            if hang_up_after is not None and received.count(b"data:") >= hang_up_after:
                return ""
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    head, _, payload = received.partition(b"\r\n\r\n")
    if not body.get("stream"):
        return json.loads(payload)["choices"][0]["text"]
    text = ""
    for line in payload.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                text += choice.get("text") or ""
    return text


def _answered(sock: socket.socket) -> bool:
    """Whether the whole answer has arrived on ``sock`` (reads what is there)."""
    sock.setblocking(False)
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
            received += chunk
    except BlockingIOError:
        pass
    # Streamed: the end marker; not streamed: any answer at all (a 200 or an error).
    return b"[DONE]" in received or bool(received) and b"data:" not in received


def _idle_after(server: Server, since: float, window: float = 0.2) -> float:
    """Seconds from ``since`` until the server's CPU use drops below idle."""
    cpu, _ = server.usage()
    tic = time.monotonic()
    while time.monotonic() - since < 30:
        time.sleep(window)
        now_cpu, _ = server.usage()
        now = time.monotonic()
        if (now_cpu - cpu) / (now - tic) < IDLE_CORES:
            return tic - since
        cpu, tic = now_cpu, now
    return float("inf")


def storm(server: Server, model: str, methods, max_tokens: int) -> dict:
    import mlx_lm

    target, tokenizer = mlx_lm.load(model)
    expected = {
        p: mlx_lm.generate(target, tokenizer, p, max_tokens=max_tokens)
        for p in PROMPTS[:4]
    }
    results: List = [None] * 8
    busy = []

    def measure_busy():  # the server's CPU use just before the hang-ups
        cpu, tic = server.usage()[0], time.monotonic()
        time.sleep(0.5)
        busy.append((server.usage()[0] - cpu) / (time.monotonic() - tic))

    # Every client; then the leavers hang up.
    keepers_done = threading.Barrier(8, action=measure_busy)
    last_hang_up = [0.0]

    def keeper(i):
        body = {"prompt": PROMPTS[i], "max_tokens": max_tokens, "stream": i % 2 == 0}
        body["speculative"] = methods[i % len(methods)]
        results[i] = _request(server, body, None)
        keepers_done.wait()

    def leaver(i):
        stream = i % 2 == 0
        body = {"prompt": COUNTING, "max_tokens": 3000, "stream": stream}
        # A streamed leaver reads a few chunks first; both hang up once the
        # keepers are done, so the last event is a hang-up.
        sock = _open(server, body)
        if stream:
            received = b""
            while received.count(b"data:") < 3:
                received += sock.recv(4096)
        keepers_done.wait()
        results[i] = "finished before" if _answered(sock) else "hung up"
        sock.close()
        last_hang_up[0] = max(last_hang_up[0], time.monotonic())

    threads = [threading.Thread(target=keeper, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=leaver, args=(i,)) for i in range(4, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    idle = _idle_after(server, last_hang_up[0])
    exact = sum(results[i] == expected[PROMPTS[i]] for i in range(4))
    hung_up = results[4:].count("hung up")
    return {
        "clients": 8,
        "hung_up_while_generating": f"{hung_up}/4",
        "exact_answers": f"{exact}/4",
        "server_cores_before_hang_up": round(busy[0], 2) if busy else None,
        "idle_after_last_hang_up_s": round(idle, 2),
        "server_alive": server.process.poll() is None,
        "ok": exact == 4 and hung_up == 4 and idle <= 2.0 and busy[0] > IDLE_CORES,
    }


def soak(server: Server, methods, requests: int, max_tokens: int) -> dict:
    rng = random.Random(0)
    samples = []
    hung_up = failed = 0
    tic = time.monotonic()
    for n in range(requests):
        prompt = rng.choice(PROMPTS) * rng.choice((1, 4, 16))
        stream = rng.random() < 0.5
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        body["speculative"] = rng.choice(methods)
        leave = rng.random() < 0.1
        try:
            _request(server, body, (2 if stream else 0) if leave else None)
            hung_up += leave
        except (OSError, ValueError, KeyError):
            failed += 1
        if (n + 1) % 50 == 0:
            time.sleep(0.5)  # let a hung-up request end before sampling
            samples.append(server.usage()[1])
    base = samples[0]
    drift = max(abs(s - base) / base for s in samples)
    return {
        "requests": requests,
        "hung_up": hung_up,
        "failed": failed,
        "rss_mb_every_50": [round(s / 2**20) for s in samples],
        "max_drift_from_first_sample": round(drift, 3),
        "minutes": round((time.monotonic() - tic) / 60, 1),
        "ok": drift <= 0.10 and failed == 0,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_faults")
    parser.add_argument("run", choices=("storm", "soak"))
    parser.add_argument("--model", default=None, help="default: the default target")
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    model, draft = args.model, args.draft_model
    if model is None:
        from mlx_spec.loading import default_model_pair

        model, draft = default_model_pair("draft")
    methods = METHODS if draft else tuple(m for m in METHODS if m in DRAFT_FREE)
    server = Server(model, draft, args.max_tokens)
    try:
        if args.run == "storm":
            figures = storm(server, model, methods, args.max_tokens)
        else:
            figures = soak(server, methods, args.requests, args.max_tokens)
    finally:
        server.stop()
    print(json.dumps(dict(figures, model=str(model), draft=str(draft))))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
