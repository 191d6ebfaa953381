"""``mlx_spec.chat``: an interactive terminal chat with speculative decoding.

Like ``mlx_lm.chat`` (same flags, same ``q``/``r``/``h`` commands), plus
the speculative options. The prompt cache of both models is kept across
turns, so each turn only prefills its new tokens, and a statistics line
follows every reply.

Under ``mlx.launch`` the target is sharded as ``mlx_spec.generate`` shards
it: rank 0 reads each line and shares it, every rank generates alike, and
rank 0 alone prints. Ctrl-C, which rank 0 alone hears, stops a reply on
every rank after the same token; at the prompt it ends the chat.

Models without a chat template (such as the default pair, a code
completion model) run in plain continuation mode: each input is appended
to the text so far and the model continues it.
"""

from .._blas import ensure_fast_blas

ensure_fast_blas()

import argparse
import signal
import sys
from typing import Any, List, NamedTuple, Optional

import mlx.core as mx
from mlx_lm.chat import setup_arg_parser as mlx_lm_chat_parser
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from mlx_spec_entry import guarded

from ..caches.owners import spoiled
from ..chat_text import repair_text
from ..config import plan_method
from ..distributed import (
    errors_in_one_line,
    flag_from_rank0,
    rank,
    rank0_prints,
    sharded_group,
    shared_seed,
    text_from_rank0,
)
from ..generation import history_kwargs, stream_generate
from ..interrupts import SigintCaught
from ..limits import GenerationCancelled
from ..loading import default_model_pair, load_pair, skip_unused_draft
from ..options import add_speculative_options, one_line_errors
from ..validation import spec_config_of_args

HELP = "commands: q exit, r reset the conversation, h help"


def setup_arg_parser() -> argparse.ArgumentParser:
    """mlx_lm.chat's parser plus the draft model and the speculative options."""
    parser = one_line_errors(mlx_lm_chat_parser())
    parser.prog = "mlx_spec.chat"
    parser.description = "Chat with an LLM, with exact speculative decoding."
    for action in parser._actions:
        if action.dest == "model":
            action.default = None
            action.help = (
                "The path to the local model directory or Hugging Face repo. "
                "Default: the embedded default pair (with its draft)."
            )
        elif action.dest == "temp":
            action.help = "Sampling temperature (default: 0.0, greedy)."
        elif action.dest == "top_p":
            action.help = "Sampling top-p (default: 1.0, off)."
    parser.add_argument(
        "--draft-model",
        default=None,
        help="A draft model for the draft/tree methods (same tokenizer).",
    )
    parser.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="Use plain continuation mode even if the model has a chat template.",
    )
    add_speculative_options(parser)
    return parser


class Reply(NamedTuple):
    """One turn's reply: its text, its tokens and the generation's stats."""

    text: str
    tokens: List[int]
    stats: Any


class CtrlC(SigintCaught):
    """Ctrl-C during a reply, heard by rank 0 and acted on by every rank alike.

    Within ``with``, SIGINT sets :attr:`pressed` instead of raising.
    :meth:`stop` is the reply's ``should_stop``: each time the stream asks
    (after each prefill chunk and each token, sharded each 8th) it shares
    rank 0's :attr:`pressed` with every rank, as the server shares a client's
    hang-up, so all stop after the same token. Where SIGINT is ignored (every rank
    but 0 of a sharded chat) or outside the main thread, SIGINT is left alone.
    """

    def __init__(self):
        super().__init__()
        self.pressed = False

    def caught(self):
        self.pressed = True

    def __enter__(self):
        self.pressed = False
        return super().__enter__()

    def stop(self) -> bool:
        return flag_from_rank0(self.pressed, sharded_group())


class Chat:
    """One conversation: the models, the kept prompt cache and the turns."""

    def __init__(
        self, model, tokenizer, draft_model, args, out=sys.stdout, config=None
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.args = args
        self.out = out
        if config is None:
            config = spec_config_of_args(args, draft_model, max_tokens=args.max_tokens)
        self.config = config
        self.method, uses_draft = plan_method(config.method, draft_model)
        self.draft_model = draft_model if uses_draft else None
        self.use_template = (
            tokenizer.has_chat_template and not args.ignore_chat_template
        )
        if args.xtc_probability > 0:
            special = tokenizer.encode("\n") + list(tokenizer.eos_token_ids)
            self.sampler = mlx_lm_make_sampler(
                args.temp,
                args.top_p,
                xtc_threshold=args.xtc_threshold,
                xtc_probability=args.xtc_probability,
                xtc_special_tokens=special,
            )
        else:
            from ..sampling import make_sampler, top_p_or_off

            self.sampler = make_sampler(args.temp, top_p_or_off(args.top_p))
        self.reset()

    def reset(self):
        self.cache = make_prompt_cache(self.model, self.args.max_kv_size)
        if self.draft_model is not None:
            self.cache += make_prompt_cache(self.draft_model, self.args.max_kv_size)
        # Every token in the cache, oldest first (the prompt lookup context).
        self.history: List[int] = []
        self.turns = 0

    @property
    def cached_tokens(self) -> int:
        return len(self.history)  # recurrent layers' caches do not count tokens

    def _prompt(self, query: str) -> List[int]:
        query = repair_text(query)  # invalid UTF-8 typed in arrives as surrogates
        if not self.use_template:
            return self.tokenizer.encode(query, add_special_tokens=self.turns == 0)
        messages = []
        if self.turns == 0 and self.args.system_prompt is not None:
            system = repair_text(self.args.system_prompt)
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": query})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def reply(self, query: str):
        """Stream the reply to ``query`` to ``out`` and return it as a :class:`Reply`.

        Ctrl-C stops it (:class:`CtrlC`): the conversation keeps the tokens
        replied so far, or, stopped in the prompt, drops the turn.
        """
        with CtrlC() as ctrl_c:
            return self._reply(query, ctrl_c.stop)

    def _reply(self, query: str, should_stop) -> Reply:
        prompt = self._prompt(query)
        cached = self.cached_tokens
        stream = stream_generate(
            self.model,
            self.tokenizer,
            prompt,
            draft_model=self.draft_model,
            config=self.config,
            sampler=self.sampler,
            prompt_cache=self.cache,
            prefill_step_size=self.args.prefill_step_size,
            should_stop=should_stop,
            **history_kwargs(stream_generate, self.history),
        )
        interrupted = False
        text, tokens = "", []
        try:
            for response in stream:
                text += response.text
                tokens.append(response.token)
                self.out.write(response.text)
                self.out.flush()
        except GenerationCancelled:  # every rank stops here alike
            interrupted = True
        finally:
            stream.close()  # the caches hold the prompt and the tokens replied
        stats = stream.stats
        self.out.write("\n")
        if interrupted and not tokens:
            self._drop_turn()
            return Reply(text, tokens, stats)
        self.history += list(prompt) + tokens
        self.turns += 1
        if interrupted:
            self.out.write(f"[interrupted after {len(tokens)} tokens]\n")
        self.out.write(
            f"[{stats.summary()} | prompt {len(prompt)} new tokens, {cached} cached | "
            f"{stats.generated_tokens} tokens at {stats.generation_tps:.1f} tok/s]\n"
        )
        self.out.flush()
        return Reply(text, tokens, stats)

    def _drop_turn(self):
        """Forget a turn stopped in its prompt: the caches went back to the
        turns before, or, where they cannot, the conversation starts anew."""
        if spoiled(self.cache):
            self.reset()
            self.out.write(
                "[interrupted in the prompt; the conversation is reset, as its "
                "cache cannot go back]\n"
            )
        else:
            self.out.write("[interrupted in the prompt; this turn is dropped]\n")
        self.out.flush()


def _read(prompt: str) -> Optional[str]:
    """The next line rank 0 reads, on every rank: ``None`` at the end of input
    or on Ctrl-C, which end the chat."""
    line = None
    if rank() == 0:
        try:
            line = input(prompt)
        except EOFError:
            pass
        except KeyboardInterrupt:
            sys.stdout.write("\n")
    return text_from_rank0(line, sharded_group())


def run(args, out=None):
    out = sys.stdout if out is None else out  # rank0_prints may have replaced it
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path, default_draft = default_model_pair(args.speculative)
        draft_path = draft_path or default_draft
    config = spec_config_of_args(args, draft_path, max_tokens=args.max_tokens)
    seed = shared_seed(args.seed)  # ranks draw alike
    if seed is not None:
        mx.random.seed(seed)
    draft_path = skip_unused_draft(config.method, draft_path)  # after the checks
    model, tokenizer, draft_model = load_pair(
        model_path,
        draft_path,
        args.speculative,
        pipeline=args.pipeline,
        adapter_path=args.adapter_path,
        tokenizer_config={"trust_remote_code": args.trust_remote_code},
        prog="mlx_spec.chat",
    )
    chat = Chat(model, tokenizer, draft_model, args, out, config)
    out.write(f"[model {model_path}]\n")
    if chat.draft_model is not None:
        out.write(f"[draft {draft_path}]\n")
    out.write(f"[speculative: {chat.method}]\n")
    if not chat.use_template:
        why = "ignored" if args.ignore_chat_template else "the model has none"
        out.write(
            f"[plain continuation mode: no chat template ({why}); "
            "each input is appended to the text and the model continues it]\n"
        )
    out.write(f"[{HELP}]\n")
    out.flush()
    while True:
        query = _read(">> ")
        if query is None or query == "q":
            out.write("bye\n")
            return
        if query == "r":
            chat.reset()
            out.write("[conversation reset]\n")
            continue
        if query == "h":
            out.write(f"[{HELP}]\n")
            continue
        if not query:
            continue
        chat.reply(query.replace("\\n", "\n"))


def main(argv: Optional[List[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    rank0_prints()  # a sharded run: rank 0 prints for all
    if rank() != 0:  # and hears Ctrl-C for all (CtrlC)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    with errors_in_one_line(parser, (ValueError, FileNotFoundError, OSError)):
        run(args)


if __name__ == "__main__":
    guarded(main)
