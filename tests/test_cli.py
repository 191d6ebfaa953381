"""The mlx_spec command family: dispatch, --help and doctor."""

import ast
import importlib
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import List

import pytest

from mlx_spec import cli
from mlx_spec.cli import bench as cli_bench

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
SPECULATIVE_FLAGS = (
    "--speculative",
    "--num-draft-tokens",
    "--tree-budget",
    "--tree-top-k",
    "--tree-depth",
    "--tree-choices",
    "--ngram-min",
    "--ngram-max",
)


SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_console_scripts_point_at_existing_functions():
    scripts = SCRIPTS
    assert set(scripts) >= {
        "mlx_spec",
        "mlx_spec.generate",
        "mlx_spec.server",
        "mlx_spec.chat",
        "mlx_spec.bench",
        "mlx_spec.doctor",
    }
    for target in scripts.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_umbrella_help_lists_subcommands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("generate", "server", "chat", "bench", "doctor"):
        assert name in out


def test_unknown_subcommand_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["frobnicate"])
    assert exit_info.value.code not in (0, None)


@pytest.mark.parametrize("name", ["generate", "server", "chat"])
def test_subcommand_help_lists_speculative_options_with_defaults(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"mlx_spec {name}" in out or f"mlx_spec.{name}" in out
    for flag in SPECULATIVE_FLAGS:
        assert flag in out, (name, flag)
    assert "default: 4" in out  # --num-draft-tokens


@pytest.mark.parametrize("name", ["generate", "server", "chat", "doctor"])
def test_dispatch_reaches_the_subcommand_main(name, monkeypatch):
    calls = []
    fake = types.ModuleType(f"fake_{name}")
    fake.main = lambda argv=None: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(cli.SUBCOMMANDS, name, f"{fake.__name__}:main")
    assert cli.main([name, "--x", "1"]) == 0
    assert calls == [["--x", "1"]]
    assert cli.SUBCOMMANDS is not None


def test_bench_dispatches_to_benchmarks_run(monkeypatch):
    calls = []
    fake = types.ModuleType("fake_benchmarks_run")
    fake.main = lambda argv=None, prog=None: calls.append(argv)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(cli_bench, "BENCH_ENTRY", f"{fake.__name__}:main")
    cli.main(["bench", "--quick"])
    assert calls == [["--quick"]]
    assert cli.SUBCOMMANDS["bench"] == "mlx_spec.cli.bench:bench_main"


def test_bench_without_harness_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(cli_bench, "BENCH_ENTRY", "no_such_benchmarks_module:main")
    with pytest.raises(SystemExit) as exit_info:
        cli_bench.bench_main([])
    assert "not available" in str(exit_info.value.code)


def test_generate_subcommand_end_to_end(pair_flags, capsys):
    cli.main(
        [
            "generate",
            *pair_flags,
            "--prompt",
            "def fibonacci(n):",
            "--max-tokens",
            "8",
            "--verbose",
            "True",
        ]
    )
    out = capsys.readouterr().out
    assert out.count("==========") == 2
    assert "Speculation: " in out


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("name", ["export", "doctor"])
def test_ctrl_c_in_a_subcommand_exits_130_without_a_traceback(
    capsys, monkeypatch, name
):
    import mlx_spec_entry

    monkeypatch.setattr(cli, "_load", lambda entry: _interrupt)
    monkeypatch.setattr(sys, "argv", ["mlx_spec", name])
    with pytest.raises(SystemExit) as e:
        mlx_spec_entry.mlx_spec()
    assert e.value.code == 130
    assert capsys.readouterr().err == "\n"


def _console_script(target: str) -> str:
    """The code pip writes into a console script for ``"module:function"``."""
    module, function = target.split(":")
    return f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n"


# Seconds after start: Python runs, mlx_spec and mlx-lm are being imported.
CTRL_C_DELAYS = (0.3, 0.8)


def assert_ctrl_c_while_starting_exits_130(argv):
    """Ctrl-C ``argv`` (run in the checkout) at each of :data:`CTRL_C_DELAYS`:
    each run still starting then exits 130 with at most one line, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLX_SPEC_DISABLE", None)  # the mlx_lm hook on
    interrupted = 0
    for delay in CTRL_C_DELAYS:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        time.sleep(delay)
        running = process.poll() is None  # still starting: the case under test
        if running:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        if running:
            interrupted += 1
            assert process.returncode == 130, (delay, process.returncode, err)
            assert "Traceback" not in err and len(err.splitlines()) <= 1, err
    assert interrupted, "every run ended before Ctrl-C"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_ctrl_c_while_a_console_script_starts_exits_130_without_a_traceback(name):
    code = _console_script(SCRIPTS[name])
    assert_ctrl_c_while_starting_exits_130([sys.executable, "-c", code, "--help"])


def _main_blocks(tree: ast.Module) -> List[ast.If]:
    """The module's top-level ``if __name__ == "__main__":`` blocks."""
    return [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and [type(op) for op in node.test.ops] == [ast.Eq]
        and isinstance(node.test.comparators[0], ast.Constant)
        and node.test.comparators[0].value == "__main__"
    ]


# Every module of the installed package that runs as ``python -m``
# (ui/ installs as mlx_spec.ui), and the checkout's documented harness.
MAIN_MODULES = sorted(
    str(path.relative_to(REPO))
    for path in (
        *(REPO / "mlx_spec").rglob("*.py"),
        *(REPO / "ui").rglob("*.py"),
        REPO / "benchmarks" / "run.py",
    )
    if re.search(r"__name__ *== *[\"']__main__[\"']", path.read_text())
)


@pytest.mark.parametrize("path", MAIN_MODULES)
def test_every_main_block_runs_under_the_ctrl_c_guard(path):
    """``python -m MODULE`` calls its main through :mod:`mlx_spec_entry`
    (``guarded``, ``run`` or an entry stub), as the console scripts do."""
    tree = ast.parse((REPO / path).read_text(), path)
    blocks = _main_blocks(tree)
    assert blocks, "a __main__ test this check does not read"
    entry = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "mlx_spec_entry"
        for alias in node.names
    }
    for block in blocks:
        for statement in block.body:
            if isinstance(statement, ast.ImportFrom):
                continue
            assert isinstance(statement, ast.Expr), ast.unparse(statement)
            call = statement.value
            if ast.unparse(getattr(call, "func", call)) == "sys.exit":
                call = call.args[0]
            assert isinstance(call, ast.Call), ast.unparse(statement)
            assert ast.unparse(call.func) in entry, ast.unparse(statement)


def test_main_modules_include_the_documented_commands():
    assert {
        "mlx_spec/__main__.py",
        "mlx_spec/cli/generate.py",
        "mlx_spec/serve/server.py",
        "mlx_spec/bench/run.py",
        "benchmarks/run.py",
    } <= set(MAIN_MODULES)


def test_ctrl_c_in_a_python_m_run_exits_130_without_a_traceback(tmp_path):
    """``python -m mlx_spec.testing OUT`` (its main builds checkpoints for a
    while) stopped by Ctrl-C once the build has started."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "mlx_spec.testing", str(tmp_path / "out")]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        # The build goes into a temporary sibling of OUT: main is running.
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob(".out-*")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, (process.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) <= 1, err


def test_ctrl_c_during_doctor_exits_130_without_a_traceback(capsys, monkeypatch):
    from mlx_spec.cli import doctor

    monkeypatch.setattr(doctor, "report", _interrupt)
    with pytest.raises(SystemExit) as e:
        doctor.main(["--size", "64", "--reps", "1"])
    assert e.value.code == 130
    assert capsys.readouterr().err == "\n"


def test_doctor_in_process(capsys):
    from mlx_spec.cli import doctor

    assert doctor.main(["--size", "64", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    for key in (
        "platform:",
        "mlx:",
        "device:",
        "BLAS:",
        "OpenBLAS preloaded:",
        "GFLOP/s",
    ):
        assert key in out


def _run_with_blas_warnings_as_errors(*args: str) -> subprocess.CompletedProcess:
    """``python -W error::RuntimeWarning ARGS`` in the checkout: the "mlx was
    imported before mlx_spec" warning fails it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("LD_PRELOAD", None)
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )


def test_python_m_mlx_spec_doctor_preloads_blas_first():
    result = _run_with_blas_warnings_as_errors(
        "-m", "mlx_spec", "doctor", "--size", "256", "--reps", "2"
    )
    assert result.returncode == 0, result.stderr
    assert "GFLOP/s" in result.stdout
    if sys.platform.startswith("linux"):
        assert "OpenBLAS preloaded: yes" in result.stdout


def test_bench_help_reaches_the_real_harness(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--prompt-sets" in capsys.readouterr().out  # a flag of the harness itself


def _fake_harness(monkeypatch):
    """A harness module with its own parser, as mlx_spec/bench/run.py has."""
    import argparse

    calls = []
    fake = types.ModuleType("fake_bench_harness")

    def setup_arg_parser():
        parser = argparse.ArgumentParser(prog="python -m mlx_spec.bench.run")
        parser.add_argument("--quick", action="store_true")
        parser.add_argument("--num-draft-tokens", type=int, default=4)
        parser.add_argument("--option", action="append", default=[])
        return parser

    fake.setup_arg_parser = setup_arg_parser
    fake.main = lambda argv=None, prog=None: calls.append(argv)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(cli_bench, "BENCH_ENTRY", f"{fake.__name__}:main")
    return calls


def test_bench_help_names_mlx_spec_bench_and_lists_method_options(monkeypatch, capsys):
    _fake_harness(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: mlx_spec bench ")
    assert "mlx_spec.bench.run" not in out
    for flag in SPECULATIVE_FLAGS[2:]:  # --speculative is the harness's --methods
        assert flag in out, flag


def test_bench_method_options_reach_the_harness_as_options(monkeypatch):
    calls = _fake_harness(monkeypatch)
    cli.main(
        ["bench", "--quick", "--tree-budget", "12", "--tree-choices", "[[0], [1]]"]
    )
    assert calls == [
        [
            "--quick",
            "--option",
            "tree_budget=12",
            "--option",
            'tree_choices="[[0], [1]]"',
        ]
    ]


def test_bench_bad_option_is_reported_under_mlx_spec_bench(monkeypatch, capsys):
    _fake_harness(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--tree-budget", "many"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "mlx_spec bench: error: argument --tree-budget: invalid int value: 'many' "
        "(see mlx_spec bench --help)"
    ]


BAD_FLAGS = [
    (
        ["generate", "--speculative", "bogus"],
        "mlx_spec.generate",
        "invalid choice: 'bogus'",
    ),
    (["chat", "--max-tokens", "many"], "mlx_spec.chat", "invalid int value: 'many'"),
    (
        ["server", "--speculative", "bogus"],
        "mlx_spec.server",
        "invalid choice: 'bogus'",
    ),
    (["doctor", "--size", "big"], "mlx_spec doctor", "invalid int value: 'big'"),
    (["doctor", "--size", "0"], "mlx_spec doctor", "--size=0 is out of range"),
    (["train-draft", "--kind", "x"], "mlx_spec train-draft", "invalid choice: 'x'"),
    (["convert", "nope"], "mlx_spec convert", "invalid choice: 'nope'"),
    (["convert", "gguf"], "mlx_spec convert gguf", "arguments are required"),
    (["frobnicate"], "mlx_spec", "unknown subcommand 'frobnicate'"),
]


@pytest.mark.parametrize(
    "argv, prog, message", BAD_FLAGS, ids=[b[0][0] + " " + b[2] for b in BAD_FLAGS]
)
def test_bad_flag_is_one_line_naming_it_with_exit_code_2(argv, prog, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: ") and message in err
    assert err.rstrip().endswith(f"(see {prog} --help)")


def test_one_line_errors_reach_subcommands_added_later(capsys):
    import argparse

    from mlx_spec.options import one_line_errors

    parser = one_line_errors(argparse.ArgumentParser(prog="tool"))
    sub = parser.add_subparsers(dest="command", required=True).add_parser("run")
    sub.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["run", "--n", "x"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "tool run: error: argument --n: invalid int value: 'x' (see tool run --help)\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["run", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: tool run [-h] [--n N]")


@pytest.mark.parametrize(
    "module",
    [
        "mlx_spec.bench.run",
        "mlx_spec.train.cli",
        "mlx_spec.train.corpus_cli",
        "ui.session",
    ],
)
def test_importing_any_entry_module_first_loads_openblas_before_mlx(module):
    code = (
        f"import {module}; from mlx_spec._blas import blas_in_use; print(blas_in_use())"
    )
    result = _run_with_blas_warnings_as_errors("-c", code)
    assert result.returncode == 0, result.stderr
    if sys.platform.startswith("linux"):
        assert result.stdout.strip() == "OpenBLAS"
