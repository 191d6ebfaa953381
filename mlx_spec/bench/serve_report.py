"""The load benchmark's goal verdicts and its markdown report."""

from typing import Dict, List, Optional

from .serve_clients import ratio

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


def _clients_row(report, server, n) -> Optional[dict]:
    for row in report.get("clients", {}).get("rows", []):
        if row["server"] == server and row["clients"] == n:
            return row
    return None


def measured_goals(report) -> Dict[str, Optional[float]]:
    agg = lambda s, n: (_clients_row(report, s, n) or {}).get("aggregate_tokens_per_s")
    values = {
        "clients4_vs_mlx_lm": ratio(agg("mlx_spec", 4), agg("mlx_lm", 4)),
        "clients4_vs_mlx_lm_draft": ratio(agg("mlx_spec", 4), agg("mlx_lm_draft", 4)),
        "clients1_vs_alone": ratio(agg("mlx_spec", 1), agg("mlx_spec_alone", 1)),
        "agent_vs_mlx_lm": None,
        "rss_max_over_min": report.get("memory", {}).get("rss_max_over_min"),
    }
    mixed = {r["server"]: r for r in report.get("mixed", {}).get("rows", [])}
    spec = mixed.get("mlx_spec", {})
    values["mixed_throughput_vs_mlx_lm"] = spec.get("throughput_vs_mlx_lm")
    values["mixed_ttft_p99_vs_mlx_lm"] = spec.get("ttft_p99_vs_mlx_lm")
    agent = {r["server"]: r for r in report.get("agent", {}).get("rows", [])}
    if "mlx_spec" in agent and "mlx_lm" in agent:
        values["agent_vs_mlx_lm"] = ratio(
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


def format_value(value, digits=2) -> str:
    """``value`` for a table: ``-`` for ``None``, floats to ``digits`` places."""
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
        tpf = (
            "1 (plain)"
            if tpf is None and r["server"] == "mlx_lm"
            else format_value(tpf)
        )
        itl = None if r["itl_p50_s"] is None else 1000 * r["itl_p50_s"]
        lines.append(
            f"| {r['server']} | {r['requests']} | {r['tokens']} "
            f"| {format_value(r['throughput_tokens_per_s'], 1)} "
            f"| {format_value(r['ttft_p50_s'])} / {format_value(r['ttft_p99_s'])} "
            f"| {format_value(itl, 1)} | {tpf} | {format_value(r['throughput_vs_mlx_lm'])} "
            f"| {format_value(r['ttft_p99_vs_mlx_lm'])} | {r['same_text_as_mlx_lm']} |"
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
                f"| {format_value(r['aggregate_tokens_per_s'], 1)}{spread} "
                f"| {format_value(r['latency_p50_s'])} / {format_value(r['latency_p95_s'])} "
                f"| {format_value(r['ttft_p50_s'])} / {format_value(r['ttft_p95_s'])} "
                f"| {format_value(r.get('mean_batch_size'))} | {r.get('same_text_as_mlx_lm', '-')} |"
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
                f"| {r['server']} | {r['requests']} | {format_value(r['decode_tokens_per_s_mean'], 1)} "
                f"| {format_value(r['decode_tokens_per_s_after_first_episode'], 1)} "
                f"| {format_value(r.get('decode_tokens_per_s_first_steps'), 1)} "
                f"| {format_value(r['tokens_mean'], 1)} | {format_value(r['cross_request_accepted'])} |"
            )
        lines.append("")
    if "memory" in report:
        m = report["memory"]
        lines += [
            f"## Memory ({m['requests']} sequential requests after {m['warmup']} warm-up, mlx_spec.server)",
            "",
            f"RSS first {format_value(m['rss_first_mb'], 0)} MB, last {format_value(m['rss_last_mb'], 0)} MB, "
            f"min {format_value(m['rss_min_mb'], 0)} MB, max {format_value(m['rss_max_mb'], 0)} MB, "
            f"max/min {format_value(m['rss_max_over_min'], 3)}; errors {m['errors']}.",
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
        lines.append(
            f"| {g['goal']} | {format_value(g['measured'])} | {g['verdict']} |"
        )
    return "\n".join(lines) + "\n"
