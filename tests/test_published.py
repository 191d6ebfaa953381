"""Published drafters (EAGLE-3 and DFlash folders): the reference's outputs, exactness.

``tests/fixtures/published`` holds small random checkpoints of each format,
built with speculators' own PyTorch classes by ``scripts/published_fixtures.py``,
and the reference's outputs for fixed inputs (``<name>.io.safetensors``).
mlx-spec's forward must give the same logits within 1e-4 relative in
float32. The engine tests use random heads written in the same formats for
tiny targets: heads only propose, so exactness must hold whatever they draft.
"""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from law_checks import assert_counts_follow_law
from mlx_lm.models import llama
from test_heads import PROMPT, VOCAB, _exact_law_of_three, _sampled_openings

from mlx_spec import SpecConfig, SpecStats
from mlx_spec.attention.tree import Tree
from mlx_spec.drafters.eagle import EagleContext, EagleDrafter
from mlx_spec.drafters.heads import load_head, random_head, save_head
from mlx_spec.drafters.published import (
    PublishedHead,
    load_published,
    published_format,
    published_kind,
)
from mlx_spec.drafters.published.dflash import DFlashDraft
from mlx_spec.drafters.published.export import (
    random_dflash,
    random_eagle1,
    random_eagle3,
    save_speculators_eagle3,
    unrolled_chain,
)
from mlx_spec.engine import speculative_events
from mlx_spec.fingerprint import model_fingerprint
from mlx_spec.sampling import normalize
from mlx_spec.testing import greedy_continuation, linear_quantizations, tiny_llama

FIXTURES = Path(__file__).parent / "fixtures" / "published"
EAGLE3 = {
    "eagle3-llama-d2t": "speculators-eagle3",
    "specforge-llama": "eagle3",
    "eagle3-qwen3-norm-before-residual": "speculators-eagle3",
    "eagle3-two-layers-fc-norm-norm-output": "speculators-eagle3",
    "eagle3-llama3-rope-norm-before-fc": "speculators-eagle3",
}
DFLASH = {"speculators-dflash-d2t": "speculators-dflash", "dflash-authors": "dflash"}
EAGLE1 = {"eagle-authors": "eagle", "eagle-authors-two-layers-qkv-bias": "eagle"}
TOLERANCE = 1e-4


def _io(name: str):
    return mx.load(str(FIXTURES / f"{name}.io.safetensors"))


def _fixture_target(io=None, layers: int = 6):
    """A llama target of the fixtures' width and vocabulary (its blocks are unused:
    the features are given); with ``io``, the reference's embedding and output layer."""
    model = tiny_llama(
        64, num_layers=layers, hidden_size=16, num_kv_heads=1, head_scale=None
    )
    if io is not None:
        model.model.embed_tokens.weight = io["verifier_embed"]
        model.lm_head.weight = io["verifier_lm_head"]
    mx.eval(model.parameters())
    return model


def _relative(got: mx.array, ref: mx.array) -> float:
    return float(mx.max(mx.abs(got - ref)) / mx.max(mx.abs(ref)))


@pytest.fixture(scope="module")
def fixture_target():
    return _fixture_target()


# --------------------------------------------------------------------------- #
# The reference's outputs
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", [*EAGLE3, *DFLASH, *EAGLE1])
def test_each_format_is_detected(name):
    fmt = {**EAGLE3, **DFLASH, **EAGLE1}[name]
    assert published_format(FIXTURES / name) == fmt
    assert published_kind(FIXTURES / name) == ("dflash" if name in DFLASH else "eagle")


def test_each_format_reads_its_target_layers_in_its_own_convention(fixture_target):
    """The same three target layers: speculators names layer inputs (2, 3, 5),
    SpecForge's eagle_config layer outputs (1, 2, 4), the DFlash authors block
    outputs; all capture the outputs of blocks 1, 2, 4 (0, 2, 3 for DFlash)."""
    for name in ("eagle3-llama-d2t", "specforge-llama"):
        head = load_published(FIXTURES / name, fixture_target)
        assert head.args.feature_layers == [1, 2, 4], name
    for name in DFLASH:
        draft = load_published(FIXTURES / name, _fixture_target(_io(name)))
        assert draft.args.feature_layers == [0, 2, 3], name


def test_a_plain_llama_checkpoint_is_no_published_drafter(checkpoints):
    assert published_format(checkpoints["llama"]) is None


def _chain_logits(head, io, pos: int, steps: int):
    """The chain from pair ``pos`` fed the reference's tokens: ``(steps, C)``."""
    return unrolled_chain(head, io["hidden_states"], io["input_ids"], pos, steps)


@pytest.mark.parametrize("name", EAGLE3)
def test_eagle3_chains_match_the_reference_unrolled_steps(fixture_target, name):
    """Every position's three-step chain equals the reference's training-time-test
    steps (step ``k`` at ``t``: the chain from pair ``t``), variants included:
    draft vocabulary, qwen3 q/k norms, norm before residual, two layers with
    per-layer fc norms and normed outputs, llama3 rope with a norm before fc,
    SpecForge's names."""
    head = load_published(FIXTURES / name, fixture_target)
    assert isinstance(head, PublishedHead) and head.kind == "eagle"
    io = _io(name)
    ref = io["step_logits"]  # (steps, T, C)
    for pos in range(ref.shape[1]):
        got = _chain_logits(head, io, pos, ref.shape[0])
        assert _relative(got, ref[:, pos]) < TOLERANCE, (name, pos)


def test_eagle3_tree_levels_match_the_reference_steps(fixture_target):
    """The tree path (one head forward per level, siblings masked from each
    other) gives the reference's step logits along the reference's tokens."""
    name = "eagle3-llama-d2t"
    head = load_published(FIXTURES / name, fixture_target)
    io = _io(name)
    ids, ref = io["input_ids"], io["step_logits"]
    pos = 3
    drafter = EagleDrafter(EagleContext(head), 64, tree=True, top_k=2, depth=3)
    out = drafter.context.feed(io["hidden_states"][: pos + 1], ids[: pos + 1], None)
    drafter.context.fed = pos + 1
    drafter._root = out[:, -1:]
    root = drafter._root_logprobs(None)
    assert _relative(root[0], normalize(ref[0, pos][None])[0]) < TOLERANCE
    sibling = (int(ids[pos + 1]) + 1) % 64
    fed = Tree.from_parents([int(ids[pos + 1]), sibling], [-1, -1])
    level = drafter._level_logprobs(fed, 0)
    assert _relative(level[0], normalize(ref[1, pos][None])[0]) < TOLERANCE
    fed = fed.grow(mx.array([int(ids[pos + 2])]), mx.array([0]))
    level = drafter._level_logprobs(fed, 2)
    assert _relative(level[0], normalize(ref[2, pos][None])[0]) < TOLERANCE


@pytest.mark.parametrize("name", EAGLE1)
def test_original_eagle_heads_match_the_authors_code(name):
    """Every pair's logits (through the target's output layer) and a two-step
    chain from the last pair equal those of the authors' ``cnets1.Model``
    (one layer; two layers with q/k/v biases)."""
    io = _io(name)
    head = load_published(FIXTURES / name, _fixture_target(io))
    context = EagleContext(head)
    out = context.feed(io["hidden_states"], io["input_ids"], None)
    context.fed = out.shape[1]
    assert _relative(head.vocab.small_logits(out[0]), io["logits"]) < TOLERANCE
    g = out[:, -1:]
    for k, token in enumerate(io["chain_tokens"]):
        g = context.step(g, token.astype(mx.uint32), context.fed + k)
        got = head.vocab.small_logits(g.reshape(1, -1))[0]
        assert _relative(got, io["chain_logits"][k]) < TOLERANCE, (name, k)


@pytest.mark.parametrize("name", DFLASH)
def test_dflash_blocks_match_the_reference(name):
    """The block logits at each anchor, over the context before it, equal the
    reference's (a draft vocabulary with d2t, and the authors' format reading
    the target's output layer)."""
    io = _io(name)
    target = _fixture_target(io)
    draft = load_published(FIXTURES / name, target)
    assert isinstance(draft, DFlashDraft)
    for anchor, ref in zip(io["anchors"].tolist(), io["block_logits"]):
        cache = draft.module.head_cache()
        draft.module.add_context(io["hidden_states"][:anchor], 0, cache)
        block = [int(io["input_ids"][anchor])]
        block += [draft.args.mask_token_id] * (ref.shape[0] - 1)
        h = draft.module.block(draft.embed(mx.array([block])), anchor, cache)
        got = draft.logits(h[0])
        if draft.ids is not None:
            got = got[:, draft.ids]
        assert _relative(got, ref) < TOLERANCE, (name, anchor)


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(hidden_size=32, num_attention_heads=4), "width 16, the target's are 32"),
        (dict(vocab_size=80), "vocabulary has 64 tokens, the target's 80"),
        (dict(num_hidden_layers=3), "beyond the target's 3 blocks"),
    ],
)
def test_a_head_for_another_target_is_refused_in_one_line(change, words):
    fields = dict(
        model_type="llama",
        hidden_size=16,
        num_hidden_layers=6,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    fields.update(change)
    target = llama.Model(llama.ModelArgs(**fields))
    for name in ("eagle3-llama-d2t", "dflash-authors"):
        with pytest.raises(ValueError) as err:
            load_published(FIXTURES / name, target)
        message = str(err.value)
        assert "\n" not in message and words in message and "does not fit" in message


def test_unsupported_layers_and_pickled_weights_are_refused_in_one_line(
    fixture_target, tmp_path
):
    folder = tmp_path / "qwen35"
    shutil.copytree(FIXTURES / "eagle3-llama-d2t", folder)
    config = json.loads((folder / "config.json").read_text())
    config["transformer_layer_config"]["model_type"] = "qwen3_5_text"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="type 'qwen3_5_text' are not supported"):
        load_published(folder, fixture_target)
    for change, words in (
        (
            {"architectures": ["DFlash2DraftModel"]},
            "DFlash2DraftModel drafters are not",
        ),
        ({"layer_types": ["sliding_attention"] * 2}, "sliding-window or causal layers"),
    ):
        folder = tmp_path / words.split()[0]
        shutil.copytree(FIXTURES / "dflash-authors", folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(change)
        (folder / "config.json").write_text(json.dumps(config))
        assert published_kind(folder) == "dflash"
        with pytest.raises(ValueError, match=words):
            load_published(folder, fixture_target)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(FIXTURES / "specforge-llama" / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no .safetensors weights .*pytorch_model.bin"):
        load_published(pickled, fixture_target)


# --------------------------------------------------------------------------- #
# Drafting with imported heads: exact
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(VOCAB, num_layers=2)


@pytest.fixture(scope="module")
def imported(tiny, tmp_path_factory):
    """Random heads of each kind for the tiny target, written in the published
    formats and loaded back: EAGLE-3 with a draft vocabulary, DFlash with the
    target's output layer."""
    root = tmp_path_factory.mktemp("published")
    eagle = load_published(
        random_eagle3(tiny, root / "eagle3", seed=2, ids=[1, 3, 4, 6]), tiny
    )
    dflash = load_published(random_dflash(tiny, root / "dflash", seed=3), tiny)
    eagle1 = load_published(random_eagle1(tiny, root / "eagle1", seed=6), tiny)
    return {"eagle": eagle, "dflash": dflash, "eagle1": eagle1}


@pytest.mark.parametrize(
    "method, kind",
    [
        ("eagle", "eagle"),
        ("eagle-chain", "eagle"),
        ("auto", "eagle"),
        ("dflash", "dflash"),
        ("auto", "dflash"),
        ("eagle", "eagle1"),
        ("eagle-chain", "eagle1"),
    ],
)
def test_imported_heads_decode_greedy_exactly(tiny, imported, method, kind):
    config = SpecConfig(method=method, max_tokens=40, adaptive=False)
    stats = SpecStats()
    events = speculative_events(
        mx.array(PROMPT), tiny, imported[kind], config=config, stats=stats
    )
    assert [e.token for e in events] == greedy_continuation(tiny, PROMPT, 40)[0]
    assert stats.accepted_tokens > 0


@pytest.mark.parametrize("name", [*EAGLE3, *DFLASH, *EAGLE1])
def test_every_fixture_format_decodes_greedy_exactly(name):
    """Each published format and variant as the reference code wrote it (SpecForge
    and the DFlash authors' folders too) drafts in the engine and keeps greedy
    output equal to the target's own."""
    io = _io(name)
    target = _fixture_target(io if "verifier_embed" in io else None)
    head = load_published(FIXTURES / name, target)
    prompt = [int(t) for t in io["input_ids"].reshape(-1)[:6].tolist()]
    plain = greedy_continuation(target, prompt, 24)[0]
    for method in ("dflash",) if name in DFLASH else ("eagle", "eagle-chain"):
        config = SpecConfig(method=method, max_tokens=24, adaptive=False)
        stats = SpecStats()
        events = speculative_events(
            mx.array(prompt), target, head, config=config, stats=stats
        )
        assert [e.token for e in events] == plain, (name, method)
        assert stats.draft_tokens > 0, (name, method)


@pytest.mark.parametrize(
    "method, kind",
    [
        ("eagle", "eagle"),
        ("eagle-chain", "eagle"),
        ("dflash", "dflash"),
        ("eagle-chain", "eagle1"),
    ],
)
def test_imported_heads_sample_the_exact_law(tiny, imported, method, kind):
    """The first three sampled tokens follow the target's joint law: ``eagle-chain``
    and ``dflash`` rejection-sample on the head's own laws, ``eagle`` proposes
    top-k trees (EAGLE-3 heads with a draft vocabulary, DFlash, original EAGLE)."""
    config = SpecConfig(
        method=method, max_tokens=3, temp=1.0, adaptive=False, tree_budget=6
    )
    counts, accepted = _sampled_openings(tiny, imported[kind], config, seed=11)
    assert accepted > 200 // 4
    assert_counts_follow_law(counts, _exact_law_of_three(tiny, 1.0).reshape(-1))


def test_imported_heads_next_to_a_quantized_target_take_its_quantization(
    tmp_path,
):
    """4-bit target: the heads' linear layers are 4-bit too, and decoding stays
    exact (EAGLE-3, DFlash, original EAGLE)."""
    target = tiny_llama(VOCAB, num_layers=2)
    nn.quantize(target, group_size=32, bits=4)
    plain = greedy_continuation(target, PROMPT, 40)[0]
    heads = {
        "eagle": load_published(random_eagle3(target, tmp_path / "e", seed=6), target),
        "dflash": load_published(random_dflash(target, tmp_path / "d", seed=5), target),
        "eagle1": load_published(random_eagle1(target, tmp_path / "o", seed=6), target),
    }
    for method, head in (
        ("eagle", heads["eagle"]),
        ("eagle-chain", heads["eagle"]),
        ("dflash", heads["dflash"]),
        ("eagle", heads["eagle1"]),
        ("eagle-chain", heads["eagle1"]),
    ):
        assert (4, 32) in linear_quantizations(head.module), method
        if "embed_tokens" in head.module:  # EAGLE-3 keeps its own, quantized too
            assert isinstance(head.module.embed_tokens, nn.QuantizedEmbedding)
        stats = SpecStats()
        config = SpecConfig(method=method, max_tokens=40, adaptive=False)
        events = speculative_events(
            mx.array(PROMPT), target, head, config=config, stats=stats
        )
        assert [e.token for e in events] == plain, method
        assert stats.accepted_tokens > 0, method


# --------------------------------------------------------------------------- #
# Export
# --------------------------------------------------------------------------- #


def test_an_exported_eagle3_head_drafts_the_same_tokens(fixture_target, tmp_path):
    """Export (speculators' format), load: the same logits and the same greedy drafts."""
    name = "eagle3-two-layers-fc-norm-norm-output"
    head = load_published(FIXTURES / name, fixture_target)
    save_speculators_eagle3(tmp_path / "out", head.module, ids=head.vocab.ids)
    again = load_published(tmp_path / "out", fixture_target)
    io = _io(name)
    for pos in (0, 4):
        first = _chain_logits(head, io, pos, 3)
        second = _chain_logits(again, io, pos, 3)
        assert mx.array_equal(first, second)
        assert mx.array_equal(mx.argmax(first, -1), mx.argmax(second, -1))


def _own_eagle3_dir(target, path, seed: int, ids=None):
    """A random ``--kind eagle3`` head directory for ``target``."""
    head = random_head(
        "eagle3", target, seed=seed, draft_ids=None if ids is None else mx.array(ids)
    )
    save_head(
        path,
        "eagle3",
        head.module,
        target_fingerprint=model_fingerprint(target),
        draft_ids=head.vocab.ids,
    )
    return path


@pytest.mark.parametrize("bits", [None, 4])
def test_our_eagle3_head_exported_and_imported_drafts_the_same(bits, tmp_path):
    """A ``--kind eagle3`` head and its speculators export, loaded next to a float
    and a 4-bit target: the same logits bit for bit, the same drafts and
    acceptance in every round, and exact decoding."""
    from mlx_spec.drafters.published.export import export_eagle3

    target = tiny_llama(VOCAB, num_layers=3)
    if bits:
        nn.quantize(target, group_size=32, bits=bits)
    own_dir = _own_eagle3_dir(target, tmp_path / "own", seed=3, ids=[1, 3, 4, 6])
    export_eagle3(own_dir, target, tmp_path / "exported", verifier="tiny")
    own = load_head(own_dir, target)
    again = load_published(tmp_path / "exported", target)
    assert again.format == "speculators-eagle3" and again.kind == own.kind
    assert again.args.feature_layers == own.args.feature_layers
    mx.random.seed(2)
    hidden = mx.random.normal((6, 3 * 32))
    ids = mx.random.randint(0, VOCAB, (6,)).astype(mx.int32)
    for pos in range(6):
        first = unrolled_chain(own, hidden, ids, pos, 3)
        assert mx.array_equal(first, unrolled_chain(again, hidden, ids, pos, 3))
    plain = greedy_continuation(target, PROMPT, 40)[0]
    accepted = 0
    for method in ("eagle", "eagle-chain"):
        rounds = []
        for head in (own, again):
            stats = SpecStats()
            config = SpecConfig(method=method, max_tokens=40, adaptive=False)
            events = speculative_events(
                mx.array(PROMPT), target, head, config=config, stats=stats
            )
            assert [e.token for e in events] == plain, method
            rounds.append(stats.accepted_per_round)
        assert rounds[0] == rounds[1], method
        accepted += sum(rounds[0])
    assert accepted > 0


def test_the_export_command_writes_eagle3_heads_and_refuses_others_in_one_line(
    checkpoints, tmp_path, capsys
):
    from mlx_spec.cli.export import main
    from mlx_spec.loading import load_pair
    from mlx_spec.train.evaluate import engine_acceptance

    model, tokenizer, _ = load_pair(str(checkpoints["llama"]), None)
    own_dir = _own_eagle3_dir(model, tmp_path / "own", seed=4)
    out = tmp_path / "exported"
    argv = ["--model", str(checkpoints["llama"]), "--verifier", "org/target"]
    main(["--head", str(own_dir), "--out", str(out), *argv])
    assert "speculators EAGLE-3" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    # Without --verifier, a local target's path is not written (meaningless elsewhere).
    main(["--head", str(own_dir), "--out", str(tmp_path / "anonymous"), *argv[:2]])
    config = json.loads((tmp_path / "anonymous" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] is None
    assert published_format(out) == "speculators-eagle3"
    assert "d2t" not in mx.load(str(out / "model.safetensors"))  # the whole vocabulary
    _, _, loaded = load_pair(str(checkpoints["llama"]), str(out))
    assert isinstance(loaded, PublishedHead)
    # The engine's acceptance, as measured on the real pair: the same to the digit.
    prompts = [tokenizer.encode("def fibonacci(n):"), tokenizer.encode("Hello")]
    measured = [
        engine_acceptance(
            model, tokenizer, head, prompts, [3], max_tokens=24, method="eagle-chain"
        )
        for head in (load_head(own_dir, model), load_published(out, model))
    ]
    assert measured[0] == measured[1] and measured[0][0]["tokens_per_forward"] >= 1
    eagle = random_head("eagle", model, seed=5)
    fingerprint = model_fingerprint(model)
    save_head(tmp_path / "eagle", "eagle", eagle.module, target_fingerprint=fingerprint)
    for head, words in (
        (tmp_path / "eagle", "is not EAGLE-3-shaped"),
        (tmp_path / "nothing", "holds no head"),
        (own_dir, "already holds files"),
    ):
        target = out if head == own_dir else tmp_path / "again"
        with pytest.raises(SystemExit) as exit:
            main(["--head", str(head), "--out", str(target), *argv])
        assert exit.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err


# --------------------------------------------------------------------------- #
# Front ends
# --------------------------------------------------------------------------- #


def test_the_command_line_runs_a_published_folder_by_its_kind(
    checkpoints, tmp_path, capsys
):
    """``--draft-model FOLDER`` alone picks the folder's method; results are exact."""
    from mlx_spec.cli.generate import main
    from mlx_spec.cli.hook import speculative_method
    from mlx_spec.loading import load_pair

    model, _, _ = load_pair(str(checkpoints["llama"]), None)
    random_eagle3(model, tmp_path / "eagle3", seed=7)
    random_dflash(model, tmp_path / "dflash", seed=8)
    texts = {}
    for folder, method in (("eagle3", "none"), ("eagle3", None), ("dflash", None)):
        argv = ["--model", str(checkpoints["llama"]), "--draft-model"]
        argv += [str(tmp_path / folder)]
        argv += [] if method is None else ["--speculative", method]
        argv += ["--prompt", "def fibonacci(n):", "--max-tokens", "16", "--temp", "0"]
        main(argv)
        out = capsys.readouterr().out
        texts[(folder, method)] = out.split("==========")[1]
    assert len(set(texts.values())) == 1
    ns = type("Args", (), {"speculative": None})
    for folder, kind in (("eagle3", "eagle"), ("dflash", "dflash")):
        ns.draft_model = str(tmp_path / folder)
        assert speculative_method(ns) == kind


def test_our_exported_eagle3_head_gives_the_reference_logits():
    """``mlx-spec-eagle3``: one of our own ``--kind eagle3`` heads (briefly
    trained), written by ``mlx_spec export``'s code. speculators'
    ``Eagle3DraftModel`` loaded it and recorded its training-time-test steps
    (``reference_step_logits``); they are the logits the head directory drafted
    with (``step_logits``), and mlx-spec's chains on the folder give them too."""
    name = "mlx-spec-eagle3"
    io = _io(name)
    target = _fixture_target()
    target.model.embed_tokens.weight = io["verifier_embed"]
    assert published_format(FIXTURES / name) == "speculators-eagle3"
    head = load_published(FIXTURES / name, target)
    assert head.vocab.size == 32 and head.args.feature_layers == [1, 2, 4]
    ref = io["reference_step_logits"]  # (steps, T, C)
    assert _relative(io["step_logits"], ref) < TOLERANCE
    for pos in range(ref.shape[1]):
        got = _chain_logits(head, io, pos, ref.shape[0])
        assert _relative(got, ref[:, pos]) < TOLERANCE, pos


@pytest.mark.parametrize("own", [False, True])
def test_the_export_script_writes_a_head_and_the_logits_the_reference_checks(
    tmp_path, own
):
    """``scripts/export_for_reference.py``: the folder loads, and the logits beside
    it are the loaded head's own three unrolled steps (with ``--own``, those of
    the ``--kind eagle3`` head directory it exported)."""
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "export_for_reference.py"
    spec = importlib.util.spec_from_file_location("export_for_reference", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(tmp_path / "exported")] + (["--own"] if own else []))
    io = mx.load(str(tmp_path / "exported.io.safetensors"))
    head = load_published(tmp_path / "exported", script.small_target())
    assert head.vocab.size == 32 and published_format(tmp_path / "exported")
    for pos in (0, 6):
        got = _chain_logits(head, io, pos, 3)
        assert _relative(got, io["step_logits"][:, pos]) < TOLERANCE


def test_a_server_runs_the_methods_of_its_published_drafter(imported):
    """The server offers a published head's methods and names what a request
    lacks in one line."""
    from mlx_spec.serve.requests import (
        RequestError,
        check_request_method,
        runnable_methods,
    )

    assert "dflash" in runnable_methods(imported["dflash"])
    assert "eagle" not in runnable_methods(imported["dflash"])
    assert {"eagle", "eagle-chain"} <= set(runnable_methods(imported["eagle"]))
    check_request_method("dflash", imported["dflash"])
    with pytest.raises(RequestError) as err:
        check_request_method("dflash", imported["eagle"])
    message = str(err.value)
    assert "\n" not in message and "needs a DFlash drafter" in message
    assert "pass a published DFlash checkpoint folder" in message


def test_a_published_head_takes_the_dtype_of_a_half_precision_target(tmp_path):
    """Next to a bfloat16 target the head computes in bfloat16, and stays exact."""
    target = tiny_llama(VOCAB, num_layers=2)
    target.apply(lambda w: w.astype(mx.bfloat16))
    head = load_published(random_eagle3(target, tmp_path / "e", seed=6), target)
    assert head.module.fc.weight.dtype == mx.bfloat16
    config = SpecConfig(method="eagle", max_tokens=24, adaptive=False)
    events = speculative_events(mx.array(PROMPT), target, head, config=config)
    assert [e.token for e in events] == greedy_continuation(target, PROMPT, 24)[0]


def test_a_short_dflash_round_drafts_what_the_whole_block_drafts():
    """A round asking for fewer tokens than a block still runs the whole block
    (its slots all see each other): its drafts and their laws are the first
    ones of a full round."""
    from mlx_spec.drafters.base import RoundState
    from mlx_spec.drafters.published.dflash import DFlashDrafter

    io = _io("dflash-authors")
    draft = load_published(FIXTURES / "dflash-authors", _fixture_target(io))
    seq = io["input_ids"].tolist()
    laws = {}
    for size in (1, 3):
        drafter = DFlashDrafter(draft)
        drafter.add_features(io["hidden_states"][: len(seq) - 1], None)
        state = RoundState(
            seq, 0, lambda logits, _: (mx.argmax(logits, -1), normalize(logits)), False
        )
        laws[size] = drafter.propose(state, size).logprobs
    assert laws[1].shape[0] == 1 and laws[3].shape[0] == 3
    assert _relative(laws[1][0], laws[3][0]) < TOLERANCE
