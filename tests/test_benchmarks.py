"""The benchmark harness runs end to end on the tiny test checkpoints.

Nothing here asserts on speed: timings on a shared CPU are noise at this size.
"""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from benchmarks import run as bench
from benchmarks.prompts import PROMPT_SETS, PROMPTS, prompt_suite

REPO = Path(__file__).resolve().parent.parent


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_results(checkpoints, tmp_path_factory):
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
        "--model",
        str(checkpoints["llama"]),
        "--draft-model",
        str(checkpoints["llama-near"]),
        "--quick",
        "--max-tokens",
        "4",
        "--repeats",
        "1",
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
        missing = [k for k in bench.REQUIRED_ROW_KEYS if k not in row]
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
        if row["method"] in bench.PLAIN_METHODS:
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
    assert {"mlx_lm", "mlx_lm_speculative", "none", "draft"} <= methods
    assert {r["temp"] for r in rows} == {0.0, 0.7}
    assert {r["prompt_set"] for r in rows} == {"all", *PROMPT_SETS}
    assert {r["gamma"] for r in rows if r["method"] == "draft"} == {2, 4}


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
    assert "Draft length sweep" in md
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
    out = bench.project(rows, curves, pair_draft_ratio=None)
    assert [p["target_shape"] for p in out] == ["big"]
    (p,) = out
    assert p["kind"] == "projected"
    t_verify = 0.11 + (5 - 4) / (8 - 4) * (0.15 - 0.11)
    assert p["projected_speedup"] == pytest.approx(3.0 * 0.1 / (4 * 0.01 + t_verify))


def test_bad_settings_exit_with_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--max-tokens", "0", "--no-progress"])
    assert e.value.code == 2
    assert "--max-tokens=0" in capsys.readouterr().err


def test_prompt_suite_comes_from_held_out_modules():
    path = REPO / "models" / "data.py"
    if not path.exists():
        pytest.skip("models/data.py is not there")
    spec = importlib.util.spec_from_file_location("_models_data", path)
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    assert {p.module for p in PROMPTS} <= set(data.HELDOUT_MODULES)
    assert len({p.name for p in PROMPTS}) == len(PROMPTS)
    assert [p.prompt_set for p in prompt_suite(quick=True)] == list(PROMPT_SETS)
