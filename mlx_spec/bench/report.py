"""Reporting: a benchmark's results as JSON and as a Markdown report.

The Markdown report holds the settings, the loud warnings, the headline, the
tables over all prompts, per prompt set and of the γ sweep, the bare forwards
and the labelled projection. The charts are drawn by :mod:`mlx_spec.bench.plots`.
"""

import json
import math
from pathlib import Path
from typing import List, Optional, Sequence

from ..outdir import staged_file
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


def _pct(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if value < 0.1 else f"{100 * value:.0f}%"


def _same(row: dict) -> str:
    same = row.get("greedy_identical")
    return _fmt(same) + (" **≠**" if same is not None and same < 1 else "")


def _label(row: dict) -> str:
    """Method, with ``(fixed)`` for a γ-sweep row with adaptive control off."""
    return row["method"] + (" (fixed)" if row.get("fixed") else "")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(names: Sequence[str]) -> List[str]:
    return [_row(names), "|" + "---|" * len(names)]


def _geo(row: dict, name: str):
    """The geometric mean over prompt sets, else the value over all prompts."""
    value = row.get(f"{name}_geomean")
    return row.get(name) if value is None and not row.get("prompt_sets") else value


def _table(rows: Sequence[dict], columns: Sequence[tuple]) -> List[str]:
    """A Markdown table: ``columns`` are ``(header, cell of a row)`` pairs."""
    lines = _head([name for name, _ in columns])
    return lines + [_row([cell(r) for _, cell in columns]) for r in rows]


def _value(name: str, digits: int = 2):
    """The column cell of ``row[name]`` (``None`` when missing)."""
    return lambda r: _fmt(r.get(name), digits)


def _geomean(name: str):
    """The column cell of :func:`_geo`'s value of ``name``."""
    return lambda r: _fmt(_geo(r, name))


def _share(name: str):
    """The column cell of a time share (``draft``, ``verify`` or ``host``)."""
    return lambda r: _pct(r.get(f"{name}_time_share"))


# Columns the tables share.
_TEMP = ("temp", _value("temp", 1))
_GAMMA = ("γ", _gamma)
_DECODE = ("decode tok/s", _value("decode_tokens_per_s", 1))
_ACCEPTANCE = ("acceptance", _value("acceptance_rate"))
_SHARES = tuple((name, _share(name)) for name in ("draft", "verify", "host"))
_SAME = ("greedy = mlx_lm", _same)
_RATIOS = (
    ("× mlx_lm", "speedup_vs_plain"),
    ("× mlx_lm spec", "speedup_vs_mlx_lm_speculative"),
    ("tokens/target fwd", "tokens_per_target_forward"),
    ("per-token acc.", "per_token_acceptance"),
)


def _main_table(rows: Sequence[dict]) -> List[str]:
    """Rows over all prompts: ratios as geometric means over the prompt sets."""
    ratios = [(name, _geomean(key)) for name, key in _RATIOS]
    e2e = ("× mlx_lm e2e", _geomean("speedup_vs_plain_e2e"))
    columns = [("method", _label), _TEMP, _GAMMA, _DECODE]
    columns += [("e2e tok/s", _value("tokens_per_s", 1)), *ratios[:2], e2e]
    columns += [*ratios[2:], _ACCEPTANCE, *_SHARES]
    columns += [
        ("overhead", _value("overhead")),
        ("peak GB", _value("peak_memory_gb", 3)),
    ]
    columns += [("+MB", lambda r: _fmt(_mb(r.get("memory_increase_gb")), 1)), _SAME]
    return _table(rows, columns)


def _set_table(rows: Sequence[dict]) -> List[str]:
    """Rows of one prompt set each: paired medians over the set's blocks."""
    ratios = [(name, _value(key)) for name, key in _RATIOS]
    columns = [("prompts", _value("prompt_set")), ("method", _label), _TEMP, _GAMMA]
    return _table(rows, columns + [_DECODE, *ratios, _ACCEPTANCE, *_SHARES, _SAME])


def _position_table(rows: Sequence[dict]) -> List[str]:
    """Acceptance by draft position, for the rows that drafted."""
    drafted = [
        r
        for r in rows
        if any(v is not None for v in r.get("acceptance_by_position") or [])
    ]
    if not drafted:
        return []
    width = max(
        max((i + 1 for i, v in enumerate(r["acceptance_by_position"]) if v is not None))
        for r in drafted
    )
    lines = _head(
        ["prompts", "method", "temp", "γ"] + [str(k) for k in range(1, width + 1)]
    )
    for r in drafted:
        values = r["acceptance_by_position"][:width]
        lines.append(
            _row(
                [r["prompt_set"], _label(r), _fmt(r["temp"], 1), _gamma(r)]
                + [_fmt(v) for v in values]
            )
        )
    return lines


def _cost_table(rows: Sequence[dict]) -> List[str]:
    """The round cost model each mlx-spec method measured while it ran."""
    measured = [r for r in rows if r.get("target_step_ms") is not None]
    if not measured:
        return []
    lines = _head(
        ["prompts", "method", "temp", "draft step", "verify 2", "verify 4"]
        + ["verify 8", "1-token step ms"]
    )
    for r in measured:
        cells = [r["prompt_set"], _label(r), _fmt(r["temp"], 1)]
        cells += [_fmt(r[k]) for k in ("draft_step_cost", "verify_cost_2")]
        cells += [_fmt(r[k]) for k in ("verify_cost_4", "verify_cost_8")]
        lines.append(_row(cells + [_fmt(r["target_step_ms"], 1)]))
    return lines


def _control(row: dict) -> str:
    """How a γ-sweep row set its draft length."""
    if row["method"] == "mlx_lm_speculative":
        return "–"
    return "fixed" if row.get("fixed") else "adaptive"


def _sweep_table(rows: Sequence[dict]) -> List[str]:
    ratios = [(name, _geomean(key)) for name, key in _RATIOS]
    columns = [("method", _value("method")), _TEMP, _GAMMA, ("control", _control)]
    return _table(rows, columns + [_DECODE, *ratios, _ACCEPTANCE, _SAME])


def _mb(gb: Optional[float]) -> Optional[float]:
    return None if gb is None else gb * 1e3


def accepted_anything(row: dict) -> bool:
    """Whether a row's method accepted any draft token (more than 1 token per round)."""
    return (row.get("tokens_per_target_forward") or 0.0) > NOTHING_ACCEPTED


def _headline(results: dict) -> List[str]:
    """Per temperature: the fastest mlx-spec method against both baselines.

    Only methods that accepted something compete: a method at 1.00 tokens per
    target forward is plain decoding, whatever its timing says. Methods are
    ranked by their geometric-mean speedup over the prompt sets.
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
            and _geo(r, "speedup_vs_plain") is not None
        ]
        if not spec:
            lines.append(f"- temp {temp:g}: no mlx-spec method accepted a draft token")
            continue
        best = max(spec, key=lambda r: _geo(r, "speedup_vs_plain"))
        lines.append(
            f"- temp {temp:g}: best mlx-spec method **{best['method']}** "
            f"({_fmt(best.get('decode_tokens_per_s'), 1)} decode tokens/s, "
            f"{_fmt(_geo(best, 'tokens_per_target_forward'))} tokens per target "
            f"forward): **{_fmt(_geo(best, 'speedup_vs_plain'))}× mlx_lm**, "
            f"{_fmt(_geo(best, 'speedup_vs_mlx_lm_speculative'))}× mlx_lm speculative "
            f"(decode, paired, geometric mean over prompt sets; end to end "
            f"{_fmt(_geo(best, 'speedup_vs_plain_e2e'))}× mlx_lm), overhead "
            f"{_fmt(best['overhead'])}"
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


def _goals(results: dict) -> List[str]:
    goals = results.get("goals") or []
    if not goals:
        return []
    issues = [str(i) for i in sorted({g["issue"] for g in goals})]
    named = " and ".join([", ".join(issues[:-1]), issues[-1]] if issues[1:] else issues)
    lines = ["", f"## Goals (issue{'s' if issues[1:] else ''} {named})", ""]
    lines += _head(["issue", "goal", "measured", "status", "detail"])
    for g in goals:
        status = {"met": "**met**", "missed": "**missed**"}.get(
            g["status"], g["status"]
        )
        if g.get("shortfall") is not None:
            status += f" ({100 * g['shortfall']:.0f}% of the goal)"
        lines.append(
            _row(
                [
                    str(g["issue"]),
                    g["goal"],
                    _fmt(g["measured"]),
                    status,
                    g["detail"],
                ]
            )
        )
    lines += [
        "",
        "Measured in this run only; a goal whose method, temperature or prompt set "
        'did not run is "not run". Speedups are decode-only, paired, geometric '
        "means over the prompt sets (benchmarks/README.md).",
    ]
    return lines


def _warnings(results: dict) -> List[str]:
    warnings = results.get("warnings") or []
    if not warnings:
        return []
    lines = ["", "## ⚠️ WARNINGS", ""]
    lines += [f"> **WARNING: {w}**" + "\n>" for w in warnings]
    return lines


def _samples(results: dict, limit: int = 240) -> List[str]:
    samples = results.get("samples_mlx_lm_greedy") or {}
    if not samples:
        return []
    lines = ["", "## Greedy outputs of plain mlx_lm (first repeat)", ""]
    for name, text in samples.items():
        short = " ".join(text.split())
        short = short[:limit] + ("…" if len(short) > limit else "")
        lines.append(f"- `{name}`: {short}")
    return lines


def markdown(results: dict) -> str:
    """The Markdown report: settings, goals, the tables, bare forwards, projection."""
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
    for method, path in (models.get("method_drafts") or {}).items():
        lines.append(f"- drafter of {method}: `{path}`")
    suite = "chat template" if s.get("chat_template") else "raw text, no chat template"
    sets = ", ".join(s.get("prompt_sets") or [])
    lines += [
        f"- machine: {m['platform']}, {m['cpu_count']} CPUs, {m['device']}, BLAS: {m['blas']}",
        f"- versions: mlx {m['mlx']}, mlx-lm {m['mlx_lm']}, mlx-spec {m['mlx_spec']}"
        + (f" (commit {m['git_commit']})" if m.get("git_commit") else ""),
        f"- {len(s['prompts'])} prompts ({sets}; {suite}) × {s['repeats']} repeat(s)"
        + (f" × {s['draws']} draws when sampling" if s.get("draws", 1) > 1 else "")
        + ", "
        f"{s['max_tokens']} tokens each, warm-up {s['warmup']}, seed {s['seed']}"
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
    lines += _goals(results)
    lines += ["", "## Headline", ""]
    lines += _headline(results)
    lines += ["", "## All prompt sets (geometric mean over sets)", ""]
    lines += _main_table(main_rows(results))
    lines += [
        "",
        "× mlx_lm: paired decode-only speedup over plain mlx_lm (per block of one "
        "prompt, repeat, temperature and draw, over the mean of the block's two mlx_lm "
        "runs; median over a set's blocks), then the geometric mean over the prompt "
        "sets; × mlx_lm spec pairs with mlx-lm's speculative mode at the same γ. "
        "decode tok/s, e2e tok/s and acceptance are pooled over all prompts. "
        "draft / verify / host: shares of the decode time, from a separate profiled "
        "pass. overhead: median over rounds of the round time / the bare forward "
        "cost of its draft steps and verification (plain mlx_lm ≈ 1.00 is the "
        "calibration). See benchmarks/README.md.",
    ]
    main_gamma = s["num_draft_tokens"]
    per_set = [
        r
        for r in results["rows"]
        if r["prompt_set"] != ALL_PROMPTS
        and r["gamma"] in (None, main_gamma)
        and not r.get("fixed")
    ]
    if per_set:
        lines += ["", "## By prompt set", ""]
        per_set.sort(key=lambda r: (r["prompt_set"], r["temp"]))
        lines += _set_table(per_set)
    positions = [
        r
        for r in results["rows"]
        if r["gamma"] in (None, main_gamma) and not r.get("fixed")
    ]
    table = _position_table(positions)
    if table:
        lines += [
            "",
            "## Acceptance by draft position",
            "",
            "Column k: the share of rounds that accepted draft token k among those "
            "that drafted it and accepted the k - 1 before it (trees: depth k).",
            "",
        ]
        lines += table
    table = _cost_table(positions)
    if table:
        lines += [
            "",
            "## Cost model measured online",
            "",
            "What each method's engine measured from its own rounds (medians over "
            "runs), in 1-token target forwards: a draft step of its most used arm, "
            "and a target forward of 2, 4 and 8 tokens. Greedy rows are wall time; "
            "sampled rows show the fixed model the engine prices them with.",
            "",
        ]
        lines += table
    sweep = sweep_rows(results)
    if len({r["gamma"] for r in sweep}) > 1:
        lines += ["", "## Draft length sweep (draft, mlx_lm_speculative)", ""]
        lines += _sweep_table(
            sorted(
                sweep,
                key=lambda r: (r["temp"], r["method"], r["gamma"], r.get("fixed")),
            )
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
    lines += _samples(results)
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


# The files of a run in its --out folder (and the charts, see write_charts).
RESULTS_JSON, RESULTS_MD = "results.json", "results.md"


def is_results_json(path: Path) -> bool:
    """``path`` holds the results of a benchmark run (so a new run may replace it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"rows", "definitions"} <= data.keys()


def write_outputs(results: dict, out: Path, *, charts: bool = True) -> List[Path]:
    """Write ``results.json``, ``results.md`` and the charts into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / RESULTS_JSON
    with staged_file(json_path) as work:
        work.write_text(json.dumps(_clean(results), indent=2, allow_nan=False) + "\n")
    md_path = out / RESULTS_MD
    with staged_file(md_path) as work:
        work.write_text(markdown(results))
    written = [json_path, md_path]
    if charts:
        written += write_charts(results, out)
    return written
