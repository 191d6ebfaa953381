"""The mlx-spec Gradio app: chat or complete, and watch speculation happen.

``python -m ui.app`` serves http://127.0.0.1:7860 with the embedded default
model pair. Every token is coloured by where it came from (accepted from the
draft, recovered by the target, bonus), with live statistics, a chart of
accepted tokens per round and a race against plain mlx_lm decoding.
"""

import mlx_spec  # noqa: F401  (loads OpenBLAS before mlx.core)

# isort: split

import argparse
import html
import ipaddress
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlx_spec.config import (  # noqa: E402
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_TREE_BUDGET,
    METHODS,
)
from mlx_spec.generate import DEFAULT_MAX_TOKENS  # noqa: E402
from mlx_spec.loading import default_model_pair  # noqa: E402

from . import render  # noqa: E402
from .render import Turn  # noqa: E402
from .session import (  # noqa: E402
    NO_DRAFT,
    ModelStore,
    Options,
    Pair,
    Session,
    Sessions,
    Worker,
    encode_prompt,
    known_models,
    run_turn,
)

log = logging.getLogger("mlx_spec.ui")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
MAX_UI_TOKENS = 8192
# Seconds between streamed page updates (tokens are batched in between).
UPDATE_INTERVAL = 0.1

METHOD_LABELS = {
    "none": "none (plain decoding)",
    "draft": "draft (draft model)",
    "tree": "tree (token tree)",
    "lookup": "lookup (prompt lookup)",
    "self": "self (self-speculation)",
    "auto": "auto (keeps the fastest)",
}

METHOD_HELP = {
    "none": "plain mlx_lm decoding (the baseline)",
    "draft": "a small draft model proposes γ tokens; the target checks them in one forward",
    "tree": "a tree of draft continuations, verified in one forward",
    "lookup": "drafts copied from n-grams already in the text (no draft model)",
    "self": "the target drafts with a subset of its own layers",
    "auto": "tries the methods your models allow (draft, tree, lookup; lookup and self "
    "without a draft) and keeps the fastest, measured round by round",
}

DEFAULT_METHOD = "auto"
# No trailing newline: the model's own newline and indent tokens come first.
COMPLETION_PROMPT = "class Stack:\n    def __init__(self):"
CHAT_PROMPT = "Explain speculative decoding in one paragraph."
COMPLETION_EXAMPLES = [
    COMPLETION_PROMPT,
    "def fibonacci(n):",
    "import os\n\n\ndef list_python_files(path):",
]
CHAT_EXAMPLES = [
    CHAT_PROMPT,
    "Write a Python function that reverses a string.",
]

HEADER = """
<div class="spec-header">
  <h1>mlx-spec</h1>
  <p>Exact speculative decoding for MLX: a small draft guesses, the big model checks
  several tokens in one step. Same text as plain decoding, fewer slow steps.</p>
</div>
"""

RACE_HELP = (
    '<div class="spec-note">Runs plain mlx_lm decoding, then the chosen method, on the '
    "same prompt and shows the measured speed ratio. At temperature 0 the two texts "
    "must be identical.</div>"
)
PLAIN_HEAD = '<div class="spec-lane-head">Plain mlx_lm decoding</div>'


def _as_int(value, name: str, optional: bool = False) -> Optional[int]:
    """An integer from a UI number, or a readable ``ValueError``."""
    if value is None or value == "":
        if optional:
            return None
        raise ValueError(f"{name} is empty; enter a whole number.")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number.") from None
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name}={value} is out of range: a whole number.")
        value = int(value)
    return value


def parse_options(
    method, num_draft_tokens, tree_budget, temp, top_p, max_tokens, seed, adaptive=False
) -> Options:
    """UI values to :class:`Options`; ``SpecConfig`` checks the ranges later."""
    if method not in METHODS:
        raise ValueError(
            f"method {method!r} is unknown; choose one of {', '.join(METHODS)}."
        )
    max_tokens = _as_int(max_tokens, "max tokens")
    if max_tokens is not None and max_tokens > MAX_UI_TOKENS:
        raise ValueError(
            f"max tokens={max_tokens} is out of range: at most {MAX_UI_TOKENS} here."
        )
    return Options(
        method=method,
        num_draft_tokens=_as_int(num_draft_tokens, "γ (draft tokens per round)"),
        tree_budget=_as_int(tree_budget, "tree budget"),
        temp=float(temp if temp is not None else 0.0),
        top_p=float(top_p if top_p is not None else 1.0),
        max_tokens=max_tokens,
        seed=_as_int(seed, "seed", optional=True),
        adaptive=bool(adaptive),
    )


def _param_count(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def _num_params(model) -> str:
    n = _param_count(model)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _name(path: Optional[str]) -> str:
    return Path(path).name if path and Path(path).expanduser().exists() else str(path)


class App:
    """The page and its handlers; all MLX work goes through one :class:`Worker`."""

    def __init__(
        self,
        target: str,
        draft: Optional[str],
        method: str = DEFAULT_METHOD,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ):
        self.default_target = target
        self.default_draft = draft
        self.default_method = method if draft or method != "draft" else "none"
        self.default_gamma = num_draft_tokens
        self.default_max_tokens = max_tokens
        self.worker = Worker()
        self.store = ModelStore()
        self.sessions = Sessions()

    # --- models -----------------------------------------------------------------

    def load_pair(self, target: str, draft: Optional[str]) -> Pair:
        """The pair, loaded on the worker unless both models are already loaded."""
        if not self._needs_loading(target, draft):
            return self.store.get(target, draft)
        return self.worker.call(self.store.get, target, draft)

    def preload(self):
        """Load the default pair before the first visitor arrives."""
        self.load_pair(self.default_target, self.default_draft)

    def _needs_loading(self, target, draft) -> bool:
        return not (self.store.loaded(target) and self.store.loaded(draft))

    def describe(self, pair: Pair, raw: bool) -> Tuple[str, str]:
        """The model status line and the chat/completion mode note."""
        status = f"<b>Target</b> {html.escape(_name(pair.target_path))} ({_num_params(pair.model)})"
        if pair.draft_model is not None:
            status += (
                f" &middot; <b>Draft</b> {html.escape(_name(pair.draft_path))} "
                f"({_num_params(pair.draft_model)}) &middot; same tokenizer &#10003;"
            )
        else:
            status += " &middot; no draft model (speculative methods that need one will say so)"
        if pair.has_chat_template and not raw:
            note = (
                "<b>Chat mode</b>: the model has a chat template; each turn reuses the "
                "prompt cache."
            )
        elif pair.has_chat_template:
            note = "<b>Completion mode</b> (chat template ignored): the model continues your text."
        else:
            note = (
                "<b>Completion mode</b>: the model has no chat template, so it "
                "continues your text."
            )
        return render.banner(status, "info"), render.banner(note, "info")

    def on_models(self, target, draft, raw, prompt, request: gr.Request):
        """Load the chosen models; update the mode, its controls and the transcript.

        Returns updates for: model status, mode note, send button, transcript,
        status, the raw checkbox, the completion and chat examples, stats,
        chart and prompt. A failed load clears the mode note and the stats.
        """
        session = self.sessions.get(_session_key(request))
        keep = gr.update()
        try:
            pair = self.load_pair(target, draft)
        except Exception as e:  # shown in the page, the app keeps running
            error = render.error_banner(e)
            session.reset()
            session.pair_key = None
            return (
                error,
                "",
                gr.update(value="Generate"),
                render.transcript_html([], False),
                error,
                keep,
                keep,
                keep,
                render.stats_html(None),
                render.chart_svg([]),
                keep,
            )
        status, note = self.describe(pair, raw)
        chat = pair.has_chat_template and not raw
        cleared, stats, chart = keep, keep, keep
        if session.pair_key != (pair.target_path, chat):
            session.reset()
            session.pair_key = (pair.target_path, chat)
            cleared, stats, chart = "", render.stats_html(None), render.chart_svg([])
        button = gr.update(value="Send" if chat else "Generate")
        transcript = render.transcript_html(session.turns, chat, mono=not chat)
        return (
            status,
            note,
            button,
            transcript,
            cleared,
            gr.update(visible=pair.has_chat_template),
            gr.update(visible=not chat),
            gr.update(visible=chat),
            stats,
            chart,
            _prompt_for_mode(prompt, chat),
        )

    def on_unload(self, request: gr.Request):
        """The page was closed: stop its generation and forget its session."""
        key = _session_key(request)
        self.sessions.get(key).stop.set()
        self.sessions.drop(key)

    # --- generation -------------------------------------------------------------

    def on_generate(
        self,
        text,
        target,
        draft,
        method,
        gamma,
        tree_budget,
        adaptive,
        temp,
        top_p,
        max_tokens,
        seed,
        raw,
        request: gr.Request,
    ):
        """Stream one chat turn (or completion) into the page."""
        session = self.sessions.get(_session_key(request))
        session.stop.clear()
        keep = gr.update()
        try:
            options = parse_options(
                method, gamma, tree_budget, temp, top_p, max_tokens, seed, adaptive
            )
            if not (text or "").strip():
                raise ValueError("the prompt is empty; type some text first.")
            if self._needs_loading(target, draft):
                yield keep, keep, keep, render.banner("Loading models&hellip;"), keep
            pair = self.load_pair(target, draft)
            _check_pair(options, pair)
        except Exception as e:
            yield keep, *_no_stats(), render.error_banner(e), keep
            return
        chat = pair.has_chat_template and not raw
        key = (pair.target_path, chat)
        if session.pair_key != key or not chat:
            session.turns = []
            session.pair_key = key
        history = list(session.turns)
        turn = Turn(user=text)
        session.turns.append(turn)
        cleared = gr.update(value="") if chat else keep
        stats_view, chart_view = keep, keep
        for update in self._stream_turn(session, pair, turn, history, options, chat):
            if isinstance(update[1], str):
                stats_view, chart_view = update[1], update[2]
            yield update[0], update[1], update[2], update[3], keep
        yield (
            render.transcript_html(session.turns, chat, mono=not chat),
            stats_view,
            chart_view,
            self._final_status(turn, options),
            cleared,
        )

    def _stream_turn(
        self,
        session: Session,
        pair: Pair,
        turn: Turn,
        history: List[Turn],
        options: Options,
        chat: bool,
        use_cache: bool = True,
    ):
        """Yield (transcript, stats, chart, status) while the worker generates."""
        start = time.perf_counter()
        last, stats = None, None
        try:
            tokens = encode_prompt(pair.tokenizer, turn.user, history, chat)
            batches = self.worker.stream(
                lambda: run_turn(session, pair, tokens, options, use_cache),
                session.stop,
            )
            status = render.banner("Generating&hellip; press <b>Stop</b> to cancel.")
            next_update = 0.0
            for batch in batches:
                for piece, response in batch:
                    turn.pieces.append(piece)
                    last, stats = response, response.stats
                now = time.perf_counter()
                if now < next_update:
                    continue
                next_update = now + UPDATE_INTERVAL
                yield self._view(session, turn, stats, chat, start, status)
            turn.finish = (
                last.finish_reason if last and last.finish_reason else "stopped"
            )
        except Exception as e:
            log.warning(
                "generation failed: %s", e, exc_info=not isinstance(e, ValueError)
            )
            turn.finish = "error"
            turn.error = e
            if not turn.pieces and turn in session.turns:
                session.turns.remove(turn)
            yield (
                render.transcript_html(session.turns, chat, mono=not chat),
                *_no_stats(),
                render.error_banner(e),
            )
            return
        turn.stats = stats
        yield self._view(session, turn, stats, chat, start, gr.update(), False)

    def _view(self, session, turn, stats, chat, start, status, streaming=True):
        elapsed = time.perf_counter() - start
        return (
            render.transcript_html(
                session.turns, chat, mono=not chat, streaming=streaming
            ),
            render.stats_html(stats, reused=session.last_reused, elapsed=elapsed),
            _chart(turn, stats),
            status,
        )

    def _final_status(self, turn: Turn, options: Options) -> str:
        if turn.error is not None:
            return render.error_banner(turn.error)
        n = len(turn.pieces)
        if turn.finish == "stopped":
            return render.banner(
                f"Stopped after {n} tokens. The next request starts cleanly.", "warn"
            )
        why = (
            "end of text"
            if turn.finish == "stop"
            else f"max tokens ({options.max_tokens})"
        )
        return render.banner(f"Done: {n} tokens ({why}).", "ok")

    def on_stop(self, request: gr.Request):
        self.sessions.get(_session_key(request)).stop.set()

    def on_clear(self, target, draft, raw, request: gr.Request):
        session = self.sessions.get(_session_key(request))
        session.reset()
        chat = self._chat_mode(target, draft, raw)
        return (
            render.transcript_html([], chat),
            render.stats_html(None),
            render.chart_svg([]),
            render.banner("Cleared; the prompt cache is empty.", "ok"),
        )

    def _chat_mode(self, target, draft, raw) -> bool:
        """Whether the (already loaded) target chats; ``True`` when unknown."""
        if self._needs_loading(target, draft):
            return True
        try:
            return self.load_pair(target, draft).has_chat_template and not raw
        except ValueError:
            return True

    # --- race ---------------------------------------------------------------------

    def on_race(
        self,
        text,
        target,
        draft,
        method,
        gamma,
        tree_budget,
        adaptive,
        temp,
        top_p,
        max_tokens,
        seed,
        raw,
        request: gr.Request,
    ):
        """Plain decoding, then the chosen method, on the same prompt; then the verdict.

        Yields updates for: plain text, plain stats, speculative lane header,
        speculative text, speculative stats, verdict, and the page's stats
        cards and chart (which follow the speculative lane).
        """
        session_key = _session_key(request)
        session = self.sessions.get(session_key)
        session.stop.clear()
        keep = gr.update()
        empty = render.transcript_html([Turn("")], chat=False)
        no_stats, no_chart = render.stats_html(None), render.chart_svg([])
        head = _spec_head(method)

        def failed(error):
            return (
                empty,
                no_stats,
                head,
                empty,
                no_stats,
                render.error_banner(error),
                no_stats,
                no_chart,
            )

        try:
            options = parse_options(
                method, gamma, tree_budget, temp, top_p, max_tokens, seed, adaptive
            )
            if options.method == "none":
                raise ValueError(
                    "choose a speculative method to race against plain decoding."
                )
            if not (text or "").strip():
                raise ValueError("the prompt is empty; type some text first.")
            if self._needs_loading(target, draft):
                loading = render.banner("Loading models&hellip;")
                yield keep, keep, head, keep, keep, loading, keep, keep
            pair = self.load_pair(target, draft)
            _check_pair(options, pair)
        except Exception as e:
            yield failed(e)
            return
        chat = pair.has_chat_template and not raw
        plain_opts = Options(**{**options.__dict__, "method": "none"})
        # plain text, plain stats, spec text, spec stats
        views = [empty, no_stats, empty, no_stats]
        page_stats, chart_view = no_stats, no_chart

        def update(status):
            return (*views[:2], head, *views[2:], status, page_stats, chart_view)

        yield update(render.banner("Racing: warming up both methods&hellip;"))
        try:
            tokens = encode_prompt(pair.tokenizer, text, [], chat)
            self.worker.call(_warm_up, pair, tokens, (plain_opts, options))
        except Exception as e:
            yield failed(e)
            return
        lanes = []
        for lane, opts in enumerate((plain_opts, options)):
            lane_session = Session(stop=session.stop)
            turn = Turn(user=text)
            lane_session.turns = [turn]
            label = "plain decoding" if lane == 0 else options.method
            status = render.banner(
                f"Racing: running <b>{html.escape(label)}</b>&hellip;"
            )
            stream = self._stream_turn(lane_session, pair, turn, [], opts, chat, False)
            for view in stream:
                if turn.error is not None:
                    yield failed(turn.error)
                    return
                views[2 * lane] = render.transcript_html(
                    [turn], False, not chat, prompt=False, streaming=turn.finish is None
                )
                if isinstance(view[1], str):
                    views[2 * lane + 1] = view[1]
                    if lane == 1:
                        page_stats, chart_view = view[1], view[2]
                yield update(status)
            if turn.finish == "stopped":
                yield update(render.banner("Race stopped.", "warn"))
                return
            lanes.append((turn, lane_session.timing))
            session.stop.clear()
        (plain_turn, plain_time), (spec_turn, spec_time) = lanes
        stats = spec_turn.stats
        plain = render.Lane(
            options.method,
            plain_turn.reply,
            plain_time.decode_tps,
            plain_time.total,
            plain_time.tokens,
        )
        spec = render.Lane(
            options.method,
            spec_turn.reply,
            spec_time.decode_tps,
            spec_time.total,
            spec_time.tokens,
            acceptance=stats.acceptance_rate if stats else None,
            per_forward=stats.tokens_per_target_forward if stats else None,
        )
        verdict = render.race_verdict(plain, spec, greedy=options.temp == 0)
        yield update(verdict + _draft_size_note(pair))

    # --- API ----------------------------------------------------------------------

    def api_generate(
        self,
        prompt: str,
        model: str = "",
        draft_model: str = "",
        method: str = DEFAULT_METHOD,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        temp: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: Optional[int] = None,
        raw: bool = False,
        tree_budget: int = DEFAULT_TREE_BUDGET,
        adaptive: bool = False,
    ) -> Dict[str, Any]:
        """Generate a complete reply; returns {"text", "finish_reason", "stats"}.

        Empty ``model`` means the default pair; ``raw`` ignores a chat template.
        """
        try:
            options = parse_options(
                method,
                num_draft_tokens,
                tree_budget,
                temp,
                top_p,
                max_tokens,
                seed,
                adaptive,
            )
            if not model:
                model, draft_model = (
                    self.default_target,
                    draft_model or self.default_draft,
                )
            pair = self.load_pair(model, draft_model or None)
            _check_pair(options, pair)
            chat = pair.has_chat_template and not raw
            tokens = encode_prompt(pair.tokenizer, prompt or "", [], chat)
            session = Session()
            pieces, last = [], None
            for batch in self.worker.stream(
                lambda: run_turn(session, pair, tokens, options, use_cache=False),
                session.stop,
            ):
                for piece, response in batch:
                    pieces.append(piece.text)
                    last = response
        except Exception as e:
            raise gr.Error(str(e) or type(e).__name__) from None
        stats = last.stats.as_dict() if last is not None else {}
        return {
            "text": "".join(pieces),
            "finish_reason": last.finish_reason if last is not None else None,
            "stats": stats,
        }

    # --- page -------------------------------------------------------------------------

    def _starting_mode(self) -> Tuple[bool, bool]:
        """``(has_chat_template, chat)`` of the starting pair (completion if unknown)."""
        if self._needs_loading(self.default_target, self.default_draft):
            return False, False
        try:
            pair = self.load_pair(self.default_target, self.default_draft)
        except ValueError:
            return False, False
        return pair.has_chat_template, pair.has_chat_template

    def build(self) -> gr.Blocks:
        """The page: prompt and Generate at the top left, stats and settings right.

        The prompt box and its buttons come before the output so that they are
        in view on a 1440x900 screen without scrolling.
        """
        models = known_models(self.default_target, self.default_draft)
        model_choices = [(label, path) for label, path in models]
        draft_choices = [(NO_DRAFT, NO_DRAFT)] + model_choices
        method_choices = [(METHOD_LABELS.get(m, m), m) for m in METHODS]
        has_template, chat = self._starting_mode()
        first_prompt = CHAT_PROMPT if chat else COMPLETION_PROMPT
        with gr.Blocks(title="mlx-spec", analytics_enabled=False) as demo:
            gr.HTML(HEADER, padding=False)
            with gr.Row(equal_height=False):
                with gr.Column(scale=3, min_width=420):
                    mode_note = gr.HTML(elem_id="mode-note", padding=False)
                    with gr.Tabs():
                        with gr.Tab("Generate", id="generate"):
                            with gr.Row(equal_height=True):
                                prompt = gr.Textbox(
                                    value=first_prompt,
                                    lines=3,
                                    max_lines=10,
                                    show_label=False,
                                    placeholder="Type a message or the start of some "
                                    "code (Shift+Enter sends)",
                                    elem_id="prompt",
                                    scale=4,
                                )
                                with gr.Column(scale=1, min_width=170):
                                    send = gr.Button(
                                        "Send" if chat else "Generate",
                                        variant="primary",
                                        elem_id="send",
                                    )
                                    with gr.Row():
                                        stop = gr.Button(
                                            "Stop",
                                            variant="stop",
                                            elem_id="stop",
                                            min_width=60,
                                        )
                                        clear = gr.Button(
                                            "Clear", elem_id="clear", min_width=60
                                        )
                            status = gr.HTML(elem_id="status", padding=False)
                            gr.HTML(
                                render.legend_html(), elem_id="legend", padding=False
                            )
                            transcript = gr.HTML(
                                render.transcript_html([], chat),
                                elem_id="transcript",
                                autoscroll=True,
                                max_height=520,
                                min_height=240,
                                container=True,
                                padding=True,
                            )
                            with gr.Column(
                                visible=not chat, elem_id="completion-examples"
                            ) as completion_examples:
                                gr.Examples(
                                    COMPLETION_EXAMPLES, inputs=[prompt], label="Try"
                                )
                            with gr.Column(
                                visible=chat, elem_id="chat-examples"
                            ) as chat_examples:
                                gr.Examples(CHAT_EXAMPLES, inputs=[prompt], label="Try")
                        with gr.Tab("Race", id="race"):
                            with gr.Row(equal_height=True):
                                race_prompt = gr.Textbox(
                                    value=COMPLETION_PROMPT,
                                    lines=3,
                                    max_lines=10,
                                    show_label=False,
                                    elem_id="race-prompt",
                                    scale=4,
                                )
                                with gr.Column(scale=1, min_width=170):
                                    race = gr.Button(
                                        "Race vs plain",
                                        variant="primary",
                                        elem_id="race",
                                    )
                                    race_stop = gr.Button(
                                        "Stop", variant="stop", elem_id="race-stop"
                                    )
                            gr.HTML(RACE_HELP, padding=False)
                            verdict = gr.HTML(elem_id="verdict", padding=False)
                            with gr.Row(equal_height=False):
                                with gr.Column():
                                    gr.HTML(PLAIN_HEAD, padding=False)
                                    plain_text = gr.HTML(
                                        container=True,
                                        padding=True,
                                        max_height=420,
                                        autoscroll=True,
                                        elem_id="plain-text",
                                    )
                                    plain_stats = gr.HTML(
                                        render.stats_html(None), elem_id="plain-stats"
                                    )
                                with gr.Column():
                                    spec_head = gr.HTML(
                                        _spec_head(self.default_method),
                                        padding=False,
                                        elem_id="spec-head",
                                    )
                                    spec_text = gr.HTML(
                                        container=True,
                                        padding=True,
                                        max_height=420,
                                        autoscroll=True,
                                        elem_id="spec-text",
                                    )
                                    spec_stats = gr.HTML(
                                        render.stats_html(None), elem_id="spec-stats"
                                    )
                with gr.Column(scale=2, min_width=320):
                    stats = gr.HTML(render.stats_html(None), elem_id="stats")
                    chart = gr.HTML(render.chart_svg([]), elem_id="chart")
                    with gr.Accordion("Models and method", open=True):
                        target = gr.Dropdown(
                            model_choices,
                            value=self.default_target,
                            label="Target model",
                            info="A local mlx_lm model folder or a Hugging Face repo",
                            allow_custom_value=True,
                            elem_id="target",
                        )
                        draft = gr.Dropdown(
                            draft_choices,
                            value=self.default_draft or NO_DRAFT,
                            label="Draft model",
                            info="Must share the target's tokenizer",
                            allow_custom_value=True,
                            elem_id="draft",
                        )
                        method = gr.Dropdown(
                            method_choices,
                            value=self.default_method,
                            label="Method",
                            elem_id="method",
                            info=_method_info(self.default_method),
                        )
                        raw = gr.Checkbox(
                            False,
                            label="Ignore the chat template (raw completion)",
                            visible=has_template,
                            elem_id="raw",
                        )
                        model_status = gr.HTML(elem_id="model-status")
                    with gr.Accordion("Options", open=True):
                        gamma = gr.Slider(
                            1,
                            16,
                            value=self.default_gamma,
                            step=1,
                            label="γ: draft tokens per round",
                        )
                        tree_budget = gr.Slider(
                            1,
                            64,
                            value=DEFAULT_TREE_BUDGET,
                            step=1,
                            label="Tree budget (nodes per round)",
                            visible=self.default_method == "tree",
                        )
                        adaptive = gr.Checkbox(
                            False,
                            label="Adaptive: choose the draft length or tree size per round",
                        )
                        temp = gr.Slider(
                            0.0,
                            2.0,
                            value=0.0,
                            step=0.05,
                            label="Temperature",
                            info="0 is greedy",
                        )
                        top_p = gr.Slider(
                            0.05, 1.0, value=1.0, step=0.05, label="Top-p"
                        )
                        with gr.Row():
                            max_tokens = gr.Number(
                                self.default_max_tokens,
                                precision=0,
                                label="Max tokens",
                                elem_id="max-tokens",
                            )
                            seed = gr.Textbox(
                                "", label="Seed", placeholder="random", elem_id="seed"
                            )

            settings = [
                target,
                draft,
                method,
                gamma,
                tree_budget,
                adaptive,
                temp,
                top_p,
                max_tokens,
                seed,
                raw,
            ]
            gen_outputs = [transcript, stats, chart, status, prompt]
            gen = dict(
                fn=self.on_generate,
                inputs=[prompt, *settings],
                outputs=gen_outputs,
                concurrency_id="mlx",
                concurrency_limit=1,
                show_progress="hidden",
            )
            send.click(api_name="chat", **gen)
            prompt.submit(api_visibility="private", **gen)
            for button in (stop, race_stop):
                button.click(
                    self.on_stop,
                    None,
                    None,
                    concurrency_limit=None,
                    api_visibility="private",
                    show_progress="hidden",
                )
            clear.click(
                self.on_clear,
                [target, draft, raw],
                [transcript, stats, chart, status],
                api_visibility="private",
            )
            race.click(
                self.on_race,
                [race_prompt, *settings],
                [
                    plain_text,
                    plain_stats,
                    spec_head,
                    spec_text,
                    spec_stats,
                    verdict,
                    stats,
                    chart,
                ],
                api_name="race",
                concurrency_id="mlx",
                concurrency_limit=1,
                show_progress="hidden",
            )
            model_outputs = [
                model_status,
                mode_note,
                send,
                transcript,
                status,
                raw,
                completion_examples,
                chat_examples,
                stats,
                chart,
                prompt,
            ]
            for trigger in (target.change, draft.change, raw.change, demo.load):
                trigger(
                    self.on_models,
                    [target, draft, raw, prompt],
                    model_outputs,
                    api_visibility="private",
                )
            method.change(
                lambda m: (
                    gr.update(visible=m == "tree"),
                    gr.update(info=_method_info(m)),
                    _spec_head(m),
                ),
                method,
                [tree_budget, method, spec_head],
                api_visibility="private",
                queue=False,
            )
            demo.unload(self.on_unload)
            gr.api(
                self.api_generate,
                api_name="generate",
                concurrency_id="mlx",
                concurrency_limit=1,
            )
        return demo


def _no_stats() -> Tuple[str, str]:
    """Empty stats cards and chart (after an error, or for new models)."""
    return render.stats_html(None), render.chart_svg([])


def _chart(turn: Turn, stats) -> str:
    """The round chart of a reply, counting the same rounds as its stats."""
    accepted, drafted, bonus = render.round_series(turn.pieces, stats)
    # A tree's size is not comparable to its accepted depth: no outlines.
    return render.chart_svg(
        accepted, drafted, bonus, outlines=not (stats and stats.tree_sizes)
    )


def _spec_head(method) -> str:
    """The speculative lane's header, naming its method."""
    label = METHOD_LABELS.get(method, str(method))
    return f'<div class="spec-lane-head">Speculative: {html.escape(label)}</div>'


def _prompt_for_mode(prompt: Optional[str], chat: bool):
    """Swap an untouched example prompt for one that suits the mode."""
    prompt = prompt or ""
    if chat and (not prompt.strip() or prompt in COMPLETION_EXAMPLES):
        return CHAT_PROMPT
    if not chat and (not prompt.strip() or prompt in CHAT_EXAMPLES):
        return COMPLETION_PROMPT
    return gr.update()


def _check_pair(options: Options, pair: Pair):
    if options.method == "draft" and pair.draft_model is None:
        raise ValueError(
            "the draft method needs a draft model: choose one under "
            "'Models and method', or pick another method."
        )


def _draft_size_note(pair: Pair) -> str:
    """A hint when the draft is too big for speculation to pay off."""
    if pair.draft_model is None:
        return ""
    ratio = _param_count(pair.draft_model) / max(_param_count(pair.model), 1)
    if ratio < 0.5:
        return ""
    return render.banner(
        f"The draft model has {ratio:.0%} of the target's parameters: a draft pays off "
        "when it is much smaller (and faster) than the target.",
        "info",
    )


def _warm_up(pair: Pair, tokens: List[int], methods: Tuple[Options, ...]):
    """Run each method for two tokens so neither lane pays first-use costs."""
    for options in methods:
        short = Options(**{**options.__dict__, "max_tokens": 2})
        for _ in run_turn(Session(), pair, tokens[:16], short, use_cache=False):
            pass


def _method_info(method: str) -> str:
    return METHOD_HELP.get(method, "")[:1].upper() + METHOD_HELP.get(method, "")[1:]


def _session_key(request: Optional[gr.Request]) -> Optional[str]:
    return getattr(request, "session_hash", None) if request is not None else None


def launch_kwargs() -> Dict[str, Any]:
    """Theme and CSS for ``Blocks.launch`` (Gradio 6 takes them there)."""
    system = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"]
    mono = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
    theme = gr.themes.Soft(primary_hue="indigo", font=system, font_mono=mono)
    return dict(theme=theme, css=render.CSS, ssr_mode=False)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_auth(values: Optional[List[str]]) -> Optional[List[Tuple[str, str]]]:
    if not values:
        return None
    pairs = []
    for value in values:
        user, sep, password = value.partition(":")
        if not sep or not user or not password:
            raise ValueError(f"--auth {value!r} is not of the form user:password.")
        pairs.append((user, password))
    return pairs


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ui.app",
        description="The mlx-spec web app: chat with speculative decoding and watch it work.",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"Address to listen on (default: {DEFAULT_HOST}).",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"Port to listen on (default: {DEFAULT_PORT}).",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="Allow a --host that is not loopback: anyone who can reach it can "
        "use this machine's compute.",
    )
    parser.add_argument(
        "--auth",
        action="append",
        metavar="USER:PASSWORD",
        help="Require a login (repeat for several users). Default: $MLX_SPEC_UI_AUTH "
        "(comma-separated), which keeps passwords out of the process list.",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="Target model to start with (default: the embedded default pair).",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="Draft model to start with (default: the default pair's draft).",
    )
    parser.add_argument(
        "--speculative",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help=f"Method to start with (default: {DEFAULT_METHOD}, which keeps the fastest "
        "method for the models and prompt).",
    )
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=DEFAULT_NUM_DRAFT_TOKENS,
        help=f"γ to start with (default: {DEFAULT_NUM_DRAFT_TOKENS}).",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"Max tokens to start with (default: {DEFAULT_MAX_TOKENS}).",
    )
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="Load the models on the first request instead of at start-up.",
    )
    return parser


def create_app(
    model: Optional[str] = None, draft_model: Optional[str] = None, **kwargs
) -> App:
    """An :class:`App` on the given models (default: the embedded default pair)."""
    if model is None:
        model, default_draft = default_model_pair()
        draft_model = draft_model or default_draft
    return App(model, draft_model, **kwargs)


def main(argv=None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    env_auth = [a for a in os.environ.get("MLX_SPEC_UI_AUTH", "").split(",") if a]
    try:
        auth = parse_auth(args.auth or env_auth)
    except ValueError as e:
        parser.error(str(e))
    if not is_loopback(args.host):
        if not args.allow_remote:
            parser.error(
                f"--host {args.host} is not a loopback address; anyone on the network could "
                "use this machine's compute. Pass --allow-remote (and ideally --auth) to do it."
            )
        print(
            f"WARNING: listening on {args.host}: anyone who can reach this address can use "
            "this machine's compute" + ("." if auth else " (no --auth given)."),
            file=sys.stderr,
        )
    try:
        app = create_app(
            args.model,
            args.draft_model,
            method=args.speculative,
            num_draft_tokens=args.num_draft_tokens,
            max_tokens=args.max_tokens,
        )
        if not args.no_preload:
            print("Loading the models...", file=sys.stderr)
            app.preload()
    except (ValueError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    demo = app.build()
    demo.queue()
    demo.launch(
        server_name=args.host, server_port=args.port, auth=auth, **launch_kwargs()
    )


if __name__ == "__main__":
    main()
