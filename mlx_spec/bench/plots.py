"""Plotting: PNG charts of a benchmark's results (needs matplotlib).

Decode tokens/s by method, speedup against temperature, acceptance and
speedup against γ (from the sweep), and the cost curves when measured. Every
chart shows measured values only.
"""

from pathlib import Path
from typing import List

from ..outdir import staged_file
from .rows import main_rows, sweep_rows
from .runner import MLX_LM_SPECULATIVE, SWEEP_METHODS


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
    rows = main_rows(results)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    temps = sorted({r["temp"] for r in rows})
    index = {(r["method"], r["temp"]): r for r in rows}

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(methods) + 2), 4))
    width = 0.8 / max(len(temps), 1)
    for i, t in enumerate(temps):
        xs = [j + i * width for j in range(len(methods))]
        ys = [
            (index[(m, t)].get("decode_tokens_per_s") or 0) if (m, t) in index else 0
            for m in methods
        ]
        ax.bar(xs, ys, width, label=f"temp {t:g}")
    ax.set_xticks([j + width * (len(temps) - 1) / 2 for j in range(len(methods))])
    ax.set_xticklabels(methods, rotation=20, ha="right")
    ax.set_ylabel("decode tokens/s (measured)")
    ax.set_title("Decode throughput by method")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, out / "tokens_per_s.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        pts = [
            (t, _speedup(index[(m, t)]))
            for t in temps
            if (m, t) in index and _speedup(index[(m, t)]) is not None
        ]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("temperature")
    ax.set_ylabel("decode speedup vs mlx_lm (measured, geomean over sets)")
    ax.set_title("Speedup against temperature")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out / "speedup_vs_temp.png", plt))

    # Fixed-γ rows only: the adaptive default of draft is no point of the sweep.
    sweep = [
        r
        for r in sweep_rows(results)
        if r["acceptance_rate"] is not None
        and (r.get("fixed") or r["method"] == MLX_LM_SPECULATIVE)
    ]
    if sweep:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        # A series of one γ is a lone dot: left out when some series sweeps γ.
        swept = len({(r["method"], r["temp"], r["gamma"]) for r in sweep}) > len(
            {(r["method"], r["temp"]) for r in sweep}
        )
        for m in SWEEP_METHODS:
            for t in temps:
                pts = sorted(
                    (r["gamma"], r["acceptance_rate"], _speedup(r))
                    for r in sweep
                    if r["method"] == m and r["temp"] == t
                )
                if not pts or (swept and len(pts) < 2):
                    continue
                style = dict(
                    marker="o",
                    ls="-" if m == "draft" else ":",
                    label=f"{m}, temp {t:g}",
                )
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
                speed = [(g, x) for g, _, x in pts if x is not None]
                ax2.plot([p[0] for p in speed], [p[1] for p in speed], **style)
        ax.set_xlabel("γ (draft tokens per round)")
        ax.set_ylabel("acceptance rate (measured)")
        ax.set_ylim(0, 1.05)
        ax.set_title("Acceptance against γ")
        ax.legend(fontsize=8)
        ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax2.set_xlabel("γ (draft tokens per round)")
        ax2.set_ylabel("decode speedup vs mlx_lm (measured)")
        ax2.set_title("Speedup against γ")
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


def _speedup(row: dict):
    """Geometric mean over the prompt sets, else the median over all prompts."""
    value = row.get("speedup_vs_plain_geomean")
    return row["speedup_vs_plain"] if value is None else value


def _save(fig, path: Path, plt) -> Path:
    with staged_file(path) as work:
        fig.savefig(work, dpi=110)
    plt.close(fig)
    return path
