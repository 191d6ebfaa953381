"""Requests written by the target itself (``train-draft --self-instruct N``): only
requests the target ends are kept, distinct, split by a hash of their text, and
a rerun reuses the file instead of sampling again."""

import json

import pytest

from mlx_spec.train import self_instruct as SI
from mlx_spec.train.prompt import split_of


def test_the_user_turn_prefix_is_the_template_before_the_users_words(load_model):
    _, tokenizer = load_model("llama")
    prefix = tokenizer.decode(SI.user_turn_prefix(tokenizer))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Plant a tree."}], tokenize=False
    )
    assert text.startswith(prefix + "Plant a tree.")
    assert prefix.endswith("user\n")


def test_requests_are_ended_distinct_split_and_resumed_from_their_file(
    load_model, tmp_path, monkeypatch
):
    model, tokenizer = load_model("llama")
    path = tmp_path / "self.jsonl"
    options = dict(progress=False, batch_size=16)
    train, heldout = SI.self_instruct_prompts(model, tokenizer, 6, path, **options)
    texts = [p.text for p in train + heldout]
    assert len(set(texts)) == 6 and all(len(t) >= SI.MIN_CHARS for t in texts)
    assert all(p.prompt_set == SI.PROMPT_SET for p in train + heldout)
    assert all(split_of(p.text) == "train" for p in train)
    assert all(split_of(p.text) == "heldout" for p in heldout)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["messages"][0]["content"] for r in rows) == sorted(texts)

    asked = []
    sample = SI.sample_requests
    monkeypatch.setattr(
        SI, "sample_requests", lambda *a, **k: asked.append(a[2]) or sample(*a, **k)
    )
    more = SI.self_instruct_prompts(model, tokenizer, 9, path, **options)
    assert asked == [3]  # only the missing ones are sampled
    file_order = [json.loads(line)["messages"][0]["content"] for line in open(path)]
    assert file_order[:6] == [r["messages"][0]["content"] for r in rows]
    assert len(set(file_order)) == 9
    assert sorted(p.text for p in more[0] + more[1]) == sorted(file_order)
    SI.self_instruct_prompts(model, tokenizer, 9, path, **options)
    assert asked == [3]  # nothing left to sample


def test_unended_requests_are_dropped_and_sampling_gives_up(load_model):
    model, tokenizer = load_model("llama")
    # Two tokens cannot end a request of at least MIN_CHARS characters.
    found = SI.sample_requests(model, tokenizer, 4, max_tokens=2, batch_size=8)
    assert found == []


def test_every_row_is_the_prefix_drawn_at_the_asked_temperature_and_nucleus(
    load_model, monkeypatch
):
    model, tokenizer = load_model("llama")
    rows = []

    class Recording(SI.LaneDecoder):
        def insert(self, ids, max_tokens, temp, top_p=1.0):
            rows.append((tuple(ids), max_tokens, temp, top_p))
            return super().insert(ids, max_tokens, temp, top_p)

    monkeypatch.setattr(SI, "LaneDecoder", Recording)
    SI.sample_requests(
        model, tokenizer, 2, temp=0.8, top_p=0.5, max_tokens=2, batch_size=4
    )
    prefix = tuple(SI.user_turn_prefix(tokenizer))
    assert len(rows) == 4 * SI.MAX_BARREN_BATCHES
    assert set(rows) == {(prefix, 2, 0.8, 0.5)}


def test_a_model_without_a_chat_template_is_refused_in_one_line(load_model):
    _, tokenizer = load_model("llama")

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="needs a chat model") as e:
        SI.user_turn_prefix(NoTemplate())
    assert "\n" not in str(e.value)
