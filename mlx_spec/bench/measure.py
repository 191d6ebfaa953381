"""Bare forward timings: the limit the models themselves set.

:class:`ForwardTimer` times cached forwards of a given width (the number of
tokens scored at once), evaluated, with the KV cache prefilled to a fixed
context and trimmed back after each call, optionally as a pipelined chain of
dependent forwards like mlx_lm's decoding loop. :func:`fit_linear` fits
``T(w) = a + b * w`` to the medians, and :class:`BareCosts` prices a whole
round (its draft forwards and its verification). The harness uses them for the
implementation-overhead ratio (draft steps and target verification forwards)
and, with random-weight models shaped like real targets, for the
``--cost-curves`` projection.
"""

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec_entry import guarded

DEFAULT_CONTEXT = 256
DEFAULT_FORWARD_REPEATS = 10
RANDOM_BLOCK = 1 << 20
COST_CURVE_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 16, 32, 64)

# Real target shapes (Hugging Face config values), built with random weights.
QWEN2_SHAPES: Dict[str, dict] = {
    "Qwen2.5-0.5B": dict(
        hidden_size=896,
        num_hidden_layers=24,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-1.5B": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


def _vocab_size(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    return int(size) if size else 256


def prefilled_cache(model: nn.Module, context: int, seed: int = 0) -> list:
    """A KV cache holding ``context`` random tokens.

    The prefill runs the model body only when it has one (``model.model``),
    skipping the output head, which is large and irrelevant to the cache.
    """
    body = getattr(model, "model", None)
    run = body if isinstance(body, nn.Module) else model
    prefix = mx.random.randint(
        0, _vocab_size(model), (1, context), key=mx.random.key(seed)
    )
    cache = make_prompt_cache(model)
    for start in range(0, context, 128):
        run(prefix[:, start : start + 128], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


@dataclass(frozen=True)
class LinearCost:
    """A forward-time model ``T(w) = a + b * w`` (seconds, w tokens).

    Attributes:
        a: Fixed seconds per forward.
        b: Seconds per token of width.
        max_rel_residual: Largest ``|T(w) / median(w) - 1|`` over the fitted widths.
        widths: The widths it was fitted on.
    """

    a: float
    b: float
    max_rel_residual: float
    widths: tuple

    def __call__(self, width: float) -> float:
        return self.a + self.b * width

    def as_dict(self) -> dict:
        return {
            "a_s": self.a,
            "b_s_per_token": self.b,
            "max_rel_residual": self.max_rel_residual,
            "widths": list(self.widths),
        }


def fit_linear(widths: Sequence[float], times: Sequence[float]) -> LinearCost:
    """Least-squares ``a + b * w`` through ``(widths, times)``.

    With one width, or a negative slope (noise), the cost is flat: ``b = 0``
    and ``a`` the median time.
    """
    if len(widths) < 2:
        a, b = statistics.median(times), 0.0
    else:
        w, t = np.asarray(widths, float), np.asarray(times, float)
        b, a = (float(v) for v in np.polyfit(w, t, 1))
        if b < 0:
            a, b = float(np.median(t)), 0.0
    residual = max(abs((a + b * w) / t - 1) for w, t in zip(widths, times) if t > 0)
    return LinearCost(a, b, float(residual), tuple(int(w) for w in widths))


@dataclass(frozen=True)
class PiecewiseCost:
    """A forward-time model from medians at sampled widths (seconds, w tokens).

    Between two sampled widths, ``T(w) = a + b * w`` is the line through
    their medians; past the widest, the last line goes on (never
    decreasing). CPU BLAS costs are not one line over all widths (a 16-row
    matmul can beat an 8-row one), so each width is priced by its neighbours.

    Attributes:
        widths: Sampled widths, increasing.
        times: Median seconds at each width.
    """

    widths: tuple
    times: tuple

    def __call__(self, width: float) -> float:
        ws, ts = self.widths, self.times
        if len(ws) == 1 or width <= ws[0]:
            return ts[0]
        i = next((k for k in range(1, len(ws)) if width <= ws[k]), len(ws) - 1)
        slope = (ts[i] - ts[i - 1]) / (ws[i] - ws[i - 1])
        if width > ws[-1]:
            return ts[-1] + max(slope, 0.0) * (width - ws[-1])
        return ts[i - 1] + slope * (width - ws[i - 1])


class ForwardTimer:
    """Bare forward times per model and width, sampled repeatedly during a run.

    Each model keeps one KV cache prefilled to ``context`` tokens, so a sample
    costs only its forwards. With ``chain > 1`` one sample is the mean
    steady-state time per forward of a chain of dependent forwards, each
    ``mx.async_eval``'d before the host waits for the previous one (the next
    input is the argmax of the last output), as mlx_lm's ``generate_step``
    pipelines decoding: graph building overlaps the previous forward, so plain
    mlx_lm decoding runs at one such bare forward per token. ``chain=1``
    times one synchronous forward.

    :meth:`sample` adds samples (call it between benchmark passes, so the bare
    forwards see the same machine noise as the generations); :meth:`__call__`
    returns the median, interpolating a fractional width linearly between its
    neighbours; :meth:`curve` prices any width from the medians (a line
    ``a + b * w`` between sampled neighbours) and :meth:`fit` fits one line
    ``T(w) = a + b * w`` to them all.
    """

    def __init__(
        self,
        *,
        context: int = DEFAULT_CONTEXT,
        repeats: int = DEFAULT_FORWARD_REPEATS,
        seed: int = 0,
        chain: int = 1,
    ):
        self.context = context
        self.repeats = repeats
        self.seed = seed
        self.chain = chain
        self._samples: Dict[tuple, List[float]] = {}
        self._caches: Dict[str, list] = {}

    def _cache(self, name: str, model: nn.Module) -> list:
        if name not in self._caches:
            self._caches[name] = prefilled_cache(model, self.context, self.seed)
        return self._caches[name]

    def sample(
        self,
        name: str,
        model: nn.Module,
        width: int,
        repeats: Optional[int] = None,
        warmup: int = 1,
        chain: Optional[int] = None,
    ) -> None:
        """Add ``repeats`` samples of ``width``-token forwards of ``model``.

        Each sample is the seconds per forward of a chain of ``chain``
        forwards (default: the timer's; see :func:`_time_chain`); ``warmup``
        untimed chains come first.
        """
        cache = self._cache(name, model)
        chain = chain or self.chain
        inputs = mx.random.randint(
            0, _vocab_size(model), (1, width), key=mx.random.key(self.seed + width)
        ).astype(mx.uint32)
        mx.eval(inputs)
        times = self._samples.setdefault((name, width), [])
        for i in range(warmup + (repeats or self.repeats)):
            elapsed = _time_chain(model, cache, inputs, chain)
            if i >= warmup:
                times.append(elapsed)

    def widths(self) -> List[tuple]:
        """The ``(name, width)`` pairs sampled so far."""
        return sorted(self._samples)

    def samples(self) -> Dict[str, Dict[int, List[float]]]:
        """Every sample so far, as ``{model name: {width: [seconds, ...]}}``."""
        out: Dict[str, Dict[int, List[float]]] = {}
        for (name, width), times in sorted(self._samples.items()):
            out.setdefault(name, {})[width] = list(times)
        return out

    def __call__(self, name: str, model: nn.Module, width: float) -> float:
        """Median seconds of a ``width``-token forward (measured if never sampled)."""
        low = max(int(width), 1)
        high = low + 1 if width > low else low
        t_low = self._median(name, model, low)
        if high == low:
            return t_low
        t_high = self._median(name, model, high)
        return t_low + (width - low) * (t_high - t_low)

    def _median(self, name: str, model: nn.Module, width: int) -> float:
        if not self._samples.get((name, width)):
            self.sample(name, model, width)
        return statistics.median(self._samples[(name, width)])

    def table(self) -> Dict[str, Dict[int, float]]:
        """Medians of everything sampled, as ``{model name: {width: seconds}}``."""
        out: Dict[str, Dict[int, float]] = {}
        for (name, width), times in sorted(self._samples.items()):
            if times:
                out.setdefault(name, {})[width] = statistics.median(times)
        return out

    def fit(self, name: str) -> Optional[LinearCost]:
        """One line ``T(w) = a + b * w`` fitted to all of ``name``'s medians."""
        medians = self.table().get(name)
        if not medians:
            return None
        return fit_linear(list(medians), list(medians.values()))

    def curve(self, name: str) -> Optional[PiecewiseCost]:
        """``T(w)`` from the medians of ``name``, piecewise linear in ``w``."""
        medians = self.table().get(name)
        if not medians:
            return None
        return PiecewiseCost(tuple(medians), tuple(medians.values()))

    def close(self) -> None:
        """Free the caches."""
        self._caches.clear()
        mx.clear_cache()


@dataclass(frozen=True)
class BareCosts:
    """Bare forward-time models of the target and the draft (seconds).

    A round that drafts ``d`` tokens in ``f`` draft forwards and verifies
    ``d + 1`` tokens costs ``f * draft(d / f) + target(d + 1)``: a chain
    feeds one token per draft forward, a tree a level of nodes per forward.
    """

    target: PiecewiseCost
    draft: Optional[PiecewiseCost]

    def round(self, drafted: int, forwards: int) -> Optional[float]:
        cost = self.target(drafted + 1)
        if forwards:
            if self.draft is None:
                return None
            cost += forwards * self.draft(max(drafted / forwards, 1.0))
        return cost


def bare_costs(timer: ForwardTimer) -> Optional[BareCosts]:
    """The target's and the draft's cost models from ``timer``'s samples."""
    target = timer.curve("target")
    if target is None:
        return None
    return BareCosts(target, timer.curve("draft"))


def _rewind(cache: list, width: int) -> None:
    """Trim ``width`` tokens off every cache that can be trimmed.

    Recurrent state (``ArraysCache``) does not grow and is left as it is: a
    timing does not depend on its values.
    """
    for c in cache:
        trimmable = getattr(c, "is_trimmable", lambda: hasattr(c, "trim"))
        if hasattr(c, "trim") and trimmable():
            c.trim(width)


def _time_chain(model: nn.Module, cache: list, inputs: mx.array, chain: int) -> float:
    """Seconds per forward of ``model`` on ``cache``; pipelined when ``chain > 1``.

    With ``chain == 1``: one synchronous forward. Otherwise, as mlx_lm's
    ``generate_step`` decodes: forward ``i + 1`` is built and
    ``mx.async_eval``'d before the host waits for forward ``i``; the result is
    the mean gap between those ``chain`` waits (steady state, ``chain - 1``
    gaps, ``chain + 1`` forwards). The cache is trimmed back after each
    forward (only its offset moves), so every forward sees the same context
    (see :func:`_rewind`).
    """
    width = inputs.shape[1]

    def step(x):
        out = mx.argmax(model(x, cache=cache), axis=-1).astype(mx.uint32)
        _rewind(cache, width)
        return out

    if chain <= 1:
        tic = time.perf_counter()
        mx.eval(step(inputs))
        return time.perf_counter() - tic
    y = step(inputs)
    mx.async_eval(y)
    waits = []
    for _ in range(chain):
        following = step(y)
        mx.async_eval(following)
        mx.eval(y)
        waits.append(time.perf_counter())
        y = following
    mx.eval(y)
    return (waits[-1] - waits[0]) / (len(waits) - 1)


def random_qwen2(shape: dict, seed: int = 0) -> nn.Module:
    """A float32 Qwen2 model of the given shape with random weights (no download).

    Matrices tile a block of ``RANDOM_BLOCK`` normal values (std 0.02) drawn
    with numpy, which takes a second where drawing every value takes a
    minute; norm scales are ones and biases zeros. Forward time does not
    depend on the values.
    """
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen2

    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, **shape)
    model = qwen2.Model(args)
    rng = np.random.default_rng(seed)
    weights = []
    for name, value in tree_flatten(model.parameters()):
        if value.ndim == 1:
            fill = np.zeros if name.endswith("bias") else np.ones
            array = fill(value.shape, np.float32)
        else:
            block = rng.standard_normal(min(value.size, RANDOM_BLOCK), dtype=np.float32)
            array = np.resize(block * np.float32(0.02), value.shape)
        weights.append((name, mx.array(array)))
        mx.eval(weights[-1][1])
        del array
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    return model


def cost_curves(
    shapes: Dict[str, dict] = QWEN2_SHAPES,
    widths: Sequence[int] = COST_CURVE_WIDTHS,
    *,
    context: int = DEFAULT_CONTEXT,
    repeats: int = 3,
    progress: Optional[Callable[[str], None]] = None,
) -> Dict[str, Dict[str, List[float]]]:
    """Measured forward time against width for random-weight real shapes.

    One model is alive at a time (Qwen2.5-1.5B in float32 is about 6 GB).

    Returns:
        ``{shape name: {"widths": [...], "forward_s": [...], "params": n}}``.
    """
    from mlx.utils import tree_flatten

    out = {}
    for name, shape in shapes.items():
        if progress:
            progress(f"cost curve: building random {name} (float32)")
        model = random_qwen2(shape)
        params = sum(v.size for _, v in tree_flatten(model.parameters()))
        timer = ForwardTimer(context=context, repeats=repeats)
        # Interleaved passes over the widths, so that bursts of machine load
        # spread over the whole curve instead of bending one part of it.
        for i in range(repeats):
            if progress:
                progress(
                    f"cost curve: {name} pass {i + 1}/{repeats} over widths {list(widths)}"
                )
            for width in widths:
                timer.sample(name, model, width, repeats=1, warmup=1 if i == 0 else 0)
        times = [timer(name, model, width) for width in widths]
        timer.close()
        out[name] = {"widths": list(widths), "forward_s": times, "params": int(params)}
        del model
        gc.collect()
        mx.clear_cache()
    return out


def interpolate(widths: Sequence[int], times: Sequence[float], width: float) -> float:
    """Piecewise-linear value of a cost curve at ``width`` (clamped at the ends)."""
    if width <= widths[0]:
        return times[0]
    for (w0, t0), (w1, t1) in zip(zip(widths, times), zip(widths[1:], times[1:])):
        if width <= w1:
            return t0 + (width - w0) / (w1 - w0) * (t1 - t0)
    return times[-1]


def load_cost_curves(path: str, flag: str = "--cost-curves-from") -> Dict[str, dict]:
    """Cost curves from a ``cost_curves.json`` or an earlier ``results.json``.

    Raises:
        ValueError: One line naming ``flag`` and ``path``: missing, not UTF-8
          JSON, or holding no cost curves.
    """
    import json
    from pathlib import Path

    name = f"{flag} {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{name}: no such file.") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not UTF-8 text (byte {e.start}).") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not valid JSON ({e.msg}).") from None
    except OSError as e:  # a folder, a device
        raise ValueError(f"{name} cannot be read ({e.strerror}).") from None
    curves = data.get("cost_curves", data) if isinstance(data, dict) else None
    if (
        not isinstance(curves, dict)
        or not curves
        or not all(
            isinstance(c, dict) and "widths" in c and "forward_s" in c
            for c in curves.values()
        )
    ):
        raise ValueError(f"{name} holds no cost curves.")
    return curves


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Measure the cost curves alone: ``python -m mlx_spec.bench.measure OUT.json``."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from mlx_spec.options import one_line_errors

    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.measure",
        description="Measure forward time against verified width for random-weight "
        "models of real shapes; reuse with `mlx_spec.bench.run --cost-curves-from FILE`.",
    )
    one_line_errors(parser)
    parser.add_argument("out", help="JSON file to write.")
    parser.add_argument(
        "--shapes", nargs="+", default=list(QWEN2_SHAPES), choices=list(QWEN2_SHAPES)
    )
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    curves = cost_curves(
        {k: QWEN2_SHAPES[k] for k in args.shapes},
        context=args.context,
        repeats=args.repeats,
        progress=lambda text: print(text, file=sys.stderr, flush=True),
    )
    Path(args.out).write_text(
        json.dumps({"cost_curves": curves, "context": args.context}, indent=2)
    )
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    guarded(main)
