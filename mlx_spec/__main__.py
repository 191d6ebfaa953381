"""``python -m mlx_spec SUBCOMMAND ...`` (see :mod:`mlx_spec.cli`)."""

import sys

from mlx_spec_entry import mlx_spec

if __name__ == "__main__":
    sys.exit(mlx_spec())
