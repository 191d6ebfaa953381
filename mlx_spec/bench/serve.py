"""Load benchmark of the servers: concurrent clients, an agent loop, memory.

Usage::

    python -m mlx_spec.bench.serve --out bench_out/serve
    python -m mlx_spec.bench.serve --model models/smollm2-135m-instruct \\
        --draft-model models/DRAFT --out bench_out/serve
    python -m mlx_spec.bench.serve --quick --out bench_out/serve_quick

Every server is a real process on a loopback port, started from this
command (OpenBLAS loaded first on Linux, as ``import mlx_spec`` does; the
mlx_lm hook disabled in the baselines with ``MLX_SPEC_DISABLE=1``, so they
are mlx-lm's own code):

==================  ====================================================
``mlx_lm``          ``mlx_lm.server --model T`` (continuous batching,
                    plain decoding)
``mlx_lm_draft``    ``mlx_lm.server --model T --draft-model D`` (mlx-lm
                    turns batching off with a draft: one request at a time)
``mlx_spec``        ``mlx_spec.server --model T --draft-model D``
                    (continuous batching with speculation)
``mlx_spec_alone``  ``mlx_spec.server ... --no-batching`` (one request at a
                    time: the server before batching, for the 1-client goal)
==================  ====================================================

Workloads (greedy, streamed, chat completions when the model has a chat
template, else text completions):

* **clients**: N concurrent clients (1, 2, 4, 8), each sending its requests
  back to back from the benchmark prompt suite, ``--repeats`` times. The
  servers take turns per N (order rotating), so slow drifts of a shared
  machine hit them alike. The cross-request index is off here
  (``--cross-request-tokens 0``): repeats resend the same prompts.
  Reported: aggregate tokens/s (all completion tokens over the wall time
  from the first request to the last answer), per-request latency and time
  to first token (p50, p95), and how many answers equal ``mlx_lm``'s text.
* **agent**: a repeated agent loop. Episodes run the same tool-using task
  with a different file name each: a fixed system prompt with tool
  definitions, then steps whose tool outputs recur across episodes and whose
  earlier replies are the server's own. One client, sequential. Reported:
  decode tokens/s per request (tokens after the first / time from first to
  last token) on ``mlx_lm`` and on ``mlx_spec`` with the cross-request index
  (method ``lookup``) and without it (``speculative_isolation``).
* **mixed**: ``--mixed-clients`` (default 8) concurrent chat clients on
  ``mlx_lm`` and ``mlx_spec``, each sending ``--mixed-requests`` requests
  back to back; the requests mix prompt lengths (a suite request alone, after
  a passage of about 250 tokens, or after a document of about 1000) and
  ``max_tokens`` (24 to 192, capped by ``--max-tokens``), so long prompts
  arrive while other rows decode. Reported per server: time to first token
  (p50, p99), inter-token latency (p50 over requests of each request's
  (last - first token time) / (tokens - 1): a speculative round streams
  several tokens at once, so gaps between chunks would not compare), total
  throughput (all completion tokens over the wall time of the run), tokens
  per target forward (from ``speculative_stats``; 1 for plain decoding), and
  the ratios to ``mlx_lm`` in the same run.
* **memory**: server RSS over ``--rss-requests`` sequential requests after a
  warm-up, sampled every ``--rss-every`` requests (prompts made distinct
  so the prompt cache and the cross-request index keep filling and evicting).

Results go to ``OUT/serve.json`` and ``OUT/serve.md``; the goals of issue 19
and of issue 40 are printed with the measured value next to each, never
estimated.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlx_spec.drafters.fit import DRAFT_METHODS
from mlx_spec.drafters.heads import read_head_config
from mlx_spec.loading import default_model_pair
from mlx_spec.options import one_line_errors

from .machine import machine_info
from .prompts import prompt_suite

CLIENTS = (1, 2, 4, 8)
SERVERS = ("mlx_lm", "mlx_lm_draft", "mlx_spec", "mlx_spec_alone")
AGENT_SERVERS = ("mlx_lm", "mlx_spec", "mlx_spec_isolated")
DEFAULT_MAX_TOKENS = 96
DEFAULT_REQUESTS_PER_CLIENT = 2
DEFAULT_RSS_REQUESTS = 500
MIXED_SERVERS = ("mlx_lm", "mlx_spec")
DEFAULT_MIXED_CLIENTS = 8
DEFAULT_MIXED_REQUESTS = 2  # per client
# The mixed workload's prompt lengths and max_tokens, combined in turn.
MIXED_LENGTHS = ("short", "medium", "long")
MIXED_MAX_TOKENS = (24, 48, 96, 192)
MIN_REQUESTS = 4  # per (server, clients) run
START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 900.0
# Goals of issue 19: (text, measured key, threshold).
GOALS = (
    (
        "4 clients: aggregate tokens/s >= 1.3x mlx_lm.server batched plain",
        "clients4_vs_mlx_lm",
        1.3,
    ),
    (
        "4 clients: aggregate tokens/s >= 2.5x mlx_lm.server --draft-model",
        "clients4_vs_mlx_lm_draft",
        2.5,
    ),
    (
        "1 client: >= 0.97x today's single-request speed (mlx_spec.server --no-batching)",
        "clients1_vs_alone",
        0.97,
    ),
    ("agent loop: >= 2x plain mlx_lm tokens/s per request", "agent_vs_mlx_lm", 2.0),
    (
        "memory: server RSS flat within 10% over the requests after warm-up",
        "rss_max_over_min",
        None,
    ),
)
# Goals of issue 40: (text, measured key, threshold, higher is better).
MIXED_GOALS = (
    (
        "8 mixed clients: total tokens/s >= 1.5x mlx_lm.server batched plain",
        "mixed_throughput_vs_mlx_lm",
        1.5,
        True,
    ),
    (
        "8 mixed clients: p99 time to first token no worse than mlx_lm.server's",
        "mixed_ttft_p99_vs_mlx_lm",
        1.0,
        False,
    ),
)

LAUNCH = (
    "import mlx_spec, runpy, sys; sys.argv = [sys.argv[1]] + sys.argv[2:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__')"
)


# --------------------------------------------------------------------------- #
# Servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One server in a subprocess on a loopback port; its log in ``log_path``."""

    def __init__(self, name: str, module: str, args: Sequence[str], log_dir: Path):
        self.name = name
        self.port = free_port()
        argv = [sys.executable, "-c", LAUNCH, module, *args]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ)
        if module.startswith("mlx_lm"):
            env["MLX_SPEC_DISABLE"] = "1"  # mlx-lm's own server, not the hook's
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self.argv = argv

    def wait_ready(self, timeout: float = START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log_path}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not start; see {self.log_path}")

    def rss_mb(self) -> Optional[float]:
        """Resident memory of the server process, in MB."""
        status = Path(f"/proc/{self.process.pid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(self.process.pid)],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return int(out) / 1024 if out else None

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


def mlx_lm_draft_model(target: str, draft: str, out: Path):
    """``(path, note)``: an mlx-spec drafter directory as mlx_lm.server can load it.

    A distilled draft is written as a plain mlx-lm checkpoint in
    ``OUT/mlx_lm_draft_model`` (full-width output layer); a head has no
    mlx-lm form, so the path is ``None``.
    """
    from mlx_lm import load

    from mlx_spec.drafters.distilled import is_draft_dir, save_as_mlx_lm
    from mlx_spec.loading import load_draft

    if not is_draft_dir(draft):
        return None, (
            f"mlx_lm_draft not run: `{draft}` is a head, which mlx_lm.server "
            "cannot load."
        )
    model, tokenizer = load(target)
    path = save_as_mlx_lm(
        load_draft(draft, model, tokenizer), target, out / "mlx_lm_draft_model"
    )
    return str(path), (
        f"mlx_lm_draft runs `{draft}` written as a plain mlx-lm checkpoint "
        "(its output layer widened to the full vocabulary, as mlx-lm needs)."
    )


def server_command(
    name: str, target: str, draft: Optional[str], method: str, spec_extra=()
):
    """``(module, args)`` of a named server configuration.

    ``spec_extra`` are further flags of the mlx_spec servers.
    """
    if name == "mlx_lm":
        return "mlx_lm.server", ["--model", target]
    if name == "mlx_lm_draft":
        return "mlx_lm.server", ["--model", target, "--draft-model", draft]
    args = ["--model", target, "--speculative", method]
    if draft is not None:
        args += ["--draft-model", draft]
    if name == "mlx_spec_alone":
        args.append("--no-batching")
    return "mlx_spec.serve.server", [*args, *spec_extra]


# --------------------------------------------------------------------------- #
# Requests


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


# --------------------------------------------------------------------------- #
# Workloads


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
        "decode_tokens_per_s_mean": _mean([r.decode_tps for r in ok]),
        "mean_batch_size": _mean(batch),
    }


def mixed_contexts(chat: bool) -> Dict[str, str]:
    """The text put before a request, by prompt length (see the module docstring).

    ``medium`` is the summarize set's passages (about 250 tokens); ``long``
    every suite prompt's words (about 1000 tokens).
    """
    suite = prompt_suite(chat=chat)
    passages = [p.user_text() for p in suite if p.prompt_set == "summarize"]
    everything = [p.user_text() for p in suite]
    return {
        "short": "",
        "medium": "Background notes:\n\n" + "\n\n".join(passages or everything),
        "long": "Reference document:\n\n" + "\n\n".join(everything),
    }


def mixed_plan(
    prompts: Sequence[tuple], chat: bool, n_clients: int, per_client: int, cap: int
) -> List[List[tuple]]:
    """Each client's ``(label, prompt, max_tokens)`` requests, in order.

    Request ``j = r * n_clients + c`` (client ``c``'s ``r``-th) takes suite
    prompt ``j``, the length ``MIXED_LENGTHS[j % 3]`` and ``max_tokens``
    ``MIXED_MAX_TOKENS[(j // 3) % 4]`` (at most ``cap``): twelve requests
    hold every combination, and any three clients in a row start with all
    three lengths. Labels are unique.
    """
    contexts = mixed_contexts(chat)
    plan = []
    for c in range(n_clients):
        requests = []
        for r in range(per_client):
            j = r * n_clients + c
            name, prompt = prompts[j % len(prompts)]
            length = MIXED_LENGTHS[j % len(MIXED_LENGTHS)]
            max_tokens = min(MIXED_MAX_TOKENS[(j // 3) % len(MIXED_MAX_TOKENS)], cap)
            context = contexts[length]
            if context and chat:
                prompt = [dict(m) for m in prompt]
                prompt[-1]["content"] = f"{context}\n\n{prompt[-1]['content']}"
            elif context:
                prompt = f"{context}\n\n{prompt}"
            requests.append((f"{j}:{name}:{length}:{max_tokens}", prompt, max_tokens))
        plan.append(requests)
    return plan


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


def mixed_workload(args, target, draft, chat, out) -> dict:
    """The mixed workload on each server, ``--mixed-repeats`` times, order rotating.

    Rows pool the requests of every repeat; each run's throughput is kept.
    """
    prompts = suite_prompts(chat)
    plan = mixed_plan(
        prompts, chat, args.mixed_clients, args.mixed_requests, args.max_tokens
    )
    servers = _start_all(
        MIXED_SERVERS,
        target,
        draft,
        args.method,
        out,
        spec_extra=["--cross-request-tokens", "0"],
    )
    results: Dict[str, List[Result]] = {name: [] for name in servers}
    runs = []
    try:
        for server in servers.values():  # warm-up
            send(server, request_body(prompts[0][1], chat, 8), "warmup")
        for rep in range(args.mixed_repeats):
            names = list(servers)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for name in names:
                res = run_plan(servers[name], plan, chat)
                results[name].extend(res)
                run = {"server": name, "repeat": rep, **latency_summary(res)}
                runs.append(run)
                print(
                    f"{name:>15} mixed clients={args.mixed_clients} "
                    f"tokens={run['tokens']} errors={run['errors']} "
                    f"throughput={_fmt(run['throughput_tokens_per_s'], 1)} tok/s",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
    ref = {r.prompt: r.text for r in results.get("mlx_lm", []) if not r.error}
    rows = []
    for name, res in results.items():
        throughputs = [
            r["throughput_tokens_per_s"]
            for r in runs
            if r["server"] == name and r["throughput_tokens_per_s"]
        ]
        row = {"server": name, **latency_summary(res)}
        row["wall_s"] = None  # pooled over repeats: see the runs
        row["throughput_tokens_per_s"] = (
            statistics.median(throughputs) if throughputs else None
        )
        row["throughput_tokens_per_s_runs"] = throughputs
        mine = [r for r in res if not r.error and r.prompt in ref]
        same = sum(r.text == ref[r.prompt] for r in mine)
        row["same_text_as_mlx_lm"] = f"{same}/{len(mine)}"
        rows.append(row)
    base = next((r for r in rows if r["server"] == "mlx_lm"), {})
    for row in rows:
        row["throughput_vs_mlx_lm"] = _ratio(
            row["throughput_tokens_per_s"], base.get("throughput_tokens_per_s")
        )
        row["ttft_p99_vs_mlx_lm"] = _ratio(row["ttft_p99_s"], base.get("ttft_p99_s"))
        row["itl_p50_vs_mlx_lm"] = _ratio(row["itl_p50_s"], base.get("itl_p50_s"))
    return {
        "clients": args.mixed_clients,
        "requests_per_client": args.mixed_requests,
        "repeats": args.mixed_repeats,
        "requests": [[label for label, _, _ in c] for c in plan],
        "rows": rows,
        "runs": runs,
    }


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


AGENT_SYSTEM = (
    "You are a coding agent. You work in a repository through tools and answer "
    "with exactly one tool call per turn, as JSON on one line.\n"
    "Tools:\n"
    '- read_file {"path": str}: returns the file.\n'
    '- replace {"path": str, "old": str, "new": str}: edits the file.\n'
    '- run_tests {"path": str}: runs the tests of a file.\n'
    '- done {"summary": str}: ends the task.\n'
    "Rules: read a file before editing it; keep edits small; run the tests "
    "after every edit; stop when the tests pass."
)
AGENT_FILE = (
    "def {name}(values):\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total = total + value\n"
    "    return total / len(values)\n"
)
AGENT_STEPS = (
    "read_file returned:\n{file}",
    'replace returned: {{"ok": true, "path": "{path}"}}',
    'run_tests returned: {{"passed": 3, "failed": 0, "path": "{path}"}}',
)
AGENT_TASK = (
    "Task: in {path}, make {name} return 0.0 for an empty list instead of "
    "raising ZeroDivisionError."
)


def agent_messages(episode: int, replies: List[str], steps: int) -> List[dict]:
    """The conversation of one agent step: earlier replies are the server's own."""
    name = f"mean_{episode}"
    path = f"src/stats_{episode}.py"
    messages = [
        {"role": "system", "content": AGENT_SYSTEM},
        {"role": "user", "content": AGENT_TASK.format(path=path, name=name)},
    ]
    for s in range(steps):
        messages.append({"role": "assistant", "content": replies[s]})
        tool = AGENT_STEPS[s % len(AGENT_STEPS)]
        text = tool.format(file=AGENT_FILE.format(name=name), path=path)
        messages.append({"role": "user", "content": text})
    return messages


def agent_text(messages: List[dict]) -> str:
    """The agent conversation as plain text (a model without a chat template)."""
    parts = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(parts) + "\nassistant:"


def run_agent(servers, variant_args, episodes, steps, chat, max_tokens):
    """Episodes of the agent loop on each server; the servers alternate."""
    results: Dict[str, List[Result]] = {name: [] for name in variant_args}
    for e in range(episodes):
        for name, (server, extra) in variant_args.items():
            replies: List[str] = []
            for s in range(steps):
                messages = agent_messages(e, replies, s)
                prompt = messages if chat else agent_text(messages)
                body = request_body(prompt, chat, max_tokens, extra)
                res = send(server, body, f"agent e{e} s{s}")
                res.server = name
                results[name].append(res)
                replies.append(res.text)
    return results


def run_memory(server, prompts, chat, max_tokens, total, every, warmup):
    """Sequential requests with distinct prompts; RSS sampled every ``every``."""
    samples = []

    def distinct(i):
        label, prompt = prompts[i % len(prompts)]
        tag = f"Request {i}."
        if chat:
            prompt = [dict(m) for m in prompt]
            prompt[-1]["content"] = f"{tag} {prompt[-1]['content']}"
        else:
            prompt = f"# {tag}\n{prompt}"
        return label, prompt

    for i in range(warmup):
        label, prompt = distinct(i)
        send(server, request_body(prompt, chat, max_tokens), label)
    errors = 0
    for i in range(total):
        label, prompt = distinct(warmup + i)
        res = send(server, request_body(prompt, chat, max_tokens), label)
        errors += res.error is not None
        if i % every == 0 or i == total - 1:
            samples.append((i, server.rss_mb()))
    rss = [mb for _, mb in samples if mb is not None]
    return {
        "requests": total,
        "errors": errors,
        "warmup": warmup,
        "samples": samples,
        "rss_first_mb": rss[0] if rss else None,
        "rss_last_mb": rss[-1] if rss else None,
        "rss_min_mb": min(rss) if rss else None,
        "rss_max_mb": max(rss) if rss else None,
        "rss_max_over_min": max(rss) / min(rss) if rss else None,
    }


# --------------------------------------------------------------------------- #
# Driver


def has_chat_template(model_path: str) -> bool:
    path = Path(model_path)
    if (path / "chat_template.jinja").exists():
        return True
    config = path / "tokenizer_config.json"
    if config.exists():
        return bool(json.loads(config.read_text()).get("chat_template"))
    return False


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.serve",
        description="Load benchmark: mlx_lm.server against mlx_spec.server.",
    )
    one_line_errors(parser)
    parser.add_argument("--model", help="Target model (default: the embedded pair).")
    parser.add_argument(
        "--draft-model",
        help="Draft model (default: the pair's; 'none': no draft, mlx_spec "
        "drafts by lookup and mlx_lm_draft is left out).",
    )
    parser.add_argument(
        "--method",
        default="auto",
        help="mlx_spec.server --speculative (default: auto).",
    )
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument(
        "--requests-per-client", type=int, default=DEFAULT_REQUESTS_PER_CLIENT
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="Runs of each (server, clients) pair; rows report the median.",
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--agent-episodes", type=int, default=6)
    parser.add_argument("--agent-steps", type=int, default=3)
    parser.add_argument("--rss-requests", type=int, default=DEFAULT_RSS_REQUESTS)
    parser.add_argument("--rss-every", type=int, default=25)
    parser.add_argument("--rss-warmup", type=int, default=20)
    parser.add_argument(
        "--mixed-clients",
        type=int,
        default=DEFAULT_MIXED_CLIENTS,
        help="Concurrent clients of the mixed workload.",
    )
    parser.add_argument(
        "--mixed-requests",
        type=int,
        default=DEFAULT_MIXED_REQUESTS,
        help="Requests per client of the mixed workload.",
    )
    parser.add_argument(
        "--mixed-repeats",
        type=int,
        default=1,
        help="Runs of the mixed workload per server (order rotating).",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["clients", "agent", "memory"],
        choices=["clients", "agent", "memory", "mixed"],
        help="Default: clients agent memory (add mixed for the 8-client table).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="Clients 1 and 4, fewer requests."
    )
    parser.add_argument("--out", default="bench_out/serve")
    return parser


def main(argv: Optional[Sequence[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    for flag in ("mixed_clients", "mixed_requests", "mixed_repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1.")
    if args.quick:
        args.mixed_requests = 1
        args.clients = [c for c in args.clients if c in (1, 4)] or [1]
        args.requests_per_client = 1
        args.repeats = 1
        args.agent_episodes = min(args.agent_episodes, 3)
        args.rss_requests = min(args.rss_requests, 50)
        args.rss_every = min(args.rss_every, 10)
        args.rss_warmup = min(args.rss_warmup, 5)
    target, draft = args.model, args.draft_model
    if target is None:
        target, pair_draft = default_model_pair()
        draft = draft or pair_draft
    if draft in (None, "none"):
        draft = None  # no draft model: mlx_lm_draft is left out
        args.servers = [s for s in args.servers if s != "mlx_lm_draft"]
        if args.method in DRAFT_METHODS:
            parser.error(f"--method {args.method} needs a --draft-model.")
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    notes, lm_draft = [], draft
    wants_lm_draft = "clients" in args.workloads and "mlx_lm_draft" in args.servers
    if wants_lm_draft and read_head_config(draft) is not None:
        lm_draft, note = mlx_lm_draft_model(target, draft, out)
        notes.append(note)
        if lm_draft is None:
            args.servers = [s for s in args.servers if s != "mlx_lm_draft"]
    chat = has_chat_template(target)
    report = {
        "machine": machine_info(),
        "model": target,
        "draft_model": draft,
        "method": args.method,
        "chat": chat,
        "max_tokens": args.max_tokens,
        # As typed, without this machine's path to the module.
        "command": " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)]),
        "notes": notes,
    }
    if "clients" in args.workloads:
        report["clients"] = clients_workload(args, target, draft, chat, out, lm_draft)
    if "agent" in args.workloads:
        report["agent"] = agent_workload(args, target, draft, chat, out)
    if "memory" in args.workloads:
        report["memory"] = memory_workload(args, target, draft, chat, out)
    if "mixed" in args.workloads:
        report["mixed"] = mixed_workload(args, target, draft, chat, out)
    report["goals"] = check_goals(report)
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(markdown(report))
    print(markdown(report))


def _start_all(names, target, draft, method, out, spec_extra=(), lm_draft=None):
    """Start the named servers; ``mlx_lm_draft`` loads ``lm_draft`` if given."""
    servers = {}
    try:
        for name in names:
            own = lm_draft if name == "mlx_lm_draft" and lm_draft else draft
            module, sargs = server_command(name, target, own, method, spec_extra)
            servers[name] = ServerProcess(name, module, sargs, out / "logs")
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def clients_workload(args, target, draft, chat, out, lm_draft=None) -> dict:
    """Every client count on every server, ``--repeats`` times, order rotating.

    A row's aggregate tokens/s is the median over its repeats (the spread is
    kept); latencies and times to first token pool the requests of all
    repeats.
    """
    prompts = suite_prompts(chat)
    # Repeats resend the same prompts: the cross-request index would draft
    # them from the first run. Its effect is the agent workload's subject.
    servers = _start_all(
        args.servers,
        target,
        draft,
        args.method,
        out,
        spec_extra=["--cross-request-tokens", "0"],
        lm_draft=lm_draft,
    )
    runs, results = [], {}
    try:
        for server in servers.values():  # warm-up
            send(server, request_body(prompts[0][1], chat, 8), "warmup")
        turn = 0
        for rep in range(args.repeats):
            for n in args.clients:
                names = list(servers)
                names = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                # At least MIN_REQUESTS per run: one client's run is short.
                per_client = max(args.requests_per_client, -(-MIN_REQUESTS // n))
                for name in names:
                    res = run_clients(
                        servers[name],
                        prompts,
                        n,
                        per_client,
                        chat,
                        args.max_tokens,
                        offset=turn,
                    )
                    run = {
                        "server": name,
                        "clients": n,
                        "repeat": rep,
                        **summarize(res),
                    }
                    runs.append(run)
                    results.setdefault((name, n), []).extend(res)
                    print(_row_line(run), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    for (name, n), res in results.items():
        tps = [
            r["aggregate_tokens_per_s"]
            for r in runs
            if (r["server"], r["clients"]) == (name, n) and r["aggregate_tokens_per_s"]
        ]
        row = {"server": name, "clients": n, **summarize(res)}
        row["aggregate_tokens_per_s"] = statistics.median(tps) if tps else None
        row["aggregate_tokens_per_s_runs"] = tps
        row["wall_s"] = None  # pooled over repeats: see the runs
        ref = {r.prompt: r.text for r in results.get(("mlx_lm", n), []) if not r.error}
        mine = [r for r in res if not r.error and r.prompt in ref]
        if ref:  # greedy answers equal to mlx_lm's (near-ties may differ)
            same = sum(r.text == ref[r.prompt] for r in mine)
            row["same_text_as_mlx_lm"] = f"{same}/{len(mine)}"
        rows.append(row)
    rows.sort(key=lambda r: (r["clients"], SERVERS.index(r["server"])))
    return {"rows": rows, "runs": runs, "repeats": args.repeats}


def _row_line(row) -> str:
    tps = row["aggregate_tokens_per_s"]
    return (
        f"{row['server']:>15} clients={row['clients']} tokens={row['tokens']} "
        f"agg={tps if tps is None else round(tps, 1)} tok/s errors={row['errors']}"
    )


def agent_workload(args, target, draft, chat, out) -> dict:
    names = ["mlx_lm", "mlx_spec"]
    servers = _start_all(names, target, draft, "lookup", out)
    try:
        variants = {
            "mlx_lm": (servers["mlx_lm"], None),
            "mlx_spec": (servers["mlx_spec"], None),
            "mlx_spec_isolated": (servers["mlx_spec"], {"speculative_isolation": True}),
        }
        results = run_agent(
            servers,
            variants,
            args.agent_episodes,
            args.agent_steps,
            chat,
            args.max_tokens,
        )
    finally:
        for server in servers.values():
            server.stop()
    rows, requests = [], []
    for name, res in results.items():
        requests += [
            {
                "server": name,
                "request": r.prompt,
                "tokens": r.tokens,
                "text": r.text,
                "decode_tokens_per_s": r.decode_tps,
                "stats": r.stats,
                "error": r.error,
            }
            for r in res
        ]
        ok = [r for r in res if r.error is None]
        later = [r for r in ok if not r.prompt.startswith("agent e0 ")]
        # First steps of later episodes: the reply is in no earlier turn of
        # its own conversation, so only earlier requests can draft it.
        fresh = [r for r in later if r.prompt.endswith(" s0")]
        cross = [r.stats.get("cross_request_accepted", 0) for r in ok if r.stats]
        rows.append(
            {
                "server": name,
                "requests": len(res),
                "errors": len(res) - len(ok),
                "decode_tokens_per_s_mean": _mean([r.decode_tps for r in ok]),
                "decode_tokens_per_s_after_first_episode": _mean(
                    [r.decode_tps for r in later]
                ),
                "decode_tokens_per_s_first_steps": _mean([r.decode_tps for r in fresh]),
                "tokens_mean": _mean([r.tokens for r in ok]),
                "cross_request_accepted": sum(cross) if cross else None,
            }
        )
    return {
        "method": "lookup",
        "episodes": args.agent_episodes,
        "steps": args.agent_steps,
        "rows": rows,
    }


def memory_workload(args, target, draft, chat, out) -> dict:
    prompts = suite_prompts(chat)
    servers = _start_all(["mlx_spec"], target, draft, args.method, out)
    try:
        result = run_memory(
            servers["mlx_spec"],
            prompts,
            chat,
            min(args.max_tokens, 32),
            args.rss_requests,
            args.rss_every,
            args.rss_warmup,
        )
    finally:
        for server in servers.values():
            server.stop()
    return {"server": "mlx_spec", **result}


def _clients_row(report, server, n) -> Optional[dict]:
    for row in report.get("clients", {}).get("rows", []):
        if row["server"] == server and row["clients"] == n:
            return row
    return None


def _ratio(a, b) -> Optional[float]:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def measured_goals(report) -> Dict[str, Optional[float]]:
    agg = lambda s, n: (_clients_row(report, s, n) or {}).get("aggregate_tokens_per_s")
    values = {
        "clients4_vs_mlx_lm": _ratio(agg("mlx_spec", 4), agg("mlx_lm", 4)),
        "clients4_vs_mlx_lm_draft": _ratio(agg("mlx_spec", 4), agg("mlx_lm_draft", 4)),
        "clients1_vs_alone": _ratio(agg("mlx_spec", 1), agg("mlx_spec_alone", 1)),
        "agent_vs_mlx_lm": None,
        "rss_max_over_min": report.get("memory", {}).get("rss_max_over_min"),
    }
    mixed = {r["server"]: r for r in report.get("mixed", {}).get("rows", [])}
    spec = mixed.get("mlx_spec", {})
    values["mixed_throughput_vs_mlx_lm"] = spec.get("throughput_vs_mlx_lm")
    values["mixed_ttft_p99_vs_mlx_lm"] = spec.get("ttft_p99_vs_mlx_lm")
    agent = {r["server"]: r for r in report.get("agent", {}).get("rows", [])}
    if "mlx_spec" in agent and "mlx_lm" in agent:
        values["agent_vs_mlx_lm"] = _ratio(
            agent["mlx_spec"]["decode_tokens_per_s_mean"],
            agent["mlx_lm"]["decode_tokens_per_s_mean"],
        )
    return values


def check_goals(report) -> List[dict]:
    values = measured_goals(report)
    out = []
    for text, key, threshold in GOALS:
        value = values.get(key)
        if value is None:
            verdict = "not run"
        elif threshold is None:  # RSS: max/min within 10%
            verdict = "met" if value <= 1.10 else "missed"
        else:
            verdict = "met" if value >= threshold else "missed"
        out.append({"goal": text, "measured": value, "verdict": verdict})
    for text, key, threshold, higher in MIXED_GOALS:
        value = values.get(key)
        if value is None:
            verdict = "not run"
        else:
            met = value >= threshold if higher else value <= threshold
            verdict = "met" if met else "missed"
        out.append({"goal": text, "measured": value, "verdict": verdict})
    return out


def _fmt(value, digits=2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def mixed_markdown(mixed) -> List[str]:
    """The mixed workload's table (see the module docstring)."""
    lines = [
        f"## {mixed['clients']} concurrent clients, mixed prompt lengths and max_tokens",
        "",
        f"{mixed['requests_per_client']} requests per client, {mixed['repeats']} "
        "run(s) per server; percentiles pool every run's requests, throughput "
        "is the median run's. Ratios are to `mlx_lm` in the same run.",
        "",
        "| server | requests | tokens | throughput tok/s | TTFT p50 / p99 s | inter-token p50 ms | tokens per target forward | throughput vs mlx_lm | TTFT p99 vs mlx_lm | same text as mlx_lm |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in mixed["rows"]:
        tpf = r["tokens_per_target_forward"]
        tpf = "1 (plain)" if tpf is None and r["server"] == "mlx_lm" else _fmt(tpf)
        itl = None if r["itl_p50_s"] is None else 1000 * r["itl_p50_s"]
        lines.append(
            f"| {r['server']} | {r['requests']} | {r['tokens']} "
            f"| {_fmt(r['throughput_tokens_per_s'], 1)} "
            f"| {_fmt(r['ttft_p50_s'])} / {_fmt(r['ttft_p99_s'])} "
            f"| {_fmt(itl, 1)} | {tpf} | {_fmt(r['throughput_vs_mlx_lm'])} "
            f"| {_fmt(r['ttft_p99_vs_mlx_lm'])} | {r['same_text_as_mlx_lm']} |"
        )
    return lines + [""]


def markdown(report) -> str:
    lines = [
        "# Serving benchmark",
        "",
        f"Model `{report['model']}`, draft `{report['draft_model']}`, mlx_spec "
        f"method `{report['method']}`, greedy, max_tokens {report['max_tokens']}, "
        f"{'chat' if report['chat'] else 'text'} completions, streamed.",
        f"Command: `{report['command']}`",
        "",
        *[f"- {note}" for note in report.get("notes", [])],
        *([""] if report.get("notes") else []),
    ]
    if "clients" in report:
        lines += [
            "## Concurrent clients",
            "",
            f"Median of {report['clients']['repeats']} runs per row (min-max in "
            "brackets); latencies pool every run's requests.",
            "",
            "| server | clients | requests | tokens | aggregate tok/s | latency p50 / p95 s | TTFT p50 / p95 s | mean batch | same text as mlx_lm |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["clients"]["rows"]:
            spread = r.get("aggregate_tokens_per_s_runs") or []
            spread = (
                f" [{min(spread):.1f}-{max(spread):.1f}]" if len(spread) > 1 else ""
            )
            lines.append(
                f"| {r['server']} | {r['clients']} | {r['requests']} | {r['tokens']} "
                f"| {_fmt(r['aggregate_tokens_per_s'], 1)}{spread} "
                f"| {_fmt(r['latency_p50_s'])} / {_fmt(r['latency_p95_s'])} "
                f"| {_fmt(r['ttft_p50_s'])} / {_fmt(r['ttft_p95_s'])} "
                f"| {_fmt(r.get('mean_batch_size'))} | {r.get('same_text_as_mlx_lm', '-')} |"
            )
        lines.append("")
    if "agent" in report:
        a = report["agent"]
        lines += [
            f"## Agent loop ({a['episodes']} episodes x {a['steps']} steps, mlx_spec method `{a['method']}`)",
            "",
            "Decode tok/s per request: mean over requests; 'first steps' are the "
            "first step of episodes 2..E (no earlier turn of their own "
            "conversation holds the reply: only earlier requests can draft it).",
            "",
            "| server | requests | decode tok/s per request | after the first episode | first steps | tokens per reply | cross-request accepted |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in a["rows"]:
            lines.append(
                f"| {r['server']} | {r['requests']} | {_fmt(r['decode_tokens_per_s_mean'], 1)} "
                f"| {_fmt(r['decode_tokens_per_s_after_first_episode'], 1)} "
                f"| {_fmt(r.get('decode_tokens_per_s_first_steps'), 1)} "
                f"| {_fmt(r['tokens_mean'], 1)} | {_fmt(r['cross_request_accepted'])} |"
            )
        lines.append("")
    if "memory" in report:
        m = report["memory"]
        lines += [
            f"## Memory ({m['requests']} sequential requests after {m['warmup']} warm-up, mlx_spec.server)",
            "",
            f"RSS first {_fmt(m['rss_first_mb'], 0)} MB, last {_fmt(m['rss_last_mb'], 0)} MB, "
            f"min {_fmt(m['rss_min_mb'], 0)} MB, max {_fmt(m['rss_max_mb'], 0)} MB, "
            f"max/min {_fmt(m['rss_max_over_min'], 3)}; errors {m['errors']}.",
            "",
        ]
    if "mixed" in report:
        lines += mixed_markdown(report["mixed"])
    lines += [
        "## Goals (issues 19 and 40)",
        "",
        "| goal | measured | verdict |",
        "|---|---|---|",
    ]
    for g in report["goals"]:
        lines.append(f"| {g['goal']} | {_fmt(g['measured'])} | {g['verdict']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
