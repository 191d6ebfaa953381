"""``python -m mlx_spec.testing OUT_DIR``: write the named checkpoint set."""

from mlx_spec_entry import run

if __name__ == "__main__":
    run("mlx_spec.testing.named_set:main")
