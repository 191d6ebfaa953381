"""Clients of the load benchmark: requests, concurrent runs and their statistics."""

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .prompts import prompt_suite
from .serve_servers import ServerProcess

REQUEST_TIMEOUT = 900.0


@dataclass
class Result:
    """One request as a client saw it. Times are ``time.perf_counter`` seconds."""

    server: str
    prompt: str
    start: float
    first: Optional[float] = None
    end: Optional[float] = None
    tokens: int = 0
    text: str = ""
    stats: Optional[dict] = None
    error: Optional[str] = None

    @property
    def latency(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first is None else self.first - self.start

    @property
    def decode_tps(self) -> Optional[float]:
        if self.first is None or self.end is None or self.tokens < 2:
            return None
        return (self.tokens - 1) / max(self.end - self.first, 1e-9)


def request_body(prompt, chat: bool, max_tokens: int, extra=None) -> dict:
    body = {
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = prompt
    else:
        body["prompt"] = prompt
    body.update(extra or {})
    return body


def send(server: ServerProcess, body: dict, label: str) -> Result:
    """POST one streamed request; time its first token and its end."""
    chat = "messages" in body
    path = "/v1/chat/completions" if chat else "/v1/completions"
    data = json.dumps(body).encode()
    result = Result(server.name, label, time.perf_counter())
    try:
        conn = http.client.HTTPConnection(
            "127.0.0.1", server.port, timeout=REQUEST_TIMEOUT
        )
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or []:
                if chat:
                    piece = (choice.get("delta") or {}).get("content")
                else:
                    piece = choice.get("text")
                if piece:
                    if result.first is None:
                        result.first = time.perf_counter()
                    result.text += piece
            if event.get("usage"):
                result.tokens = event["usage"]["completion_tokens"]
            if event.get("speculative_stats"):
                result.stats = event["speculative_stats"]
        result.end = time.perf_counter()
        conn.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        result.error = f"{type(e).__name__}: {e}"
    if result.first is None and result.end is not None:
        result.first = result.end
    return result


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q`` quantile (0..1) by linear interpolation; ``None`` if empty."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    pos = q * (len(values) - 1)
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def suite_prompts(chat: bool) -> List[tuple]:
    """``(label, prompt)`` pairs of the benchmark suite, messages or text."""
    out = []
    for p in prompt_suite(chat=chat):
        if chat:
            messages = p.messages or (("user", p.text),)
            out.append((p.name, [{"role": r, "content": c} for r, c in messages]))
        else:
            out.append((p.name, p.text))
    return out


def run_clients(server, prompts, n_clients, per_client, chat, max_tokens, offset=0):
    """``n_clients`` threads, each sending ``per_client`` requests back to back."""
    plan = [
        [
            (*prompts[(offset + c * per_client + r) % len(prompts)], max_tokens)
            for r in range(per_client)
        ]
        for c in range(n_clients)
    ]
    return run_plan(server, plan, chat)


def _totals(results: Sequence[Result]):
    """``(answered, row)``: the answered results, and the counts and tokens
    per second (all completion tokens over the wall time of all requests)."""
    ok = [r for r in results if r.error is None]
    wall = max(r.end for r in ok) - min(r.start for r in ok) if ok else None
    tokens = sum(r.tokens for r in ok)
    return ok, {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
    }


def summarize(results: Sequence[Result]) -> dict:
    ok, row = _totals(results)
    batch = [r.stats.get("mean_batch_size") for r in ok if r.stats]
    batch = [b for b in batch if b is not None]
    return {
        **row,
        "aggregate_tokens_per_s": row["tokens_per_s"],
        "latency_p50_s": percentile([r.latency for r in ok], 0.5),
        "latency_p95_s": percentile([r.latency for r in ok], 0.95),
        "ttft_p50_s": percentile([r.ttft for r in ok], 0.5),
        "ttft_p95_s": percentile([r.ttft for r in ok], 0.95),
        "decode_tokens_per_s_mean": mean_of([r.decode_tps for r in ok]),
        "mean_batch_size": mean_of(batch),
    }


def inter_token_latency(result: Result) -> Optional[float]:
    """A request's mean time between output tokens after the first, in s."""
    if result.first is None or result.end is None or result.tokens < 2:
        return None
    return (result.end - result.first) / (result.tokens - 1)


def latency_summary(results: Sequence[Result]) -> dict:
    """Percentiles of one run of the mixed workload (see the module docstring)."""
    ok, row = _totals(results)
    stats = [r.stats for r in ok if r.stats]
    forwards = sum(st.get("target_forwards", 0) for st in stats)
    generated = sum(st.get("generated_tokens", 0) for st in stats)
    return {
        **row,
        "throughput_tokens_per_s": row["tokens_per_s"],
        "ttft_p50_s": percentile([r.ttft for r in ok], 0.5),
        "ttft_p99_s": percentile([r.ttft for r in ok], 0.99),
        "itl_p50_s": percentile([inter_token_latency(r) for r in ok], 0.5),
        # Plain decoding (no stats) makes one token per target forward.
        "tokens_per_target_forward": generated / forwards if forwards else None,
    }


def mean_of(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def run_plan(server, plan: Sequence[Sequence[tuple]], chat: bool) -> List[Result]:
    """One thread per client of ``plan``, each sending its requests back to back."""
    results: List[Result] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(plan))

    def client(requests):
        barrier.wait()
        for label, prompt, max_tokens in requests:
            res = send(server, request_body(prompt, chat, max_tokens), label)
            with lock:
                results.append(res)

    threads = [threading.Thread(target=client, args=(r,)) for r in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def ratio(a, b) -> Optional[float]:
    """``a / b``, or ``None`` when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b
