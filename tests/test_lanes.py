"""The corpus's lane decoder: each row decodes what plain mlx-lm decodes for it,
through lane openings, compactions and merges, and samples at its own
temperature and nucleus."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_spec.train.lanes import LaneDecoder, pick_window, prefill_alone, sample_rows


def _decode_all(decoder, prompts, max_tokens, temps=None):
    temps = temps or [0.0] * len(prompts)
    uids = [decoder.insert(p, m, t) for p, m, t in zip(prompts, max_tokens, temps)]
    out = {u: [] for u in uids}
    reasons = {}
    lanes_seen = 0
    while len(reasons) < len(uids):
        for tok in decoder.next_generated():
            assert tok.uid not in reasons, "a row decoded after it finished"
            out[tok.uid].append(tok.token)
            if tok.finish_reason:
                reasons[tok.uid] = tok.finish_reason
        lanes_seen = max(lanes_seen, len(decoder.lanes))
    assert decoder.next_generated() == [] and not decoder.lanes
    return [out[u] for u in uids], [reasons[u] for u in uids], lanes_seen


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mamba2"])
def test_each_row_is_what_plain_mlx_lm_decodes_through_lanes_and_merges(
    load_model, arch
):
    from mlx_lm.generate import generate_step

    model, _ = load_model(arch)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, n).tolist() for n in (1, 2, 9, 4, 17, 3, 12, 6, 25)]
    max_tokens = [5, 9, 3, 12, 7, 1, 10, 4, 8]
    # Each free row opens a lane, at most 2 at once: rows join as others
    # finish, and the two oldest lanes merge whenever a third would open.
    decoder = LaneDecoder(model, 4, stop_tokens=set(), lane_size=1, max_lanes=2)
    merges = []
    merge = decoder._merge_oldest
    decoder._merge_oldest = lambda: (merges.append(1), merge())
    got, reasons, lanes_seen = _decode_all(decoder, prompts, max_tokens)
    assert lanes_seen == 2 and merges and reasons == ["length"] * len(prompts)
    for prompt, m, tokens in zip(prompts, max_tokens, got):
        steps = generate_step(mx.array(prompt), model, max_tokens=m)
        assert tokens == [int(t) for t, _ in steps]


@pytest.mark.parametrize("arch", ["llama", "mamba2"])
def test_prompts_prefilled_in_chunks_decode_as_mlx_lm_with_the_same_chunks(
    load_model, arch
):
    from mlx_lm.generate import generate_step

    model, _ = load_model(arch)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 200, n).tolist() for n in (11, 4, 8)]
    decoder = LaneDecoder(model, 3, stop_tokens=set(), prefill_step=3)
    got, _, _ = _decode_all(decoder, prompts, [6] * 3)
    for prompt, tokens in zip(prompts, got):
        steps = generate_step(
            mx.array(prompt), model, max_tokens=6, prefill_step_size=3
        )
        assert tokens == [int(t) for t, _ in steps]


def test_each_prompt_is_fed_alone_in_order_in_chunks_of_at_most_the_step(load_model):
    model, _ = load_model("llama")
    prompts = [list(range(3, 10)), [], list(range(20, 23))]
    fed, seen = [], []

    def forward(tokens, cache):
        fed.append(tokens.tolist())
        return (model(tokens, cache=cache),)

    cache = prefill_alone(
        model,
        prompts,
        step_size=3,
        forward=forward,
        on_chunk=lambda row, out: seen.append((row, out[0].shape)),
    )
    assert fed == [[[3, 4, 5]], [[6, 7, 8]], [[9]], [[20, 21, 22]]]
    assert [r for r, _ in seen] == [0, 0, 0, 2]
    assert [s[1] for _, s in seen] == [3, 3, 1, 3]  # the chunk's logits
    assert cache[0].keys.shape[0] == 3  # one batch cache of the three rows


def test_a_stop_token_ends_its_row_and_is_kept(load_model):
    model, _ = load_model("llama")
    prompt = [5, 6, 7, 8]
    decoder = LaneDecoder(model, 2, stop_tokens=set())
    (free,), _, _ = _decode_all(decoder, [prompt], [6])
    stop = free[2]
    decoder = LaneDecoder(model, 2, stop_tokens={stop})
    (tokens, other), reasons, _ = _decode_all(decoder, [prompt, [9, 10]], [6, 3])
    assert tokens == free[: free.index(stop) + 1] and reasons[0] == "stop"
    assert len(other) == 3 or other[-1] == stop


def test_sampled_rows_follow_softmax_at_their_own_temperature():
    logits = mx.array([[2.0, 1.0, 0.0, -1.0, 0.5]] * 3)
    temps = mx.array([0.0, 0.7, 1.5])
    n = 20000
    draws = np.array(
        sample_rows(mx.tile(logits, (n, 1)), mx.tile(temps, (n,)))
    ).reshape(n, 3)
    assert (draws[:, 0] == 0).all()  # greedy row: the argmax
    for col, t in ((1, 0.7), (2, 1.5)):
        law = np.exp(np.array(logits[0]) / t)
        law /= law.sum()
        freq = np.bincount(draws[:, col], minlength=5) / n
        # 5 sigma of a binomial frequency over 20000 draws is below 0.018.
        assert np.abs(freq - law).max() < 0.018, (t, freq, law)


def _nucleus_law(logits, temp, top_p):
    """Law of the fewest most likely tokens holding ``top_p`` of
    softmax(logits), reweighted at ``temp``."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    order = np.argsort(-p)
    above = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
    kept = np.zeros(len(p), bool)
    kept[order[above < top_p]] = True
    law = np.where(kept, np.exp((logits - logits.max()) / temp), 0.0)
    return law / law.sum()


def test_sampled_rows_follow_the_tempered_law_over_their_own_nucleus():
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5], np.float32)
    # softmax(logits) by rank: 0.563, 0.207, 0.126, 0.076, 0.028; so 0.6 keeps
    # tokens 0 and 1, 0.8 keeps 0, 1 and 4, and 1 keeps them all.
    rows = [(0.0, 0.6), (0.7, 0.8), (1.5, 0.6), (1.0, 1.0), (1.3, 0.8)]
    temps = mx.array([t for t, _ in rows])
    top_ps = mx.array([p for _, p in rows])
    n, k = 20000, len(rows)
    draws = np.array(
        sample_rows(
            mx.tile(mx.array(logits)[None], (n * k, 1)),
            mx.tile(temps, (n,)),
            mx.tile(top_ps, (n,)),
        )
    ).reshape(n, k)
    assert (draws[:, 0] == 0).all()  # greedy row: the argmax
    for col, (t, top_p) in enumerate(rows[1:], start=1):
        law = _nucleus_law(logits, t, top_p)
        freq = np.bincount(draws[:, col], minlength=5) / n
        assert (freq[law == 0] == 0).all(), (t, top_p, freq)
        # 5 sigma of a binomial frequency over 20000 draws is below 0.018.
        assert np.abs(freq - law).max() < 0.018, (t, top_p, freq, law)


def test_a_whole_vocabulary_row_draws_as_without_a_nucleus_beside_one():
    # mlx-lm's top-p filter at 1 drops tail tokens by float rounding (a
    # quarter of a 49152-token vocabulary); such rows must keep every token.
    mx.random.seed(0)
    n, vocab = 256, 8192
    logits = mx.random.normal((n, vocab)) * 3
    temps = mx.full((n,), 3.0)
    top_ps = mx.array([1.0] * (n - 1) + [0.5])
    mx.random.seed(1)
    mixed = sample_rows(logits, temps, top_ps)
    mx.random.seed(1)
    whole = sample_rows(logits, temps)
    assert mixed[:-1].tolist() == whole[:-1].tolist()


def test_lanes_without_a_nucleus_row_sort_nothing(load_model, monkeypatch):
    import mlx_spec.train.lanes as L

    sorts = []
    top_p = L.apply_top_p
    monkeypatch.setattr(L, "apply_top_p", lambda *a: sorts.append(1) or top_p(*a))
    model, _ = load_model("llama")
    _decode_all(LaneDecoder(model, 2, stop_tokens=set()), [[5, 6], [7]], [3, 3])
    assert sorts == []
    decoder = LaneDecoder(model, 2, stop_tokens=set())
    uids = [decoder.insert([5, 6], 3, 0.0), decoder.insert([7], 3, 1.0, top_p=0.9)]
    assert len(decoder.next_generated()) == len(uids) and sorts == [1]


def test_a_top_p_outside_zero_to_one_is_refused(load_model):
    model, _ = load_model("llama")
    decoder = LaneDecoder(model, 2, stop_tokens=set())
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p must be in"):
            decoder.insert([5, 6], 3, 1.0, top_p=bad)


def test_a_window_holds_the_oldest_row_and_the_closest_lengths():
    lengths = [50, 3, 4, 900, 5, 48, 52]
    assert sorted(pick_window(lengths, 0, 3)) == [0, 5, 6]
    assert sorted(pick_window(lengths, 3, 2)) == [3, 6]
    assert sorted(pick_window(lengths, 1, 3)) == [1, 2, 4]
    assert sorted(pick_window(lengths, 2, 7)) == list(range(7))
