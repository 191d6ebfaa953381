"""``python -m mlx_spec.testing OUT_DIR``: write the named checkpoint set."""

from .named_set import main

if __name__ == "__main__":
    main()
