"""The ``mlx_spec`` command family: ``mlx_spec generate|server|chat|ui|bench|doctor|...``.

Like the ``mlx_lm`` umbrella, the first argument picks a subcommand whose
``main()`` then parses the rest. Each subcommand is also its own console
script (``mlx_spec.generate``, ``mlx_spec.server``, ...). The flags they
share live in :mod:`mlx_spec.options`, which the server uses too. The
console scripts are the light stubs of :mod:`mlx_spec_entry`, where Ctrl-C
exits 130 quietly.
"""

import importlib
import sys
from typing import List, Optional

from mlx_spec_entry import guarded

# Subcommand -> "module:function", imported only when chosen.
SUBCOMMANDS = {
    "generate": "mlx_spec.cli.generate:main",
    "server": "mlx_spec.serve.server:main",
    "chat": "mlx_spec.cli.chat:main",
    "ui": "mlx_spec.ui.__main__:main",
    "bench": "mlx_spec.cli.bench:bench_main",
    "doctor": "mlx_spec.cli.doctor:main",
    "convert": "mlx_spec.convert.__main__:main",
    "train-draft": "mlx_spec.train.cli:main",
    "corpus": "mlx_spec.train.corpus_cli:main",
    "export": "mlx_spec.cli.export:main",
}


def _load(entry: str):
    module, function = entry.split(":")
    return getattr(importlib.import_module(module), function)


def _usage() -> str:
    lines = ["usage: mlx_spec {" + ",".join(SUBCOMMANDS) + "} ...", ""]
    lines.append("Exact speculative decoding for MLX / mlx-lm. Subcommands:")
    described = {
        "generate": "generate text (a superset of mlx_lm.generate)",
        "server": "OpenAI-compatible HTTP server (a superset of mlx_lm.server)",
        "chat": "interactive terminal chat (like mlx_lm.chat)",
        "ui": "the chat in the browser, each token coloured by where it came from",
        "bench": "benchmarks of the speculative methods",
        "doctor": "check the platform, the mlx device and the BLAS in use",
        "convert": "GGUF or Hugging Face (MTP kept) -> mlx-lm; the default SmolLM2",
        "train-draft": "train a drafter (draft model or head) for a target, with MLX",
        "corpus": "grow or describe a distillation corpus of the target's completions",
        "export": "write a trained eagle3 head in speculators' EAGLE-3 format",
    }
    width = max(map(len, SUBCOMMANDS)) + 2
    for name in SUBCOMMANDS:
        lines.append(f"  {name:{width}s}{described[name]}")
    lines.append("")
    lines.append(
        "Pass --help to a subcommand for its options, e.g. mlx_spec generate --help"
    )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None):
    """Dispatch ``mlx_spec SUBCOMMAND [ARGS...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from .. import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        choices = ", ".join(SUBCOMMANDS)
        print(
            f"mlx_spec: error: unknown subcommand '{name}'; choose from: {choices} "
            "(see mlx_spec --help)",
            file=sys.stderr,
        )
        sys.exit(2)
    # Subcommands parse sys.argv; make it look like their own console script.
    sys.argv = [f"mlx_spec {name}", *rest]
    result = _load(SUBCOMMANDS[name])(rest)
    # Console scripts exit with main()'s value: only pass on exit codes.
    return result if isinstance(result, int) else None


if __name__ == "__main__":
    sys.exit(guarded(main))
