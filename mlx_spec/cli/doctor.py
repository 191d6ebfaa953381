"""``mlx_spec doctor``: is this machine set up for fast speculative decoding?

Prints the platform, the mlx version and device, the BLAS mlx resolves its
matmuls to, whether OpenBLAS was preloaded, and a measured float32 matmul
throughput.
"""

from .._blas import ensure_fast_blas

ensure_fast_blas()

import argparse
import platform
import sys
import time
from typing import List, Optional

import mlx.core as mx

from mlx_spec_entry import guarded

from .. import __version__
from .._blas import _state as _blas_state
from .._blas import blas_in_use, preload_in_environment
from ..options import one_line_errors

DEFAULT_SIZE = 1024
DEFAULT_REPS = 5
MAX_SIZE = 8192  # two float32 matrices of 256 MB each
MAX_REPS = 1000
# Below this a Linux CPU is almost surely on the reference BLAS.
SLOW_GFLOPS = 8.0


def measure_matmul_gflops(size: int = DEFAULT_SIZE, reps: int = DEFAULT_REPS) -> float:
    """GFLOP/s of a float32 ``(size, size) @ (size, size)`` matmul.

    Inputs are evaluated before the timer starts and every product is
    evaluated before it stops; one warm-up product is not timed.
    """
    a = mx.random.normal((size, size), dtype=mx.float32)
    b = mx.random.normal((size, size), dtype=mx.float32)
    mx.eval(a, b)
    mx.eval(a @ b)
    tic = time.perf_counter()
    for _ in range(reps):
        mx.eval(a @ b)
    elapsed = time.perf_counter() - tic
    return 2.0 * size**3 * reps / elapsed / 1e9


def openblas_preloaded() -> str:
    """How OpenBLAS got in front of mlx, or ``"no"``."""
    if preload_in_environment():
        return "yes (LD_PRELOAD)"
    if _blas_state["loaded"]:
        return f"yes ({_blas_state['loaded']}, loaded by mlx_spec)"
    return "no"


def report(size: int = DEFAULT_SIZE, reps: int = DEFAULT_REPS) -> List[str]:
    """The doctor's lines (measures the matmul once)."""
    import mlx_lm

    device = mx.default_device()
    try:
        info = mx.device_info()
        device_name = info.get("device_name") or info.get("architecture") or ""
    except Exception:  # older mlx
        device_name = ""
    blas = blas_in_use()
    gflops = measure_matmul_gflops(size, reps)
    slow = sys.platform.startswith("linux") and gflops < SLOW_GFLOPS
    if slow and not blas.startswith("reference"):
        blas += " (but the measured speed is that of the reference BLAS)"
    lines = [
        f"mlx_spec:   {__version__}",
        f"platform:   {platform.platform()} ({platform.machine()}), Python {platform.python_version()}",
        f"mlx:        {mx.__version__} (mlx-lm {mlx_lm.__version__})",
        f"device:     {device}" + (f" - {device_name}" if device_name else ""),
        f"BLAS:       {blas}",
        f"OpenBLAS preloaded: {openblas_preloaded()}",
        f"matmul:     {gflops:.1f} GFLOP/s (float32 {size}x{size}, {reps} reps)",
    ]
    if sys.platform.startswith("linux") and (
        blas.startswith("reference") or gflops < SLOW_GFLOPS
    ):
        lines.append(
            "hint:       mlx is using the slow reference BLAS, so speculation cannot win. "
            "Install OpenBLAS (apt-get install libopenblas0-pthread) and import mlx_spec "
            "before mlx, or run with LD_PRELOAD=libopenblas.so.0."
        )
    if device.type == mx.DeviceType.cpu and sys.platform.startswith("linux"):
        lines.append(
            "note:       on a Linux CPU use float32 models; float16/bfloat16/4-bit matmuls "
            "are several times slower here."
        )
    return lines


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlx_spec doctor",
        description="Check the platform, the mlx device and the BLAS in use.",
    )
    one_line_errors(parser)
    parser.add_argument(
        "--size",
        type=int,
        default=DEFAULT_SIZE,
        help=f"Matrix size of the timed matmul (default: {DEFAULT_SIZE}).",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=DEFAULT_REPS,
        help=f"Timed repetitions (default: {DEFAULT_REPS}).",
    )
    return parser


def main(argv: Optional[List[str]] = None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.size <= MAX_SIZE:
        parser.error(f"--size={args.size} is out of range: 1 to {MAX_SIZE}.")
    if not 1 <= args.reps <= MAX_REPS:
        parser.error(f"--reps={args.reps} is out of range: 1 to {MAX_REPS}.")
    try:
        lines = report(args.size, args.reps)
    except KeyboardInterrupt:
        parser.exit(130, "\n")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    guarded(main)
