"""A chat turn's prompt read in slices of bounded time, for Stop and other users.

The engine reads a prompt in fixed chunks (``prefill_step_size``, 512 tokens
by default): on a slow machine one chunk of a long conversation takes tens
of seconds, and Stop or a waiting user gets the model only between chunks.
Here the prompt goes into the session's prompt cache (the target's and, for
the draft method, the draft model's) in slices sized so each takes about
:data:`SLICE_SECONDS`, whatever the machine; the turn's generation then
starts from the filled cache, as the next turn of a conversation does.
"""

import inspect
import time
from typing import Any, Callable, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream

from mlx_spec.generate import stream_generate
from mlx_spec.models import num_caches

# Seconds one slice should take: Stop and waiting users wait at most about this.
SLICE_SECONDS = 0.5
FIRST_SLICE = 32  # tokens; later slices follow the measured speed
MAX_GROWTH = 2  # a slice is at most this many times the previous one
# The largest slice unless the app sets one: the engine's prefill chunk.
DEFAULT_CAP = inspect.signature(stream_generate).parameters["prefill_step_size"].default


def next_slice(tokens: int, seconds: float, cap: int) -> int:
    """Tokens for the next slice after ``tokens`` took ``seconds``.

    Aims at :data:`SLICE_SECONDS`; grows at most :data:`MAX_GROWTH`-fold
    (later slices attend over more context) and stays within ``1..cap``.
    """
    if seconds <= 0:
        return min(cap, tokens * MAX_GROWTH)
    aimed = int(tokens * SLICE_SECONDS / seconds)
    return max(1, min(cap, tokens * MAX_GROWTH, aimed))


def prefill_in_slices(
    models: Sequence[Any],
    cache: List[Any],
    tokens: List[int],
    cap: int,
    progress: Optional[Callable[[int, int], None]] = None,
) -> None:
    """Feed ``tokens`` into each model's part of ``cache``, slice by slice.

    Args:
        models: The models whose caches ``cache`` holds, in order (the
          target, then the draft model if it drafts).
        cache: Their prompt caches, concatenated.
        tokens: The prompt tokens to add (shape ``(L,)`` as a list).
        cap: The largest slice, in tokens (the app's ``prefill_step_size``).
        progress: ``progress(done, total)`` first with ``done`` 0, then after
          each slice, every model's cache then holding ``done`` more tokens;
          it may raise to stop.
    """
    parts, start = [], 0
    for model in models:
        n = num_caches(model)
        parts.append((model, cache[start : start + n]))
        start += n
    done, size, total = 0, min(FIRST_SLICE, cap), len(tokens)
    if progress is not None:  # reading begins (and Stop may end it at once)
        progress(0, total)
    with mx.stream(generation_stream):
        while done < total:
            piece = mx.array(tokens[done : done + size])[None]
            tic = time.perf_counter()
            for model, part in parts:
                model(piece, cache=part)
                mx.eval([c.state for c in part])
            took = time.perf_counter() - tic
            done += piece.shape[1]
            mx.clear_cache()
            if progress is not None:
                progress(done, total)
            size = next_slice(piece.shape[1], took, cap)
