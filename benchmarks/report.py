"""Reporting: a benchmark's results as JSON and as a Markdown report.

The Markdown report holds the settings, the loud warnings, the headline, the
tables over all prompts, per prompt set and of the γ sweep, the bare forwards
and the labelled projection. The charts are drawn by :mod:`benchmarks.plots`.
"""

import json
import math
from pathlib import Path
from typing import List, Optional, Sequence

from .plots import write_charts
from .rows import ALL_PROMPTS, NOTHING_ACCEPTED, main_rows, sweep_rows
from .runner import BASELINES


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}{suffix}"
    return str(value)


def _gamma(row) -> str:
    return "–" if row["gamma"] is None else str(row["gamma"])


def _table(rows: Sequence[dict], with_set: bool = False) -> List[str]:
    head = (
        ["method", "temp", "γ"]
        + (["prompts"] if with_set else [])
        + [
            "decode tok/s",
            "e2e tok/s",
            "× mlx_lm",
            "× mlx_lm e2e",
            "× mlx_lm spec",
            "acceptance",
            "tokens/target fwd",
            "overhead",
            "peak GB",
            "+MB",
            "greedy = mlx_lm",
        ]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["method"], _fmt(r["temp"], 1), _gamma(r)]
        if with_set:
            cells.append(r["prompt_set"])
        same = r["greedy_identical"]
        cells += [
            _fmt(r.get("decode_tokens_per_s"), 1),
            _fmt(r["tokens_per_s"], 1),
            _fmt(r["speedup_vs_plain"]),
            _fmt(r.get("speedup_vs_plain_e2e")),
            _fmt(r["speedup_vs_mlx_lm_speculative"]),
            _fmt(r["acceptance_rate"]),
            _fmt(r["tokens_per_target_forward"]),
            _fmt(r["overhead"]),
            _fmt(r["peak_memory_gb"], 3),
            _fmt(_mb(r.get("memory_increase_gb")), 1),
            _fmt(same) + (" **≠**" if same is not None and same < 1 else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _mb(gb: Optional[float]) -> Optional[float]:
    return None if gb is None else gb * 1e3


def accepted_anything(row: dict) -> bool:
    """Whether a row's method accepted any draft token (more than 1 token per round)."""
    return (row.get("tokens_per_target_forward") or 0.0) > NOTHING_ACCEPTED


def _headline(results: dict) -> List[str]:
    """Per temperature: the fastest mlx-spec method against both baselines.

    Only methods that accepted something compete: a method at 1.00 tokens per
    target forward is plain decoding, whatever its timing says.
    """
    rows = main_rows(results)
    lines = []
    for temp in sorted({r["temp"] for r in rows}):
        spec = [
            r
            for r in rows
            if r["temp"] == temp
            and r["method"] not in BASELINES
            and r["method"] != "none"
            and accepted_anything(r)
            and r["speedup_vs_plain"] is not None
        ]
        if not spec:
            lines.append(f"- temp {temp:g}: no mlx-spec method accepted a draft token")
            continue
        best = max(spec, key=lambda r: r["speedup_vs_plain"])
        lines.append(
            f"- temp {temp:g}: best mlx-spec method **{best['method']}** "
            f"({_fmt(best.get('decode_tokens_per_s'), 1)} decode tokens/s, "
            f"{_fmt(best['tokens_per_target_forward'])} tokens per target forward): "
            f"**{_fmt(best['speedup_vs_plain'])}× mlx_lm**, "
            f"{_fmt(best['speedup_vs_mlx_lm_speculative'])}× mlx_lm speculative "
            f"(decode, paired medians; end to end {_fmt(best.get('speedup_vs_plain_e2e'))}× "
            f"mlx_lm), overhead {_fmt(best['overhead'])}"
        )
    excluded = sorted(
        {
            r["method"]
            for r in rows
            if r["method"] not in BASELINES
            and r["method"] != "none"
            and not accepted_anything(r)
        }
    )
    if excluded:
        lines.append(
            "- not ranked (1.00 tokens per target forward, nothing accepted): "
            + ", ".join(excluded)
        )
    calibration = results.get("overhead_calibration") or {}
    if calibration:
        lines.append(
            "- overhead calibration, plain mlx_lm (should be ~1.00): "
            + ", ".join(f"temp {t}: {_fmt(v)}" for t, v in calibration.items())
        )
    if results.get("plain_drift") is not None:
        lines.append(
            f"- noise floor: the two mlx_lm runs of a block differ by "
            f"{100 * results['plain_drift']:.1f}% (median over blocks)"
        )
    return lines or ["- no mlx-spec speculative method ran"]


def _warnings(results: dict) -> List[str]:
    warnings = results.get("warnings") or []
    if not warnings:
        return []
    lines = ["", "## ⚠️ WARNINGS", ""]
    lines += [f"> **WARNING: {w}**" + "\n>" for w in warnings]
    return lines


def markdown(results: dict) -> str:
    """The Markdown report: settings, main table, per-set and γ tables, projection."""
    m, s, models = results["machine"], results["settings"], results["models"]
    lines = [
        "# mlx-spec benchmark",
        "",
        f"- target: `{models['target']}` ({models['target_params'] / 1e6:.2f}M params)",
    ]
    if models.get("draft"):
        lines.append(
            f"- draft: `{models['draft']}` ({models['draft_params'] / 1e6:.2f}M params)"
        )
    lines += [
        f"- machine: {m['platform']}, {m['cpu_count']} CPUs, {m['device']}, BLAS: {m['blas']}",
        f"- versions: mlx {m['mlx']}, mlx-lm {m['mlx_lm']}, mlx-spec {m['mlx_spec']}"
        + (f" (commit {m['git_commit']})" if m.get("git_commit") else ""),
        f"- {len(s['prompts'])} prompts × {s['repeats']} repeat(s), {s['max_tokens']} tokens "
        f"each, warm-up {s['warmup']}, seed {s['seed']}"
        + (f", γ sweep {s['gamma_sweep']}" if s.get("gamma_sweep") else "")
        + (", quick mode" if s["quick"] else ""),
        f"- date: {m['date_utc']}"
        + (f", {s['elapsed_s']:.0f} s" if s.get("elapsed_s") is not None else ""),
    ]
    if m.get("load_average_at_start"):
        lines.append(
            "- load average at start: "
            + ", ".join(f"{x:.2f}" for x in m["load_average_at_start"])
        )
    if results.get("methods_skipped"):
        lines.append(
            "- skipped: "
            + "; ".join(f"{k} ({v})" for k, v in results["methods_skipped"].items())
        )
    lines += _warnings(results)
    lines += ["", "## Headline", ""]
    lines += _headline(results)
    lines += ["", "## All prompts", ""]
    lines += _table(main_rows(results))
    lines += [
        "",
        "decode tok/s: tokens after the first round / time from the first token to the "
        "last. e2e tok/s: all tokens / time from the call (prompt processing included). "
        "× mlx_lm: paired speedup over plain mlx_lm, decode only: per block (prompt, "
        "repeat, temperature) over the mean of the block's two mlx_lm runs, median over "
        "blocks (× mlx_lm e2e: the same end to end). overhead: median over rounds of the "
        "round time / the bare forward cost of its draft steps and verification, measured "
        "in this run (plain mlx_lm ≈ 1.00 is the calibration). +MB: the run's peak memory "
        "over the active memory just before it. See benchmarks/README.md.",
    ]
    main_gamma = s["num_draft_tokens"]
    per_set = [
        r
        for r in results["rows"]
        if r["prompt_set"] != ALL_PROMPTS and r["gamma"] in (None, main_gamma)
    ]
    if per_set:
        lines += ["", "## By prompt set", ""]
        per_set.sort(key=lambda r: (r["prompt_set"], r["temp"]))
        lines += _table(per_set, with_set=True)
    sweep = sweep_rows(results)
    if len({r["gamma"] for r in sweep}) > 1:
        lines += ["", "## Draft length sweep (draft, mlx_lm_speculative)", ""]
        lines += _table(
            sorted(sweep, key=lambda r: (r["temp"], r["method"], r["gamma"]))
        )
    lines += _bare_section(results)
    if results.get("cost_curves"):
        lines += ["", "## Cost curves (random weights, measured)", ""]
        curves = results["cost_curves"]
        widths = next(iter(curves.values()))["widths"]
        lines.append(
            "| shape | params | " + " | ".join(f"w={w}" for w in widths) + " |"
        )
        lines.append("|" + "---|" * (len(widths) + 2))
        for name, c in curves.items():
            cells = [f"{t * 1e3:.0f}" for t in c["forward_s"]]
            lines.append(
                f"| {name} | {c['params'] / 1e9:.2f}B | " + " | ".join(cells) + " |"
            )
        lines.append("")
        lines.append("Milliseconds per forward of w tokens, float32, on this machine.")
    if results.get("projections"):
        lines += [
            "",
            "## PROJECTED speedups (not measurements)",
            "",
            "Measured tokens per target forward of the benchmarked pair, combined with the "
            "measured cost curves above: speedup = E·T(1) / (d·t_draft + T(w)), assuming zero "
            "implementation overhead and that a real pair of these sizes accepts as often as "
            "the benchmarked one.",
            "",
            "| target shape | draft cost | method | temp | γ | tokens/target fwd | "
            "PROJECTED speedup |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in results["projections"]:
            lines.append(
                f"| {p['target_shape']} | {p['draft_cost']} | {p['method']} | "
                f"{_fmt(p['temp'], 1)} | {_fmt(p['gamma'], 0)} | "
                f"{_fmt(p['measured_tokens_per_target_forward'])} | "
                f"{_fmt(p['projected_speedup'])} (projected) |"
            )
    return "\n".join(lines) + "\n"


def _bare_section(results: dict) -> List[str]:
    bare = results.get("bare_forward_s") or {}
    if not bare:
        return []
    s = results["settings"]
    fits = results.get("bare_forward_fit") or {}
    lines = [
        "",
        "## Bare forwards (this run)",
        "",
        f"Cache of {s['bare_forward_context']} tokens; each sample is the steady-state "
        f"time per forward of a chain of {s.get('bare_chain', 1)} pipelined forwards (as "
        "mlx_lm decodes), one taken after every run. The overhead prices a width with "
        "the medians (a + b·w between sampled neighbours); one line over all widths is "
        "shown for comparison.",
        "",
        "| model | width | median ms | one-line fit ms | samples |",
        "|---|---|---|---|---|",
    ]
    samples = results.get("bare_forward_samples_s") or {}
    for name, widths in bare.items():
        fit = fits.get(name)
        for w, t in sorted(widths.items(), key=lambda kv: int(kv[0])):
            fitted = fit["a_s"] + fit["b_s_per_token"] * int(w) if fit else None
            n = len(samples.get(name, {}).get(w, []))
            lines.append(
                f"| {name} | {w} | {t * 1e3:.2f} | {_fmt(_ms(fitted))} | {n} |"
            )
    for name, fit in fits.items():
        if fit:
            lines.append(
                f"\n{name}, one line: T(w) = {fit['a_s'] * 1e3:.3f} ms + "
                f"{fit['b_s_per_token'] * 1e3:.3f} ms × w (largest deviation from a "
                f"median: {100 * fit['max_rel_residual']:.0f}%)"
            )
    return lines


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e3


def _clean(value):
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_outputs(results: dict, out: Path, *, charts: bool = True) -> List[Path]:
    """Write ``results.json``, ``results.md`` and the charts into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    json_path.write_text(json.dumps(_clean(results), indent=2, allow_nan=False) + "\n")
    md_path = out / "results.md"
    md_path.write_text(markdown(results))
    written = [json_path, md_path]
    if charts:
        written += write_charts(results, out)
    return written
