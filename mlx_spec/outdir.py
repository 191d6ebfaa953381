"""Output folders that never lose what a user owns.

Every command that writes a folder (``convert``, ``train-draft``) checks its
``--out`` with :func:`check_out_dir` before any work: a non-empty folder that
the command did not write itself is refused unless ``--force`` is given.
:func:`staged_dir` writes a new folder beside its destination and renames it
into place at the end, so an interrupted run leaves no half-written folder;
:func:`staged_file` does the same for one file.
"""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

PathLike = Union[str, os.PathLike]
# Temporary siblings start with this, so a listing shows what they are.
PARTIAL_PREFIX = ".partial-"


class OutDirError(ValueError):
    """An output folder that cannot be written without losing files."""


def check_out_dir(
    out: PathLike,
    *,
    force: bool = False,
    flag: str = "--out",
    ours: Optional[Callable[[Path], bool]] = None,
) -> Path:
    """Refuse an output folder whose files would be lost.

    Args:
        out: The folder to write.
        force: Replace a non-empty folder all the same. Default: ``False``.
        flag: The option's name, for the message. Default: ``"--out"``.
        ours: ``ours(folder)`` is true for a folder this command wrote
          earlier (updated or resumed in place, so it is not refused).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        OutDirError: ``out`` is a file, or a non-empty folder (one line).
    """
    out = Path(check_named(out, flag))
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{flag} {out} is a file; pass a directory.")
    if out.is_dir() and not force and any(out.iterdir()):
        if ours is None or not ours(out):
            raise OutDirError(
                f"{flag} {out} is a folder that already holds files; choose a new "
                "or empty folder, or pass --force to replace it."
            )
    return out


def check_named(path: PathLike, flag: str) -> PathLike:
    """Refuse an empty path (``Path("")`` is the working folder).

    Returns:
        ``path`` itself.

    Raises:
        OutDirError: ``--out is empty; name a folder.``
    """
    if not str(path).strip():
        raise OutDirError(f"{flag} is empty; name a folder.")
    return path


def check_out_file(path: PathLike, flag: str) -> Path:
    """Refuse an output file path that cannot be written: a folder, or one in
    a folder that does not exist (checked before the work, not after it).

    Returns:
        ``path`` as a ``Path``, ``~`` expanded.

    Raises:
        OutDirError: One line naming the flag and the path.
    """
    file = Path(path).expanduser()
    if file.is_dir():
        raise OutDirError(f"{flag} {path} is a folder; pass a file path.")
    if not file.parent.is_dir():
        raise OutDirError(f"{flag} {path}: the folder {file.parent} does not exist.")
    return file


def check_outside(out: PathLike, folder: PathLike, *, flag: str, what: str) -> None:
    """Refuse an output folder equal to, or inside, ``folder`` (or empty).

    Raises:
        OutDirError: One line naming both folders.
    """
    out_path, inner = Path(check_named(out, flag)).resolve(), Path(folder).resolve()
    if out_path == inner or inner in out_path.parents:
        raise OutDirError(
            f"{flag} {out} is inside {what} {folder}; writing there would change "
            f"{what}: choose a folder outside it."
        )


def replace_dir(new: Path, old: Path) -> None:
    """Put folder ``new`` at ``old``, replacing what was there (renames only)."""
    if not old.exists():
        os.replace(new, old)
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{old.name}.old-", dir=old.parent))
    os.replace(old, trash / old.name)
    os.replace(new, old)
    shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def staged_dir(out: PathLike) -> Iterator[Path]:
    """Write a folder beside ``out`` and rename it to ``out`` at the end.

    Yields a path that does not exist yet, in a private sibling of ``out``
    (``.partial-NAME-*``); the caller creates and fills it. When the block
    ends without error it replaces ``out``; otherwise it is deleted. A
    killed run leaves only the hidden sibling, never a half-written ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(
        tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{out.name}-", dir=out.parent)
    )
    work = holder / out.name
    try:
        yield work
        if work.is_dir():
            replace_dir(work, out)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


@contextmanager
def staged_file(path: PathLike) -> Iterator[Path]:
    """Write a file beside ``path`` and rename it to ``path`` at the end.

    Yields a hidden sibling with the same suffix (``.partial-NAME``); when the
    block ends without error it replaces ``path``, otherwise it is deleted. An
    interrupted write leaves ``path`` as it was, never half-written.
    """
    path = Path(path)
    work = path.with_name(f"{PARTIAL_PREFIX}{path.name}")
    try:
        yield work
        os.replace(work, path)
    finally:
        work.unlink(missing_ok=True)
