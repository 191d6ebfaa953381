"""``python -m mlx_spec.bench ...``: the same as ``mlx_spec bench ...``."""

import sys

from ..cli.bench import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
