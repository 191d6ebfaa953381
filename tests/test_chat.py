"""mlx_spec.chat: driven through a pseudo-terminal, and turn by turn in process."""

import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx_lm
import pytest

from mlx_spec.cli.chat import Chat, setup_arg_parser

REPO = Path(__file__).resolve().parent.parent
STATS_LINE = re.compile(r"\[Speculation: (\w+).*prompt (\d+) new tokens, (\d+) cached")


class Terminal:
    """A child process on a pseudo-terminal, read until a pattern shows up."""

    def __init__(self, argv, timeout=90):
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO), TERM="dumb"),
            close_fds=True,
        )
        os.close(slave)
        self.timeout = timeout
        self.output = ""

    def expect(self, pattern: str) -> re.Match:
        deadline = time.monotonic() + self.timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.output)
            if match:
                self.output = self.output[match.end() :]
                return match
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {pattern!r} in {self.output!r}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    data = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    data = b""
                if not data:
                    raise EOFError(f"no {pattern!r} in {self.output!r}")
                self.output += data.decode(errors="replace")

    def send(self, line: str):
        os.write(self.master, (line + "\n").encode())

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        os.close(self.master)


def test_two_turns_through_a_pseudo_terminal(pair_flags):
    terminal = Terminal(
        [
            sys.executable,
            "-m",
            "mlx_spec",
            "chat",
            *pair_flags,
            "--max-tokens",
            "8",
        ]
    )
    try:
        method = terminal.expect(r"\[speculative: (\w+)\]").group(1)
        terminal.expect(">> ")
        terminal.send("Write a parser.")
        first = terminal.expect(STATS_LINE)
        assert first.group(1) == method
        assert int(first.group(3)) == 0  # nothing cached before the first turn
        terminal.expect(">> ")
        terminal.send("Now a lexer.")
        second = terminal.expect(STATS_LINE)
        # The second turn prefills only its own tokens on top of the first turn.
        assert int(second.group(3)) >= int(first.group(2)) + 1
        terminal.expect(">> ")
        terminal.send("q")
        terminal.expect("bye")
        assert terminal.process.wait(timeout=30) == 0
    finally:
        terminal.close()


@pytest.fixture(scope="module")
def pair(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    return model, tokenizer, draft


def _chat(pair, *flags):
    model, tokenizer, draft = pair
    args = setup_arg_parser().parse_args(["--max-tokens", "8", *flags])
    out = io.StringIO()
    return Chat(model, tokenizer, draft, args, out), out


def test_turns_with_kept_cache_equal_one_shot_greedy(pair):
    model, tokenizer, _ = pair
    chat, out = _chat(pair)
    first = chat.reply("Write a parser.")
    cached = chat.cached_tokens
    second = chat.reply("Now a lexer.")
    assert cached > 0 and chat.cached_tokens > cached
    history = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a parser."}], add_generation_prompt=True
    )
    history += first.tokens
    history += tokenizer.apply_chat_template(
        [{"role": "user", "content": "Now a lexer."}], add_generation_prompt=True
    )
    expected = [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, history, max_tokens=8)
    ]
    assert second.tokens == expected
    assert out.getvalue().count("[Speculation: ") == 2


@pytest.mark.parametrize("template", [True, False])
def test_a_turn_of_invalid_utf8_is_answered_with_replacement(pair, template):
    """A terminal gives invalid UTF-8 as lone surrogates: the tokenizer raised
    a TypeError traceback; now they read as U+FFFD, as mlx_lm's stdin would."""
    bad = b"sys \xff".decode("utf-8", "surrogateescape")
    flags = ["--system-prompt", bad] if template else ["--ignore-chat-template"]
    chat, _ = _chat(pair, *flags)
    reply = chat.reply(b"def f(\xff\xfe):".decode("utf-8", "surrogateescape"))
    fixed, _ = _chat(pair, *[f.replace(bad, "sys \ufffd") for f in flags])
    assert reply.tokens == fixed.reply("def f(\ufffd\ufffd):").tokens


def test_plain_continuation_mode_continues_the_text(pair):
    model, tokenizer, _ = pair
    chat, out = _chat(pair, "--ignore-chat-template")
    assert not chat.use_template
    first = chat.reply("def fibonacci(n):")
    second = chat.reply("\n    return")
    history = tokenizer.encode("def fibonacci(n):") + first.tokens
    history += tokenizer.encode("\n    return", add_special_tokens=False)
    expected = [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, history, max_tokens=8)
    ]
    assert second.tokens == expected


def test_reset_empties_the_cache(pair):
    chat, _ = _chat(pair, "--speculative", "none")
    assert chat.draft_model is None
    chat.reply("hello")
    assert chat.cached_tokens > 0
    chat.reset()
    assert chat.cached_tokens == 0


def test_lookup_leaves_a_given_draft_model_unloaded_with_a_note(
    checkpoints, monkeypatch, capsys
):
    from mlx_spec.cli import chat as chat_module

    lines = iter(["def add(a, b):", "q"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    other = str(checkpoints["llama-othertok"])  # refused, were it loaded
    args = setup_arg_parser().parse_args(
        ["--model", str(checkpoints["llama"]), "--draft-model", other]
        + ["--speculative", "lookup", "--max-tokens", "4"]
    )
    out = io.StringIO()
    chat_module.run(args, out)
    assert capsys.readouterr().err.splitlines() == [
        "note: --speculative lookup does not use a draft model; "
        f"--draft-model {other} is not loaded."
    ]
    text = out.getvalue()
    assert "[draft " not in text and "[Speculation: lookup" in text


def test_run_says_when_it_falls_back_to_continuation_mode(checkpoints, monkeypatch):
    from mlx_spec.cli import chat as chat_module

    lines = iter(["def add(a, b):", "h", "q"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    args = setup_arg_parser().parse_args(
        [
            "--model",
            str(checkpoints["llama"]),
            "--ignore-chat-template",
            "--speculative",
            "none",
            "--max-tokens",
            "4",
        ]
    )
    out = io.StringIO()
    chat_module.run(args, out)
    text = out.getvalue()
    assert "plain continuation mode" in text
    assert "[Speculation: none" in text
    assert text.endswith("bye\n")


def test_later_turns_pass_the_cached_conversation_as_history(pair, monkeypatch):
    """Prompt lookup must see earlier turns, though only new tokens are prefilled."""
    from mlx_spec.cli import chat as chat_module

    real = chat_module.stream_generate
    seen = []

    def spy(*args, history_tokens=None, **kwargs):
        seen.append(history_tokens)
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "stream_generate", spy)
    chat, _ = _chat(pair, "--speculative", "lookup")
    first_prompt = chat._prompt("Write a parser.")
    first = chat.reply("Write a parser.")
    chat.reply("Now a lexer.")
    assert seen[0] is None
    assert seen[1] == first_prompt + first.tokens
    assert len(chat.history) == chat.cached_tokens
    chat.reset()
    assert chat.history == []


class CtrlCAt(io.StringIO):
    """A chat's output that sends this process SIGINT as the chat writes its
    ``k``-th piece (the ``k``-th token of the first reply)."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.pieces = k, 0

    def write(self, text):
        self.pieces += 1
        if self.pieces == self.k:
            signal.raise_signal(signal.SIGINT)
        return super().write(text)


def _greedy(pair, history) -> list:
    model, tokenizer, _ = pair
    steps = mlx_lm.stream_generate(model, tokenizer, history, max_tokens=8)
    return [r.token for r in steps]


def test_ctrl_c_stops_a_reply_and_the_next_turn_goes_on_from_its_tokens(pair):
    model, tokenizer, draft = pair
    args = setup_arg_parser().parse_args(["--max-tokens", "8"])
    out = CtrlCAt(3)
    chat = Chat(model, tokenizer, draft, args, out)
    history = chat._prompt("Write a parser.")
    first = chat.reply("Write a parser.")
    assert len(first.tokens) == 3
    assert "\n[interrupted after 3 tokens]\n" in out.getvalue()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    history += first.tokens + chat._prompt("Now a lexer.")
    assert chat.reply("Now a lexer.").tokens == _greedy(pair, history)


def test_ctrl_c_in_the_prompt_drops_the_turn(pair, monkeypatch):
    from mlx_spec.cli.chat import CtrlC

    chat, out = _chat(pair)
    history = chat._prompt("Write a parser.")
    history += chat.reply("Write a parser.").tokens
    cached = chat.cached_tokens
    stop = CtrlC.stop

    def ctrl_c_first(self):  # the stream asks first after the prompt's prefill
        signal.raise_signal(signal.SIGINT)
        return stop(self)

    monkeypatch.setattr(CtrlC, "stop", ctrl_c_first)
    assert chat.reply("Tell me a long story.").tokens == []
    assert "[interrupted in the prompt; this turn is dropped]" in out.getvalue()
    assert chat.cached_tokens == cached
    monkeypatch.setattr(CtrlC, "stop", stop)
    history += chat._prompt("Now a lexer.")
    assert chat.reply("Now a lexer.").tokens == _greedy(pair, history)


def test_ctrl_c_at_the_prompt_ends_the_chat(checkpoints, monkeypatch):
    from mlx_spec.cli import chat as chat_module

    def ctrl_c(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", ctrl_c)
    args = setup_arg_parser().parse_args(
        ["--model", str(checkpoints["llama"]), "--speculative", "none"]
    )
    out = io.StringIO()
    chat_module.run(args, out)
    assert out.getvalue().endswith("bye\n")
