"""What ``mlx_spec.server`` accepts in a request: the speculative fields,
the checks of the fields mlx_lm reads unchecked, and the statistics sent back.

Every refusal is one line, answered with HTTP 400.
"""

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import mlx_lm.server as lm_server

from ..config import MAX_SEED, METHODS, SpecConfig
from ..drafters.fit import (
    check_drafter,
    drafter_description,
    drafter_fits,
    drafter_kind,
)
from ..loading import check_adapter_dir
from ..options import method_option_fields
from ..validation import DRAFTER_LATER, spec_config

# Statistics left out of responses (per-round lists grow with the output).
_STATS_LISTS = ("accepted_per_round", "drafted_per_round", "tree_sizes")
STATS_FIELD = "speculative_stats"
# The request field that keeps a request out of the cross-request index.
ISOLATION_FIELD = "speculative_isolation"


class RequestError(ValueError):
    """A request the server refuses (sent back as HTTP 400)."""


@dataclass
class SpecCompletionRequest(lm_server.CompletionRequest):
    """mlx_lm's request plus its speculative options and, once served, stats."""

    config: Optional[SpecConfig] = None
    isolation: bool = False
    stats: Any = None
    serving: Optional[dict] = None
    error: Optional[Exception] = None
    # Whether the client has hung up (polled by the generation thread).
    client_gone: Optional[Callable[[], bool]] = None


def _check_type(name: str, value, default):
    """Request fields take the JSON type of their ``SpecConfig`` default."""
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        kind = "a number"
    else:
        return
    if not ok:
        raise RequestError(f"{name} must be {kind}, got {value!r}.")


def request_config(body: dict, cli_args: argparse.Namespace) -> SpecConfig:
    """The config of a request's speculative fields (body fields over server flags).

    The drafter is checked once the request's model is loaded
    (:func:`check_request_method`).

    Raises:
        RequestError: A field has a bad type or value.
    """
    speculative = body.get("speculative", cli_args.speculative)
    if speculative is not None and not isinstance(speculative, str):
        raise RequestError(f"speculative must be a string, got {speculative!r}.")
    defaults = getattr(cli_args, "spec_config", None)
    options = {}
    for f in method_option_fields():
        value = body.get(f.name, getattr(defaults or cli_args, f.name, f.default))
        _check_type(f.name, value, f.default)
        options[f.name] = value
    try:
        return spec_config(speculative, DRAFTER_LATER, **options)
    except ValueError as e:
        raise RequestError(str(e)) from None


def config_of(request) -> SpecConfig:
    """A request's config (``auto`` with the defaults for one without)."""
    return getattr(request, "config", None) or spec_config(None, DRAFTER_LATER)


def request_isolation(body: dict) -> bool:
    """The ``speculative_isolation`` field (``RequestError`` unless a bool)."""
    value = body.get(ISOLATION_FIELD, False)
    if not isinstance(value, bool):
        raise RequestError(f"{ISOLATION_FIELD} must be true or false, got {value!r}.")
    return value


def runnable_methods(draft_model) -> List[str]:
    """The ``speculative`` values a server holding ``draft_model`` can run."""
    kind = drafter_kind(draft_model)
    return [m for m in METHODS if drafter_fits(m, kind)]


def check_request_method(method: str, draft_model) -> None:
    """A one-line :class:`RequestError` when ``method`` needs a drafter the server lacks.

    It says what is missing and what the client may ask for instead.
    """
    kind = drafter_kind(draft_model)
    try:
        check_drafter(method, kind, subject=f"speculative={method!r}")
    except ValueError as e:
        raise RequestError(
            f"{e} This server has {drafter_description(kind)}: ask for one of "
            f"{', '.join(runnable_methods(draft_model))} instead."
        ) from None


def stats_payload(stats, serving: Optional[dict] = None) -> Optional[dict]:
    """The JSON ``speculative_stats`` of a :class:`SpecStats` (lists left out).

    ``serving`` (batched or alone, and why) is merged in.
    """
    if stats is None:
        return None
    out = stats.as_dict()
    for name in _STATS_LISTS:
        out.pop(name, None)
    if serving:
        out.update(serving)
    return out


# Numeric fields mlx_lm checks by type and range, which NaN and infinity pass.
FINITE_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "xtc_probability",
    "xtc_threshold",
)


# XTC fields and their largest value (mlx_lm.sample_utils.apply_xtc's ranges).
XTC_RANGES = (("xtc_probability", 1.0), ("xtc_threshold", 0.5))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_request_values(body: dict) -> None:
    """One-line ``ValueError`` (a 400) for values that would break mlx_lm's own
    checks or the process: non-finite numbers, a malformed ``logit_bias``, a
    seed mx.random.seed cannot take, malformed ``stream_options``."""
    for name in FINITE_FIELDS:
        value = body.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name}={value} must be a finite number.")
    for name, high in XTC_RANGES:  # mlx_lm checks these at the first token
        value = body.get(name)
        if _is_number(value) and not 0 <= value <= high:
            raise ValueError(f"{name}={value} is out of range: 0 to {high:g}.")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise ValueError("logit_bias must be an object of token id to number.")
        for token, value in bias.items():
            if not str(token).isdigit():
                raise ValueError(f"logit_bias key {token!r} is not a token id (>= 0).")
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value):
                raise ValueError(
                    f"logit_bias[{token}]={value!r} must be a finite number."
                )
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(
                f"seed={seed} is out of range: an integer from 0 to 2**64 - 1."
            )
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, dict)
        and isinstance(options.get("include_usage", False), bool)
    ):
        raise ValueError(
            'stream_options must be an object such as {"include_usage": true}.'
        )


# The paths mlx_lm's handler answers POST requests on (others get its 404).
POST_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")
# JSON names of the values ``json.loads`` returns.
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def body_error(raw: bytes) -> Optional[str]:
    """Why a POST body is not a UTF-8 JSON object (one line), or ``None``."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError
        return f"request body is not valid UTF-8 JSON: {e}."
    except RecursionError:
        return "request body is not valid UTF-8 JSON: it is nested too deeply."
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), "a number")
        return f"request body must be a JSON object of request fields, got {kind}."
    return None


def check_adapters(adapters) -> None:
    """One-line ``ValueError`` (a 400) unless ``adapters`` is absent or names
    an adapter directory on the server."""
    if adapters is None:
        return
    if not isinstance(adapters, str) or not adapters:
        raise ValueError(
            f"adapters must be the path of an adapter directory, got {adapters!r}."
        )
    check_adapter_dir(adapters, f"adapters={adapters!r}", " on the server")


def check_logit_bias_ids(logit_bias, vocab_size: Optional[int]) -> None:
    """A :class:`RequestError` for a biased token id outside the model's vocabulary."""
    if not logit_bias or not vocab_size:
        return
    for token in logit_bias:
        if not 0 <= int(token) < vocab_size:
            raise RequestError(
                f"logit_bias token {token} is out of range: ids go from 0 to "
                f"{vocab_size - 1} for this model."
            )


def check_request_fields(body: dict, chat: bool) -> None:
    """One-line ``ValueError`` (a 400) for request fields mlx_lm reads unchecked."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ValueError(f"n={n!r} is not supported: the server returns one choice.")
    stop = body.get("stop")
    words = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (
        isinstance(words, list) and all(isinstance(w, str) for w in words)
    ):
        raise ValueError("stop must be a string or a list of strings.")
    prompt = body.get("prompt")
    if not chat and "prompt" in body and not isinstance(prompt, (str, list)):
        raise ValueError("prompt must be a string or a list of token ids.")
    messages = body.get("messages")
    if not chat or messages is None:
        return  # a missing list gets mlx_lm's own error
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of {role, content} objects.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string role.")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(
                f"messages[{i}].content must be a string or a list of parts."
            )
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(
                    f"messages[{i}].content parts must be objects with a type, "
                    'such as {"type": "text", "text": "..."}.'
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise ValueError(
                    f'messages[{i}].content: a "text" part needs a string text.'
                )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise ValueError(f"messages[{i}].tool_calls must be a list.")


def token_prompt(prompt: list, vocab_size: int) -> List[int]:
    """A ``/v1/completions`` prompt given as token ids, checked (``RequestError``).

    OpenAI's API also takes a list of such lists (several prompts); like
    mlx_lm's server, this one answers one prompt per request.
    """
    if prompt and all(isinstance(p, list) for p in prompt):
        if len(prompt) != 1:
            raise RequestError(
                f"prompt holds {len(prompt)} token lists; send one prompt per request."
            )
        prompt = prompt[0]
    if not prompt:
        raise RequestError("prompt is an empty list; give at least one token id.")
    for i, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int):
            raise RequestError(
                f"prompt[{i}]={token!r} is not a token id; a list prompt holds "
                "integers."
            )
        if not 0 <= token < vocab_size:
            raise RequestError(
                f"prompt[{i}]={token} is out of range: ids go from 0 to "
                f"{vocab_size - 1} for this model."
            )
    return list(prompt)


# Request fields that name something to load, and the flag that names it.
PATH_FIELDS = {
    "model": "model",
    "draft_model": "draft_model",
    "adapters": "adapter_path",
}
DEFAULT_NAME = "default_model"


def public_name(path: str) -> str:
    """How ``/v1/models`` lists ``path``: a hub id or relative path as given,
    a local folder by its name alone (the listing shows no file system)."""
    local = Path(path).expanduser()
    if local.is_absolute():
        return local.name or str(path)
    return str(path)


def served_names(path: Optional[str]) -> set:
    """The names a request may give for ``path`` (as given, resolved, listed)."""
    if path is None:
        return set()
    names = {str(path), public_name(path)}
    local = Path(path).expanduser()
    if local.exists():
        names.add(str(local.resolve()))
    return names


def _under(value: str, roots: Sequence[str]) -> bool:
    try:
        path = Path(value).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    for root in roots:
        root_path = Path(root).expanduser().resolve()
        if path == root_path or root_path in path.parents:
            return True
    return False


def check_served_paths(body: dict, cli_args: argparse.Namespace) -> Dict[str, bool]:
    """Refuse a request that would make the server load something it was not
    started with, with the same message whether or not the path exists.

    ``model``, ``draft_model`` and ``adapters`` may name what the server serves
    (as given at start-up, resolved, or ``default_model``); others only under
    the roots of ``--allow-request-models``.

    Returns:
        Field name -> whether the request names the served value (so the
        request maps to the loaded models).

    Raises:
        RequestError: One line that never depends on the file system.
    """
    roots = getattr(cli_args, "allow_request_models", None) or []
    served = {}
    for name, flag in PATH_FIELDS.items():
        value = body.get(name)
        if value is None or value == DEFAULT_NAME and name != "adapters":
            served[name] = True
            continue
        if not isinstance(value, str) or not value:
            what = (
                "the path of an adapter directory" if name == "adapters" else "a string"
            )
            raise RequestError(f"{name} must be {what}, got {value!r}.")
        if value in served_names(getattr(cli_args, flag, None)):
            served[name] = True
            continue
        if roots and _under(value, roots):
            served[name] = False
            continue
        raise RequestError(
            f"{name}={value!r} is not served here: this server answers with the "
            "models it was started with (leave the field out); to let requests "
            "load others, start it with --allow-request-models ROOT."
        )
    return served
