"""Write a benchmark's results: JSON, a Markdown report and PNG charts."""

import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ALL_PROMPTS = "all"
BASELINES = ("mlx_lm", "mlx_lm_speculative")


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


def _main_rows(results) -> List[dict]:
    """Rows over all prompts at the main γ (the sweep's extra γ left out)."""
    main_gamma = results["settings"]["num_draft_tokens"]
    return [
        r
        for r in results["rows"]
        if r["prompt_set"] == ALL_PROMPTS and r["gamma"] in (None, main_gamma)
    ]


def _table(rows: Sequence[dict], with_set: bool = False) -> List[str]:
    head = (
        ["method", "temp", "γ"]
        + (["prompts"] if with_set else [])
        + [
            "tokens/s",
            "× mlx_lm",
            "× mlx_lm spec",
            "acceptance",
            "tokens/target fwd",
            "overhead",
            "peak GB",
            "greedy = mlx_lm",
        ]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["method"], _fmt(r["temp"], 1), _gamma(r)]
        if with_set:
            cells.append(r["prompt_set"])
        cells += [
            _fmt(r["tokens_per_s"], 1),
            _fmt(r["speedup_vs_plain"]),
            _fmt(r["speedup_vs_mlx_lm_speculative"]),
            _fmt(r["acceptance_rate"]),
            _fmt(r["tokens_per_target_forward"]),
            _fmt(r["overhead"]),
            _fmt(r["peak_memory_gb"], 3),
            _fmt(r["greedy_identical"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _headline(results: dict) -> List[str]:
    """Per temperature: the fastest mlx-spec method against both baselines."""
    rows = _main_rows(results)
    lines = []
    for temp in sorted({r["temp"] for r in rows}):
        spec = [
            r
            for r in rows
            if r["temp"] == temp
            and r["method"] not in BASELINES
            and r["method"] != "none"
        ]
        if not spec:
            continue
        best = max(spec, key=lambda r: r["tokens_per_s"])
        lines.append(
            f"- temp {temp:g}: fastest mlx-spec method **{best['method']}** "
            f"({_fmt(best['tokens_per_s'], 1)} tokens/s): "
            f"{_fmt(best['speedup_vs_plain'])}× mlx_lm, "
            f"{_fmt(best['speedup_vs_mlx_lm_speculative'])}× mlx_lm speculative, "
            f"overhead {_fmt(best['overhead'])}"
        )
    return lines or ["- no mlx-spec speculative method ran"]


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
        + (", quick mode" if s["quick"] else ""),
        f"- date: {m['date_utc']}",
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
    lines += ["", "## Headline", ""]
    lines += _headline(results)
    lines += ["", "## All prompts", ""]
    lines += _table(_main_rows(results))
    lines += [
        "",
        "tokens/s: generated tokens / wall time from the call to the last token (prompt "
        "processing included). × mlx_lm: speedup over plain mlx_lm at the same temperature. "
        "overhead: round time / bare forward times of the round's draft steps and "
        "verification, measured in this run (1.00 = no cost beyond the forwards).",
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
    sweep = [
        r
        for r in results["rows"]
        if r["prompt_set"] == ALL_PROMPTS and r["method"] == "draft"
    ]
    if len({r["gamma"] for r in sweep}) > 1:
        lines += ["", "## Draft length sweep (method draft)", ""]
        lines += _table(sorted(sweep, key=lambda r: (r["temp"], r["gamma"])))
    bare = results.get("bare_forward_s") or {}
    if bare:
        lines += [
            "",
            "## Bare forwards (this run)",
            "",
            f"Cache of {s['bare_forward_context']} tokens; mean of the samples taken "
            "between benchmark passes.",
            "",
            "| model | width | ms |",
            "|---|---|---|",
        ]
        for name, widths in bare.items():
            for w, t in sorted(widths.items(), key=lambda kv: int(kv[0])):
                lines.append(f"| {name} | {w} | {t * 1e3:.2f} |")
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


def write_charts(results: dict, out: Path) -> List[Path]:
    """PNG charts: tokens/s by method, speedup vs temperature, acceptance vs γ,
    and the cost curves when measured. Needs matplotlib; returns written paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    rows = _main_rows(results)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    temps = sorted({r["temp"] for r in rows})
    index = {(r["method"], r["temp"]): r for r in rows}

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(methods) + 2), 4))
    width = 0.8 / max(len(temps), 1)
    for i, t in enumerate(temps):
        xs = [j + i * width for j in range(len(methods))]
        ys = [index[(m, t)]["tokens_per_s"] if (m, t) in index else 0 for m in methods]
        ax.bar(xs, ys, width, label=f"temp {t:g}")
    ax.set_xticks([j + width * (len(temps) - 1) / 2 for j in range(len(methods))])
    ax.set_xticklabels(methods, rotation=20, ha="right")
    ax.set_ylabel("tokens/s (measured)")
    ax.set_title("Throughput by method")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, out / "tokens_per_s.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        pts = [
            (t, index[(m, t)]["speedup_vs_plain"])
            for t in temps
            if (m, t) in index and index[(m, t)]["speedup_vs_plain"] is not None
        ]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("temperature")
    ax.set_ylabel("speedup vs mlx_lm (measured)")
    ax.set_title("Speedup against temperature")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out / "speedup_vs_temp.png", plt))

    sweep = [
        r
        for r in results["rows"]
        if r["prompt_set"] == ALL_PROMPTS
        and r["acceptance_rate"] is not None
        and r["gamma"] is not None
        and r["method"] in ("draft", "mlx_lm_speculative")
    ]
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in ("draft", "mlx_lm_speculative"):
            for t in temps:
                pts = sorted(
                    (r["gamma"], r["acceptance_rate"])
                    for r in sweep
                    if r["method"] == m and r["temp"] == t
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        ls="-" if m == "draft" else ":",
                        label=f"{m}, temp {t:g}",
                    )
        ax.set_xlabel("γ (draft tokens per round)")
        ax.set_ylabel("acceptance rate (measured)")
        ax.set_ylim(0, 1.05)
        ax.set_title("Acceptance against γ")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out / "acceptance_vs_gamma.png", plt))

    curves = results.get("cost_curves") or {}
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, c in curves.items():
            base = c["forward_s"][0]
            ax.plot(
                c["widths"], [t / base for t in c["forward_s"]], marker="o", label=name
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per forward (verified width)")
        ax.set_ylabel("forward time / 1-token forward (measured)")
        ax.set_title("Cost curves, random-weight float32 models")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, out / "cost_curves.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
