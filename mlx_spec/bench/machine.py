"""Machine, versions and model sizes, recorded with every benchmark."""

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx_lm

from mlx_spec import __version__ as mlx_spec_version
from mlx_spec._blas import blas_in_use


def _git_commit() -> Optional[str]:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    """Platform, CPU count, versions, BLAS, device, git commit and date."""
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "mlx_spec": mlx_spec_version,
        "blas": blas_in_use(),
        "device": str(mx.default_device()),
        "git_commit": _git_commit(),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = list(os.getloadavg())
    return info


def param_count(model) -> int:
    """Number of parameters of ``model`` (quantized weights count packed)."""
    from mlx.utils import tree_flatten

    return int(sum(v.size for _, v in tree_flatten(model.parameters())))
