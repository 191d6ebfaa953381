"""The console entry points of mlx-spec, light enough to catch an early Ctrl-C.

``import mlx_spec`` loads mlx and mlx-lm, which takes seconds, and a console
script imports its function before calling it. So each function here is a
stub that imports the real ``main`` inside :func:`guarded`: Ctrl-C at any
moment, during that import or after it, exits 130 (the shell's 128 + SIGINT)
with an empty line on stderr and no traceback. The start-up hook of mlx-lm's
commands (:mod:`mlx_spec_hook`) runs its ``main`` the same way, and exits
so on Ctrl-C while mlx-lm is imported, before that ``main`` runs. Each
``if __name__ == "__main__":`` block of the package calls its ``main`` through
:func:`guarded` or :func:`run` too, so ``python -m mlx_spec.X`` stops alike.

This module uses the standard library only, so importing it loads nothing else.
"""

import importlib
import os
import signal
import sys

INTERRUPTED = 130


def interrupted():
    """Exit as Ctrl-C does here: an empty line on stderr, code 130."""
    exit_interrupted("")


def quit_now(signum=None, frame=None):
    """A ``SIGINT`` handler for while modules import: exit 130 at once.

    An exception raised by a handler can land in an import lock's callback,
    where Python prints it as ignored and goes on.
    """
    print(file=sys.stderr, flush=True)
    os._exit(INTERRUPTED)


def exit_interrupted(line: str):
    """Exit 130 (the shell's 128 + SIGINT) with ``line`` on stderr."""
    print(line, file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED)


def guarded(function, *args, **kwargs):
    """``function(*args, **kwargs)``, where Ctrl-C exits 130 quietly."""
    try:
        return function(*args, **kwargs)
    except KeyboardInterrupt:
        interrupted()


def _call(entry: str):
    module, function = entry.split(":")
    previous = signal.signal(signal.SIGINT, quit_now)
    try:
        main = getattr(importlib.import_module(module), function)
    finally:
        signal.signal(signal.SIGINT, previous)
    return main()


def run(entry: str):
    """Import ``"module:function"`` and call it with no arguments, guarded."""
    return guarded(_call, entry)


def mlx_spec():
    return run("mlx_spec.cli:main")


def generate():
    return run("mlx_spec.cli.generate:main")


def server():
    return run("mlx_spec.serve.server:main")


def chat():
    return run("mlx_spec.cli.chat:main")


def bench():
    return run("mlx_spec.cli.bench:bench_main")


def doctor():
    return run("mlx_spec.cli.doctor:main")
