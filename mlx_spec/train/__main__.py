"""``python -m mlx_spec.train ...``: the same as ``mlx_spec train-draft ...``."""

import sys

from mlx_spec.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
