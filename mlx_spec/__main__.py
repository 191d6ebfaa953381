"""``python -m mlx_spec SUBCOMMAND ...`` (see :mod:`mlx_spec.cli`)."""

import sys

from mlx_spec.cli import main

if __name__ == "__main__":
    sys.exit(main())
