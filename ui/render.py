"""HTML for the app: coloured tokens, the legend, statistics and the round chart.

Pure functions of plain data, so they are easy to test and cheap to call on
every streamed update. Everything user-provided goes through ``html.escape``.
"""

import html
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mlx_spec.engine import ACCEPTED, BONUS, RECOVERED, TARGET

# Where a token came from, as the engine names it.
KINDS = (ACCEPTED, RECOVERED, BONUS, TARGET)

KIND_HELP = {
    "accepted": "drafted by the small model and kept by the target",
    "recovered": "the target's own token after it rejected a draft (hover for the rejected draft)",
    "bonus": "a free extra token from the target when every draft token was kept",
    "target": "plain decoding: one target forward per token",
}

MAX_CHART_ROUNDS = 160
MIN_CHART_SLOTS = 48  # so that a few rounds do not make giant bars

CSS = """
.spec-header { display: flex; align-items: baseline; gap: 0.3rem 0.9rem; flex-wrap: wrap; }
.spec-header h1 { margin: 0; font-size: 1.35rem; letter-spacing: -0.02em; }
.spec-header p { margin: 0; opacity: 0.75; font-size: 0.85rem; }
#status:has(.prose:empty), #verdict:has(.prose:empty) { display: none; }
#mode-note .spec-banner { padding: 0.3rem 0.65rem; font-size: 0.84rem; }
.spec-transcript { min-height: 200px; }
.spec-turn-error { color: #b91c1c; font-size: 0.85rem; margin-top: 0.2rem; }
.spec-empty { opacity: 0.6; padding: 2rem 1rem; text-align: center; line-height: 1.6; }
.spec-turn { margin: 0 0 0.9rem; }
.spec-role { font-size: 0.72rem; text-transform: uppercase; letter-spacing: 0.06em;
  opacity: 0.6; margin-bottom: 0.15rem; }
.spec-you { display: flex; flex-direction: column; align-items: flex-end; }
.spec-user { white-space: pre-wrap; padding: 0.45rem 0.7rem; border-radius: 12px 12px 3px 12px;
  background: rgba(99, 102, 241, 0.13); max-width: 85%; }
.spec-turn-stats { font-size: 0.74rem; opacity: 0.65; margin-top: 0.25rem;
  font-variant-numeric: tabular-nums; }
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
.ws { position: relative; }
.ws::before { content: attr(data-ws); opacity: 0.5; pointer-events: none;
  user-select: none; }
.ws-sp::before { position: absolute; left: 0; top: 0; width: 100%; overflow: hidden;
  white-space: pre; }
.ws-nl::before { font-size: 0.8em; padding: 0 0.1em; }
.spec-end { font-size: 0.75rem; opacity: 0.6; margin-left: 0.4rem; font-style: italic; }
.spec-legend { display: flex; flex-wrap: wrap; gap: 0.2rem 0.7rem; font-size: 0.78rem;
  align-items: center; }
#stop, #clear { white-space: nowrap; }
.spec-legend .swatch { display: inline-block; width: 0.95em; height: 0.95em;
  border-radius: 3px; vertical-align: -0.12em; margin-right: 0.3em;
  border: 1px solid rgba(127, 127, 127, 0.35); }
.spec-legend .tip { opacity: 0.65; }
.spec-stats { display: grid; grid-template-columns: repeat(3, 1fr); gap: 0.4rem; }
.spec-stat { padding: 0.35rem 0.6rem; border-radius: 8px;
  background: rgba(127, 127, 127, 0.09); }
.spec-stat .v { font-size: 1.2rem; font-weight: 650; font-variant-numeric: tabular-nums; }
.spec-stat .k { font-size: 0.72rem; opacity: 0.7; }
.spec-sub { font-size: 0.78rem; opacity: 0.7; margin-top: 0.4rem; }
.spec-chart svg { width: 100%; height: 110px; display: block; }
.spec-chart .title { font-size: 0.8rem; opacity: 0.8; margin-bottom: 0.2rem; }
.spec-chart .spec-key { opacity: 0.7; font-size: 0.72rem; }
.spec-banner { padding: 0.45rem 0.75rem; border-radius: 8px; font-size: 0.88rem; }
.spec-banner.info { background: rgba(59, 130, 246, 0.12); }
.spec-banner.ok { background: rgba(34, 197, 94, 0.15); }
.spec-banner.warn { background: rgba(234, 179, 8, 0.18); }
.spec-banner.error { background: rgba(239, 68, 68, 0.16); }
.spec-banner code { font-size: 0.82rem; }
.spec-note { font-size: 0.85rem; opacity: 0.85; }
.spec-lane-head { font-weight: 600; }
.spec-verdict { font-size: 1.05rem; }
.spec-verdict b.big { font-size: 1.6rem; }
.spec-why { margin-top: 0.3rem; }
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
    progress: Any = None  # while no token has come: waiting or prefill progress
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


# Marks drawn (by CSS, from ``data-ws``) over whitespace-only tokens.
WS_MARKS = {"\n": "\u23ce", "\t": "\u21e5"}
SPACE_MARK = "\u00b7"


def _whitespace_html(text: str) -> str:
    """A whitespace-only token with visible marks that copy as the real text.

    Each newline gets a ``⏎`` and each run of spaces or tabs a row of ``·``
    or ``⇥``; the marks live in CSS ``::before`` content, so selecting and
    copying the text gives the original whitespace.
    """
    out = []
    for run in re.findall(r"\n|\t+|[^\S\n\t]+", text):
        if run == "\n":
            out.append('<span class="ws ws-nl" data-ws="\u23ce">\n</span>')
        else:
            mark = WS_MARKS["\t"] if run[0] == "\t" else SPACE_MARK
            out.append(
                f'<span class="ws ws-sp" data-ws="{mark * len(run)}">'
                f"{html.escape(run)}</span>"
            )
    return "".join(out)


def token_spans(pieces: Sequence[Piece]) -> str:
    """The reply as ``<span class="tok tok-KIND">`` elements, one per token.

    Whitespace-only tokens (newlines, indentation) get visible marks, so that
    an accepted newline is as easy to see as an accepted word.
    """
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
        body = _whitespace_html(p.text) if p.text.isspace() else html.escape(p.text)
        out.append(f"<span {attrs}>{body}</span>")
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
                '<div class="spec-turn spec-you"><div class="spec-role">you</div>'
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
            footer = turn_stats_html(turn.stats) if chat else ""
            if turn.error is not None:
                footer += _turn_error_html(turn.error)
            parts.append(_end_marker(turn.finish) + f"</div>{footer}</div>")
    if not streaming:
        parts.append("</div>")
    return "".join(parts)


def _turn_error_html(error: BaseException) -> str:
    """The error of a failed turn, shown under its message."""
    text = (str(error).strip() or type(error).__name__).splitlines()[0]
    return (
        '<div class="spec-turn-error"><b>Error:</b> '
        f"{html.escape(text[:MAX_ERROR_CHARS])} (press <b>Retry</b> to send it "
        "again)</div>"
    )


def turn_stats_html(stats) -> str:
    """One line of a reply's speculation statistics (empty without stats).

    Tokens, tokens per target forward, the share of draft tokens kept and
    tokens per second, so that every turn of a chat keeps its own numbers.
    """
    if stats is None or not stats.generated_tokens:
        return ""
    parts = [
        f"<b>{html.escape(stats.method)}</b>",
        f"{stats.generated_tokens} tokens",
    ]
    if stats.method != "none":
        parts.append(f"{stats.tokens_per_target_forward:.2f} tokens / target forward")
        if stats.draft_tokens:
            parts.append(f"{stats.acceptance_rate:.0%} of draft tokens kept")
    parts.append(f"{stats.generation_tps:.1f} tokens/s")
    return f'<div class="spec-turn-stats">{" &middot; ".join(parts)}</div>'


LEGEND_SHORT = {
    "accepted": "draft kept",
    "recovered": "target's fix (hover)",
    "bonus": "free extra",
    "target": "plain step",
}
COLOURS = {
    "accepted": "rgba(34, 197, 94, 0.28)",
    "recovered": "rgba(249, 115, 22, 0.38)",
    "bonus": "rgba(59, 130, 246, 0.32)",
    "target": "transparent",
}


def legend_html() -> str:
    """One line of swatches for the four token origins; hover for more."""
    items = [
        f'<span title="{html.escape(KIND_HELP[k], quote=True)}">'
        f'<span class="swatch" style="background:{COLOURS[k]}"></span><b>{k}</b> '
        f'<span class="tip">{html.escape(LEGEND_SHORT[k])}</span></span>'
        for k in KINDS
    ]
    marks = (
        '<span title="newlines and indentation the model generated">'
        '<span class="tip">\u23ce \u00b7</span></span>'
    )
    return f'<div class="spec-legend">{"".join(items)}{marks}</div>'


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
        if stats.auto_rounds:
            picked = ", ".join(
                f"{html.escape(str(k))} {v}" for k, v in stats.auto_rounds.items() if v
            )
            sub += f" &middot; auto ran: {picked} rounds"
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


def round_series(
    pieces: Sequence[Piece], stats
) -> Tuple[List[int], List[int], List[bool]]:
    """Accepted and drafted tokens, and bonus flags, for every round so far.

    ``stats.accepted_per_round`` skips rounds that had no draft (prompt
    lookup found nothing, say); the pieces know every round, so those come
    back as ``0`` drafted, and the chart counts the same rounds as the stats.

    Args:
        pieces: The reply's tokens in order.
        stats: Its :class:`mlx_spec.SpecStats` (or ``None``).

    Returns:
        ``(accepted, drafted, bonus)``, one entry per round, in order.
    """
    if stats is None or stats.method == "none":
        return [], [], []
    drafted_in: Dict[int, bool] = {}
    bonus_in: Dict[int, bool] = {}
    accepted_in: Dict[int, int] = {}
    for p in pieces:
        drafted_in[p.round] = drafted_in.get(p.round, False) or p.kind != "target"
        bonus_in[p.round] = bonus_in.get(p.round, False) or p.kind == "bonus"
        accepted_in[p.round] = accepted_in.get(p.round, 0) + (p.kind == "accepted")
    acc_iter = iter(list(stats.accepted_per_round))
    drf_iter = iter(list(stats.drafted_per_round))
    accepted, drafted, bonus = [], [], []
    for r in sorted(drafted_in):
        if drafted_in[r]:
            a, d = next(acc_iter, None), next(drf_iter, None)
            accepted.append(accepted_in[r] if a is None else a)
            drafted.append(max(d or 0, 1))
        else:
            accepted.append(0)
            drafted.append(0)
        bonus.append(bonus_in[r])
    return accepted, drafted, bonus


def chart_svg(
    accepted: Sequence[int],
    drafted: Sequence[int] = (),
    bonus: Sequence[bool] = (),
    *,
    outlines: bool = True,
) -> str:
    """A bar chart of accepted draft tokens per round.

    Args:
        accepted: Accepted draft tokens, one per round (every round).
        drafted: Draft tokens proposed, one per round; ``0`` marks a round
          without a draft, drawn as a grey tick. Drawn as outlines.
        bonus: Rounds where every draft token was kept and a bonus token
          followed, drawn in blue. Default: rounds with ``accepted >= drafted``.
        outlines: Draw the drafted outlines (a tree's size is not comparable
          to its accepted depth, so trees turn them off).

    Only the last ``MAX_CHART_ROUNDS`` rounds are drawn; the title counts all.
    """
    title = "Accepted draft tokens per round"
    if not accepted:
        return (
            f'<div class="spec-chart"><div class="title">{title}</div>'
            '<div class="spec-sub">The chart fills in as rounds are verified '
            "(speculative methods only).</div></div>"
        )
    n = len(accepted)
    drafted = list(drafted) if len(drafted) >= n else [None] * n
    bonus = list(bonus) if len(bonus) >= n else [None] * n
    start = max(0, n - MAX_CHART_ROUNDS)
    rows = list(zip(accepted, drafted, bonus))[start:]
    top = max(
        max(a for a, _, _ in rows),
        max((d or 0) for _, d, _ in rows) if outlines else 0,
        1,
    )
    width, height, pad = 600, 120, 14
    slot = width / max(len(rows), MIN_CHART_SLOTS)
    bar = max(slot * 0.78, 0.6)
    scale = (height - pad - 2) / top
    base = height - pad
    rects = []
    for i, (a, d, b) in enumerate(rows):
        x = i * slot + (slot - bar) / 2
        label = f"round {start + i}"
        if d == 0:
            rects.append(
                f'<rect x="{x:.2f}" y="{base:.2f}" width="{bar:.2f}" height="3" '
                f'fill="rgba(127,127,127,0.55)"><title>{label}: no draft '
                "(one plain target step)</title></rect>"
            )
            continue
        if d and outlines:
            h = d * scale
            rects.append(
                f'<rect x="{x:.2f}" y="{base - h:.2f}" width="{bar:.2f}" '
                f'height="{h:.2f}" fill="none" stroke="rgba(127,127,127,0.45)" '
                'stroke-width="0.8"/>'
            )
        full = b if b is not None else bool(d and a >= d)
        colour = "rgba(59,130,246,0.85)" if full else "rgba(34,197,94,0.85)"
        h = max(a * scale, 1.5)  # a thin bar marks a round that kept nothing
        fill = colour if a else "rgba(249,115,22,0.85)"
        kept = f"{a}/{d}" if d and outlines else str(a)
        rects.append(
            f'<rect x="{x:.2f}" y="{base - h:.2f}" width="{bar:.2f}" '
            f'height="{h:.2f}" fill="{fill}"><title>{label}: {kept} accepted'
            f"{' + bonus' if full else ''}</title></rect>"
        )
    mean = sum(accepted) / n
    y_mean = base - mean * scale
    grid = "".join(
        f'<line x1="0" x2="{width}" y1="{base - k * scale:.2f}" '
        f'y2="{base - k * scale:.2f}" stroke="rgba(127,127,127,0.15)"/>'
        f'<text x="2" y="{base - k * scale - 2:.2f}" font-size="9" '
        f'fill="currentColor" opacity="0.5">{k}</text>'
        for k in range(1, top + 1)
    )
    plain = sum(1 for d in drafted if d == 0)
    counted = f"{n} rounds" + (f", {plain} without a draft" if plain else "")
    shown = f"last {len(rows)} of {counted}" if start else counted
    svg = (
        f'<svg viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{title}">{grid}{"".join(rects)}'
        f'<line x1="0" x2="{width}" y1="{y_mean:.2f}" y2="{y_mean:.2f}" '
        'stroke="rgba(249,115,22,0.9)" stroke-dasharray="4 3" stroke-width="1.2"/>'
        f'<text x="{width - 4}" y="{height - 2}" font-size="9" text-anchor="end" '
        f'fill="currentColor" opacity="0.6">{shown}</text></svg>'
    )
    return (
        f'<div class="spec-chart"><div class="title">{title}: mean {mean:.2f} '
        f'over {counted} <span class="spec-key">(dashed: mean; blue: all kept '
        "+ bonus; orange: none kept; grey: no draft)</span></div>"
        f"{svg}</div>"
    )


def banner(message: str, level: str = "info") -> str:
    """A coloured one-line message; ``level`` is info, ok, warn or error."""
    return f'<div class="spec-banner {level}">{message}</div>'


MAX_ERROR_CHARS = 240


def plural(n: int, word: str) -> str:
    """``"1 token"``, ``"2 tokens"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def error_banner(error: BaseException, retry: bool = False) -> str:
    """A readable one-line error: the message's first line, without a traceback.

    With ``retry``, it points to the Retry button.
    """
    text = str(error).strip() or type(error).__name__
    if not isinstance(error, ValueError):
        text = f"{type(error).__name__}: {text}"
    full = text
    text = text.splitlines()[0]
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return (
        f'<div class="spec-banner error" title="{html.escape(full, quote=True)}">'
        f"<b>Error:</b> {html.escape(text)}"
        + (" Press <b>Retry</b> to send it again." if retry else "")
        + "</div>"
    )


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
        acceptance: Fraction of draft tokens kept (speculative lane only).
        per_forward: Tokens per target forward (speculative lane only).
    """

    method: str
    text: str
    decode_tps: float
    total: float
    tokens: int
    acceptance: Optional[float] = None
    per_forward: Optional[float] = None


MIN_RACE_TOKENS = 16
# Below this acceptance, "the draft is rejected often" explains a slow race.
LOW_ACCEPTANCE = 0.5
LOW_PER_FORWARD = 1.5
ALTERNATIVES = {
    "draft": "try <b>lookup</b> or <b>auto</b>",
    "tree": "try <b>lookup</b> or <b>auto</b>",
    "self": "try <b>lookup</b> or <b>auto</b>",
    "lookup": "try <b>auto</b>, or a prompt that repeats more of itself",
    "auto": "try <b>lookup</b>, or a smaller &gamma;",
}


def slow_reason(spec: Lane) -> str:
    """Why a speculative lane lost the race, from its own statistics."""
    method = html.escape(spec.method)
    # A tree counts every node as drafted, so its acceptance looks low even
    # when it goes deep: judge trees (and auto, which may use one) by depth.
    if spec.method in ("tree", "auto"):
        rejected = spec.per_forward is not None and spec.per_forward < LOW_PER_FORWARD
    else:
        rejected = spec.acceptance is not None and spec.acceptance < LOW_ACCEPTANCE
    if rejected and spec.method in ("tree", "auto"):
        why = (
            f"the drafts are rejected often (only {spec.per_forward:.2f} tokens per "
            "target forward), so most drafting work is wasted"
        )
    elif rejected:
        why = (
            f"the draft is rejected often (only {spec.acceptance:.0%} of draft tokens "
            "kept), so most drafting work is wasted"
        )
    else:
        per = (
            f" ({spec.per_forward:.2f} tokens per target forward)"
            if spec.per_forward
            else ""
        )
        why = (
            f"each round saves too little{per}: on this CPU a target forward over "
            "several tokens costs much more than over one, and drafting is not free"
        )
    tip = ALTERNATIVES.get(spec.method, "try <b>lookup</b> or <b>auto</b>")
    return f"Speculation ({method}) is slower here: {why}. Plain decoding wins this one; {tip}."


def race_verdict(plain: Lane, spec: Lane, greedy: bool) -> str:
    """The race result: measured speedup and, under greedy, whether texts agree.

    A slower speculative lane comes with :func:`slow_reason`.
    """
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
    if ratio < 1:
        if level == "ok":
            level = "warn"
        head += f'<div class="spec-why">{slow_reason(spec)}</div>'
    return banner(f"{head}<div>{check}</div>", level)
