"""Limits every front end applies the same way: the model's context window,
the smallest temperature a sampler represents, and stopping a generation on
request (between prefill chunks or rounds).

- :func:`check_context` refuses a prompt whose tokens plus ``max_tokens`` do
  not fit the model's context, before any prefill (OpenAI answers 400).
- :func:`stopping_progress` turns ``should_stop`` into a
  ``prompt_progress_callback`` that raises :class:`GenerationCancelled`
  between prefill chunks; :func:`mlx_spec.stream_generate` takes
  ``should_stop=`` and also checks it before each token it yields.
"""

from typing import Any, Callable, Optional

# Below this a temperature is greedy, the law's limit: 1/temp overflows
# float16 (and 1e-300 overflows float32), so a sampler cannot represent it.
GREEDY_BELOW_TEMP = 1e-4
# Config fields that hold a model's context window, most common first.
CONTEXT_FIELDS = (
    "max_position_embeddings",
    "max_sequence_length",
    "max_seq_len",
    "n_positions",
    "seq_length",
    "n_ctx",
)


def greedy_limit(temp: float) -> float:
    """``temp``, or 0 (greedy) below :data:`GREEDY_BELOW_TEMP`."""
    return 0.0 if temp < GREEDY_BELOW_TEMP else temp


class GenerationCancelled(Exception):
    """``should_stop()`` returned true: the generation stopped early.

    Raised between prefill chunks or before a token is yielded. The prompt
    cache is left as :func:`mlx_spec.stream_generate` documents.
    """


class ContextTooLong(ValueError):
    """The prompt plus ``max_tokens`` do not fit the model's context window."""


def context_window(model: Any) -> Optional[int]:
    """The model's context window in tokens, or ``None`` if its config has none.

    Read from the mlx-lm model's ``args`` (its ``config.json``), e.g.
    ``max_position_embeddings``; a model with text and vision configs is
    looked up in its ``text_config`` too.
    """
    args = getattr(model, "args", None)
    for source in (args, getattr(args, "text_config", None)):
        if source is None:
            continue
        for name in CONTEXT_FIELDS:
            value = (
                source.get(name)
                if isinstance(source, dict)
                else getattr(source, name, None)
            )
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def check_context(
    model: Any, prompt_tokens: int, max_tokens: int, *, limit: Optional[int] = None
) -> None:
    """Refuse a request that cannot fit the model's context window.

    Args:
        model: The target model (its context window is read with
          :func:`context_window`).
        prompt_tokens: Tokens of the whole prompt, cached part included.
        max_tokens: Tokens the request may generate.
        limit: Use this window instead of the model's. Default: ``None``.

    Raises:
        ContextTooLong: One line naming the token counts and the limit.
    """
    limit = limit if limit is not None else context_window(model)
    total = prompt_tokens + max_tokens
    if limit is not None and total > limit:
        raise ContextTooLong(
            f"the prompt is {prompt_tokens} tokens and max_tokens is {max_tokens}: "
            f"{total} tokens, beyond the model's context of {limit} tokens; "
            "shorten the prompt or lower max_tokens."
        )


def stopping_progress(
    should_stop: Optional[Callable[[], bool]],
    progress: Optional[Callable[[int, int], None]] = None,
) -> Optional[Callable[[int, int], None]]:
    """A ``prompt_progress_callback`` that also stops the prefill.

    Args:
        should_stop: Polled after each prefill chunk; true stops.
        progress: ``progress(processed, total)`` to call first, if any.

    Returns:
        A callback raising :class:`GenerationCancelled` once ``should_stop()``
        is true, or ``progress`` itself when ``should_stop`` is ``None``.
    """
    if should_stop is None:
        return progress

    def report(processed: int, total: int) -> None:
        if progress is not None:
            progress(processed, total)
        if should_stop():
            raise GenerationCancelled(
                f"stopped during the prompt ({processed} of {total} tokens)"
            )

    return report
