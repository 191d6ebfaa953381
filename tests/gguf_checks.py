"""GGUF test helpers: the test checkpoints' tensor names in GGUF, reference
checkpoints holding the values a GGUF file stores, and their logits."""

import json
import shutil
from pathlib import Path
from typing import Optional

import mlx.core as mx

PROMPT_IDS = [5, 77, 301, 12, 499, 3, 260, 41, 100, 7, 511, 64]
# Test checkpoint parameter -> GGUF name, written out independently of the
# converter's own table.
GGUF_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``."""
    module, suffix = name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, layer, rest = module.split(".", 3)
        return f"blk.{layer}.{GGUF_NAMES[rest]}.{suffix}"
    return f"{GGUF_NAMES[module]}.{suffix}"


def reference_checkpoint(
    source: Path, out: Path, weights: dict, config: Optional[dict] = None, **fields
) -> Path:
    """``source`` copied to ``out`` with ``weights`` and its config (``config``,
    else its own) updated with ``fields``."""
    shutil.copytree(source, out)
    config = dict(config or json.loads((out / "config.json").read_text()))
    config.update(fields)
    (out / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(
        str(out / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()}
    )
    return out


def logits(path: Path, prompt_ids=PROMPT_IDS) -> mx.array:
    """The float32 logits of the checkpoint at ``path`` over ``prompt_ids``."""
    import mlx_lm

    model, _ = mlx_lm.load(str(path))
    out = model(mx.array(prompt_ids)[None]).astype(mx.float32)
    mx.eval(out)
    return out


def tokenizer_metadata(checkpoint: Path) -> dict:
    """The GGUF tokenizer fields of a checkpoint's byte-level BPE tokenizer."""
    content = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab = dict(content["model"]["vocab"])
    special = {t["content"]: t["id"] for t in content["added_tokens"]}
    vocab.update(special)
    tokens = [None] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        tokens[index] = token
    merges = [
        m if isinstance(m, str) else " ".join(m) for m in content["model"]["merges"]
    ]
    types = [3 if t in special else 1 for t in tokens]
    return {"tokens": tokens, "merges": merges, "types": types}


def add_tokenizer(writer, checkpoint: Path, model: str = "gpt2", pre: str = "gpt2"):
    """The checkpoint's byte-level BPE tokenizer as GGUF metadata (BOS 1, EOS 2)."""
    meta = tokenizer_metadata(checkpoint)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(meta["tokens"])
    writer.add_token_types(meta["types"])
    writer.add_token_merges(meta["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_file(writer) -> None:
    """Write out a ``gguf.GGUFWriter``'s file: header, metadata, tensors."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
