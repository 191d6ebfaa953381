"""The set-up script (``make setup``) stops in one line where it cannot go on."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run_setup(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    """``scripts/setup.sh`` in an empty project copy (no ``.venv``) with ``PYTHON``."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    env = {**os.environ, "PYTHON": python}
    script = str(tmp_path / "scripts" / "setup.sh")
    return subprocess.run(["bash", script], env=env, capture_output=True, text=True)


def test_a_python_older_than_3_10_is_named_in_one_line(tmp_path):
    """As macOS's own python3 (3.9) would be."""
    fake = tmp_path / "python3"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.9.6" && exit 0\nexit 1\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = _run_setup(tmp_path / "project", str(fake))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "needs Python 3.10 or newer" in lines[0]
    assert "Python 3.9.6" in lines[0] and "PYTHON=" in lines[0]
    assert not (tmp_path / "project" / ".venv").exists()


def test_a_missing_python_is_named_in_one_line(tmp_path):
    result = _run_setup(tmp_path, str(tmp_path / "no-such-python"))
    assert result.returncode == 1
    assert result.stdout.strip().splitlines() == [
        f"setup: no {tmp_path / 'no-such-python'} found; install Python 3.10 or "
        "newer, or name one with PYTHON=..."
    ]
