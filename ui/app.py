"""The command line of the mlx-spec Gradio app: ``mlx_spec ui`` installed,
``python -m ui.app`` in a checkout (:mod:`ui.__main__` is the entry point that
checks for gradio).

Serves http://127.0.0.1:7860: a multi-turn chat (or plain completion, for a
model without a chat template) on the default model of
:func:`mlx_spec.loading.default_model_pair`, with its draft if it has one.
Every token is coloured by where it came from (accepted from the draft,
recovered by the target, bonus), with live statistics, a chart of accepted
tokens per round and a race against plain mlx_lm decoding. This module owns the flags,
access checks (loopback unless ``--allow-remote``, optional logins) and
start-up; the page is :mod:`ui.layout`, the handlers :mod:`ui.handlers`.
"""

import argparse
import ipaddress
import logging
import os
import sys
from typing import List, Optional, Tuple

from mlx_spec.config import (
    DEFAULT_NUM_DRAFT_TOKENS,
    METHODS,
    OptionError,
    SpecConfig,
    check_generation_options,
)
from mlx_spec.generate import DEFAULT_MAX_TOKENS
from mlx_spec.loading import (
    check_draft_path,
    check_model_path,
    check_not_a_drafter,
    default_model_pair,
)
from mlx_spec.options import one_line_errors
from mlx_spec.validation import DRAFTER_LATER, spec_config
from mlx_spec_entry import guarded

from .handlers import App
from .layout import launch_kwargs
from .options import DEFAULT_METHOD, check_max_tokens

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
DEFAULT_PROG = f"python -m {__package__}.app"  # ui.app, or mlx_spec.ui.app installed


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


def setup_arg_parser(prog: str = DEFAULT_PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="The mlx-spec web app: chat with speculative decoding and watch it work.",
    )
    one_line_errors(parser)
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
        help="Target model to start with (default: mlx-spec's default model).",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="Draft model to start with (default: the default model's draft, if "
        "there is one; without a draft, lookup, self and auto still speculate).",
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
        "--prefill-step-size",
        type=int,
        default=None,
        help="The most prompt tokens read at once (default: the engine's chunk, "
        "512). A chat prompt is read in slices of about half a second, up to "
        "this size; Stop and other users' requests get the model between them.",
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
    """An :class:`App` on the given models (default: ``default_model_pair()``)."""
    if model is None:
        model, default_draft = default_model_pair()
        draft_model = draft_model or default_draft
    return App(model, draft_model, **kwargs)


def check_start_values(args) -> SpecConfig:
    """The page's starting settings, checked: a one-line ``ValueError`` for a
    start-up value the page would refuse later."""
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port={args.port} is out of range: 1 to 65535.")
    check_max_tokens(args.max_tokens, "--max-tokens")
    config = spec_config(
        args.speculative,
        DRAFTER_LATER,  # checked once the default pair is known
        flags=True,
        num_draft_tokens=args.num_draft_tokens,
        max_tokens=args.max_tokens,
    )
    if args.prefill_step_size is not None:
        try:
            check_generation_options(prefill_step_size=args.prefill_step_size)
        except OptionError as e:
            raise e.as_flag() from None
    # The paths too, before anything loads (--no-preload loads at the first request).
    if args.model is not None:
        check_model_path(args.model, "model")
        check_not_a_drafter(args.model, "model")
    if args.draft_model is not None:
        check_model_path(args.draft_model, "draft model")
    return config


def main(argv=None, prog: str = DEFAULT_PROG):
    parser = setup_arg_parser(prog)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    env_auth = [a for a in os.environ.get("MLX_SPEC_UI_AUTH", "").split(",") if a]
    try:
        auth = parse_auth(args.auth or env_auth)
        config = check_start_values(args)
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
            method=config.method,
            num_draft_tokens=config.num_draft_tokens,
            max_tokens=config.max_tokens,
        )
        app.prefill_step_size = args.prefill_step_size
        check_draft_path(config.method, app.default_draft)
        if not args.no_preload:
            print("Loading the models...", file=sys.stderr)
            app.preload()
    except (ValueError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    demo = app.build()
    demo.queue()
    try:
        demo.launch(
            server_name=args.host, server_port=args.port, auth=auth, **launch_kwargs()
        )
    except OSError as e:  # the port is taken
        parser.exit(
            1, f"{parser.prog}: error: cannot listen on port {args.port}: {e}\n"
        )


if __name__ == "__main__":
    guarded(main)
