"""mlx-lm's own commands with ``--speculative`` (the runtime half of the hook).

The start-up module :mod:`mlx_spec_hook` (run by ``mlx_spec_hook.pth``)
wraps the ``main`` of ``mlx_lm.generate``, ``mlx_lm.server`` and
``mlx_lm.chat`` when their command line asks for speculation or help. The
wrapped ``main`` calls :func:`prepare`, which builds the command's parser
(mlx-lm's flags plus ``--speculative`` and the method options; an mlx-lm
it cannot extend fails here and runs unchanged), then the returned runner:

- without ``--speculative`` and ``--draft-model`` it calls mlx-lm's
  ``main`` as is (``--help`` lists the added flags too);
- ``mlx_lm.generate`` runs mlx-lm's own ``main`` with the extended parser,
  its draft loaded by mlx-spec (a model or a trained head, checked against
  the target) and its ``generate`` call served by
  :func:`mlx_spec.stream_generate`, so every other flag keeps mlx-lm's
  handling and output (plus a statistics line with ``--verbose``);
- ``mlx_lm.server`` and ``mlx_lm.chat`` run ``mlx_spec.server`` and
  ``mlx_spec.chat`` (supersets of their flags), under mlx-lm's name.

``--draft-model`` without ``--speculative`` keeps mlx-lm's meaning,
speculation from that draft model, and runs mlx-spec's ``draft`` method
(or the head's own method for a trained EAGLE or Medusa head).
Flags mlx-lm has keep mlx-lm's defaults (``--num-draft-tokens`` 3, the
default ``--model``, ...).
"""

import argparse
import contextlib
import importlib
import sys
from typing import Callable, Dict, List, Optional

from .. import integration
from ..config import METHODS, plan_method
from ..generation import collect_text, stream_generate
from ..loading import (
    check_model_path,
    load_draft,
    resolve_draft,
    skip_unused_draft,
)
from ..options import (
    add_speculative_options,
    method_options,
    one_line_errors,
)
from ..validation import spec_config_of_args

# The method ``--draft-model`` alone runs (mlx-lm's speculative decoding).
DRAFT_MODEL_METHOD = "draft"
# mlx-lm's ``--max-tokens -1`` (until the end of sequence) as a token budget.
UNTIL_EOS = 2**31 - 1

Runner = Callable[..., object]


def program_name() -> str:
    """The name argparse gives mlx-lm's own parsers in this process."""
    return argparse.ArgumentParser().prog


def keep_defaults(parser: argparse.ArgumentParser, base: argparse.ArgumentParser):
    """Give every flag of ``parser`` that ``base`` also has ``base``'s default
    (and, where that changes the default, ``base``'s help, which names it)."""
    base_actions = {action.dest: action for action in base._actions}
    for action in parser._actions:
        original = base_actions.get(action.dest)
        if original is not None and original.default != action.default:
            action.default, action.help = original.default, original.help


def explain_method_flag(parser: argparse.ArgumentParser):
    """Say in ``--help`` what the mlx-lm command does without ``--speculative``."""
    for action in parser._actions:
        if action.dest == "speculative":
            action.help = (
                f"Speculative decoding by mlx-spec, one of: {', '.join(METHODS)}. "
                "Without it, plain mlx-lm decoding, or mlx-spec's draft method "
                "when --draft-model is given."
            )


def speculative_method(args: argparse.Namespace) -> Optional[str]:
    """The method parsed ``args`` ask for, or ``None`` for plain mlx-lm.

    ``--draft-model`` alone runs :data:`DRAFT_MODEL_METHOD`, or the kind of
    a trained head (``eagle``, ``medusa``) when it names a head directory.
    """
    if getattr(args, "speculative", None) is not None:
        return args.speculative
    draft_model = getattr(args, "draft_model", None)
    if draft_model is None:
        return None
    from ..loading import drafter_dir_kind

    kind = drafter_dir_kind(draft_model)  # a trained or published head's
    return DRAFT_MODEL_METHOD if kind in (None, "draft") else kind


def check_method(parser: argparse.ArgumentParser, method: str, args) -> None:
    """A one-line usage error for bad method options or a missing draft model."""
    draft_model = getattr(args, "draft_model", None)
    try:  # mlx_lm's command runs it: the config it makes is checked alike
        spec_config_of_args(args, draft_model, speculative=method)
    except ValueError as error:
        parser.error(str(error))
    uses_draft = plan_method(method, draft_model)[1]
    if uses_draft and getattr(args, "prompt_cache_file", None):
        parser.error(
            "--prompt-cache-file holds the target's cache only; with it, use "
            "--speculative lookup, self or none (no --draft-model)."
        )


@contextlib.contextmanager
def patched(module, **names):
    """Set attributes of ``module`` for the duration of the block."""
    saved = {name: getattr(module, name) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def with_method(argv: List[str], args, method: str) -> List[str]:
    """``argv`` with ``--speculative method`` added when it names none."""
    if args.speculative is None:
        return [*argv, "--speculative", method]
    return argv


# --------------------------------------------------------------------------- #
# mlx_lm.generate
# --------------------------------------------------------------------------- #


def require(module, *names: str):
    """``AttributeError`` naming what an unknown mlx-lm version lacks."""
    for name in names:
        if not hasattr(module, name):
            raise AttributeError(f"{module.__name__} has no {name}")


def speculative_generate(
    model,
    tokenizer,
    prompt,
    verbose: bool = False,
    draft_model=None,
    max_tokens: int = 256,
    input_embeddings=None,
    **kwargs,
) -> str:
    """mlx-lm's ``generate`` (as ``mlx_lm.generate``'s ``main`` calls it) by mlx-spec.

    Every keyword goes to :func:`mlx_spec.stream_generate` (``max_kv_size``
    included: mlx-spec bounds the cache as mlx-lm does); ``verbose`` prints
    mlx-lm's output plus a line of speculation statistics.
    """
    if input_embeddings is not None:
        raise ValueError("--image is not supported with --speculative.")
    if max_tokens < 0:  # mlx-lm's "until the end of sequence"
        max_tokens = UNTIL_EOS
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        draft_model=draft_model,
        max_tokens=max_tokens,
        **kwargs,
    )
    return collect_text(stream, verbose)


def replace_bad_utf8(stream) -> None:
    """Decode ``stream`` (a text stream not read yet) with U+FFFD for bad UTF-8.

    mlx_lm reads ``--prompt -`` from stdin, whose bad bytes Python keeps as
    surrogates that the tokenizer refuses with a TypeError traceback.
    """
    if hasattr(stream, "reconfigure"):
        stream.reconfigure(encoding="utf-8", errors="replace")


def _generate_runner() -> Runner:
    """mlx-lm's ``main`` with the extended parser and a speculative ``generate``."""
    lm = importlib.import_module("mlx_lm.generate")
    require(lm, "setup_arg_parser", "generate", "load")  # what main calls
    base_parser = lm.setup_arg_parser

    def make_parser():
        parser = one_line_errors(base_parser())
        add_speculative_options(parser)
        explain_method_flag(parser)
        return parser

    make_parser()

    def run(original, *main_args, **main_kwargs):
        parser = make_parser()
        args = parser.parse_args(sys.argv[1:])
        method = speculative_method(args)
        if method is None:
            return original(*main_args, **main_kwargs)
        check_method(parser, method, args)
        args.draft_model = skip_unused_draft(method, args.draft_model)
        options = method_options(args)
        if args.prompt == "-":  # as mlx_spec generate: bad UTF-8 becomes U+FFFD
            replace_bad_utf8(sys.stdin)

        def parsed_parser():
            parser.parse_args = lambda *_, **__: args
            return parser

        target = []  # (model, tokenizer) of main's first load()

        def load(path, *load_args, **load_kwargs):
            if target and path == args.draft_model:
                model, tokenizer = target[0]
                return load_draft(path, model, tokenizer), tokenizer
            check_model_path(path, "model")  # one line, not a hub error
            loaded = lm_load(path, *load_args, **load_kwargs)
            target.append(loaded[:2])
            return loaded

        def generate(model, tokenizer, prompt, **kwargs):
            kwargs.update(options, speculative=method)
            if kwargs.get("draft_model") is None and method in ("mtp", "auto"):
                # The checkpoint's own MTP layer, which mlx_lm.load drops.
                kwargs["draft_model"] = resolve_draft(
                    method, args.model, None, model, tokenizer
                )
            return speculative_generate(model, tokenizer, prompt, **kwargs)

        lm_load = lm.load
        registered = integration.is_registered()
        integration.register()  # samplers carry their law (exact sampling)
        try:
            with patched(
                lm, setup_arg_parser=parsed_parser, load=load, generate=generate
            ):
                return original(*main_args, **main_kwargs)
        except (ValueError, FileNotFoundError, OSError) as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        finally:
            if not registered:
                integration.unregister()

    return run


# --------------------------------------------------------------------------- #
# mlx_lm.server and mlx_lm.chat: mlx-spec's commands under mlx-lm's name
# --------------------------------------------------------------------------- #


def _delegating_runner(spec_module, lm_parser: Callable) -> Runner:
    """Run ``spec_module.main`` (a superset of the mlx-lm command) when asked to.

    Args:
        spec_module: ``mlx_spec.serve.server`` or ``mlx_spec.cli.chat``:
          its ``setup_arg_parser()`` extends mlx-lm's parser, its
          ``main(argv)`` runs the command.
        lm_parser: Builds the mlx-lm command's own parser.
    """
    base_parser = spec_module.setup_arg_parser
    prog = program_name()

    def make_parser():
        parser = base_parser()
        parser.prog = prog
        keep_defaults(parser, lm_parser())
        explain_method_flag(parser)
        return parser

    make_parser()

    def run(original, *main_args, **main_kwargs):
        argv = sys.argv[1:]
        parser = make_parser()
        args = parser.parse_args(argv)
        method = speculative_method(args)
        if method is None:
            return original(*main_args, **main_kwargs)
        with patched(spec_module, setup_arg_parser=make_parser):
            return spec_module.main(with_method(argv, args, method))

    return run


def _server_runner() -> Runner:
    from ..mlx_lm_private import server_parser
    from ..serve import server

    return _delegating_runner(server, server_parser)


def _chat_runner() -> Runner:
    from . import chat

    lm_chat = importlib.import_module("mlx_lm.chat")
    return _delegating_runner(chat, lm_chat.setup_arg_parser)


RUNNERS: Dict[str, Callable[[], Runner]] = {
    "generate": _generate_runner,
    "server": _server_runner,
    "chat": _chat_runner,
}


def prepare(command: str) -> Runner:
    """The runner of ``mlx_lm.<command>``, built now so that it fails early.

    Args:
        command: ``"generate"``, ``"server"`` or ``"chat"``.

    Returns:
        ``run(original_main, *args, **kwargs)``, which parses ``sys.argv``
        and runs mlx-spec or, without a speculative flag, ``original_main``.

    Raises:
        Exception: The installed mlx-lm cannot be extended (the caller
          prints one warning line and runs mlx-lm unchanged).
    """
    return RUNNERS[command]()
