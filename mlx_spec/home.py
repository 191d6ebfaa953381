"""Where mlx-spec keeps its models and downloads.

- :func:`home_dir`: the user data folder, ``$MLX_SPEC_HOME``, else
  ``~/.cache/mlx_spec`` (``$XDG_CACHE_HOME/mlx_spec`` when that is set).
  Its ``models/`` holds the default target, built there on first use, and
  any model or drafter the user puts there. A source checkout is such a
  folder too: its ``Makefile`` sets ``MLX_SPEC_HOME`` to the checkout.
- :func:`shipped_dir`: the drafters that travel in the wheel (package data,
  copied from the checkout's ``models/`` when the wheel is built).
- :func:`cache_dir`: downloads (``$MLX_SPEC_CACHE``, else the same default).

Nothing is looked up in the current folder or beside the installed modules
other than the shipped drafters.
"""

import os
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Iterator, List, Optional

try:
    import fcntl
except ImportError:  # not POSIX: builds are not serialized
    fcntl = None

HOME_ENV = "MLX_SPEC_HOME"
CACHE_ENV = "MLX_SPEC_CACHE"
MODELS = "models"
# The default target's folder name: built in models_dir() on first use.
DEFAULT_TARGET_NAME = "smollm2-135m-instruct"
# The package-data folder of the shipped drafters (setup.py fills it).
SHIPPED = "shipped"
# The drafters that ship in the wheel, by folder name under the checkout's models/.
SHIPPED_MODELS = ("smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-medusa")


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "mlx_spec"


def home_dir() -> Path:
    """``$MLX_SPEC_HOME``, else ``~/.cache/mlx_spec``."""
    given = os.environ.get(HOME_ENV)
    return Path(given).expanduser().resolve() if given else _user_cache()


def cache_dir() -> Path:
    """``$MLX_SPEC_CACHE``, else ``~/.cache/mlx_spec``: downloaded wheels."""
    given = os.environ.get(CACHE_ENV)
    return Path(given).expanduser() if given else _user_cache()


def models_dir() -> Path:
    """``models/`` in :func:`home_dir`: the default target and the user's models."""
    return home_dir() / MODELS


def shipped_dir() -> Path:
    """The shipped drafters inside the installed package (absent in a checkout)."""
    return Path(str(files(__package__) / SHIPPED))


def model_roots() -> List[Path]:
    """Where a model is looked up by folder name, first match wins."""
    return [models_dir(), shipped_dir()]


def find_model(name: str) -> Optional[Path]:
    """The folder ``name`` in :func:`model_roots` that holds a ``config.json``."""
    for root in model_roots():
        if (root / name / "config.json").is_file():
            return root / name
    return None


def model_folders() -> List[Path]:
    """Every model folder in :func:`model_roots`, one per name, sorted by name."""
    found = {}
    for root in model_roots():
        for config in sorted(root.glob("*/config.json")):
            found.setdefault(config.parent.name, config.parent)
    return [found[name] for name in sorted(found)]


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``folder`` while building it, so processes
    started together (a server and a UI) build it once, one after the other."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
