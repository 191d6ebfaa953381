"""Tiny random checkpoints of real mlx-lm architectures, for tests and demos.

Every checkpoint is a Hugging Face style directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``) that
plain ``mlx_lm.load(path)`` accepts. Weights are float32 and seeded, the
tokenizer is a byte-level BPE trained in about 0.2 s on Python's own standard
library sources, and the output head is scaled so that greedy decoding has no
near-ties (see :func:`min_top2_gap`).

One module a concern: :mod:`.tokenizer`, :mod:`.configs` (each family's
``config.json``), :mod:`.checkpoints` (weights, in-memory models,
quantization), :mod:`.mtp` (checkpoints with MTP layers), :mod:`.checks`
(greedy gaps and agreement) and :mod:`.named_set` (the cached set).

Typical use::

    from mlx_spec.testing import test_checkpoints
    paths = test_checkpoints()          # built once, cached on disk
    model, tokenizer = mlx_lm.load(str(paths["llama"]))
    draft, _ = mlx_lm.load(str(paths["llama-near"]))

or from a shell: ``python -m mlx_spec.testing OUT_DIR``.
"""

from .checkpoints import (
    DEFAULT_HEAD_SCALE,
    DEFAULT_HIDDEN_SIZE,
    DEFAULT_NEAR_NOISE,
    DEFAULT_NUM_HEADS,
    DEFAULT_NUM_KV_HEADS,
    DEFAULT_NUM_LAYERS,
    linear_quantizations,
    make_checkpoint,
    quantized_checkpoint,
    tiny_llama,
)
from .checks import PROMPTS, greedy_agreement, greedy_continuation, min_top2_gap
from .configs import (
    ALL_ARCHITECTURES,
    ARCHITECTURES,
    MTP_ARCHITECTURES,
    ROLLBACK_ARCHITECTURES,
    ROLLBACK_LAYERS,
    SLIDING_WINDOW,
)
from .mtp import make_mtp_checkpoint
from .named_set import (
    CHECKPOINT_NAMES,
    FACTORY_VERSION,
    GAP_FLOOR,
    default_root,
    test_checkpoints,
    version_hash,
)
from .tokenizer import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    TOKENIZER_VARIANTS,
    build_tokenizer,
)

__all__ = [
    "ALL_ARCHITECTURES",
    "ARCHITECTURES",
    "CHAT_TEMPLATE",
    "CHECKPOINT_NAMES",
    "DEFAULT_HEAD_SCALE",
    "DEFAULT_HIDDEN_SIZE",
    "DEFAULT_NEAR_NOISE",
    "DEFAULT_NUM_HEADS",
    "DEFAULT_NUM_KV_HEADS",
    "DEFAULT_NUM_LAYERS",
    "EOS_TOKEN",
    "FACTORY_VERSION",
    "GAP_FLOOR",
    "MTP_ARCHITECTURES",
    "PROMPTS",
    "ROLLBACK_ARCHITECTURES",
    "ROLLBACK_LAYERS",
    "SLIDING_WINDOW",
    "SPECIAL_TOKENS",
    "TOKENIZER_VARIANTS",
    "build_tokenizer",
    "default_root",
    "greedy_agreement",
    "greedy_continuation",
    "linear_quantizations",
    "make_checkpoint",
    "make_mtp_checkpoint",
    "min_top2_gap",
    "quantized_checkpoint",
    "test_checkpoints",
    "tiny_llama",
    "version_hash",
]
