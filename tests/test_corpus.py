"""The committed distillation corpus (``mlx_spec corpus``): shard format, append-only
writes, dedupe, cap, resume after a kill and the held-out split, on a tiny target."""

import json
import signal

import numpy as np
import pytest

from mlx_spec.train import corpus_grow as G
from mlx_spec.train.corpus import Corpus, CorpusFull, Record, Shard, prompt_hash
from mlx_spec.train.corpus_cli import card_text
from mlx_spec.train.corpus_cli import main as corpus_main
from mlx_spec.train.corpus_prompts import (
    CHAT_FAMILIES,
    DEFAULT_SHARES,
    FAMILIES,
    FAMILY_NOTES,
    family_prompts,
    is_code_family,
    prompt_stream,
    turn_suffix,
)
from mlx_spec.train.prompt import Prompt, split_of

TARGET = {"model_type": "llama", "vocab_size": 300}
TOKENIZER = {"vocab_size": 300, "eos_token_ids": [2]}


def _record(i: int, heldout: bool = False, length: int = 5) -> Record:
    rng = np.random.default_rng(i)
    return Record(
        prompt=rng.integers(0, 60000, 7).astype(np.uint16),
        completion=rng.integers(0, 60000, length).astype(np.uint16),
        temp=0.7 if i % 2 else 0.0,
        prompt_set="chat" if i % 3 else "code",
        hash=prompt_hash([{"role": "user", "content": f"request {i}"}]),
        heldout=heldout,
        stopped=bool(i % 2),
    )


def _corpus(tmp_path, cap=None) -> Corpus:
    corpus = Corpus(tmp_path / "corpus", cap)
    corpus.create(TARGET, TOKENIZER)
    return corpus


def _same(a: Record, b: Record):
    assert np.array_equal(a.prompt, b.prompt)
    assert np.array_equal(a.completion, b.completion)
    assert (a.temp, a.prompt_set, a.hash, a.heldout, a.stopped) == (
        b.temp,
        b.prompt_set,
        b.hash,
        b.heldout,
        b.stopped,
    )


def test_a_shard_round_trips_its_sequences_as_uint16_ids():
    records = [_record(i, heldout=i == 3) for i in range(6)]
    shard = Shard.from_sequences(records, {"run": "r", "seconds": 1.5})
    back = Shard.from_bytes(shard.to_bytes())
    assert back.tokens.dtype == np.uint16
    assert back.meta == {"run": "r", "seconds": 1.5}
    for a, b in zip(records, back.sequences()):
        _same(a, b)
    assert back.completion_tokens == 30 and back.prompt_tokens == 42


def test_ids_that_do_not_fit_16_bits_are_refused():
    record = _record(0)
    record.prompt = np.array([70000], np.int64)
    with pytest.raises(ValueError, match="must lie in"):
        Shard.from_sequences([record], {})


def test_appending_adds_a_shard_and_never_touches_the_old_ones(tmp_path):
    corpus = _corpus(tmp_path)
    first = corpus.append([_record(0), _record(1)], {"run": "a"})
    before = first.read_bytes()
    second = corpus.append([_record(2)], {"run": "b"})
    assert [p.name for p in corpus.shard_paths()] == [
        "shard-00000.npz.xz",
        "shard-00001.npz.xz",
    ]
    assert first.read_bytes() == before and second != first
    assert [s.hash for s in corpus.sequences()] == [_record(i).hash for i in range(3)]


def test_prompts_already_stored_are_dropped(tmp_path):
    corpus = _corpus(tmp_path)
    corpus.append([_record(0), _record(1)], {})
    corpus.append([_record(1), _record(2), _record(2)], {})
    assert sorted(corpus.hashes()) == sorted(_record(i).hash for i in range(3))
    assert sum(1 for _ in corpus.sequences()) == 3
    with pytest.raises(ValueError, match="already in the corpus"):
        corpus.append([_record(0)], {})
    assert len(corpus.shard_paths()) == 2


def test_the_cap_refuses_a_shard_that_would_pass_it(tmp_path):
    corpus = _corpus(tmp_path)
    corpus.append([_record(0)], {})
    small = Corpus(corpus.folder, cap_bytes=corpus.size_bytes() + 10)
    with pytest.raises(CorpusFull, match="cap"):
        small.append([_record(1, length=400)], {})
    assert len(small.shard_paths()) == 1


def test_a_damaged_shard_is_named_in_one_line(tmp_path):
    corpus = _corpus(tmp_path)
    path = corpus.append([_record(0)], {})
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="shard-00000.npz.xz' is damaged"):
        list(corpus.sequences())


@pytest.mark.parametrize(
    "manifest", [b"[]", b'"corpus"', b"\xff\xfe{}"], ids=["list", "text", "not-utf8"]
)
def test_a_damaged_manifest_is_named_in_one_line(tmp_path, capsys, manifest):
    corpus = _corpus(tmp_path)
    (corpus.folder / "corpus.json").write_bytes(manifest)
    with pytest.raises(SystemExit) as e:
        corpus_main(["info", str(corpus.folder)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "corpus.json' is not a" in err and "Traceback" not in err, err
    assert (corpus.folder / "corpus.json").read_bytes() == manifest


def test_the_heldout_split_is_never_among_the_training_sequences(tmp_path):
    corpus = _corpus(tmp_path)
    corpus.append([_record(i, heldout=i % 4 == 0) for i in range(12)], {})
    train = list(corpus.sequences("train"))
    heldout = list(corpus.sequences("heldout"))
    assert len(train) == 9 and len(heldout) == 3
    assert not {s.hash for s in train} & {s.hash for s in heldout}
    assert not any(s.heldout for s in train)


def test_the_prompt_stream_is_fixed_and_splits_by_source():
    stream = prompt_stream(0)
    again = prompt_stream(0)
    assert [p.text for p in stream[:300]] == [p.text for p in again[:300]]
    families = {p.prompt_set for p in stream}
    assert {
        "long",
        "polyglot",
        "json",
        "rewrite",
        "chat",
        "code",
        "advice",
        "tasks",
    } <= families
    hashes = [prompt_hash(p.messages) for p in stream]
    assert len(set(hashes)) == len(hashes)
    heldout = [p for p in stream if split_of(p.source) == "heldout"]
    assert 0.02 < len(heldout) / len(stream) < 0.15


def test_the_stream_follows_the_shares_of_its_families():
    head = prompt_stream(0)[:2000]
    for name, share in DEFAULT_SHARES.items():
        count = sum(p.prompt_set == name for p in head)
        assert abs(count - 2000 * share) <= 1, name


def test_the_advice_family_is_thousands_of_distinct_situational_prompts():
    advice = family_prompts("advice")
    texts = [p.text for p in advice]
    assert len(advice) >= 7000  # 7,364 measured
    assert len(set(texts)) == len(texts)
    assert all(p.prompt_set == "advice" for p in advice)
    assert all(p.source.startswith("advice:") for p in advice)
    assert len({p.source for p in advice}) >= 400  # 418 situations
    assert not any("{" in t or "}" in t or "  " in t for t in texts)
    # Asked in the first person, and with varied openings.
    openings = {t.split()[0] for t in texts}
    assert {"I", "My", "We", "Our", "Can", "How"} <= openings
    assert not is_code_family("advice") and "advice" in CHAT_FAMILIES
    assert family_prompts("advice") == advice  # fixed order, for resuming


def test_no_heldout_advice_situation_trains():
    advice = family_prompts("advice")
    heldout = {p.source for p in advice if split_of(p.source) == "heldout"}
    train = {p.source for p in advice} - heldout
    assert heldout and train
    assert 0.02 < len(heldout) / (len(heldout) + len(train)) < 0.15

    class Tokenizer:
        chat_template = None

        def encode(self, text):
            return [len(text)]

    jobs = list(G.template_jobs(Tokenizer(), advice, set(), {0.0: 1.0}))
    assert [j.heldout for j in jobs] == [p.source in heldout for p in advice]


def _share_no_passage_with_the_judges(family: str):
    """No prompt of ``family`` is another family's, nor shares a request or a
    passage of 40 characters with the benchmark suites or heldout.jsonl."""
    from pathlib import Path

    from mlx_spec.bench.prompts import load_prompt_file, prompt_suite

    mine = {" ".join(p.text.lower().split()) for p in family_prompts(family)}
    for name in DEFAULT_SHARES:
        if name != family:
            assert not mine & {p.text.lower() for p in family_prompts(name)}, name
    heldout = Path(__file__).resolve().parent.parent / "benchmarks" / "heldout.jsonl"
    judges = prompt_suite(chat=True) + prompt_suite(chat=False)
    judges += load_prompt_file(str(heldout))
    for judge in judges:
        theirs = " ".join(judge.user_text().lower().split())
        pieces = {theirs[i : i + 40] for i in range(0, max(len(theirs) - 40, 1), 20)}
        clashes = sum(any(piece in t for piece in pieces) for t in mine)
        assert not clashes, (judge.name, clashes)


def test_advice_prompts_are_neither_other_families_nor_benchmark_prompts():
    _share_no_passage_with_the_judges("advice")


def test_the_tasks_family_asks_for_everyday_code_in_many_languages():
    tasks = family_prompts("tasks")
    texts = [p.text for p in tasks]
    assert len(tasks) >= 900  # 904
    assert len(set(texts)) == len(texts)
    assert all(p.prompt_set == "tasks" for p in tasks)
    assert not any("{" in t or "}" in t or "  " in t for t in texts)
    assert {"Python", "JavaScript", "Go", "Rust", "SQL", "Bash"} <= {
        w.strip("?,.") for t in texts for w in t.split()
    }
    # A held-out task is held out in every language it is asked in.
    heldout = {p.source for p in tasks if split_of(p.source) == "heldout"}
    assert 0.02 < len(heldout) / len({p.source for p in tasks}) < 0.15
    assert is_code_family("tasks") and "tasks" not in CHAT_FAMILIES
    _share_no_passage_with_the_judges("tasks")


def test_the_card_says_what_each_family_asks(tmp_path):
    assert set(FAMILY_NOTES) == set(FAMILIES)
    corpus = _corpus(tmp_path)
    record = _record(0)
    record.prompt_set = "advice"
    corpus.append([record, _record(1)], {"run": "r", "seconds": 1.0})
    card = card_text(corpus.summary(), corpus.manifest())
    assert f"| advice | {FAMILY_NOTES['advice']} | 1 | 5 |" in card
    assert f"| chat | {FAMILY_NOTES['chat']} | 1 | 5 |" in card


def _grower(model, tokenizer, corpus, **options):
    """A quiet grower of small batches and short completions; ``options`` override."""
    options = {"batch_size": 3, "max_tokens": 6, "log": lambda s: None, **options}
    return G.Grower(model, tokenizer, corpus, **options)


def _grow(model, tokenizer, corpus, prompts, **kw):
    temps = {0.0: 0.5, 1.0: 0.5}
    jobs = G.template_jobs(tokenizer, prompts, corpus.hashes(), temps)
    grower = _grower(model, tokenizer, corpus, **kw)
    return grower, grower.grow(jobs)


def _prompts(n, offset=0):
    return [
        Prompt("chat", ({"role": "user", "content": f"say {i} things"},), f"t{i}")
        for i in range(offset, offset + n)
    ]


def test_shards_wait_for_enough_sequences_and_count_every_decoded_token(
    load_model, tmp_path
):
    model, tokenizer = load_model("llama")
    corpus = _corpus(tmp_path)
    jobs = G.template_jobs(tokenizer, _prompts(7), set(), {0.0: 1.0})
    grower = _grower(
        model, tokenizer, corpus, batch_size=2, shard_seconds=0.0, min_shard_sequences=3
    )
    grower.grow(jobs)
    sizes = [len(s) for s in corpus.shards()]
    assert sum(sizes) == 7 and all(n >= 3 for n in sizes[:-1]) and len(sizes) >= 2
    # Every decoded token is counted once; a run leaves no row unfinished.
    decoded = sum(s.meta["decoded_tokens"] for s in corpus.shards())
    assert decoded == sum(s.completion_tokens for s in corpus.shards())
    # Each shard keeps the CPU time spent on it, for a rate that pauses do not stretch.
    assert all(s.meta["cpu_seconds"] > 0 for s in corpus.shards())


def test_grow_writes_greedy_completions_of_the_target(load_model, tmp_path):
    from mlx_lm import generate

    model, tokenizer = load_model("llama")
    corpus = _corpus(tmp_path)
    _, made = _grow(model, tokenizer, corpus, _prompts(5))
    records = list(corpus.sequences())
    assert len(records) == 5 and made == sum(len(r.completion) for r in records)
    greedy = [r for r in records if r.temp == 0]
    assert greedy
    for r in greedy:  # the stored ids are what plain mlx-lm decodes
        text = generate(model, tokenizer, [int(t) for t in r.prompt], max_tokens=6)
        assert tokenizer.decode([int(t) for t in r.completion]) == text
    # Each prompt's split is its source's.
    for i, r in _by_prompt(records):
        assert r.heldout == (split_of(f"t{i}") == "heldout")


def _by_prompt(records):
    index = {
        prompt_hash(({"role": "user", "content": f"say {i} things"},)): i
        for i in range(100)
    }
    return [(index[r.hash], r) for r in records]


def test_a_killed_run_keeps_its_shards_and_the_next_run_goes_on(load_model, tmp_path):
    model, tokenizer = load_model("llama")
    corpus = _corpus(tmp_path)

    class Killed(Exception):
        pass

    def kill_after_first_shard(line):
        raise Killed(line)

    temps = {0.0: 1.0}
    jobs = G.template_jobs(tokenizer, _prompts(9), set(), temps)
    grower = _grower(
        model,
        tokenizer,
        corpus,
        batch_size=2,
        shard_seconds=0.0,  # a shard after every finished step
        min_shard_sequences=1,
        log=kill_after_first_shard,
    )
    with pytest.raises(Killed):
        grower.grow(jobs)
    (path,) = corpus.shard_paths()
    # A shard cut short while written (a kill inside the write) is never read.
    (corpus.folder / ".shard-00001.npz.xz.999.tmp").write_bytes(b"partial")
    first = {s.hash for s in corpus.sequences()}
    assert 0 < len(first) < 9
    before = path.read_bytes()
    _grow(model, tokenizer, corpus, _prompts(9))
    hashes = [s.hash for s in corpus.sequences()]
    assert len(hashes) == len(set(hashes)) == 9
    assert set(hashes[: len(first)]) == first
    assert path.read_bytes() == before


def test_follow_ups_continue_a_stored_conversation_in_the_template(
    load_model, tmp_path
):
    _, tokenizer = load_model("llama")
    corpus = _corpus(tmp_path)
    eos = sorted(tokenizer.eos_token_ids)[0]
    answer = tokenizer.encode("a b c d e f g h i j", add_special_tokens=False)
    records = []
    for i, p in enumerate(_prompts(4)):
        ids = G.encode_messages(tokenizer, p.messages)
        completion = answer + [eos] if i != 3 else answer  # the last hit the limit
        records.append(
            Record(
                np.array(ids, np.uint16),
                np.array(completion, np.uint16),
                0.0,
                "chat",
                prompt_hash(p.messages),
                heldout=i == 1,
                stopped=i != 3,
            )
        )
    corpus.append(records, {})
    _, after = turn_suffix(tokenizer)
    jobs = G.follow_up_jobs(tokenizer, corpus, corpus.hashes(), {0.0: 1.0})
    assert len(jobs) == 3  # not the one cut at the length limit
    for job, parent in zip(jobs, records):
        assert job.prompt_set == "multiturn" and job.turns == 2
        assert job.heldout == parent.heldout
        head = [int(t) for t in parent.prompt] + answer
        assert job.ids[: len(head)] == head
        assert tokenizer.decode(job.ids[len(head) :]).endswith(after)
    # Stored, they are not asked again; at MAX_TURNS a conversation stops.
    known = corpus.hashes() | {job.hash for job in jobs}
    assert G.follow_up_jobs(tokenizer, corpus, known, {0.0: 1.0}) == []


def test_turn_suffix_joins_a_conversation_as_the_template_does(load_model):
    _, tokenizer = load_model("llama")
    between, after = turn_suffix(tokenizer)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    full = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert full.endswith("hello" + between + "more" + after)


def test_the_card_and_info_report_the_breakdown(tmp_path, capsys):
    corpus = _corpus(tmp_path)
    corpus.append(
        [_record(i, heldout=i == 0) for i in range(4)],
        {"run": "r1", "seconds": 3600.0, "batch_size": 8, "max_tokens": 512},
    )
    assert corpus_main(["info", str(corpus.folder)]) == 0
    card = (corpus.folder / "README.md").read_text()
    assert "completion tokens: 20" in card
    assert "| r1 | 1 | 20 | 1.00 | 20 | – | 8 | 512 |" in card
    assert "15 train, 5 held out" in card


def test_the_card_reports_tokens_per_cpu_hour_where_shards_kept_it(tmp_path):
    corpus = _corpus(tmp_path)
    old = {"run": "r1", "seconds": 3600.0, "decoded_tokens": 30}
    corpus.append([_record(i) for i in range(2)], old)  # written before CPU time
    corpus.append(
        [_record(i) for i in range(2, 4)],
        {"run": "r1", "seconds": 7200.0, "cpu_seconds": 1800.0, "decoded_tokens": 40},
    )
    assert corpus_main(["info", str(corpus.folder)]) == 0
    card = (corpus.folder / "README.md").read_text()
    # Wall: 70 tokens in 3 hours; CPU: 40 tokens in the half hour kept.
    assert "| r1 | 2 | 20 | 3.00 | 23 | 80 |" in card


@pytest.mark.parametrize(
    "argv, message",
    [
        (["grow", "--model", "m", "--out", "o", "--tokens", "0"], "--tokens must be"),
        (
            ["grow", "--model", "m", "--out", "o", "--max-tokens", "0"],
            "--max-tokens=0 is out of range: an integer from 1 to 2**31 - 1.",
        ),
        (
            ["sweep", "--model", "m", "--out", "o", "--max-tokens", "0"],
            "--max-tokens=0 is out of range: an integer from 1 to 2**31 - 1.",
        ),
        (
            ["grow", "--model", "m", "--out", "o", "--shard-minutes", "0"],
            "--shard-minutes",
        ),
        (
            ["grow", "--model", "m", "--out", "o", "--own-share", "1"],
            "--own-share must be in [0, 1)",
        ),
        (["info", "nowhere"], "holds no corpus"),
    ],
)
def test_bad_options_stop_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        corpus_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_grow_and_sweep_take_one_max_tokens_option():
    """The sweep times completions as long as grow's: one flag, one default."""
    import argparse

    from mlx_spec.train.corpus_cli import setup_arg_parser

    (sub,) = [
        a
        for a in setup_arg_parser()._actions
        if isinstance(a, argparse._SubParsersAction)
    ]
    flags = [
        [
            (a.default, a.help, a.type)
            for a in sub.choices[command]._actions
            if "--max-tokens" in a.option_strings
        ]
        for command in ("grow", "sweep")
    ]
    assert len(flags[0]) == 1 and flags[0] == flags[1]
    assert flags[0][0][0] == G.DEFAULT_MAX_TOKENS


def test_a_corpus_of_another_target_is_refused(
    load_model, checkpoints, tmp_path, capsys
):
    model, _ = load_model("llama")
    corpus = Corpus(tmp_path / "c")
    from mlx_spec.fingerprint import model_fingerprint

    other = dict(model_fingerprint(model), hidden_size=999)
    corpus.create(other, TOKENIZER)
    with pytest.raises(SystemExit):
        corpus_main(
            ["grow", "--model", str(checkpoints["llama"]), "--out", str(corpus.folder)]
        )
    assert "another target" in capsys.readouterr().err
    assert json.loads((corpus.folder / "corpus.json").read_text())["target"] == other


# --------------------------------------------------------------------------- #
# Training from the corpus: one prefill, cached outside git; warm starts
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def grown(load_model, tmp_path_factory):
    """A corpus of the tiny target: two shards, held-out sequences in each."""
    from mlx_spec.fingerprint import model_fingerprint

    model, tokenizer = load_model("llama")
    corpus = Corpus(tmp_path_factory.mktemp("grown") / "corpus")
    corpus.create(model_fingerprint(model), TOKENIZER, model="llama")
    prompts = _prompts(16)
    for part in (prompts[:8], prompts[8:]):
        jobs = G.template_jobs(tokenizer, part, corpus.hashes(), {0.0: 0.5, 1.0: 0.5})
        G.Grower(
            model, tokenizer, corpus, batch_size=4, max_tokens=8, log=lambda s: None
        ).grow(jobs)
    # The held-out split by source: mark a few, as held-out topics would be.
    return corpus


def _heldout_marked(corpus: Corpus, tmp_path) -> Corpus:
    """A copy of ``corpus`` whose every fourth sequence is held out."""
    copy = Corpus(tmp_path / "marked")
    copy.create(corpus.manifest()["target"], TOKENIZER, model="llama")
    for shard in corpus.shards():
        records = list(shard.sequences())
        for i, r in enumerate(records):
            r.heldout = i % 4 == 0
        copy.append(records, shard.meta)
    return copy


def _count_prefills(monkeypatch) -> list:
    """A list that gains, each time the corpus data runs a prefill, the
    sequences it prefills (token ids, as tuples)."""
    from mlx_spec.train import corpus_data

    runs = []
    real = corpus_data.teacher_data

    def counted(model, sequences, *a, **k):
        runs.append([tuple(s) for s in sequences])
        return real(model, sequences, *a, **k)

    monkeypatch.setattr(corpus_data, "teacher_data", counted)
    return runs


def test_the_prefill_gives_the_targets_laws_at_every_position(
    load_model, grown, tmp_path
):
    import mlx.core as mx

    from mlx_spec.train.corpus_data import corpus_completions

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    train = corpus_completions(model, corpus, "train", top_k=4, cache=tmp_path / "c")
    stored = list(corpus.sequences("train"))
    assert len(train) == len(stored) == 12
    for i in (0, 5, 11):
        tokens = stored[i].tokens
        assert np.array_equal(train.tokens[i], tokens)
        assert train.starts[i] == len(stored[i].prompt)
        logits = model(mx.array(tokens)[None])[0]
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        best = np.array(mx.argmax(logp, axis=-1))
        assert np.array_equal(train.law_ids[i][:, 0], best)
        top = np.array(mx.max(logp, axis=-1))
        assert np.allclose(train.law_logp[i][:, 0].astype(np.float32), top, atol=2e-2)
        assert train.features[i].shape == (len(tokens), model.args.hidden_size)
    held = corpus_completions(model, corpus, "heldout", top_k=4, cache=tmp_path / "c")
    train_ids = {t.tobytes() for t in train.tokens}
    assert len(held) == 4 and not any(t.tobytes() in train_ids for t in held.tokens)


def test_the_prefill_is_cached_per_shard_and_only_new_shards_run(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    first = corpus_data.corpus_completions(model, corpus, "train", cache=cache)
    runs = _count_prefills(monkeypatch)
    again = corpus_data.corpus_completions(model, corpus, "train", cache=cache)
    assert runs == []
    assert all(np.array_equal(a, b) for a, b in zip(first.law_ids, again.law_ids))
    assert again.temps == first.temps and again.prompt_sets == first.prompt_sets
    # A new shard: only it is prefilled.
    new = next(corpus.sequences("train"))
    new.hash += 1
    corpus.append([new], {})
    grown_more = corpus_data.corpus_completions(model, corpus, "train", cache=cache)
    assert len(runs) == 1 and len(grown_more) == len(first) + 1
    assert np.array_equal(grown_more.law_ids[-1], first.law_ids[0])


def test_sequences_within_a_budget_are_a_prefix_that_never_passes_it():
    from mlx_spec.train.corpus_data import sequences_within

    lengths = [3, 4, 5]
    assert [sequences_within(lengths, b) for b in (2, 3, 6, 7, 11, 12, 99)] == [
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]


def test_a_heldout_budget_gives_the_same_sequences_after_the_corpus_grows(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    lengths = [len(r.completion) for r in corpus.sequences("heldout")]
    assert len(lengths) == 4 and len(corpus.shard_paths()) == 2
    budget = sum(lengths[:3]) + lengths[3] - 1  # the fourth does not fit
    before = corpus_data.corpus_completions(
        model, corpus, "heldout", token_budget=budget, cache=cache
    )
    assert len(before) == 3 and before.completion_tokens == sum(lengths[:3])
    # A new shard brings more held-out sequences (new prompts, as a grown corpus would).
    more = list(corpus.sequences("heldout"))
    for r in more:
        r.hash += 1
    corpus.append(more, {})
    runs = _count_prefills(monkeypatch)
    after = corpus_data.corpus_completions(
        model, corpus, "heldout", token_budget=budget, cache=cache
    )
    assert runs == []  # served by the cache; the new shard is not even read
    assert len(after) == len(before)
    for name in ("tokens", "law_ids", "law_logp", "features"):
        pairs = zip(getattr(before, name), getattr(after, name))
        assert all(np.array_equal(a, b) for a, b in pairs), name
    assert (after.starts, after.temps, after.prompt_sets) == (
        before.starts,
        before.temps,
        before.prompt_sets,
    )
    # Without a budget the split grew; with one past it, all of it is used.
    assert (
        len(corpus_data.corpus_completions(model, corpus, "heldout", cache=cache)) == 8
    )
    whole = corpus_data.corpus_completions(
        model, corpus, "heldout", token_budget=10**9, cache=cache
    )
    assert len(whole) == 8 and len(runs) == 1  # the new shard, prefilled once


def _stage(checkpoints, model, corpus, tmp_path, *flags, out="o"):
    """The held-out data and record of train-draft's corpus stage for ``flags``."""
    from mlx_spec.train.cli_options import setup_arg_parser
    from mlx_spec.train.stages import corpus_stage

    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / out)]
    argv += ["--corpus", str(corpus.folder), "--cache", str(tmp_path / "cache")]
    args = setup_arg_parser().parse_args([*argv, *flags])
    return corpus_stage(args, model, tmp_path / out)[1:3]


def test_the_record_and_cards_say_which_heldout_sequences_measured(
    checkpoints, load_model, grown, tmp_path
):
    from mlx_spec.train.card import head_card, model_card
    from mlx_spec.train.corpus_data import DEFAULT_HELDOUT_TOKENS
    from mlx_spec.train.stages import learning_point

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    lengths = [len(r.completion) for r in corpus.sequences("heldout")]
    budget = sum(lengths[:2])
    heldout, record = _stage(
        checkpoints, model, corpus, tmp_path, "--heldout-tokens", str(budget)
    )
    assert len(heldout) == 2 and heldout.completion_tokens == budget
    assert record["heldout_budget"] == budget and record["heldout_all"] is False
    assert record["heldout_completion_tokens"] == budget
    point = learning_point("draft", record, {"alpha": 0.5}, 2)
    assert (point["heldout_tokens"], point["heldout_budget"]) == (budget, budget)
    fixed = f"the first 2 held-out sequences in shard order, {budget} completion"
    config = {"data": record}
    assert fixed in model_card(config, "c", None)
    assert fixed in head_card(config, "c")
    # The default budget passes this corpus's held-out split: all of it, and said so.
    heldout, record = _stage(checkpoints, model, corpus, tmp_path)
    assert len(heldout) == 4 and record["heldout_all"] is True
    assert record["heldout_budget"] == DEFAULT_HELDOUT_TOKENS
    text = model_card({"data": record}, "c", None)
    assert f"all 4 held-out sequences of the corpus, {sum(lengths)} completion" in text
    assert f"fewer than the budget `--heldout-tokens {DEFAULT_HELDOUT_TOKENS}`" in text


def test_a_heldout_budget_below_the_first_sequence_stops_in_one_line(
    checkpoints, grown, tmp_path, monkeypatch, capsys
):
    from mlx_spec.train.cli import main as train_main

    corpus = _heldout_marked(grown, tmp_path)
    first = len(next(corpus.sequences("heldout")).completion)
    assert first > 1
    runs = _count_prefills(monkeypatch)
    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "o")]
    argv += ["--corpus", str(corpus.folder), "--cache", str(tmp_path / "cache")]
    with pytest.raises(SystemExit) as e:
        train_main([*argv, "--heldout-tokens", str(first - 1), "--no-progress"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.splitlines() == [
        f"mlx_spec train-draft: error: --heldout-tokens {first - 1} is less than the "
        f"corpus's first held-out sequence ({first} completion tokens); raise it."
    ]
    assert runs == []  # stopped before any prefill


def test_a_resumed_run_keeps_its_heldout_budget_or_is_refused_in_one_line(
    checkpoints, grown, tmp_path, monkeypatch, capsys
):
    """Its learning-curve points are measured on one held-out set: another
    --heldout-tokens is refused before any prefill, and left out it is kept."""
    from mlx_spec.train.cli import main as train_main

    corpus = _heldout_marked(grown, tmp_path)
    lengths = [len(r.completion) for r in corpus.sequences("heldout")]
    old, new = sum(lengths[:2]), sum(lengths[:3])
    out = tmp_path / "o"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(out)]
    argv += ["--corpus", str(corpus.folder), "--cache", str(tmp_path / "cache")]
    argv += ["--steps", "2", "--eval-every", "2", "--no-progress", "--skip-eval"]
    argv += ["--draft-vocab", "64"]
    assert train_main([*argv, "--heldout-tokens", str(old)]) == 0
    state = (out / "checkpoints" / "state.json").read_bytes()
    runs = _count_prefills(monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_main([*argv, "--heldout-tokens", str(new)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0] == (
        f"mlx_spec train-draft: error: --heldout-tokens {new} differs from the "
        f"{old} of the run checkpointed in '{out}', whose learning-curve points are "
        f"measured on that held-out set; pass --heldout-tokens {old} (or leave it "
        "out), or choose a new --out."
    )
    assert runs == [] and (out / "checkpoints" / "state.json").read_bytes() == state
    assert train_main(argv) == 0
    err = capsys.readouterr().err
    assert f"kept: --heldout-tokens={old}" in err and "resumed from step 2" in err
    curve = json.loads((out / "config.json").read_text())["data"]["learning_curve"]
    assert curve[-1]["heldout_budget"] == old


def test_one_prefill_stores_a_superset_that_serves_a_draft_and_a_head(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    head = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(0,), store_layers=(0, -1), cache=cache
    )
    width = model.args.hidden_size
    assert head.features[0].shape[1] == width
    assert all(path.stem.endswith("-f0_-1") for path in cache.glob("*.npz"))
    runs = _count_prefills(monkeypatch)
    draft = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(-1,), cache=cache
    )
    assert runs == []
    alone = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(-1,), cache=tmp_path / "alone"
    )
    assert all(np.array_equal(a, b) for a, b in zip(draft.features, alone.features))
    with pytest.raises(ValueError, match="must include"):
        corpus_data.corpus_completions(
            model, corpus, "train", feature_layers=(1,), store_layers=(0,), cache=cache
        )


@pytest.mark.parametrize(
    "kind, measures",
    [
        (
            "eagle",
            ("tokens_per_round", "conditional_by_depth", "tree_tokens_per_round"),
        ),
        (
            "medusa",
            ("tokens_per_round", "conditional_by_depth", "tree_tokens_per_round"),
        ),
        ("draft", ("alpha", "best_tokens_per_forward")),
    ],
)
def test_a_drafter_trained_on_the_corpus_warm_starts_and_keeps_its_learning_curve(
    kind, measures, checkpoints, load_model, grown, tmp_path
):
    from mlx_spec.train.cli import main as train_main
    from mlx_spec.train.corpus_data import DEFAULT_HELDOUT_TOKENS

    corpus = _heldout_marked(grown, tmp_path)
    base = [
        "--model",
        str(checkpoints["llama"]),
        "--kind",
        kind,
        "--corpus",
        str(corpus.folder),
        "--cache",
        str(tmp_path / "cache"),
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--no-progress",
        *(["--skip-eval", "--draft-vocab", "64"] if kind == "draft" else []),
    ]
    first, second = tmp_path / "h1", tmp_path / "h2"
    assert train_main([*base, "--out", str(first), "--corpus-tokens", "20"]) == 0
    assert train_main([*base, "--out", str(second), "--init-from", str(first)]) == 0
    curve = json.loads((second / "config.json").read_text())["data"]["learning_curve"]
    assert len(curve) == 2
    assert curve[0]["corpus_tokens"] < curve[1]["corpus_tokens"]
    assert all(m in p for p in curve for m in measures)
    assert [p["heldout_budget"] for p in curve] == [DEFAULT_HELDOUT_TOKENS] * 2
    card = (second / "README.md").read_text()
    point = f"| {curve[1]['corpus_tokens']} | {curve[1]['heldout_tokens']} |"
    assert "Learning curve" in card and point in card  # the held-out size beside it
    if kind != "draft":  # heads: chain and tree τ on the held-out split
        assert "| τ (chain) |" in card and "| τ (tree) |" in card
        assert "per round of a static tree of 24 nodes fitted to them" in card
    assert "first held-out sequences in shard order" in card
    # Each run's shards are on its point and card: the first ones, then all.
    assert (
        curve[0]["shards"] != curve[1]["shards"] == f"0-{len(corpus.shard_paths()) - 1}"
    )
    assert [p["seen_tokens"] for p in curve] == [p["corpus_tokens"] for p in curve]
    assert f"trained on shards {curve[1]['shards']}, the first in order" in card.lower()
    # The recipe of the run the chain began with stays, through any number of warm starts.
    began = json.loads((first / "config.json").read_text())
    third = tmp_path / "h3"
    assert train_main([*base, "--out", str(third), "--init-from", str(second)]) == 0
    for head in (second, third):
        origin = json.loads((head / "config.json").read_text())["origin"]
        assert origin == {
            "recipe": began["training"]["config"],
            "command": began["command"],
        }
    assert f"began with `{began['command']}`" in (third / "README.md").read_text()


def test_keep_features_prefills_the_corpus_once_for_a_head_and_a_draft(
    checkpoints, grown, tmp_path, capsys
):
    from mlx_spec.train.cli import main as train_main

    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    base = ["--model", str(checkpoints["llama"]), "--corpus", str(corpus.folder)]
    base += ["--cache", str(cache), "--no-progress", "--data-only"]
    argv = [
        *base,
        "--kind",
        "eagle",
        "--feature-layers",
        "0",
        "--out",
        str(tmp_path / "h"),
    ]
    assert train_main([*argv, "--keep-features", "0,-1"]) == 0
    assert {p.stem.rsplit("-f", 1)[1] for p in cache.glob("*.npz")} == {"0_-1"}
    made = sorted(cache.glob("*.npz"))
    draft = [*base, "--kind", "draft", "--out", str(tmp_path / "d")]
    assert train_main(draft) == 0
    assert sorted(cache.glob("*.npz")) == made  # the draft read the head's prefill
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_main([*argv, "--keep-features", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--keep-features -1 must include" in err[0]


def test_the_sweep_records_speed_by_batch_size_and_grow_uses_the_fastest(
    checkpoints, tmp_path, monkeypatch, capsys
):
    folder = tmp_path / "corpus"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(folder)]
    assert (
        corpus_main(
            [
                "sweep",
                *argv,
                "--batch-sizes",
                "1,3",
                "--seconds",
                "0.3",
                "--warmup",
                "0",
            ]
        )
        == 0
    )
    measured = json.loads((folder / "sweep.json").read_text())
    assert [r["batch_size"] for r in measured["rows"]] == [1, 3]
    assert all(r["tokens"] > 0 and r["tokens_per_cpu_s"] > 0 for r in measured["rows"])
    assert measured["best"] == G.best_batch(measured["rows"])
    used = []

    class Spy(G.Grower):
        def grow(self, jobs, tokens=None):
            used.append(self.batch_size)
            return 0

    monkeypatch.setattr(G, "Grower", Spy)
    before = signal.getsignal(signal.SIGTERM)
    assert corpus_main(["grow", *argv, "--self-instruct", "0", "--tokens", "5"]) == 0
    assert used == [measured["best"]]
    assert signal.getsignal(signal.SIGTERM) is before  # grow's own handler is gone
    assert "| 3 |" in (folder / "README.md").read_text()


def test_ctrl_c_while_growing_exits_130_in_one_line(
    checkpoints, tmp_path, monkeypatch, capsys
):
    class Pressed(G.Grower):
        def grow(self, jobs, tokens=None):
            raise KeyboardInterrupt

    monkeypatch.setattr(G, "Grower", Pressed)
    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "c")]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        corpus_main(["grow", *argv, "--self-instruct", "0", "--tokens", "5"])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "mlx_spec corpus: interrupted; the shards written are kept."


def test_bad_batch_sizes_stop_in_one_line(capsys):
    with pytest.raises(SystemExit):
        corpus_main(["sweep", "--model", "m", "--out", "o", "--batch-sizes", "8,x"])
    assert "comma-separated integers" in capsys.readouterr().err


@pytest.mark.parametrize("max_tokens", [2, 1000])
def test_the_sweep_times_after_its_warmup_and_replaces_finished_rows(
    load_model, max_tokens
):
    """Each fake clock read is a second: one untimed step after the first, then
    two timed steps of all 32 rows, whether rows go on or finish every 2 steps
    and are replaced at once."""
    model, tokenizer = load_model("llama")
    ticks = iter(range(10**6))
    row = G.measure_batch(
        model,
        tokenizer,
        [list(range(3, 40)), list(range(5, 30))],
        32,
        3,
        warmup=2,
        max_tokens=max_tokens,
        temps={0.0: 1.0},
        clock=lambda: float(next(ticks)),
    )
    assert row["tokens"] == 32 * 2


def test_a_laws_only_request_reuses_a_heads_prefill_and_selects_its_layers(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    wide = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(0, -1), cache=cache
    )
    runs = _count_prefills(monkeypatch)
    laws = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(), cache=cache
    )
    final = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(-1,), cache=cache
    )
    assert runs == [] and laws.features is None
    assert all(np.array_equal(a, b) for a, b in zip(wide.law_ids, laws.law_ids))
    width = model.args.hidden_size
    for a, b in zip(wide.features, final.features):
        assert np.array_equal(a[:, width:], b)
    # A layer the cache lacks is prefilled anew, and laws alone prefill without features.
    corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(1,), cache=cache
    )
    assert sum(map(len, runs)) == len(wide)  # every shard's rows, anew
    fresh = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(), cache=tmp_path / "fresh"
    )
    assert all(np.array_equal(a, b) for a, b in zip(wide.law_ids, fresh.law_ids))


@pytest.mark.parametrize("share, every", [(0.5, 2), (0.25, 4), (0.1, 10)])
def test_own_requests_take_their_share_of_the_run(share, every):
    """With --own-share P, one job in 1/P is the target's own or a follow-up."""
    jobs = list(G.interleave((f"t{i}" for i in range(40)), ["own"] * 100, share))
    head = jobs[: 4 * every]
    assert head.count("own") == 4
    assert jobs.count("own") == 100 and jobs[-1] == "own"


def test_no_own_share_keeps_them_for_the_end():
    jobs = list(G.interleave(iter(["t0", "t1"]), ["own"], 0.0))
    assert jobs == ["t0", "t1", "own"]


# --------------------------------------------------------------------------- #
# --corpus-select newest: unseen shards first, then replay; only they are prefilled
# --------------------------------------------------------------------------- #


def _sharded(corpus: Corpus, tmp_path, per: int = 3) -> Corpus:
    """A copy of ``corpus`` in shards of ``per`` sequences, every fourth held out."""
    copy = Corpus(tmp_path / "sharded")
    copy.create(corpus.manifest()["target"], TOKENIZER, model="llama")
    records = list(corpus.sequences())
    for i, r in enumerate(records):
        r.heldout = i % 4 == 0
    for lo in range(0, len(records), per):
        copy.append(records[lo : lo + per], {})
    return copy


def _train_rows(corpus: Corpus, numbers) -> set:
    """Token ids (tuples) of the training sequences of the shards ``numbers``."""
    from mlx_spec.train.corpus import read_shard

    paths = corpus.shard_paths()
    return {
        tuple(r.tokens.tolist())
        for n in numbers
        for r in read_shard(paths[n]).sequences()
        if not r.heldout
    }


def _as_old_record(folder):
    """Make ``folder``'s drafter read as one trained before selections were
    recorded: no selection, and curve points without shards."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    data = config["data"]
    del data["selection"]
    for point in data["learning_curve"]:
        for key in ("shards", "new_tokens", "replay_tokens", "seen_tokens"):
            del point[key]
    path.write_text(json.dumps(config))


def test_newest_trains_on_unseen_shards_then_a_replay_and_prefills_only_them(
    checkpoints, grown, tmp_path, monkeypatch
):
    from mlx_spec.train.cli import main as train_main
    from mlx_spec.train.corpus_data import shard_train_tokens
    from mlx_spec.train.corpus_select import parse_ranges

    corpus = _sharded(grown, tmp_path)
    tokens = shard_train_tokens(corpus)
    assert len(tokens) == 6 and all(tokens.values())
    base = ["--model", str(checkpoints["llama"]), "--corpus", str(corpus.folder)]
    base += ["--steps", "2", "--eval-every", "2", "--no-progress", "--skip-eval"]
    base += ["--draft-vocab", "64"]
    first, second = tmp_path / "d1", tmp_path / "d2"
    budget = tokens[0] + tokens[1] + tokens[2] + 1  # the first four shards
    argv = [*base, "--out", str(first), "--cache", str(tmp_path / "c1")]
    assert train_main([*argv, "--corpus-tokens", str(budget)]) == 0
    _as_old_record(first)  # what it saw is found from its corpus tokens
    runs = _count_prefills(monkeypatch)
    unseen = tokens[4] + tokens[5]
    argv = [*base, "--out", str(second), "--cache", str(tmp_path / "c2")]
    argv += ["--corpus-select", "newest", "--init-from", str(first)]
    assert train_main([*argv, "--corpus-tokens", str(unseen + 1)]) == 0
    data = json.loads((second / "config.json").read_text())["data"]
    selection = data["selection"]
    chosen = parse_ranges(selection["shards"])
    assert {4, 5} < chosen and len(chosen) == 3  # both unseen, then one replayed
    (again,) = chosen - {4, 5}
    assert again in {0, 1, 2, 3}
    seen = sum(tokens[n] for n in range(4))
    assert selection == {
        "mode": "newest",
        "budget": unseen + 1,
        "shards": selection["shards"],
        "new_shards": 2,
        "new_tokens": unseen,
        "replay_shards": 1,
        "replay_tokens": tokens[again],
        "seen_tokens": seen + unseen,
        "seed": 0,
    }
    # Only the chosen shards' training sequences were prefilled (and the held-out set).
    heldout = {tuple(r.tokens.tolist()) for r in corpus.sequences("heldout")}
    prefilled = {row for run in runs for row in run} - heldout
    assert prefilled == _train_rows(corpus, chosen)
    # The curve's new point says what the run read and what the drafter has seen.
    curve = data["learning_curve"]
    assert len(curve) == 2 and "shards" not in curve[0]
    assert curve[1]["shards"] == selection["shards"]
    assert (curve[1]["new_tokens"], curve[1]["replay_tokens"]) == (
        unseen,
        tokens[again],
    )
    assert curve[1]["seen_tokens"] == seen + unseen
    card = (second / "README.md").read_text()
    assert f"trained on shards {selection['shards']} (`--corpus-select newest`" in card
    assert "2 not trained on before" in card
    assert "tokens seen" in card
    assert f"| {curve[0]['heldout_tokens']} | {seen} |" in card  # the old point
    assert f"| {curve[1]['heldout_tokens']} | {seen + unseen} |" in card


def test_a_resumed_newest_run_keeps_its_shards_after_the_corpus_grows(
    checkpoints, load_model, grown, tmp_path
):
    from mlx_spec.train.corpus_data import shard_train_tokens

    model, _ = load_model("llama")
    corpus = _sharded(grown, tmp_path)
    tokens = shard_train_tokens(corpus)
    old = tmp_path / "old"  # a drafter that read the first four shards
    old.mkdir()
    curve = [{"corpus_tokens": sum(tokens[n] for n in range(4))}]
    data = {"corpus": corpus.folder.name, "learning_curve": curve}
    (old / "config.json").write_text(json.dumps({"data": data}))
    budget = tokens[4] + tokens[5] + 1
    flags = ["--corpus-select", "newest", "--init-from", str(old)]
    flags += ["--corpus-tokens", str(budget)]
    before = _stage(checkpoints, model, corpus, tmp_path, *flags)[1]["selection"]
    assert before["replay_shards"] == 1
    # The corpus grows: a new shard, unseen, would now come before any replay.
    more = list(corpus.sequences("train"))[:2]
    for r in more:
        r.hash += 1
    corpus.append(more, {})
    again = _stage(checkpoints, model, corpus, tmp_path, *flags)[1]["selection"]
    assert again == before
    fresh = _stage(checkpoints, model, corpus, tmp_path, *flags, out="o2")[1]
    assert fresh["selection"]["shards"] == "4-6"
    assert fresh["selection"]["replay_shards"] == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--corpus-select", "newest", "--init-from", "{tmp}"],
            "--corpus-select newest needs --corpus-tokens N, the run's budget",
        ),
        (
            ["--corpus-select", "newest", "--corpus-tokens", "10"],
            "--corpus-select newest needs --init-from DIR, the drafter whose",
        ),
        (["--corpus-select", "last"], "argument --corpus-select: invalid choice"),
    ],
)
def test_bad_corpus_selections_stop_in_one_line(
    flags, message, checkpoints, grown, tmp_path, capsys
):
    from mlx_spec.train.cli import main as train_main

    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "o")]
    argv += ["--corpus", str(grown.folder)]
    flags = [f.format(tmp=tmp_path) for f in flags]
    with pytest.raises(SystemExit) as e:
        train_main([*argv, *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_corpus_select_needs_a_corpus(checkpoints, tmp_path, capsys):
    from mlx_spec.train.cli import main as train_main

    argv = ["--model", str(checkpoints["llama"]), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        train_main([*argv, "--corpus-select", "first"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.strip() == "mlx_spec train-draft: error: --corpus-select needs --corpus."


def test_shards_prefilled_together_give_each_row_its_unpadded_laws_and_features(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data
    from mlx_spec.train.head_data import teacher_data

    model, _ = load_model("llama")
    corpus = _sharded(grown, tmp_path)
    rows = list(corpus.sequences("train"))
    assert len({len(r.tokens) for r in rows}) > 1  # so shorter rows are padded
    runs = _count_prefills(monkeypatch)
    layers = (0, -1)
    together = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=layers, cache=tmp_path / "c"
    )
    assert len(runs) == 1 and len(runs[0]) == len(rows) == len(together)
    for i, r in enumerate(rows):
        alone = teacher_data(
            model, [r.tokens.tolist()], [len(r.prompt)], feature_layers=layers
        )
        assert np.array_equal(together.tokens[i], r.tokens)
        assert np.array_equal(together.law_ids[i][:, 0], alone.teacher_ids[0][:, 0])
        for got, want in (
            (together.law_logp[i], alone.teacher_logp[0]),
            (together.features[i], alone.features[0]),
        ):
            assert got.shape == want.shape
            assert np.allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)
    # Shard by shard (a group of one each), the same rows come out.
    monkeypatch.setattr(corpus_data, "PREFILL_GROUP_TOKENS", 1)
    apart = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=layers, cache=tmp_path / "apart"
    )
    assert len(runs) == 1 + len(corpus.shard_paths())
    assert together.starts == apart.starts
    for a, b in zip(together.tokens, apart.tokens):
        assert np.array_equal(a, b)
    for a, b in zip(together.law_ids, apart.law_ids):
        assert np.array_equal(a[:, 0], b[:, 0])


def test_a_newest_run_stopped_after_its_prefill_goes_on_in_the_same_folder(
    checkpoints, grown, tmp_path
):
    from mlx_spec.train.cli import main as train_main

    corpus = _sharded(grown, tmp_path)
    base = ["--model", str(checkpoints["llama"]), "--corpus", str(corpus.folder)]
    base += ["--cache", str(tmp_path / "c"), "--no-progress", "--skip-eval"]
    base += ["--steps", "2", "--eval-every", "2", "--draft-vocab", "64"]
    first = tmp_path / "d1"
    assert train_main([*base, "--out", str(first), "--corpus-tokens", "30"]) == 0
    argv = [*base, "--out", str(tmp_path / "d2"), "--init-from", str(first)]
    argv += ["--corpus-select", "newest", "--corpus-tokens", "30"]
    assert train_main([*argv, "--data-only"]) == 0  # the selection is kept in d2
    assert train_main(argv) == 0  # d2 is this command's folder, not refused
    assert (tmp_path / "d2" / "config.json").is_file()


# --------------------------------------------------------------------------- #
# --labels written: the written tokens alone, no forward of the target
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def larger(load_model, tmp_path_factory):
    """A corpus of 48 answers of up to 16 tokens, a quarter held out: enough
    for a few steps of training to show on the held-out split."""
    import mlx.core as mx

    from mlx_spec.fingerprint import model_fingerprint

    model, tokenizer = load_model("llama")
    mx.random.seed(0)  # its sampled answers do not depend on the tests before
    folder = tmp_path_factory.mktemp("larger")
    corpus = Corpus(folder / "corpus")
    corpus.create(model_fingerprint(model), TOKENIZER, model="llama")
    jobs = G.template_jobs(tokenizer, _prompts(48), set(), {0.0: 0.5, 1.0: 0.5})
    G.Grower(
        model, tokenizer, corpus, batch_size=8, max_tokens=16, log=lambda s: None
    ).grow(jobs)
    return _heldout_marked(corpus, folder)


def _count_target_forwards(monkeypatch) -> list:
    """A list that gains an entry at each forward of a target train-draft loads
    (the whole model or its inner one; the draft's own blocks are not counted)."""
    from mlx_lm.models import llama

    from mlx_spec import loading

    targets, calls = [], []
    real_load = loading.load_model

    def load(*a, **k):
        model, tokenizer = real_load(*a, **k)
        targets.extend([model, model.model])
        return model, tokenizer

    def counted(cls):
        real = cls.__call__

        def call(self, *a, **k):
            if any(self is t for t in targets):
                calls.append(type(self).__name__)
            return real(self, *a, **k)

        monkeypatch.setattr(cls, "__call__", call)

    monkeypatch.setattr(loading, "load_model", load)
    counted(llama.Model)
    counted(llama.LlamaModel)
    return calls


def test_written_labels_read_the_corpus_without_the_target(
    load_model, grown, tmp_path, monkeypatch
):
    from mlx_spec.train import corpus_data

    model, _ = load_model("llama")
    corpus = _heldout_marked(grown, tmp_path)
    cache = tmp_path / "cache"
    laws = corpus_data.corpus_completions(model, corpus, "train", cache=cache)
    runs = _count_prefills(monkeypatch)
    written = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(), laws=False, cache=tmp_path / "w"
    )
    assert runs == [] and not (tmp_path / "w").exists()  # no prefill, no cache
    assert len(written) == len(laws) == 12
    for name in ("tokens", "starts", "temps", "prompt_sets"):
        pairs = zip(getattr(written, name), getattr(laws, name))
        assert all(np.array_equal(a, b) for a, b in pairs), name
    assert all(
        ids.shape == (len(t), 0) for ids, t in zip(written.law_ids, written.tokens)
    )
    assert written.features is None
    with pytest.raises(ValueError, match="come from the target's prefill"):
        corpus_data.corpus_completions(model, corpus, "train", laws=False)


def test_written_labels_train_a_draft_with_no_forward_of_the_target(
    checkpoints, larger, tmp_path, monkeypatch
):
    from mlx_spec.train.cli import main as train_main

    corpus = larger
    calls = _count_target_forwards(monkeypatch)
    argv = ["--model", str(checkpoints["llama"]), "--corpus", str(corpus.folder)]
    argv += ["--cache", str(tmp_path / "cache"), "--no-progress", "--skip-eval"]
    argv += ["--steps", "12", "--eval-every", "6", "--lr", "5e-3"]
    argv += ["--draft-vocab", "64", "--layers", "1", "--batch-tokens", "1024"]
    assert train_main([*argv, "--out", str(tmp_path / "laws")]) == 0
    assert calls  # the spy sees the laws path's prefill
    calls.clear()
    out = tmp_path / "written"
    assert train_main([*argv, "--out", str(out), "--labels", "written"]) == 0
    assert calls == []
    config = json.loads((out / "config.json").read_text())
    tc, evals = config["training"]["config"], config["training"]["evals"]
    assert (tc["labels"], tc["soft_weight"]) == ("written", 0.0)
    assert [e["step"] for e in evals] == [0, 6, 12]
    # 36 sequences overfit fast: the best later evaluation must beat the first
    assert min(e["heldout_loss"] for e in evals[1:]) < 0.8 * evals[0]["heldout_loss"]
    assert max(e["alpha"] for e in evals[1:]) > evals[0]["alpha"], evals
    point = config["data"]["learning_curve"][-1]
    assert (point["labels"], config["data"]["labels"]) == ("written", "written")
    card = (out / "README.md").read_text()
    assert "cross-entropy of the written token alone (`--labels written`" in card
    assert "- labels: the written tokens alone" in card and "soft labels" not in card
    assert "prefill" not in card.split("## Data")[1].split("- training")[0]
    assert f"| {point['steps']} | written | {point['alpha']} |" in card
    laws_card = (tmp_path / "laws" / "README.md").read_text()
    assert f"| {point['steps']} | laws |" in laws_card
    assert "the target's laws come from one prefill" in laws_card


def test_written_labels_measure_the_same_alpha_as_the_laws_on_greedy_sequences(
    load_model, larger, tmp_path
):
    """Greedy rows' written tokens are the target's argmax (checked against the
    prefill here), so the held-out replay needs no laws: both sets measure alike."""
    from mlx_spec.train import corpus_data
    from mlx_spec.train import draft as D

    model, tokenizer = load_model("llama")
    corpus = larger
    read = dict(cache=tmp_path / "cache")
    laws = corpus_data.corpus_completions(model, corpus, "heldout", **read)
    written = corpus_data.corpus_completions(
        model, corpus, "heldout", feature_layers=(), laws=False
    )
    greedy = [i for i, t in enumerate(laws.temps) if t == 0.0]
    assert greedy and len(greedy) < len(laws)  # sampled rows are skipped
    for i in greedy:
        s = laws.starts[i]
        argmax = laws.law_ids[i][s - 1 : -1, 0]
        assert np.array_equal(argmax, laws.tokens[i][s:])
    train = corpus_data.corpus_completions(
        model, corpus, "train", feature_layers=(), laws=False
    )
    config = D.DraftTrainConfig(
        steps=6, batch_tokens=1024, lr=1e-2, warmup=2, draft_vocab=64, layers=[1]
    )
    trainer = D.DraftTrainer(model, tokenizer, train, laws, config)
    # The draft vocabulary counts the written tokens, whichever the labels.
    by_prefill = corpus_data.corpus_completions(model, corpus, "train", **read)
    assert D.DraftTrainer(model, tokenizer, by_prefill, laws, config).token_ids == (
        trainer.token_ids
    )
    for _ in range(6):
        trainer.train_step()
    by_laws = trainer.evaluate()
    trainer.heldout = written
    by_written = trainer.evaluate()
    assert 0 < by_laws["alpha"] == by_written["alpha"]
    assert by_laws["chains"] == by_written["chains"]


def test_a_resumed_run_with_other_labels_is_refused_in_one_line(
    checkpoints, grown, tmp_path, monkeypatch, capsys
):
    from mlx_spec.train.cli import main as train_main

    corpus = _heldout_marked(grown, tmp_path)
    out = tmp_path / "o"
    argv = ["--model", str(checkpoints["llama"]), "--out", str(out)]
    argv += ["--corpus", str(corpus.folder), "--cache", str(tmp_path / "cache")]
    argv += ["--steps", "2", "--eval-every", "2", "--no-progress", "--skip-eval"]
    argv += ["--draft-vocab", "64"]
    assert train_main([*argv, "--labels", "written"]) == 0
    state = (out / "checkpoints" / "state.json").read_bytes()
    runs = _count_prefills(monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_main(argv)  # --labels left out: laws
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0] == (
        "mlx_spec train-draft: error: --labels laws differs from the --labels written "
        f"of the run checkpointed in '{out}', whose loss and learning-curve points "
        "are of those labels; pass --labels written, or choose a new --out."
    )
    assert runs == [] and (out / "checkpoints" / "state.json").read_bytes() == state
    assert train_main([*argv, "--labels", "written"]) == 0
    assert "resumed from step 2" in capsys.readouterr().err
    assert runs == []
