"""Write EAGLE-3 heads in speculators' format, and make random ones for tests.

:func:`save_speculators_eagle3` writes a folder that vLLM's speculators
(``Eagle3DraftModel.from_pretrained``) and :func:`~.load_published` read:
``config.json`` with ``speculators_model_type: eagle3`` and the layer in
``transformer_layer_config``, and ``model.safetensors`` under speculators'
weight names, ``d2t``/``t2d`` for a draft vocabulary.

:func:`export_eagle3` writes a head that ``mlx_spec train-draft --kind
eagle3`` trained (the ``mlx_spec export`` command): its weights as stored,
the target's embedding table (speculators keeps one in the head), its
draft vocabulary as ``d2t``/``t2d``, and its target blocks as speculators'
layer ids (the input of layer ``i`` is block ``i - 1``'s output).

Our ``train-draft --kind eagle`` heads are not EAGLE-3 heads: they norm
and fuse ``[embedding, feature]`` with a biased ``fc`` into the residual
stream of a standard layer, read the target's final normed state, and
score through the target's output layer with no norm of their own. EAGLE-3
feeds the two normed halves straight to the attention projections, keeps
the raw feature as the residual, and has its own final norm and output
layer. No weight mapping turns one into the other exactly, so only
EAGLE-3 heads (``--kind eagle3``, imported, or built here) are written in
this format.
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .eagle3 import Eagle3Head, eagle3_args_for
from .layers import LayerShape

WEIGHTS_FILE = "model.safetensors"


def layer_config(shape: LayerShape) -> Dict:
    """The HF config dict of a head's decoder layer (transformers 5 style)."""
    config = {
        "model_type": shape.model_type,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": shape.num_layers,
        "vocab_size": shape.vocab_size,
        "rms_norm_eps": shape.rms_norm_eps,
        "attention_bias": shape.attention_bias,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings or 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shape.rope_theta,
            **(shape.rope_scaling or {}),
        },
        "tie_word_embeddings": False,
    }
    return config


def speculators_eagle3_config(args: SimpleNamespace, verifier: Optional[str]) -> Dict:
    """speculators' ``config.json`` for an :class:`Eagle3Head` of ``args``."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": args.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(args.layer_ids),
        "target_hidden_size": args.target_hidden_size,
        "norm_before_residual": args.norm_before_residual,
        "norm_before_fc": args.norm_before_fc,
        "fc_norm": args.fc_norm,
        "norm_output": args.norm_output,
        "embed_requires_grad": False,
        "transformer_layer_config": layer_config(args.shape),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
    }


def save_speculators_eagle3(
    path,
    module: Eagle3Head,
    *,
    ids: Optional[mx.array] = None,
    embedding: Optional[mx.array] = None,
    verifier: Optional[str] = None,
    dtype=mx.float32,
    embedding_dtype=None,
):
    """Write ``module`` as a speculators EAGLE-3 folder.

    Args:
        path: The folder (created if needed).
        module: The head (float weights).
        ids: ``(C,)`` target id of each draft column, or ``None`` for the target's vocabulary.
        embedding: ``(V, H)`` token embedding to store (speculators keeps the
          head's own); the module's when ``None``.
        verifier: The target's name, recorded for vLLM users.
        dtype: Storage dtype. Default: float32.
        embedding_dtype: Storage dtype of the embedding. Default: ``dtype``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    args = module.args
    weights = {
        k: v.astype(dtype)
        for k, v in tree_flatten(module.parameters())
        if k != "embed_tokens.weight"
    }
    table = embedding if embedding is not None else module.get("embed_tokens")
    if isinstance(table, nn.Embedding):
        table = table.weight
    if table is not None:
        weights["embed_tokens.weight"] = table.astype(embedding_dtype or dtype)
    if ids is not None:
        columns = mx.arange(ids.shape[0])
        weights["d2t"] = (ids.astype(mx.int64) - columns).astype(mx.int64)
        t2d = mx.zeros((args.shape.vocab_size,), mx.bool_)
        t2d[ids] = True
        weights["t2d"] = t2d
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights)
    config = speculators_eagle3_config(args, verifier)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def eagle3_head_config(path) -> dict:
    """The config of the ``--kind eagle3`` head directory ``path``, read before
    the target loads.

    Raises:
        ValueError: One line: no head there, or a head of another architecture.
    """
    from ..heads import head_architecture, read_head_config

    config = read_head_config(path)
    if config is None:
        raise ValueError(
            f"'{path}' holds no head written by mlx_spec train-draft (no config.json "
            "with mlx_spec_head)."
        )
    architecture = head_architecture(config)
    if architecture != "eagle3":
        raise ValueError(
            f"the {architecture} head in '{path}' is not EAGLE-3-shaped, so it has no "
            "speculators form; train one with mlx_spec train-draft --kind eagle3."
        )
    return config


def export_eagle3(path, target: nn.Module, out, *, verifier: Optional[str] = None):
    """Write the ``--kind eagle3`` head directory ``path`` as a speculators folder ``out``.

    Weights keep their stored dtype and the embedding the target's, so the
    exported head loads (:func:`~.load_published`) to the same weights as the
    head itself, and drafts the same tokens.

    Args:
        path: A head directory written by ``mlx_spec train-draft --kind eagle3``.
        target: The target it was trained for (checked; its embedding is stored).
        out: The folder to write.
        verifier: The target's name recorded for vLLM users (a hub id).

    Raises:
        ValueError: One line: no head, a head of another architecture, or
          another target.
    """
    from ...features import embed
    from ...fingerprint import fingerprint_mismatch
    from ..heads import WEIGHTS_FILE as HEAD_WEIGHTS
    from ..heads import args_of_record

    config = eagle3_head_config(path)
    reason = fingerprint_mismatch(config.get("target", {}), target)
    if reason is not None:
        raise ValueError(
            f"the eagle3 head in '{path}' was trained for another target ({reason}); "
            "pass its own target as --model."
        )
    weights = mx.load(str(Path(path) / HEAD_WEIGHTS))
    ids = weights.pop("draft_vocab", None)
    module = Eagle3Head(args_of_record("eagle3", config["head"]))
    module.load_weights(list(weights.items()))
    dtype = next(iter(weights.values())).dtype
    table = embed(target, mx.arange(module.args.shape.vocab_size))
    save_speculators_eagle3(
        out,
        module,
        ids=ids,
        embedding=table,
        verifier=verifier,
        dtype=dtype,
        embedding_dtype=table.dtype,
    )
    return Path(out)


def random_eagle3(
    target: nn.Module,
    path,
    *,
    seed: int = 0,
    ids: Optional[List[int]] = None,
    **options,
):
    """Write a random EAGLE-3 head for ``target`` in speculators' format (tests).

    ``ids``: the target ids of a draft vocabulary (sorted), or ``None``.
    The stored embedding is the target's own, as speculators stores it.
    """
    from ...features import embed
    from ...models import output_size

    args = eagle3_args_for(
        target, draft_vocab_size=None if ids is None else len(ids), **options
    )
    mx.random.seed(seed)
    module = Eagle3Head(args)
    table = embed(target, mx.arange(output_size(target))).astype(mx.float32)
    save_speculators_eagle3(
        path, module, ids=None if ids is None else mx.array(ids), embedding=table
    )
    return path


def random_dflash(
    target: nn.Module,
    path,
    *,
    seed: int = 0,
    block_size: int = 4,
    ids: Optional[List[int]] = None,
    layer_ids: Optional[Sequence[int]] = None,
    num_layers: int = 1,
):
    """Write a random DFlash drafter for ``target`` in speculators' format (tests).

    It reads the target's own embedding and, without ``ids``, its output layer.
    The mask token is the target's last token id.
    """
    from .dflash import DFlashHead

    args = eagle3_args_for(
        target,
        layer_ids=layer_ids,
        model_type="qwen3",
        num_layers=num_layers,
        draft_vocab_size=None if ids is None else len(ids),
    )
    shape = args.shape
    args = SimpleNamespace(
        shape=shape,
        target_hidden_size=args.target_hidden_size,
        num_aux=args.num_aux,
        layer_ids=args.layer_ids,
        feature_layers=args.feature_layers,
        block_size=block_size,
        mask_token_id=shape.vocab_size - 1,
        draft_vocab_size=None if ids is None else len(ids),
        logit_scale=1.0,
        softcap=0.0,
        own_embedding=False,
    )
    mx.random.seed(seed)
    module = DFlashHead(args)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(module.parameters()))
    if ids is not None:
        weights["d2t"] = mx.array(ids, mx.int64) - mx.arange(len(ids))
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights)
    config = {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "draft_vocab_size": len(ids) if ids is not None else shape.vocab_size,
        "block_size": block_size,
        "aux_hidden_state_layer_ids": list(args.layer_ids),
        "mask_token_id": args.mask_token_id,
        "transformer_layer_config": layer_config(shape),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def random_eagle1(target: nn.Module, path, *, seed: int = 0, num_layers: int = 1):
    """Write a random original EAGLE-1/2 head for ``target`` in its authors'
    layout (a llama ``config.json``, bare weight names) (tests)."""
    from ...features import embed
    from ...models import output_size
    from .eagle1 import Eagle1Head

    args = eagle3_args_for(target, num_layers=num_layers)
    args = SimpleNamespace(
        shape=args.shape,
        fc_bias=True,
        qkv_bias=False,
        feature_layers=[-1],
        own_embedding=False,
    )
    mx.random.seed(seed)
    module = Eagle1Head(args)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(module.parameters()))
    weights["embed_tokens.weight"] = embed(target, mx.arange(output_size(target)))
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights)
    config = layer_config(args.shape)
    config.pop("rope_parameters")
    config["rope_theta"] = args.shape.rope_theta
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def unrolled_chain(head, hidden: mx.array, ids: mx.array, pos: int, steps: int):
    """Draft-vocabulary logits ``(steps, C)`` of the chain from pair ``pos``.

    The head reads pairs ``(hidden[t], ids[t])`` for ``t <= pos``, then is fed
    its own output and the tokens ``ids[pos+1..]`` (0 past the end): what
    speculators computes as its training-time-test steps.
    """
    from ..eagle import EagleContext

    context = EagleContext(head)
    out = context.feed(hidden[: pos + 1], ids[: pos + 1], None)
    context.fed = pos + 1
    g = out[:, -1:]
    rows = [head.vocab.small_logits(g.reshape(1, -1))[0]]
    for k in range(1, steps):
        token = ids[pos + k] if pos + k < ids.shape[0] else mx.array(0)
        g = context.step(g, token.astype(mx.uint32), pos + k)
        rows.append(head.vocab.small_logits(g.reshape(1, -1))[0])
    return mx.stack(rows)
