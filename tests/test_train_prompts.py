"""The built-in drafter training prompts: large, varied, split by source, reproducible."""

import json

import pytest

from mlx_spec.train import prompts as P


@pytest.fixture(scope="module")
def pools():
    return {split: P.builtin_prompts(split) for split in P.SPLITS}


def test_every_prompt_set_is_large_and_has_a_heldout_part(pools):
    train = P.prompt_counts(pools["train"])
    heldout = P.prompt_counts(pools["heldout"])
    for name in P.PROMPT_SETS:
        assert train[name] >= 1000, (name, train[name])
        assert heldout[name] >= 20, (name, heldout[name])


def test_heldout_prompts_share_no_topic_or_module_with_training(pools):
    train_sources = {p.source for p in pools["train"]}
    heldout_sources = {p.source for p in pools["heldout"]}
    assert not train_sources & heldout_sources
    train_texts = {p.text for p in pools["train"]}
    assert not train_texts & {p.text for p in pools["heldout"]}


def test_prompts_are_distinct_and_the_same_on_every_call(pools):
    texts = [p.text for p in pools["train"]]
    assert len(set(texts)) == len(texts)
    P._BUILDERS["chat"].cache_clear()
    assert [p.text for p in P.builtin_prompts("train", ("chat",))] == [
        p.text for p in pools["train"] if p.prompt_set == "chat"
    ]


def test_a_mix_follows_its_shares_and_seed():
    mix = P.mixed_prompts(400, seed=3)
    again = P.mixed_prompts(400, seed=3)
    assert [p.text for p in mix] == [p.text for p in again]
    assert [p.text for p in P.mixed_prompts(400, seed=4)] != [p.text for p in mix]
    counts = P.prompt_counts(mix)
    assert counts == {"chat": 160, "code": 100, "editing": 80, "summarize": 60}
    # More prompts only add prompts at the end (completions made so far stay valid).
    assert [p.text for p in P.mixed_prompts(150, seed=3)] == [p.text for p in mix[:150]]


def test_code_and_editing_prompts_come_from_the_standard_library(pools):
    edits = [p for p in pools["train"] if p.prompt_set == "editing"]
    assert all("```python\n" in p.text for p in edits if "```" in p.text)
    assert all(p.source.startswith("module:") for p in edits)


def test_prompt_file_reads_prompts_and_messages(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [
        {"prompt_set": "mine", "prompt": "Say hi."},
        {"messages": [{"role": "user", "content": "Count to 3."}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = P.load_prompt_file(str(path))
    assert [p.prompt_set for p in prompts] == ["mine", "file"]
    assert prompts[1].messages == ({"role": "user", "content": "Count to 3."},)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json\n", "not valid JSON"),
        ('{"x": 1}\n', "needs 'prompt'"),
        ("\n", "no prompts"),
    ],
)
def test_bad_prompt_file_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        P.load_prompt_file(str(path))
    assert "\n" not in str(e.value)


def test_unknown_split_or_set_is_refused():
    with pytest.raises(ValueError, match="split"):
        P.builtin_prompts("test")
    with pytest.raises(ValueError, match="unknown prompt set"):
        P.builtin_prompts("train", ("poems",))
