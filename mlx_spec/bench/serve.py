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
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from mlx_spec.drafters.fit import DRAFT_METHODS
from mlx_spec.drafters.heads import read_head_config
from mlx_spec.loading import check_model_path, default_model_pair
from mlx_spec.options import one_line_errors
from mlx_spec_entry import guarded

from .machine import machine_info
from .options import check_out
from .serve_report import check_goals, markdown
from .serve_servers import ServerFailed, has_chat_template, mlx_lm_draft_model
from .serve_workloads import (
    SERVERS,
    agent_workload,
    clients_workload,
    memory_workload,
    mixed_workload,
)

CLIENTS = (1, 2, 4, 8)
AGENT_SERVERS = ("mlx_lm", "mlx_spec", "mlx_spec_isolated")
DEFAULT_MAX_TOKENS = 96
DEFAULT_REQUESTS_PER_CLIENT = 2
DEFAULT_RSS_REQUESTS = 500
DEFAULT_MIXED_CLIENTS = 8
DEFAULT_MIXED_REQUESTS = 2  # per client


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


# Count flags and their least value (--clients takes several).
COUNTS = (
    ("clients", 1),
    ("requests_per_client", 1),
    ("repeats", 1),
    ("max_tokens", 1),
    ("agent_episodes", 1),
    ("agent_steps", 1),
    ("rss_requests", 1),
    ("rss_every", 1),
    ("rss_warmup", 0),
    ("mixed_clients", 1),
    ("mixed_requests", 1),
    ("mixed_repeats", 1),
)


def main(argv: Optional[Sequence[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    for flag, low in COUNTS:
        values = getattr(args, flag)
        if min(values if isinstance(values, list) else [values]) < low:
            parser.error(f"--{flag.replace('_', '-')} must be at least {low}.")
    try:  # the paths, before any server starts (a bad one hung until its timeout)
        check_out(args.out)
        for path, role in ((args.model, "model"), (args.draft_model, "draft model")):
            if path not in (None, "none"):
                check_model_path(path, role)
    except ValueError as e:
        parser.error(str(e))
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
    try:
        if "clients" in args.workloads:
            report["clients"] = clients_workload(
                args, target, draft, chat, out, lm_draft
            )
        if "agent" in args.workloads:
            report["agent"] = agent_workload(args, target, draft, chat, out)
        if "memory" in args.workloads:
            report["memory"] = memory_workload(args, target, draft, chat, out)
        if "mixed" in args.workloads:
            report["mixed"] = mixed_workload(args, target, draft, chat, out)
    except ServerFailed as e:  # a bad --method or model pair: the server said why
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    report["goals"] = check_goals(report)
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    guarded(main)
