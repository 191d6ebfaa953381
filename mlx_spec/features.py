"""Hidden states of an unmodified mlx-lm model, taken from its own forward.

Draft heads (EAGLE, Medusa) read the target's *features*: the hidden states
its forward computes anyway. No model file is forked. While a forward's
graph is built under :meth:`FeatureCapture.capturing`, the model's final
norm (and any chosen blocks) are seen through thin taps that record their
outputs and return them unchanged, so the logits are bit-identical; on exit
the model is restored. mlx is lazy, so recording costs no compute and no
host sync: the recorded arrays are part of the graph the round evaluates.

Feature layers, as ``int``:

- :data:`FINAL` (``-1``): the final hidden state *after* the model's last
  norm, i.e. the input of the output layer (``logits = W h``). A head that
  predicts it can reuse the target's frozen output layer as is, so this is
  the feature EAGLE-1/2 and Medusa use.
- ``i >= 0``: the output of block ``i`` (the residual stream before any
  norm), e.g. a low, a middle and a high block as EAGLE-3 does.

Any mlx-lm model that keeps its blocks in ``model.model.layers`` and its
final norm in ``model.model.norm`` works (llama, mistral, qwen2, qwen3,
gemma, phi3 and most others).

On mlx-lm's pipeline stages each process runs some of the blocks: it gives
the features of those it holds, zeros for the others, and one ``all_sum``
gives every process the same features (the final state is the same on all).
"""

from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn

FINAL = -1


def feature_owner(model: nn.Module) -> nn.Module:
    """The inner module holding ``layers``, ``norm`` and ``embed_tokens``.

    Raises:
        ValueError: If the model keeps them elsewhere (unsupported layout).
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if (
        not isinstance(layers, list)
        or getattr(inner, "norm", None) is None
        or getattr(inner, "embed_tokens", None) is None
    ):
        kind = getattr(model, "model_type", type(model).__name__)
        raise ValueError(
            f"draft heads need an mlx-lm model with model.model.layers, .norm and "
            f".embed_tokens; model type {kind!r} has another layout."
        )
    return inner


def check_feature_layers(model: nn.Module, layers: Sequence[int]) -> Tuple[int, ...]:
    """Validate feature layers for ``model``; return them as a tuple."""
    count = len(feature_owner(model).layers)
    layers = tuple(int(i) for i in layers)
    bad = [i for i in layers if not (i == FINAL or 0 <= i < count)]
    if not layers or bad or len(set(layers)) != len(layers):
        raise ValueError(
            f"feature layers {list(layers)} are invalid for a model with {count} "
            f"blocks: use distinct block indices 0..{count - 1}, or {FINAL} for the "
            "final normed hidden state."
        )
    return layers


def eagle3_blocks(num_layers: int) -> List[int]:
    """EAGLE-3's low, middle and high blocks of a target with ``num_layers`` blocks.

    Blocks ``m``, ``num_layers // 2`` and ``num_layers - 1 - m`` with
    ``m = 2``, i.e. 2, 15 and 27 of 30. On targets under 8 blocks ``m``
    shrinks so the three stay distinct; a target under 3 blocks gives each
    of its blocks once.
    """
    margin = max(0, min(2, (num_layers - 2) // 3))
    return sorted({margin, num_layers // 2, num_layers - 1 - margin})


def _lm_head(model: nn.Module) -> Optional[nn.Module]:
    """``lm_head``, also inside a vision-language wrapper's ``language_model``."""
    head = getattr(model, "lm_head", None)
    if head is None:
        head = getattr(getattr(model, "language_model", None), "lm_head", None)
    return head


def output_layer(model: nn.Module) -> nn.Module:
    """The module mapping final features to logits (``lm_head`` or tied embedding)."""
    head = _lm_head(model)
    if head is not None:
        return head
    return feature_owner(model).embed_tokens


def feature_logits(model: nn.Module, h: mx.array) -> mx.array:
    """The target's output layer applied to features ``h`` ``(..., H) -> (..., V)``.

    Exactly what the model's forward does after its final norm for the
    supported architectures (no soft-capping or logit scaling).
    """
    head = _lm_head(model)
    if head is not None:
        return head(h)
    return feature_owner(model).embed_tokens.as_linear(h)


def embed(model: nn.Module, tokens: mx.array) -> mx.array:
    """The target's own (frozen) token embedding: ``(...,) -> (..., H)``."""
    return feature_owner(model).embed_tokens(tokens)


def pipeline_stage(model: nn.Module) -> Optional[range]:
    """The blocks this process runs when ``model`` is in mlx-lm's pipeline
    stages (``PipelineMixin``, on ``model.model``), else ``None``: any model
    may ask, whatever its layout."""
    inner = getattr(model, "model", None)
    if getattr(inner, "pipeline_size", 1) <= 1:
        return None
    return range(inner.start_idx, inner.end_idx)


class _Tap:
    """Records the output of the wrapped module; everything else delegates."""

    def __init__(self, module, record: List[mx.array]):
        self.module = module
        self.record = record

    def __call__(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        self.record.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self.module, name)


class FeatureCapture:
    """Records chosen hidden states of ``model`` during the forwards it wraps.

    Args:
        model: An mlx-lm model (see :func:`feature_owner`).
        layers: Feature layers, in the order their states are concatenated
          (see the module docstring). Default: ``(FINAL,)``.
    """

    def __init__(self, model: nn.Module, layers: Sequence[int] = (FINAL,)):
        self.model = model
        self.layers = check_feature_layers(model, layers)
        self._records: List[List[mx.array]] = [[] for _ in self.layers]
        # Pipeline stages: the blocks held here; the final state, which every
        # stage computes, gives the shape of the blocks held elsewhere.
        blocks = [i for i in self.layers if i != FINAL]
        self._stage = pipeline_stage(model) if blocks else None
        self._final = dict(zip(self.layers, self._records)).get(FINAL, [])

    @contextmanager
    def capturing(self) -> Iterator["FeatureCapture"]:
        """Tap the model while the forwards inside the block build their graphs."""
        owner = feature_owner(self.model)
        norm, blocks = owner.norm, owner.layers
        taps = dict(zip(self.layers, self._records))
        try:
            if FINAL in taps or self._stage is not None:
                owner.norm = _Tap(norm, self._final)
            if any(i != FINAL for i in taps):
                owner.layers = [
                    _Tap(block, taps[i]) if i in taps and block is not None else block
                    for i, block in enumerate(blocks)
                ]
            yield self
        finally:
            owner.norm = norm
            owner.layers = blocks

    def take(self, batched: bool = False) -> Optional[mx.array]:
        """The features recorded since the last call, or ``None`` if none were.

        Returns:
            ``(T, F)``: every position of the captured forwards, in order (a
            batch of one); with ``batched``, ``(B, T, F)``. ``F`` is the sum
            of the layers' widths.
        """
        if self._stage is not None:
            return self._take_shared(batched)
        if not self._records[0]:
            return None
        return self._fuse(self._records, batched)

    def _take_shared(self, batched: bool) -> Optional[mx.array]:
        """:meth:`take` on pipeline stages: this stage's blocks, zeros for the
        others' (and for the final state but on stage 0), summed over stages."""
        final = list(self._final)
        if not final:
            return None
        rank = feature_owner(self.model).pipeline_rank
        records = [
            (
                record
                if i in self._stage or (i == FINAL and rank == 0)
                else [mx.zeros_like(f) for f in final]
            )
            for i, record in zip(self.layers, self._records)
        ]
        features = self._fuse(records, batched)
        self._final.clear()
        # After the forwards' own all_gather, on every stage: one order of collectives.
        return mx.distributed.all_sum(mx.depends(features, final))

    def _fuse(self, records: List[List[mx.array]], batched: bool) -> mx.array:
        """The records' rows concatenated: positions in order, layers side by
        side; clears the records."""
        parts = []
        for record in records:
            rows = record if batched else [r.reshape(-1, r.shape[-1]) for r in record]
            parts.append(rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=-2))
        for record in self._records:
            record.clear()
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)


@contextmanager
def maybe_capturing(capture: Optional[FeatureCapture]):
    """``capture.capturing()``, or nothing when no drafter wants features."""
    if capture is None:
        yield None
    else:
        with capture.capturing() as c:
            yield c
