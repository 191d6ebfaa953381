"""``mlx_spec.server``'s command line: mlx_lm.server's flags plus the
speculative options, and the start-up checks of their values."""

import argparse
from pathlib import Path
from typing import Optional

from ..config import DEFAULT_NUM_DRAFT_TOKENS, MAX_DRAFT_TOKENS, OptionError
from ..loading import default_model_pair
from ..mlx_lm_private import server_parser
from ..options import add_speculative_options, one_line_errors
from ..validation import check_chat_template, json_object_option, spec_config_of_args
from .index import DEFAULT_MAX_TOKENS as DEFAULT_INDEX_TOKENS
from .index import cap_range

PORT_RANGE = (1, 65535)
DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def setup_arg_parser() -> argparse.ArgumentParser:
    """mlx_lm.server's parser plus ``--speculative`` and the method options."""
    parser = one_line_errors(server_parser())
    parser.prog = "mlx_spec.server"
    parser.description = (
        "OpenAI-compatible HTTP server with exact speculative decoding "
        "(a superset of mlx_lm.server)."
    )
    for action in parser._actions:
        if action.dest == "model":
            action.help = (
                "The path to the MLX model weights, tokenizer and config. "
                "Default: the embedded default pair (with its draft)."
            )
        elif action.dest == "draft_model":
            action.help = (
                "A draft model for the draft/tree methods. Default: the embedded "
                "draft when --model is not given."
            )
        elif action.dest == "num_draft_tokens":
            action.default = DEFAULT_NUM_DRAFT_TOKENS
            action.help = (
                f"Draft tokens per round, 1 to {MAX_DRAFT_TOKENS}; requests may override it "
                f"(default: {DEFAULT_NUM_DRAFT_TOKENS})."
            )
        elif action.dest == "host":
            action.default = "127.0.0.1"
            action.help = "Host for the HTTP server (default: 127.0.0.1)."
    add_speculative_options(parser)
    group = parser.add_argument_group("batching")
    group.add_argument(
        "--batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Decode concurrent requests together with speculation (default: on); "
        "--no-batching serves one request at a time.",
    )
    group.add_argument(
        "--cross-request-tokens",
        type=int,
        default=DEFAULT_INDEX_TOKENS,
        help="Tokens of earlier requests that lookup and auto may draft from "
        f"(a memory cap; 0 turns it off; default: {DEFAULT_INDEX_TOKENS}).",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--allow-request-models",
        nargs="+",
        default=None,
        metavar="ROOT",
        help="Let requests load models, drafts and adapters (the model, "
        "draft_model and adapters fields) from folders under ROOT; by default a "
        "request may only name what the server was started with (always, "
        "sharded).",
    )
    limits.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        help="The most tokens a request may ask for (default: the model's "
        "context window; a prompt plus max_tokens beyond it is refused too).",
    )
    limits.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="The largest request body accepted, in bytes (larger ones get 413; "
        f"default: {DEFAULT_MAX_REQUEST_BYTES}).",
    )
    return parser


def check_port(port: int) -> int:
    """The ``--port`` value, or a one-line ``ValueError`` naming the range."""
    low, high = PORT_RANGE
    if not low <= port <= high:
        raise OptionError("--port", port, f"an integer from {low} to {high}")
    return port


def resolve_model_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in the default pair and check the speculative options (``ValueError``)."""
    if args.model is None:
        args.model, draft = default_model_pair(args.speculative)
        args.draft_model = args.draft_model or draft
    # What a request's fields fall back on (requests.request_config).
    args.spec_config = spec_config_of_args(
        args, args.draft_model, max_tokens=args.max_tokens
    )
    check_request_defaults(args)
    return args


def check_request_defaults(args: argparse.Namespace) -> None:
    """The server-wide values requests fall back on, checked at start-up.

    Otherwise a bad one would be reported to every client as its own error.
    """
    checks = [
        (
            "decode-concurrency",
            args.decode_concurrency,
            args.decode_concurrency >= 1,
            "an integer >= 1",
        ),
        (
            "prompt-concurrency",
            args.prompt_concurrency,
            args.prompt_concurrency >= 1,
            "an integer >= 1",
        ),
        (
            "prompt-cache-size",
            args.prompt_cache_size,
            args.prompt_cache_size >= 1,
            "an integer >= 1",
        ),
    ]
    limit = getattr(args, "max_tokens_limit", None)
    if limit is not None:
        checks.append(("max-tokens-limit", limit, limit >= 1, "an integer >= 1"))
    body = getattr(args, "max_request_bytes", DEFAULT_MAX_REQUEST_BYTES)
    checks.append(("max-request-bytes", body, body >= 1, "an integer >= 1"))
    cache_bytes = getattr(args, "prompt_cache_bytes", None)
    if cache_bytes is not None:
        checks.append(
            ("prompt-cache-bytes", cache_bytes, cache_bytes >= 1, "a size >= 1")
        )
    tokens = getattr(args, "cross_request_tokens", 0)
    low, high = cap_range()
    checks.append(
        (
            "cross-request-tokens",
            tokens,
            tokens == 0 or low <= tokens <= high,
            f"0 (off) or an integer from {low} to {high}",
        )
    )
    for flag, value, ok, allowed in checks:
        if not ok:
            raise OptionError(f"--{flag}", value, allowed)
    json_object_option(getattr(args, "chat_template_args", {}), "--chat-template-args")
    if getattr(args, "chat_template", None):  # "" is mlx_lm's "none given"
        check_chat_template(args.chat_template, "--chat-template")
    for root in getattr(args, "allow_request_models", None) or []:
        if not root:
            raise ValueError("--allow-request-models: an empty root; name a folder.")
        if not Path(root).expanduser().is_dir():
            raise ValueError(f"--allow-request-models {root}: no such folder.")


def host_warning(host: str) -> Optional[str]:
    """A warning for a server reachable from other machines, else ``None``."""
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return None
    return (
        f"--host {host} makes this server reachable from other machines, and it "
        "has no authentication: anyone who can reach it can use it."
    )
