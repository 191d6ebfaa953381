"""``python -m mlx_spec.bench ...``: the same as ``mlx_spec bench ...``."""

import sys

from mlx_spec_entry import bench

if __name__ == "__main__":
    sys.exit(bench())
