"""The page: the Gradio blocks of the app and which handler each event calls.

:func:`build` lays out the Chat and Race tabs, the statistics and the
settings, and wires every event to a handler of an
:class:`ui.handlers.App`. The page's fixed texts (method labels and help,
example prompts) and its theme live here too. No MLX work happens here.
"""

import html
from dataclasses import dataclass, fields
from inspect import Parameter, Signature
from typing import Any, Callable, Dict

import gradio as gr

from mlx_spec.config import METHODS, SpecConfig

from . import render
from .session import NO_DRAFT, known_models

# The settings' starting values: SpecConfig's own defaults, declared once there.
SPEC_DEFAULTS = {f.name: f.default for f in fields(SpecConfig)}

METHOD_LABELS = {
    "none": "none (plain decoding)",
    "draft": "draft (draft model)",
    "tree": "tree (token tree)",
    "lookup": "lookup (prompt lookup)",
    "self": "self (self-speculation)",
    "auto": "auto (keeps the fastest)",
    "eagle": "eagle (EAGLE head, tree)",
    "eagle-chain": "eagle-chain (EAGLE head, chain)",
    "medusa": "medusa (Medusa heads)",
    "mtp": "mtp (the model's MTP layer)",
    "dflash": "dflash (DFlash block drafter)",
}

METHOD_HELP = {
    "none": "plain mlx_lm decoding (the baseline)",
    "draft": "a small draft model proposes γ tokens; the target checks them in one forward",
    "tree": "a tree of draft continuations, verified in one forward",
    "lookup": "drafts copied from n-grams already in the text (no draft model)",
    "self": "the target drafts with a subset of its own layers",
    "auto": "copies from the text when lookup finds a good match; otherwise plain "
    "steps or the methods your models allow (draft, tree; self without a draft), "
    "whichever is fastest, measured round by round",
    "eagle": "a trained EAGLE head (chosen as the draft model) grows a token tree "
    "from the target's own features",
    "eagle-chain": "a trained EAGLE head (chosen as the draft model) drafts a chain",
    "medusa": "trained Medusa heads (chosen as the draft model) propose a tree of "
    "next tokens in one step",
    "mtp": "the model's own multi-token-prediction layer drafts (checkpoints that ship one)",
    "dflash": "a published DFlash drafter (chosen as the draft model) drafts a block "
    "of tokens in one forward from the target's features",
}

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
    "Add type hints to this function and keep the rest as it is:\n\n"
    "def scale(values, factor):\n    return [v * factor for v in values]",
]

HEADER = """
<div class="spec-header">
  <h1>mlx-spec</h1>
  <p>Exact speculative decoding for MLX: a cheap drafter guesses, the model checks
  several tokens in one forward. Same text as plain decoding, fewer slow steps.</p>
</div>
"""

RACE_HELP = (
    '<div class="spec-note">Runs plain mlx_lm decoding, then the chosen method, on the '
    "same prompt and shows the measured speed ratio. At temperature 0 the two texts "
    "must be identical.</div>"
)
# The transcript fills the window's height but leaves the message box below
# it (and its Stop / New chat buttons) in view.
TRANSCRIPT_MAX_HEIGHT = "max(200px, calc(100vh - 400px))"
PLAIN_HEAD = '<div class="spec-lane-head">Plain mlx_lm decoding</div>'


def checked_by_handler(component):
    """``component`` handing its value to the handler as sent (range-checked if a
    number), so the handler names the field of temp "hot" or max tokens 2.5:
    Gradio fails on "hot" with a bare ``TypeError`` and rounds 2.5 to 2."""

    def preprocess(payload):
        if isinstance(payload, (int, float)):
            gr.Number.raise_if_out_of_bounds(
                payload, component.minimum, component.maximum
            )
        return payload

    # On the instance: a subclass would make Gradio write a .pyi next to this file.
    component.preprocess = preprocess
    return component


@dataclass
class PageRequest:
    """The page's values for one generation: the inputs of ``/chat`` and
    ``/race``, in this order, as the page (or an API caller) sent them."""

    text: Any
    target: Any
    draft: Any
    method: Any
    gamma: Any
    tree_budget: Any
    adaptive: Any
    temp: Any
    top_p: Any
    max_tokens: Any
    seed: Any
    raw: Any
    system: Any = ""
    stops: Any = None  # the page's count of Stop presses when it sent this


# Enter sends, Shift+Enter makes a new line, Ctrl/Cmd+Enter sends too. Keys go
# through the button, so one guard (its handler's) covers keys and clicks;
# Gradio's own Shift+Enter submit never sees the key. Clicks of one task are one
# send: Gradio's "once" trigger lets them all through (it marks a send pending
# only after an await), and the handler's claim misses those that reach the
# server after a short reply is over.
KEYS_JS = """
() => {
  const buttons = {prompt: "send", "race-prompt": "race"};
  const sending = new Set();
  document.addEventListener("click", (e) => {
    const button = e.target.closest && e.target.closest("#send, #race, #retry");
    if (!button) return;
    if (sending.has(button.id)) {
      e.stopImmediatePropagation();
      e.preventDefault();
      return;
    }
    sending.add(button.id);
    setTimeout(() => sending.delete(button.id), 0);
  }, true);
  const boxOf = (e) => e.target.tagName === "TEXTAREA" && e.key === "Enter"
    && !e.isComposing && e.target.closest("#prompt, #race-prompt");
  document.addEventListener("keydown", (e) => {
    const box = boxOf(e);
    if (!box) return;
    e.stopPropagation();
    if (e.shiftKey && !(e.ctrlKey || e.metaKey)) return;
    e.preventDefault();
    document.getElementById(buttons[box.id]).click();
  }, true);
  // Gradio submits on Shift+Enter's keypress: the newline is ours.
  document.addEventListener("keypress", (e) => {
    if (boxOf(e)) e.stopPropagation();
  }, true);
}
"""


# Stop and New chat count their presses in the page and send the count; each
# request sends the count at its send, so a Stop handled before its request
# starts still stops it (the server runs the two events in any order).
def with_stop_count(inputs: int, press: bool = False) -> str:
    """The JS that sends an event's ``inputs`` values, the last one replaced by
    the page's count of Stop presses (after counting this one, with ``press``).
    Gradio passes the outputs' values after the inputs'."""
    count = (
        "window.mlxSpecStops = (window.mlxSpecStops || 0) + 1"
        if press
        else "window.mlxSpecStops || 0"
    )
    return f"(...values) => values.slice(0, {inputs - 1}).concat([{count}])"


def page_event(handler: Callable) -> Callable:
    """``handler(PageRequest, request)`` as a Gradio event function that takes
    the page's values (the fields of :class:`PageRequest`, in order)."""

    def event(*args):
        *values, request = args
        yield from handler(PageRequest(*values), request)

    params = [
        Parameter(f.name, Parameter.POSITIONAL_OR_KEYWORD) for f in fields(PageRequest)
    ]
    params.append(
        Parameter("request", Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    )
    event.__signature__ = Signature(params)
    event.__annotations__ = {"request": gr.Request}
    event.__name__ = handler.__name__
    return event


def lane_head(method) -> str:
    """The speculative lane's header, naming its method."""
    label = METHOD_LABELS.get(method, str(method))
    return f'<div class="spec-lane-head">Speculative: {html.escape(label)}</div>'


def method_info(method: str) -> str:
    """The method's help line, capitalised, for the method picker."""
    return METHOD_HELP.get(method, "")[:1].upper() + METHOD_HELP.get(method, "")[1:]


def launch_kwargs() -> Dict[str, Any]:
    """Theme and CSS for ``Blocks.launch`` (Gradio 6 takes them there)."""
    system = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"]
    mono = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
    theme = gr.themes.Soft(primary_hue="indigo", font=system, font_mono=mono)
    return dict(theme=theme, css=render.CSS, js=KEYS_JS, ssr_mode=False)


def build(app) -> gr.Blocks:
    """The page of ``app``: the chat on the left, stats and settings on the right.

    The transcript's height is capped so that the message box and its buttons
    below it stay in view on a 1440x900 screen without scrolling.
    """
    models = known_models(app.default_target, app.default_draft)
    model_choices = [(label, path) for label, path in models]
    draft_choices = [(NO_DRAFT, NO_DRAFT)] + model_choices
    method_choices = [(METHOD_LABELS.get(m, m), m) for m in METHODS]
    has_template, chat = app._starting_mode()
    first_prompt = CHAT_PROMPT if chat else COMPLETION_PROMPT
    with gr.Blocks(title="mlx-spec", analytics_enabled=False) as demo:
        gr.HTML(HEADER, padding=False)
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                with gr.Tabs():
                    with gr.Tab("Chat", id="generate"):
                        gr.HTML(render.legend_html(), elem_id="legend", padding=False)
                        transcript = gr.HTML(
                            render.transcript_html([], chat),
                            elem_id="transcript",
                            autoscroll=True,
                            max_height=TRANSCRIPT_MAX_HEIGHT,
                            min_height=200,
                            container=True,
                            padding=True,
                        )
                        with gr.Row(equal_height=True):
                            prompt = gr.Textbox(
                                value=first_prompt,
                                lines=2,
                                max_lines=8,
                                show_label=False,
                                placeholder="Type a message or the start of some "
                                "code (Enter sends, Shift+Enter for a new line)",
                                elem_id="prompt",
                                scale=4,
                            )
                            with gr.Column(scale=1, min_width=230):
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
                                        "New chat", elem_id="clear", min_width=100
                                    )
                                retry = gr.Button(
                                    "Retry", elem_id="retry", visible=False
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
                                value=first_prompt,
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
                                    lane_head(app.default_method),
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
                mode_note = gr.HTML(elem_id="mode-note", padding=False)
                status = gr.HTML(elem_id="status", padding=False)
                stats = gr.HTML(render.stats_html(None), elem_id="stats")
                chart = gr.HTML(render.chart_svg([]), elem_id="chart")
                with gr.Accordion("Models and method", open=True):
                    target = gr.Dropdown(
                        model_choices,
                        value=app.default_target,
                        label="Target model",
                        info="A local mlx_lm model folder or a Hugging Face repo",
                        allow_custom_value=True,
                        elem_id="target",
                    )
                    draft = gr.Dropdown(
                        draft_choices,
                        value=app.default_draft or NO_DRAFT,
                        label="Draft model",
                        info="Must share the target's tokenizer",
                        allow_custom_value=True,
                        elem_id="draft",
                    )
                    method = gr.Dropdown(
                        method_choices,
                        value=app.default_method,
                        label="Method",
                        elem_id="method",
                        info=method_info(app.default_method),
                    )
                    raw = gr.Checkbox(
                        False,
                        label="Ignore the chat template (raw completion)",
                        visible=has_template,
                        elem_id="raw",
                    )
                    system = gr.Textbox(
                        "",
                        label="System prompt",
                        placeholder="(the chat template's default)",
                        lines=2,
                        max_lines=6,
                        visible=chat,
                        elem_id="system",
                    )
                    model_status = gr.HTML(elem_id="model-status")
                with gr.Accordion("Options", open=True):
                    gamma = gr.Slider(
                        1,
                        16,
                        value=app.default_gamma,
                        step=1,
                        label="γ: draft tokens per round",
                    )
                    tree_budget = gr.Slider(
                        1,
                        64,
                        value=SPEC_DEFAULTS["tree_budget"],
                        step=1,
                        label="Tree budget (nodes per round)",
                        visible=app.default_method == "tree",
                    )
                    adaptive = gr.Checkbox(
                        SPEC_DEFAULTS["adaptive"],
                        label="Adaptive: choose the draft length or tree size per round",
                    )
                    temp = gr.Slider(
                        0.0,
                        2.0,
                        value=SPEC_DEFAULTS["temp"],
                        step=0.05,
                        label="Temperature",
                        info="0 is greedy",
                    )
                    top_p = gr.Slider(
                        0.05,
                        1.0,
                        value=SPEC_DEFAULTS["top_p"],
                        step=0.05,
                        label="Top-p",
                    )
                    with gr.Row():
                        max_tokens = gr.Number(
                            app.default_max_tokens,
                            precision=0,
                            label="Max tokens",
                            elem_id="max-tokens",
                        )
                        seed = gr.Textbox(
                            "", label="Seed", placeholder="random", elem_id="seed"
                        )

        for number in (gamma, tree_budget, temp, top_p, max_tokens):
            checked_by_handler(number)
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
            system,
        ]
        # The page's count of Stop presses, sent with each request and each Stop.
        stops = gr.Number(0, precision=0, visible=False)
        # No concurrency limit: the handlers queue their MLX work on the app's
        # worker themselves, so they can say where they wait and be stopped.
        gen_outputs = [transcript, stats, chart, status, prompt, retry]
        send.click(
            page_event(app.on_generate),
            [prompt, *settings, stops],
            gen_outputs,
            api_name="chat",
            concurrency_limit=None,
            show_progress="hidden",
            js=with_stop_count(len(settings) + 2),
        )
        retry.click(
            page_event(app.on_retry),
            [prompt, *settings, stops],
            gen_outputs,
            api_visibility="private",
            concurrency_limit=None,
            show_progress="hidden",
            js=with_stop_count(len(settings) + 2),
        )
        for button in (stop, race_stop):
            button.click(
                app.on_stop,
                stops,
                None,
                concurrency_limit=None,
                api_visibility="private",
                show_progress="hidden",
                js=with_stop_count(1, press=True),
            )
        clear.click(
            app.on_clear,
            [target, draft, raw, stops],
            [transcript, stats, chart, status, retry],
            api_visibility="private",
            concurrency_limit=None,
            js=with_stop_count(4, press=True),
        )
        race.click(
            page_event(app.on_race),
            [race_prompt, *settings, stops],
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
            concurrency_limit=None,
            show_progress="hidden",
            js=with_stop_count(len(settings) + 2),
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
            system,
            race_prompt,
        ]
        # The method picks the drafter too (mtp, auto without a draft), so it
        # refreshes the model status line; the transcript stays.
        for trigger in (
            target.change,
            draft.change,
            raw.change,
            method.change,
            demo.load,
        ):
            trigger(
                app.on_models,
                [target, draft, raw, prompt, race_prompt, method],
                model_outputs,
                api_visibility="private",
            )
        method.change(
            lambda m: (
                gr.update(visible=m == "tree"),
                gr.update(info=method_info(m)),
                lane_head(m),
            ),
            method,
            [tree_budget, method, spec_head],
            api_visibility="private",
            queue=False,
        )
        demo.unload(app.on_unload)
        gr.api(app.api_generate, api_name="generate", concurrency_limit=None)
    return demo
