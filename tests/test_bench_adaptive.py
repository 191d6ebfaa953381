"""mlx_spec.bench.adaptive: adaptive against fixed γ and tree budgets, and the replay.

The replay must reproduce the engine's rounds exactly under greedy decoding,
so its modelled comparison describes the same rounds the engine runs. Tree
methods sweep fixed node budgets, each capping its rounds' trees.
"""

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlx_spec import SpecConfig, SpecStats, speculative_generate_step
from mlx_spec.bench import adaptive as bench


def test_replay_advances_by_accepted_plus_one_and_respects_the_budget():
    runs = [2, 0, 5, 5, 1, 0, 3]
    seen = []
    seconds, rounds = bench.replay(
        runs, lambda: 3, lambda *a: seen.append(a), lambda g: 1.0 + g
    )
    # Rounds start at 0 (accepts 2), 3 (3), 7 = end; a γ never reaches past it.
    assert [(g, a) for g, a, _ in seen] == [(3, 2), (3, 3)]
    assert rounds == 2 and seconds == 8.0
    seen.clear()
    bench.replay([4, 4, 4], lambda: 5, lambda *a: seen.append(a), lambda g: 1.0)
    assert [(g, a) for g, a, _ in seen] == [(2, 2)]  # cut to remaining - 1


def test_interpolated_cost_is_linear_between_and_beyond_measured_gammas():
    cost = bench._interpolate_cost({1: 10.0, 2: 12.0, 4: 20.0})
    assert cost(1) == 10.0 and cost(3) == 16.0
    assert cost(6) == 28.0  # the last slope, extended
    assert cost(0) == 8.0  # the first slope, extended


@pytest.mark.parametrize("gamma", [1, 3])
def test_replay_reproduces_the_engines_greedy_rounds(load_model, gamma):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def add(a, b):")
    path = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=20)]
    runs = bench.acceptance_runs(model, draft, ids, path, depth=gamma)
    assert any(runs) and not all(r == gamma for r in runs)

    stats = SpecStats()
    config = SpecConfig(
        method="draft", num_draft_tokens=gamma, adaptive=False, max_tokens=20
    )
    out = [
        t
        for t, _, _ in speculative_generate_step(
            mx.array(ids), model, draft, config=config, stats=stats
        )
    ]
    assert out == path
    accepted = []
    _, rounds = bench.replay(
        runs, lambda: gamma, lambda g, a, c: accepted.append(a), lambda g: 1.0
    )
    assert rounds == stats.rounds
    drafted = zip(stats.accepted_per_round, stats.drafted_per_round)
    assert accepted == [a for a, d in drafted if d]


def test_end_to_end_on_test_checkpoints_reports_identity_and_replay(
    checkpoints, capsys
):
    # fmt: off
    bench.main(
        [
            "--model", str(checkpoints["llama"]),
            "--draft-model", str(checkpoints["llama-near"]),
            "--methods", "draft", "lookup",
            "--gammas", "1", "2",
            "--max-tokens", "8",
            "--repeats", "1",
            "--quick",
        ]
    )
    # fmt: on
    out = capsys.readouterr().out
    assert "greedy output identical to plain decoding in every run: yes" in out
    assert "replay reproduces the measured rounds of every fixed γ: yes" in out
    assert "draft: adaptive" in out and "lookup: adaptive" in out
    assert "replay: adaptive/best fixed" in out


def test_tree_methods_sweep_budgets_against_adaptive_with_identity(
    checkpoints, load_model, tmp_path, capsys
):
    heads = pytest.importorskip("mlx_spec.drafters.heads")
    from mlx_spec.fingerprint import model_fingerprint

    model, _ = load_model("llama")
    stored = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    for kind, extra in (("eagle", None), ("medusa", {"tree_choices": stored})):
        head = heads.random_head(kind, model, seed=3)
        heads.save_head(
            tmp_path / kind,
            kind,
            head.module,
            target_fingerprint=model_fingerprint(model),
            extra=extra,
        )
    # fmt: off
    bench.main(
        [
            "--model", str(checkpoints["llama"]),
            "--draft-model", str(checkpoints["llama-near"]),
            "--head", str(tmp_path / "eagle"),
            "--head", str(tmp_path / "medusa"),
            "--methods", "tree", "eagle", "medusa",
            "--budgets", "1", "16",
            "--max-tokens", "8",
            "--repeats", "1",
            "--quick",
            "--json", str(tmp_path / "out.json"),
        ]
    )
    # fmt: on
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "out.json").read_text())
    configs = {}
    for row in results["rows"]:
        configs.setdefault(row["method"], []).append(row["config"])
    budgets = ["budget=1", "budget=16"]
    assert configs == {
        "plain": ["plain"],
        "tree": [*budgets, "adaptive"],
        "eagle": [*budgets, "adaptive"],
        "medusa": [*budgets, "stored", "adaptive"],
    }
    drafted = {
        (r["method"], r["config"]): r["drafted_per_round"] for r in results["rows"]
    }
    # A fixed budget caps every round's tree, the stored tree set aside for
    # medusa; a one-node tree is a one-token chain.
    for method in ("tree", "eagle", "medusa"):
        assert 0 < drafted[(method, "budget=1")] <= 1
        assert drafted[(method, "budget=16")] <= 16
    assert 1 < drafted[("medusa", "stored")] <= len(stored)
    verdicts = results["verdicts"]
    assert verdicts[:3] == [line for line in out.splitlines() if ": adaptive " in line]
    verdict_of = {line.split(":")[0]: line for line in verdicts[:3]}
    assert list(verdict_of) == ["tree", "eagle", "medusa"]
    assert all("adaptive/best = " in line for line in verdicts[:3])
    # Adaptive is held to what adaptive=False runs by default.
    assert "adaptive/default budget=16 = " in verdict_of["tree"]
    assert "adaptive/default budget=16 = " in verdict_of["eagle"]
    assert "adaptive/default stored = " in verdict_of["medusa"]
    assert verdicts[3] == "greedy output identical to plain decoding in every run: yes"
    assert results["replay"] is None  # the replay is the draft method's


def test_a_head_method_without_a_head_exits_with_a_one_line_error(checkpoints, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", str(checkpoints["llama"]), "--methods", "eagle"])
    assert e.value.code == 2
    assert "--methods eagle needs --head DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gammas", "0"], "--gammas must all be >= 1"),
        (["--budgets", "4", "0"], "--budgets must all be from 1 to 256, got 0"),
        (["--methods", "mtp"], "--methods takes draft, lookup, self, tree, eagle"),
        (["--max-tokens", "1"], "--max-tokens must be >= 2"),
    ],
)
def test_bad_arguments_exit_with_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
