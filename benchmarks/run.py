"""``python -m benchmarks.run`` in a source checkout: the harness in :mod:`mlx_spec.bench.run`."""

import sys

from mlx_spec.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
