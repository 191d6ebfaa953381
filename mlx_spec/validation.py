"""The one path from user options to a checked :class:`SpecConfig`.

Every front end (``mlx_spec generate``, ``chat``, the ``mlx_lm`` hook, the
server at start-up and per request, the UI, the benchmarks) and
:func:`mlx_spec.stream_generate` call :func:`spec_config`, so each rule and
its message lives once: the ranges in :class:`SpecConfig`, whether the
drafter fits the method in :func:`~mlx_spec.drafters.fit.check_drafter`.
"""

import argparse
import inspect
import json
import os
from typing import Any, Optional

from .config import OptionError, SpecConfig, check_generation_options, resolve_method
from .drafters.fit import check_drafter, drafter_kind
from .drafters.self_spec import ON_PIPELINE_STAGES
from .loading import check_adapter_dir, check_draft_path, check_model_path
from .options import method_options

# SpecConfig fields that commands read from flags of the same name. Not among
# them: ``seed`` (a command seeds before it loads, as mlx_lm does) and
# ``max_tokens`` (mlx_lm's -1 is "until EOS"; the commands pass their own).
ARG_FIELDS = ("temp", "top_p", "top_k", "min_p", "min_tokens_to_keep")


# ``draft`` when the drafter is not loaded yet (a server request, whose model
# is chosen later): it is checked once loaded, with ``check_drafter``.
DRAFTER_LATER = object()


def _is_path(draft) -> bool:
    return isinstance(draft, (str, os.PathLike))


def spec_config(
    speculative: Optional[str] = None,
    draft: Any = None,
    *,
    flags: bool = False,
    subject: str = "",
    **fields,
) -> SpecConfig:
    """Check user options and return the config that runs them.

    Args:
        speculative: The requested method; ``None`` picks ``auto``.
        draft: The drafter on hand: a path (checked before anything loads),
          a loaded draft model or head, ``None``, or :data:`DRAFTER_LATER`.
        flags: Name options as command-line flags in messages
          (``--num-draft-tokens=0 ...``). Default: ``False``.
        subject: How the front end names the method in messages (see
          :func:`~mlx_spec.drafters.fit.check_drafter`).
        fields: Further :class:`SpecConfig` fields.

    Raises:
        ValueError: One line naming the bad option and how to fix it.
    """
    method = resolve_method(speculative)
    try:
        config = SpecConfig(method=method, **fields)
    except OptionError as e:
        raise (e.as_flag() if flags else e) from None
    except TypeError as e:  # an option SpecConfig does not have
        raise ValueError(str(e)) from None
    if draft is DRAFTER_LATER:
        pass
    elif _is_path(draft) or draft is None:
        check_draft_path(method, draft, subject)
    else:
        check_drafter(method, drafter_kind(draft), subject=subject)
    return config


def check_generation_args(args: argparse.Namespace) -> None:
    """:func:`~mlx_spec.config.check_generation_options` on the flags ``args`` has,
    and the other run flags of mlx_lm's commands (``--extra-eos-token``, the XTC
    flags, ``--chat-template-config``, ``--adapter-path``, whether ``--draft-model``
    can hold a model, ``self`` on ``--pipeline`` stages), checked before the
    target loads.

    Raises:
        ValueError: One line naming the flag (``--kv-group-size=0 ...``).
    """
    given = {
        name: getattr(args, name)
        for name in inspect.signature(check_generation_options).parameters
        if hasattr(args, name)
    }
    try:
        check_generation_options(**given)
    except OptionError as e:
        raise e.as_flag() from None
    check_extra_eos_tokens(getattr(args, "extra_eos_token", None) or ())
    if hasattr(args, "xtc_probability"):
        check_xtc_args(args)
    if getattr(args, "chat_template_config", None) is not None:
        json_object_option(args.chat_template_config, "--chat-template-config")
    adapter_path = getattr(args, "adapter_path", None)
    if adapter_path is not None:  # mlx_lm reads it after the model loads
        check_adapter_dir(adapter_path, f"--adapter-path {adapter_path!r}")
    draft_path = getattr(args, "draft_model", None)
    if draft_path is not None:  # its drafter is checked against the target once loaded
        check_model_path(draft_path, "draft model")
    method = resolve_method(getattr(args, "speculative", None))
    if getattr(args, "pipeline", False) and method == "self":  # before the load
        raise ValueError(ON_PIPELINE_STAGES)


EOS_TOKEN_FORM = "pass a token as the tokenizer spells it, or its id"


def check_extra_eos_tokens(tokens) -> None:
    """``--extra-eos-token`` values are text a tokenizer can hold, checked at start.

    Invalid UTF-8 on the command line was a UnicodeEncodeError after the load
    that did not name the flag.

    Raises:
        ValueError: Naming the flag and the form it takes.
    """
    for token in tokens:
        if not token:
            raise ValueError(f"--extra-eos-token is empty; {EOS_TOKEN_FORM}.")
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"--extra-eos-token {token!r} is not valid UTF-8; {EOS_TOKEN_FORM}."
            ) from None


def check_chat_template(template: str, flag: str) -> None:
    """A chat template given as a flag is UTF-8 text, checked at start
    (before the load; its Jinja is checked once the tokenizer is loaded, by
    :func:`check_chat_template_syntax`).

    Raises:
        ValueError: Naming the flag and what is wrong.
    """
    try:
        template.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{flag} is not valid UTF-8; pass the template's text."
        ) from None


def check_chat_template_syntax(tokenizer, template: str, flag: str) -> None:
    """A chat template given as a flag compiles as ``tokenizer`` compiles it
    for every request (else every request failed).

    A one-message conversation is rendered by the tokenizer's public
    ``apply_chat_template``. Only the template's syntax is judged: a template
    may refuse that conversation and still serve real ones.

    Raises:
        ValueError: Naming the flag and the line of the syntax error.
    """
    from jinja2 import TemplateSyntaxError

    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hello."}],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
    except TemplateSyntaxError as e:
        line = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise ValueError(f"{flag} is not a valid Jinja template{line}: {e}") from None
    except Exception:  # compiled, but refuses this conversation
        pass


def extra_eos_token_id(tokenizer, token: str) -> int:
    """The id ``--extra-eos-token TOKEN`` names: a token of ``tokenizer``'s
    vocabulary, or an id in it (as mlx_lm reads it: digits are an id).

    mlx_lm took any integer, and a tokenizer with an unknown token mapped an
    unknown text to it, so a typo stopped generation at that token.

    Raises:
        ValueError: Naming the flag, the token and the ids allowed.
    """
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    try:
        token_id = int(token)
    except ValueError:
        token_id = vocab.get(token)
    if token_id is None or not 0 <= token_id < size:
        raise ValueError(
            f"--extra-eos-token {token!r} is not in the model's vocabulary; "
            f"{EOS_TOKEN_FORM} (0 to {size - 1})."
        )
    return token_id


def check_xtc_args(args: argparse.Namespace) -> None:
    """mlx_lm's XTC flags in the ranges its sampler takes, checked at start.

    mlx_lm checks them at the first sampled token (after the model loads and
    the user types); NaN, which it takes as off, is refused.

    Raises:
        OptionError: Naming the flag and its range.
    """
    probability, threshold = args.xtc_probability, args.xtc_threshold
    if not 0 <= probability <= 1:
        raise OptionError("--xtc-probability", probability, "a number from 0 to 1")
    if not 0 <= threshold <= 0.5:
        raise OptionError("--xtc-threshold", threshold, "a number from 0 to 0.5")


def json_object_option(value: Any, flag: str) -> dict:
    """A flag's JSON object (text, or already parsed) as a dict, else one line.

    Keyword arguments of the chat template: a number or a list there was a
    TypeError at the first prompt.

    Raises:
        ValueError: Naming the flag and showing the form it takes.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag} is not valid JSON ({e.msg}).") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{flag} must be a JSON object of keyword arguments, such as "
            f"'{{\"enable_thinking\": false}}'; got {json.dumps(value)}."
        )
    return value


def check_gammas(gammas, flag: str) -> None:
    """Each γ of ``gammas`` is a valid ``num_draft_tokens``, named ``flag`` in errors.

    Raises:
        OptionError: ``--gammas=0 is out of range: ...``.
    """
    for g in gammas:
        try:
            spec_config(None, DRAFTER_LATER, num_draft_tokens=g)
        except OptionError as e:
            raise e.renamed(flag) from None


def spec_config_of_args(
    args: argparse.Namespace,
    draft: Any = None,
    *,
    speculative: Optional[str] = None,
    **fields,
) -> SpecConfig:
    """:func:`spec_config` of a command's parsed flags (those ``args`` has),
    with the run flags outside the config checked too (:func:`check_generation_args`).

    ``speculative`` and ``fields`` override the flags' values.
    """
    values = {n: getattr(args, n) for n in ARG_FIELDS if hasattr(args, n)}
    values.update(method_options(args))
    if getattr(args, "profile", None) is not None:
        values["profile"] = args.profile
    values.update(fields)
    speculative = speculative or getattr(args, "speculative", None)
    config = spec_config(speculative, draft, flags=True, **values)
    check_generation_args(args)
    return config
