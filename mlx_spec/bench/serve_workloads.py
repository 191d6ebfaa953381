"""The workloads of the load benchmark: concurrent clients, mixed lengths, an
agent loop and memory (see :mod:`mlx_spec.bench.serve`)."""

import statistics
from typing import Dict, List, Sequence

from .prompts import prompt_suite
from .serve_clients import (
    Result,
    latency_summary,
    mean_of,
    ratio,
    request_body,
    run_clients,
    run_plan,
    send,
    suite_prompts,
    summarize,
)
from .serve_report import format_value
from .serve_servers import start_servers

SERVERS = ("mlx_lm", "mlx_lm_draft", "mlx_spec", "mlx_spec_alone")
MIXED_SERVERS = ("mlx_lm", "mlx_spec")
# The mixed workload's prompt lengths and max_tokens, combined in turn.
MIXED_LENGTHS = ("short", "medium", "long")
MIXED_MAX_TOKENS = (24, 48, 96, 192)
MIN_REQUESTS = 4  # per (server, clients) run


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


def mixed_workload(args, target, draft, chat, out) -> dict:
    """The mixed workload on each server, ``--mixed-repeats`` times, order rotating.

    Rows pool the requests of every repeat; each run's throughput is kept.
    """
    prompts = suite_prompts(chat)
    plan = mixed_plan(
        prompts, chat, args.mixed_clients, args.mixed_requests, args.max_tokens
    )
    servers = start_servers(
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
        # Warm-up: one unmeasured run of the plan each; after one short request,
        # a server's first batched run was still 2x slower than its next ones.
        for server in servers.values():
            run_plan(server, plan, chat)
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
                    f"throughput={format_value(run['throughput_tokens_per_s'], 1)} tok/s",
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
        row["throughput_vs_mlx_lm"] = ratio(
            row["throughput_tokens_per_s"], base.get("throughput_tokens_per_s")
        )
        row["ttft_p99_vs_mlx_lm"] = ratio(row["ttft_p99_s"], base.get("ttft_p99_s"))
        row["itl_p50_vs_mlx_lm"] = ratio(row["itl_p50_s"], base.get("itl_p50_s"))
    return {
        "clients": args.mixed_clients,
        "requests_per_client": args.mixed_requests,
        "repeats": args.mixed_repeats,
        "requests": [[label for label, _, _ in c] for c in plan],
        "rows": rows,
        "runs": runs,
    }


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


def clients_workload(args, target, draft, chat, out, lm_draft=None) -> dict:
    """Every client count on every server, ``--repeats`` times, order rotating.

    A row's aggregate tokens/s is the median over its repeats (the spread is
    kept); latencies and times to first token pool the requests of all
    repeats.
    """
    prompts = suite_prompts(chat)
    # Repeats resend the same prompts: the cross-request index would draft
    # them from the first run. Its effect is the agent workload's subject.
    servers = start_servers(
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
    servers = start_servers(names, target, draft, "lookup", out)
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
                "decode_tokens_per_s_mean": mean_of([r.decode_tps for r in ok]),
                "decode_tokens_per_s_after_first_episode": mean_of(
                    [r.decode_tps for r in later]
                ),
                "decode_tokens_per_s_first_steps": mean_of(
                    [r.decode_tps for r in fresh]
                ),
                "tokens_mean": mean_of([r.tokens for r in ok]),
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
    servers = start_servers(["mlx_spec"], target, draft, args.method, out)
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
