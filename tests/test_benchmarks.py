"""The benchmark harness runs end to end on the tiny test checkpoints.

Nothing here asserts on speed: timings on a shared CPU are noise at this size.
The definitions (paired speedups, decode spans, round costs) are checked on
the stored raw runs and on hand-built traces instead.
"""

import json
import math
import statistics
from pathlib import Path

import pytest

from mlx_spec.bench import options, report
from mlx_spec.bench import rows as bench_rows
from mlx_spec.bench import run as bench
from mlx_spec.bench import runner
from mlx_spec.bench.goals import GOALS, check_goals
from mlx_spec.bench.measure import BareCosts, PiecewiseCost, fit_linear
from mlx_spec.bench.prompts import (
    BASE_PROMPTS,
    BASE_SETS,
    CHAT_PROMPTS,
    CHAT_SETS,
    encode,
    load_prompt_file,
    prompt_suite,
)
from mlx_spec.config import METHODS
from mlx_spec.loading import default_model_pair

REPO = Path(__file__).resolve().parent.parent

# One short run of each method: one repeat, no warm-up, no γ sweep, no charts.
ONE_RUN = ["--repeats", "1", "--warmup", "0", "--no-gamma-sweep"]
ONE_RUN += ["--forward-repeats", "1", "--no-charts", "--no-progress"]
# And on the first chat prompts only, greedy.
TINY_CHAT = ["--quick", "--prompt-sets", "chat", "--temps", "0", *ONE_RUN]


def _chat_default() -> bool:
    """Whether the default target has a chat template (the chat suite runs)."""
    if not _shipped_default_pair():
        return False
    config = Path(default_model_pair()[0]) / "tokenizer_config.json"
    return config.exists() and "chat_template" in config.read_text()


def _shipped_default_pair() -> bool:
    """Whether the default target was built and its draft ships in models/."""
    try:
        pair = default_model_pair()
    except ValueError:
        return False
    return all(p and Path(p).resolve().parent == REPO / "models" for p in pair)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_results(pair_flags, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # Made-up cost curves: the projection path runs without measuring them.
    curves = {
        "small": {"widths": [1, 8], "forward_s": [0.01, 0.02], "params": 1},
        "big": {"widths": [1, 8], "forward_s": [0.1, 0.15], "params": 2},
    }
    (out / "curves.json").write_text(json.dumps({"cost_curves": curves}))
    argv = [
        "--cost-curves-from",
        str(out / "curves.json"),
        *pair_flags,
        "--quick",
        "--max-tokens",
        "6",
        "--repeats",
        "2",
        "--draws",
        "2",
        "--warmup",
        "1",
        "--gamma-sweep",
        "2",
        "--forward-repeats",
        "2",
        "--out",
        str(out),
        "--no-progress",
    ]
    bench.main(argv)
    return out, json.loads((out / "results.json").read_text())


def test_results_json_has_required_row_keys_and_types(quick_results):
    _, results = quick_results
    assert results["rows"]
    for row in results["rows"]:
        missing = [k for k in bench_rows.REQUIRED_ROW_KEYS if k not in row]
        assert not missing, (row["method"], missing)
        for key in (
            "tokens_per_s",
            "tokens_per_target_forward",
            "peak_memory_gb",
            "temp",
        ):
            assert _is_number(row[key]), (key, row)
        assert row["tokens_per_s"] > 0
        assert row["tokens_per_target_forward"] >= 1.0 - 1e-9
        assert row["speedup_vs_plain"] is None or _is_number(row["speedup_vs_plain"])
        assert row["overhead"] is None or _is_number(row["overhead"])
        if row["method"] in runner.PLAIN_METHODS:
            assert row["acceptance_rate"] is None and row["gamma"] is None
        else:
            # None when a method drafted nothing (e.g. lookup with no n-gram match).
            rate = row["acceptance_rate"]
            assert rate is None or 0.0 <= rate <= 1.0
            assert isinstance(row["gamma"], int)


def test_every_method_temp_and_prompt_set_is_covered(quick_results):
    _, results = quick_results
    rows = results["rows"]
    methods = {r["method"] for r in rows}
    assert {"mlx_lm", "mlx_lm_speculative", "draft"} <= methods
    # Every method of the registry runs or says why not; --quick leaves out
    # none, and self-speculation when there is a draft model (saying so).
    ran_or_skipped = methods | set(results["methods_skipped"])
    assert set(METHODS) - set(bench.QUICK_LEFT_OUT) <= ran_or_skipped
    assert "none" not in methods and "self" not in methods
    assert "--quick" in results["methods_skipped"]["self"]
    assert {r["temp"] for r in rows} == {0.0, 0.7}
    # The slowest methods run at the first temperature only.
    assert "tree" in bench.QUICK_FIRST_TEMP_ONLY
    slow = {r["temp"] for r in rows if r["method"] in bench.QUICK_FIRST_TEMP_ONLY}
    assert slow == {0.0}
    # The profiled pass covers the first prompt only.
    assert {p["prompt_set"] for p in results["profiles"]} == {CHAT_SETS[0]}
    # The test checkpoints have a chat template: the chat suite runs.
    assert {r["prompt_set"] for r in rows} == {"all", *CHAT_SETS}
    for method in ("draft", "mlx_lm_speculative"):
        assert {r["gamma"] for r in rows if r["method"] == method} == {2, 4}


def test_plain_mlx_lm_speedup_is_one_by_definition(quick_results):
    _, results = quick_results
    plain = [r for r in results["rows"] if r["method"] == "mlx_lm"]
    assert plain
    assert all(r["speedup_vs_plain"] == 1.0 for r in plain)
    spec = [r for r in results["rows"] if r["method"] == "mlx_lm_speculative"]
    assert all(r["speedup_vs_mlx_lm_speculative"] == 1.0 for r in spec)


def test_machine_and_versions_are_recorded(quick_results):
    _, results = quick_results
    machine = results["machine"]
    for key in ("platform", "cpu_count", "mlx", "mlx_lm", "blas"):
        assert machine[key], key
    assert results["models"]["target_params"] > 0


def test_markdown_and_charts_are_written(quick_results):
    out, _ = quick_results
    md = (out / "results.md").read_text()
    assert "| mlx_lm | 0.0 |" in md and "| draft | 0.7 | 4 |" in md
    assert "Draft length sweep" in md and "overhead calibration" in md
    assert "× 2 repeat(s) × 2 draws when sampling, 6 tokens each" in md
    pytest.importorskip("matplotlib")
    for name in ("tokens_per_s.png", "speedup_vs_temp.png", "acceptance_vs_gamma.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name


def test_projections_from_saved_cost_curves_are_labelled(quick_results):
    out, results = quick_results
    assert results["projections"]
    assert all(p["kind"] == "projected" for p in results["projections"])
    assert all(_is_number(p["projected_speedup"]) for p in results["projections"])
    md = (out / "results.md").read_text()
    assert "PROJECTED speedups (not measurements)" in md


def test_projection_is_labelled_and_follows_its_formula():
    rows = [
        {
            "prompt_set": "all",
            "method": "draft",
            "temp": 0.0,
            "gamma": 4,
            "draft_cost_known": True,
            "draft_forwards_per_round": 4.0,
            "verify_width": 5.0,
            "tokens_per_target_forward": 3.0,
        },
        {
            "prompt_set": "all",
            "method": "mlx_lm",
            "temp": 0.0,
            "gamma": None,
            "draft_cost_known": True,
            "draft_forwards_per_round": 0.0,
            "verify_width": 1.0,
            "tokens_per_target_forward": 1.0,
        },
    ]
    curves = {
        "small": {"widths": [1, 8], "forward_s": [0.01, 0.02]},
        "big": {"widths": [1, 4, 8], "forward_s": [0.1, 0.11, 0.15]},
    }
    out = bench_rows.project(rows, curves, pair_draft_ratio=None)
    assert [p["target_shape"] for p in out] == ["big"]
    (p,) = out
    assert p["kind"] == "projected"
    t_verify = 0.11 + (5 - 4) / (8 - 4) * (0.15 - 0.11)
    assert p["projected_speedup"] == pytest.approx(3.0 * 0.1 / (4 * 0.01 + t_verify))


def test_bad_settings_exit_with_a_one_line_error(capsys, tmp_path):
    afile = tmp_path / "afile.txt"
    afile.write_text("")
    for argv, message in (
        (["--max-tokens", "0"], "--max-tokens=0"),
        (["--draws", "0"], "--draws=0"),
        (["--option", "nonsense=3"], "--option nonsense: not a method option"),
        (["--option", "tree_budget=0"], "tree_budget"),
        (["--out", str(afile)], f"--out {afile} is a file; pass a directory."),
    ):
        with pytest.raises(SystemExit) as e:
            bench.main([*argv, "--no-progress"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("stage", ["benchmark", "markdown"])
def test_ctrl_c_exits_quietly_and_leaves_no_half_written_file(
    tmp_path, capsys, monkeypatch, stage
):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "benchmark", lambda args: {"rows": []})
    monkeypatch.setattr(bench if stage == "benchmark" else report, stage, interrupt)
    monkeypatch.setattr(report, "_clean", lambda results: results)
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path), "--no-progress", "--no-charts"])
    assert e.value.code == 130
    assert "Traceback" not in capsys.readouterr().err
    # Interrupted while writing: results.json is whole, results.md absent.
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ([] if stage == "benchmark" else [report.RESULTS_JSON])


def test_raw_runs_are_stored_with_mlx_lm_first_and_last_in_every_block(quick_results):
    _, results = quick_results
    runs = results["runs"]
    blocks = {}
    for r in runs:
        blocks.setdefault(r["block"], []).append(r)
        assert len(r["round_s"]) == len(r["round_drafted"]) == len(r["round_forwards"])
        assert r["decode_s"] >= 0 and r["wall_s"] >= r["ttft_s"] >= 0
        assert r["memory_increase_gb"] >= 0
    # 4 prompts x 2 repeats x (greedy + 2 sampled draws).
    assert len(blocks) == 4 * 2 * (1 + 2)
    seeds = {}
    for block in blocks.values():
        block.sort(key=lambda r: r["position"])
        assert block[0]["method"] == block[-1]["method"] == "mlx_lm"
        assert len({(r["temp"], r["draw"], r["seed"]) for r in block}) == 1
        first = block[0]
        seeds.setdefault((first["prompt"], first["repeat"], first["temp"]), []).append(
            (first["draw"], first["seed"])
        )
    for (_, _, temp), draws in seeds.items():
        # Each draw of a sampled block has a seed of its own; greedy runs once.
        assert sorted(d for d, _ in draws) == ([0, 1] if temp > 0 else [0])
    sampled = [(p, s) for (p, _, t), ds in seeds.items() if t > 0 for _, s in ds]
    assert len(set(sampled)) == len(sampled) == 4 * 2 * 2


def test_speedup_is_the_median_of_paired_decode_ratios(quick_results):
    _, results = quick_results
    runs = results["runs"]

    def decode_tps(r):
        return r["decode_tokens"] / r["decode_s"] if r["decode_s"] > 0 else None

    row = next(
        r
        for r in results["rows"]
        if (r["method"], r["temp"], r["gamma"], r["fixed"], r["prompt_set"])
        == ("draft", 0.0, 4, False, "all")
    )
    ratios = []
    for r in runs:
        if (r["method"], r["temp"], r["gamma"], r["fixed"]) != ("draft", 0.0, 4, False):
            continue
        base = [
            decode_tps(b)
            for b in runs
            if b["block"] == r["block"] and b["method"] == "mlx_lm"
        ]
        base = [b for b in base if b]
        if decode_tps(r) and base:
            ratios.append(decode_tps(r) / (sum(base) / len(base)))
    if not ratios:
        assert row["speedup_vs_plain"] is None
    else:
        assert row["speedup_vs_plain"] == pytest.approx(statistics.median(ratios))
        assert row["pairs"] == len(ratios)


def test_calibration_and_bare_fit_are_recorded(quick_results):
    _, results = quick_results
    assert set(results["overhead_calibration"]) == {"0", "0.7"}
    fit = results["bare_forward_fit"]["target"]
    # A fit of wall times: its intercept may come out just below zero on a
    # busy machine, so only the slope's sign is the fit's own (fit_linear).
    assert _is_number(fit["a_s"]) and fit["b_s_per_token"] >= 0
    assert results["bare_forward_samples_s"]["target"]["1"]
    plain = [r for r in results["rows"] if r["method"] == "mlx_lm"]
    assert all(r["overhead"] is None or _is_number(r["overhead"]) for r in plain)


def test_quick_mode_runs_once_and_sweeps_gamma_only_when_asked():
    parse = bench.setup_arg_parser().parse_args
    quick = options.resolve_settings(parse(["--quick"]))
    assert quick["repeats"] == options.QUICK_REPEATS
    assert quick["draws"] == options.DEFAULT_DRAWS
    assert quick["gamma_sweep"] == []
    quick = options.resolve_settings(parse(["--quick", "--gamma-sweep", "2", "4", "6"]))
    configs = bench._configs(["mlx_lm", "mlx_lm_speculative", "draft", "none"], quick)
    assert len(set(configs)) == len(configs)
    greedy = [c for c in configs if c.temp == 0.0]
    for m in runner.SWEEP_METHODS:
        assert {c.gamma for c in greedy if c.method == m} == {2, 4, 6}
    # draft's sweep runs every γ with adaptive control off, next to its default.
    assert {c.gamma for c in greedy if c.method == "draft" and c.fixed} == {2, 4, 6}
    assert [c for c in greedy if c.method == "draft" and not c.fixed] == [
        runner.Config("draft", 0.0, 4)
    ]
    assert not any(c.fixed for c in configs if c.method == "mlx_lm_speculative")
    # Quick mode sweeps the first temperature only; full mode sweeps them all.
    assert {c.gamma for c in configs if c.temp == 0.7 and c.method == "draft"} == {4}
    full = options.resolve_settings(parse([]))
    assert full["draws"] == options.DEFAULT_DRAWS == 1
    configs = bench._configs(["mlx_lm", "draft"], full)
    assert {c.gamma for c in configs if c.temp == 0.7 and c.method == "draft"} == set(
        options.DEFAULT_GAMMA_SWEEP
    )


def test_block_order_brackets_with_mlx_lm_and_rotates_the_rest():
    configs = [("mlx_lm", 0.0, None), ("a", 0.0, 4), ("b", 0.0, 4), ("c", 0.0, 4)]
    assert [c[0] for c in bench.block_order(configs, 0)] == [
        "mlx_lm",
        "a",
        "b",
        "c",
        "mlx_lm",
    ]
    assert [c[0] for c in bench.block_order(configs, 1)] == [
        "mlx_lm",
        "b",
        "c",
        "a",
        "mlx_lm",
    ]


def _trace(times, rounds, counted=None, drafted=None, forwards=None):
    n = len(times)
    return runner.Trace(
        times=list(times),
        rounds=list(rounds),
        counted=list(counted or [True] * n),
        drafted=list(drafted or [0] * n),
        forwards=list(forwards or [0] * n),
    )


def test_split_rounds_plain_decoding_has_one_token_per_round():
    out = runner.split_rounds(_trace([1.0, 1.1, 1.3, 1.6], [0, 1, 2, 3]))
    assert out["decode_tokens"] == 3
    assert out["decode_s"] == pytest.approx(0.6)
    assert out["round_s"] == pytest.approx([0.1, 0.2, 0.3])
    assert out["round_drafted"] == [0, 0, 0]


def test_split_rounds_speculative_rounds_count_their_drafts():
    # Round 0 emits 3 tokens, round 1 emits 2, round 2 emits 1; γ = 4 each.
    out = runner.split_rounds(
        _trace(
            [1.0, 1.0, 1.0, 1.5, 1.5, 2.1],
            [0, 0, 0, 1, 1, 2],
            drafted=[4, 4, 4, 8, 8, 12],
            forwards=[4, 4, 4, 8, 8, 12],
        )
    )
    assert out["decode_tokens"] == 3  # round 0's tokens come before the first one
    assert out["decode_s"] == pytest.approx(1.1)
    assert out["round_s"] == pytest.approx([0.5, 0.6])
    assert out["round_drafted"] == out["round_forwards"] == [4, 4]


def test_split_rounds_does_not_count_the_eos_of_a_stop():
    out = runner.split_rounds(
        _trace([1.0, 1.2, 1.5], [0, 1, 2], counted=[True, True, False])
    )
    assert out["decode_tokens"] == 1
    assert out["decode_s"] == pytest.approx(0.2)
    assert out["round_s"] == pytest.approx([0.2, 0.3])


def test_mlx_lm_rounds_end_at_a_token_not_from_the_draft():
    class R:
        def __init__(self, from_draft):
            self.from_draft = from_draft

    describe = runner._mlx_lm_rounds(max_tokens=10, gamma=4)
    flags = [True, True, False, False, True, True, True, True, False, False]
    seen = [describe(R(f)) for f in flags]
    assert [r for r, _, _ in seen] == [0, 0, 0, 1, 2, 2, 2, 2, 2, 3]
    # Drafted per round: 4, 4, 4, then min(10 - 9, 4) = 1.
    assert [d for _, d, _ in seen] == [4, 4, 4, 8, 12, 12, 12, 12, 12, 13]
    plain = runner._mlx_lm_rounds(max_tokens=10, gamma=0)
    assert [plain(R(False))[0] for _ in range(3)] == [0, 1, 2]


def test_round_cost_is_draft_forwards_plus_verification_of_its_width():
    costs = BareCosts(
        target=PiecewiseCost((1, 5, 17), (0.011, 0.015, 0.021)),
        draft=PiecewiseCost((1, 4), (0.0025, 0.004)),
    )
    # Chain: 4 one-token draft forwards, a 5-token verification.
    assert costs.round(4, 4) == pytest.approx(4 * 0.0025 + 0.015)
    # Tree: 4 draft forwards feeding 16 tokens (4 per level), a 17-token verification.
    assert costs.round(16, 4) == pytest.approx(4 * 0.004 + 0.021)
    # Lookup: no draft forward; width 3 lies between the sampled 1 and 5.
    assert costs.round(2, 0) == pytest.approx(0.013)
    assert BareCosts(costs.target, None).round(4, 4) is None


def test_piecewise_cost_is_a_line_between_sampled_neighbours():
    cost = PiecewiseCost((1, 8, 16), (0.010, 0.017, 0.013))
    assert cost(1) == 0.010 and cost(8) == 0.017 and cost(16) == 0.013
    assert cost(4) == pytest.approx(0.013)
    assert cost(12) == pytest.approx(0.015)
    # Past the widest sample the last line goes on, never decreasing.
    assert cost(20) == pytest.approx(0.013)
    assert PiecewiseCost((1, 2), (0.01, 0.02))(4) == pytest.approx(0.04)
    assert PiecewiseCost((3,), (0.5,))(7) == 0.5


def test_round_ratios_compare_each_round_with_its_own_cost():
    run = runner.Run(
        method="draft",
        temp=0.0,
        gamma=4,
        prompt="p",
        prompt_set="editing",
        repeat=0,
        block=0,
        position=1,
        tokens=[1] * 8,
        wall_s=1.0,
        ttft_s=0.1,
        decode_s=0.5,
        decode_tokens=5,
        rounds=3,
        accepted=5,
        drafted=12,
        draft_forwards=12,
        round_s=[0.030, 0.015],
        round_drafted=[4, 0],
        round_forwards=[4, 0],
        peak_memory_gb=0.1,
        memory_increase_gb=0.01,
    )
    costs = BareCosts(
        PiecewiseCost((1, 5), (0.01, 0.02)), PiecewiseCost((1,), (0.0025,))
    )
    assert bench_rows.round_ratios(run, costs) == pytest.approx([1.0, 1.5])
    run.draft_cost_known = False
    assert bench_rows.round_ratios(run, costs) == []


def test_fit_linear_recovers_a_line_and_flattens_a_negative_slope():
    fit = fit_linear([1, 2, 5], [0.011, 0.012, 0.015])
    assert fit.a == pytest.approx(0.010) and fit.b == pytest.approx(0.001)
    assert fit.max_rel_residual == pytest.approx(0.0, abs=1e-9)
    flat = fit_linear([1, 4], [0.02, 0.01])
    assert flat.b == 0.0 and flat.a == pytest.approx(0.015)
    assert fit_linear([3], [0.5])(7) == 0.5


def _fake_results(rows):
    return {
        "rows": rows,
        "settings": {"num_draft_tokens": 4},
        "overhead_calibration": {"0": 1.01},
        "plain_drift": 0.03,
    }


def _fake_row(method, speedup, per_forward, temp=0.0, same=1.0):
    return {
        "method": method,
        "temp": temp,
        "fixed": False,
        "gamma": None if method in runner.PLAIN_METHODS else 4,
        "prompt_set": "all",
        "decode_tokens_per_s": 100.0 * speedup,
        "tokens_per_s": 90.0 * speedup,
        "speedup_vs_plain": speedup,
        "speedup_vs_plain_e2e": speedup,
        "speedup_vs_mlx_lm_speculative": speedup,
        "tokens_per_target_forward": per_forward,
        "overhead": 1.0,
        "greedy_identical": same,
    }


def test_headline_excludes_methods_that_accepted_nothing():
    rows = [
        _fake_row("mlx_lm", 1.0, 1.0),
        _fake_row("draft", 1.3, 2.5),
        _fake_row("lookup", 1.6, 1.0),  # fast by noise alone: nothing accepted
    ]
    lines = "\n".join(report._headline(_fake_results(rows)))
    assert "**draft**" in lines and "**lookup**" not in lines
    assert "not ranked" in lines and "lookup" in lines
    assert "calibration" in lines


def test_greedy_mismatch_is_a_loud_warning():
    rows = [_fake_row("mlx_lm", 1.0, 1.0), _fake_row("tree", 1.2, 2.0, same=0.5)]
    warnings = bench_rows.check_rows(rows)
    assert len(warnings) == 1 and "GREEDY MISMATCH: tree" in warnings[0]
    assert (
        bench_rows.check_rows([_fake_row("tree", 1.2, 2.0, temp=0.7, same=None)]) == []
    )
    md = report._warnings({"warnings": warnings})
    assert any("WARNING" in line and "tree" in line for line in md)


@pytest.mark.skipif(
    not _shipped_default_pair(), reason="default model pair not present in models/"
)
def test_every_method_is_greedy_identical_to_mlx_lm_on_the_default_pair(
    tmp_path, monkeypatch
):
    # Identity only: no bare forward is timed (here they cost more than the runs).
    monkeypatch.setattr(bench, "_sample_one", lambda *args, **kwargs: None)
    bench.main(
        [
            "--quick",
            "--methods",
            "mlx_lm",
            "mlx_lm_speculative",
            *METHODS,
            "--temps",
            "0",
            "--no-profile",
            # One prompt keeps it short on a CPU: on the copying one every
            # drafting method gets both accepted and rejected tokens.
            *(["--prompt-sets", "editing"] if _chat_default() else []),
            "--max-tokens",
            "12",
            *ONE_RUN,
            "--out",
            str(tmp_path),
        ]
    )
    results = json.loads((tmp_path / "results.json").read_text())
    ran = {r["method"] for r in results["rows"]}
    # The methods every pair runs must run; a head or MTP method may be skipped
    # only when no drafter of its kind was found for the default target.
    core = {"none", "draft", "tree", "lookup", "self", "auto"}
    kinds = {h["kind"] for h in results["models"]["heads"]}
    for method, why in results["methods_skipped"].items():
        assert method not in core, (method, why)
        assert not any(method.startswith(k) for k in kinds), (method, why)
    assert core <= ran
    assert "mlx_lm_speculative" in ran or not results["models"]["draft"]
    temp0 = [r for r in results["rows"] if r["temp"] == 0]
    assert temp0
    for row in temp0:
        if row["method"] == "mlx_lm_speculative":
            continue  # mlx-lm's own mode: reported, not ours to enforce
        assert row["greedy_identical"] == 1.0, (row["method"], row["prompt_set"])


# --------------------------------------------------------------------------- #
# Acceptance, time split, geometric means and goals
# --------------------------------------------------------------------------- #


def test_acceptance_by_position_conditions_on_the_tokens_before():
    # Rounds (accepted, drafted): all 4 accepted; 1 of 4; 0 of 4; 2 of 2.
    accepted, drafted = [4, 1, 0, 2], [4, 4, 4, 2]
    by_position = bench_rows.acceptance_by_position(accepted, drafted, positions=5)
    # Position 1: 3 of 4 rounds; 2: 2 of the 3 that got there; 3: the one round
    # that drafted 3 and accepted 2; 4: the same; 5: never drafted.
    assert by_position == [0.75, pytest.approx(2 / 3), 1.0, 1.0, None]


def test_per_token_acceptance_counts_one_rejection_per_failed_round():
    # 7 accepted tokens; rounds 2 and 3 ended on a rejected draft token.
    value = bench_rows.per_token_acceptance([4, 1, 0, 2], [4, 4, 4, 2])
    assert value == pytest.approx(7 / 9)
    assert bench_rows.per_token_acceptance([], []) is None


def test_mlx_lm_round_counts_split_at_target_tokens():
    flags = [True, True, False, False, True, True, True, True, False, True]
    accepted, drafted = runner.mlx_lm_round_counts(flags, max_tokens=10, gamma=4)
    # Rounds: 2 accepted + target; 0 + target; 4 + bonus; 1 cut by the budget.
    assert accepted == [2, 0, 4, 1]
    assert drafted == [4, 4, 4, 1]


def test_geometric_mean_needs_every_value():
    assert bench_rows.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert bench_rows.geomean([2.0, None]) is None
    assert bench_rows.geomean([]) is None


def test_all_rows_carry_the_geometric_mean_of_their_prompt_sets(quick_results):
    _, results = quick_results
    rows = results["rows"]
    key = bench_rows.row_key
    checked = 0
    for row in rows:
        if row["prompt_set"] != "all":
            continue
        sets = [r for r in rows if r["prompt_set"] != "all" and key(r) == key(row)]
        assert row["prompt_sets"] == len(sets) == len(CHAT_SETS)
        for name in bench_rows.GEOMEAN_FIELDS:
            values = [s[name] for s in sets]
            expected = bench_rows.geomean(values)
            got = row[f"{name}_geomean"]
            assert got == pytest.approx(expected) if expected else got == expected
            checked += expected is not None
    assert checked


def test_per_token_acceptance_is_recomputed_from_the_raw_rounds(quick_results):
    _, results = quick_results
    row = next(
        r
        for r in results["rows"]
        if bench_rows.row_key(r) == ("draft", 0.0, 4, False)
        and r["prompt_set"] == "all"
    )
    runs = [
        r
        for r in results["runs"]
        if (r["method"], r["temp"], r["gamma"], r["fixed"]) == ("draft", 0.0, 4, False)
    ]
    accepted = [n for r in runs for n in r["accepted_per_round"]]
    drafted = [d for r in runs for d in r["drafted_per_round"]]
    assert sum(accepted) == sum(r["accepted"] for r in runs)
    assert row["per_token_acceptance"] == bench_rows.per_token_acceptance(
        accepted, drafted
    )
    positions = row["acceptance_by_position"]
    assert len(positions) == bench_rows.MAX_POSITIONS
    assert all(v is None or 0.0 <= v <= 1.0 for v in positions)


def test_rows_report_the_cost_model_each_run_measured(quick_results):
    """The draft step and verification costs of a row are the medians of the
    cost models its runs' engines measured; plain mlx_lm measures none."""
    import statistics

    out, results = quick_results
    key = ("draft", 0.0, 4, False)
    row = next(
        r
        for r in results["rows"]
        if bench_rows.row_key(r) == key and r["prompt_set"] == "all"
    )
    runs = [
        r
        for r in results["runs"]
        if (r["method"], r["temp"], r["gamma"], r["fixed"]) == key
    ]
    models = [r["cost_model"] for r in runs]
    assert all(m and m["draft_step"]["draft"] > 0 for m in models)
    steps = statistics.median(m["draft_step"]["draft"] for m in models)
    assert row["draft_step_cost"] == pytest.approx(steps)
    verify = statistics.median(m["verify_by_width"]["8"] for m in models)
    assert row["verify_cost_8"] == pytest.approx(verify)
    plain = [r for r in results["rows"] if r["method"] == "mlx_lm"]
    assert plain and all(r["target_step_ms"] is None for r in plain)
    assert "## Cost model measured online" in (out / "results.md").read_text()


def test_profiled_pass_splits_round_time_into_shares_that_sum_to_one(quick_results):
    _, results = quick_results
    profiles = results["profiles"]
    assert profiles
    assert not any(p["method"] in runner.BASELINES for p in profiles)
    assert not any(p["fixed"] for p in profiles)
    for row in results["rows"]:
        shares = [row[f"{p}_time_share"] for p in ("draft", "verify", "host")]
        # --quick profiles the first prompt (chat) at the first temperature only.
        first = row["prompt_set"] in ("all", CHAT_SETS[0])
        if (
            row["method"] in runner.BASELINES
            or row["fixed"]
            or row["temp"] != 0.0
            or not first
        ):
            assert shares == [None, None, None], row["method"]
            continue
        assert all(s is not None and 0.0 <= s <= 1.0 for s in shares), row
        assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    # The timed runs stay unprofiled: none of them carries a profile.
    assert not any("profile" in r for r in results["runs"])


def _goal_rows():
    """Greedy and temp-0.7 rows: 'all' rows with geometric means and set rows."""
    sets = ("chat", "code", "editing", "summarize")
    speed = {"mlx_lm": 1.0, "mlx_lm_speculative": 1.4, "draft": 1.7, "auto": 1.1}
    rows = []
    for temp in (0.0, 0.7):
        for method, s in speed.items():
            base = {
                "method": method,
                "temp": temp,
                "gamma": None if method == "mlx_lm" else 4,
                "fixed": False,
                "tokens_per_target_forward": 1.0 if method == "mlx_lm" else 2.6,
                "per_token_acceptance": None if method == "mlx_lm" else 0.72,
            }
            for group in sets:
                low = method == "auto" and group == "code" and temp == 0.7
                rows.append(
                    dict(base, prompt_set=group, speedup_vs_plain=0.9 if low else s)
                )
            rows.append(
                dict(
                    base,
                    prompt_set="all",
                    speedup_vs_plain=s,
                    speedup_vs_plain_geomean=s,
                    speedup_vs_mlx_lm_speculative_geomean=s / 1.4,
                    tokens_per_target_forward_geomean=base["tokens_per_target_forward"],
                )
            )
    return rows


def test_goals_report_met_missed_and_not_run():
    goals = {g["goal"]: g for g in check_goals(_goal_rows(), main_gamma=4)}
    assert len(goals) == len(GOALS)
    best = goals["greedy: best mlx-spec method ≥ 1.6× mlx_lm (geomean)"]
    assert (best["status"], best["measured"]) == ("met", 1.7)
    assert "draft" in best["detail"]
    vs_spec = goals["greedy: best mlx-spec method ≥ 1.3× mlx_lm speculative (geomean)"]
    assert vs_spec["status"] == "missed"
    assert vs_spec["shortfall"] == pytest.approx(1.7 / 1.4 / 1.3)
    auto = goals["auto ≥ 0.95× mlx_lm on every prompt set (every temperature)"]
    assert (auto["status"], auto["measured"]) == ("missed", 0.9)
    assert "code" in auto["detail"] and "0.7" in auto["detail"]
    alpha = goals["draft: per-token acceptance ≥ 0.7, greedy, chat set"]
    assert (alpha["status"], alpha["measured"]) == ("met", 0.72)
    # No eagle or medusa row: their goals are not run, never met.
    for g in goals.values():
        if "eagle" in g["goal"] or "medusa" in g["goal"]:
            assert g["status"] == "not run" and g["measured"] is None, g


def test_issue_36_goals_read_auto_per_temperature_and_eagle_on_chat():
    goals = {g["goal"]: g for g in check_goals(_goal_rows(), main_gamma=4)}
    mean = goals["greedy: auto ≥ 1.5× mlx_lm (geomean)"]
    assert (mean["status"], mean["measured"]) == ("missed", 1.1)
    assert mean["shortfall"] == pytest.approx(1.1 / 1.5)
    chat = goals["greedy: auto ≥ 1.3× mlx_lm, chat set"]
    assert (chat["status"], chat["measured"]) == ("missed", 1.1)
    # The greedy floor reads greedy rows only: auto's 0.9 on code is at temp 0.7.
    floor = goals["greedy: auto ≥ 1.0× mlx_lm on every prompt set"]
    assert (floor["status"], floor["measured"]) == ("met", 1.1)
    assert "0.7" not in floor["detail"]
    sampled = goals["temp 0.7: auto ≥ 1.3× mlx_lm (geomean)"]
    assert (sampled["status"], sampled["measured"]) == ("missed", 1.1)
    tree = goals["eagle: tokens per target forward ≥ 2.5, greedy, chat set"]
    assert tree["status"] == "not run" and tree["measured"] is None
    rows = _goal_rows() + [
        dict(r, method="eagle", tokens_per_target_forward=2.7)
        for r in _goal_rows()
        if r["method"] == "draft" and r["temp"] == 0.0
    ]
    tree = {g["goal"]: g for g in check_goals(rows, main_gamma=4)}[tree["goal"]]
    assert (tree["status"], tree["measured"]) == ("met", 2.7)


def test_the_goals_heading_names_the_issues_of_its_goals():
    from mlx_spec.bench.report import _goals

    def heading(issues):
        goals = [
            dict(issue=i, goal="g", measured=None, status="not run", detail="")
            for i in issues
        ]
        return _goals({"goals": goals})[1]

    assert heading([17, 16, 36, 16]) == "## Goals (issues 16, 17 and 36)"
    assert heading([16, 17]) == "## Goals (issues 16 and 17)"
    assert heading([36]) == "## Goals (issue 36)"


def test_goals_are_in_the_results_and_the_report(quick_results):
    out, results = quick_results
    goals = results["goals"]
    assert {g["issue"] for g in goals} == {16, 17, 36}
    assert all(g["status"] in ("met", "missed", "not run") for g in goals)
    for g in goals:
        assert (g["measured"] is None) == (g["status"] == "not run"), g
    md = (out / "results.md").read_text()
    assert "## Goals (issues 16, 17 and 36)" in md
    assert "## Acceptance by draft position" in md


# --------------------------------------------------------------------------- #
# Prompts
# --------------------------------------------------------------------------- #


def test_chat_suite_has_three_to_six_prompts_per_set_and_quick_takes_the_first():
    for name in CHAT_SETS:
        members = [p for p in CHAT_PROMPTS if p.prompt_set == name]
        assert 3 <= len(members) <= 6, name
        assert all(p.is_chat and p.text is None for p in members)
    names = [p.name for p in CHAT_PROMPTS + BASE_PROMPTS]
    assert len(set(names)) == len(names)
    quick = prompt_suite(quick=True, chat=True)
    assert [p.prompt_set for p in quick] == list(CHAT_SETS)
    assert quick == [
        next(p for p in CHAT_PROMPTS if p.prompt_set == s) for s in CHAT_SETS
    ]
    with pytest.raises(ValueError, match="free_text"):
        prompt_suite(chat=True, sets=["free_text"])


def test_chat_prompts_go_through_the_chat_template(load_model):
    _, tokenizer = load_model("llama")
    prompt = CHAT_PROMPTS[0]
    conversation = [{"role": r, "content": c} for r, c in prompt.messages]
    expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    assert encode(prompt, tokenizer, chat=True) == list(expected)
    base = BASE_PROMPTS[0]
    assert encode(base, tokenizer, chat=False) == list(tokenizer.encode(base.text))


def test_prompt_file_lines_become_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt_set": "mine", "prompt": "Say hi."}\n'
        "\n"
        '{"prompt_set": "mine", "name": "two", "messages": '
        '[{"role": "user", "content": "Say bye."}]}\n'
    )
    first, second = load_prompt_file(str(path))
    assert (first.prompt_set, first.text, first.messages) == ("mine", "Say hi.", None)
    assert second.name == "two" and second.messages == (("user", "Say bye."),)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 1: not JSON"),
        ('{"prompt": "x"}', "'prompt_set' must be"),
        ('{"prompt_set": "a"}', "exactly one of 'prompt' and 'messages'"),
        ('{"prompt_set": "a", "messages": [{"role": "user"}]}', "'messages' must be"),
    ],
)
def test_a_bad_prompt_file_line_fails_in_one_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_prompt_file(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("reader", ["bench", "train"])
@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "does not exist; pass a JSON-lines file."),
        ("folder", "is a folder; pass a JSON-lines file."),
        ("not UTF-8", "is not UTF-8 text (byte 31); save it as UTF-8 JSON lines."),
    ],
)
def test_both_prompt_file_readers_refuse_an_unreadable_file_in_the_same_line(
    tmp_path, reader, case, message
):
    from mlx_spec.train import prompts as train_prompts

    read = load_prompt_file if reader == "bench" else train_prompts.load_prompt_file
    path = tmp_path / "p.jsonl"
    if case == "folder":
        path.mkdir()
    elif case == "not UTF-8":
        path.write_bytes(b'{"prompt_set": "a", "prompt": "\xff"}\n')
    with pytest.raises(ValueError) as e:
        read(str(path))
    assert str(e.value) == f"--prompts file '{path}' {message}"


def test_prompt_file_runs_end_to_end(checkpoints, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt_set": "greetings", "prompt": "Say hi."}\n'
        '{"prompt_set": "farewells", "prompt": "Say bye."}\n'
    )
    out = tmp_path / "out"
    bench.main(
        [
            "--model",
            str(checkpoints["llama"]),
            "--prompts",
            str(path),
            "--methods",
            "mlx_lm",
            "lookup",
            "--temps",
            "0",
            "--max-tokens",
            "4",
            *ONE_RUN,
            "--out",
            str(out),
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert {r["prompt_set"] for r in results["rows"]} == {
        "all",
        "greetings",
        "farewells",
    }
    assert results["settings"]["chat_template"] is True
    assert {r["method"] for r in results["rows"]} == {"mlx_lm", "lookup"}


def test_cost_curves_are_read_once_before_the_run(checkpoints, tmp_path, monkeypatch):
    """The file of --cost-curves-from is read at start only: a file that changes
    during the run does not fail it at its end."""
    curves = {"small": {"widths": [1, 8], "forward_s": [0.01, 0.02], "params": 1}}
    given = tmp_path / "curves.json"
    given.write_text(json.dumps({"cost_curves": curves}))
    load_pair = bench.load_pair

    def load_and_overwrite(*args, **kwargs):
        given.write_text("{}")  # no cost curves in it any more
        return load_pair(*args, **kwargs)

    monkeypatch.setattr(bench, "load_pair", load_and_overwrite)
    out = tmp_path / "out"
    bench.main(
        ["--model", str(checkpoints["llama"]), "--cost-curves-from", str(given)]
        + ["--methods", "mlx_lm", "--temps", "0", "--max-tokens", "2", *ONE_RUN]
        + ["--quick", "--no-profile", "--out", str(out)]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["cost_curves"] == curves


def _strings(value, depth=0):
    """Every string inside nested lists, tuples, dicts and simple objects."""
    if depth > 6:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _strings(v, depth + 1)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _strings(getattr(value, name), depth + 1)


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _training_texts(training) -> set:
    """Every user text of the drafter training prompts, normalised."""
    builtin = getattr(training, "builtin_prompts", None)
    if builtin is not None:
        splits = getattr(training, "SPLITS", ("train",))
        prompts = [p for split in splits for p in builtin(split)]
        return {_normal(m["content"]) for p in prompts for m in p.messages}
    texts = set()  # no builder: every string the module holds
    for name, value in vars(training).items():
        if not name.startswith("__") and not callable(value):
            texts |= {_normal(s) for s in _strings(value) if len(s) > 20}
    return texts


def test_benchmark_prompts_are_not_drafter_training_prompts():
    training = pytest.importorskip(
        "mlx_spec.train.prompts", reason="the drafter training prompts do not exist yet"
    )
    texts = _training_texts(training)
    assert texts, "found no training prompt text in mlx_spec.train.prompts"
    for prompt in CHAT_PROMPTS:
        mine = _normal(prompt.user_text())
        clashes = [t for t in texts if t and (mine in t or t in mine)]
        assert not clashes, (prompt.name, clashes[:1])


# --------------------------------------------------------------------------- #
# Methods from the registry, heads
# --------------------------------------------------------------------------- #


def test_a_new_registry_method_joins_the_benchmark_without_edits(
    load_model, monkeypatch
):
    import mlx_spec.config
    from mlx_spec.drafters import registry

    factories = dict(registry.FACTORIES, lookup2=registry.FACTORIES["lookup"])
    methods = (*registry.METHODS, "lookup2")
    monkeypatch.setattr(registry, "FACTORIES", factories)
    monkeypatch.setattr(registry, "METHODS", methods)
    monkeypatch.setattr(mlx_spec.config, "METHODS", methods)
    model, tokenizer = load_model("llama")
    setup = runner.Setup(model, tokenizer, None, 8)
    drafters, skipped = runner.discover_methods(setup, tokenizer.encode("def f(x):"))
    assert "lookup2" in drafters, skipped
    chosen, _ = bench._choose_methods(None, drafters, skipped, False, quick=True)
    assert "lookup2" in chosen and "none" not in chosen


@pytest.mark.parametrize("flag", ["--head", "--draft-model"])
def test_a_head_runs_its_methods(checkpoints, load_model, tmp_path, flag):
    heads = pytest.importorskip("mlx_spec.drafters.heads")
    fingerprint = pytest.importorskip("mlx_spec.fingerprint")
    model, _ = load_model("llama")
    head = heads.random_head("eagle", model)
    heads.save_head(
        tmp_path / "eagle",
        "eagle",
        head.module,
        target_fingerprint=fingerprint.model_fingerprint(model),
    )
    # With --head the draft model stays for draft; a head as --draft-model
    # leaves no draft model, so mlx-lm's speculative mode cannot run.
    drafts = (
        ["--draft-model", str(checkpoints["llama-near"])] if flag == "--head" else []
    )
    out = tmp_path / "out"
    bench.main(
        [
            "--model",
            str(checkpoints["llama"]),
            *drafts,
            flag,
            str(tmp_path / "eagle"),
            "--methods",
            "mlx_lm",
            "mlx_lm_speculative",
            "draft",
            "eagle",
            *TINY_CHAT,
            "--max-tokens",
            "6",
            "--out",
            str(out),
        ]
    )
    results = json.loads((out / "results.json").read_text())
    drafter_of = results["models"]["drafter_of"]
    assert drafter_of["eagle"].startswith("eagle head")
    eagle = [r for r in results["rows"] if r["method"] == "eagle"]
    assert eagle and all(r["greedy_identical"] == 1.0 for r in eagle)
    # Nobody times a head's forward: no overhead for it.
    assert all(r["overhead"] is None for r in eagle)
    if flag == "--head":
        assert drafter_of["draft"] == "draft model"
    else:
        assert results["models"]["draft"] is None
        assert "mlx_lm_speculative" in results["methods_skipped"]
        assert "draft" in results["methods_skipped"]


def test_a_target_with_mtp_layers_runs_the_mtp_method(checkpoints, tmp_path):
    pytest.importorskip("mlx_spec.mtp")
    names = [n for n in checkpoints if n.endswith("-mtp")]
    if not names:
        pytest.skip("no MTP test checkpoint in this version")
    out = tmp_path / "out"
    bench.main(
        [
            "--model",
            str(checkpoints[names[0]]),
            "--methods",
            "mlx_lm",
            "mtp",
            *TINY_CHAT,
            "--max-tokens",
            "6",
            "--out",
            str(out),
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["models"]["drafter_of"]["mtp"].startswith("mtp head")
    rows = [r for r in results["rows"] if r["method"] == "mtp"]
    assert rows and all(r["greedy_identical"] == 1.0 for r in rows)


def test_a_target_without_mtp_layers_says_why_mtp_is_skipped(checkpoints, tmp_path):
    pytest.importorskip("mlx_spec.mtp")
    out = tmp_path / "out"
    argv = ["--model", str(checkpoints["llama"]), "--methods", "mlx_lm", "mtp"]
    bench.main(
        argv + [*TINY_CHAT, "--max-tokens", "4", "--no-profile", "--out", str(out)]
    )
    results = json.loads((out / "results.json").read_text())
    assert "llama" in results["methods_skipped"]["mtp"]


def test_a_hybrid_target_runs_and_skips_what_mlx_lm_cannot_rewind(
    checkpoints, tmp_path
):
    if "qwen3_next-near" not in checkpoints:
        pytest.skip("no hybrid test checkpoints in this version")
    out = tmp_path / "out"
    bench.main(
        ["--model", str(checkpoints["qwen3_next"])]
        + ["--draft-model", str(checkpoints["qwen3_next-near"])]
        + ["--methods", "mlx_lm", "mlx_lm_speculative", "draft"]
        + [*TINY_CHAT, "--max-tokens", "6", "--no-profile", "--out", str(out)]
    )
    results = json.loads((out / "results.json").read_text())
    # mlx-lm's speculative mode cannot trim recurrent caches: skipped, with why.
    assert "mlx_lm_speculative" in results["methods_skipped"]
    draft = [r for r in results["rows"] if r["method"] == "draft"]
    assert draft and all(r["greedy_identical"] == 1.0 for r in draft)
    assert results["bare_forward_s"]["target"]


@pytest.mark.parametrize("named", [False, True])
def test_quick_runs_the_slowest_methods_greedy_unless_they_are_named(named):
    settings = dict(
        quick=True,
        temps=[0.0, 0.7],
        num_draft_tokens=4,
        sweep_temps=[0.0],
        gamma_sweep=[],
        methods_named=named,
    )
    configs = bench._configs(["mlx_lm", "draft", "tree"], settings)
    tree_temps = {c.temp for c in configs if c.method == "tree"}
    assert tree_temps == ({0.0, 0.7} if named else {0.0})
    assert {c.temp for c in configs if c.method == "draft"} == {0.0, 0.7}


def test_batch_benchmark_compares_every_batched_method_with_mlx_lm(
    checkpoints, tmp_path, capsys
):
    from mlx_spec.bench import batch

    out = tmp_path / "batch.json"
    argv = ["--model", str(checkpoints["llama"])]
    argv += ["--draft-model", str(checkpoints["llama-near"]), "--batch-sizes", "3"]
    argv += ["--max-tokens", "6", "--repeats", "1", "--json", str(out)]
    rows = batch.main(argv)
    assert [r["method"] for r in rows] == ["mlx_lm", "none", "lookup", "draft", "auto"]
    assert all(r["identical"] for r in rows)
    assert rows[0]["speedup"] == 1.0 and all(r["tokens_per_s"] > 0 for r in rows)
    assert json.loads(out.read_text())["rows"] == rows
    assert "| 3 | auto |" in capsys.readouterr().out


def test_batch_benchmark_refuses_a_bad_model_in_one_line(tmp_path, capsys):
    from mlx_spec.bench import batch

    with pytest.raises(SystemExit) as stop:
        batch.main(["--model", str(tmp_path / "missing")])
    assert stop.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_batch_benchmark_samples_with_temp_and_leaves_identity_open(checkpoints):
    from mlx_spec.bench import batch

    argv = ["--model", str(checkpoints["llama"]), "--batch-sizes", "2"]
    argv += ["--max-tokens", "5", "--repeats", "1", "--temp", "0.8"]
    rows = batch.main([*argv, "--methods", "lookup"])
    assert [r["method"] for r in rows] == ["mlx_lm", "lookup"]
    assert all(r["identical"] is None and r["tokens_per_s"] > 0 for r in rows)
