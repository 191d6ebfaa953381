"""``auto`` replayed on teacher-forced matches with a modelled clock (no timing)."""

import numpy as np
import pytest
from draft_dirs import write_draft

from mlx_spec.bench.auto_replay import (
    CostModel,
    corpus_records,
    family_speeds,
    main,
    markdown,
    replay_auto,
    replay_fixed,
)

CHEAP = CostModel(draft_step=0.05, verify_slope=0.01, catch_up=0.0)


def distinct_tokens(n, start=1000):
    """``n`` distinct ids: nothing for lookup to match."""
    return list(range(start, start + n))


def test_fixed_replay_accepts_each_run_and_prices_each_round():
    costs = CostModel(draft_step=0.1, verify_slope=0.1, catch_up=1.0)
    matches = np.array([1, 1, 0, 1, 0, 0], bool)
    run = replay_fixed(matches, 2, costs)
    # Rounds: 2 accepted (3 tokens), 1 accepted (2), then a plain last token.
    assert run.drafted == [2, 2, 0] and run.tokens == 6
    assert run.accepted == [2, 1, 0] and run.rejected("draft") == 1
    # The round after one that kept every draft reads 2 tokens (catch-up).
    assert run.time == pytest.approx(1.4 + (1.4 + 0.1) + 1.0)


def test_auto_drafts_long_chains_where_every_draft_is_accepted():
    tokens = distinct_tokens(20 + 200)
    run = replay_auto(tokens, 20, np.ones(200, bool), CHEAP, lookup=False)
    assert run.tokens == 200
    assert run.tokens / run.time > 2.5
    assert max(run.drafted) >= 6


def test_auto_runs_plain_rounds_where_no_draft_is_accepted():
    tokens = distinct_tokens(20 + 300)
    costs = CostModel()
    run = replay_auto(tokens, 20, np.zeros(300, bool), costs, lookup=False)
    assert run.tokens == 300
    assert run.rounds.count("plain") > 0.85 * len(run.rounds)
    assert run.tokens / run.time > 0.97


@pytest.mark.parametrize("seed", [2, 3])
def test_auto_keeps_drafting_where_catching_up_after_plain_rounds_is_dear(seed):
    """Each token a draft missed costs a draft step to catch up on (a loaded
    CPU): priced per caught-up token, not per drafting round, it does not
    make steady drafting look dear, so auto does not fall back to plain
    rounds that each make the next catch-up dearer."""
    costs = CostModel(draft_step=0.12, verify_slope=0.085, catch_up=1.0)
    matches = np.random.default_rng(seed).random(300) < 0.5
    run = replay_auto(distinct_tokens(20 + 300), 20, matches, costs, lookup=False)
    fixed = replay_fixed(matches, 1, costs)
    assert run.rounds.count("plain") < 0.1 * len(run.rounds)
    assert run.tokens / run.time > 0.95 * fixed.tokens / fixed.time > 1.1


def test_auto_copies_a_repeated_passage_with_lookup():
    passage = distinct_tokens(60, start=5000)
    prompt = distinct_tokens(10) + passage + distinct_tokens(5, start=9000)
    tokens = prompt + passage
    run = replay_auto(tokens, len(prompt), np.zeros(60, bool), CostModel())
    assert run.tokens == 60
    assert "lookup" in run.rounds
    assert run.tokens / run.time > 2.0


def test_noisy_costs_are_seeded():
    tokens = distinct_tokens(20 + 100)
    rng = np.random.default_rng(0)
    matches = rng.random(100) < 0.5
    runs = [
        replay_auto(tokens, 20, matches, noise=0.3, seed=s, lookup=False)
        for s in (1, 1, 2)
    ]
    assert runs[0].rounds == runs[1].rounds and runs[0].time == runs[1].time
    assert all(r.tokens == 100 for r in runs)


def test_family_speeds_per_family_and_overall():
    rng = np.random.default_rng(1)
    records = [
        dict(
            family=family,
            tokens=np.array(distinct_tokens(80, start=100 * i)),
            start=10,
            matches=rng.random(70) < p,
        )
        for i, (family, p) in enumerate([("high", 0.9), ("low", 0.05)])
    ]
    speeds = family_speeds(records, CostModel(), gammas=(1, 4))
    assert set(speeds) == {"high", "low", "all"}
    fitted = {"fit v(8)", "fit draft"}
    assert (
        set(speeds["all"]) == {"alpha", "auto", "γ=1", "γ=4", "lookup waste"} | fitted
    )
    assert speeds["all"]["lookup waste"] == 0.0  # nothing to copy
    assert speeds["high"]["γ=4"] > speeds["high"]["γ=1"] > 1.0
    assert speeds["low"]["γ=4"] < speeds["low"]["γ=1"] < 1.0
    # A token budget replays each record's first tokens only.
    cut = family_speeds(records[:1], CostModel(), gammas=(1,), max_tokens=30)
    first = records[0]
    alone = replay_auto(first["tokens"], 10, first["matches"][:30], max_tokens=30)
    assert cut["all"]["auto"] == pytest.approx(alone.tokens / alone.time)
    assert alone.tokens == 30
    table = markdown(speeds, CostModel())
    assert table.splitlines()[-1].startswith("| all |")
    assert "| high |" in table and "γ=4" in table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--corpus", "x", "--max-tokens", "1"], "--max-tokens must be >= 2"),
        (["--corpus", "x", "--noise", "-1"], "must be >= 0"),
        (["--corpus", "x", "--heldout-tokens", "0"], "--heldout-tokens must be >= 1"),
    ],
)
def test_bad_arguments_exit_with_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_auto_fits_the_modelled_costs_when_a_queued_step_runs_ahead():
    """Timed as a CPU times them, a plain step queued ahead runs in the round
    that queued it (two steps, then none): auto's fitted verification and
    draft step still read as the modelled costs (a prior scaled by the first
    round read verifying 8 tokens as 1.0-1.2 steps and a draft step as 0.064)."""
    costs = CostModel(draft_step=0.09, verify_slope=0.07, catch_up=1.0)
    rng = np.random.default_rng(0)
    for s in range(3):
        matches = rng.random(96) < 0.6
        run = replay_auto(
            distinct_tokens(20 + 96, start=200 * s),
            20,
            matches,
            costs,
            lookup=False,
            queued_ahead=True,
        )
        assert run.fitted["verify_by_width"][8] == pytest.approx(1.49, rel=0.05)
        assert run.fitted["draft_step"]["draft"] == pytest.approx(0.09, rel=0.08)


def _shard(corpus, n, rng):
    """A shard of 2 training and 2 held-out sequences of 10 completion tokens;
    the first held-out one of shard 0 is sampled, the others greedy."""
    from mlx_spec.train.corpus import Record, prompt_hash

    records = [
        Record(
            prompt=rng.integers(3, 512, 6).astype(np.uint16),
            completion=rng.integers(3, 200, 10).astype(np.uint16),
            temp=0.7 if (n, i) == (0, 1) else 0.0,
            prompt_set="chat" if i < 3 else "code",
            hash=prompt_hash([{"role": "user", "content": f"request {n}.{i}"}]),
            heldout=i % 2 == 1,
            stopped=False,
        )
        for i in range(4)
    ]
    corpus.append(records, {})


def test_the_corpus_replay_reads_train_drafts_heldout_set_and_only_its_shards(
    load_model, tmp_path, monkeypatch
):
    from mlx_spec.drafters.distilled import load_draft
    from mlx_spec.fingerprint import model_fingerprint
    from mlx_spec.train import corpus_data
    from mlx_spec.train.corpus import Corpus

    model = load_model("llama")[0]
    corpus = Corpus(tmp_path / "corpus")
    corpus.create(model_fingerprint(model), {"vocab_size": 512, "eos_token_ids": [2]})
    rng = np.random.default_rng(0)
    for n in range(3):
        _shard(corpus, n, rng)
    draft = load_draft(str(write_draft(model, tmp_path / "d", [1], 200)), model)
    read = []
    real = corpus_data._read
    monkeypatch.setattr(corpus_data, "_read", lambda p: read.append(p.name) or real(p))
    # 30 tokens: both held-out sequences of shard 0 and the first of shard 1.
    cache = tmp_path / "cache"
    records = corpus_records(
        model, draft, corpus, max_length=512, heldout_tokens=30, cache=cache
    )
    assert read == ["shard-00000.npz.xz", "shard-00001.npz.xz"]
    held = corpus_data.heldout_set(model, corpus, 30, feature_layers=(), cache=cache)
    assert len(held) == 3
    greedy = [i for i, temp in enumerate(held.temps) if temp == 0]
    assert sorted(r["tokens"].tolist() for r in records) == sorted(
        held.tokens[i].tolist() for i in greedy
    )
    assert all(len(r["matches"]) == 10 and r["start"] == 6 for r in records)
    with pytest.raises(ValueError, match="--heldout-tokens 9 is less than"):
        corpus_records(
            model, draft, corpus, max_length=512, heldout_tokens=9, cache=cache
        )
