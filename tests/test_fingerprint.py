"""A drafter's check of its target: the same weights in another storage pass, other weights fail."""

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx.utils import tree_flatten, tree_unflatten

from mlx_spec.fingerprint import fingerprint_mismatch, model_fingerprint


def _fresh(checkpoints, name="llama"):
    model, _ = mlx_lm.load(str(checkpoints[name]))
    return model


def _gguf_pair(checkpoints):
    """One model as SmolLM2's GGUF converts: float32 values, and 4-bit layers with float16 scales.

    The float32 copy computes ``scale * q + bias`` in float32, as the float32
    conversion does; the quantized model's fingerprint dequantizes in float16.
    """
    quantized, float32 = _fresh(checkpoints), _fresh(checkpoints)
    nn.quantize(quantized, group_size=32, bits=4)
    values = []
    for name, module in quantized.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            module.scales = module.scales.astype(mx.float16)
            module.biases = module.biases.astype(mx.float16)
            weight = mx.dequantize(
                module.weight,
                module.scales.astype(mx.float32),
                module.biases.astype(mx.float32),
                group_size=module.group_size,
                bits=module.bits,
            )
            values.append((f"{name}.weight", weight))
    float32.update(tree_unflatten(values))
    return float32, quantized


def test_a_quantized_target_matches_its_float32_conversion(checkpoints):
    """As SmolLM2's GGUF converts: float32 on Linux, the same 4-bit values on macOS.

    Dequantizing float16 scales rounds the values to float16, which moves a
    mean near zero by more than 1e-3 of itself; the check reads it on the
    scale of the weights.
    """
    float32, quantized = _gguf_pair(checkpoints)
    assert fingerprint_mismatch(model_fingerprint(float32), quantized) is None
    assert fingerprint_mismatch(model_fingerprint(quantized), float32) is None


def test_weights_moved_by_half_a_percent_are_another_target(checkpoints):
    model = _fresh(checkpoints)
    expected = model_fingerprint(model)
    name, weight = next(
        (k, v) for k, v in tree_flatten(model.parameters()) if "layers.0.mlp" in k
    )
    noise = 0.005 * mx.random.normal(weight.shape, key=mx.random.key(0))
    model.update(tree_unflatten([(name, weight * (1 + noise) + 0.005 * weight.std())]))
    assert fingerprint_mismatch(expected, model) == "its weights differ"
    assert fingerprint_mismatch(expected, _fresh(checkpoints)) is None
    assert fingerprint_mismatch(expected, _fresh(checkpoints, "llama-near")) is not None
