"""Shared pytest set-up: load OpenBLAS before mlx is imported anywhere, and
make the checkout the user data folder (its models/ holds the default pair)."""

import functools
import os
from pathlib import Path

import pytest

from mlx_spec._blas import ensure_fast_blas

ensure_fast_blas()  # before any test module imports mlx
os.environ["MLX_SPEC_HOME"] = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="session")
def checkpoints():
    """Name -> directory of the tiny test checkpoints (see mlx_spec.testing)."""
    from mlx_spec.testing import test_checkpoints

    return test_checkpoints()


@pytest.fixture(scope="session")
def load_model(checkpoints):
    """``load_model(name) -> (model, tokenizer)``, loaded once per session.

    Models are shared between tests: do not modify them in place.
    """
    import mlx_lm

    @functools.lru_cache(maxsize=None)
    def load(name):
        return mlx_lm.load(str(checkpoints[name]))

    return load


@pytest.fixture(scope="session")
def pair_flags(checkpoints):
    """``--model`` and ``--draft-model`` of the default test pair: llama and its near draft."""
    return [
        "--model",
        str(checkpoints["llama"]),
        "--draft-model",
        str(checkpoints["llama-near"]),
    ]
