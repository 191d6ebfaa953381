"""No traceback, signal or hang from user input: every command meets many bad
invocations and answers each with exit code 2 and one line on stderr that
names what is wrong, before any model work (tiny checkpoints where a model
is named, in case a check comes after the load)."""

import os
import re
import shutil
import signal
import socketserver
import sys
from pathlib import Path

import pytest
from draft_dirs import write_draft

from mlx_spec import cli

DEADLINE_S = 60
BIG = str(2**70)  # past int64: mlx raised std::bad_cast
EMPTY = ""
NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # invalid UTF-8 in argv, as Python receives it

# (command and flags, text the error line must hold). Placeholders:
# {llama} a copy of a tiny checkpoint, {user} a folder holding a user's file, {theirs}
# one holding a user's results.json, {damaged} and {listed} model folders whose
# config.json is not UTF-8 or not an object, {file} a plain file, {new} a folder that
# does not exist yet, {missing} a missing path.
GENERATE = ["generate", "--model", "{llama}", "--prompt", "hi"]
CHAT = ["chat", "--model", "{llama}"]
SERVER = ["server", "--model", "{llama}", "--port", "8"]
TRAIN = ["train-draft", "--model", "{llama}"]
GROW = ["corpus", "grow", "--model", "{llama}"]
SWEEP = ["corpus", "sweep", "--model", "{llama}", "--out", "{new}"]
BENCH = ["bench", "--model", "{llama}", "--quick", "--no-progress", "--out", "{new}"]
BAD = [
    # generate: the run options' one path (mlx_spec.config)
    (GENERATE + ["--seed", "-1"], "--seed=-1"),
    (GENERATE + ["--seed", BIG], "--seed="),
    (GENERATE + ["--seed", "x"], "--seed"),
    (GENERATE + ["--kv-bits", "4", "--kv-group-size", "0"], "--kv-group-size=0"),
    (GENERATE + ["--kv-bits", "3", "--kv-group-size", "7"], "--kv-group-size=7"),
    (GENERATE + ["--kv-bits", "4", "--kv-group-size", "-64"], "--kv-group-size=-64"),
    (GENERATE + ["--kv-bits", "9"], "--kv-bits=9"),
    (GENERATE + ["--kv-bits", "4", "--quantized-kv-start", "-1"], "--quantized-kv"),
    (GENERATE + ["--prefill-step-size", "0"], "--prefill-step-size=0"),
    (GENERATE + ["--prefill-step-size", BIG], "--prefill-step-size="),
    (GENERATE + ["--max-kv-size", "0"], "--max-kv-size=0"),
    (GENERATE + ["--max-kv-size", BIG], "--max-kv-size="),
    (GENERATE + ["--max-tokens", "0"], "--max-tokens=0"),
    (GENERATE + ["--max-tokens", "many"], "--max-tokens"),
    (GENERATE + ["--temp", "-1"], "--temp=-1"),
    (GENERATE + ["--temp", "nan"], "--temp=nan"),
    (GENERATE + ["--top-p", "2"], "--top-p=2"),
    (GENERATE + ["--min-p", "-1"], "--min-p=-1"),
    (GENERATE + ["--top-k", "-1"], "--top-k=-1"),
    (GENERATE + ["--min-tokens-to-keep", "0"], "--min-tokens-to-keep=0"),
    (GENERATE + ["--min-tokens-to-keep", BIG], "--min-tokens-to-keep="),
    (GENERATE + ["--temp", "1", "--top-k", BIG], "--top-k="),
    (GENERATE + ["--xtc-probability", "nan"], "--xtc-probability=nan"),
    (GENERATE + ["--xtc-probability", "0.5"], "--xtc-probability"),
    (GENERATE + ["--chat-template-config", "-1"], "--chat-template-config"),
    (GENERATE + ["--chat-template-config", "{"], "--chat-template-config"),
    (GENERATE + ["--stats-json", "{missing}/stats.json"], "--stats-json"),
    (GENERATE + ["--stats-json", "{user}"], "--stats-json"),
    (GENERATE + ["--speculative", "bogus"], "--speculative"),
    (GENERATE + ["--num-draft-tokens", "0"], "--num-draft-tokens=0"),
    (GENERATE + ["--num-draft-tokens", BIG], "--num-draft-tokens="),
    (GENERATE + ["--tree-budget", "0"], "--tree-budget=0"),
    (GENERATE + ["--tree-top-k", "0"], "--tree-top-k=0"),
    (GENERATE + ["--ngram-min", "0"], "--ngram-min=0"),
    (GENERATE + ["--lookup-candidates", "0"], "--lookup-candidates=0"),
    (GENERATE + ["--draft-p-min", "2"], "--draft-p-min=2"),
    (GENERATE + ["--tree-choices", "[[0], [0, 99]]"], "tree_choices"),
    (GENERATE + ["--tree-choices", "[["], "tree_choices"),
    (GENERATE + ["--draft-model", "{missing}"], "draft model"),
    (["generate", "--model", "{missing}", "--prompt", "hi"], "{missing}"),
    (["generate", "--model", "{damaged}", "--prompt", "hi"], "damaged config.json"),
    (["generate", "--model", "{listed}", "--prompt", "hi"], "not a JSON object"),
    (GENERATE + ["--draft-model", "{damaged}"], "damaged config.json"),
    (GENERATE + ["--draft-model", "{listed}"], "not a JSON object"),
    (GENERATE + ["--prompt-cache-file", "{file}"], "--prompt-cache-file"),
    (GENERATE + ["--extra-eos-token", NOT_UTF8], "--extra-eos-token"),
    (GENERATE + ["--extra-eos-token", EMPTY], "--extra-eos-token"),
    (GENERATE + ["--extra-eos-token", "no-such-token"], "--extra-eos-token"),
    (GENERATE + ["--extra-eos-token", "-1"], "--extra-eos-token"),
    (GENERATE + ["--extra-eos-token", BIG], "--extra-eos-token"),
    (GENERATE + ["--adapter-path", "{missing}"], "--adapter-path"),
    (GENERATE + ["--adapter-path", "{user}"], "--adapter-path"),
    (GENERATE + ["--adapter-path", EMPTY], "--adapter-path"),
    (GENERATE + ["--pipeline", "--speculative", "self"], "self does not run on --pip"),
    # chat
    (CHAT + ["--seed", "-1"], "--seed=-1"),
    (CHAT + ["--max-kv-size", "0"], "--max-kv-size=0"),
    (CHAT + ["--prefill-step-size", "0"], "--prefill-step-size=0"),
    (CHAT + ["--xtc-probability", "2"], "--xtc-probability=2"),
    (CHAT + ["--xtc-probability", ".5", "--xtc-threshold", ".9"], "--xtc-threshold"),
    (CHAT + ["--temp", "nan"], "--temp=nan"),
    (CHAT + ["--num-draft-tokens", "65"], "--num-draft-tokens=65"),
    (CHAT + ["--speculative", "bogus"], "--speculative"),
    (CHAT + ["--adapter-path", "{missing}"], "--adapter-path"),
    (CHAT + ["--pipeline", "--speculative", "self"], "self does not run on --pipeline"),
    # server flags, checked at start
    (SERVER + ["--prompt-cache-size", "-1"], "--prompt-cache-size=-1"),
    (SERVER + ["--prompt-cache-bytes", "lots"], "--prompt-cache-bytes"),
    (SERVER + ["--prefill-step-size", "0"], "--prefill-step-size=0"),
    (SERVER + ["--prefill-step-size", BIG], "--prefill-step-size="),
    (SERVER + ["--kv-bits", "4", "--kv-group-size", "0"], "--kv-group-size=0"),
    (SERVER + ["--max-tokens-limit", "0"], "--max-tokens-limit=0"),
    (SERVER + ["--max-request-bytes", "0"], "--max-request-bytes=0"),
    (SERVER + ["--decode-concurrency", "0"], "--decode-concurrency=0"),
    (SERVER + ["--cross-request-tokens", "-1"], "--cross-request-tokens=-1"),
    (SERVER + ["--chat-template-args", "-1"], "--chat-template-args"),
    (SERVER + ["--chat-template-args", "{"], "--chat-template-args"),
    (SERVER + ["--allow-request-models", EMPTY], "--allow-request-models"),
    (SERVER + ["--allow-request-models", "{missing}"], "--allow-request-models"),
    (SERVER + ["--temp", "-1"], "--temp=-1"),
    (SERVER + ["--max-tokens", "0"], "--max-tokens=0"),
    (SERVER + ["--port", "0"], "--port=0"),
    (SERVER + ["--port", "70000"], "--port=70000"),
    (SERVER + ["--speculative", "bogus"], "--speculative"),
    (SERVER + ["--adapter-path", "{file}"], "--adapter-path"),
    (SERVER + ["--chat-template", NOT_UTF8], "--chat-template"),
    (SERVER + ["--chat-template", "{% if %}"], "--chat-template"),
    # convert
    (["convert", "gguf", "{user}", "--out", "{new}"], "is a folder"),
    (["convert", "gguf", "{missing}", "--out", "{new}"], "GGUF file"),
    (["convert", "gguf", "{file}", "--out", "{new}"], "not a GGUF file"),
    (["convert", "gguf", "{file}", "--out", "{user}"], "--out"),
    (["convert", "gguf", "{file}"], "--out"),
    (["convert", "hf", "{file}", "--out", "{new}"], "is a file"),
    (["convert", "hf", "{user}", "--out", "{missing}/x"], "holds no model"),
    (["convert", "hf", "{llama}", "--out", "{user}"], "--out"),
    (["convert", "hf", "{llama}", "--out", "{new}", "--q-bits", "0"], "--q-bits=0"),
    (
        ["convert", "hf", "{llama}", "--out", "{new}", "--q-group-size", "7"],
        "--q-group-size=7",
    ),
    (["convert", "gguf", "{file}", "--out", "{new}", "--bogus"], "--bogus"),
    (["convert", "gguf", "{file}", "--out", "{new}", "--dtype", "x"], "--dtype"),
    # train-draft: never into the target, never over a user's folder
    (TRAIN + ["--out", "{llama}"], "--out"),
    (TRAIN + ["--out", "{llama}/draft"], "--out"),
    (TRAIN + ["--out", "{new}", "--data", "{llama}/data"], "--data"),
    (TRAIN + ["--out", "{new}", "--cache", "{llama}/cache"], "--cache"),
    (TRAIN + ["--out", "{user}"], "--out"),
    (TRAIN + ["--out", "{file}"], "--out"),
    (TRAIN + ["--out", "{new}", "--kind", "bogus"], "--kind"),
    (TRAIN + ["--out", "{new}", "--lr", "0"], "--lr"),
    (TRAIN + ["--out", "{new}", "--soft-weight", "2"], "--soft-weight"),
    (TRAIN + ["--out", "{new}", "--prompts", "{missing}"], "--prompts"),
    (TRAIN + ["--out", "{new}", "--corpus", "{missing}"], "--corpus"),
    (TRAIN + ["--out", "{new}", "--init-from", "{missing}"], "--init-from"),
    (TRAIN + ["--out", "{new}", "--self-instruct", "-1"], "--self-instruct"),
    (TRAIN + ["--out", "{new}", "--steps", "x"], "--steps"),
    (TRAIN + ["--out", "{new}", "--steps", "0"], "--steps=0"),
    (TRAIN + ["--out", "{new}", "--eval-every", "0"], "--eval-every=0"),
    (TRAIN + ["--out", "{new}", "--seed", "-1"], "--seed=-1"),
    (TRAIN + ["--out", "{new}", "--sampled-temp", "nan"], "--sampled-temp=nan"),
    (TRAIN + ["--out", "{new}", "--draft-vocab", "0"], "--draft-vocab=0"),
    (TRAIN + ["--out", "{new}", "--heldout-prompts", "-1"], "--heldout-prompts=-1"),
    (TRAIN + ["--out", "{new}", "--heldout-tokens", "0"], "--heldout-tokens=0"),
    (TRAIN + ["--out", "{new}", "--heldout-tokens", "x"], "--heldout-tokens: invalid"),
    (TRAIN + ["--out", "{new}", "--heldout-tokens", BIG], "--heldout-tokens="),
    (TRAIN + ["--out", "{new}", "--heldout-tokens", "9"], "--heldout-tokens needs"),
    (TRAIN + ["--out", "{new}", "--batch-tokens", BIG], "--batch-tokens="),
    (TRAIN + ["--out", "{new}", "--lr", "inf"], "--lr"),
    (TRAIN + ["--out", EMPTY], "--out is empty"),
    (TRAIN + ["--out", "{new}", "--self-instruct", BIG], "--self-instruct="),
    (TRAIN + ["--out", "{new}", "--rollout-steps", BIG], "--rollout-steps="),
    (
        TRAIN + ["--out", "{new}", "--kind", "eagle", "--batch-size", BIG],
        "--batch-size",
    ),
    # checked at start: the measurement after training refused them (BIG: a traceback)
    (TRAIN + ["--out", "{new}", "--eval-gammas", "0"], "--eval-gammas=0"),
    (TRAIN + ["--out", "{new}", "--eval-gammas", BIG], "--eval-gammas="),
    (TRAIN + ["--out", "{new}", "--eval-gammas", EMPTY], "--eval-gammas is empty"),
    # --data is a folder of completions, never a user's folder or a file
    (TRAIN + ["--out", "{new}", "--data", "{user}"], "--data"),
    (TRAIN + ["--out", "{new}", "--data", "{file}"], "--data {file} is a file"),
    (TRAIN + ["--out", "{new}", "--cache", "{file}"], "--cache {file} is a file"),
    # train-draft --labels written: no option that needs a forward of the target
    (TRAIN + ["--out", "{new}", "--labels", "bogus"], "--labels"),
    (
        TRAIN + ["--out", "{new}", "--labels", "written"],
        "--labels written needs --corpus",
    ),
    *(
        (
            TRAIN
            + [
                "--out",
                "{new}",
                "--corpus",
                "{missing}",
                "--labels",
                "written",
                *flags,
            ],
            field,
        )
        for flags, field in (
            (["--kind", "eagle"], "--labels written is for --kind draft"),
            (["--soft-weight", "0.5"], "--soft-weight 0.5 needs the target's laws"),
            (["--rollout-steps", "2"], "--rollout-steps 2 needs the target's laws"),
            (
                ["--feature-weight", "1"],
                "--feature-weight 1.0 needs the target's final",
            ),
            (["--keep-features", "-1"], "--keep-features -1 needs a prefill"),
        )
    ),
    # corpus
    (GROW + ["--out", EMPTY], "--out"),
    (GROW + ["--out", "{llama}"], "--out"),
    (GROW + ["--out", "{user}"], "--out"),
    (GROW + ["--out", "{new}", "--tokens", "0"], "--tokens"),
    (GROW + ["--out", "{new}", "--shard-minutes", "nan"], "--shard-minutes"),
    (GROW + ["--out", "{new}", "--cap-mb", "inf"], "--cap-mb"),
    (GROW + ["--out", "{new}", "--batch-size", BIG], "--batch-size="),
    (GROW + ["--out", "{new}", "--max-tokens", BIG], "--max-tokens="),
    (GROW + ["--out", "{new}", "--self-instruct", BIG], "--self-instruct="),
    (SWEEP + ["--batch-sizes", BIG], "--batch-sizes="),
    (SWEEP + ["--batch-sizes", "8,x"], "--batch-sizes"),
    (SWEEP + ["--seconds", "nan"], "--seconds"),
    (SWEEP + ["--warmup", "-1"], "--warmup"),
    (SWEEP + ["--max-tokens", "0"], "--max-tokens"),
    (["corpus", "info", "{missing}"], "{missing}"),
    (["corpus", "bogus"], "bogus"),
    # bench
    (BENCH + ["--max-tokens", "0"], "--max-tokens=0"),
    (BENCH + ["--max-tokens", BIG], "--max-tokens="),
    (BENCH + ["--num-draft-tokens", "0"], "--num-draft-tokens=0"),
    (BENCH + ["--gamma-sweep", "0"], "--gamma-sweep=0"),
    (BENCH + ["--repeats", "0"], "--repeats=0"),
    (BENCH + ["--draws", "0"], "--draws=0"),
    (BENCH + ["--warmup", "-1"], "--warmup=-1"),
    (BENCH + ["--temps", "nan"], "--temp=nan"),
    (BENCH + ["--seed", "-1"], "seed=-1"),
    (BENCH + ["--methods", "none", "--seed", "-1"], "--seed=-1"),  # mx.random.seed
    (BENCH + ["--methods", "none", "--seed", BIG], "--seed="),
    (BENCH[:-1] + [EMPTY], "--out is empty"),  # wrote into the working folder
    (BENCH + ["--cost-curves-from", "{file}"], "--cost-curves-from {file} is not"),
    (BENCH + ["--methods", "bogus"], "bogus"),
    (BENCH + ["--prompts", "{missing}"], "--prompts"),
    (BENCH + ["--prompt-sets", "bogus"], "bogus"),
    (BENCH + ["--option", "x"], "--option"),
    (BENCH + ["--option", "tree_budget=0"], "tree_budget=0"),
    (BENCH + ["--method-draft", "bogus"], "--method-draft"),
    (BENCH + ["--cost-curves-from", "{missing}"], "--cost-curves-from"),
    (BENCH + ["--draft-model", "{missing}"], "draft model"),
    (BENCH + ["--head", "{missing}"], "--head"),
    (BENCH + ["--head", "{file}"], "--head"),
    (BENCH + ["--method-draft", "draft={missing}"], "--method-draft"),
    (BENCH[:-1] + ["{theirs}"], "--out {theirs} holds a results.json that is not"),
    # export
    (["export", "--head", "{missing}", "--model", "{llama}", "--out", "{new}"], "head"),
    (["export", "--head", "{user}", "--model", "{llama}", "--out", "{user}"], "--out"),
    (
        ["export", "--head", "{user}", "--model", "{llama}", "--out", EMPTY],
        "--out is empty",
    ),
    (
        ["export", "--head", "{user}", "--model", "{llama}", "--out", "{missing}/x"],
        "holds no head",
    ),
    # doctor
    (["doctor", "--size", "0"], "--size=0"),
    (["doctor", "--size", BIG], "--size="),
    (["doctor", "--reps", BIG], "--reps="),
    # the umbrella
    (["frobnicate"], "frobnicate"),
]
# python -m mlx_spec.bench.draft_shapes ({draft}: a distilled draft of 100 rows)
SHAPES = ["--model", "{llama}", "--corpus", "{user}"]
BAD_SHAPES = [
    (SHAPES + ["--drafts", "{missing}"], "--drafts: '{missing}' does not exist"),
    (SHAPES + ["--drafts", "{user}"], "--drafts: '{user}' holds no distilled draft"),
    (SHAPES + ["--drafts", "{draft}", "--vocabs", "101"], "--vocabs 101"),
    (SHAPES + ["--drafts", "{draft}", "--vocabs", "0"], "--vocabs=0 is out of range"),
    (SHAPES + ["--drafts", "{draft}", "--gammas", "0"], "--gammas=0 is out of range"),
    (SHAPES + ["--drafts", "{draft}", "--passes", "0"], "--passes=0 is out of range"),
    (SHAPES + ["--drafts", "{draft}", "--context", BIG], "--context="),
    (SHAPES + ["--drafts", "{draft}", "--cache", "{file}"], "--cache {file} is a"),
    # written after the study: a folder was an IsADirectoryError then
    (SHAPES + ["--drafts", "{draft}", "--out", "{user}"], "--out {user} is a"),
    (SHAPES + ["--drafts", "{draft}", "--json", "{user}"], "--json {user} is a"),
    (SHAPES + ["--drafts", "{draft}"], "--corpus: '{user}' holds no corpus"),
]
# python -m mlx_spec.bench.STUDY (study, flags, text the error line must hold);
# {served}: the serving study's folder (it writes its logs there, so not {new}).
SERVE = ["--model", "{llama}", "--quick", "--out", "{served}"]
BAD_STUDIES = [
    ("draft_free", ["--model", "{llama}", "--gammas", "0"], "--gammas=0"),
    ("draft_free", ["--model", "{llama}", "--self-gammas", "65"], "--self-gammas=65"),
    ("draft_free", ["--model", "{llama}", "--max-tokens", "-5"], "--max-tokens=-5"),
    ("draft_free", ["--model", "{llama}", "--repeats", "0"], "--repeats=0"),
    ("draft_free", ["--model", "{llama}", "--temp", "-1"], "--temp=-1"),
    ("draft_free", ["--model", "{user}"], "holds no model"),
    ("rollback", ["--archs", "bogus"], "--archs"),
    ("rollback", ["--gamma", "0"], "--gamma=0"),
    ("rollback", ["--max-tokens", "0"], "--max-tokens=0"),
    ("rollback", ["--repeats", "0"], "--repeats=0"),
    ("serve", SERVE + ["--clients", "4", "0"], "--clients must be at least 1"),
    ("serve", SERVE + ["--rss-every", "0"], "--rss-every must be at least 1"),
    ("serve", SERVE[:-1] + ["{file}"], "--out {file} is a file"),
    ("serve", ["--model", "{user}", "--out", "{served}"], "holds no model"),
    ("serve", ["--draft-model", "{missing}", "--out", "{served}"], "{missing}"),
    # the server's own one-line error, once it exits
    ("serve", SERVE + ["--method", "bogus"], "--speculative: invalid choice"),
]
UI = ["--model", "{llama}", "--no-preload"]
BAD_UI = [
    (UI + ["--port", "0"], "--port=0"),
    (UI + ["--max-tokens", "0"], "--max-tokens=0"),
    (UI + ["--prefill-step-size", "0"], "--prefill-step-size=0"),
    (UI + ["--prefill-step-size", BIG], "--prefill-step-size="),
    (UI + ["--num-draft-tokens", "0"], "--num-draft-tokens=0"),
    (UI + ["--host", "0.0.0.0"], "--host"),
    (UI + ["--auth", "nocolon"], "--auth"),
    # the models' paths are checked at start, not at the first request
    (["--model", "{missing}", "--no-preload"], "{missing}"),
    (["--model", "{file}", "--no-preload"], "is a file"),
    (["--model", "{user}", "--no-preload"], "holds no model"),
    (UI + ["--draft-model", "{missing}"], "draft model"),
]


@pytest.fixture(scope="module")
def places(checkpoints, load_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    (root / "user").mkdir()
    (root / "user" / "notes.txt").write_text("mine")
    (root / "model.gguf").write_bytes(b"not a gguf")
    for name, config in (("damaged", b"\xff{"), ("listed", b"[1, 2]")):
        (root / name).mkdir()  # a model folder whose config.json is damaged
        (root / name / "config.json").write_bytes(config)
    (root / "theirs").mkdir()  # a user's own results, not a benchmark's
    (root / "theirs" / "results.json").write_text('{"mine": 1}')
    llama = root / "llama"  # a copy: a check that failed would write into it
    shutil.copytree(checkpoints["llama"], llama)
    draft = write_draft(load_model("llama")[0], root / "draft", [1], 100)
    return {
        "llama": str(llama),
        "draft": str(draft),
        "user": str(root / "user"),
        "theirs": str(root / "theirs"),
        "damaged": str(root / "damaged"),
        "listed": str(root / "listed"),
        "served": str(root / "served"),
        "file": str(root / "model.gguf"),
        "new": str(root / "new"),
        "missing": str(root / "no-such-path"),
    }


@pytest.fixture
def no_serving(monkeypatch):
    """A server that got past its checks fails the test instead of serving."""

    def refuse(*args, **kwargs):
        raise AssertionError("started serving: a bad flag was not refused")

    monkeypatch.setattr(socketserver.BaseServer, "serve_forever", refuse)


@pytest.fixture
def deadline():
    """A bad flag that is not refused fails the test instead of running on."""

    def expire(signum, frame):
        raise TimeoutError(f"not refused within {DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _listing(folder):
    return sorted(p.name for p in Path(folder).iterdir())


def _fill(text, places):
    for name, value in places.items():
        text = text.replace("{" + name + "}", value)
    return text


def _error_prefix(argv) -> str:
    """The line begins with the command's name: ``mlx_spec bench: error: `` (or
    its console script's, ``mlx_spec.generate: error: ``; a subcommand's after it)."""
    command = argv[0] if argv[0] in cli.SUBCOMMANDS else None
    if command is None:
        return r"mlx_spec: error: "
    return rf"mlx_spec[ .]{re.escape(command)}( [a-z-]+)?: error: "


def _assert_one_line_exit_2(argv, field, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, (exit_info.value.code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert field in lines[0], lines[0]
    assert re.match(_error_prefix(argv), lines[0]), lines[0]


@pytest.mark.parametrize(
    "argv, field", BAD, ids=[" ".join(b[0][:1] + b[0][-2:]) for b in BAD]
)
def test_a_bad_invocation_exits_2_in_one_line_naming_the_field(
    places, no_serving, deadline, capsys, monkeypatch, argv, field
):
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # chat reads no turns
    target = _listing(places["llama"])
    argv = [_fill(a, places) for a in argv]
    _assert_one_line_exit_2(argv, _fill(field, places), capsys)
    assert not Path(places["missing"]).exists()  # no folder made for a refused run
    assert _listing(places["user"]) == ["notes.txt"]
    assert _listing(places["llama"]) == target
    assert (Path(places["theirs"]) / "results.json").read_text() == '{"mine": 1}'


@pytest.mark.parametrize("command", [TRAIN, GROW], ids=lambda c: " ".join(c[:2]))
def test_an_empty_out_is_named_so_from_inside_the_target_folder(
    places, deadline, capsys, monkeypatch, command
):
    """``--out ""`` is the working folder: from inside the target's folder it is
    refused as empty, not as "inside the target model"."""
    monkeypatch.chdir(places["llama"])
    argv = [_fill(a, places) for a in [*command, "--out", EMPTY]]
    _assert_one_line_exit_2(argv, "--out is empty; name a folder.", capsys)


@pytest.mark.parametrize("command", [GENERATE, CHAT, SERVER], ids=lambda c: c[0])
@pytest.mark.parametrize(
    "draft, field",
    [
        ("{missing}", "draft model path '{missing}' does not exist"),
        ("{file}", "draft model path '{file}' is a file"),
        ("{user}", "draft model path '{user}' holds no model"),
    ],
)
def test_a_bad_draft_model_path_is_refused_before_the_target_loads(
    places, no_serving, deadline, capsys, monkeypatch, command, draft, field
):
    import mlx_lm

    def load(*args, **kwargs):
        raise AssertionError("the target loaded before --draft-model was checked")

    monkeypatch.setattr(mlx_lm, "load", load)
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))
    argv = [_fill(a, places) for a in [*command, "--draft-model", draft]]
    _assert_one_line_exit_2(argv, _fill(field, places), capsys)


@pytest.mark.parametrize(
    "argv, field", BAD_SHAPES, ids=[" ".join(b[0][-2:]) for b in BAD_SHAPES]
)
def test_a_bad_draft_shapes_flag_exits_2_in_one_line_naming_it(
    places, deadline, capsys, argv, field
):
    from mlx_spec.bench import draft_shapes

    kept = {name: _listing(places[name]) for name in ("user", "llama", "draft")}
    with pytest.raises(SystemExit) as exit_info:
        draft_shapes.main([_fill(a, places) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert _fill(field, places) in err and "Traceback" not in err, err
    assert err.startswith(f"{draft_shapes.PROG}: error: "), err
    assert {name: _listing(places[name]) for name in kept} == kept


@pytest.mark.parametrize(
    "study, argv, field",
    BAD_STUDIES,
    ids=[" ".join([b[0], *b[1][-2:]]) for b in BAD_STUDIES],
)
def test_a_bad_study_flag_exits_in_one_line_naming_it(
    places, deadline, capsys, study, argv, field
):
    import importlib

    module = importlib.import_module(f"mlx_spec.bench.{study}")
    with pytest.raises(SystemExit) as exit_info:
        module.main([_fill(a, places) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code in (1, 2) and len(err.splitlines()) == 1, err
    assert _fill(field, places) in err and "Traceback" not in err, err
    assert err.startswith(f"python -m mlx_spec.bench.{study}: error: "), err
    assert _listing(places["user"]) == ["notes.txt"]


@pytest.mark.parametrize(
    "argv, field", BAD_UI, ids=[" ".join(b[0][-2:]) for b in BAD_UI]
)
def test_a_bad_ui_flag_exits_2_in_one_line_naming_it(
    places, deadline, capsys, monkeypatch, argv, field
):
    gradio = pytest.importorskip("gradio")
    import mlx_lm

    from ui.app import main as ui_main  # this checkout's (mlx_spec.ui when installed)

    def refuse(*args, **kwargs):
        raise AssertionError("loaded or served: a bad flag was not refused at start")

    monkeypatch.setattr(gradio.Blocks, "launch", refuse)
    monkeypatch.setattr(mlx_lm, "load", refuse)  # --no-preload loads nothing
    with pytest.raises(SystemExit) as exit_info:
        ui_main([_fill(a, places) for a in argv], prog="mlx_spec ui")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert _fill(field, places) in err and "Traceback" not in err, err
    assert re.match(_error_prefix(["ui"]), err), err
