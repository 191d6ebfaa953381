"""HTML for the app: coloured tokens, the legend, statistics and the round chart.

Pure functions of plain data, so they are easy to test and cheap to call on
every streamed update. Everything user-provided goes through ``html.escape``.
"""

import html
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

KINDS = ("accepted", "recovered", "bonus", "target")

KIND_HELP = {
    "accepted": "drafted by the small model and kept by the target",
    "recovered": "the target's own token after it rejected a draft (hover for the rejected draft)",
    "bonus": "a free extra token from the target when every draft token was kept",
    "target": "plain decoding: one target forward per token",
}

MAX_CHART_ROUNDS = 160
MIN_CHART_SLOTS = 48  # so that a few rounds do not make giant bars

CSS = """
.spec-header h1 { margin: 0; font-size: 1.9rem; letter-spacing: -0.02em; }
.spec-header p { margin: 0.2rem 0 0; opacity: 0.75; }
.spec-transcript { min-height: 320px; }
.spec-empty { opacity: 0.6; padding: 2.5rem 1rem; text-align: center; line-height: 1.6; }
.spec-turn { margin: 0 0 0.9rem; }
.spec-role { font-size: 0.72rem; text-transform: uppercase; letter-spacing: 0.06em;
  opacity: 0.6; margin-bottom: 0.15rem; }
.spec-user { white-space: pre-wrap; padding: 0.45rem 0.7rem; border-radius: 8px;
  background: rgba(127, 127, 127, 0.12); }
.spec-text { white-space: pre-wrap; word-break: break-word; line-height: 1.65;
  font-size: 0.92rem; }
.spec-mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.spec-prompt { opacity: 0.55; }
.tok { border-radius: 3px; position: relative; }
.tok-accepted { background: rgba(34, 197, 94, 0.28); }
.tok-accepted.odd { background: rgba(34, 197, 94, 0.16); }
.tok-recovered { background: rgba(249, 115, 22, 0.38); cursor: help; }
.tok-bonus { background: rgba(59, 130, 246, 0.32); }
.tok-bonus.odd { background: rgba(59, 130, 246, 0.22); }
.tok-target { background: transparent; }
.tok-recovered:hover::after { content: attr(data-rejected); position: absolute; left: 0;
  top: 1.55em; z-index: 20; white-space: pre; font-size: 0.78rem; padding: 0.3rem 0.5rem;
  border-radius: 6px; background: #1f2937; color: #f9fafb; pointer-events: none;
  box-shadow: 0 4px 14px rgba(0, 0, 0, 0.25); }
.spec-end { font-size: 0.75rem; opacity: 0.6; margin-left: 0.4rem; font-style: italic; }
.spec-legend { display: flex; flex-wrap: wrap; gap: 0.35rem 1.1rem; font-size: 0.82rem;
  align-items: center; }
.spec-legend .swatch { display: inline-block; width: 0.95em; height: 0.95em;
  border-radius: 3px; vertical-align: -0.12em; margin-right: 0.3em;
  border: 1px solid rgba(127, 127, 127, 0.35); }
.spec-legend .tip { opacity: 0.65; }
.spec-stats { display: grid; grid-template-columns: repeat(3, 1fr); gap: 0.5rem; }
.spec-stat { padding: 0.45rem 0.6rem; border-radius: 8px;
  background: rgba(127, 127, 127, 0.09); }
.spec-stat .v { font-size: 1.25rem; font-weight: 650; font-variant-numeric: tabular-nums; }
.spec-stat .k { font-size: 0.72rem; opacity: 0.7; }
.spec-sub { font-size: 0.78rem; opacity: 0.7; margin-top: 0.4rem; }
.spec-chart svg { width: 100%; height: 130px; display: block; }
.spec-chart .title { font-size: 0.8rem; opacity: 0.8; margin-bottom: 0.2rem; }
.spec-banner { padding: 0.5rem 0.75rem; border-radius: 8px; font-size: 0.88rem; }
.spec-banner.info { background: rgba(59, 130, 246, 0.12); }
.spec-banner.ok { background: rgba(34, 197, 94, 0.15); }
.spec-banner.warn { background: rgba(234, 179, 8, 0.18); }
.spec-banner.error { background: rgba(239, 68, 68, 0.16); }
.spec-banner code { font-size: 0.82rem; }
.spec-verdict { font-size: 1.05rem; }
.spec-verdict b.big { font-size: 1.6rem; }
"""


@dataclass
class Piece:
    """One generated token as the page shows it.

    Attributes:
        text: The text the streaming detokenizer released with this token
          (may be empty while a multi-byte character is incomplete).
        kind: ``"accepted"``, ``"recovered"``, ``"bonus"`` or ``"target"``.
        round: The verification round that emitted it.
        rejected: For a recovered token, the decoded draft tokens it replaced.
    """

    text: str
    kind: str = "target"
    round: int = 0
    rejected: str = ""


@dataclass
class Turn:
    """One exchange: the user's text (or the completion prompt) and the reply."""

    user: str
    pieces: List[Piece] = field(default_factory=list)
    finish: Optional[str] = None  # "stop", "length", "stopped" or "error"
    stats: Any = None  # the SpecStats once finished
    error: Optional[BaseException] = None
    _html: str = field(default="", repr=False)
    _rendered: int = field(default=0, repr=False)

    @property
    def reply(self) -> str:
        return "".join(p.text for p in self.pieces)

    def spans(self) -> str:
        """:func:`token_spans` of the pieces, rendering only the new ones."""
        if self._rendered > len(self.pieces):
            self._html, self._rendered = "", 0
        if self._rendered < len(self.pieces):
            self._html += token_spans(self.pieces[self._rendered :])
            self._rendered = len(self.pieces)
        return self._html


def _visible(text: str) -> str:
    """Draft text for a tooltip: whitespace made visible, kept short."""
    text = text.replace("\n", "\u21b5").replace("\t", "\u21e5")
    return text if len(text) <= 60 else text[:57] + "..."


def token_spans(pieces: Sequence[Piece]) -> str:
    """The reply as ``<span class="tok tok-KIND">`` elements, one per token."""
    out = []
    for p in pieces:
        if not p.text:
            continue
        kind = p.kind if p.kind in KINDS else "target"
        cls = f"tok tok-{kind}" + (" odd" if p.round % 2 else "")
        attrs = f'class="{cls}" data-round="{p.round}"'
        if kind == "recovered":
            tip = (
                f"draft proposed: {_visible(p.rejected)}"
                if p.rejected
                else "draft rejected"
            )
            attrs += f' data-rejected="{html.escape(tip, quote=True)}"'
        else:
            attrs += f' title="round {p.round}: {kind}"'
        out.append(f"<span {attrs}>{html.escape(p.text)}</span>")
    return "".join(out)


def _end_marker(finish: Optional[str]) -> str:
    labels = {
        "stop": "end of text",
        "length": "max tokens reached",
        "stopped": "stopped",
        "error": "failed",
    }
    if finish not in labels:
        return ""
    return f'<span class="spec-end">[{labels[finish]}]</span>'


def transcript_html(
    turns: Sequence[Turn],
    chat: bool,
    mono: bool = False,
    *,
    prompt: bool = True,
    streaming: bool = False,
) -> str:
    """The conversation (chat) or the prompt and its continuation (completion).

    Args:
        turns: The turns to show; the last one may still be generating.
        chat: Show "you" / "model" turns (else the prompt and its continuation).
        mono: Set the text in a monospace font (for code).
        prompt: Show the completion prompt before the continuation.
        streaming: Leave the last reply's tags open (the browser closes them),
          so that each update only appends to the previous one and Gradio
          sends just the new tokens.
    """
    font = " spec-mono" if mono else ""
    if not turns:
        if chat:
            hint = "Type a message below and press <b>Send</b>."
        else:
            hint = "Type the start of a text (or code) below and press <b>Generate</b>."
        return (
            '<div class="spec-transcript"><div class="spec-empty">'
            f"{hint}<br>Each token is coloured by where it came from.</div></div>"
        )
    parts = ['<div class="spec-transcript">']
    for turn in turns:
        if chat:
            parts.append(
                '<div class="spec-turn"><div class="spec-role">you</div>'
                f'<div class="spec-user">{html.escape(turn.user)}</div></div>'
                '<div class="spec-turn"><div class="spec-role">model</div>'
                f'<div class="spec-text{font} spec-reply">'
            )
        else:
            shown = (
                f'<span class="spec-prompt">{html.escape(turn.user)}</span>'
                if prompt
                else ""
            )
            parts.append(
                f'<div class="spec-turn"><div class="spec-text{font} spec-reply">{shown}'
            )
        parts.append(turn.spans())
        if not (streaming and turn is turns[-1]):
            parts.append(_end_marker(turn.finish) + "</div></div>")
    if not streaming:
        parts.append("</div>")
    return "".join(parts)


def legend_html() -> str:
    """Swatches for the four token origins, with one-line explanations."""
    colours = {
        "accepted": "rgba(34, 197, 94, 0.28)",
        "recovered": "rgba(249, 115, 22, 0.38)",
        "bonus": "rgba(59, 130, 246, 0.32)",
        "target": "transparent",
    }
    items = [
        f'<span title="{html.escape(KIND_HELP[k], quote=True)}">'
        f'<span class="swatch" style="background:{colours[k]}"></span><b>{k}</b> '
        f'<span class="tip">{html.escape(KIND_HELP[k])}</span></span>'
        for k in KINDS
    ]
    return f'<div class="spec-legend">{"".join(items)}</div>'


def _fmt(value: Optional[float], digits: int = 1, suffix: str = "") -> str:
    return "&ndash;" if value is None else f"{value:.{digits}f}{suffix}"


def stats_html(stats, *, reused: int = 0, elapsed: Optional[float] = None) -> str:
    """Live statistics cards from a :class:`mlx_spec.SpecStats` (or ``None``)."""
    if stats is None:
        cards = [
            ("&ndash;", k)
            for k in (
                "tokens/s",
                "acceptance",
                "tokens / target forward",
                "rounds",
                "tokens",
                "target forwards",
            )
        ]
        sub = "Statistics appear as soon as the first round is verified."
    else:
        plain = stats.method == "none"
        cards = [
            (_fmt(stats.generation_tps), "tokens/s"),
            (
                "&ndash;" if plain else _fmt(100 * stats.acceptance_rate, 0, "%"),
                "acceptance",
            ),
            (_fmt(stats.tokens_per_target_forward, 2), "tokens / target forward"),
            (str(stats.rounds), "rounds"),
            (str(stats.generated_tokens), "tokens"),
            (str(stats.target_forwards), "target forwards"),
        ]
        sub = f"method <b>{html.escape(stats.method)}</b>"
        if not plain:
            sub += (
                f" &middot; &gamma; = {stats.num_draft_tokens} &middot; "
                f"{stats.accepted_tokens}/{stats.draft_tokens} draft tokens kept"
            )
        sub += f" &middot; prompt {stats.prompt_tokens} new tokens"
        if reused:
            sub += f" + {reused} reused from the cache"
        if elapsed is not None:
            sub += f" &middot; {elapsed:.1f} s"
    body = "".join(
        f'<div class="spec-stat"><div class="v">{v}</div><div class="k">{k}</div></div>'
        for v, k in cards
    )
    return f'<div class="spec-stats">{body}</div><div class="spec-sub">{sub}</div>'


def chart_svg(accepted: Sequence[int], drafted: Sequence[int] = ()) -> str:
    """A bar chart of accepted draft tokens per round, drafted tokens as outlines.

    Rounds where every draft token was kept (and a bonus token followed) are
    drawn in blue. Only the last ``MAX_CHART_ROUNDS`` rounds are drawn.
    """
    title = "Accepted draft tokens per round"
    if not accepted:
        return (
            f'<div class="spec-chart"><div class="title">{title}</div>'
            '<div class="spec-sub">The chart fills in as rounds are verified '
            "(speculative methods only).</div></div>"
        )
    start = max(0, len(accepted) - MAX_CHART_ROUNDS)
    acc = list(accepted[start:])
    drf = list(drafted[start:]) if len(drafted) >= len(accepted) else [0] * len(acc)
    top = max(max(acc), max(drf), 1)
    width, height, pad = 600, 120, 14
    slot = width / max(len(acc), MIN_CHART_SLOTS)
    bar = max(slot * 0.78, 0.6)
    scale = (height - pad - 2) / top
    rects = []
    for i, (a, d) in enumerate(zip(acc, drf)):
        x = i * slot + (slot - bar) / 2
        if d:
            h = d * scale
            rects.append(
                f'<rect x="{x:.2f}" y="{height - pad - h:.2f}" width="{bar:.2f}" '
                f'height="{h:.2f}" fill="none" stroke="rgba(127,127,127,0.45)" '
                'stroke-width="0.8"/>'
            )
        if a:
            h = a * scale
            full = d and a >= d
            colour = "rgba(59,130,246,0.85)" if full else "rgba(34,197,94,0.85)"
            rects.append(
                f'<rect x="{x:.2f}" y="{height - pad - h:.2f}" width="{bar:.2f}" '
                f'height="{h:.2f}" fill="{colour}"><title>round {start + i}: '
                f"{a}/{d} accepted</title></rect>"
            )
    mean = sum(accepted) / len(accepted)
    y_mean = height - pad - mean * scale
    grid = "".join(
        f'<line x1="0" x2="{width}" y1="{height - pad - k * scale:.2f}" '
        f'y2="{height - pad - k * scale:.2f}" stroke="rgba(127,127,127,0.15)"/>'
        f'<text x="2" y="{height - pad - k * scale - 2:.2f}" font-size="9" '
        f'fill="currentColor" opacity="0.5">{k}</text>'
        for k in range(1, top + 1)
    )
    shown = (
        f"last {len(acc)} of {len(accepted)} rounds" if start else f"{len(acc)} rounds"
    )
    svg = (
        f'<svg viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{title}">{grid}{"".join(rects)}'
        f'<line x1="0" x2="{width}" y1="{y_mean:.2f}" y2="{y_mean:.2f}" '
        'stroke="rgba(249,115,22,0.9)" stroke-dasharray="4 3" stroke-width="1.2"/>'
        f'<text x="{width - 4}" y="{height - 2}" font-size="9" text-anchor="end" '
        f'fill="currentColor" opacity="0.6">{shown}</text></svg>'
    )
    return (
        f'<div class="spec-chart"><div class="title">{title} '
        f"(mean {mean:.2f}, dashed; blue = all kept + bonus)</div>{svg}</div>"
    )


def banner(message: str, level: str = "info") -> str:
    """A coloured one-line message; ``level`` is info, ok, warn or error."""
    return f'<div class="spec-banner {level}">{message}</div>'


def error_banner(error: BaseException) -> str:
    """A readable error: the exception's message, without a traceback."""
    text = str(error).strip() or type(error).__name__
    if not isinstance(error, ValueError):
        text = f"{type(error).__name__}: {text}"
    return banner(f"<b>Error:</b> {html.escape(text)}", "error")


def first_difference(a: str, b: str) -> Optional[int]:
    """Index of the first differing character, or ``None`` if equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class Lane:
    """One side of a race, timed the same way for both sides.

    Attributes:
        method: The speculative method of the race.
        text: The generated text.
        decode_tps: Tokens per second after the first token.
        total: Seconds from the request to the last token, prompt included.
        tokens: Number of generated tokens.
    """

    method: str
    text: str
    decode_tps: float
    total: float
    tokens: int


MIN_RACE_TOKENS = 16


def race_verdict(plain: Lane, spec: Lane, greedy: bool) -> str:
    """The race result: measured speedup and, under greedy, whether texts agree."""
    if greedy:
        diff = first_difference(plain.text, spec.text)
        if diff is None:
            check = "&#10003; Greedy decoding: the two texts are <b>identical</b>."
        else:
            check = f"&#10007; The texts differ from character {diff} on."
    else:
        check = (
            "Sampling (temperature &gt; 0): the texts may differ, but both follow "
            "the target model's distribution exactly."
        )
    level = "error" if greedy and diff is not None else "ok"
    tokens = min(plain.tokens, spec.tokens)
    if tokens < MIN_RACE_TOKENS or plain.decode_tps <= 0 or spec.decode_tps <= 0:
        head = (
            f"Only {tokens} tokens were generated: too few to measure a speed. "
            "Raise max tokens, or try completion mode."
        )
        return banner(f"<div>{head}</div><div>{check}</div>", "warn")
    ratio = spec.decode_tps / plain.decode_tps
    wall = plain.total / spec.total if spec.total > 0 else 0.0
    head = (
        f'<div class="spec-verdict"><b class="big">{ratio:.2f}&times;</b> '
        f"{'faster' if ratio >= 1 else 'slower'} with <b>{html.escape(spec.method)}</b> "
        f"({spec.decode_tps:.1f} vs {plain.decode_tps:.1f} tokens/s after the first token; "
        f"{wall:.2f}&times; end to end: {spec.total:.2f} s vs {plain.total:.2f} s)</div>"
    )
    return banner(f"{head}<div>{check}</div>", level)
