"""A trained drafter held in memory as its target is held.

Drafters are saved in float16. Next to a quantized target (an mlx-lm 4-bit
model, or the default target as macOS builds it, which keeps the GGUF's
4-/8-bit values), a float16 draft of SmolLM2-135M would read a quarter of
the target's bytes per step instead of a tenth, and the cost model that
chooses the draft length would price it so. So a drafter takes the dtype of
its target's hidden states, and its linear layers take the bits and group
size of the target's blocks. Quantizing changes what a drafter proposes,
never which tokens are accepted.
"""

from typing import Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from ..features import embed, feature_owner, output_layer

# (group_size, bits, mode) of a quantized layer.
Quantization = Tuple[int, int, str]


def _embedded(target: nn.Module) -> mx.array:
    """One token through the target's input embedding: ``(1, 1, H)``."""
    return embed(target, mx.array([[0]]))


def activation_dtype(target: nn.Module) -> mx.Dtype:
    """The dtype of the target's hidden states (its input embedding's output)."""
    return _embedded(target).dtype


def hidden_width(target: nn.Module) -> int:
    """The width of the target's hidden states (a quantized table packs its rows)."""
    return int(_embedded(target).shape[-1])


def quantization_of(layer: nn.Module) -> Optional[Quantization]:
    """``(group_size, bits, mode)`` of a quantized layer, ``None`` for a float one."""
    if getattr(layer, "scales", None) is None:
        return None
    return layer.group_size, layer.bits, getattr(layer, "mode", "affine")


def block_quantization(target: nn.Module) -> Optional[Quantization]:
    """How the linear layers of the target's first held block are quantized, if
    they are (a pipeline stage lists the blocks of other stages as ``None``)."""
    block = next(b for b in feature_owner(target).layers if b is not None)
    for _, module in block.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            return quantization_of(module)
    return None


def output_quantization(target: nn.Module) -> Optional[Quantization]:
    """How the target's output layer (or tied embedding) is quantized, if it is."""
    return quantization_of(output_layer(target))


def quantize_linears(module: nn.Module, quantization: Optional[Quantization]):
    """Quantize ``module``'s linear layers in place (no-op for ``None``).

    Layers whose input width the group size does not divide stay float.
    """
    if quantization is None:
        return
    group_size, bits, mode = quantization
    nn.quantize(
        module,
        group_size,
        bits,
        mode=mode,
        class_predicate=lambda _, m: isinstance(m, nn.Linear)
        and m.weight.shape[-1] % group_size == 0,
    )


def matmul_rows(x: mx.array, layer: nn.Module, quantization: Optional[Quantization]):
    """``x @ W.T`` for rows ``W`` held as ``layer.weight`` (with ``scales`` and
    ``biases`` when ``quantization`` is given)."""
    if quantization is None:
        return x @ layer.weight.T
    group_size, bits, mode = quantization
    return mx.quantized_matmul(
        x,
        layer.weight,
        layer.scales,
        layer.get("biases"),
        transpose=True,
        group_size=group_size,
        bits=bits,
        mode=mode,
    )


def quantize_like_target(module: nn.Module, target: nn.Module):
    """Quantize like the target: blocks' layers as its blocks, output rows and
    a head's own embedding as the target's."""
    quantize_linears(module, block_quantization(target))
    table = quantization_of(feature_owner(target).embed_tokens)
    if "embed_tokens" in module and table is not None:
        group, bits, mode = table
        if module.embed_tokens.weight.shape[-1] % group == 0:
            module.embed_tokens = nn.QuantizedEmbedding.from_embedding(
                module.embed_tokens, group, bits, mode=mode
            )
    if "lm_head" in module and isinstance(module.lm_head, nn.Linear):
        out = output_quantization(target)
        if out is not None and module.lm_head.weight.shape[-1] % out[0] == 0:
            module.lm_head = nn.QuantizedLinear.from_linear(
                module.lm_head, out[0], out[1], mode=out[2]
            )
