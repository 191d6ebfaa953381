"""mlx-lm's own commands with ``--speculative``: the installed start-up hook.

Every test runs the real console scripts (``mlx_lm.generate``, ``mlx_lm``,
``python -m mlx_lm ...``, ``mlx_lm.server``, ``mlx_lm.chat``) of this
environment in subprocesses, on the tiny test checkpoints, and compares
with plain mlx-lm.
"""

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import mlx_spec_hook

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROMPT = "def fibonacci(n):"
CHAT_PROMPT = "The quick brown fox"
MAX_TOKENS = 24
GENERATE_ARGS = ["--prompt", PROMPT, "--max-tokens", str(MAX_TOKENS)]
GENERATE_ARGS += ["--ignore-chat-template"]
RULE = "=" * 10 + "\n"
WARNING_PREFIX = "mlx-spec: warning:"


def run(
    argv, env=None, stdin=None, timeout=300, cwd=REPO
) -> subprocess.CompletedProcess:
    """Run ``argv`` with this environment (hook on unless ``env`` says otherwise)."""
    full_env = {k: v for k, v in os.environ.items() if k != mlx_spec_hook.DISABLE_ENV}
    full_env.update(env or {})
    return subprocess.run(
        [str(a) for a in argv],
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=timeout,
        cwd=cwd,
    )


def generated_text(stdout: str) -> str:
    """The text between mlx_lm.generate's two rules (``--verbose True``)."""
    start = stdout.index(RULE) + len(RULE)
    return stdout[start : stdout.index(RULE, start)]


def stats_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("Speculation:")]
    return lines[0] if lines else ""


def imported_modules(importtime_stderr: str):
    """Module names in ``python -X importtime`` output."""
    lines = importtime_stderr.splitlines()
    return [line.split("|")[-1].strip() for line in lines if "import time:" in line]


def is_mlx_spec(module: str) -> bool:
    return module.split(".")[0] in ("mlx_spec", "mlx_spec_hook")


def warnings_of(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith(WARNING_PREFIX)]


def assert_usage_error(result, message: str):
    """Exit code 2, no traceback, and a last line that names the problem."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def models(checkpoints):
    return str(checkpoints["llama"]), str(checkpoints["llama-near"])


@pytest.fixture(scope="module")
def plain(models):
    """``mlx_lm.generate`` output with the hook off: (quiet stdout, verbose text)."""
    target, _ = models
    off = {mlx_spec_hook.DISABLE_ENV: "1"}
    args = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    quiet = run([*args, "--verbose", "False"], off)
    verbose = run(args, off)
    assert quiet.returncode == 0 and verbose.returncode == 0, quiet.stderr
    return quiet.stdout, generated_text(verbose.stdout)


def test_hook_pth_is_installed_at_the_site_packages_root():
    pth = Path(sysconfig.get_paths()["purelib"]) / mlx_spec_hook.PTH_NAME
    assert pth.is_file(), f"{pth} is missing: reinstall with `make setup-dev`"
    assert pth.read_text(encoding="utf-8") == mlx_spec_hook.PTH_LINE


def test_other_python_programs_never_import_the_hook():
    result = run([sys.executable, "-X", "importtime", "-c", "pass"])
    assert result.returncode == 0
    assert "site" in imported_modules(result.stderr)
    assert not [name for name in imported_modules(result.stderr) if is_mlx_spec(name)]


def test_mlx_lm_generate_without_speculative_flags_never_imports_mlx_spec(
    models, plain
):
    target, _ = models
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    result = run([sys.executable, "-X", "importtime", *argv, "--verbose", "False"])
    assert result.returncode == 0, result.stderr
    imported = imported_modules(result.stderr)
    assert "mlx_spec_hook" in imported  # the command line names mlx_lm
    assert [name for name in imported if is_mlx_spec(name)] == ["mlx_spec_hook"]
    assert result.stdout == plain[0]


@pytest.mark.parametrize(
    "flags, method",
    [
        (["--speculative", "lookup"], "lookup"),
        (["--draft-model", "DRAFT"], "draft"),  # mlx-lm's meaning, mlx-spec's loop
        (
            ["--draft-model", "DRAFT", "--speculative", "tree", "--tree-budget", "8"],
            "tree",
        ),
    ],
)
def test_mlx_lm_generate_speculates_with_greedy_identity(models, plain, flags, method):
    target, draft = models
    flags = [draft if flag == "DRAFT" else flag for flag in flags]
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS, *flags]
    result = run(argv)
    assert result.returncode == 0, result.stderr
    assert generated_text(result.stdout) == plain[1]
    assert stats_line(result.stdout).startswith(f"Speculation: {method}")
    assert not warnings_of(result.stderr)


def test_a_trained_head_as_draft_model_runs_its_own_method(models, plain, tmp_path):
    import mlx_lm

    from mlx_spec.drafters.heads import random_head, save_head
    from mlx_spec.fingerprint import model_fingerprint

    target, _ = models
    model, _ = mlx_lm.load(target)
    head = random_head("eagle", model, seed=8)
    fingerprint = model_fingerprint(model)
    save_head(tmp_path, "eagle", head.module, target_fingerprint=fingerprint)
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    result = run([*argv, "--draft-model", tmp_path])
    assert result.returncode == 0, result.stderr
    assert generated_text(result.stdout) == plain[1]
    assert stats_line(result.stdout).startswith("Speculation: eagle")


def test_a_checkpoint_with_an_mtp_layer_drafts_with_it(checkpoints):
    target = str(checkpoints["qwen3_next-mtp"])
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    off = run([*argv, "--verbose", "True"], {mlx_spec_hook.DISABLE_ENV: "1"})
    result = run([*argv, "--speculative", "mtp"])
    assert off.returncode == 0 and result.returncode == 0, result.stderr
    assert generated_text(result.stdout) == generated_text(off.stdout)
    assert stats_line(result.stdout).startswith("Speculation: mtp")


def test_quiet_speculative_output_is_byte_identical_to_mlx_lm(models, plain):
    target, draft = models
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    result = run([*argv, "--draft-model", draft, "--verbose", "False"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == plain[0]


@pytest.mark.parametrize(
    "command",
    [
        [BIN / "mlx_lm", "generate"],
        [sys.executable, "-m", "mlx_lm", "generate"],
        [sys.executable, "-m", "mlx_lm.generate"],  # mlx-lm's deprecated form
    ],
    ids=["umbrella", "python-m-mlx_lm", "python-m-mlx_lm.generate"],
)
def test_every_way_to_start_mlx_lm_generate_is_hooked(models, plain, command):
    target, _ = models
    # "--spec=lookup": argparse's unique prefixes work as for mlx-lm's flags.
    argv = [*command, "--model", target, *GENERATE_ARGS, "--spec=lookup"]
    result = run(argv)
    assert result.returncode == 0, result.stderr
    assert generated_text(result.stdout) == plain[1]
    assert stats_line(result.stdout).startswith("Speculation: lookup")


def test_a_bounded_cache_keeps_greedy_identity_or_is_refused_in_one_line(models):
    target, draft = models
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    argv += ["--max-kv-size", "16", "--verbose", "False"]  # prompt + output > 16
    expected = run(argv, {mlx_spec_hook.DISABLE_ENV: "1"})
    result = run([*argv, "--draft-model", draft])
    assert expected.returncode == 0, expected.stderr
    if result.returncode == 0:
        assert result.stdout == expected.stdout  # never a silently longer context
    else:
        assert_usage_error(result, "max_kv_size")


def test_help_adds_the_speculative_flags_to_mlx_lm_generate():
    result = run([BIN / "mlx_lm.generate", "--help"])
    assert result.returncode == 0, result.stderr
    assert "--speculative METHOD" in result.stdout and "--tree-budget" in result.stdout
    assert "--num-draft-tokens" in result.stdout and "--kv-bits" in result.stdout


def test_disable_env_turns_the_hook_off(models):
    target, _ = models
    off = {mlx_spec_hook.DISABLE_ENV: "1"}
    base = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    refused = run([*base, "--speculative", "lookup"], off)
    assert_usage_error(refused, "unrecognized arguments: --speculative lookup")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--speculative", "draft"], "--speculative draft needs a --draft-model"),
        (
            ["--speculative", "lookup", "--ngram-min", "4", "--ngram-max", "2"],
            "ngram_min",
        ),
        (["--draft-model", "/nonexistent/draft"], "/nonexistent/draft"),
        (["--draft-model", "DRAFT", "--prompt-cache-file", "c"], "--prompt-cache-file"),
        (["--draft-model", "OTHERTOK"], "tokenizer differs"),
        # mlx_lm's own flags, checked before the load as mlx_spec generate does
        (["--speculative", "none", "--temp", "1", "--top-k", str(2**70)], "--top-k="),
        (["--speculative", "none", "--chat-template-config", "5"], "--chat-template"),
        (["--speculative", "none", "--xtc-probability", "nan"], "--xtc-probability"),
    ],
)
def test_bad_speculative_input_is_a_one_line_error(models, checkpoints, flags, message):
    target, draft = models
    named = {"OTHERTOK": str(checkpoints["llama-othertok"]), "DRAFT": draft}
    flags = [named.get(f, f) for f in flags]
    result = run([BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS, *flags])
    assert_usage_error(result, message)


def test_a_stdin_prompt_with_bad_utf8_is_read_as_mlx_spec_generate_reads_it(models):
    target, _ = models
    env = {k: v for k, v in os.environ.items() if k != mlx_spec_hook.DISABLE_ENV}
    argv = [BIN / "mlx_lm.generate", "--model", target, "--prompt", "-"]
    argv += ["--max-tokens", "4", "--speculative", "lookup"]
    result = subprocess.run(
        [str(a) for a in argv],
        input=b"\xff\xfe say hi",
        capture_output=True,
        env=env,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr
    assert b"Speculation:" in result.stdout


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--speculative", "bogus"],
            "argument --speculative: invalid choice: 'bogus' (choose from",
        ),
        (["--speculative", "lookup", "--ngram-max", "x"], "invalid int value: 'x'"),
        (["--speculative", "tree"], "--speculative tree needs a --draft-model."),
    ],
)
def test_usage_errors_are_one_line_without_the_usage_block(models, flags, message):
    target, _ = models
    result = run([BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS, *flags])
    assert_usage_error(result, message)
    (line,) = result.stderr.splitlines()
    assert line.startswith("mlx_lm.generate: error: ")
    assert line.endswith("(see mlx_lm.generate --help)")


def test_a_draft_model_the_method_does_not_use_is_not_loaded(
    models, plain, checkpoints
):
    target, _ = models
    other = str(checkpoints["llama-othertok"])  # refused, were it loaded
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    result = run([*argv, "--speculative", "lookup", "--draft-model", other])
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "note: --speculative lookup does not use a draft model; "
        f"--draft-model {other} is not loaded."
    ]
    assert generated_text(result.stdout) == plain[1]
    assert stats_line(result.stdout).startswith("Speculation: lookup")


def test_a_failing_runtime_half_warns_once_and_mlx_lm_runs_unchanged(
    models, plain, tmp_path
):
    target, draft = models
    # mlx_spec.cli.hook cannot be imported (as with a broken mlx-spec).
    source = "import sys\nsys.modules['mlx_spec.cli.hook'] = None\n"
    (tmp_path / "sitecustomize.py").write_text(source, encoding="utf-8")
    argv = [BIN / "mlx_lm.generate", "--model", target, *GENERATE_ARGS]
    result = run([*argv, "--draft-model", draft], {"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert len(warnings_of(result.stderr)) == 1, result.stderr
    assert generated_text(result.stdout) == plain[1]
    assert not stats_line(result.stdout)  # mlx-lm's own speculative decoding


def test_a_failing_start_up_module_warns_once_and_mlx_lm_runs_unchanged(tmp_path):
    source = "raise RuntimeError('simulated failure')\n"
    (tmp_path / "mlx_spec_hook.py").write_text(source, encoding="utf-8")
    env = {"PYTHONPATH": str(tmp_path)}
    result = run([BIN / "mlx_lm.generate", "--speculative", "lookup"], env)
    assert_usage_error(result, "unrecognized arguments: --speculative lookup")
    assert warnings_of(result.stderr) == [
        f"{WARNING_PREFIX} the mlx_lm hook is off (RuntimeError: simulated "
        "failure); mlx_lm runs unchanged"
    ]


def test_an_mlx_lm_without_the_expected_parser_falls_back_with_one_warning(
    monkeypatch, capsys
):
    import importlib

    lm_generate = importlib.import_module("mlx_lm.generate")
    monkeypatch.delattr(lm_generate, "setup_arg_parser")
    module = types.SimpleNamespace(main=lambda: "plain mlx-lm ran")
    wrapped = mlx_spec_hook.hooked_main(module, "generate")
    assert wrapped() == "plain mlx-lm ran"
    err = capsys.readouterr().err
    assert warnings_of(err) == err.splitlines()
    assert len(warnings_of(err)) == 1 and "AttributeError" in err


def test_ctrl_c_while_a_hooked_command_starts_exits_130_without_a_traceback():
    from test_cli import assert_ctrl_c_while_starting_exits_130

    argv = [BIN / "mlx_lm.generate", "--speculative", "lookup", "--help"]
    assert_ctrl_c_while_starting_exits_130([str(a) for a in argv])


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("moment", ["while mlx-spec loads", "while it runs"])
def test_ctrl_c_in_a_hooked_command_exits_130_without_a_traceback(
    moment, monkeypatch, capsys
):
    from mlx_spec.cli import hook

    loads = moment == "while mlx-spec loads"
    monkeypatch.setattr(hook, "prepare", _interrupt if loads else lambda c: _interrupt)
    module = types.SimpleNamespace(main=lambda: "plain mlx-lm ran")
    with pytest.raises(SystemExit) as e:
        mlx_spec_hook.hooked_main(module, "generate")()
    assert e.value.code == 130
    assert capsys.readouterr().err == "\n"


@pytest.mark.parametrize(
    "argv, found",
    [
        (["/venv/bin/mlx_lm.generate", "-p", "x"], ("generate", ["-p", "x"], False)),
        (
            ["/venv/bin/mlx_lm", "server", "--port", "1"],
            ("server", ["--port", "1"], False),
        ),
        (["-m", "chat", "--help"], ("chat", ["--help"], False)),
        (["-m", "--model", "m"], ("generate", ["--model", "m"], True)),
        (["/venv/bin/mlx_lm.convert", "--hf-path", "x"], None),
        (["/venv/bin/mlx_lm", "convert"], None),
        (["-c", "mlx_lm"], None),
        (["script.py", "mlx_lm.generate"], None),
    ],
)
def test_find_command_recognises_only_mlx_lm_entry_points(argv, found):
    orig = {
        ("-m", "chat", "--help"): ["python", "-m", "mlx_lm", "chat", "--help"],
        ("-m", "--model", "m"): ["python", "-X", "dev", "-m", "mlx_lm.generate"]
        + ["--model", "m"],
    }.get(tuple(argv), ["python", *argv])
    assert mlx_spec_hook.find_command(argv, orig) == found


@pytest.mark.parametrize(
    "args, wanted",
    [
        (["--speculative", "tree"], True),
        (["--spec=tree"], True),
        (["--draft-model", "d"], True),
        (["-h"], True),
        (["--prompt", "x", "--max-tokens", "3"], False),
        (["--prompt=--speculative"], False),
        (["--", "--speculative"], False),
    ],
)
def test_only_speculative_or_help_flags_wake_the_hook(args, wanted):
    assert mlx_spec_hook.wants_hook(args) is wanted


# --------------------------------------------------------------------------- #
# mlx_lm.server and mlx_lm.chat
# --------------------------------------------------------------------------- #


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _complete(port: int, body: dict, process, timeout: float = 120.0) -> dict:
    """POST a completion, retrying until the server listens."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"HTTP {error.code}: {error.read()!r}") from None
        except (ConnectionError, urllib.error.URLError):
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _serve(argv):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != mlx_spec_hook.DISABLE_ENV}
    process = subprocess.Popen(
        [str(a) for a in argv] + ["--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return port, process


def _stop(process) -> str:
    process.terminate()
    try:
        return process.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[1]


def test_mlx_lm_server_speculates_with_greedy_identity(models):
    target, draft = models
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    plain_port, plain_server = _serve([BIN / "mlx_lm.server", "--model", target])
    spec_port, spec_server = _serve(
        [BIN / "mlx_lm.server", "--model", target, "--draft-model", draft]
    )
    try:
        expected = _complete(plain_port, body, plain_server)
        drafted = _complete(spec_port, body, spec_server)
        looked_up = _complete(spec_port, {**body, "speculative": "lookup"}, spec_server)
    finally:
        logs = _stop(plain_server) + _stop(spec_server)
    assert "speculative_stats" not in expected
    text = expected["choices"][0]["text"]
    assert drafted["choices"][0]["text"] == text
    assert drafted["speculative_stats"]["method"] == "draft"
    assert looked_up["choices"][0]["text"] == text
    assert looked_up["speculative_stats"]["method"] == "lookup"
    assert not warnings_of(logs)


def _chat(argv) -> subprocess.CompletedProcess:
    result = run(argv, stdin=f"{CHAT_PROMPT}\nq\n", timeout=180)
    assert result.returncode == 0, result.stderr
    return result


def test_mlx_lm_chat_speculates_with_greedy_identity(models):
    target, _ = models
    base = [BIN / "mlx_lm.chat", "--model", target, "--max-tokens", "16"]
    plain = _chat(base)
    spec = _chat([*base, "--speculative", "lookup"])
    reply = spec.stdout.split(">> ", 1)[1].split("\n[Speculation: lookup", 1)[0]
    assert len(reply) > 8
    assert reply in plain.stdout
    assert not warnings_of(spec.stderr)


# --------------------------------------------------------------------------- #
# A normal (non-editable) install into a fresh environment
# --------------------------------------------------------------------------- #

SOURCES = (
    "pyproject.toml",
    "setup.py",
    "mlx_spec_hook.py",
    "mlx_spec_entry.py",
    "README.md",
    "mlx_spec",
    "ui",
)


def _copy_sources(dst: Path):
    import shutil

    from mlx_spec.home import SHIPPED_MODELS

    for name in (*SOURCES, *(f"models/{drafter}" for drafter in SHIPPED_MODELS)):
        src = REPO / name
        if src.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(src, dst / name, ignore=ignore)  # makes models/
        else:
            shutil.copy2(src, dst / name)


def test_pip_install_into_a_fresh_venv_hooks_mlx_lm(models, plain, tmp_path):
    """``pip install .`` (a wheel build, no network) puts the hook in place."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("building mlx-spec needs setuptools>=77 (make setup-dev)")
    target, _ = models
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run([python, "-c", purelib]).stdout.strip())
    # mlx, mlx-lm and the build tools come from this environment, read-only.
    deps = [p for p in sys.path if "site-packages" in p and Path(p).is_dir()]
    (site / "_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    src = tmp_path / "src"
    src.mkdir()
    _copy_sources(src)
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q"]
    installed = run([*pip, "--no-deps", "--no-build-isolation", "--no-index", src])
    assert installed.returncode == 0, installed.stderr
    assert (site / mlx_spec_hook.PTH_NAME).read_text() == mlx_spec_hook.PTH_LINE
    # Run outside the checkout and its PYTHONPATH: only the installed copy counts.
    alone = {"PYTHONPATH": ""}
    modules = ("mlx_spec", "mlx_spec_hook", "mlx_spec_entry")
    where = f"import {', '.join(modules)}; print({', '.join(m + '.__file__' for m in modules)})"
    files = run([python, "-c", where], alone, cwd=tmp_path).stdout.split()
    assert [Path(f).relative_to(site).parts[0] for f in files] == [
        "mlx_spec",
        "mlx_spec_hook.py",
        "mlx_spec_entry.py",
    ]
    import mlx_spec

    version = run([venv / "bin" / "mlx_spec", "--version"], alone, cwd=tmp_path)
    assert version.stdout == f"{mlx_spec.__version__}\n", version.stderr
    argv = [python, "-m", "mlx_lm", "generate", "--model", target, *GENERATE_ARGS]
    hooked = run([*argv, "--speculative", "lookup"], alone, cwd=tmp_path)
    assert hooked.returncode == 0, hooked.stderr
    assert generated_text(hooked.stdout) == plain[1]
    assert stats_line(hooked.stdout).startswith("Speculation: lookup")
    quiet = run([*argv, "--verbose", "False"], alone, cwd=tmp_path)
    assert quiet.stdout == plain[0]


def test_kept_defaults_bring_their_help_along():
    """A flag whose default the hook restores to mlx-lm's also shows mlx-lm's help
    (the hooked mlx_lm.chat --help named mlx-spec's default model)."""
    import argparse

    from mlx_spec.cli.hook import keep_defaults

    ours, base = argparse.ArgumentParser(), argparse.ArgumentParser()
    ours.add_argument("--model", default=None, help="Default: the embedded pair.")
    ours.add_argument("--temp", default=0.0, help="Ours.")
    base.add_argument("--model", default="org/llama", help="Default: org/llama.")
    base.add_argument("--temp", default=0.0, help="Theirs.")
    keep_defaults(ours, base)
    model, temp = ours._actions[1], ours._actions[2]
    assert (model.default, model.help) == ("org/llama", "Default: org/llama.")
    assert (temp.default, temp.help) == (0.0, "Ours.")  # same default: our help stays
