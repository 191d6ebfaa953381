"""``python -m mlx_spec.train ...``: the same as ``mlx_spec train-draft ...``."""

import sys

from mlx_spec_entry import run

if __name__ == "__main__":
    sys.exit(run("mlx_spec.train.cli:main"))
