"""Make mlx use OpenBLAS on Linux CPUs.

The ``mlx[cpu]`` wheel links a reference BLAS that is 10-40x slower than
OpenBLAS. Loading ``libopenblas.so.0`` with ``RTLD_GLOBAL`` before
``mlx.core`` is first imported makes mlx resolve its BLAS symbols there.
Nothing here runs on macOS, where mlx uses Accelerate and Metal.
"""

import ctypes
import ctypes.util
import os
import sys
import warnings

OPENBLAS_NAMES = ("libopenblas.so.0", "libopenblas.so")
_state = {"loaded": None, "warned": False}


def _find_openblas():
    for name in OPENBLAS_NAMES:
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL), name
        except OSError:
            continue
    found = ctypes.util.find_library("openblas")
    if found:
        try:
            return ctypes.CDLL(found, mode=ctypes.RTLD_GLOBAL), found
        except OSError:
            pass
    return None, None


def preload_in_environment() -> bool:
    """True when OpenBLAS was put in front of mlx by ``LD_PRELOAD``."""
    return "openblas" in os.environ.get("LD_PRELOAD", "")


def ensure_fast_blas() -> str | None:
    """Load OpenBLAS globally before mlx is imported (Linux only).

    Returns:
        The library name that was loaded, or ``None`` when nothing was done
        (not Linux, already loaded, or OpenBLAS is not installed).
    """
    if not sys.platform.startswith("linux") or os.environ.get("MLX_SPEC_NO_OPENBLAS"):
        return None
    if _state["loaded"] is not None:
        return _state["loaded"]
    if "mlx.core" in sys.modules and not preload_in_environment():
        if not _state["warned"]:
            _state["warned"] = True
            warnings.warn(
                "mlx was imported before mlx_spec could load OpenBLAS, so matmuls use "
                "the slow reference BLAS. Import mlx_spec first, or run with "
                "LD_PRELOAD=libopenblas.so.0.",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    _lib, name = _find_openblas()
    if name is None and not _state["warned"]:
        _state["warned"] = True
        warnings.warn(
            "OpenBLAS was not found, so mlx uses its slow reference BLAS. "
            "Install it with: apt-get install libopenblas0-pthread",
            RuntimeWarning,
            stacklevel=2,
        )
    _state["loaded"] = name
    return name


def blas_in_use() -> str:
    """Name the BLAS that this process's mlx resolves its matmuls to.

    mlx uses OpenBLAS only if the system library was loaded globally before
    ``mlx.core`` (by :func:`ensure_fast_blas` or ``LD_PRELOAD``); numpy's
    private ``scipy_openblas`` copy does not count.
    """
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return "unknown"
    system_openblas = any(
        "libopenblas" in lib and "scipy_openblas" not in lib for lib in libs
    )
    if system_openblas and (_state["loaded"] is not None or preload_in_environment()):
        return "OpenBLAS"
    return (
        "reference BLAS (slow: install libopenblas0-pthread and import mlx_spec first)"
    )
