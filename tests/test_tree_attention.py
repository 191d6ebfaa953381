"""Tree attention: one forward over a token tree equals the per-path forwards."""

import importlib
import random

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache
from mlx_lm.models.rope_utils import DynamicNTKScalingRoPE

from mlx_spec.attention.tree import (
    SUPPORTED_ARCHITECTURES,
    Tree,
    commit_path,
    masked_forward,
    prepare_tree_model,
    tree_forward,
)

VOCAB = 96
PREFIX = [5, 17, 42, 8, 3, 77, 61]
QUANT = dict(group_size=32, bits=8)

_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
)
# Each architecture with a rope variant mlx-lm uses for it.
_ARGS = {
    "llama": dict(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "mistral": dict(tie_word_embeddings=False),
    "qwen2": dict(hidden_size=128, rope_theta=1e6),  # head_dim = hidden / heads
    "qwen3": dict(rope_theta=1e6),
    "gemma": dict(),
    "phi3": dict(
        hidden_size=128,
        partial_rotary_factor=0.5,
        original_max_position_embeddings=8,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.25 * i for i in range(8)],
            "long_factor": [1.0 + i for i in range(8)],
        },
    ),
}
_MODULE = {"mistral": "llama"}

# (name, parents): chains, a star, deep+wide, a forest.
TREES = {
    "chain": [-1, 0, 1, 2, 3],
    "single": [-1],
    "star": [-1, 0, 0, 0, 0, 0],
    "deep_wide": [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9, 10],
    "forest": [-1, -1, 0, 1, 1, 2, 4],
}


def _make_model(arch, **overrides):
    module = importlib.import_module(f"mlx_lm.models.{_MODULE.get(arch, arch)}")
    args = module.ModelArgs.from_dict({"model_type": arch, **_COMMON, **_ARGS[arch]})
    for k, v in overrides.items():
        setattr(args, k, v)
    mx.random.seed(sum(map(ord, arch)))
    model = module.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module", params=SUPPORTED_ARCHITECTURES)
def model(request):
    return prepare_tree_model(_make_model(request.param))


def _cache(model, quantized=False):
    n = len(model.layers)
    return [QuantizedKVCache(**QUANT) if quantized else KVCache() for _ in range(n)]


def _prefilled(model, tokens, quantized=False):
    """Caches after a prefill of ``tokens`` (a list, or a list of rows)."""
    cache = _cache(model, quantized)
    batch = isinstance(tokens[0], list)
    logits = model(mx.array(tokens if batch else [tokens]), cache=cache)
    logits = logits if batch else logits[0]
    mx.eval(logits, [c.state for c in cache])
    return cache, logits


def _paths(parents):
    paths = []
    for i, p in enumerate(parents):
        paths.append((paths[p] if p >= 0 else []) + [i])
    return paths


def _tokens(n, seed):
    return mx.random.randint(0, VOCAB, (n,), key=mx.random.key(seed))


def _sequential_logits(model, parents, tokens, quantized=False):
    """``(N, V)``: node i's logits from a normal forward of its root-to-i path."""
    tokens = tokens.tolist()
    rows = []
    for path in _paths(parents):
        cache, _ = _prefilled(model, PREFIX, quantized)
        rows.append(model(mx.array([[tokens[j] for j in path]]), cache=cache)[0, -1])
    return mx.stack(rows)


@pytest.mark.parametrize("name", TREES)
def test_tree_logits_match_sequential_paths(model, name):
    parents = TREES[name]
    tree = Tree.from_parents(_tokens(len(parents), len(name)), parents)
    cache, _ = _prefilled(model, PREFIX)
    logits = tree_forward(model, cache, tree)
    expected = _sequential_logits(model, parents, tree.tokens)
    assert logits.shape == (len(parents), VOCAB)
    assert cache[0].offset == len(PREFIX) + len(parents)
    assert mx.abs(logits - expected).max().item() < 1e-4


def _random_parents(seed: int, n: int):
    """A random topological forest: node i's parent is uniform in [-1, i)."""
    rng = random.Random(seed)
    return [-1] + [rng.randrange(-1, i) for i in range(1, n)]


@pytest.mark.parametrize("seed", range(3))
def test_random_tree_logits_match_sequential_paths(model, seed):
    n = random.Random(seed).randint(2, 14)
    parents = _random_parents(seed, n)
    tree = Tree.from_parents(_tokens(n, 100 + seed), parents)
    on_device = Tree.from_parents(tree.tokens, mx.array(parents))
    assert mx.array_equal(tree.ancestor_mask, on_device.ancestor_mask).item()
    cache, _ = _prefilled(model, PREFIX)
    logits = tree_forward(model, cache, tree)
    expected = _sequential_logits(model, parents, tree.tokens)
    assert mx.abs(logits - expected).max().item() < 1e-4
    # The same tree under a new root (as the target verifies a draft tree).
    rooted = tree.with_root(PREFIX[-1])
    cache, _ = _prefilled(model, PREFIX[:-1])
    logits = tree_forward(model, cache, rooted)[1:]
    assert mx.abs(logits - expected).max().item() < 1e-4


def test_tree_grown_level_by_level_matches_one_shot(model):
    parents = TREES["deep_wide"]
    tokens = _tokens(len(parents), 1)
    cache, _ = _prefilled(model, PREFIX)
    one_shot = tree_forward(model, cache, Tree.from_parents(tokens, parents))
    # Drafter-style: one forward per level, each new level's parents on device.
    cache, _ = _prefilled(model, PREFIX)
    tree = Tree.from_parents(tokens[:1], parents[:1])
    levels = [tree_forward(model, cache, tree)]
    for start, stop in ((1, 3), (3, 6), (6, 9), (9, 11), (11, 13)):
        tree = tree.grow(tokens[start:stop], mx.array(parents[start:stop]))
        levels.append(tree_forward(model, cache, tree, start=start))
    assert mx.abs(mx.concatenate(levels) - one_shot).max().item() < 1e-4


def test_subtree_verifies_like_the_full_tree(model):
    parents = TREES["deep_wide"]
    full = Tree.from_parents(_tokens(len(parents), 4), parents)
    keep = [0, 1, 3, 4, 6, 9]
    cache, _ = _prefilled(model, PREFIX)
    expected = tree_forward(model, cache, full)[mx.array(keep)]
    cache, _ = _prefilled(model, PREFIX)
    logits = tree_forward(model, cache, full.subtree(mx.array(keep)))
    assert mx.abs(logits - expected).max().item() < 1e-4


def test_masked_forward_with_explicit_visibility_matches_tree_forward(model):
    parents = TREES["forest"]
    tree = Tree.from_parents(_tokens(len(parents), 3), parents)
    cache, _ = _prefilled(model, PREFIX)
    expected = tree_forward(model, cache, tree)
    cache, _ = _prefilled(model, PREFIX)
    P, N = len(PREFIX), len(parents)
    mask = mx.concatenate([mx.ones((N, P), mx.bool_), tree.ancestor_mask], axis=1)
    logits = masked_forward(model, cache, tree.tokens, P + tree.depth, mask)
    assert mx.abs(logits - expected).max().item() < 1e-5


@pytest.mark.parametrize("quantized", [False, True], ids=["kv", "quantized_kv"])
def test_commit_path_then_next_token_matches_fresh_prefill(model, quantized):
    parents = TREES["deep_wide"]
    tokens = _tokens(len(parents), 7)
    tree = Tree.from_parents(tokens, parents)
    path = _paths(parents)[11]  # [0, 1, 3, 6, 9, 11]: not contiguous
    cache, _ = _prefilled(model, PREFIX, quantized)
    tree_logits = tree_forward(model, cache, tree)
    commit_path(cache, len(PREFIX), tree.path(11, len(path)))
    assert all(c.offset == len(PREFIX) + len(path) for c in cache)

    nxt = 13
    logits = model(mx.array([[nxt]]), cache=cache)[0, -1]
    accepted = [int(t) for t in tokens[mx.array(path)].tolist()]
    _, fresh = _prefilled(model, PREFIX + accepted + [nxt], quantized)
    tol = 1e-3 if quantized else 1e-4  # both sides quantize the same K/V
    assert mx.abs(logits - fresh[-1]).max().item() < tol
    if quantized:
        expected = _sequential_logits(model, parents, tokens, quantized=True)
        assert mx.abs(tree_logits - expected).max().item() < tol


def test_batched_trees_match_single_tree_forwards(model):
    trees = [
        Tree.from_parents(_tokens(8, 11), [-1, 0, 0, 1, 1, 2, 5, 5]),
        Tree.from_parents(_tokens(8, 12), [-1, 0, 1, 2, -1, 4, 4, 0]),
    ]
    prompts = [PREFIX, PREFIX[::-1]]
    expected = []
    for tree, prompt in zip(trees, prompts):
        cache, _ = _prefilled(model, prompt)
        expected.append(tree_forward(model, cache, tree))
    cache, _ = _prefilled(model, prompts)
    P, N = len(PREFIX), 8
    prefix = mx.ones((N, P), mx.bool_)
    mask = mx.stack([mx.concatenate([prefix, t.ancestor_mask], 1) for t in trees])
    tokens = mx.stack([t.tokens for t in trees])
    positions = P + mx.stack([t.depth for t in trees])
    logits = masked_forward(model, cache, tokens, positions, mask)
    assert logits.shape == (2, N, VOCAB)
    assert mx.abs(logits - mx.stack(expected)).max().item() < 1e-4


def test_commit_path_accepts_host_lists_and_identity_paths(model):
    parents = TREES["chain"]
    tree = Tree.from_parents(_tokens(len(parents), 5), parents)
    cache, _ = _prefilled(model, PREFIX)
    tree_forward(model, cache, tree)
    commit_path(cache, len(PREFIX), [0, 1, 2])
    logits = model(mx.array([[9]]), cache=cache)[0, -1]
    accepted = tree.tokens[:3].tolist()
    _, fresh = _prefilled(model, PREFIX + accepted + [9])
    assert mx.abs(logits - fresh[-1]).max().item() < 1e-4


@pytest.mark.parametrize("arch", SUPPORTED_ARCHITECTURES)
def test_loaded_checkpoint_tree_matches_sequential_paths(checkpoints, arch):
    import mlx_lm

    # A private copy: prepare_tree_model wraps modules of the model in place.
    model, _ = mlx_lm.load(str(checkpoints[arch]))
    prepare_tree_model(model)
    parents = TREES["deep_wide"]
    tree = Tree.from_parents(_tokens(len(parents), 9), parents)
    cache, _ = _prefilled(model, PREFIX)
    logits = tree_forward(model, cache, tree)
    expected = _sequential_logits(model, parents, tree.tokens)
    assert mx.abs(logits - expected).max().item() < 1e-4


@pytest.mark.parametrize("arch", SUPPORTED_ARCHITECTURES)
def test_prepare_keeps_normal_decoding_bit_identical(arch):
    model = _make_model(arch)
    prompt = mx.array([PREFIX])

    def decode():
        cache = _cache(model)
        out = [model(prompt, cache=cache)[0]]
        for t in (4, 50, 23):
            out.append(model(mx.array([[t]]), cache=cache)[0])
        out.append(model(prompt)[0])  # no cache
        return mx.concatenate(out)

    before, names = decode(), [k for k, _ in tree_flatten(model.parameters())]
    prepare_tree_model(model)
    prepare_tree_model(model)  # idempotent
    assert mx.array_equal(decode(), before).item()
    assert [k for k, _ in tree_flatten(model.parameters())] == names


def test_unsupported_architecture_refused_in_one_line():
    from mlx_lm.models import starcoder2

    args = starcoder2.ModelArgs.from_dict({"model_type": "starcoder2", **_COMMON})
    with pytest.raises(ValueError) as err:
        prepare_tree_model(starcoder2.Model(args))
    msg = str(err.value)
    assert "\n" not in msg and "starcoder2" in msg
    assert all(a in msg for a in SUPPORTED_ARCHITECTURES)


def test_unsupported_rope_and_cache_refused():
    model = _make_model("llama", rope_scaling=None)
    for layer in model.layers:  # dynamic NTK does int arithmetic on the offset
        layer.self_attn.rope = DynamicNTKScalingRoPE(16, 64, False, 1e4, 2.0)
    with pytest.raises(ValueError, match="DynamicNTKScalingRoPE"):
        prepare_tree_model(model)

    model = prepare_tree_model(_make_model("llama"))
    cache = [RotatingKVCache(max_size=16) for _ in model.layers]
    with pytest.raises(ValueError, match="RotatingKVCache"):
        tree_forward(model, cache, Tree.from_parents([1, 2], [-1, 0]))
    with pytest.raises(ValueError, match="prepare_tree_model"):
        tree_forward(_make_model("llama"), _cache(model), Tree.from_parents([1], [-1]))


def test_tree_structure_from_parents_and_choices():
    tree = Tree.from_parents([10, 11, 12, 13, 14], [-1, 0, 0, 1, 3])
    assert tree.depth.tolist() == [0, 1, 1, 2, 3]
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    assert tree.ancestor_mask.astype(mx.int32).tolist() == expected
    assert tree.path(4, 4).tolist() == [0, 1, 3, 4]
    assert tree.path(mx.array(2), 2).tolist() == [0, 2]

    choices = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    candidates = mx.array([[20, 21], [30, 31], [40, 41]])  # (depth, top-k)
    medusa = Tree.from_choices(choices, candidates, root=7)
    assert medusa.tokens.tolist() == [7, 20, 21, 30, 31, 40]
    assert medusa.parents.tolist() == [-1, 0, 0, 1, 1, 3]
    rootless = Tree.from_choices(choices, [1, 2, 3, 4, 5])
    assert rootless.parents.tolist() == [-1, -1, 0, 0, 2]

    with pytest.raises(ValueError, match="parent"):
        Tree.from_choices([(0, 0), (0,)], [1, 2])
    with pytest.raises(ValueError, match="parents\\[1\\]"):
        Tree.from_parents([1, 2], [-1, 1])


def test_grow_and_subtree_agree_with_from_parents():
    parents = TREES["deep_wide"]
    tokens = _tokens(len(parents), 2)
    full = Tree.from_parents(tokens, parents)
    grown = Tree.from_parents(tokens[:3], parents[:3])
    for start, stop in ((3, 6), (6, 9), (9, 11), (11, 13)):  # one level each
        grown = grown.grow(tokens[start:stop], parents[start:stop])
    forest = Tree.from_parents([1], [-1]).grow([2, 3], [0, -1])
    assert forest.parents.tolist() == [-1, 0, -1]
    assert forest.depth.tolist() == [0, 1, 0]

    keep = [0, 1, 3, 4, 6, 9]
    sub = full.subtree(keep)
    assert sub.parents.tolist() == [-1, 0, 1, 1, 2, 4]
    ref = Tree.from_parents(tokens[mx.array(keep)], [-1, 0, 1, 1, 2, 4])
    for a, b in ((grown, full), (sub, ref)):
        for field in ("tokens", "parents", "depth", "ancestor_mask"):
            assert mx.array_equal(getattr(a, field), getattr(b, field)).item(), field
    with pytest.raises(ValueError, match="ascending"):
        full.subtree([0, 3, 1])
    with pytest.raises(ValueError, match="grow"):
        full.grow([1], [len(parents)])


def test_device_parents_give_the_same_tree():
    parents = TREES["deep_wide"]
    host = Tree.from_parents(_tokens(len(parents), 2), parents)
    device = Tree.from_parents(host.tokens, mx.array(parents))
    assert mx.array_equal(host.ancestor_mask, device.ancestor_mask).item()
    assert mx.array_equal(host.depth, device.depth).item()
