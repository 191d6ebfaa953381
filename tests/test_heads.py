"""Draft heads (EAGLE, EAGLE-3-shaped, Medusa): features of unmodified models,
exactness, loading.

Heads only propose, so their weights do not matter for exactness: random
heads are used throughout. On a tiny 8-token vocabulary random drafts are
accepted often enough that multi-token rounds, deep tree paths and the
head's cache rewinds all run.
"""

import itertools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics

from mlx_spec import SpecConfig, SpecStats, stream_generate
from mlx_spec.drafters.eagle import EagleContext, EagleDrafter
from mlx_spec.drafters.heads import (
    ARCHITECTURES,
    HEAD_KEY,
    DraftVocab,
    LoadedHead,
    head_vocab,
    load_head,
    random_head,
    save_head,
)
from mlx_spec.drafters.medusa import MedusaDrafter
from mlx_spec.engine import speculative_events
from mlx_spec.features import FINAL, FeatureCapture, feature_logits
from mlx_spec.fingerprint import model_fingerprint
from mlx_spec.loading import load_pair
from mlx_spec.testing import greedy_continuation, linear_quantizations, tiny_llama
from mlx_spec.train.head_data import teacher_data
from mlx_spec.train.heads import HeadTrainConfig, HeadTrainer

ARCHS = ("llama", "qwen2", "qwen3", "gemma", "phi3")
METHODS = {
    "eagle": ("eagle", "eagle-chain"),
    "eagle3": ("eagle", "eagle-chain"),
    "medusa": ("medusa",),
}
VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(VOCAB)


@pytest.fixture(scope="module")
def trained(tiny):
    """EAGLE, EAGLE-3-shaped (on block 0) and Medusa heads trained for a few
    seconds on the tiny target's greedy text."""
    rng = np.random.default_rng(0)
    sequences = []
    for _ in range(24):
        prompt = rng.integers(0, VOCAB, size=5).tolist()
        sequences.append(prompt + greedy_continuation(tiny, prompt, 40)[0])
    data = teacher_data(tiny, sequences, [5] * len(sequences))
    blocks = teacher_data(tiny, sequences, [5] * len(sequences), feature_layers=[0])
    heads = {}
    for kind in ("eagle", "eagle3", "medusa"):
        config = HeadTrainConfig(
            kind=kind, steps=80, batch_size=8, window=48, lr=1e-2, draft_vocab=0
        )
        if kind == "eagle3":
            config.feature_layers = [0]
        trainer = HeadTrainer(tiny, blocks if kind == "eagle3" else data, config)
        for _ in range(config.steps):
            trainer.train_step()
        vocab = head_vocab(kind, trainer.head, tiny, None, VOCAB)
        heads[kind] = LoadedHead(
            ARCHITECTURES[kind], trainer.head, {HEAD_KEY: {"kind": kind}}, vocab, tiny
        )
    return heads


# --------------------------------------------------------------------------- #
# Features of an unmodified model
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_leaves_logits_bit_identical_and_restores_the_model(load_model, arch):
    model, tokenizer = load_model(arch)
    tokens = mx.array([tokenizer.encode("def fibonacci(n):")])
    before = model(tokens)
    names = [k for k, _ in nn.utils.tree_flatten(model.parameters())]
    capture = FeatureCapture(model, (0, FINAL))
    with capture.capturing():
        during = model(tokens)
    assert mx.array_equal(before, during).item()
    assert sorted(names) == sorted(
        k for k, _ in nn.utils.tree_flatten(model.parameters())
    )
    assert isinstance(model.model.norm, nn.Module)
    assert all(isinstance(layer, nn.Module) for layer in model.model.layers)
    feats = capture.take()
    hidden = model.model.embed_tokens.weight.shape[1]
    assert feats.shape == (tokens.shape[1], 2 * hidden)
    # The final feature is the output layer's input: it reproduces the logits.
    assert mx.allclose(feature_logits(model, feats[:, hidden:]), before[0], atol=1e-4)
    assert capture.take() is None  # taken once


def test_capture_of_a_block_is_its_output(load_model):
    model, _ = load_model("llama")
    tokens = mx.array([[5, 6, 7, 8]])
    capture = FeatureCapture(model, (1,))
    with capture.capturing():
        model(tokens)
    h = model.model.embed_tokens(tokens)
    mask = "causal"
    for layer in model.model.layers[:2]:
        h = layer(h, mask, None)
    assert mx.allclose(capture.take(), h[0], atol=1e-5)


def test_bad_feature_layers_one_line_error(load_model):
    model, _ = load_model("llama")
    with pytest.raises(ValueError, match="feature layers"):
        FeatureCapture(model, (99,))


# --------------------------------------------------------------------------- #
# Exactness: greedy identity on every architecture, the target's law when sampling
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_greedy_identity_every_architecture(load_model, arch):
    model, tokenizer = load_model(arch)
    prompt = "def fibonacci(n):"
    plain = [
        r.token
        for r in stream_generate(
            model, tokenizer, prompt, speculative="none", max_tokens=24
        )
    ]
    for kind, methods in METHODS.items():
        head = random_head(kind, model, seed=1)
        for method in methods:
            stream = stream_generate(
                model,
                tokenizer,
                prompt,
                draft_model=head,
                speculative=method,
                max_tokens=24,
            )
            assert [r.token for r in stream] == plain, (kind, method)
            assert stream.stats.note is None


HEAD_METHODS = [
    ("eagle", "eagle"),
    ("eagle-chain", "eagle"),
    ("medusa", "medusa"),
    ("eagle", "eagle3"),
    ("eagle-chain", "eagle3"),
]


@pytest.mark.parametrize(
    "method, kind", HEAD_METHODS + [("auto", "eagle"), ("auto", "eagle3")]
)
def test_trained_heads_greedy_identity_with_deep_accepted_drafts(
    tiny, trained, method, kind
):
    """Trained heads get several drafts accepted per round, and stay exact."""
    head = trained[kind]
    plain = greedy_continuation(tiny, PROMPT, 60)[0]
    stats = SpecStats()
    config = SpecConfig(
        method=method, max_tokens=60, tree_budget=6, tree_depth=4, adaptive=False
    )
    out = [
        e.token
        for e in speculative_events(
            mx.array(PROMPT), tiny, head, config=config, stats=stats
        )
    ]
    assert out == plain
    assert stats.accepted_tokens > 10
    assert max(stats.accepted_per_round) >= 2


def test_eagle_with_a_draft_vocabulary_greedy_identity(tiny):
    head = random_head("eagle", tiny, seed=3, draft_ids=mx.array([1, 3, 4, 6]))
    config = SpecConfig(method="eagle", max_tokens=40, tree_budget=5, adaptive=False)
    stats = SpecStats()
    out = [
        e.token
        for e in speculative_events(
            mx.array(PROMPT), tiny, head, config=config, stats=stats
        )
    ]
    assert out == greedy_continuation(tiny, PROMPT, 40)[0]
    assert stats.accepted_tokens > 0


def _exact_law_of_three(model, temp) -> np.ndarray:
    """``(V, V, V)``: the target's probability of each first three tokens."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    batch = mx.array([PROMPT + list(p) for p in pairs])
    probs = mx.softmax(model(batch)[:, -3:] / temp, axis=-1)
    probs = np.array(probs, dtype=np.float64)
    law = np.empty((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        law[a, b, :] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return law


@pytest.mark.parametrize("method, kind", HEAD_METHODS)
def test_heads_sampled_first_three_tokens_follow_exact_law(tiny, trained, method, kind):
    """Chi-square of 200 sampled 3-token openings against the exact joint law.

    ``eagle-chain`` draws drafts from the head's law (rejection sampling);
    ``eagle`` and ``medusa`` propose top-k trees (point masses). EAGLE-3-shaped
    heads draw from their own output layer.
    """
    head = trained[kind]
    config = SpecConfig(
        method=method,
        max_tokens=3,
        temp=1.0,
        adaptive=False,
        tree_budget=6,
        tree_depth=3,
    )
    counts, accepted = _sampled_openings(tiny, head, config, seed=7)
    assert accepted > 200 // 4  # drafts were accepted: non-root choices ran
    assert_counts_follow_law(counts, _exact_law_of_three(tiny, 1.0).reshape(-1))


def _sampled_openings(model, head, config, seed: int, runs: int = 200):
    """Counts of the first three sampled tokens over ``runs`` calls, ``(V**3,)``,
    and the drafts accepted in all."""
    mx.random.seed(seed)
    counts, accepted = np.zeros(VOCAB**3), 0
    for _ in range(runs):
        stats = SpecStats()
        events = speculative_events(
            mx.array(PROMPT), model, head, config=config, stats=stats
        )
        a, b, c = (e.token for e in events)
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        accepted += stats.accepted_tokens
    return counts, accepted


def test_eagle_chain_with_a_draft_vocabulary_samples_the_exact_law(tiny):
    """A head whose vocabulary covers half the target's draws its chain over
    those columns and widens the law for rejection sampling: the first three
    tokens still follow the target's joint law."""
    head = random_head("eagle", tiny, seed=3, draft_ids=mx.array([1, 3, 4, 6]))
    config = SpecConfig(method="eagle-chain", max_tokens=3, temp=1.0, adaptive=False)
    counts, accepted = _sampled_openings(tiny, head, config, seed=5)
    assert accepted > 200 // 4
    law = _exact_law_of_three(tiny, 1.0)
    assert_counts_follow_law(counts, law.reshape(-1))
    pairs = counts.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1)  # the first two tokens
    assert_counts_follow_law(pairs, law.reshape(VOCAB * VOCAB, VOCAB).sum(axis=1))


def test_eagle_chain_sampled_stream_follows_target_law(load_model):
    """A long sampled stream: randomized PIT chi-square and standardised log-likelihood."""
    model, tokenizer = load_model("llama")
    head = random_head("eagle", model, seed=5)
    ids = tokenizer.encode("def fibonacci(n):")
    temp, n = 1.0, 200
    mx.random.seed(3)
    config = SpecConfig(method="eagle-chain", max_tokens=n, temp=temp, adaptive=False)
    out = [
        e.token for e in speculative_events(mx.array(ids), model, head, config=config)
    ]
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :] / temp
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


@pytest.fixture(scope="module")
def trained_on_blocks(tiny):
    """An EAGLE head reading block 0 and the final state (EAGLE-3 style), trained briefly."""
    rng = np.random.default_rng(1)
    sequences = []
    for _ in range(24):
        prompt = rng.integers(0, VOCAB, size=5).tolist()
        sequences.append(prompt + greedy_continuation(tiny, prompt, 40)[0])
    layers = [0, FINAL]
    data = teacher_data(tiny, sequences, [5] * len(sequences), feature_layers=layers)
    config = HeadTrainConfig(
        kind="eagle",
        steps=80,
        batch_size=8,
        window=48,
        lr=1e-2,
        draft_vocab=0,
        feature_layers=layers,
    )
    trainer = HeadTrainer(tiny, data, config)
    for _ in range(config.steps):
        trainer.train_step()
    config = {HEAD_KEY: {"kind": "eagle"}}
    return LoadedHead(
        "eagle", trainer.head, config, DraftVocab(tiny, None, VOCAB), tiny
    )


@pytest.mark.parametrize("method", ["eagle", "eagle-chain"])
def test_an_eagle_head_on_several_blocks_is_exact(tiny, trained_on_blocks, method):
    """Drafts are accepted, greedy output is plain decoding's, and sampled
    3-token openings follow the target's exact law."""
    head = trained_on_blocks
    assert head.module.args.feature_layers == [0, FINAL]
    stats = SpecStats()
    config = SpecConfig(method=method, max_tokens=60, tree_budget=6, adaptive=False)
    greedy = speculative_events(
        mx.array(PROMPT), tiny, head, config=config, stats=stats
    )
    assert [e.token for e in greedy] == greedy_continuation(tiny, PROMPT, 60)[0]
    assert stats.accepted_tokens > 10 and max(stats.accepted_per_round) >= 2
    law = _exact_law_of_three(tiny, 1.0)
    config = SpecConfig(
        method=method, max_tokens=3, temp=1.0, adaptive=False, tree_budget=6
    )
    mx.random.seed(11)
    counts, accepted = np.zeros(VOCAB**3), 0
    for _ in range(200):
        stats = SpecStats()
        events = speculative_events(
            mx.array(PROMPT), tiny, head, config=config, stats=stats
        )
        a, b, c = (e.token for e in events)
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        accepted += stats.accepted_tokens
    assert accepted > 50
    assert_counts_follow_law(counts, law.reshape(-1))


# --------------------------------------------------------------------------- #
# The features the heads read are the target's, at the right positions
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("method", ["eagle", "eagle-chain"])
def test_eagle_reads_every_pair_of_target_feature_and_next_token(
    tiny, monkeypatch, method
):
    """The pairs fed to the head are ``(f_j, x_{j+1})`` for every position, in order,
    with ``f_j`` the target's final feature of a full forward of the text."""
    fed = []
    original = EagleContext.catch_up

    def recording(self, state):
        if self.pending:
            feats = mx.concatenate(self.pending)
            fed.append(
                (
                    self.fed,
                    feats,
                    state.seq[self.fed + 1 : self.fed + 1 + feats.shape[0]],
                )
            )
        return original(self, state)

    monkeypatch.setattr(EagleContext, "catch_up", recording)
    head = random_head("eagle", tiny, seed=6)
    config = SpecConfig(method=method, max_tokens=40, tree_budget=6)
    out = [
        e.token for e in speculative_events(mx.array(PROMPT), tiny, head, config=config)
    ]
    text = PROMPT + out
    starts = [start for start, _, _ in fed]
    feats = mx.concatenate([f for _, f, _ in fed])
    tokens = [t for _, _, toks in fed for t in toks]
    assert starts[0] == 0 and len(fed) > 5
    assert tokens == text[1 : 1 + len(tokens)]
    capture = FeatureCapture(tiny)
    with capture.capturing():
        tiny(mx.array([text]))
    reference = capture.take()[: feats.shape[0]]
    assert mx.allclose(feats, reference, atol=1e-4).item()


def test_medusa_reads_the_feature_that_chose_the_pending_token(tiny, monkeypatch):
    seen = []
    original = MedusaDrafter.propose

    def recording(self, state, size):
        seen.append((len(state.seq), self.last))
        return original(self, state, size)

    monkeypatch.setattr(MedusaDrafter, "propose", recording)
    head = random_head("medusa", tiny, seed=7)
    config = SpecConfig(method="medusa", max_tokens=30)
    out = [
        e.token for e in speculative_events(mx.array(PROMPT), tiny, head, config=config)
    ]
    capture = FeatureCapture(tiny)
    with capture.capturing():
        tiny(mx.array([PROMPT + out]))
    reference = capture.take()
    for length, last in seen:
        assert mx.allclose(last[0], reference[length - 2], atol=1e-4).item()


def test_medusa_grows_adaptive_trees_and_keeps_its_stored_tree_when_fixed(tiny):
    """The heads' stored static tree has one size; an adaptive run sizes its
    tree per round instead (a 24-node static tree is mostly verification)."""
    head = random_head("medusa", tiny, seed=7)
    head.config["tree_choices"] = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]
    sizes, outputs = {}, {}
    for adaptive in (False, True):
        stats = SpecStats()
        config = SpecConfig(method="medusa", max_tokens=40, adaptive=adaptive)
        events = speculative_events(
            mx.array(PROMPT), tiny, head, config=config, stats=stats
        )
        outputs[adaptive] = [e.token for e in events]
        sizes[adaptive] = set(stats.tree_sizes)
    assert sizes[False] == {6}
    assert len(sizes[True]) > 1 and sizes[True] != {6}
    assert outputs[True] == outputs[False] == greedy_continuation(tiny, PROMPT, 40)[0]


# --------------------------------------------------------------------------- #
# Head directories: --draft-model DIR, checked against the target
# --------------------------------------------------------------------------- #


def test_head_directory_loads_as_its_kind_and_checks_the_target(checkpoints, tmp_path):
    model, tokenizer, _ = load_pair(str(checkpoints["llama"]), None)
    for kind in ("eagle", "eagle3", "medusa"):
        head = random_head(kind, model, seed=8, draft_ids=mx.array([1, 2, 3, 50]))
        save_head(
            tmp_path / kind,
            kind,
            head.module,
            target_fingerprint=model_fingerprint(model),
            draft_ids=head.vocab.ids,
        )
        _, _, loaded = load_pair(str(checkpoints["llama"]), str(tmp_path / kind))
        assert loaded.kind == ARCHITECTURES[kind]
        assert loaded.vocab.ids.tolist() == [1, 2, 3, 50]
        with pytest.raises(ValueError) as error:
            load_pair(str(checkpoints["qwen2"]), str(tmp_path / kind))
        assert "trained for another target" in str(error.value)
        assert "\n" not in str(error.value)
    # A float16 copy of the target is still the same target.
    half, _, _ = load_pair(str(checkpoints["llama"]), None)
    half.apply(lambda w: w.astype(mx.float16))
    assert load_head(tmp_path / "eagle", half).kind == "eagle"


@pytest.fixture(scope="module")
def quantized_heads(tiny, trained, tmp_path_factory):
    """The tiny target quantized to 4 bits, and the trained heads saved for it
    and for the float target, loaded next to each: ``(target, {kind: (head, float_head)})``.
    """
    quantized = tiny_llama(VOCAB)
    nn.quantize(quantized, group_size=32, bits=4)
    root = tmp_path_factory.mktemp("quantized_heads")
    heads = {}
    for kind in METHODS:
        loaded = []
        for name, target in (("quantized", quantized), ("float", tiny)):
            path = root / name / kind
            fingerprint = model_fingerprint(target)
            save_head(path, kind, trained[kind].module, target_fingerprint=fingerprint)
            loaded.append(load_head(path, target))
        heads[kind] = tuple(loaded)
    return quantized, heads


def test_a_head_next_to_a_quantized_target_takes_its_quantization(quantized_heads):
    """Its linear layers as the target's blocks: fewer bytes a step than in
    float, drafts still accepted, and decoding stays exact."""
    from mlx_spec.costs import weight_bytes

    quantized, heads = quantized_heads
    plain = greedy_continuation(quantized, PROMPT, 40)[0]
    for kind, methods in METHODS.items():
        head, float_head = heads[kind]
        assert linear_quantizations(head.module) == {(4, 32)}, kind
        assert weight_bytes(head.module) < 0.5 * weight_bytes(float_head.module)
        for method in methods:
            stats = SpecStats()
            config = SpecConfig(method=method, max_tokens=40, adaptive=False)
            events = speculative_events(
                mx.array(PROMPT), quantized, head, config=config, stats=stats
            )
            assert [e.token for e in events] == plain, (kind, method)
            assert stats.accepted_tokens > 0, (kind, method)


def test_a_pipeline_stage_takes_the_quantization_of_the_blocks_it_holds():
    """A pipeline stage lists the blocks another stage holds as ``None``
    (block 0 on the last stage): a head still quantizes as the held blocks."""
    from mlx_spec.drafters.storage import block_quantization

    stage = tiny_llama(VOCAB, num_layers=2)
    nn.quantize(stage, group_size=32, bits=4)
    whole = block_quantization(stage)
    stage.model.layers[0] = None
    assert whole is not None and block_quantization(stage) == whole


@pytest.mark.parametrize(
    "method, kind",
    [("eagle-chain", "eagle"), ("eagle-chain", "eagle3"), ("medusa", "medusa")],
)
def test_a_quantized_head_samples_the_quantized_targets_exact_law(
    quantized_heads, method, kind
):
    """``eagle-chain`` rejection-samples on the quantized head's own law;
    ``medusa`` proposes a top-k tree."""
    quantized, heads = quantized_heads
    head = heads[kind][0]
    config = SpecConfig(
        method=method, max_tokens=3, temp=1.0, adaptive=False, tree_budget=6
    )
    counts, accepted = _sampled_openings(quantized, head, config, seed=9)
    assert accepted > 200 // 4
    law = _exact_law_of_three(quantized, 1.0)
    assert_counts_follow_law(counts, law.reshape(-1))


def test_head_of_another_kind_one_line_error(tiny):
    head = random_head("medusa", tiny)
    config = SpecConfig(method="eagle", max_tokens=4)
    with pytest.raises(
        ValueError, match="needs a trained eagle head, not the medusa head given"
    ):
        list(speculative_events(mx.array(PROMPT), tiny, head, config=config))
    config = SpecConfig(method="medusa", max_tokens=4)
    with pytest.raises(
        ValueError, match="needs a trained medusa head as --draft-model"
    ):
        list(speculative_events(mx.array(PROMPT), tiny, None, config=config))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_generate_and_chat_commands_run_a_head_directory(
    checkpoints, tmp_path, capsys, kind
):
    """``--draft-model HEAD_DIR``: the command line runs the head's method, exactly
    (an EAGLE-3-shaped head directory drafts as an eagle head)."""
    from mlx_spec.cli.chat import Chat, setup_arg_parser
    from mlx_spec.cli.generate import main

    model, tokenizer, _ = load_pair(str(checkpoints["llama"]), None)
    head = random_head(kind, model, seed=9)
    save_head(
        tmp_path / "eagle",
        kind,
        head.module,
        target_fingerprint=model_fingerprint(model),
    )
    texts = {}
    for method in ("none", "eagle", "auto"):
        argv = ["--model", str(checkpoints["llama"]), "--draft-model"]
        argv += [str(tmp_path / "eagle"), "--speculative", method]
        argv += ["--prompt", "def fibonacci(n):", "--max-tokens", "20", "--temp", "0"]
        main(argv)
        texts[method] = capsys.readouterr().out.split("==========")[1]
    assert texts["eagle"] == texts["none"] == texts["auto"]
    model, tokenizer, loaded = load_pair(
        str(checkpoints["llama"]), str(tmp_path / "eagle")
    )
    replies = {}
    for method in ("none", "eagle"):
        args = setup_arg_parser().parse_args(
            ["--speculative", method, "--max-tokens", "8"]
        )
        with open(tmp_path / "chat.txt", "w") as out:
            chat = Chat(model, tokenizer, loaded, args, out=out)
            replies[method] = [chat.reply(q).tokens for q in ("hello", "more")]
    assert replies["eagle"] == replies["none"]


def test_draft_vocabulary_takes_the_prompts_tokens_for_one_call(tiny):
    head = random_head("eagle", tiny, seed=10, draft_ids=mx.array([1, 3]))
    extended = head.vocab.with_tokens([3, 5, 5, 7])
    assert head.vocab.all_ids.tolist() == [1, 3]  # the head's own is unchanged
    assert extended.all_ids.tolist() == [1, 3, 5, 7]
    h = mx.random.normal((2, 32), key=mx.random.key(0))
    logits = extended.logits(h)
    finite = mx.isfinite(logits[0]).tolist()
    assert [i for i, f in enumerate(finite) if f] == [1, 3, 5, 7]
    full = feature_logits(tiny, h)
    assert mx.allclose(
        logits[:, mx.array([1, 3, 5, 7])], full[:, mx.array([1, 3, 5, 7])]
    )
    assert extended.with_tokens([7, 1]) is extended


@pytest.mark.parametrize(
    "method, budget",
    [("eagle", 6), ("eagle", 1), ("eagle-chain", 4), ("medusa", 6), ("medusa", 1)],
)
def test_heads_with_a_draft_vocabulary_propose_target_ids_best_first(
    tiny, monkeypatch, method, budget
):
    """Children are ranked over the draft vocabulary's columns and mapped back:
    every proposed token is in this call's vocabulary, and the first proposed
    token is the head's best at full width (``vocab.logits``)."""
    kind = "medusa" if method == "medusa" else "eagle"
    head = random_head(kind, tiny, seed=12, draft_ids=mx.array([6, 7]))
    seen = []
    cls = MedusaDrafter if kind == "medusa" else EagleDrafter
    original = cls.propose

    def recording(self, state, size):
        proposal = original(self, state, size)
        if proposal.size:
            if kind == "medusa":
                vocab, hidden = self.vocab, head.module(self.last)[0][:1]
            else:
                vocab, hidden = self.context.vocab, self._root.reshape(1, -1)
            best = mx.argmax(vocab.logits(hidden), axis=-1).item()
            seen.append((proposal.tokens.tolist(), vocab.all_ids.tolist(), best))
        return proposal

    monkeypatch.setattr(cls, "propose", recording)
    config = SpecConfig(
        method=method, max_tokens=30, tree_budget=budget, adaptive=False
    )
    out = [
        e.token for e in speculative_events(mx.array(PROMPT), tiny, head, config=config)
    ]
    assert out == greedy_continuation(tiny, PROMPT, 30)[0]
    assert len(seen) > 3
    for tokens, allowed, best in seen:
        assert {6, 7} <= set(allowed)
        assert set(tokens) <= set(allowed)
        assert tokens[0] == best
