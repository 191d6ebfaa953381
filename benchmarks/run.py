"""``python -m benchmarks.run`` in a source checkout: the harness in :mod:`mlx_spec.bench.run`."""

import sys

from mlx_spec_entry import run

if __name__ == "__main__":
    sys.exit(run("mlx_spec.bench.run:main"))
