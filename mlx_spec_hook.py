"""Start-up hook: ``mlx_lm.generate|server|chat --speculative METHOD`` run mlx-spec.

mlx-lm has no plugin entry point, so mlx-spec installs ``mlx_spec_hook.pth``
next to this module in site-packages. Python runs its one line at start-up
in every process; the line only checks whether the command line names
``mlx_lm`` and, if so, imports this module and calls :func:`install`.
:func:`install` looks for an mlx-lm command (console script, ``mlx_lm``
umbrella, ``python -m mlx_lm ...``) that asks for speculation (``--speculative``,
``--draft-model``) or for help. Only then does it load OpenBLAS (before mlx
is imported, as ``import mlx_spec`` does) and put a one-shot import hook on
``sys.meta_path`` that wraps the command module's ``main``; the wrapped
``main`` hands the command to :mod:`mlx_spec.cli.hook`. From then on, Ctrl-C
exits 130 without a traceback (:mod:`mlx_spec_entry`). Any other process
is left alone, and so is an mlx-lm command without those flags.

``MLX_SPEC_DISABLE=1`` turns the hook off. If the hook fails (for example
with an mlx-lm version it does not know), it prints one warning line and
mlx-lm runs unchanged. This module uses the standard library only.
"""

import os
import signal
import sys

DISABLE_ENV = "MLX_SPEC_DISABLE"
COMMANDS = ("generate", "server", "chat")
# Flags that hand a command to mlx-spec (argparse also takes unique prefixes).
TRIGGER_FLAGS = ("--speculative", "--draft-model", "--help")
WARNING = "mlx-spec: warning: the mlx_lm hook is off ({}); mlx_lm runs unchanged"

# What the line of mlx_spec_hook.pth runs once the command line names mlx_lm.
# site may read a .pth file twice: a failed import is remembered as None.
_BOOT = """\
if "mlx_spec_hook" not in sys.modules:
    try:
        import mlx_spec_hook
    except Exception as e:
        sys.modules["mlx_spec_hook"] = None
        print(f"mlx-spec: warning: the mlx_lm hook is off ({type(e).__name__}: {e}); "
              "mlx_lm runs unchanged", file=sys.stderr)
    else:
        mlx_spec_hook.install()
"""
PTH_NAME = "mlx_spec_hook.pth"
# site runs this line in every process: a string test, unless it names mlx_lm.
PTH_LINE = (
    "import sys; 'mlx_lm' in str(getattr(sys, 'orig_argv', sys.argv)) "
    f"and exec({_BOOT!r})\n"
)


def warn(error: BaseException):
    """Print the one warning line of a failed hook to stderr."""
    reason = f"{type(error).__name__}: {error}".replace("\n", " ")
    print(WARNING.format(reason), file=sys.stderr, flush=True)


def disabled(environ=os.environ) -> bool:
    """True when ``MLX_SPEC_DISABLE`` is set to anything but ``""`` or ``"0"``."""
    return environ.get(DISABLE_ENV, "") not in ("", "0")


def _console_name(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".exe", "-script.py"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def find_command(argv, orig_argv):
    """The mlx-lm command this process runs, from its command line.

    Args:
        argv: ``sys.argv`` as seen at start-up (``["-m", ...]`` for ``-m``).
        orig_argv: ``sys.orig_argv`` (the interpreter's own command line).

    Returns:
        ``(command, args, direct)``: ``command`` in :data:`COMMANDS`, the
        command's arguments, and whether it runs as ``python -m
        mlx_lm.<command>`` (mlx-lm's deprecated form); ``None`` for any
        other program.
    """
    if not argv:
        return None
    if argv[0] == "-m":
        if not orig_argv or len(orig_argv) < len(argv):
            return None
        module = orig_argv[len(orig_argv) - len(argv)]
        module = module[2:] if module.startswith("-m") else module
    else:
        module = _console_name(argv[0])
    args = list(argv[1:])
    if module == "mlx_lm":
        if args and args[0] in COMMANDS:
            return args[0], args[1:], False
        return None
    package, _, command = module.partition(".")
    if package == "mlx_lm" and command in COMMANDS:
        return command, args, argv[0] == "-m"
    return None


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def wants_hook(args) -> bool:
    """True when ``args`` ask for speculation or help (a cheap pre-check).

    The command's own parser decides for sure later; an argument that only
    looks like a trigger then still runs plain mlx-lm.
    """
    for arg in args:
        if arg == "--":
            break
        if arg == "-h":
            return True
        name = _flag_name(arg)
        if len(name) > 2 and any(flag.startswith(name) for flag in TRIGGER_FLAGS):
            return True
    return False


def preload_blas():
    """Load ``mlx_spec/_blas.py`` on its own and run it before mlx is imported.

    ``mlx_spec`` itself imports mlx-lm, so it cannot be imported this early;
    its BLAS module is stand-alone and registered under its own name, so the
    package finds it (and its state) when it is imported later.
    """
    if "mlx_spec._blas" in sys.modules or "mlx.core" in sys.modules:
        return
    import importlib.util

    package = importlib.util.find_spec("mlx_spec")
    if package is None or not package.submodule_search_locations:
        return
    path = os.path.join(list(package.submodule_search_locations)[0], "_blas.py")
    spec = importlib.util.spec_from_file_location("mlx_spec._blas", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mlx_spec._blas"] = module
    try:
        spec.loader.exec_module(module)
        module.ensure_fast_blas()
    except BaseException:
        sys.modules.pop("mlx_spec._blas", None)
        raise


def _interrupted(signum, frame):
    from mlx_spec_entry import quit_now

    quit_now()


def _prepare(command: str):
    from mlx_spec.cli.hook import prepare

    return prepare(command)


def hooked_main(module, command: str):
    """``module.main`` (mlx-lm's) routed through :mod:`mlx_spec.cli.hook`.

    Once called, the wrapper puts mlx-lm's ``main`` back on the module, so
    code that calls it again (``mlx_spec.server`` reads mlx-lm's parser that
    way) gets mlx-lm's own.
    """
    original = module.main

    def main(*args, **kwargs):
        module.main = original
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            from mlx_spec_entry import guarded  # Ctrl-C: exit 130 quietly

            run = guarded(_prepare, command)
        except Exception as error:  # any failure: plain mlx-lm, one warning
            warn(error)
            return original(*args, **kwargs)
        return guarded(run, original, *args, **kwargs)

    main.__wrapped__ = original
    main.__doc__ = original.__doc__
    main.__name__ = getattr(original, "__name__", "main")
    return main


class CommandFinder:
    """A one-shot ``sys.meta_path`` finder that wraps ``mlx_lm.<command>.main``.

    It finds the module through the other finders and wraps its loader's
    ``exec_module`` (on that loader object only); after the module ran, its
    ``main`` is replaced by :func:`hooked_main` and the finder removes itself.
    For ``python -m mlx_lm.<command>``, the code ``runpy`` runs as
    ``__main__`` calls the module's (wrapped) ``main``.
    """

    def __init__(self, command: str, direct: bool = False):
        self.command = command
        self.module = f"mlx_lm.{command}"
        self.direct = direct
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module or self._busy:
            return None
        import importlib.util

        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        try:
            self._wrap(spec.loader)
        except Exception as error:
            warn(error)
            self.remove()
        return spec

    def _wrap(self, loader):
        exec_module = loader.exec_module

        def exec_and_hook(module):
            self.remove()
            # The loader reads the module's real code through get_code.
            stub = loader.__dict__.pop("get_code", None)
            try:
                exec_module(module)
            finally:
                if stub is not None:
                    loader.get_code = stub
            try:
                module.main = hooked_main(module, self.command)
            except Exception as error:
                warn(error)

        loader.exec_module = exec_and_hook
        if self.direct:
            # runpy runs get_code()'s code as __main__: call the wrapped main.
            source = (
                f"import importlib\nimportlib.import_module({self.module!r}).main()\n"
            )
            loader.get_code = lambda name: compile(source, self.module, "exec")

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install(argv=None, orig_argv=None):
    """Hook this process's mlx-lm command if it asks for speculation or help.

    Called from ``mlx_spec_hook.pth`` at start-up. Never raises: a failure
    prints one warning line and leaves mlx-lm as it is.

    Returns:
        The installed :class:`CommandFinder`, or ``None``.
    """
    try:
        for finder in sys.meta_path:  # site may read a .pth file twice
            if isinstance(finder, CommandFinder):
                return finder
        if disabled():
            return None
        argv = sys.argv if argv is None else argv
        orig_argv = getattr(sys, "orig_argv", None) if orig_argv is None else orig_argv
        found = find_command(argv, orig_argv)
        if found is None:
            return None
        command, args, direct = found
        if not wants_hook(args):
            return None
        preload_blas()
        finder = CommandFinder(command, direct)
        sys.meta_path.insert(0, finder)
        # Until the hooked main runs (mlx-lm is imported first), Ctrl-C exits 130.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted)
        return finder
    except Exception as error:
        warn(error)
        return None
