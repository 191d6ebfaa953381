"""``python -m mlx_spec.bench.draft_shapes``: draft shapes by measured speed.

The arithmetic on hand-built match vectors, the vocabulary restriction against
the draft's own argmax, the cost measurement's shape (no timing asserted) and
the command end to end on a tiny target, corpus and drafts."""

import json

import mlx.core as mx
import numpy as np
import pytest
from draft_dirs import write_draft

from mlx_spec.bench import draft_shapes as S
from mlx_spec.drafters.distilled import build_draft
from mlx_spec.train.completions import Completions
from mlx_spec.train.corpus import Corpus, Record, prompt_hash
from mlx_spec.train.draft import greedy_matches
from mlx_spec.train.head_data import token_rows

STOPS = [0, 2]  # the tiny llama's stop tokens


# --------------------------------------------------------------------------- #
# Arithmetic
# --------------------------------------------------------------------------- #


def test_speed_divides_tokens_per_round_by_verification_and_draft_steps():
    # γ=2: rounds of 3, 3 and 1 tokens (see test_replay_chains_counts_...): τ = 7/3.
    matches = [np.array([True, True, False, True, True, True, True])]
    (row,) = S.speed_rows(matches, [2], step=0.1, verify={3: 1.3})
    assert row["tau"] == round(7 / 3, 4)
    assert row["verify"] == 1.3
    assert row["speed_here"] == pytest.approx(row["tau"] / (1.3 + 2 * 0.1))
    assert row["speed_flat"] == pytest.approx(row["tau"] / (1.0 + 2 * 0.1))


def test_no_flat_speed_past_the_width_a_forward_verifies_for_free():
    matches = [np.ones(20, bool)]
    widths = S.FLAT_VERIFY_WIDTH + 1
    verify = {w: 1.0 + 0.1 * (w - 1) for w in range(1, widths + 1)}
    rows = S.speed_rows(matches, [widths - 2, widths - 1], step=0.0, verify=verify)
    assert rows[0]["speed_flat"] is not None and rows[1]["speed_flat"] is None
    # All accepted, free drafts: τ = γ + 1 tokens for v(γ + 1) each round (the last cut).
    assert rows[0]["speed_here"] == pytest.approx(rows[0]["tau"] / verify[widths - 1])


def test_the_best_choice_is_per_column_over_every_draft_and_vocabulary():
    always = [np.ones(12, bool)]
    never = [np.zeros(12, bool)]
    verify = {w: float(w) for w in range(1, 5)}  # verification as dear as decoding
    shapes = [
        {"draft": "a", "layers": 1, "vocab": 8, "step": 0.5},
        {"draft": "b", "layers": 2, "vocab": 4, "step": 0.1},
    ]
    shapes[0]["rows"] = S.speed_rows(always, [1, 3], 0.5, verify)
    shapes[1]["rows"] = S.speed_rows(always, [1, 3], 0.1, verify)
    here = S.best_choice(shapes, "speed_here")
    flat = S.best_choice(shapes, "speed_flat")
    # Here a verified token costs a forward: γ=1 (2 tokens / 2.1); flat, γ=3 (4 / 1.3).
    assert (here["draft"], here["gamma"]) == ("b", 1)
    assert (flat["draft"], flat["gamma"], flat["vocab"]) == ("b", 3, 4)
    shapes[1]["rows"] = S.speed_rows(never, [1, 3], 0.1, verify)
    assert S.best_choice(shapes, "speed_flat")["draft"] == "a"


def test_frequent_rows_keep_the_most_frequent_tokens_and_the_stop_tokens():
    token_ids = [2, 5, 7, 9, 11]
    counts = np.zeros(16, np.int64)
    counts[[5, 7, 9, 11]] = [10, 30, 20, 5]
    assert S.frequent_rows(token_ids, counts, 2).tolist() == [2, 3]  # 7, 9
    # A stop token the draft has is always kept; one it lacks is not added.
    assert S.frequent_rows(token_ids, counts, 2, [2, 3]).tolist() == [0, 2]
    assert S.coverage([7, 9], np.array([7, 7, 9, 5])) == 0.75


# --------------------------------------------------------------------------- #
# The restriction, on a tiny draft
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def target(load_model):
    return load_model("llama")[0]


def _draft_greedy(draft, prompt, n):
    """``prompt`` followed by ``n`` tokens of the draft's own greedy decoding."""
    tokens = list(prompt)
    for _ in range(n):
        logits = draft.lm_head.subset_logits(draft.hidden(mx.array([tokens])))
        tokens.append(int(draft.lm_head.token_ids[mx.argmax(logits[0, -1])].item()))
    return np.array(tokens, np.int32)


def _completions(sequences, starts):
    K = 2
    return Completions(
        tokens=list(sequences),
        starts=list(starts),
        temps=[0.0] * len(sequences),
        prompt_sets=["chat"] * len(sequences),
        law_ids=[np.zeros((len(t), K), np.int32) for t in sequences],
        law_logp=[np.zeros((len(t), K), np.float16) for t in sequences],
    )


def test_a_smaller_vocabulary_keeps_the_matches_inside_it_and_loses_the_others(
    target,
):
    vocab = int(target.args.vocab_size)
    draft = build_draft(target, list(range(3, 131)), [1])
    ids = np.array(draft.lm_head.token_ids)
    # Completions the draft writes itself: every full-vocabulary argmax matches.
    sequences = [_draft_greedy(draft, [5 + i, 40, 77], 10) for i in range(3)]
    data = _completions(sequences, [3, 3, 3])
    written = np.concatenate([t[3:] for t in sequences])
    half = np.arange(0, len(ids), 2)  # the even rows
    full, sub = greedy_matches(
        draft, data, [[0, 1, 2]], token_rows(ids, vocab), 64, [None, half]
    )
    assert all(m.all() for m in full)
    inside = np.isin(written, ids[half])
    assert 0 < inside.sum() < len(written)  # the restriction matters here
    # Where the argmax was among the kept rows it still is; elsewhere it moved.
    assert np.array_equal(np.concatenate(sub), inside)
    # The timed step over those rows proposes what the matches assumed.
    step = S.SubsetStep(draft, half)
    logits = step(mx.array(sequences[0][None, :-1]))[0, 2:]  # (n, k/2)
    proposed = ids[half][np.array(mx.argmax(logits, axis=-1))]
    expected = sequences[0][3:]
    assert np.array_equal(proposed == expected, sub[0])


def test_costs_are_positive_in_target_forwards_for_every_width_and_step(target):
    draft = build_draft(target, list(range(64)), [1])
    steps = {"all": S.SubsetStep(draft), "half": S.SubsetStep(draft, range(32))}
    costs = S.measure_costs(target, steps, 3, context=16, passes=2)
    assert sorted(costs["verify"]) == [1, 2, 3] and costs["verify"][1] == 1.0
    assert all(v > 0 for v in costs["verify"].values())
    assert sorted(costs["step"]) == ["all", "half"]
    assert all(c > 0 for c in costs["step"].values())
    assert sorted(costs["seconds"]["target"]) == [1, 2, 3]


def test_the_spread_is_the_interquartile_range_of_the_passes():
    assert S.spread([4.0, 1.0, 3.0, 2.0]) == pytest.approx(3.25 - 1.75)
    assert S.spread([5.0]) == 0.0


# --------------------------------------------------------------------------- #
# The command, end to end
# --------------------------------------------------------------------------- #


def _record(i, heldout, temp, rng):
    return Record(
        prompt=rng.integers(3, 512, 6).astype(np.uint16),
        completion=rng.integers(3, 200, 10).astype(np.uint16),
        temp=temp,
        prompt_set="chat",
        hash=prompt_hash([{"role": "user", "content": f"request {i}"}]),
        heldout=heldout,
        stopped=False,
    )


@pytest.fixture(scope="module")
def study(target, tmp_path_factory):
    """A tiny corpus (train and held-out, greedy and sampled) and two drafts."""
    from mlx_spec.fingerprint import model_fingerprint

    root = tmp_path_factory.mktemp("shapes")
    corpus = Corpus(root / "corpus")
    corpus.create(
        model_fingerprint(target), {"vocab_size": 512, "eos_token_ids": STOPS}, "llama"
    )
    rng = np.random.default_rng(0)
    records = [_record(i, i >= 6, 0.7 if i in (4, 9) else 0.0, rng) for i in range(10)]
    corpus.append(records, {})
    return {
        "root": root,
        "corpus": corpus,
        "d1": write_draft(target, root / "d1", [1], 200),
        "d2": write_draft(target, root / "d2", [0, 1], 256),
    }


def test_train_counts_read_the_training_split_only(study):
    corpus = study["corpus"]
    counts = S.train_counts(corpus, 512)
    train = np.concatenate([r.tokens for r in corpus.sequences("train")])
    held = np.concatenate([r.tokens for r in corpus.sequences("heldout")])
    only_held = np.setdiff1d(held, train)
    assert len(only_held) and counts[only_held].sum() == 0
    assert (counts[np.unique(train)] > 0).all()


class _Stop(Exception):
    """Raised by a stand-in for the study: the test needs only its input."""


def test_heldout_tokens_measures_on_train_drafts_heldout_set(
    study, checkpoints, target, monkeypatch, tmp_path
):
    """The same --heldout-tokens N gives the same held-out sequences as
    train-draft's: N cuts inside the corpus's one shard here."""
    from mlx_spec.train.cli_options import setup_arg_parser
    from mlx_spec.train.stages import corpus_stage

    root, corpus, budget = study["root"], study["corpus"], 25
    lengths = [len(r.completion) for r in corpus.sequences("heldout")]
    assert len(corpus.shard_paths()) == 1 and lengths[0] + lengths[1] <= budget
    assert budget < lengths[0] + lengths[1] + lengths[2]
    measured = []

    def study_of(model, drafts, heldout, *args, **kwargs):
        measured.append(heldout)
        raise _Stop

    monkeypatch.setattr(S, "shape_study", study_of)
    common = ["--model", str(checkpoints["llama"]), "--corpus", str(corpus.folder)]
    common += ["--cache", str(root / "cache"), "--heldout-tokens", str(budget)]
    with pytest.raises(_Stop):
        S.main([*common, "--drafts", str(study["d1"])])
    args = setup_arg_parser().parse_args([*common, "--out", str(tmp_path / "o")])
    trained = corpus_stage(args, target, tmp_path / "o")[1]
    assert len(trained) == 2
    assert [t.tolist() for t in measured[0].tokens] == [
        t.tolist() for t in trained.tokens
    ]


def test_the_command_reports_every_draft_vocabulary_and_gamma(
    study, checkpoints, capsys
):
    root = study["root"]
    argv = ["--model", str(checkpoints["llama"]), "--corpus", str(root / "corpus")]
    argv += ["--drafts", str(study["d1"]), str(study["d2"]), "--vocabs", "100"]
    argv += ["--gammas", "1", "2", "--passes", "1", "--context", "16"]
    argv += ["--cache", str(root / "cache"), "--out", str(root / "shapes.md")]
    argv += ["--json", str(root / "shapes.json")]
    S.main(argv)
    printed = capsys.readouterr().out
    report = json.loads((root / "shapes.json").read_text())
    assert (root / "shapes.md").read_text() == printed
    got = [(s["draft"], s["layers"], s["vocab"]) for s in report["shapes"]]
    assert got == [("d1", 1, 200), ("d1", 1, 100), ("d2", 2, 256), ("d2", 2, 100)]
    assert report["heldout_sequences"] == 3  # the greedy held-out sequences
    assert report["heldout_tokens"] == 30
    for s in report["shapes"]:
        assert [r["gamma"] for r in s["rows"]] == [1, 2]
        assert 0 <= s["coverage"] <= 1 and s["step"] > 0
        assert all(r["tau"] >= 1 for r in s["rows"])
    by_key = {(s["draft"], s["vocab"]): s for s in report["shapes"]}
    assert by_key[("d1", 100)]["coverage"] <= by_key[("d1", 200)]["coverage"]
    assert sorted(report["verify"]) == ["1", "2", "3"]
    best = report["best"]["speed_flat"]
    assert "Best here" in printed and f"V = {best['vocab']}" in printed
    # One row per (draft, V), per (draft, V, set) by position (all and chat),
    # then one per (draft, V, γ).
    rows = 2 + 2 * 2 + 4
    assert printed.count("| d1 |") == rows and printed.count("| d2 |") == rows
    assert "| d1 | 100 | chat | " in printed and "α at 256+" in printed
    assert sorted(report["verify_spread"]) == ["1", "2", "3"]


def test_alpha_by_set_pools_the_matches_of_each_prompt_set():
    matches = [
        np.array([1, 1, 0, 0], bool),
        np.array([1], bool),
        np.array([0, 0], bool),
    ]
    by_set = S.alpha_by_set(matches, ["chat", "code", "chat"])
    assert by_set == {"chat": pytest.approx(2 / 6), "code": 1.0}


def test_alpha_by_band_splits_each_completion_by_position():
    matches = [np.array([1, 1, 0, 0, 1], bool), np.array([0, 1, 1], bool)]
    bands = S.alpha_by_band(matches, ["chat", "code"], (0, 2, 4))
    assert bands["chat"] == [1.0, 0.0, 1.0]
    assert bands["code"] == [0.5, 1.0, None]
    assert bands["all"] == [pytest.approx(3 / 4), pytest.approx(1 / 3), 1.0]


def test_sets_follow_the_greedy_completions_that_were_matched(study, target):
    """Sampled and empty completions have no matches: each match array's set
    is its own sequence's, not the next one's in batch order."""
    from mlx_spec.train.completions import Completions

    rng = np.random.default_rng(1)
    data = Completions()
    for temp, name, completion in ((0.7, "json", 6), (0, "code", 6), (0, "chat", 0)):
        data.tokens.append(rng.integers(3, 200, 5 + completion).astype(np.int32))
        data.starts.append(5)
        data.temps.append(temp)
        data.prompt_sets.append(name)
        data.law_ids.append(np.zeros((5 + completion, 0), np.int32))
        data.law_logp.append(np.zeros((5 + completion, 0), np.float16))
    draft = S.load_draft(str(study["d1"]), target)
    ids = np.array(draft.lm_head.token_ids)
    owners = []
    [m] = greedy_matches(
        draft, data, [[0, 1, 2]], token_rows(ids, 512), 64, owners=owners
    )
    assert owners == [1] and [len(x) for x in m] == [6]
    report = S.shape_study(
        target, {"d1": draft}, data, np.ones(512), gammas=(1,), passes=1, context=16
    )
    [shape] = report["shapes"]
    assert shape["alpha_by_set"] == {"code": pytest.approx(S.greedy_alpha(m))}
    assert list(shape["alpha_by_band"]) == ["all", "code"]


def test_prompts_measure_on_the_targets_greedy_completions_by_set(
    study, checkpoints, load_model, capsys, tmp_path
):
    """--prompts: each prompt decoded greedily as mlx-lm decodes it, α per set."""
    from mlx_lm.generate import generate_step

    from mlx_spec.bench.prompts import encode, has_chat_template, load_prompt_file

    model, tokenizer = load_model("llama")
    lines = [
        {"prompt_set": "chat", "prompt": "Tell me about the sea."},
        {"prompt_set": "code", "prompt": "def add(a, b):"},
        {"prompt_set": "chat", "prompt": "How do I boil an egg?"},
    ]
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    root = study["root"]
    argv = ["--model", str(checkpoints["llama"]), "--corpus", str(root / "corpus")]
    argv += ["--drafts", str(study["d1"]), "--prompts", str(prompts_file)]
    argv += ["--prompt-tokens", "12", "--gammas", "1", "2", "--passes", "1"]
    argv += ["--context", "16", "--json", str(tmp_path / "r.json")]
    S.main(argv)
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    # The completions are plain mlx-lm's greedy decoding, cut at 12 tokens or a stop.
    chat = has_chat_template(tokenizer)
    expected = []
    for p in load_prompt_file(str(prompts_file)):
        out = []
        ids = mx.array(encode(p, tokenizer, chat=chat))
        for token, _ in generate_step(ids, model, max_tokens=12):
            out.append(int(token))
            if out[-1] in tokenizer.eos_token_ids:
                break
        expected.append(out)
    assert report["heldout_sequences"] == 3
    assert report["heldout_tokens"] == sum(len(o) for o in expected)
    # α per set pools that set's matches: recompute them from the completions.
    draft = S.load_draft(str(study["d1"]), model)
    data = S.greedy_completions(
        model,
        [
            (p.prompt_set, encode(p, tokenizer, chat=chat))
            for p in load_prompt_file(str(prompts_file))
        ],
        list(tokenizer.eos_token_ids),
        12,
    )
    assert [t[s:].tolist() for t, s in zip(data.tokens, data.starts)] == expected
    ids = np.array(draft.lm_head.token_ids)
    [m] = greedy_matches(draft, data, [[0], [1], [2]], token_rows(ids, 512), 512)
    [shape] = report["shapes"]
    assert shape["alpha_by_set"] == {
        "chat": pytest.approx(S.greedy_alpha([m[0], m[2]])),
        "code": pytest.approx(S.greedy_alpha([m[1]])),
    }
    assert "α chat" in printed and "α code" in printed


def test_a_missing_prompts_file_is_one_line(study, checkpoints, capsys):
    root = study["root"]
    argv = ["--model", str(checkpoints["llama"]), "--corpus", str(root / "corpus")]
    argv += ["--drafts", str(study["d1"]), "--prompts", str(root / "nope.jsonl")]
    with pytest.raises(SystemExit) as e:
        S.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jsonl" in err[0] and "does not exist" in err[0]
