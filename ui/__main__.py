"""The app's command: ``mlx_spec ui`` or ``python -m mlx_spec.ui`` installed,
``python -m ui`` (or ``python -m ui.app``, ``make ui``) in a checkout.

Gradio is the optional ``ui`` extra: without it the command says in one
line how to install it.
"""

import sys
from typing import List, Optional

from mlx_spec_entry import guarded

INSTALL_HINT = "the UI needs gradio; install it with: pip install 'mlx-spec[ui]'"


def command_name() -> str:
    """``mlx_spec ui`` from the umbrella command, else ``python -m PACKAGE``."""
    if sys.argv and sys.argv[0] == "mlx_spec ui":
        return "mlx_spec ui"
    return f"python -m {__package__}"


def main(argv: Optional[List[str]] = None):
    prog = command_name()
    try:
        from .app import main as app_main
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "gradio":
            raise
        sys.exit(f"{prog}: error: {INSTALL_HINT}")
    return app_main(argv, prog=prog)


if __name__ == "__main__":
    guarded(main)
