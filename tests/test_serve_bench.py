"""mlx_spec/bench/serve*.py: its statistics, goal verdicts and one tiny real run."""

import json

import pytest

from mlx_spec.bench import serve as bench
from mlx_spec.bench import serve_clients, serve_report, serve_workloads


def _result(start, first, end, tokens, stats=None):
    return serve_clients.Result("s", "p", start, first, end, tokens, "", stats)


def test_percentiles_interpolate_and_skip_missing_values():
    assert serve_clients.percentile([3.0, 1.0, 2.0, None], 0.5) == 2.0
    assert serve_clients.percentile([1.0, 2.0], 0.95) == pytest.approx(1.95)
    assert serve_clients.percentile([], 0.5) is None


def test_summary_counts_tokens_over_the_wall_time_of_all_requests():
    results = [
        _result(0.0, 0.5, 2.0, 10, {"mean_batch_size": 2.0}),
        _result(1.0, 1.2, 4.0, 30, {"mean_batch_size": 3.0}),
    ]
    row = serve_clients.summarize(results)
    assert row["tokens"] == 40 and row["wall_s"] == 4.0
    assert row["aggregate_tokens_per_s"] == 10.0
    assert row["ttft_p50_s"] == pytest.approx(0.35)
    assert row["mean_batch_size"] == 2.5
    assert row["decode_tokens_per_s_mean"] == pytest.approx((9 / 1.5 + 29 / 2.8) / 2)


def test_goals_report_measured_values_and_never_invent_missing_ones():
    report = {
        "clients": {
            "rows": [
                {"server": "mlx_lm", "clients": 4, "aggregate_tokens_per_s": 100.0},
                {"server": "mlx_spec", "clients": 4, "aggregate_tokens_per_s": 150.0},
            ]
        },
        "memory": {"rss_max_over_min": 1.04},
    }
    goals = {g["goal"][:30]: g for g in serve_report.check_goals(report)}
    verdicts = [g["verdict"] for g in serve_report.check_goals(report)]
    assert verdicts == ["met", "not run", "not run", "not run", "met"] + ["not run"] * 2
    assert serve_report.check_goals(report)[0]["measured"] == 1.5
    assert all(
        g["measured"] is None for g in goals.values() if g["verdict"] == "not run"
    )


def test_mixed_goals_compare_throughput_up_and_ttft_down():
    rows = [
        {"server": "mlx_spec", "throughput_vs_mlx_lm": 1.6, "ttft_p99_vs_mlx_lm": 1.2}
    ]
    goals = serve_report.check_goals({"mixed": {"rows": rows}})[-2:]
    assert [g["verdict"] for g in goals] == ["met", "missed"]
    assert [g["measured"] for g in goals] == [1.6, 1.2]


def test_the_mixed_plan_combines_every_length_with_every_max_tokens():
    prompts = serve_clients.suite_prompts(chat=True)
    plan = serve_workloads.mixed_plan(prompts, True, 4, 3, cap=100)
    requests = [r for client in plan for r in client]
    assert len(plan) == 4 and all(len(c) == 3 for c in plan)
    labels = [label for label, _, _ in requests]
    assert len(set(labels)) == 12
    combos = {tuple(label.split(":")[2:]) for label in labels}
    assert combos == {
        (length, str(min(m, 100)))
        for length in serve_workloads.MIXED_LENGTHS
        for m in serve_workloads.MIXED_MAX_TOKENS
    }
    size = {}
    for label, prompt, max_tokens in requests:
        assert max_tokens <= 100 and label.endswith(f":{max_tokens}")
        size.setdefault(label.split(":")[2], []).append(len(prompt[-1]["content"]))
    assert max(size["short"]) < min(size["medium"])
    assert max(size["medium"]) < min(size["long"])
    # The first wave (one request per client) holds every length.
    assert {plan[c][0][0].split(":")[2] for c in range(3)} == set(
        serve_workloads.MIXED_LENGTHS
    )


def test_latency_summary_reads_percentiles_and_tokens_per_target_forward():
    stats = {"target_forwards": 4, "generated_tokens": 10}
    results = [
        _result(0.0, 1.0, 3.0, 5, stats),  # 0.5 s between tokens
        _result(0.0, 2.0, 3.0, 3, stats),  # 0.5 s
        _result(1.0, 1.5, 5.0, 8, None),  # 0.5 s
    ]
    row = serve_clients.latency_summary(results)
    assert row["tokens"] == 16 and row["wall_s"] == 5.0
    assert row["throughput_tokens_per_s"] == pytest.approx(3.2)
    assert row["ttft_p50_s"] == 0.5 + 0.5  # ttfts 1.0, 2.0, 0.5
    assert row["ttft_p99_s"] == pytest.approx(1.0 + 0.98 * 1.0)
    assert row["itl_p50_s"] == pytest.approx(0.5)
    assert row["tokens_per_target_forward"] == 2.5
    assert (
        serve_clients.latency_summary(results[2:])["tokens_per_target_forward"] is None
    )


def test_agent_conversations_recur_across_episodes_with_the_servers_replies():
    first = serve_workloads.agent_messages(0, ["call A", "call B"], 2)
    second = serve_workloads.agent_messages(1, ["call A", "call B"], 2)
    assert first[0] == second[0]  # the same system prompt
    roles = ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["role"] for m in first] == roles
    assert first[2]["content"] == "call A" and "mean_0" in first[3]["content"]


def test_a_tiny_run_writes_its_tables(pair_flags, tmp_path):
    bench.main(
        [
            *pair_flags,
            "--servers",
            "mlx_lm",
            "mlx_spec",
            "--clients",
            "2",
            "--requests-per-client",
            "1",
            "--repeats",
            "2",
            "--max-tokens",
            "8",
            "--workloads",
            "clients",
            "agent",
            "mixed",
            "--mixed-clients",
            "3",
            "--mixed-requests",
            "1",
            "--agent-episodes",
            "2",
            "--agent-steps",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads((tmp_path / "serve.json").read_text())
    rows = report["clients"]["rows"]
    assert {r["server"] for r in rows} == {"mlx_lm", "mlx_spec"}
    assert all(r["errors"] == 0 and r["tokens"] > 0 for r in rows)
    # 2 clients x 2 requests (at least 4 per run) x 2 runs
    assert all(r["same_text_as_mlx_lm"] == "8/8" for r in rows)
    assert all(len(r["aggregate_tokens_per_s_runs"]) == 2 for r in rows)
    assert "| mlx_spec | 2 |" in (tmp_path / "serve.md").read_text()
    agent = {r["server"]: r for r in report["agent"]["rows"]}
    assert set(agent) == {"mlx_lm", "mlx_spec", "mlx_spec_isolated"}
    assert all(r["errors"] == 0 and r["requests"] == 4 for r in agent.values())
    assert agent["mlx_spec_isolated"]["cross_request_accepted"] in (0, None)
    mixed = {r["server"]: r for r in report["mixed"]["rows"]}
    assert set(mixed) == {"mlx_lm", "mlx_spec"}
    assert all(r["errors"] == 0 and r["requests"] == 3 for r in mixed.values())
    assert all(r["same_text_as_mlx_lm"] == "3/3" for r in mixed.values())
    assert mixed["mlx_spec"]["tokens_per_target_forward"] >= 1.0
    assert mixed["mlx_lm"]["throughput_vs_mlx_lm"] == 1.0
    assert "mixed prompt lengths" in (tmp_path / "serve.md").read_text()
    assert report["command"].startswith("python -m mlx_spec.bench.serve --model ")


def test_a_draft_method_without_a_draft_stops_in_one_line(checkpoints, capsys):
    argv = ["--model", str(checkpoints["llama"]), "--draft-model", "none"]
    with pytest.raises(SystemExit) as stop:
        bench.main([*argv, "--method", "draft"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--method draft needs a --draft-model" in err and "\n" not in err
