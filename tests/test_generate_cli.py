"""``mlx_spec.generate``: mlx_lm-compatible output, stats JSON and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlx_spec.cli.generate import main
from mlx_spec.engine import speculative_generate_step
from mlx_spec.loading import ADAPTER_FILES

REPO = Path(__file__).resolve().parent.parent


def run_cli(argv, capsys):
    """Run the command in-process; return (exit code, stdout, stderr)."""
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def model_args(checkpoints, target="llama", draft="llama-near"):
    return [
        "--model",
        str(checkpoints[target]),
        "--draft-model",
        str(checkpoints[draft]),
    ]


def test_cli_output_format_and_stats_json(checkpoints, capsys, tmp_path):
    stats_path = tmp_path / "stats.json"
    code, out, err = run_cli(
        model_args(checkpoints)
        + [
            "--prompt",
            "def fibonacci(n):",
            "--max-tokens",
            "24",
            "--stats-json",
            str(stats_path),
            "--ignore-chat-template",
        ],
        capsys,
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "=========="
    assert out.count("==========\n") == 2
    assert any(
        line.startswith("Prompt: ") and "tokens-per-sec" in line for line in lines
    )
    assert any(line.startswith("Generation: 24 tokens") for line in lines)
    assert any(line.startswith("Speculation: auto") for line in lines)
    stats = json.loads(stats_path.read_text())
    for key in (
        "method",
        "generated_tokens",
        "target_forwards",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "tokens_per_target_forward",
        "generation_tps",
    ):
        assert key in stats
    assert stats["method"] == "auto" and stats["generated_tokens"] == 24
    assert stats["tokens_per_target_forward"] == pytest.approx(
        24 / stats["target_forwards"]
    )


def test_cli_text_equals_plain_decoding(checkpoints, capsys, load_model):
    model, tokenizer = load_model("qwen2")
    prompt = "import os\nimport sys\n"
    ids = tokenizer.encode(prompt)
    expected = tokenizer.decode(
        [t for t, _ in generate_step(mx.array(ids), model, max_tokens=30)]
    )
    for method in ("none", "draft", "tree"):
        code, out, err = run_cli(
            model_args(checkpoints, "qwen2", "qwen2-near")
            + [
                "--prompt",
                prompt.replace("\n", "\\n"),
                "--max-tokens",
                "30",
                "--ignore-chat-template",
                "--speculative",
                method,
                "--verbose",
                "False",
            ],
            capsys,
        )
        assert code == 0, err
        assert out == expected + "\n", method


def test_cli_same_text_as_mlx_lm_generate_command(checkpoints):
    """The real console commands, side by side, print the same text."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    common = [
        "--model",
        str(checkpoints["llama"]),
        "--prompt",
        "class Parser:",
        "--max-tokens",
        "20",
        "--ignore-chat-template",
        "--verbose",
        "False",
    ]
    ours = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_spec.generate",
            *common,
            "--draft-model",
            str(checkpoints["llama-near"]),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    theirs = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", *common],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ours.returncode == 0, ours.stderr
    assert theirs.returncode == 0, theirs.stderr
    assert ours.stdout == theirs.stdout
    assert "Traceback" not in ours.stderr


BAD_INPUTS = [
    (["--num-draft-tokens", "0"], "num-draft-tokens"),
    (["--num-draft-tokens", "65"], "num-draft-tokens"),
    (["--temp", "-0.5"], "temp"),
    (["--top-p", "-0.1"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--max-tokens", "0"], "max-tokens"),
    (["--prompt", ""], "prompt is empty"),
    (
        ["--speculative", "tree", "--tree-budget", "0"],
        "--tree-budget=0 is out of range",
    ),
    (["--speculative", "tree", "--tree-choices", "[[0], [1"], "tree_choices"),
    (
        ["--stats-json", "/no/such/folder/stats.json"],
        "folder /no/such/folder does not exist",
    ),
    (
        [
            "--speculative",
            "draft",
            "--draft-model",
            str(REPO / "models" / "smollm2-135m-eagle"),
        ],
        "needs a draft model, not the eagle head given; use --speculative eagle or eagle-chain.",
    ),
]


@pytest.mark.parametrize("extra, needle", BAD_INPUTS, ids=[b[1] for b in BAD_INPUTS])
def test_bad_input_one_line_error(checkpoints, capsys, extra, needle):
    argv = model_args(checkpoints) + ["--prompt", "x = 1", "--max-tokens", "8"] + extra
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_non_trimmable_cache_refused(checkpoints, capsys):
    # qwen2 honours --max-kv-size with a RotatingKVCache keeping sink tokens, refused.
    argv = model_args(checkpoints, "qwen2", "qwen2-near") + [
        "--prompt",
        "x",
        "--max-kv-size",
        "16",
    ]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "RotatingKVCache" in err and "--speculative none" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(argv + ["--speculative", "none"], capsys)
    assert code == 0, err


def test_draft_with_other_tokenizer_refused(checkpoints, capsys):
    code, _, err = run_cli(
        model_args(checkpoints, "llama", "llama-othertok") + ["--prompt", "x = 1"],
        capsys,
    )
    assert code == 2 and "tokenizer differs" in err and "512" in err and "384" in err
    assert len(err.strip().splitlines()) == 1


def test_draft_output_smaller_than_vocabulary_refused(load_model):
    model, tokenizer = load_model("llama")
    small, _ = load_model("llama-othertok")  # 384 logits for a 512-token tokenizer
    with pytest.raises(ValueError) as err:
        speculative_generate_step(
            mx.array([1, 2, 3]), model, small, tokenizer_size=len(tokenizer)
        )
    assert "384" in str(err.value) and "512" in str(err.value)


@pytest.mark.parametrize("path_kind", ["missing", "empty"])
def test_bad_model_path(checkpoints, capsys, tmp_path, path_kind):
    path = tmp_path / "nothing-here" if path_kind == "missing" else tmp_path
    code, _, err = run_cli(["--model", str(path), "--prompt", "x"], capsys)
    assert code == 2 and str(path) in err
    assert (
        ("does not exist" in err)
        if path_kind == "missing"
        else ("holds no model" in err)
    )
    assert len(err.strip().splitlines()) == 1


def test_bad_input_as_a_real_process_has_no_traceback(checkpoints):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_spec.generate",
            *model_args(checkpoints),
            "--temp",
            "-1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("method", ["none", "lookup", "self"])
def test_method_without_a_draft_skips_the_draft_model_with_a_note(
    checkpoints, capsys, method
):
    # A draft with another tokenizer would be refused, were it loaded.
    other = str(checkpoints["llama-othertok"])
    argv = model_args(checkpoints, "llama", "llama-othertok")
    argv += ["--prompt", "x = 1", "--max-tokens", "8", "--speculative", method]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert err.splitlines() == [
        f"note: --speculative {method} does not use a draft model; "
        f"--draft-model {other} is not loaded."
    ]
    assert out.count("==========\n") == 2 and f"Speculation: {method}" in out


def test_bad_flag_value_is_one_line_with_exit_code_2(checkpoints, capsys):
    code, out, err = run_cli(model_args(checkpoints) + ["--top-k", "many"], capsys)
    assert code == 2 and not out
    assert err.splitlines() == [
        "mlx_spec.generate: error: argument --top-k: invalid int value: 'many' "
        "(see mlx_spec.generate --help)"
    ]


def test_stdin_prompt(checkpoints, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("def main():"))
    code, out, err = run_cli(
        model_args(checkpoints)
        + ["--prompt", "-", "--max-tokens", "5", "--ignore-chat-template"],
        capsys,
    )
    assert code == 0, err and "Generation: 5 tokens" in out


def test_top_p_zero_is_off_as_in_mlx_lm(checkpoints, capsys):
    """--top-p 0 samples the whole law, exactly as --top-p 1 does."""
    argv = model_args(checkpoints) + ["--prompt", "x = 1", "--max-tokens", "12"]
    argv += ["--temp", "0.8", "--seed", "3", "--speculative", "draft"]
    outputs = []
    for top_p in ("0", "1.0"):
        code, out, err = run_cli([*argv, "--top-p", top_p], capsys)
        assert code in (0, None), err
        outputs.append(out.split("==========")[1])  # the text, not the timings
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_adapter_path_is_passed_to_mlx_lm_load(
    checkpoints, capsys, tmp_path, monkeypatch
):
    """--adapter-path keeps mlx_lm.generate's meaning (it used to be ignored)."""
    import mlx_lm

    for name in ADAPTER_FILES:  # the form is checked before the load
        (tmp_path / name).write_text("")
    passed = {}

    def load(path, **kwargs):
        passed.update(kwargs)
        raise ValueError("not loaded in this test")

    monkeypatch.setattr(mlx_lm, "load", load)
    argv = model_args(checkpoints) + ["--prompt", "x", "--max-tokens", "3"]
    code, out, err = run_cli([*argv, "--adapter-path", str(tmp_path)], capsys)
    assert code == 2 and "not loaded in this test" in err, err
    assert passed["adapter_path"] == str(tmp_path)


@pytest.mark.parametrize(
    "folder, methods",
    [
        ("smollm2-135m-draft", "draft or tree"),
        ("smollm2-135m-eagle", "eagle or eagle-chain"),
    ],
)
def test_a_drafter_folder_given_as_the_model_says_where_it_goes(
    folder, methods, capsys
):
    """A train-draft folder as --model named a missing safetensors file before."""
    path = str(Path(__file__).resolve().parents[1] / "models" / folder)
    code, _, err = run_cli(["--model", path, "--prompt", "x"], capsys)
    assert code == 2 and "\n" not in err.strip(), err
    assert "written by mlx_spec train-draft and cannot be loaded as the model" in err
    assert f"--draft-model next to its target, with --speculative {methods}." in err
