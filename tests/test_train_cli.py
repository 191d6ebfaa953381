"""``mlx_spec train-draft`` end to end on a tiny target: one command writes a
loadable draft and its card, a rerun resumes instead of redoing, heads train on
the same completions, and bad options fail in one line."""

import json
import shlex
import shutil
import signal
from pathlib import Path

import pytest

from mlx_spec.cli import main as mlx_spec_main
from mlx_spec.loading import load_draft
from mlx_spec.train import completions as C
from mlx_spec.train import draft as D
from mlx_spec.train import head_command as H
from mlx_spec.train.cli import main, setup_arg_parser
from mlx_spec.train.cli_options import check_grown_lr

MODELS = Path(__file__).resolve().parents[1] / "models"
TINY = [
    "--num-prompts",
    "6",
    "--heldout-prompts",
    "3",
    "--max-tokens",
    "10",
    "--steps",
    "6",
    "--batch-tokens",
    "2048",
    "--draft-vocab",
    "150",
    "--layers",
    "-1",
    "--eval-every",
    "3",
    "--eval-prompts",
    "1",
    "--eval-max-tokens",
    "8",
    "--eval-gammas",
    "1,2",
    "--no-progress",
]


def _error(argv, capsys) -> str:
    """The message of a train-draft command refused with exit status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after any progress log
    assert last.startswith("mlx_spec train-draft: error: "), last
    return last


@pytest.fixture(scope="module")
def trained(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "draft"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(out), *TINY]
    assert mlx_spec_main(["train-draft", *argv]) == 0
    return out, argv


def test_one_command_writes_a_draft_its_card_and_its_record(trained, load_model):
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    assert config["draft"]["init_layers"] == [1]  # -1: the target's last layer
    assert config["training"]["steps"] == 6
    assert [e["step"] for e in config["training"]["evals"]] == [0, 3, 6]
    assert config["evaluation"]["end_to_end"]["identical"]
    card = (out / "README.md").read_text()
    for part in (
        "## Data",
        "## Training",
        "pos 1",
        "ratio",
        "mlx_spec train-draft --model",
    ):
        assert part in card, part
    assert "--no-progress" not in config["command"]  # it changes no result
    model, tokenizer = load_model("llama")
    assert load_draft(str(out), model, tokenizer) is not None


def test_rerun_resumes_without_regenerating_or_retraining(trained, capsys):
    out, argv = trained
    shards = {p: p.stat().st_mtime_ns for p in (out / "data").glob("*.npz")}
    trained_for = json.loads((out / "config.json").read_text())["timing"]["train"]
    assert main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "data").glob("*.npz")} == shards
    assert "resumed from step 6" in capsys.readouterr().err
    # A rerun with no step left measures again but keeps the training's time.
    timing = json.loads((out / "config.json").read_text())["timing"]
    assert timing["train"] == trained_for
    assert f"train {trained_for['wall_s'] / 60:.1f} min" in timing["summary"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--layers", "7"], "draft layers [7]"),
        (["--sampled-share", "2"], "--sampled-share"),
        (["--prompts", "nope.jsonl"], "does not exist"),
        (["--prompts", "{folder}"], "is a folder"),
        (["--prompts", "/dev/null"], "is not a regular file"),  # was "does not exist"
        (["--prompts", "{not_utf8}"], "is not UTF-8 text"),
        (["--prompts", "{bad_messages}"], ":1: 'messages' must be a non-empty list"),
        (["--init-from", "nope"], "--init-from directory 'nope' does not exist"),
        (
            ["--self-instruct", "-1"],
            "--self-instruct=-1 is out of range: an integer from 0",
        ),
        (
            ["--rollout-steps", "-2"],
            "--rollout-steps=-2 is out of range: an integer from 0",
        ),
        (
            ["--rollout-steps", "3", "--rollout-share", "0"],
            "--rollout-share must be more than 0 and at most 1, got 0.0",
        ),
        (
            ["--rollout-steps", "3", "--rollout-temp", "-1"],
            "--rollout-temp must be at least 0",
        ),
        (["--rollout-share", "0.5"], "--rollout-share and --rollout-temp need"),
        (
            ["--kind", "eagle", "--rollout-steps", "2"],
            "--rollout-steps is for --kind draft",
        ),
    ],
)
def test_bad_options_fail_in_one_line(checkpoints, tmp_path, capsys, extra, message):
    files = {
        "{not_utf8}": b'{"prompt": "\xff"}\n',
        "{bad_messages}": b'{"messages": 5}\n',
    }
    for name, data in files.items():
        (tmp_path / name.strip("{}")).write_bytes(data)
    places = {name: str(tmp_path / name.strip("{}")) for name in files}
    places["{folder}"] = str(tmp_path)
    extra = [places.get(arg, arg) for arg in extra]
    argv = [
        "--model",
        str(checkpoints["llama"]),
        "--out",
        str(tmp_path / "d"),
        *TINY,
        *extra,
    ]
    text = _error(argv, capsys)
    assert message in text and "\n" not in text, text


def test_head_kinds_train_on_the_same_completions(
    trained, checkpoints, tmp_path, capsys
):
    out, argv = trained
    head = tmp_path / "medusa"
    data = out / "data"
    head.mkdir()
    (head / "data").symlink_to(data)  # reuse the completions: no generation
    argv = [a if a != str(out) else str(head) for a in argv]
    argv = argv[: argv.index("--layers")] + argv[argv.index("--layers") + 2 :]
    assert main([*argv, "--kind", "medusa"]) == 0
    config = json.loads((head / "config.json").read_text())
    assert config["mlx_spec_head"]["kind"] == "medusa"
    # An EAGLE head by default reads the target's blocks 0 and 1, which the
    # draft's folder lacks: one teacher-forced pass, and the folder is kept.
    eagle = tmp_path / "eagle"
    argv = [a if a != str(head) else str(eagle) for a in argv]
    capsys.readouterr()
    assert main([*argv, "--data", str(data), "--kind", "eagle"]) == 0
    assert "teacher pass" in capsys.readouterr().err
    assert list((eagle / "data").glob("teacher-*.npz"))
    assert json.loads((data / "train.json").read_text())["feature_layers"] == [-1]
    config = json.loads((eagle / "config.json").read_text())
    assert config["head"]["feature_layers"] == [0, 1]


def test_an_eagle_run_keeps_the_blocks_its_head_reads(checkpoints, tmp_path, capsys):
    """Default options on a 2-block target: the data keeps EAGLE-3's blocks
    for it (0 and 1), so the head reads them with no teacher-forced pass."""
    head = tmp_path / "eagle"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(head), *TINY]
    assert main([*argv, "--kind", "eagle"]) == 0
    assert "teacher pass" not in capsys.readouterr().err
    assert not list((head / "data").glob("teacher-*.npz"))
    for name in ("train.json", "heldout.json"):
        manifest = json.loads((head / "data" / name).read_text())
        assert manifest["feature_layers"] == [0, 1], name
    config = json.loads((head / "config.json").read_text())
    assert config["head"]["feature_layers"] == [0, 1]
    card = (head / "README.md").read_text()
    assert "- Reads: the target's block 0, block 1." in card


def test_kept_features_serve_a_head_without_a_teacher_pass(
    checkpoints, tmp_path, capsys
):
    """Data keeping blocks 0 and final: an EAGLE head on block 0 reads it as is,
    and a later run on the folder keeps its layers without being told."""
    data = tmp_path / "data"
    base = ["--model", str(checkpoints["llama"]), "--data", str(data), *TINY]
    made = ["--out", str(tmp_path / "d"), "--keep-features", "0,-1", "--data-only"]
    assert main([*base, *made]) == 0
    manifest = json.loads((data / "train.json").read_text())
    assert manifest["feature_layers"] == [0, -1]
    capsys.readouterr()
    head = tmp_path / "eagle"
    argv = [*base, "--out", str(head), "--kind", "eagle", "--feature-layers", "0"]
    assert main(argv) == 0
    assert "teacher pass" not in capsys.readouterr().err
    assert not (head / "data").exists()  # no teacher-forced pass was cached
    config = json.loads((head / "config.json").read_text())
    assert config["head"]["feature_layers"] == [0]
    card = (head / "README.md").read_text()
    assert "- Reads: the target's block 0." in card
    assert "- Prompts: " in card and " completion tokens (" in card
    draft = ["--out", str(tmp_path / "d2"), "--feature-weight", "0.5", "--skip-eval"]
    assert main([*base, *draft]) == 0


def _without(argv, *options):
    """``argv`` without the named options and their values."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in options:
            skip = True
        else:
            out.append(word)
    return out


def test_a_rerun_leaving_training_options_out_keeps_the_checkpoints(
    trained, tmp_path, capsys
):
    """After the defaults change (or an option is dropped), the same command
    resumes the run with its own options instead of refusing or mixing."""
    out, argv = trained
    copy = tmp_path / "draft"
    shutil.copytree(out, copy)
    argv = [str(copy) if word == str(out) else word for word in argv]
    bare = _without(argv, "--steps", "--eval-every")
    capsys.readouterr()
    assert main(bare) == 0
    err = capsys.readouterr().err
    assert "kept: --steps=6 --eval-every=3" in err, err
    assert "resumed from step 6" in err
    assert json.loads((copy / "config.json").read_text())["training"]["steps"] == 6
    command = json.loads((copy / "config.json").read_text())["command"]
    assert command.endswith("--steps=6 --eval-every=3"), command
    # An option given explicitly must still match the checkpoint.
    text = _error([*bare, "--steps", "9"], capsys)
    assert "other steps" in text and "\n" not in text, text


def test_ctrl_c_during_training_pauses_in_one_line(
    trained, tmp_path, monkeypatch, capsys
):
    out, argv = trained
    real = D.DraftTrainer.train_step

    def pressed_during_step_2(self):
        if self.step == 1:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            signal.raise_signal(signal.SIGINT)
        return real(self)

    monkeypatch.setattr(D.DraftTrainer, "train_step", pressed_during_step_2)
    paused = tmp_path / "d"
    argv = [str(paused) if word == str(out) else word for word in argv]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*argv, "--data", str(out / "data")])
    assert e.value.code == 130  # as any command stopped by Ctrl-C
    text = capsys.readouterr().err.strip().splitlines()[-1]
    assert text.startswith("mlx_spec train-draft: paused after step 2 ("), text
    assert text.endswith("run the same command again to go on.") and "\n" not in text
    assert (paused / "checkpoints" / "state.json").exists()


def test_an_eagle_head_resumes_with_the_blocks_it_was_started_on(
    checkpoints, tmp_path, capsys
):
    """A head begun on the final hidden state (once the default) goes on
    reading it when a later command leaves --feature-layers out."""
    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "e"), *TINY]
    started = [*argv, "--kind", "eagle", "--feature-layers", "-1"]
    assert main(started) == 0
    capsys.readouterr()
    assert main([*argv, "--kind", "eagle"]) == 0
    err = capsys.readouterr().err
    assert "kept: --feature-layers=-1" in err and "teacher pass" not in err
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert config["head"]["feature_layers"] == [-1]
    # The card's command reproduces the run: it parses, with the blocks read.
    command = config["command"]
    again = setup_arg_parser().parse_args(shlex.split(command)[2:])
    assert again.feature_layers == "-1" and again.kind == "eagle"


def test_bad_options_fail_before_anything_loads(trained, tmp_path, monkeypatch, capsys):
    """Nothing is loaded or written first: not the target, not a data folder."""
    out, argv = trained
    afile = tmp_path / "afile.txt"
    afile.write_text("")

    def loaded(*args, **kwargs):
        raise AssertionError("loaded before the option was checked")

    monkeypatch.setattr("mlx_spec.loading.load_model", loaded)
    monkeypatch.setattr(C, "build_completions", loaded)
    eagle = str(MODELS / "smollm2-135m-eagle")
    for extra, message in (
        (
            ["--kind", "draft", "--feature-layers", "2"],
            "--feature-layers is for --kind eagle",
        ),
        (
            ["--kind", "medusa", "--feature-layers", "2"],
            "--feature-layers is for --kind eagle",
        ),
        (
            ["--kind", "eagle", "--feature-layers", "2,x"],
            "--feature-layers must be comma-separated integers",
        ),
        (["--lr", "-1"], "--lr=-1.0 is out of range"),
        (["--grown-lr", "nan"], "--grown-lr=nan is out of range"),
        (["--grown-lr", "1e-3"], "--grown-lr is for the layers a draft adds"),
        (
            ["--init-from", str(out), "--grown-lr", "1e-3"],
            "--layers -1 adds none (1 layers; that draft has 1); pass more --layers",
        ),
        (
            ["--kind", "medusa", "--num-heads", "0"],
            "--num-heads=0 is out of range: an integer from 1 to 8",
        ),
        (["--kind", "eagle", "--window", "4"], "--window=4 is out of range"),
        (["--kind", "eagle", "--train-steps", "9"], "--train-steps=9 is out of range"),
        (["--kind", "eagle", "--batch-size", "0"], "--batch-size=0 is out of range"),
        (["--prompt-weight", "-1"], "--prompt-weight=-1.0 is out of range"),
        (
            ["--init-from", eagle],
            "holds the eagle drafter; pass a directory that `mlx_spec train-draft --kind draft` wrote",
        ),
        (["--init-from", str(tmp_path)], "holds no drafter written by train-draft"),
    ):
        text = _error([*argv, *extra], capsys)
        assert message in text and "\n" not in text, text
    moved = [str(afile) if word == str(out) else word for word in argv]
    text = _error(moved, capsys)
    assert f"--out {afile} is a file; pass a directory." in text


def test_grown_lr_is_taken_when_layers_grow_the_warm_started_draft(trained, tmp_path):
    """The check that refuses --grown-lr without new layers lets a grown draft by."""
    out, argv = trained
    moved = [str(tmp_path / "grown") if word == str(out) else word for word in argv]
    grown = [*moved, "--init-from", str(out), "--grown-lr", "1e-3", "--layers", "0,-1"]
    check_grown_lr(setup_arg_parser().parse_args(grown))  # no error


def test_a_feature_layer_the_target_lacks_fails_in_one_line(
    checkpoints, tmp_path, capsys
):
    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "d"), *TINY]
    text = _error([*argv, "--keep-features", "0,9"], capsys)
    assert "feature layers [0, 9]" in text and "\n" not in text, text


def test_a_draft_card_names_the_requests_the_target_wrote_itself():
    from mlx_spec.train.card import model_card

    def card(sets):
        return model_card({"data": {"train_sets": sets}}, "mlx_spec train-draft", None)

    assert "--self-instruct" in card({"chat": 3, "self": 2})
    assert "--self-instruct" not in card({"chat": 3})
    assert "prompts (3 chat, 2 self)" in card({"chat": 3, "self": 2})


def test_a_draft_card_trained_on_a_corpus_names_it_and_its_warm_start():
    from mlx_spec.train.card import model_card

    data = {
        "corpus": "c",
        "train_prompts": 3,
        "train_sets": {"chat": 3},
        "train_prompt_tokens": 7,
        "train_completion_tokens": 9,
        "heldout_prompts": 1,
        "heldout_completion_tokens": 2,
        "top_k": 8,
    }
    config = {"data": data, "training": {"config": {"init_from": "models/old"}}}
    text = model_card(config, "mlx_spec train-draft", None)
    assert "Self-distillation on the corpus `c`" in text
    assert "warm-started from the draft in `models/old`" in text
    assert "identities" not in text
    config["training"]["grown_from_layers"] = [0, 29]
    grown = model_card(config, "mlx_spec train-draft", None)
    line = "warm-started from the draft in `models/old` (its target layers [0, 29];"
    assert f"{line} the new layers started as identities);" in grown
    config["training"]["config"]["grown_lr"] = 0.0008
    grown = model_card(config, "mlx_spec train-draft", None)
    assert "started as identities and trained at peak learning rate 0.0008);" in grown
    # Nothing of a run that wrote its own completions is claimed.
    data_section = text.split("## Data")[1].split("## Training")[0]
    for words in ("built-in prompts", "None", "generation took"):
        assert words not in data_section, words
    assert "data folder" not in text


@pytest.mark.parametrize(
    "kind, reads",
    [
        ("eagle", "block 2, block 15, block 27"),
        ("medusa", "final hidden state (4 heads)"),
    ],
)
def test_a_head_card_is_written_from_the_heads_record(kind, reads):
    """The shipped heads' cards, made again from their config.json (the
    EAGLE card also has a paragraph written by hand)."""
    from mlx_spec.train.card import head_card

    folder = MODELS / f"smollm2-135m-{kind}"
    config = json.loads((folder / "config.json").read_text())
    card = head_card(config, config["command"])
    shipped = iter((folder / "README.md").read_text().splitlines())
    assert all(line in shipped for line in card.splitlines())  # in the same order
    assert f"- Reads: the target's {reads}." in card


@pytest.mark.parametrize("kind", ["draft", "eagle", "medusa"])
def test_the_defaults_are_the_recipes_of_the_shipped_drafters(kind):
    """Only the data differs: the shipped drafters trained on more prompts (a
    warm-started one: the run its chain of warm starts began with)."""
    shipped = json.loads((MODELS / f"smollm2-135m-{kind}" / "config.json").read_text())
    trained = shipped.get("origin", {}).get("recipe") or shipped["training"]["config"]
    args = setup_arg_parser().parse_args(["--model", "m", "--out", "o", "--kind", kind])
    if kind == "draft":
        # As train-draft builds its DraftTrainConfig from the options left unset.
        assert args.steps is None and args.lr is None
        made = dict(
            steps=D.DEFAULT_STEPS, lr=D.DEFAULT_LR, batch_tokens=args.batch_tokens
        )
    else:
        made = vars(H.head_config(args, kind, 30))
    keys = ["steps", "lr"] + (
        ["batch_tokens"] if kind == "draft" else ["batch_size", "window"]
    )
    assert {k: made[k] for k in keys} == {k: trained[k] for k in keys}


def test_a_corpus_folder_without_a_corpus_says_how_to_grow_one(tmp_path, capsys):
    """The three front ends of a corpus (train-draft, corpus info, the data
    stage) say it in one message: train-draft's own said to grow one without how."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "m", "--out", str(tmp_path / "o"), "--corpus", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err
    assert f"--corpus '{tmp_path}' holds no corpus (no corpus.json)" in err
    assert f"mlx_spec corpus grow --model MODEL --out {tmp_path}" in err


@pytest.mark.parametrize(
    "kind, ok", [("draft", False), ("eagle", True), ("medusa", True)]
)
def test_draft_vocab_0_keeps_a_heads_whole_vocabulary(kind, ok):
    """0 is a head's whole vocabulary (its help says so); a draft needs rows."""
    from mlx_spec.config import OptionError
    from mlx_spec.train.cli_options import check_numbers

    argv = ["--model", "m", "--out", "o", "--kind", kind, "--draft-vocab", "0"]
    args = setup_arg_parser().parse_args(argv)
    if ok:
        check_numbers(args)
    else:
        with pytest.raises(OptionError, match="--draft-vocab=0"):
            check_numbers(args)
    args.draft_vocab = -1
    with pytest.raises(OptionError, match="--draft-vocab=-1"):
        check_numbers(args)
