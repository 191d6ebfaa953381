"""``python -m mlx_spec.generate``: the command of :mod:`mlx_spec.cli.generate`.

Importing this submodule rebinds the package attribute ``mlx_spec.generate``
to it; the module is made callable so ``mlx_spec.generate(...)`` keeps
working as the function.
"""

import sys
import types

from mlx_spec_entry import guarded

from .cli.generate import main, setup_arg_parser  # noqa: F401
from .generation import (  # noqa: F401
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPT,
    SpecResponse,
    SpecStream,
    generate,
    stream_generate,
)


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    guarded(main)
