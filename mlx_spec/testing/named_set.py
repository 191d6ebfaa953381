"""The named test checkpoint set, built once into a cache folder.

The folder is named by a hash of this package's sources, so a change to
the factory builds a fresh set beside the old one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from .checkpoints import DEFAULT_NEAR_NOISE, make_checkpoint
from .checks import PROMPTS, min_top2_gap
from .configs import (
    ALL_ARCHITECTURES,
    ARCHITECTURES,
    MTP_ARCHITECTURES,
    ROLLBACK_ARCHITECTURES,
    ROLLBACK_LAYERS,
)
from .mtp import make_mtp_checkpoint

# Bump when the checkpoints change in a way the source hash would not catch.
FACTORY_VERSION = 1
# Targets of the named set are re-seeded until min_top2_gap >= this.
GAP_FLOOR = 2.5e-3
_STAMP = "mlx_spec_testing.json"


def _prompt_ids(tokenizer_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]


def _make_target(
    out_dir: Path, arch: str, *, seed: int, tries: int = 20, make=None, **kwargs
) -> Path:
    """``make`` (:func:`make_checkpoint`), re-seeded until its greedy gaps clear GAP_FLOOR."""
    from mlx_lm.utils import load_model

    make = make or make_checkpoint
    for attempt in range(tries):
        make(out_dir, arch, seed=seed + 1000 * attempt, **kwargs)
        model, _ = load_model(out_dir, strict=arch != "deepseek_v3")
        if min_top2_gap(model, None, _prompt_ids(out_dir)) >= GAP_FLOOR:
            return out_dir
    raise RuntimeError(
        f"no {arch} seed in {tries} tries has greedy gaps >= {GAP_FLOOR}"
    )


# The set's other members: (name, maker, arch, base member, options), made in
# this order; a maker of _make_target re-seeds until greedy has no near-ties.
_SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
_OTHERS = (
    ("llama-unrelated", make_checkpoint, "qwen3", None, dict(seed=7001, **_SMALL)),
    # Same weights as "qwen2" plus zero rows: its logits over real tokens match.
    ("qwen2-padded", make_checkpoint, "qwen2", "qwen2", dict(padded_vocab=128)),
    (
        "qwen2-padded-near",
        make_checkpoint,
        "qwen2",
        "qwen2",
        dict(noise=DEFAULT_NEAR_NOISE, padded_vocab=64, seed=200),
    ),
    # SmolLM2-135M's head shape (3 query heads per key/value head, 3 in all):
    # 2 tensor-parallel processes cannot split its heads, only its MLP.
    (
        "llama-3heads",
        _make_target,
        "llama",
        None,
        dict(seed=7003, hidden_size=48, num_heads=3, num_kv_heads=1),
    ),
    (
        "llama-3heads-near",
        make_checkpoint,
        "llama",
        "llama-3heads",
        dict(noise=DEFAULT_NEAR_NOISE, seed=7004),
    ),
    (
        "llama-othertok",
        make_checkpoint,
        "llama",
        None,
        dict(seed=7002, tokenizer="other", **_SMALL),
    ),
)


def _build_set(root: Path) -> dict[str, Path]:
    """Write the named checkpoint set into ``root`` (no caching)."""
    paths: dict[str, Path] = {}
    # Plain targets are seeded 0.., the rollback families' 20..; drafts 100 on.
    families = (
        (ARCHITECTURES, 0, {}),
        (ROLLBACK_ARCHITECTURES, 20, {"num_layers": ROLLBACK_LAYERS}),
    )
    for archs, first_seed, shape in families:
        for i, arch in enumerate(archs):
            seed = first_seed + i
            paths[arch] = _make_target(root / arch, arch, seed=seed, **shape)
            paths[f"{arch}-near"] = make_checkpoint(
                root / f"{arch}-near",
                arch,
                base=paths[arch],
                noise=DEFAULT_NEAR_NOISE,
                seed=100 + seed,
            )
    for i, arch in enumerate(MTP_ARCHITECTURES):
        paths[f"{arch}-mtp"] = _make_target(
            root / f"{arch}-mtp", arch, seed=40 + i, make=make_mtp_checkpoint
        )
    for name, make, arch, base, options in _OTHERS:
        based = {"base": paths[base]} if base else {}
        paths[name] = make(root / name, arch, **based, **options)
    return paths


# Names and their intended roles, for documentation and tests.
CHECKPOINT_NAMES = (
    *ALL_ARCHITECTURES,
    *(f"{a}-near" for a in ALL_ARCHITECTURES),
    *(f"{a}-mtp" for a in MTP_ARCHITECTURES),
    *(name for name, *_ in _OTHERS),
)


def version_hash() -> str:
    """Hash of everything that determines the checkpoint files (this package's sources)."""
    import tokenizers

    h = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.read_bytes())
    h.update(
        f"{FACTORY_VERSION}|{sys.version_info[:2]}|{tokenizers.__version__}".encode()
    )
    return h.hexdigest()[:16]


def default_root() -> Path:
    """``$MLX_SPEC_TEST_CKPT_DIR`` or ``~/.cache/mlx_spec/test-checkpoints``,
    plus the :func:`version_hash` subdirectory."""
    parent = os.environ.get("MLX_SPEC_TEST_CKPT_DIR") or (
        Path.home() / ".cache" / "mlx_spec" / "test-checkpoints"
    )
    return Path(parent) / version_hash()


def _is_current(root: Path, version: str) -> bool:
    try:
        stamp = json.loads((root / _STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp.get("version") == version


def test_checkpoints(root: str | Path | None = None) -> dict[str, Path]:
    """Build (once) and return the named test checkpoint set.

    Names: every arch in :data:`ALL_ARCHITECTURES` (targets), ``"<arch>-near"``
    (target + small noise, ~0.5-0.9 greedy acceptance), ``"<arch>-mtp"`` for
    :data:`MTP_ARCHITECTURES` (original layout with MTP weights), ``"llama-unrelated"``
    (a small qwen3, low acceptance), ``"llama-3heads"`` (3 attention heads and 1
    key/value head, which 2 processes cannot split) and its ``"-near"`` draft,
    ``"qwen2-padded"`` (``"qwen2"`` with 128 zero vocab rows),
    ``"qwen2-padded-near"`` (near ``"qwen2"``, 64 zero rows) and
    ``"llama-othertok"`` (a different tokenizer, for mismatch errors).

    The set is built into a temporary sibling directory and renamed into
    place, so concurrent builders are safe; a stale set (older factory
    version) is replaced.

    Args:
        root: Directory to hold the checkpoint directories. Default:
            :func:`default_root`.

    Returns:
        A dict from name to checkpoint directory.
    """
    root = Path(root) if root is not None else default_root()
    version = version_hash()
    if not _is_current(root, version):
        if root.is_dir() and any(root.iterdir()) and not (root / _STAMP).exists():
            raise FileExistsError(f"{root} is not empty and holds no test checkpoints")
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            _build_set(tmp)
            stamp = json.dumps({"version": version})
            (tmp / _STAMP).write_text(stamp, encoding="utf-8")
            _swap_in(tmp, root, version)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {name: root / name for name in CHECKPOINT_NAMES}


test_checkpoints.__test__ = False


def _swap_in(tmp: Path, root: Path, version: str) -> None:
    """Rename the fresh set ``tmp`` to ``root``, moving a stale set aside."""
    if root.exists() and not _is_current(root, version):
        trash = Path(tempfile.mkdtemp(prefix=f".{root.name}-old-", dir=root.parent))
        try:
            os.replace(root, trash / "old")
        except OSError:
            pass  # another builder moved it first
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, root)
    except OSError:
        if not _is_current(root, version):  # a concurrent builder won otherwise
            raise  # not a pytest test despite its name


def main(argv: Sequence[str] | None = None) -> None:
    """Write the named checkpoint set: ``python -m mlx_spec.testing OUT_DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.testing",
        description="Write tiny random mlx-lm checkpoints for tests and demos.",
    )
    parser.add_argument("out_dir", type=Path, help="Directory to write into.")
    args = parser.parse_args(argv)
    for name, path in test_checkpoints(args.out_dir).items():
        print(f"{name:20s} {path}")
