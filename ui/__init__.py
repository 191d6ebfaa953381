"""The mlx-spec Gradio app: chat with a model and watch speculative decoding happen.

``mlx_spec ui`` (installed, where this folder is the package ``mlx_spec.ui``)
or ``python -m ui.app`` (in a checkout) starts it on http://127.0.0.1:7860 with
the default model (``mlx_spec.loading.default_model_pair``). Its modules import
one another relatively, so both names work. From the top down:

- ``__main__``: the entry point, which says how to install gradio if missing;
- ``app``: the command line (flags, access checks, start-up);
- ``layout``: the Gradio blocks and which handler each event calls;
- ``handlers``: the handlers (``App``), from page values to page updates;
- ``session``: models, per-browser conversations (chat template, prompt
  cache across turns) and generation on one MLX thread, drivable without a
  browser;
- ``render``: HTML of tokens, statistics and the round chart (pure functions).
"""

import os

from mlx_spec._blas import ensure_fast_blas

ensure_fast_blas()  # before any module of the package imports mlx
# Before any module of the package imports gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
