"""The private names of mlx-lm that mlx-spec uses, in one place.

mlx-lm does not promise these across versions. Each is wrapped here under a
name of mlx-spec's, so a change in mlx-lm breaks this file alone: the server
(:mod:`mlx_spec.serve`) reuses ``mlx_lm.server``'s parser, sampler,
logits processors and request plumbing, the batch cache sets
``BatchKVCache``'s write index, and :mod:`mlx_spec.testing` builds models
from mlx-lm's own classes.
"""

import argparse
import threading
import types
from typing import Any, Optional, Tuple


def _server():
    """``mlx_lm.server``, imported on first use (the engine does not need it)."""
    import mlx_lm.server

    return mlx_lm.server


# --------------------------------------------------------------------------- #
# mlx_lm.server's functions
# --------------------------------------------------------------------------- #


def xtc_sampler(args, tokenizer):
    """mlx_lm.server's sampler for a request's ``args`` (used for XTC)."""
    return _server()._make_sampler(args, tokenizer)


def logits_processors(args) -> list:
    """mlx_lm.server's logits processors of a request (penalties, logit_bias)."""
    return _server()._make_logits_processors(args)


def image_parts(messages: list) -> list:
    """The image parts of a chat request's messages."""
    return _server()._image_parts(messages)


def top_logprobs(logprobs, count: int, tokenizer):
    """mlx_lm.server's ``top_logprobs`` entries for one token's logprobs."""
    return _server()._format_top_logprobs(logprobs, count, tokenizer)


# --------------------------------------------------------------------------- #
# Private members of mlx_lm.server's classes
# --------------------------------------------------------------------------- #


def should_stop(ctx) -> bool:
    """Whether a request's client has gone (``GenerationContext``)."""
    return ctx._should_stop


def tokenizer_config(provider) -> dict:
    """The tokenizer options a ``ModelProvider`` loads with."""
    return provider._tokenizer_config


def requested_model_key(provider, model) -> Tuple[Any, Any, Any]:
    """The ``(model, adapter, draft)`` key a request's ``model`` asks for.

    As ``ModelProvider.load`` maps it, except that a request's adapter applies
    to the default model too (mlx_lm's map drops it there).
    """
    p, m = provider, model
    adapter = m.adapter if m.adapter is not None else p._adapter_map.get(m.model)
    return (
        p._model_map.get(m.model, m.model),
        adapter,
        p._draft_model_map.get(m.draft, m.draft),
    )


def download(repo: str):
    """The local folder of a hub ``repo``, fetched by mlx-lm's loader if need be."""
    from mlx_lm.utils import _download

    return _download(repo)


def is_distributed(generator) -> bool:
    """Whether a ``ResponseGenerator`` runs under mlx.launch (several processes)."""
    return generator._is_distributed


def share_object(generator, obj):
    """Rank 0's ``obj`` on every rank of a distributed server (pickled, all_sum)."""
    return generator._share_object(obj)


def generation_failed(generator) -> bool:
    """Whether a ``ResponseGenerator``'s generation thread died of an error."""
    return generator._generation_failed


def stopping(generator) -> bool:
    """Whether a ``ResponseGenerator`` was asked to stop."""
    return generator._stop


def next_request(generator, timeout: Optional[float] = None):
    """The next queued ``(rqueue, request, args)`` of a ``ResponseGenerator``, or None."""
    if timeout is None:
        return generator._next_request()
    return generator._next_request(timeout=timeout)


def tokenize(generator, tokenizer, request, args):
    """``(prompt, _, _, initial_state, vision)`` of a request, as mlx_lm tokenizes it."""
    return generator._tokenize(tokenizer, request, args)


def stop_state_machine(generator, model_key, tokenizer, stop_words):
    """``(stop_sequences, text_state_machine)`` of a request's stop words."""
    return generator._make_state_machine(model_key, tokenizer, stop_words)


# --------------------------------------------------------------------------- #
# mlx_lm.server's command line
# --------------------------------------------------------------------------- #


class _ParserCaptured(Exception):
    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


class _CapturingParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        raise _ParserCaptured(self)


_capture_lock = threading.Lock()


def server_parser() -> argparse.ArgumentParser:
    """The argument parser of the installed ``mlx_lm.server``.

    ``mlx_lm.server.main()`` builds its parser inline, so it is run with an
    ``argparse`` whose ``parse_args`` stops it right there (before it loads
    anything). The flags therefore follow the installed mlx-lm version.
    """
    shim = types.ModuleType("argparse")
    shim.__dict__.update(argparse.__dict__)
    shim.ArgumentParser = _CapturingParser
    lm_server = _server()
    with _capture_lock:
        saved = lm_server.argparse
        lm_server.argparse = shim
        try:
            lm_server.main()
        except _ParserCaptured as captured:
            parser = captured.parser
        finally:
            lm_server.argparse = saved
    parser.__class__ = argparse.ArgumentParser
    return parser


# --------------------------------------------------------------------------- #
# Caches and models
# --------------------------------------------------------------------------- #


def set_write_index(cache, index: int) -> None:
    """Where a ``BatchKVCache`` writes its next keys and values (its ``_idx``)."""
    cache._idx = index


def model_classes(config: dict) -> Tuple[type, type]:
    """``(Model, ModelArgs)`` of a model config, as ``mlx_lm.utils.load`` picks them."""
    from mlx_lm.utils import _get_classes

    return _get_classes(config)
