"""A fingerprint of a model's weights, so a drafter can check its target.

A trained drafter (a head or a distilled draft) fits one target. The
fingerprint records the target's shape and a few statistics of its weights
(mean and root mean square of the embedding, the first and last blocks'
weights and the final norm, read as float values), so the same model is
recognised whether it was loaded in float32 or as quantized layers, and
another model of the same shape is not.

Both statistics of an array are compared on the scale of its weights (its
root mean square): a mean near zero moves by far more than
:data:`TOLERANCE` of itself when the same weights are stored as float16 or
as 4-/8-bit quantized layers with float16 scales (SmolLM2's GGUF: up to 1%),
but by less than 1e-5 of the weights' scale.
"""

from typing import Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn

# Tolerance of a weight statistic, relative to the root mean square of its array.
TOLERANCE = 1e-3
# Floor of that scale, for arrays of zeros.
MIN_SCALE = 1e-6


def _float_weight(module: nn.Module) -> Optional[mx.array]:
    """A module's weight as float32 values (dequantized if needed)."""
    weight = getattr(module, "weight", None)
    if weight is None:
        return None
    scales = getattr(module, "scales", None)
    if scales is not None:  # QuantizedLinear / QuantizedEmbedding
        weight = mx.dequantize(
            weight,
            scales,
            getattr(module, "biases", None),
            group_size=module.group_size,
            bits=module.bits,
            mode=getattr(module, "mode", "affine"),
        )
    return weight.astype(mx.float32)


def _leaf_weights(module: nn.Module) -> List[mx.array]:
    """Float weights of every module under ``module`` that owns one, in name order."""
    out = []
    for _, child in sorted(module.named_modules(), key=lambda item: item[0]):
        if isinstance(child.get("weight", None), mx.array):
            out.append(_float_weight(child))
    return out


def _stats(arrays: List[mx.array]) -> List[float]:
    """Mean and root mean square of each array, as Python floats."""
    values = []
    for a in arrays:
        values.append(mx.mean(a))
        values.append(mx.sqrt(mx.mean(a * a)))
    mx.eval(values)
    return [float(v.item()) for v in values]


def model_fingerprint(model: nn.Module, blocks: bool = True) -> Dict:
    """Shape and weight statistics of an mlx-lm model with ``model.model.layers``.

    Args:
        model: The model.
        blocks: Read the first and last blocks too; a sharded target, whose
          blocks are sliced across processes, reads the others only.
          Default: ``True``.

    Returns:
        A JSON-ready dict: ``model_type``, ``hidden_size``, ``vocab_size``,
        ``num_layers``, ``blocks`` and ``stats`` (mean and RMS of the weights
        read).
    """
    from .features import feature_owner, output_layer

    owner = feature_owner(model)
    embedding = _float_weight(owner.embed_tokens)
    parts = [embedding]
    if blocks:
        parts += _leaf_weights(owner.layers[0]) + _leaf_weights(owner.layers[-1])
    parts.append(_float_weight(owner.norm))
    head = output_layer(model)
    if head is not owner.embed_tokens:
        parts.append(_float_weight(head))
    kind = getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )
    return {
        "model_type": str(kind),
        "hidden_size": int(embedding.shape[1]),
        "vocab_size": int(embedding.shape[0]),
        "num_layers": len(owner.layers),
        "blocks": blocks,
        "stats": _stats(parts),
    }


def fingerprint_mismatch(expected: Dict, model: nn.Module) -> Optional[str]:
    """Why ``model`` is not the model ``expected`` describes, or ``None``.

    The reason is short (one clause), for a one-line error message.
    """
    from .distributed import sharded_group

    sharded = sharded_group() is not None
    actual = model_fingerprint(model, blocks=not sharded)
    # Pipeline stages hold some of the layers.
    keys = ("hidden_size", "vocab_size") + (() if sharded else ("num_layers",))
    for key in keys:
        if key in expected and expected[key] != actual[key]:
            return f"{key} {actual[key]} != {expected[key]}"
    stats = expected.get("stats")
    if stats is not None and not actual["blocks"]:
        # A sharded target holds slices of its blocks: compare the rest.
        head = len(actual["stats"]) - 2
        stats = stats[:2] + stats[len(stats) - head :]
    if stats is not None:
        if len(stats) != len(actual["stats"]):
            return "another architecture"
        for (mean, rms), (want_mean, want_rms) in zip(
            _arrays(actual["stats"]), _arrays(stats)
        ):
            scale = max(want_rms, MIN_SCALE)
            if max(abs(mean - want_mean), abs(rms - want_rms)) > TOLERANCE * scale:
                return "its weights differ"
    return None


def _arrays(stats: List[float]):
    """``(mean, rms)`` of each array, from the flat ``stats`` list."""
    return zip(stats[0::2], stats[1::2])
