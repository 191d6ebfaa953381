"""Route mlx-lm's own generation functions through mlx-spec.

mlx-lm has no plugin hook for generation strategies, so :func:`register`
swaps module attributes (never installed files):

- ``stream_generate`` and ``generate`` in ``mlx_lm``, ``mlx_lm.generate``
  and every loaded module that imported them by name (``mlx_lm.server``,
  ``mlx_lm.chat``, user scripts). A call that asks for speculation (a
  ``draft_model``, or a ``speculative=`` method) runs mlx-spec's loop and
  yields mlx-lm ``GenerationResponse`` objects (with ``from_draft``); every
  other call goes to the saved original, unchanged.
- ``batch_generate`` likewise: a call with a ``draft_model`` or
  ``speculative=`` runs :func:`mlx_spec.batch_generate`.
- ``make_sampler`` in ``mlx_lm.sample_utils`` (and importers): samplers
  it makes carry ``.sampling_params``, so routed calls at ``temp > 0`` use
  exact rejection sampling. Every ``temp == 0`` call returns the same
  tagged :func:`greedy_sampler`, so mlx_lm's batching (which shares one
  sampler call when all rows hold the *same* sampler) keeps its fast path.
  XTC samplers stay opaque (they are random filters, not a fixed law) and
  use sample-and-match, which is also exact.

:func:`unregister` puts the original function objects back everywhere.
Modules imported after :func:`register` pick up the patched names too, and
are restored as well.
"""

import importlib
import inspect
import sys
import threading
from dataclasses import asdict
from typing import Any, Dict, Optional

# ``import mlx_lm.generate as m`` would give the function: the package
# re-exports ``generate`` under the submodule's name.
_lm_generate = importlib.import_module("mlx_lm.generate")
_lm_sample_utils = importlib.import_module("mlx_lm.sample_utils")

from .config import DEFAULT_NUM_DRAFT_TOKENS
from .sampling import SamplingParams, top_p_or_off

# The keyword that turns a call into a speculative one without a draft model.
SPECULATIVE_KEY = "speculative"
# mlx_lm keywords the mlx-spec loop has no use for: it runs on its own
# generation stream (``max_kv_size`` is kept for plain decoding).
_DROPPED = ("stream",)
# mlx_lm's ``max_tokens=-1`` means "until EOS".
_UNLIMITED = 2**31 - 1

_lock = threading.Lock()
_originals: Dict[str, Any] = {}
_patched: Dict[str, Any] = {}


def wants_speculation(draft_model, kwargs) -> bool:
    """True when an mlx_lm-style call asks for speculative decoding."""
    return draft_model is not None or kwargs.get(SPECULATIVE_KEY) is not None


def _tag(sampler, temp, top_p, min_p, min_tokens_to_keep, top_k):
    """Attach the sampler's law; ``top_p`` 0 or 1 both mean "off" in mlx_lm."""
    top_p = top_p_or_off(top_p)
    sampler.sampling_params = SamplingParams(
        temp=float(temp),
        top_p=float(top_p),
        min_p=float(min_p),
        top_k=int(top_k),
        min_tokens_to_keep=int(min_tokens_to_keep),
    )
    return sampler


def greedy_sampler(logprobs):
    """``mlx_lm.sample_utils.greedy_sampler`` (argmax), tagged as greedy.

    One module-level object: every ``make_sampler(temp=0)`` returns it, as
    mlx_lm returns its own ``greedy_sampler``, so samplers of greedy
    requests compare identical (``is``) and mlx_lm's ``BatchGenerator``
    samples a whole batch in one call.
    """
    return _lm_sample_utils.greedy_sampler(logprobs)


greedy_sampler.sampling_params = SamplingParams()


def make_sampler(
    temp: float = 0.0,
    top_p: float = 0.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    xtc_special_tokens=None,
):
    """``mlx_lm.sample_utils.make_sampler``, tagged with ``.sampling_params``.

    Same arguments, same returned law. ``temp == 0`` gives the shared
    :func:`greedy_sampler`; XTC samplers are returned untagged.
    """
    if temp == 0:
        return greedy_sampler
    original = _originals["make_sampler"]
    sampler = original(
        temp,
        top_p,
        min_p,
        min_tokens_to_keep,
        top_k,
        xtc_probability,
        xtc_threshold,
        xtc_special_tokens,
    )
    if xtc_probability > 0.0:
        return sampler
    return _tag(sampler, temp, top_p, min_p, min_tokens_to_keep, top_k)


def _spec_stream(model, tokenizer, prompt, max_tokens, draft_model, kwargs):
    """Translate an mlx_lm-style call into :func:`mlx_spec.stream_generate`."""
    from .generation import stream_generate as spec_stream_generate

    kwargs = dict(kwargs)
    for name in _DROPPED:
        kwargs.pop(name, None)
    if kwargs.get(SPECULATIVE_KEY) != "none":
        kwargs.pop("max_kv_size", None)  # a rotating cache cannot be rewound
    if kwargs.pop("input_embeddings", None) is not None:
        raise ValueError("Speculative decoding does not support input embeddings.")
    kwargs.setdefault("num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS)
    if max_tokens == 0:
        raise ValueError(
            "Maximum number of tokens must be non-zero (use -1 for no limit)."
        )
    if max_tokens < 0:
        max_tokens = _UNLIMITED
    stream = spec_stream_generate(
        model, tokenizer, prompt, max_tokens, draft_model, **kwargs
    )
    return stream


def _responses(stream):
    """A real generator over a :class:`SpecStream`, closing it when closed."""
    try:
        for response in stream:
            yield response
    finally:
        stream.close()


def _bind_original(
    args: tuple, kwargs: dict, name: str = "stream_generate"
) -> Dict[str, Any]:
    """Bind a call as mlx_lm's function ``name`` would (its ``TypeError``s too).

    Returns every named argument given, with the ``**kwargs`` catch-all
    merged in, so positional extras (such as mlx_lm's sixth, ``stream``)
    are seen by name.
    """
    signature = inspect.signature(_originals[name])
    bound = signature.bind(*args, **kwargs).arguments
    named = {}
    for key, value in bound.items():
        if signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[key] = value
    return named


def stream_generate(
    model, tokenizer, prompt, max_tokens=256, draft_model=None, *args, **kwargs
):
    """``mlx_lm.stream_generate``, speculative when the call asks for it.

    The hook's stand-in for mlx-lm's function (:func:`register` installs it),
    not a second API: it takes mlx_lm's arguments, positional or keyword
    (``model, tokenizer, prompt, max_tokens, draft_model, stream,
    **kwargs``), the order :func:`mlx_spec.stream_generate` follows too. With a
    ``draft_model`` or a ``speculative=`` method, mlx-spec's loop runs
    (extra keywords such as ``num_draft_tokens``, ``temp``, ``tree_budget``
    go to :func:`mlx_spec.stream_generate`) and the yielded responses are
    ``GenerationResponse`` subclasses carrying ``stats``. Any other call is
    mlx_lm's original, with the same arguments.
    """
    original = _originals["stream_generate"]
    if not wants_speculation(draft_model, kwargs):
        return original(
            model, tokenizer, prompt, max_tokens, draft_model, *args, **kwargs
        )
    named = _bind_original(
        (model, tokenizer, prompt, max_tokens, draft_model, *args), kwargs
    )
    for name in ("model", "tokenizer", "prompt", "max_tokens", "draft_model"):
        named.pop(name)
    stream = _spec_stream(model, tokenizer, prompt, max_tokens, draft_model, named)
    return _responses(stream)


def generate(model, tokenizer, prompt, verbose: bool = False, **kwargs) -> str:
    """``mlx_lm.generate``, speculative when the call asks for it.

    With ``verbose`` a speculative call prints mlx_lm's output followed by
    a line of speculation statistics.
    """
    draft_model = kwargs.pop("draft_model", None)
    if not wants_speculation(draft_model, kwargs):
        if draft_model is not None:
            kwargs["draft_model"] = draft_model
        return _originals["generate"](
            model, tokenizer, prompt, verbose=verbose, **kwargs
        )
    from .generation import collect_text

    max_tokens = kwargs.pop("max_tokens", 256)
    stream = _spec_stream(model, tokenizer, prompt, max_tokens, draft_model, kwargs)
    return collect_text(stream, verbose)


# mlx_lm BatchGenerator keywords and what mlx_spec.batch_generate calls them.
_BATCH_RENAMED = {"completion_batch_size": "max_batch"}
# BatchGenerator keywords with no bearing on the result (mlx-spec's batch
# prefills one prompt at a time, on its own stream).
_BATCH_DROPPED = ("prefill_batch_size", "stream")


def batch_generate(model, tokenizer, prompts, *args, **kwargs):
    """``mlx_lm.batch_generate``, speculative when the call asks for it.

    With a ``draft_model`` or a ``speculative=`` method the call runs
    :func:`mlx_spec.batch_generate` (a ``sampler`` from ``make_sampler`` gives
    its law); any other call is mlx_lm's original.
    """
    draft_model = kwargs.pop("draft_model", None)
    original = _originals["batch_generate"]
    if not wants_speculation(draft_model, kwargs):
        return original(model, tokenizer, prompts, *args, **kwargs)
    named = _bind_original((model, tokenizer, prompts, *args), kwargs, "batch_generate")
    for name in ("model", "tokenizer", "prompts", *_BATCH_DROPPED):
        named.pop(name, None)
    for name in ("logits_processors", "max_kv_size"):
        if named.get(name) is not None:
            raise ValueError(f"batch_generate does not take {name} with speculation.")
        named.pop(name, None)
    sampler = named.pop("sampler", None)
    if sampler is not None:
        named.update(_sampler_options(sampler))
    named = {_BATCH_RENAMED.get(k, k): v for k, v in named.items()}
    from .batching import batch_generate as spec_batch_generate

    return spec_batch_generate(
        model, tokenizer, prompts, draft_model=draft_model, **named
    )


def _sampler_options(sampler) -> Dict[str, Any]:
    """The sampling keywords of a tagged sampler (from ``make_sampler``)."""
    from .sampling import sampling_params_of

    params = sampling_params_of(sampler)
    if params is None:
        raise ValueError(
            "batch_generate with speculation needs a sampler made by make_sampler "
            "(an XTC or custom sampler has no law to accept drafts against)."
        )
    return asdict(params)


# name -> (home module, replacement)
def _targets():
    return {
        "stream_generate": (_lm_generate, stream_generate),
        "generate": (_lm_generate, generate),
        "batch_generate": (_lm_generate, batch_generate),
        "make_sampler": (_lm_sample_utils, make_sampler),
    }


def _swap_everywhere(old: Dict[str, Any], new: Dict[str, Any]):
    """In every loaded module, replace ``old[name]`` (by identity) by ``new[name]``."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or module is sys.modules.get(__name__):
            continue
        for name, value in old.items():
            if namespace.get(name) is value:
                namespace[name] = new[name]


def register():
    """Route speculative mlx_lm generation calls through mlx-spec.

    Patches ``mlx_lm.generate``/``stream_generate``/``batch_generate`` (package and module
    names, and the names already imported by ``mlx_lm.server``,
    ``mlx_lm.chat`` and any other loaded module) and
    ``mlx_lm.sample_utils.make_sampler``. Idempotent.
    """
    with _lock:
        if _patched:
            return
        originals = {
            name: getattr(home, name) for name, (home, _) in _targets().items()
        }
        patched = {name: fn for name, (_, fn) in _targets().items()}
        _originals.update(originals)
        _patched.update(patched)
        _swap_everywhere(originals, patched)


def unregister():
    """Undo :func:`register`: the original function objects are back. Idempotent."""
    with _lock:
        if not _patched:
            return
        _swap_everywhere(dict(_patched), dict(_originals))
        _patched.clear()


def is_registered() -> bool:
    """Whether :func:`register` is in effect."""
    return bool(_patched)


def original(name: str) -> Optional[Any]:
    """The unpatched mlx_lm function ``name`` (whether or not registered)."""
    if name in _originals:
        return _originals[name]
    home, _ = _targets()[name]
    return getattr(home, name)
