"""``config.json`` of each tiny test architecture (Hugging Face style).

The families and the fields that make a tiny model of each of them: the
plain decoders, and the recurrent and sliding-window families whose caches
need exact rollback.
"""

from __future__ import annotations

from .tokenizer import EOS_TOKEN, SPECIAL_TOKENS

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
# Families whose caches need exact rollback (mlx_spec.caches): linear attention,
# SSM and short-convolution layers (ArraysCache), sliding windows shorter than a
# test's generation (RotatingKVCache, window SLIDING_WINDOW).
ROLLBACK_ARCHITECTURES = (
    "qwen3_next",
    "qwen3_5",
    "nemotron_h",
    "mamba2",
    "lfm2",
    "falcon_h1",
    "gemma3",
    "gpt_oss",
)
ALL_ARCHITECTURES = ARCHITECTURES + ROLLBACK_ARCHITECTURES
# Families whose original checkpoints ship multi-token-prediction (MTP) layers:
# "<arch>-mtp" is such a checkpoint in its original Hugging Face layout (the
# layout mlx_lm.load sanitizes, MTP tensors included). deepseek_v3 is left out
# of the named set: mlx-lm drops only block 61 as its MTP layer, so a tiny
# one loads with strict=False only (see make_mtp_checkpoint).
MTP_ARCHITECTURES = ("qwen3_next", "qwen3_5", "glm4_moe")
SLIDING_WINDOW = 8
# Blocks of the rollback families' test targets: recurrent (or sliding), attention
# (or global), recurrent (or sliding); nemotron_h adds an MLP block.
ROLLBACK_LAYERS = 3
_ARCHITECTURE_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "nemotron_h": "NemotronHForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gpt_oss": "GptOssForCausalLM",
}


def model_config(
    arch: str,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
) -> dict:
    """An HF-style ``config.json`` dict for ``arch``."""
    if arch not in ALL_ARCHITECTURES:
        raise ValueError(f"arch must be one of {ALL_ARCHITECTURES}, got {arch!r}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads "
            f"({num_heads}), and num_heads by num_kv_heads ({num_kv_heads})"
        )
    eos_ids = [SPECIAL_TOKENS.index(EOS_TOKEN), SPECIAL_TOKENS.index("<|im_end|>")]
    config = {
        "architectures": [_ARCHITECTURE_CLASS[arch]],
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "intermediate_size": 2 * hidden_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "hidden_act": "gelu_pytorch_tanh" if arch == "gemma" else "silu",
        "tie_word_embeddings": arch == "gemma",
        "bos_token_id": None,
        "pad_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }
    if arch == "mistral":
        config["sliding_window"] = None
    if arch == "phi3":
        del config["head_dim"]  # phi3 derives it from hidden_size
    if arch in ROLLBACK_ARCHITECTURES:
        config.update(_rollback_config(arch, config, num_layers))
    return config


def _rollback_config(arch: str, base: dict, num_layers: int) -> dict:
    """Fields of the recurrent and sliding-window families (tiny, float32).

    Layer patterns put a recurrent (or sliding) layer first and an attention
    (or global) layer among the first few, so ``num_layers`` >= 2 has both.
    """
    hidden, heads = base["hidden_size"], base["num_attention_heads"]
    head_dim = hidden // heads
    kinds = [("linear" if i % 2 == 0 else "full") for i in range(num_layers)]
    if arch == "qwen3_next":
        return dict(
            linear_num_value_heads=heads,
            linear_num_key_heads=heads // 2,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=hidden,
            moe_intermediate_size=hidden // 2,
            mlp_only_layers=[],
            partial_rotary_factor=0.5,
            full_attention_interval=2,
        )
    if arch == "qwen3_5":
        text = {k: v for k, v in base.items() if k not in ("architectures",)}
        text.update(
            model_type="qwen3_5_text",
            linear_num_value_heads=heads,
            linear_num_key_heads=heads // 2,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=4,
            full_attention_interval=2,
            rope_parameters={
                "type": "default",
                "mrope_section": [2, 1, 1],
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
        )
        return dict(text_config=text)
    if arch in ("nemotron_h", "mamba2", "falcon_h1"):
        ssm = dict(
            conv_kernel=4,
            n_groups=1,
            use_bias=False,
            use_conv_bias=True,
            layer_norm_epsilon=1e-5,
        )
        if arch == "mamba2":
            return dict(
                ssm,
                num_heads=heads,
                head_dim=2 * head_dim,  # transformers checks expand (2) * hidden
                expand=2,
                state_size=16,
                time_step_limit=(0.0, float("inf")),
                time_step_rank="auto",
            )
        if arch == "nemotron_h":
            pattern = ["M" if k == "linear" else "*" for k in kinds] + ["-"]
            return dict(
                ssm,
                attention_bias=False,
                mamba_num_heads=heads,
                mamba_head_dim=head_dim,
                mamba_proj_bias=False,
                ssm_state_size=16,
                mlp_bias=False,
                hybrid_override_pattern=pattern,
                num_hidden_layers=len(pattern),
            )
        return dict(  # falcon_h1: every layer has a Mamba2 mixer and attention
            mamba_d_conv=4,
            mamba_d_head=head_dim,
            mamba_d_ssm=hidden,
            mamba_d_state=16,
            mamba_n_heads=heads,
            mamba_n_groups=1,
            mamba_chunk_size=16,
        )
    if arch == "lfm2":
        return dict(
            norm_eps=1e-5,
            conv_bias=False,
            conv_L_cache=3,
            block_dim=hidden,
            block_multiple_of=16,
            block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=False,
            block_ff_dim=2 * hidden,
            layer_types=["conv" if k == "linear" else "full_attention" for k in kinds],
        )
    if arch == "gemma3":
        text = {k: v for k, v in base.items() if k not in ("architectures",)}
        text.update(
            model_type="gemma3_text",
            sliding_window=SLIDING_WINDOW,
            sliding_window_pattern=2,
            query_pre_attn_scalar=head_dim,
        )
        return dict(text_config=text)
    # gpt_oss: alternating sliding-window and full attention, a tiny MoE.
    return dict(
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=SLIDING_WINDOW,
        layer_types=[
            "sliding_attention" if k == "linear" else "full_attention" for k in kinds
        ],
    )
