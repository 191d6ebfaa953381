"""The event handlers: what each click, change and API call does.

:class:`App` holds the loaded models (:class:`ui.session.ModelStore`), the
per-browser sessions and the MLX worker. Its ``on_*`` handlers validate the
page's values, run generations through :mod:`ui.session` and turn the
streamed tokens into page updates with :mod:`ui.render`; ``api_generate`` is
the ``/generate`` API. The page itself is laid out by :mod:`ui.layout`.
"""

import html
import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import gradio as gr
from mlx.utils import tree_flatten

from mlx_spec.config import DEFAULT_NUM_DRAFT_TOKENS, SpecConfig
from mlx_spec.drafters.fit import check_drafter, drafter_kind
from mlx_spec.generate import DEFAULT_MAX_TOKENS

from . import layout, render
from .layout import (
    CHAT_EXAMPLES,
    CHAT_PROMPT,
    COMPLETION_EXAMPLES,
    COMPLETION_PROMPT,
    SPEC_DEFAULTS,
    PageRequest,
    lane_head,
)
from .options import DEFAULT_METHOD, PAGE_WORDS, as_bool, page_options, parse_options
from .render import Turn
from .session import (
    ModelStore,
    Pair,
    Session,
    Sessions,
    check_not_empty,
    clean_message,
    encode_prompt,
    respond,
    run_turn,
)
from .worker import Prefill, Waiting, Worker

log = logging.getLogger("mlx_spec.ui")

# Seconds between streamed page updates (tokens are batched in between).
UPDATE_INTERVAL = 0.1
# Yielded by a request's handler once its work is over, before its last
# updates: from then on the page may send again (see App._claimed).
DONE = object()
# What a second send says while the page's request runs (the box keeps it).
BUSY = (
    "A reply is on its way: wait for it or press <b>Stop</b>; your new message "
    "stays in the box."
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
        # The largest prompt slice (see ui.prefill); None: the engine's chunk.
        self.prefill_step_size: Optional[int] = None
        self.worker = Worker()
        self.store = ModelStore()
        self.sessions = Sessions()

    # --- models -----------------------------------------------------------------

    def load_pair(
        self, target: str, draft: Optional[str], method: Optional[str] = None
    ) -> Pair:
        """The target and ``method``'s drafter, loaded on the worker if not loaded yet.

        The drafter is resolved as the command line does (see
        :func:`mlx_spec.loading.resolve_draft`): ``mtp`` and ``auto`` without
        a draft use the checkpoint's own MTP layer.
        """
        if not self._needs_loading(target, draft, method):
            return self.store.get(target, draft, method)
        return self.worker.call(self.store.get, target, draft, method)

    def preload(self):
        """Load the default pair before the first visitor arrives."""
        self.load_pair(self.default_target, self.default_draft, self.default_method)

    def _needs_loading(self, target, draft, method=None) -> bool:
        return not self.store.loaded(target, draft, method)

    def describe(self, pair: Pair, raw: bool) -> Tuple[str, str]:
        """The model status line and the chat/completion mode note."""
        status = f"<b>Target</b> {html.escape(_name(pair.target_path))} ({_num_params(pair.model)})"
        if pair.mtp_path is not None:
            status += (
                f" &middot; <b>Draft</b> the MTP layer of "
                f"{html.escape(_name(pair.mtp_path))} ({_num_params(pair.draft_model)})"
            )
        elif pair.draft_model is not None:
            status += (
                f" &middot; <b>Draft</b> {html.escape(_name(pair.draft_path))} "
                f"({_num_params(pair.draft_model)}) &middot; same tokenizer &#10003;"
            )
        else:
            status += (
                " &middot; no draft model: <b>lookup</b>, <b>self</b> and <b>auto</b> "
                "speculate without one"
            )
        if pair.has_chat_template and not raw:
            note = (
                "<b>Chat mode</b>: the chat template formats the conversation; earlier "
                "turns stay in the prompt cache."
            )
        elif pair.has_chat_template:
            note = "<b>Completion mode</b> (chat template ignored): the model continues your text."
        else:
            note = (
                "<b>Completion mode</b>: the model has no chat template, so it "
                "continues your text."
            )
        return render.banner(status, "info"), render.banner(note, "info")

    def on_models(
        self,
        target,
        draft,
        raw,
        prompt,
        race_prompt=None,
        method=None,
        request: gr.Request = None,
    ):
        """Load the chosen models; update the mode, its controls and the transcript.

        ``method`` picks the drafter loaded with the target (see :meth:`load_pair`).
        Returns updates for: model status, mode note, send button, transcript,
        status, the raw checkbox, the completion and chat examples, stats,
        chart, message box, system prompt box and race prompt. A failed load
        clears the mode note and the stats.
        """
        session = self.sessions.get(_session_key(request))
        keep = gr.update()
        try:
            pair = self.load_pair(target, draft, method)
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
                keep,
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
            gr.update(visible=chat),
            _prompt_for_mode(race_prompt, chat),
        )

    def on_unload(self, request: gr.Request):
        """The page was closed: stop its generation and forget its session."""
        key = _session_key(request)
        self.sessions.get(key).stop.set()
        self.sessions.drop(key)

    # --- generation -------------------------------------------------------------

    def on_generate(self, page: PageRequest, request: gr.Request = None):
        """Stream one chat turn (or completion) into the page.

        Yields updates for: transcript, stats, chart, status, the message box
        and the Retry button. Every check runs before the box is emptied,
        which happens once the message is in the transcript; a request while
        the session's previous one runs (a double send) changes nothing.
        """
        yield from self._claimed(
            request,
            _busy(6),
            lambda session: self._chat(session, page, gr.update(value="")),
        )

    def on_retry(self, page: PageRequest, request: gr.Request = None):
        """Send the last failed message again (it leaves the transcript first).

        The message box keeps whatever is being typed.
        """
        yield from self._claimed(
            request, _busy(6), lambda session: self._retry(session, page)
        )

    def _retry(self, session: Session, page: PageRequest):
        failed = session.turns[-1] if session.turns else None
        if failed is None or failed.finish != "error":
            keep = gr.update()
            banner = render.banner("There is no failed message to retry.", "warn")
            yield keep, keep, keep, banner, keep, gr.update(visible=False)
            return
        session.turns = session.turns[:-1]
        page = PageRequest(**{**page.__dict__, "text": failed.user})
        yield from self._chat(session, page, gr.update())

    def _claimed(self, request, busy: tuple, run):
        """``run(session)``'s updates with the page's session claimed, or
        ``busy`` alone while another request of the page runs (see
        :meth:`ui.session.Session.claim`). The claim ends at ``run``'s
        :data:`DONE`, before its last updates reach the page."""
        session = self.sessions.get(_session_key(request))
        if not session.claim():
            yield busy
            return
        held = True
        try:
            for update in run(session):
                if update is not DONE:
                    yield update
                elif held:  # the work is over: the page may send again
                    held = False
                    session.release()
        finally:
            if held:
                session.release()

    def _chat(self, session: Session, page: PageRequest, cleared):
        """:meth:`on_generate` once the session is claimed; ``cleared`` is
        the message box's update once the message is in the transcript."""
        keep = gr.update()
        text = clean_message(page.text)
        session.stops_at_send = _stop_count(page.stops)
        try:
            options = page_options(page)
            raw = as_bool(page.raw, "raw")
            check_not_empty(text, "message")
            if self._needs_loading(page.target, page.draft, options.method):
                loading = render.banner("Loading models&hellip;")
                yield keep, keep, keep, loading, keep, keep
            pair = self.load_pair(page.target, page.draft, options.method)
            _check_pair(options, pair)
        except Exception as e:
            yield DONE
            yield keep, *_no_stats(), render.error_banner(e), keep, keep
            return
        chat = pair.has_chat_template and not raw
        key = (pair.target_path, chat)
        if session.pair_key != key:  # another model or mode: a new conversation
            session.turns = []
            session.pair_key = key
        if not chat:  # a completion prompt stays in the box, as typed
            text, cleared = clean_message(page.text, trim=False), keep
        epoch, turn, view = session.epoch, None, None
        box = keep
        stream = self._stream_turn(session, pair, text, options, chat, page.system)
        for turn, view in stream:
            if session.epoch != epoch:  # New chat was pressed: say it last too
                stream.close()
                *cleared_view, hide_retry = _new_chat_view(chat, stopped=True)
                yield (*cleared_view, keep, hide_retry)
                return
            if turn is not None:  # the message is in the transcript
                box, cleared = cleared, keep
            if turn is None or turn.finish is not None:
                yield DONE
            yield (*view, box, keep)
            box = keep
        if turn is None:  # refused before the turn started: the box keeps it
            yield (*view, keep, gr.update(visible=False))
            return
        status = self._final_status(turn, options)
        yield (*view[:3], status, box, gr.update(visible=turn.finish == "error"))

    def _stream_turn(
        self,
        session: Session,
        pair: Pair,
        text: str,
        options: SpecConfig,
        chat: bool,
        system: Optional[str] = None,
        use_cache: bool = True,
    ):
        """Yield ``(turn, view)`` while the worker generates one turn.

        ``view`` is (transcript, stats, chart, status), sent at most every
        ``UPDATE_INTERVAL`` seconds (and when the turn goes from waiting to
        reading its prompt to generating) and once at the end. A turn refused before it started ends
        with ``(None, view)``, its status the one-line error; a turn that
        failed later stays in the transcript with its error.
        """
        start = time.perf_counter()
        next_update, turn, shown = 0.0, None, None
        turns = respond(
            self.worker,
            session,
            pair,
            text,
            options,
            chat=chat,
            system=system,
            use_cache=use_cache,
            lend=_can_lend(options, pair),
            prefill_step_size=self.prefill_step_size,
        )
        try:
            for turn in turns:
                now, phase = time.perf_counter(), _phase(turn.progress)
                if now >= next_update or phase != shown:
                    next_update, shown = now + UPDATE_INTERVAL, phase
                    status = _progress_status(turn.progress)
                    yield turn, self._view(session, turn, chat, start, status)
        except Exception as e:
            log.warning(
                "generation failed: %s", e, exc_info=not isinstance(e, ValueError)
            )
            transcript = render.transcript_html(session.turns, chat, mono=not chat)
            yield (turn if turn is not None and turn.error is e else None), (
                transcript,
                *_no_stats(),
                render.error_banner(e),
            )
            return
        finally:
            turns.close()
        if turn is None:
            return
        yield turn, self._view(session, turn, chat, start, gr.update(), False)

    def _view(self, session, turn, chat, start, status, streaming=True):
        elapsed = time.perf_counter() - start
        stats = turn.stats
        return (
            render.transcript_html(
                session.turns, chat, mono=not chat, streaming=streaming
            ),
            render.stats_html(stats, reused=session.last_reused, elapsed=elapsed),
            _chart(turn, stats) if stats is not None else render.chart_svg([]),
            status,
        )

    def _final_status(self, turn: Turn, options: SpecConfig) -> str:
        if turn.error is not None:
            return render.error_banner(turn.error, retry=True)
        n = len(turn.pieces)
        if turn.finish == "stopped" and n == 0:
            return render.banner(
                "Stopped before the reply began; your message stays in the "
                "conversation.",
                "warn",
            )
        if turn.finish == "stopped":
            return render.banner(
                f"Stopped after {render.plural(n, 'token')}; the reply so far stays "
                "in the conversation and the next message continues from it.",
                "warn",
            )
        why = (
            "end of text"
            if turn.finish == "stop"
            else f"max tokens ({options.max_tokens})"
        )
        return render.banner(f"Done: {render.plural(n, 'token')} ({why}).", "ok")

    def on_stop(self, stops=0, request: gr.Request = None):
        """Stop this page's request: waiting, reading the prompt or generating.

        ``stops`` is the page's count of Stop presses: a Stop handled before
        the request it follows has started still stops it.
        """
        self.sessions.get(_session_key(request)).press_stop(_stop_count(stops) or 0)

    def on_clear(self, target, draft, raw, stops=0, request: gr.Request = None):
        """New chat: stop any reply and forget the conversation and its prompt cache.

        ``stops`` counts it as a Stop press (see :meth:`on_stop`): a message
        sent just before it is stopped too, and stays in the new chat.
        """
        session = self.sessions.get(_session_key(request))
        running = session.busy
        session.press_stop(_stop_count(stops) or 0)
        session.reset()
        chat = self._chat_mode(target, draft, raw)
        return _new_chat_view(chat, stopped=running)

    def _chat_mode(self, target, draft, raw) -> bool:
        """Whether the (already loaded) target chats; ``True`` when unknown."""
        if self._needs_loading(target, None, "none"):  # the target alone
            return True
        try:
            return self.load_pair(target, None, "none").has_chat_template and not raw
        except ValueError:
            return True

    # --- race ---------------------------------------------------------------------

    def on_race(self, page: PageRequest, request: gr.Request = None):
        """Plain decoding, then the chosen method, on the same prompt; then the verdict.

        In chat mode the prompt is one user message (after the system prompt)
        through the chat template. Yields updates for: plain text, plain
        stats, speculative lane header, speculative text, speculative stats,
        verdict, and the page's stats cards and chart (which follow the
        speculative lane). Like a chat turn, it claims the page's session.
        """
        yield from self._claimed(
            request, _busy(8, at=5), lambda session: self._race(session, page)
        )

    def _race(self, session: Session, page: PageRequest):
        session.stops_at_send = _stop_count(page.stops)
        session.begin_turn()
        keep = gr.update()
        empty = render.transcript_html([Turn("")], chat=False)
        no_stats, no_chart = render.stats_html(None), render.chart_svg([])
        head = lane_head(page.method)
        text = clean_message(page.text, trim=False)

        def failed(banner):
            return (empty, no_stats, head, empty, no_stats, banner, no_stats, no_chart)

        try:
            options = page_options(page)
            raw = as_bool(page.raw, "raw")
            if options.method == "none":
                raise ValueError(
                    "choose a speculative method to race against plain decoding."
                )
            check_not_empty(text, "prompt")
            if self._needs_loading(page.target, page.draft, options.method):
                loading = render.banner("Loading models&hellip;")
                yield keep, keep, head, keep, keep, loading, keep, keep
            pair = self.load_pair(page.target, page.draft, options.method)
            _check_pair(options, pair)
        except Exception as e:
            yield failed(render.error_banner(e))
            return
        chat = pair.has_chat_template and not raw
        plain_opts = replace(options, method="none")
        # plain text, plain stats, spec text, spec stats
        views = [empty, no_stats, empty, no_stats]
        page_stats, chart_view = no_stats, no_chart

        def update(status):
            return (*views[:2], head, *views[2:], status, page_stats, chart_view)

        yield update(render.banner("Racing: warming up both methods&hellip;"))
        try:
            tokens = encode_prompt(pair.tokenizer, text, [], chat, page.system)
            self.worker.call(_warm_up, pair, tokens, (plain_opts, options))
        except Exception as e:
            yield failed(render.error_banner(e))
            return
        lanes = []
        for lane, opts in enumerate((plain_opts, options)):
            lane_session = Session(stop=session.stop)
            label = "plain decoding" if lane == 0 else options.method
            running = render.banner(
                f"Racing: running <b>{html.escape(label)}</b>&hellip;"
            )
            turn = None
            stream = self._stream_turn(
                lane_session, pair, text, opts, chat, page.system, use_cache=False
            )
            for turn, view in stream:
                if turn is None or turn.error is not None:
                    yield failed(view[3])
                    return
                views[2 * lane] = render.transcript_html(
                    [turn], False, not chat, prompt=False, streaming=turn.finish is None
                )
                views[2 * lane + 1] = view[1]
                if lane == 1:
                    page_stats, chart_view = view[1], view[2]
                waiting = turn.progress is not None and turn.finish is None
                yield update(view[3] if waiting else running)
            if turn.finish == "stopped":
                yield DONE
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
        yield DONE
        yield update(verdict + _draft_size_note(pair))

    # --- API ----------------------------------------------------------------------

    def api_generate(
        self,
        prompt: str,
        model: str = "",
        draft_model: str = "",
        method: str = DEFAULT_METHOD,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        temp: float = SPEC_DEFAULTS["temp"],
        top_p: float = SPEC_DEFAULTS["top_p"],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: Optional[int] = None,
        raw: bool = False,
        tree_budget: int = SPEC_DEFAULTS["tree_budget"],
        adaptive: bool = SPEC_DEFAULTS["adaptive"],
        system_prompt: str = "",
    ) -> Dict[str, Any]:
        """Generate a complete reply; returns {"text", "finish_reason", "stats"}.

        Empty ``model`` means the default pair; ``raw`` ignores a chat
        template; ``system_prompt`` goes first through the chat template.
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
            raw = as_bool(raw, "raw")
            if not model:
                model, draft_model = (
                    self.default_target,
                    draft_model or self.default_draft,
                )
            pair = self.load_pair(model, draft_model or None, options.method)
            _check_pair(options, pair)
            chat = pair.has_chat_template and not raw
            turn = None
            for turn in respond(
                self.worker,
                Session(),
                pair,
                clean_message(prompt, trim=False),
                options,
                chat=chat,
                system=system_prompt,
                use_cache=False,
            ):
                pass
        except Exception as e:
            log.warning(
                "generate failed: %s", e, exc_info=not isinstance(e, ValueError)
            )
            message = (str(e).strip() or type(e).__name__).splitlines()[0]
            raise gr.Error(message, print_exception=False) from None
        last_stats = turn.stats.as_dict() if turn is not None and turn.stats else {}
        # JSON's own view (int keys as text): Gradio's encoder refuses int keys.
        last_stats = json.loads(json.dumps(last_stats))
        return {
            "text": turn.reply if turn is not None else "",
            "finish_reason": turn.finish if turn is not None else None,
            "stats": last_stats,
        }

    # --- page -------------------------------------------------------------------------

    def _starting_mode(self) -> Tuple[bool, bool]:
        """``(has_chat_template, chat)`` of the starting pair (completion if unknown)."""
        starting = (self.default_target, self.default_draft, self.default_method)
        if self._needs_loading(*starting):
            return False, False
        try:
            pair = self.load_pair(*starting)
        except ValueError:
            return False, False
        return pair.has_chat_template, pair.has_chat_template

    def build(self) -> gr.Blocks:
        """The page (see :func:`ui.layout.build`)."""
        return layout.build(self)


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


def _prompt_for_mode(prompt: Optional[str], chat: bool):
    """Swap an untouched example prompt for one that suits the mode."""
    prompt = prompt or ""
    if chat and (not prompt.strip() or prompt in COMPLETION_EXAMPLES):
        return CHAT_PROMPT
    if not chat and (not prompt.strip() or prompt in CHAT_EXAMPLES):
        return COMPLETION_PROMPT
    return gr.update()


def _check_pair(options: SpecConfig, pair: Pair):
    """Refuse a method whose drafter is missing or of another kind, in the page's words."""
    check_drafter(options.method, drafter_kind(pair.draft_model), words=PAGE_WORDS)


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


def _progress_status(progress) -> str:
    """The status line while a turn waits, reads its prompt or generates."""
    stop = " press <b>Stop</b> to cancel."
    if isinstance(progress, Waiting):
        ahead = render.plural(progress.ahead, "request")
        return render.banner(f"Waiting for {ahead} ahead&hellip;{stop}")
    if isinstance(progress, Prefill):
        return render.banner(
            f"Reading the prompt: {progress.done:,} of {progress.total:,} "
            f"tokens&hellip;{stop}"
        )
    return render.banner(f"Generating&hellip;{stop}")


def _busy(outputs: int, at: int = 3) -> tuple:
    """Updates that change only the status (output ``at``) to :data:`BUSY`."""
    updates = [gr.update()] * outputs
    updates[at] = render.banner(BUSY, "warn")
    return tuple(updates)


def _new_chat_view(chat: bool, stopped: bool):
    """Transcript, stats, chart, status and Retry after New chat."""
    said = "the conversation and its prompt cache are cleared."
    if stopped:
        said = "the reply in progress was stopped; " + said
    return (
        render.transcript_html([], chat),
        *_no_stats(),
        render.banner(f"New chat: {said}", "ok"),
        gr.update(visible=False),
    )


def _phase(progress):
    """What a turn is doing: its place in the queue, its prefill or its reply."""
    if isinstance(progress, Waiting):
        return progress
    return type(progress)


def _can_lend(options: SpecConfig, pair: Pair) -> bool:
    """Whether a run may let waiting requests run between its chunks and tokens.

    Not when its drafter taps the target's layers (heads, MTP: another
    request's forwards would be recorded) or when a seed fixes its samples.
    """
    taps = drafter_kind(pair.draft_model) not in (None, "draft")
    seeded = options.seed is not None and options.temp > 0
    return not (taps or seeded)


def _warm_up(pair: Pair, tokens: List[int], methods: Tuple[SpecConfig, ...]):
    """Run each method for two tokens so neither lane pays first-use costs."""
    for options in methods:
        short = replace(options, max_tokens=2)
        for _ in run_turn(Session(), pair, tokens[:16], short, use_cache=False):
            pass


def _stop_count(value) -> Optional[int]:
    """The page's count of Stop presses (``None`` when an API caller sends none)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return int(value) if number and math.isfinite(value) and value >= 0 else None


def _session_key(request: Optional[gr.Request]) -> Optional[str]:
    return getattr(request, "session_hash", None) if request is not None else None
