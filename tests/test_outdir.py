"""Nothing a user owns is lost: ``convert`` and ``train-draft`` refuse an
``--out`` holding other files unless ``--force``, ``train-draft`` never writes
into its target, and a run killed with SIGKILL leaves no half-written output."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mlx_spec.outdir import (
    OutDirError,
    check_out_dir,
    check_outside,
    staged_dir,
    staged_file,
)

ROOT = Path(__file__).resolve().parents[1]


def test_a_folder_holding_files_is_refused_unless_forced_or_ours(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(OutDirError, match="already holds files.*--force"):
        check_out_dir(tmp_path)
    assert check_out_dir(tmp_path, force=True) == tmp_path
    assert check_out_dir(tmp_path, ours=lambda p: True) == tmp_path
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_out_dir(empty) == empty
    assert check_out_dir(tmp_path / "new") == tmp_path / "new"
    with pytest.raises(OutDirError, match="is a file"):
        check_out_dir(tmp_path / "mine.txt")


def test_an_out_inside_a_protected_folder_is_refused(tmp_path):
    for out in (tmp_path, tmp_path / "sub", tmp_path / "sub" / ".." / "x"):
        with pytest.raises(OutDirError, match="inside the target model"):
            check_outside(out, tmp_path, flag="--out", what="the target model")
    check_outside(tmp_path.parent / "other", tmp_path, flag="--out", what="x")


def test_a_failed_staged_write_leaves_the_old_folder_and_no_trace(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_dir(out) as work:
            work.mkdir()
            (work / "half.txt").write_text("half")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    with staged_dir(out) as work:
        work.mkdir()
        (work / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]


def test_an_interrupted_staged_file_leaves_the_old_file_and_no_trace(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with staged_file(path) as work:
            work.write_text("ha")
            raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert path.read_text() == "old"
    with staged_file(path) as work:
        assert work.suffix == ".json"  # writers that go by the suffix (savefig)
        work.write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert path.read_text() == "new"


# --------------------------------------------------------------------------- #
# convert
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny_gguf(checkpoints, tmp_path_factory):
    pytest.importorskip("gguf")
    from test_convert_gguf import write_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(checkpoints["llama"], path, "F32")
    return path


def _convert(argv, capsys):
    from mlx_spec.convert.__main__ import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err.strip()


def test_convert_keeps_a_users_folder_and_exits_2(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8 precious")
    code, err = _convert(["gguf", str(tiny_gguf), "--out", str(out)], capsys)
    assert code == 2 and "already holds files" in err and "\n" not in err, err
    assert (out / "holiday.jpg").read_bytes() == b"\xff\xd8 precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]
    # --force replaces it; a later run over its own conversion needs no --force.
    from mlx_spec.convert.__main__ import main

    assert main(["gguf", str(tiny_gguf), "--out", str(out), "--force"]) == 0
    assert not (out / "holiday.jpg").exists() and (out / "config.json").is_file()
    assert main(["gguf", str(tiny_gguf), "--out", str(out)]) == 0


def test_convert_names_a_folder_given_as_the_gguf_and_exits_2(tmp_path, capsys):
    code, err = _convert(["gguf", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "is a folder; pass the .gguf file" in err, err
    code, err = _convert(
        ["gguf", str(tmp_path / "no.gguf"), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "does not exist" in err, err


def _killed_when(script: str, flag: Path, timeout: float = 240.0) -> None:
    """Run ``script`` in a new Python, SIGKILL it once it creates ``flag``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT)
    deadline = time.monotonic() + timeout
    try:
        while not flag.exists():
            assert process.poll() is None, "the run ended before the kill point"
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_conversion_killed_mid_write_leaves_the_old_checkpoint_whole(
    tiny_gguf, tmp_path
):
    from mlx_spec.convert.__main__ import main

    out, flag = tmp_path / "model", tmp_path / "weights-written"
    assert main(["gguf", str(tiny_gguf), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # Killed after the weights are written, before the config: the old
    # checkpoint stays as it was, the new one is only in a hidden sibling.
    script = textwrap.dedent(f"""
        import time
        from mlx_spec.convert import gguf
        real = gguf.write_weights
        def write_then_hang(*args, **kwargs):
            real(*args, **kwargs)
            open({str(flag)!r}, "w").close()
            time.sleep(600)
        gguf.write_weights = write_then_hang
        from mlx_spec.convert.__main__ import main
        main(["gguf", {str(tiny_gguf)!r}, "--out", {str(out)!r}, "--dtype", "float16"])
        """)
    _killed_when(script, flag)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert sorted(visible) == ["model", "weights-written"]
    # Running it again finishes the conversion.
    assert main(["gguf", str(tiny_gguf), "--out", str(out), "--dtype", "float16"]) == 0
    import mlx_lm

    mlx_lm.load(str(out))


# --------------------------------------------------------------------------- #
# train-draft
# --------------------------------------------------------------------------- #


def _train_error(argv, capsys) -> str:
    from mlx_spec.train.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_train_draft_refuses_to_write_into_its_target(checkpoints, tmp_path, capsys):
    from test_train_cli import TINY

    target = checkpoints["llama"]
    before = sorted(p.name for p in target.iterdir())
    for out in (target, target / "draft"):
        argv = ["--model", str(target), "--out", str(out), *TINY]
        text = _train_error(argv, capsys)
        assert "inside the target model" in text, text
        text = _train_error([*argv, "--force"], capsys)  # --force does not allow it
        assert "inside the target model" in text, text
    assert sorted(p.name for p in target.iterdir()) == before


def test_train_draft_refuses_a_folder_it_did_not_write(checkpoints, tmp_path, capsys):
    from test_train_cli import TINY

    (tmp_path / "notes.txt").write_text("mine")
    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path), *TINY]
    text = _train_error(argv, capsys)
    assert "already holds files" in text and "--force" in text, text
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_training_killed_while_checkpointing_resumes_from_the_last_checkpoint(
    checkpoints, load_model, tmp_path, capsys
):
    from test_train_cli import TINY

    from mlx_spec.loading import load_draft
    from mlx_spec.train.checkpoint import read_state
    from mlx_spec.train.cli import main

    out, flag = tmp_path / "draft", tmp_path / "killed-here"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(out), *TINY]
    # Killed while writing the second checkpoint (after step 6 of 6).
    script = textwrap.dedent(f"""
        import time, types
        from mlx_spec.train import checkpoint
        real = checkpoint.mx.save_safetensors
        def save(path, values, **kw):
            real(path, values, **kw)
            if "checkpoints.tmp" in path and checkpoint.read_state({str(out)!r}):
                open({str(flag)!r}, "w").close()
                time.sleep(600)
        checkpoint.mx = types.SimpleNamespace(save_safetensors=save)
        from mlx_spec.train.cli import main
        main({argv!r})
        """)
    _killed_when(script, flag)
    assert read_state(out)["step"] == 3
    assert not (out / "config.json").exists()  # no drafter before training ends
    capsys.readouterr()
    assert main(argv) == 0
    assert "resumed from step 3" in capsys.readouterr().err
    assert read_state(out)["step"] == 6
    model, tokenizer = load_model("llama")
    load_draft(str(out), model, tokenizer)
