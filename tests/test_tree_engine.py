"""Token-tree speculation end to end: identity, exact law, caches, refusals."""

import itertools
import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.acceptance import tree_accept
from mlx_spec.attention.tree import Tree, tree_forward
from mlx_spec.engine import speculative_events

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]
SHAPES = [
    dict(tree_budget=8, tree_top_k=2, tree_depth=4),
    dict(tree_budget=20, tree_top_k=4, tree_depth=5),
    dict(tree_choices=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]),
]


def plain(model, ids, n, **kw):
    return [t for t, _ in generate_step(mx.array(ids), model, max_tokens=n, **kw)]


def tree_tokens(model, draft, ids, n, stats=None, **kw):
    config = SpecConfig(method="tree", max_tokens=n, **kw)
    return [
        e.token
        for e in speculative_events(
            mx.array(ids), model, draft, config=config, stats=stats
        )
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_greedy_identity_every_architecture(load_model, arch):
    model, tokenizer = load_model(arch)
    draft, _ = load_model(f"{arch}-near")
    ids = tokenizer.encode("def fibonacci(n):")
    expected = plain(model, ids, 30)
    for shape in SHAPES:
        stats = SpecStats()
        assert tree_tokens(model, draft, ids, 30, stats, **shape) == expected, shape
        assert stats.tree_sizes and max(stats.accepted_per_round) >= 1


def test_tree_beats_chain_on_tokens_per_forward(load_model):
    model, tokenizer = load_model("qwen2")
    draft, _ = load_model("qwen2-near")
    ids = tokenizer.encode("import os\nimport sys\n")
    tree, chain = SpecStats(), SpecStats()
    tree_tokens(model, draft, ids, 60, tree, tree_budget=24, tree_top_k=4, tree_depth=5)
    config = SpecConfig(method="draft", max_tokens=60, num_draft_tokens=5)
    list(speculative_events(mx.array(ids), model, draft, config=config, stats=chain))
    assert tree.tokens_per_target_forward > chain.tokens_per_target_forward


def _random_tree(rng, n, vocab):
    """Random topological tree (node 0 = root) with distinct sibling tokens."""
    parents, tokens, used = [-1], [int(rng.integers(vocab))], {}
    for i in range(1, n):
        p = int(rng.integers(i))
        free = [t for t in range(vocab) if t not in used.get(p, set())]
        if not free:
            p, free = 0, [t for t in range(vocab) if t not in used.get(0, set())]
        t = int(rng.choice(free))
        used.setdefault(p, set()).add(t)
        parents.append(p)
        tokens.append(t)
    return tokens, parents


@pytest.mark.parametrize("seed", range(4))
def test_tree_round_law_is_exact_by_enumeration(seed):
    """Enumerate the target's choice at every node; the emitted sequence,
    continued by the target, must follow the target's law exactly."""
    rng = np.random.default_rng(seed)
    vocab, n = 3, 5
    tokens, parents = _random_tree(rng, n, vocab)
    tree = Tree.from_parents(tokens, parents)
    depth = np.array(tree.depth).tolist()
    max_depth = max(depth)
    # The target's law depends on the full prefix: a table per sequence.
    table = {}

    def law(prefix):
        if prefix not in table:
            x = rng.random(vocab) + 0.05
            table[prefix] = x / x.sum()
        return table[prefix]

    def path_tokens(node):
        out = []
        while node > 0:
            out.append(tokens[node])
            node = parents[node]
        return tuple(reversed(out))

    emitted = {}
    for choices in itertools.product(range(vocab), repeat=n):
        prob = math.prod(law(path_tokens(i))[c] for i, c in enumerate(choices))
        deepest, num, nxt = tree_accept(
            tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, mx.array(choices)
        )
        out = path_tokens(deepest.item()) + (nxt.item(),)
        assert num.item() == len(out) - 1
        emitted[out] = emitted.get(out, 0.0) + prob

    def target_prob(seq, start=0):
        return math.prod(law(seq[:i])[seq[i]] for i in range(start, len(seq)))

    for full in itertools.product(range(vocab), repeat=max_depth + 1):
        prob = sum(
            emitted.get(full[:m], 0.0) * target_prob(full, m)
            for m in range(1, max_depth + 2)
        )
        assert prob == pytest.approx(target_prob(full), abs=1e-9)


def test_tree_greedy_round_follows_argmax_path():
    # root -> a(1) -> c(2); root -> b(2). Target argmax: root 1, a 2, c 0.
    tree = Tree.from_parents([7, 1, 2, 2], [-1, 0, 0, 1])
    choices = mx.array([1, 2, 9, 0])
    deepest, num, nxt = tree_accept(
        tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, choices
    )
    assert (deepest.item(), num.item(), nxt.item()) == (3, 2, 0)


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    """A llama target and near draft with head_dim 32 (KV quantisable by 32)."""
    from mlx_lm import load

    from mlx_spec.testing import make_checkpoint

    root = tmp_path_factory.mktemp("q")
    target_dir = make_checkpoint(root / "t", "llama", hidden_size=128, seed=3)
    draft_dir = make_checkpoint(
        root / "d", "llama", hidden_size=128, base=target_dir, noise=0.05
    )
    model, tokenizer = load(str(target_dir))
    draft, _ = load(str(draft_dir))
    return model, draft, tokenizer


@pytest.mark.parametrize("kv_bits", [None, 8])
@pytest.mark.parametrize("stop_after", [4, 11])
def test_tree_caches_match_fresh_prefill(wide_pair, kv_bits, stop_after):
    model, draft, tokenizer = wide_pair
    ids = tokenizer.encode("class Parser:\n    def __init__(self")
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    config = SpecConfig(
        method="tree", max_tokens=50, tree_budget=10, tree_top_k=3, tree_depth=4
    )
    events = speculative_events(
        mx.array(ids),
        model,
        draft,
        config=config,
        prompt_cache=cache,
        kv_bits=kv_bits,
        kv_group_size=32,
        quantized_kv_start=0,
    )
    got = []
    for e in events:
        got.append(e.token)
        if len(got) == stop_after:
            break
    events.close()
    kv = (
        dict(kv_bits=kv_bits, kv_group_size=32, quantized_kv_start=0) if kv_bits else {}
    )
    assert got == plain(model, ids, stop_after, **kv)
    n = len(model.layers)
    seq = ids + got
    for m, part in ((model, cache[:n]), (draft, cache[n:])):
        assert part[0].offset == len(seq)
        fresh = make_prompt_cache(m)
        m(mx.array([seq[:-1]]), cache=fresh)
        if kv_bits:
            fresh = [c.to_quantized(group_size=32, bits=kv_bits) for c in fresh]
        expected = m(mx.array([[seq[-1]]]), cache=fresh)[0, -1]
        for c in part:
            c.trim(1)
        logits = m(mx.array([[seq[-1]]]), cache=part)[0, -1]
        # 8-bit K/V of slightly different float inputs may round one step
        # apart (logits are ~10 in size); a wrong cache is off by O(1).
        assert mx.abs(logits - expected).max().item() < (
            1e-4 if kv_bits is None else 0.1
        )


def test_tree_quantizes_the_target_cache_once_it_reaches_the_start(
    wide_pair, monkeypatch
):
    """With kv_bits, the target's cache turns quantized after the commit that
    takes it past quantized_kv_start, as mlx_lm's decoding does."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    import mlx_spec.verify as verify

    model, draft, tokenizer = wide_pair
    ids = tokenizer.encode("def fibonacci(n):")
    start = len(ids) + 8
    seen = []  # (cache offset, cache type) at each target tree forward

    def spy(model_, cache, tree, **kw):
        if model_ is model:
            seen.append((cache[0].offset, type(cache[0])))
        return tree_forward(model_, cache, tree, **kw)

    monkeypatch.setattr(verify, "tree_forward", spy)
    config = SpecConfig(method="tree", max_tokens=30, adaptive=False)
    events = speculative_events(
        mx.array(ids),
        model,
        draft,
        config=config,
        kv_bits=8,
        kv_group_size=32,
        quantized_kv_start=start,
    )
    assert len(list(events)) == 30
    assert {t for o, t in seen if o < start} == {KVCache}
    assert {t for o, t in seen if o >= start} == {QuantizedKVCache}


def test_tree_summary_reports_accepted_depth(load_model):
    model, tokenizer = load_model("qwen2")
    draft, _ = load_model("qwen2-near")
    stats = SpecStats()
    tree_tokens(model, draft, tokenizer.encode("import os\n"), 20, stats)
    depth = sum(stats.accepted_per_round) / len(stats.accepted_per_round)
    assert stats.mean_accepted_depth == depth > 0
    assert f"mean accepted depth {depth:.2f}" in stats.summary()


@pytest.mark.parametrize(
    "knobs, field",
    [
        (dict(tree_budget=0), "tree_budget"),
        (dict(tree_budget=1000), "tree_budget"),
        (dict(tree_top_k=0), "tree_top_k"),
        (dict(tree_depth=0), "tree_depth"),
        (dict(tree_choices="[[0], [0, 0"), "tree_choices"),
        (dict(tree_choices="[[0, 1]]"), "tree_choices"),
        (dict(tree_choices="[[0], [-1]]"), "tree_choices"),
    ],
)
def test_bad_tree_knobs_one_line_errors(knobs, field):
    with pytest.raises(ValueError) as err:
        SpecConfig(method="tree", **knobs)
    message = str(err.value)
    assert field in message and "\n" not in message


def test_unsupported_architecture_verifies_chains_and_says_so(tmp_path):
    """Where tree attention cannot run, the tree method drafts chains instead
    (exact, as --speculative draft) and the stats name the reason."""
    from mlx_lm.models import starcoder2

    from mlx_spec.generation import stream_generate
    from mlx_spec.testing import build_tokenizer

    args = starcoder2.ModelArgs(
        model_type="starcoder2",
        hidden_size=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )
    model = starcoder2.Model(args)
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(build_tokenizer(tmp_path / "tok"))
    responses = list(
        stream_generate(
            model,
            tokenizer,
            "def f():",
            draft_model=model,
            speculative="tree",
            max_tokens=8,
        )
    )
    tokens, stats = [r.token for r in responses], responses[-1].stats
    ids = tokenizer.encode("def f():")
    assert tokens == [t for t, _ in generate_step(mx.array(ids), model, max_tokens=8)]
    assert "chains" in stats.note and "starcoder2" in stats.note
    assert stats.draft_tokens > 0 and not stats.tree_sizes


def test_a_small_tree_budget_caps_the_depth_and_the_draft_forwards(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    stats = SpecStats()
    got = tree_tokens(
        model, draft, ids, 24, stats, tree_budget=2, tree_depth=5, adaptive=False
    )
    assert got == plain(model, ids, 24)
    # A budget-2 tree is at most two levels deep: two draft forwards per round.
    assert max(stats.tree_sizes) <= 2 and stats.draft_forwards <= 2 * stats.rounds


def test_adaptive_trees_may_shrink_to_one_node():
    from mlx_spec.planner import make_controller

    class Dynamic:
        is_tree, static = True, None

    controller = make_controller(SpecConfig(method="tree"), Dynamic())
    assert controller.tree_budgets[:3] == [1, 2, 4]


def test_adaptive_trees_start_small_and_fixed_trees_keep_their_budget(load_model):
    model, tokenizer = load_model("llama")
    draft, _ = load_model("llama-near")
    ids = tokenizer.encode("def fibonacci(n):")
    sizes = {}
    for adaptive in (True, False):
        stats = SpecStats()
        got = tree_tokens(model, draft, ids, 24, stats, adaptive=adaptive)
        assert got == plain(model, ids, 24)
        sizes[adaptive] = stats.tree_sizes
    # A weak draft costs little before the controller has measured it.
    assert sizes[True][0] == 4 and max(sizes[True]) <= 64
    assert set(sizes[False]) == {16}
