"""Continuous batching with speculation (mlx_spec.serve.batch), without HTTP.

Each request of a batch must equal serving it alone: greedy rows token for
token equal plain mlx_lm decoding, sampled rows follow the target's law.
Rows join and leave between rounds and accept different counts per round,
so every test mixes methods, prompt lengths and output lengths.
"""

from types import SimpleNamespace

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec.acceptance import (
    match_accept,
    one_hot_logprobs,
    recovered_law,
    rejection_accept,
)
from mlx_spec.config import SpecConfig
from mlx_spec.costs import (
    MeasuredCosts,
    best_gamma,
    fixed_batch_price,
)
from mlx_spec.planner import RoundPlanner, batch_width, chain_controller, round_rate
from mlx_spec.sampling import SamplingParams
from mlx_spec.serve.batch import (
    MIN_SHARED_PREFIX,
    SeqSpec,
    SpecBatchGenerator,
    common_prefix,
)
from mlx_spec.serve.batch_cache import RaggedBatch, RaggedKVCache, batchable
from mlx_spec.serve.batch_plan import RowPlanner, row_size
from mlx_spec.serve.index import CrossRequestIndex
from mlx_spec.serve.rows import Row
from mlx_spec.stats import SpecStats
from mlx_spec.verify import Law

PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "The quick brown fox",
    "class Parser:\n    def __init__(self",
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n",
)


def _reference(model, tokenizer, prompt, max_tokens):
    ids = tokenizer.encode(prompt)
    return [
        r.token
        for r in mlx_lm.stream_generate(model, tokenizer, ids, max_tokens=max_tokens)
    ]


def _spec(tokenizer, prompt, method, max_tokens, config=None, **kw):
    return SeqSpec(
        tokenizer.encode(prompt) if isinstance(prompt, str) else prompt,
        SpecConfig(method=method, max_tokens=max_tokens, **(config or {})),
        stop_tokens=frozenset(tokenizer.eos_token_ids),
        **kw,
    )


# Fixed draft lengths: the law tests draft every round they can.
FIXED = dict(adaptive=False, num_draft_tokens=3)


def _run(gen, outputs=None, steps=None):
    """Step ``gen`` (until idle, or ``steps`` times); collect tokens per uid."""
    outputs = {} if outputs is None else outputs
    done = 0
    while gen.has_work and (steps is None or done < steps):
        for out in gen.next():
            entry = outputs.setdefault(
                out.uid, {"tokens": [], "finish": None, "progress": []}
            )
            if out.progress is not None:
                entry["progress"].append(out.progress)
            entry["tokens"] += out.tokens
            if out.finish_reason:
                entry["finish"] = out.finish_reason
                entry["cache"] = (out.cache, out.cache_tokens)
        done += 1
    return outputs


def test_batched_greedy_requests_joining_and_leaving_equal_plain_mlx_lm(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    methods = ["draft", "lookup", "none", "auto", "draft"]
    lengths = [40, 25, 30, 50, 35]
    gen = SpecBatchGenerator(model, draft, index=CrossRequestIndex())
    uids, outputs = {}, {}
    for i, (prompt, method, n) in enumerate(zip(PROMPTS, methods, lengths)):
        if i == 3:  # the last two join a batch already decoding
            _run(gen, outputs, steps=6)
        uids[gen.insert(_spec(tokenizer, prompt, method, n))] = i
    _run(gen, outputs)
    for uid, i in uids.items():
        ref = _reference(model, tokenizer, PROMPTS[i], lengths[i])
        assert outputs[uid]["tokens"] == ref, (methods[i], PROMPTS[i])
        assert outputs[uid]["finish"] in ("stop", "length")
    # Every round's wall time reached the batch's cost model.
    costs = gen.planner.costs
    assert costs.rounds == gen.rounds and costs.forwards.get("draft", 0) > 0
    assert costs.report()["step_s"] < 10.0


def test_removing_a_row_mid_stream_leaves_the_others_exact(load_model):
    model, tokenizer = load_model("qwen3")
    draft, _ = load_model("qwen3-near")
    gen = SpecBatchGenerator(model, draft)
    uids = [gen.insert(_spec(tokenizer, p, "draft", 40)) for p in PROMPTS[:3]]
    outputs = _run(gen, steps=4)
    cache, tokens = gen.remove(uids[1], kept=3)  # a client that hung up
    assert len(tokens) <= len(tokenizer.encode(PROMPTS[1])) + 3
    assert [c.offset for c in cache] == [len(tokens)] * len(cache)
    _run(gen, outputs)
    for uid, prompt in ((uids[0], PROMPTS[0]), (uids[2], PROMPTS[2])):
        assert outputs[uid]["tokens"] == _reference(model, tokenizer, prompt, 40)


def test_a_cached_prompt_prefix_gives_the_same_output(load_model):
    """A request starting from a prompt cache (mlx_lm's LRU cache) prefills
    only the rest, and its output does not change."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode(PROMPTS[4])
    ref = _reference(model, tokenizer, PROMPTS[4], 24)
    for cached in (len(ids) // 2, len(ids)):  # a prefix, and the whole prompt
        cache = make_prompt_cache(model) + make_prompt_cache(draft)
        model(mx.array([ids[:cached]]), cache=cache[: len(model.layers)])
        draft(mx.array([ids[:cached]]), cache=cache[len(model.layers) :])
        gen = SpecBatchGenerator(model, draft)
        uid = gen.insert(_spec(tokenizer, ids, "auto", 24, cache=cache, cached=cached))
        out = _run(gen)[uid]
        assert out["tokens"] == ref
        rest = len(ids) - min(cached, len(ids) - 1)  # the last token is recomputed
        assert out["progress"][-1] == (rest, rest)


def test_a_finished_rows_cache_continues_the_conversation_exactly(load_model):
    """The cache a finished row hands back holds exactly its tokens: a
    follow-up request from it equals decoding the whole text from scratch."""
    model, tokenizer = load_model("gemma")
    gen = SpecBatchGenerator(model)
    first = gen.insert(_spec(tokenizer, PROMPTS[0], "lookup", 12))
    gen.insert(_spec(tokenizer, PROMPTS[3], "none", 20))
    outputs = _run(gen)
    cache, tokens = outputs[first]["cache"]
    ids = tokenizer.encode(PROMPTS[0])
    assert tokens == (ids + outputs[first]["tokens"])[: len(tokens)]
    assert len(tokens) >= len(ids) + 11  # all but the last token
    follow = tokens + tokenizer.encode(" def")
    uid = gen.insert(
        _spec(tokenizer, follow, "lookup", 16, cache=cache, cached=len(tokens))
    )
    got = _run(gen)[uid]["tokens"]
    ref = [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, follow, max_tokens=16)
    ]
    assert got == ref


def _sampled_laws(model, ids, out, temp):
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    return np.array(mx.softmax(logits, axis=-1), dtype=np.float64)


def test_sampled_rows_follow_the_target_law_while_batched(load_model):
    """Per request, every sampled token follows the target's exact law given
    its prefix (randomized PIT of long streams), with greedy and sampled
    rows of other laws and methods in the same batch."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    mx.random.seed(3)
    gen = SpecBatchGenerator(model, draft)
    rows = {}
    setups = [("draft", 1.3), ("lookup", 1.3), ("auto", 1.0), ("none", 0.0)]
    prompt = "def fibonacci(n):\n    return fibonacci(n - 1)"
    for method, temp in setups:
        params = SamplingParams(temp=temp) if temp else None
        spec = _spec(tokenizer, prompt, method, 240, FIXED, params=params)
        spec.stop_tokens = frozenset()
        stats = SpecStats()
        rows[gen.insert(spec, stats)] = (method, temp, stats)
    outputs = _run(gen)
    ids = tokenizer.encode(prompt)
    for uid, (method, temp, stats) in rows.items():
        out = outputs[uid]["tokens"]
        assert len(out) == 240
        if not temp:
            ref = _reference(model, tokenizer, prompt, 240)  # stops at EOS
            assert out[: len(ref)] == ref
            continue
        assert 0 < stats.accepted_tokens < stats.draft_tokens, method
        chi2, z = stream_statistics(_sampled_laws(model, ids, out, temp), np.array(out))
        assert chi2 < CHI2_9_999 and abs(z) < 4, (method, chi2, z)


def test_first_tokens_of_many_batched_sampled_requests_follow_the_target_law(
    load_model,
):
    """Through the whole engine: the first token of hundreds of sampled
    requests, batched 16 at a time with draft-model and lookup drafts (a
    weak draft, so rejections are common), follows the target's law."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-unrelated")
    ids = tokenizer.encode("x = x + x + x + x + x +")
    temp = 1.5
    mx.random.seed(5)
    gen = SpecBatchGenerator(model, draft, max_batch=16)
    stats = [SpecStats() for _ in range(320)]
    for i, st in enumerate(stats):
        method = ("draft", "lookup")[i % 2]
        spec = _spec(tokenizer, ids, method, 3, FIXED, params=SamplingParams(temp=temp))
        gen.insert(spec, st)
    outputs = _run(gen)
    first = np.array([out["tokens"][0] for out in outputs.values()])
    assert len(first) == 320
    assert sum(st.draft_tokens - st.accepted_tokens for st in stats) > 100
    logits = model(mx.array([ids]))[0, -1] / temp
    law = np.array(mx.softmax(logits), dtype=np.float64)
    assert_counts_follow_law(np.bincount(first, minlength=law.size), law)


def test_ragged_batch_rows_roll_back_to_their_own_lengths(load_model):
    """Random per-row keeps, joins, leaves and compaction: every row's logits
    equal a single-sequence forward of its own tokens."""
    model, tokenizer = load_model("qwen2")
    rng = np.random.default_rng(0)
    prompts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    singles = []
    for p in prompts:
        cache = make_prompt_cache(model)
        model(mx.array([p[:-1]]), cache=cache)
        singles.append(cache)
    seqs = [list(p) for p in prompts]
    batch = RaggedBatch.from_caches(singles)
    for step in range(24):
        width = int(rng.integers(1, 6))
        drafts = rng.integers(0, 400, size=(len(seqs), width - 1))
        tokens = np.concatenate([np.array([[s[-1]] for s in seqs]), drafts], axis=1)
        batch.prepare()
        logits = np.array(model(mx.array(tokens), cache=batch.caches))
        keep = rng.integers(1, width + 1, size=len(seqs))
        for b, s in enumerate(seqs):
            ref = model(mx.array([s[:-1] + tokens[b].tolist()]))[0, len(s) - 1 :]
            ref = np.array(ref)[: keep[b]]
            assert np.abs(ref - logits[b, : keep[b]]).max() < 1e-3
            assert (ref.argmax(-1) == logits[b, : keep[b]].argmax(-1)).all()
        batch.commit(width, keep)
        for b in range(len(seqs)):
            new = tokens[b, 1 : keep[b]].tolist() + [
                int(logits[b, keep[b] - 1].argmax())
            ]
            seqs[b] = seqs[b] + new
        assert batch.lengths.tolist() == [len(s) - 1 for s in seqs]
        if step == 8:  # a row leaves
            batch, seqs = batch.select([2, 0]), [seqs[2], seqs[0]]
        if step == 14:  # a row joins
            p = tokenizer.encode(PROMPTS[4])
            cache = make_prompt_cache(model)
            model(mx.array([p[:-1]]), cache=cache)
            batch = RaggedBatch.concat([batch, RaggedBatch.from_caches([cache])])
            seqs.append(list(p))
        if step == 19:
            assert batch.slack >= 0
            batch = batch.compact()
            assert batch.slack == 0
    extracted = batch.extract(1)
    ref = make_prompt_cache(model)
    model(mx.array([seqs[1][:-1]]), cache=ref)
    for got, want in zip(extracted, ref):
        assert got.offset == want.offset
        diff = np.abs(np.array(got.keys) - np.array(want.keys[..., : want.offset, :]))
        assert diff.max() < 1e-3


def test_batched_acceptance_equals_the_single_row_rules():
    """Rows of different draft lengths, padded into one batch, accept exactly
    what each row accepts alone (same uniforms), and their recovered or bonus
    law is the row's own: the batch is the single-sequence rule on every row."""
    rng = np.random.default_rng(1)
    B, W, V = 5, 6, 11
    sizes = np.array([0, 2, 5, 5, 3])
    logits = mx.array(rng.normal(size=(B, W, V)).astype(np.float32) * 2)
    target = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    drafts = mx.array(rng.integers(0, V, size=(B, W - 1)).astype(np.int32))
    q_logits = mx.array(rng.normal(size=(B, W - 1, V)).astype(np.float32))
    q = q_logits - mx.logsumexp(q_logits, axis=-1, keepdims=True)
    uniforms = mx.array(rng.random(size=(B, W - 1)).astype(np.float32))
    choices = mx.argmax(target, axis=-1)
    n, nxt = match_accept(drafts, choices, mx.array(sizes))
    for b in range(B):
        k = int(sizes[b])
        n_b, next_b = match_accept(drafts[b, :k], choices[b, : k + 1])
        assert int(n[b]) == int(n_b) and int(nxt[b]) == int(next_b)
    for law in (q, one_hot_logprobs(drafts, V)):
        n, _ = rejection_accept(drafts, target, law, uniforms, mx.array(sizes))
        laws = recovered_law(target, law, n, mx.array(sizes))
        for b in range(B):
            k = int(sizes[b])
            row_law = None if law is not q else q[b, :k]
            n_b, _ = rejection_accept(
                drafts[b, :k], target[b, : k + 1], row_law, uniforms[b, :k]
            )
            assert int(n[b]) == int(n_b)
            alone = recovered_law(target[b, : k + 1], law[b, :k], n_b)
            np.testing.assert_array_equal(np.array(laws[b]), np.array(alone))


def test_batch_rows_accept_and_draft_through_the_single_sequence_law(
    load_model, monkeypatch
):
    """The batch has no acceptance or draft-sampling rule of its own: each
    law group of a round goes through :class:`mlx_spec.verify.Law`, the
    single-sequence engine's rules, with the batch's rows as leading axes."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    calls = []
    accept_rows, draft_choice = Law.accept_rows, Law.draft_choice

    def spy_accept(self, drafts, target_logprobs, *args, **kw):
        calls.append(("accept", self.mode, drafts.shape[0]))
        return accept_rows(self, drafts, target_logprobs, *args, **kw)

    def spy_choice(self, logprobs):
        calls.append(("draft", self.mode, logprobs.shape[0]))
        return draft_choice(self, logprobs)

    monkeypatch.setattr(Law, "accept_rows", spy_accept)
    monkeypatch.setattr(Law, "draft_choice", spy_choice)
    gen = SpecBatchGenerator(model, draft)
    for params in (None, SamplingParams(temp=1.0), None):
        gen.insert(_spec(tokenizer, PROMPTS[0], "draft", 6, FIXED, params=params))
    _run(gen)
    assert ("accept", "greedy", 2) in calls and ("accept", "rejection", 1) in calls
    assert ("draft", "rejection", 1) in calls


def test_batched_rejection_emits_tokens_with_the_target_law():
    """Exact law on a tiny vocabulary: over many rows with their own draft
    lengths and draft laws (sampled from q, or point masses), the first
    emitted token (an accepted draft or the recovered/bonus token) follows
    the target's law p_0 exactly (chi-square over 6000 rows)."""
    rng = np.random.default_rng(2)
    B, W, V = 6000, 4, 7
    p_logits = mx.array(rng.normal(size=(1, W, V)).astype(np.float32) * 1.5)
    q_logits = mx.array(rng.normal(size=(1, W - 1, V)).astype(np.float32) * 1.5)
    target = mx.broadcast_to(
        p_logits - mx.logsumexp(p_logits, -1, keepdims=True), (B, W, V)
    )
    q = mx.broadcast_to(
        q_logits - mx.logsumexp(q_logits, -1, keepdims=True), (B, W - 1, V)
    )
    mx.random.seed(4)
    drafts = mx.random.categorical(q)  # each row's drafts drawn from q
    sizes = mx.array(rng.integers(0, W, size=B))
    half = mx.arange(B)[:, None, None] < B // 2
    law = mx.where(half, q, one_hot_logprobs(drafts, V))  # rows B/2..: fixed drafts
    n, nxt = rejection_accept(drafts, target, law, sizes=sizes)
    first = mx.where(n > 0, drafts[:, 0], nxt)
    p0 = np.array(mx.softmax(p_logits[0, 0]), dtype=np.float64)
    for rows in (slice(0, B // 2), slice(B // 2, B)):
        counts = np.bincount(np.array(first[rows]), minlength=V)
        assert_counts_follow_law(counts, p0)


def _row(method, step=0.05, **config):
    spec = SeqSpec([1], SpecConfig(method=method, num_draft_tokens=6, **config))
    return Row(0, spec, method != "lookup", SpecStats(), step, fixed_batch_price(step))


def test_a_batch_row_adapts_as_the_single_sequence_planner_does():
    """Same acceptance history, same draft lengths: a row of a batch of one
    and the single-sequence engine's planner (sampling: the fixed cost
    model) choose the same γ every round, down to 1 once the draft's
    acceptance collapses, and they estimate the same acceptance."""
    step = 0.05
    arm = SimpleNamespace(name="draft", is_tree=False, step_cost=step)
    config = SpecConfig(method="draft", num_draft_tokens=6)
    planner = RoundPlanner(config, arm, timed=False)
    row = _row("draft", step)
    planner._controller(arm).explore = row.controller("draft").explore = 0.0
    rng = np.random.default_rng(0)
    chosen = []
    for r in range(60):
        rate = 0.9 if r < 30 else 0.05  # the draft stops matching at round 30
        _, gamma = planner.begin_round()
        if r > 0:  # the planner's first round is its fixed start
            row_size(row, "draft", 12)
            assert row.size == gamma, r
        accepted = 0
        while accepted < gamma and rng.random() < rate:
            accepted += 1
        proposal = SimpleNamespace(size=gamma, forwards=gamma, setup_time=0.0)
        planner.end_round(gamma, proposal, accepted)
        row.arm, row.size = "draft", gamma
        row.record(accepted)
        chosen.append(gamma)
    assert max(chosen[:30]) >= 6 and chosen[-1] == 1
    np.testing.assert_allclose(
        row.controller("draft").acceptance(), planner._controller(arm).acceptance()
    )


def test_a_collapsing_row_drafts_less_then_not_at_all():
    """A row whose drafts stop being accepted drafts one token, and a batch
    of such rows runs plain rounds (which move the row's acceptance back
    towards its prior); a row still accepted keeps long drafts."""
    good, bad = _row("lookup", 0.0), _row("lookup", 0.0)
    for row, accepted in ((good, 8), (bad, 0)):
        row.arm, row.size = "lookup", 8
        for _ in range(20):
            row.record(accepted)
        row.controller("lookup").explore = 0.0
    assert good.controller("lookup").choose() > 4
    assert bad.controller("lookup").choose() == 1
    row = _row("draft")
    row.arm, row.size = "draft", 4
    for _ in range(20):
        row.record(0)
    row.controller("draft").explore = 0.0
    low = row.controller("draft").acceptance()[0]
    assert RowPlanner(0.05, None).plan([row], 1) == 0 and row.arm is None
    # Sitting out moves it back towards its prior, to be tried again.
    assert row.controller("draft").acceptance()[0] > low


@pytest.mark.parametrize("alpha, step", [(0.9, 0.0), (0.8, 0.15), (0.4, 0.3)])
def test_drafts_get_shorter_as_the_batch_grows(alpha, step):
    """A batch of one prices drafts like the single-sequence cost model; more
    rows sharing the verify forward make each extra column dearer."""
    config = SpecConfig(num_draft_tokens=16)
    controller = chain_controller(config, step, pauses=False, acceptance_estimate=alpha)
    controller.explore = 0.0
    price = fixed_batch_price(step)
    lengths = []
    for rows in (1, 2, 4, 8, 16):
        controller.pricer = lambda most: [
            price("draft" if g else None, g, rows, g + 1) for g in range(most + 1)
        ]
        lengths.append(controller.choose())
    assert lengths[0] == best_gamma(alpha, step, range(1, 17))[0]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[-1] < lengths[0] or lengths[0] == 1


def test_one_rows_match_does_not_widen_a_batch_that_gains_nothing_else():
    """The width is chosen for the whole batch: a lone match pays alone, and
    not in a batch of eight where every other row would verify filler."""
    lone = [([0.6] * 6, 6)]
    assert batch_width(lone, 0, 0.0, 6) > 0
    crowd = lone + [([], 0)] * 7
    assert batch_width(crowd, 0, 0.0, 6) == 0
    everyone = [([0.9] * 6, 6)] * 8
    assert batch_width(everyone, 8, 0.1, 6) > 0
    # A costlier draft step shortens the round.
    assert batch_width(everyone, 8, 1.0, 6) <= batch_width(everyone, 8, 0.1, 6)


def test_measured_batch_costs_start_at_the_fixed_model_and_learn_the_clock():
    """Before any round the measured price of a batch round is the fixed
    model's; fed rounds timed by another law (verifying a token costs half a
    forward, a draft step a fifth), it prices by that law instead."""
    fixed = fixed_batch_price(0.1)
    costs = MeasuredCosts({"draft": 0.1, "lookup": 0.0})
    for arm, steps, rows, width, draft_rows in [
        ("draft", 2, 8, 3, 8),
        ("draft", 4, 1, 5, 1),
        ("lookup", 0, 4, 3, 1),
        (None, 0, 8, 1, 1),
    ]:
        got = costs.batch_round_time(arm, steps, rows, width, draft_rows)
        assert got == pytest.approx(fixed(arm, steps, rows, width, draft_rows))

    def truth(steps, rows, width, draft_rows):  # seconds
        return 0.05 * (1 + 0.5 * (rows * width - 1) + 0.2 * steps * draft_rows)

    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, steps = int(rng.integers(1, 9)), int(rng.integers(0, 5))
        width = steps + 1 if steps else int(rng.integers(1, 3))
        arm = ("draft" if steps else "lookup") if width > 1 else None
        read = rows * steps
        costs.observe(
            arm, steps, rows * width, truth(steps, rows, width, rows), read - steps
        )
    for steps, rows in ((0, 8), (3, 8), (2, 2)):
        width = steps + 1
        arm = "draft" if steps else None
        want = truth(steps, rows, width, rows)
        got = costs.batch_round_time(arm, steps, rows, width, rows)
        assert got == pytest.approx(want, rel=0.05)


def test_a_batch_that_measures_dear_verification_stops_drafting():
    """Rows whose drafts the fixed model finds worth verifying run plain
    rounds once the batch's rounds show that verifying costs more (each
    extra token 60% of a forward), and keep drafting where it is cheap
    (10%, the fixed model's slope)."""

    def rows():
        seqs = [_row("draft") for _ in range(8)]
        for s in seqs:
            s.price = planner.price
            s.arm, s.size, s.batch = "draft", 3, 8
            for r in range(30):
                s.record(int(r % 3 != 1))  # 2 in 3 first drafts accepted
            s.controller("draft").explore = 0.0
        return seqs

    planner = RowPlanner(0.05, None, timed=False)
    assert planner.plan(rows(), 8) > 0
    for slope, drafts in ((0.6, False), (0.1, True)):
        planner = RowPlanner(0.05, None, timed=True)
        for width in (1, 2, 3, 1, 4) * 10:
            steps = width - 1
            seconds = 0.1 * (1 + slope * (8 * width - 1) + 0.05 * steps)
            planner.observe(8, steps, width, 8 * steps, seconds)
        assert (planner.plan(rows(), 8) > 0) == drafts, slope


def test_draft_steps_are_priced_for_every_row_of_the_draft_batch():
    """Each draft step is a forward of the whole draft batch, lookup rows of
    ``auto`` included: one draft-model row among seven lookup rows pays for
    eight rows' draft steps, and here sits the round out."""
    lookups, drafter = [([0.7] * 2, 2)] * 7, ([0.7] * 8, 8)
    rows = lookups + [drafter]
    alone = lookups + [([], 0)]
    width = batch_width(alone, 0, 0.1, 8)
    own = batch_width(rows, 1, 0.1, 8)
    whole = batch_width(rows, 1, 0.1, 8, draft_batch=8)
    assert round_rate(rows, 1, 0.1, own) > round_rate(alone, 0, 0.1, width)
    assert round_rate(rows, 1, 0.1, whole, draft_batch=8) < round_rate(
        alone, 0, 0.1, width
    )

    def row(acceptance, cap, arm):
        controller = SimpleNamespace(acceptance=lambda: acceptance)
        return SimpleNamespace(
            arm=arm, cap=cap, config=SpecConfig(), controller=lambda _: controller
        )

    seqs = [row(a, n, "lookup") for a, n in lookups] + [row(*drafter, "draft")]
    # Every row of auto drafts in the draft batch.
    assert RowPlanner(0.1, None).width(seqs, 8, len(seqs)) == (width, True)


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_next"])
def test_models_without_batched_rollback_are_refused(load_model, arch):
    model, _ = load_model(arch)
    reason = batchable(model)
    assert reason is not None and "no batched rollback" in reason


def test_prefilling_every_waiting_prompt_lets_all_rows_decode_from_round_one(
    load_model,
):
    model, tokenizer = load_model("llama")
    gen = SpecBatchGenerator(model, prefill_step_size=4)  # several chunks each
    uids = [gen.insert(_spec(tokenizer, p, "lookup", 12)) for p in PROMPTS[:3]]
    gen.prefill_waiting()
    assert not gen.waiting
    first = {out.uid: out.tokens for out in gen.next()}
    assert all(first.get(uid) for uid in uids)
    outputs = _run(
        gen,
        {uid: {"tokens": first[uid], "finish": None, "progress": []} for uid in uids},
    )
    for uid, prompt in zip(uids, PROMPTS):
        assert outputs[uid]["tokens"] == _reference(model, tokenizer, prompt, 12)


def test_short_prompts_waiting_together_share_one_prefill_step(load_model):
    """A step prefills up to ``prefill_step_size`` tokens in arrival order:
    three short prompts go through in one step (they used to take a step
    each), a long one takes a budget-sized chunk per step, and the rows that
    decode meanwhile stay exact."""
    model, tokenizer = load_model("llama")
    sizes = [len(tokenizer.encode(p)) for p in PROMPTS[:3]]
    budget = sum(sizes)  # each prompt's last token is left for the first round
    gen = SpecBatchGenerator(model, prefill_step_size=budget)
    short = [gen.insert(_spec(tokenizer, p, "lookup", 10)) for p in PROMPTS[:3]]
    first = gen.next()
    assert {o.uid for o in first if o.progress} == set(short)
    assert not gen.waiting and len(gen.ready) == 3
    long_prompt = " ".join(PROMPTS) * 3
    long_uid = gen.insert(_spec(tokenizer, long_prompt, "lookup", 10))
    long_size = len(tokenizer.encode(long_prompt))
    assert long_size - 1 > budget
    outputs = {}
    for out in first:
        outputs.setdefault(out.uid, {"tokens": [], "finish": None, "progress": []})
        outputs[out.uid]["progress"].append(out.progress)
    outputs = _run(gen, outputs)
    done = [p[0] for p in outputs[long_uid]["progress"]]
    assert done == [min(budget * k, long_size) for k in range(1, len(done))] + [
        long_size
    ]
    for uid, prompt in zip(short + [long_uid], list(PROMPTS[:3]) + [long_prompt]):
        assert outputs[uid]["tokens"] == _reference(model, tokenizer, prompt, 10)


def test_prefilling_waiting_prompts_stops_when_the_batch_is_full(load_model):
    model, tokenizer = load_model("llama")
    gen = SpecBatchGenerator(model, max_batch=2)
    uids = [gen.insert(_spec(tokenizer, p, "none", 6)) for p in PROMPTS]
    gen.prefill_waiting()
    assert len(gen.ready) == 2 and len(gen.waiting) == len(PROMPTS) - 2
    outputs = _run(gen)
    for uid, prompt in zip(uids, PROMPTS):
        assert outputs[uid]["tokens"] == _reference(model, tokenizer, prompt, 6)


def test_plain_sampled_rounds_in_a_batch_follow_the_target_law(load_model):
    """Rows that draft nothing sample their law directly (no residual): the
    first token of many such batched requests follows the target's law."""
    model, tokenizer = load_model("llama")
    ids = tokenizer.encode("x = x + x + x + x + x +")
    temp = 1.5
    mx.random.seed(6)
    gen = SpecBatchGenerator(model, max_batch=16)
    for _ in range(320):
        gen.insert(_spec(tokenizer, ids, "none", 1, params=SamplingParams(temp=temp)))
    outputs = _run(gen)
    first = np.array([out["tokens"][0] for out in outputs.values()])
    assert len(first) == 320
    logits = model(mx.array([ids]))[0, -1] / temp
    law = np.array(mx.softmax(logits), dtype=np.float64)
    assert_counts_follow_law(np.bincount(first, minlength=law.size), law)


def test_batched_rows_count_their_rounds_as_the_single_sequence_engine_does(
    load_model,
):
    """A batched request's stats hold each drafting round's drafted and
    accepted counts (SpecStats.add_round, the engine's own count)."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    gen = SpecBatchGenerator(model, draft)
    stats = [SpecStats(), SpecStats()]
    for method, st in zip(("draft", "lookup"), stats):
        gen.insert(_spec(tokenizer, PROMPTS[4], method, 30, FIXED), st)
    _run(gen)
    for st in stats:
        assert st.drafted_per_round and st.rounds >= len(st.drafted_per_round)
        assert sum(st.drafted_per_round) == st.draft_tokens
        assert sum(st.accepted_per_round) == st.accepted_tokens
        assert st.mean_accepted_depth > 0


def test_a_batch_row_keeps_out_lookup_matches_that_keep_failing():
    """As single-sequence lookup does (MatchRates): a match length whose
    first token keeps being rejected is kept out, and probed now and then."""
    config = SpecConfig(method="lookup", adaptive=False, max_tokens=200)
    spec = SeqSpec([5, 6, 7, 5, 6, 7, 5, 6], config)
    row = Row(0, spec, False, SpecStats(), 0.0, fixed_batch_price(0.0))
    planner = RowPlanner(0.0, None)
    drafted = []
    for _ in range(48):
        planner.plan([row], 0)
        drafted.append(row.arm == "lookup")
        row.record(0)  # every draft rejected
    # A 3-token match usually runs on (its prior): it takes a few rejections
    # more than a 1-token one to be kept out.
    assert drafted[:8] == [True] * 8
    assert 1 <= sum(drafted[24:]) <= 3  # the probes only


class _CountingPrefill:
    """A model that counts the prompt tokens prefills read (forwards on a
    request's own caches, not the batch's)."""

    def __init__(self, model):
        self.model, self.read = model, 0

    def __call__(self, tokens, cache=None):
        if not isinstance(cache[0], RaggedKVCache):
            self.read += tokens.shape[1]
        return self.model(tokens, cache=cache)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_requests_sharing_a_prompt_prefix_read_it_once(load_model):
    """A document that concurrent requests ask about is prefilled once: a
    request whose prompt starts like another's (waiting, ready to join or
    decoding) starts from that request's caches, and every output still
    equals plain mlx_lm's."""
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    document = " ".join(PROMPTS * 2)
    prompts = [f"{document} {q}" for q in ("Summary:", "Why?", "Name one.")]
    ids = [tokenizer.encode(p) for p in prompts]
    counting = _CountingPrefill(model)
    gen = SpecBatchGenerator(counting, draft)
    uids = [gen.insert(_spec(tokenizer, p, "auto", 12)) for p in prompts[:2]]
    outputs = _run(gen, steps=3)  # the third arrives while these decode
    uids.append(gen.insert(_spec(tokenizer, prompts[2], "draft", 12)))
    _run(gen, outputs)
    shared = [common_prefix(ids[i], ids[0], len(ids[i]) - 1) for i in (1, 2)]
    assert min(shared) >= MIN_SHARED_PREFIX
    assert counting.read == sum(len(p) - 1 for p in ids) - sum(shared)
    for uid, prompt in zip(uids, prompts):
        assert outputs[uid]["tokens"] == _reference(model, tokenizer, prompt, 12)
