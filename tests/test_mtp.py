"""Native MTP drafting (``--speculative mtp``) on checkpoints that ship MTP layers.

The fixtures are tiny random checkpoints in the original Hugging Face
layout (``mlx_spec.testing.make_mtp_checkpoint``): Qwen3-Next and Qwen3.5
(hybrid linear attention + attention, ``mtp.*``) and GLM-4.5 / DeepSeek-V3
(``model.layers.{N}.*`` with ``enorm``, ``hnorm``, ``eh_proj``). The MTP
weights only propose, so exactness holds whatever they are; a briefly
trained MTP layer makes deep acceptance (and the MTP cache's rewinds) run.
"""

import itertools
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import mlx_lm
import numpy as np
import pytest
from law_checks import CHI2_9_999, assert_counts_follow_law, stream_statistics
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model as mlx_lm_load_model
from serving import start_server

from mlx_spec import SpecConfig, SpecStats, stream_generate
from mlx_spec.convert.hf import convert_hf
from mlx_spec.drafters.mtp import MTPDrafter
from mlx_spec.engine import speculative_events
from mlx_spec.loading import load_pair, resolve_draft
from mlx_spec.mtp import MTP_FILE, MTPMissing, load_mtp, missing_message, random_mtp
from mlx_spec.testing import (
    MTP_ARCHITECTURES,
    PROMPTS,
    greedy_continuation,
    make_mtp_checkpoint,
)

ARCHS = MTP_ARCHITECTURES + ("deepseek_v3",)
PROMPT = PROMPTS[0]


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    # Not in the named set: mlx-lm's deepseek_v3 drops block 61 only (see testing).
    return make_mtp_checkpoint(
        tmp_path_factory.mktemp("ds") / "deepseek_v3-mtp", "deepseek_v3", seed=3
    )


@pytest.fixture(scope="module")
def mtp_model(checkpoints, deepseek_dir):
    """``mtp_model(arch) -> (path, model, tokenizer)`` of the MTP checkpoints."""
    cache = {}

    def load(arch):
        if arch not in cache:
            if arch == "deepseek_v3":
                model, _ = mlx_lm_load_model(deepseek_dir, strict=False)
                tokenizer = mlx_lm.utils.load_tokenizer(deepseek_dir)
                cache[arch] = (deepseek_dir, model, tokenizer)
            else:
                path = checkpoints[f"{arch}-mtp"]
                cache[arch] = (path, *mlx_lm.load(str(path)))
        return cache[arch]

    return load


def _plain(model, ids, n):
    return greedy_continuation(model, ids, n)[0]


def _run(model, head, ids, **options):
    stats = SpecStats()
    config = SpecConfig(**{"method": "mtp", "max_tokens": 32, **options})
    out = [
        e.token
        for e in speculative_events(
            mx.array(ids), model, head, config=config, stats=stats
        )
    ]
    return out, stats


# --------------------------------------------------------------------------- #
# A reference computation of the MTP module, straight from the original tensors
# --------------------------------------------------------------------------- #


def _raw_tensors(path: Path) -> dict:
    out = {}
    for file in sorted(path.glob("model-*.safetensors")):
        out.update(mx.load(str(file)))
    return out


def _rms(x, w, eps=1e-6):
    return x * mx.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _stack(weights: dict, prefix: str) -> dict:
    """Per-expert ``experts.{e}.{p}.weight`` -> ``switch_mlp.{p}.weight``."""
    out = {k: v for k, v in weights.items() if ".experts." not in k}
    for p in ("gate_proj", "up_proj", "down_proj"):
        rows = sorted(
            (int(k.split(".experts.")[1].split(".")[0]), v)
            for k, v in weights.items()
            if k.startswith(prefix + "experts.") and k.endswith(f".{p}.weight")
        )
        if rows:
            out[f"{prefix}switch_mlp.{p}.weight"] = mx.stack([v for _, v in rows])
    return out


class Reference:
    """The MTP layer as the vLLM files cited in mlx_spec.mtp describe it.

    Built from the checkpoint's tensors with this test's own mapping, and run
    without any cache: every draft step recomputes all pairs from scratch.
    """

    def __init__(self, arch, path, model):
        raw = _raw_tensors(path)
        self.model = model
        inner = getattr(model, "language_model", model)
        args = inner.args
        if arch in ("qwen3_next", "qwen3_5"):
            get = lambda n: raw[f"mtp.{n}"]  # noqa: E731
            # Qwen stores each RMSNorm scale as (scale - 1).
            self.e_norm = 1 + get("pre_fc_norm_embedding.weight")
            self.h_norm = 1 + get("pre_fc_norm_hidden.weight")
            self.out_norm = 1 + get("norm.weight")
            self.proj = get("fc.weight")
            block = {
                k[len("mtp.layers.0.") :]: v
                for k, v in raw.items()
                if k.startswith("mtp.layers.0.")
            }
            block = {
                k: (1 + v if k.endswith("norm.weight") else v) for k, v in block.items()
            }
            block = _stack(block, "mlp.")
            if arch == "qwen3_next":
                from mlx_lm.models import qwen3_next as m

                self.block = m.Qwen3NextDecoderLayer(args, 1)  # full attention
            else:
                from mlx_lm.models import qwen3_5 as m

                self.block = m.DecoderLayer(args, 1)
            self.zero_first = False
        else:
            n = f"model.layers.{args.num_hidden_layers}."
            get = lambda k: raw[n + k]  # noqa: E731
            self.e_norm, self.h_norm = get("enorm.weight"), get("hnorm.weight")
            self.out_norm, self.proj = get("shared_head.norm.weight"), get(
                "eh_proj.weight"
            )
            skip = ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")
            block = {
                k[len(n) :]: v
                for k, v in raw.items()
                if k.startswith(n) and not k[len(n) :].startswith(skip)
            }
            block = _stack(block, "mlp.")
            if arch == "glm4_moe":
                from mlx_lm.models import glm4_moe as m

                self.block = m.DecoderLayer(args, args.num_hidden_layers)
            else:
                from mlx_lm.models import deepseek_v3 as m

                kv = block.pop("self_attn.kv_b_proj.weight")
                kv = kv.reshape(
                    args.num_attention_heads,
                    args.qk_nope_head_dim + args.v_head_dim,
                    -1,
                )
                nope = args.qk_nope_head_dim
                block["self_attn.embed_q.weight"] = kv[:, :nope, :].swapaxes(-1, -2)
                block["self_attn.unembed_out.weight"] = kv[:, nope:, :]
                self.block = m.DeepseekV3DecoderLayer(args, args.num_hidden_layers)
            self.zero_first = True  # vLLM masks the embedding at position 0
        self.block.load_weights(list(block.items()))
        self.eps = args.rms_norm_eps
        inner_model = model.model
        self.embedding = inner_model.embed_tokens
        head = getattr(inner, "lm_head", None)
        self.head = head if head is not None else self.embedding.as_linear

    def outputs(self, hidden, tokens):
        """MTP outputs ``(T, H)`` for pairs ``(hidden[j], tokens[j])``, all at once."""
        e = self.embedding(mx.array(tokens))
        if self.zero_first:
            e = mx.concatenate([mx.zeros_like(e[:1]), e[1:]])
        x = mx.concatenate(
            [_rms(e, self.e_norm, self.eps), _rms(hidden, self.h_norm, self.eps)], -1
        )
        x = (x @ self.proj.T)[None]
        out = self.block(x, create_causal_mask(x.shape[1]), None)[0]
        return _rms(out, self.out_norm, self.eps)

    def drafts(self, seq, gamma):
        """Greedy chain of ``gamma`` drafts after ``seq`` (its last token is pending)."""
        hidden = self.model.model(mx.array([seq[:-1]]))[
            0
        ]  # the target's normed features
        tokens = list(seq[1:])
        drafts = []
        for _ in range(gamma):
            g = self.outputs(hidden, tokens)[-1]
            d = int(mx.argmax(self.head(g)).item())
            drafts.append(d)
            hidden = mx.concatenate([hidden, g[None]])  # chained on its own output
            tokens.append(d)
        return drafts


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_proposals_equal_a_reference_computation_from_the_original_tensors(
    mtp_model, monkeypatch, arch
):
    """Every round's drafts equal the MTP module recomputed from scratch on the
    same text: target features of a full forward, all pairs, chained steps."""
    path, model, tokenizer = mtp_model(arch)
    rounds = []
    original = MTPDrafter.propose

    def recording(self, state, size):
        proposal = original(self, state, size)
        rounds.append((list(state.seq), proposal.tokens.tolist()))
        return proposal

    monkeypatch.setattr(MTPDrafter, "propose", recording)
    head = load_mtp(path, model)
    ids = tokenizer.encode(PROMPT)
    _run(model, head, ids, max_tokens=16, num_draft_tokens=3, adaptive=False)
    reference = Reference(arch, path, model)
    assert len(rounds) >= 8
    for seq, drafts in rounds:
        assert drafts == reference.drafts(seq, len(drafts)), len(seq)


# --------------------------------------------------------------------------- #
# Exactness
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_greedy_identity_with_plain_mlx_lm_at_several_gammas(mtp_model, arch):
    path, model, tokenizer = mtp_model(arch)
    head = load_mtp(path, model)
    ids = tokenizer.encode(PROMPT)
    plain = _plain(model, ids, 24)
    for gamma in (1, 3, 6):
        out, stats = _run(
            model, head, ids, max_tokens=24, num_draft_tokens=gamma, adaptive=False
        )
        assert out == plain, gamma
        assert stats.draft_tokens > 0
    out, stats = _run(model, head, ids, max_tokens=24, method="auto")
    assert out == plain and stats.auto_rounds.get("mtp", 0) > 0


def _fit(head, model, tokenizer, steps=30):
    """Train the MTP layer briefly on the target's greedy text (deep acceptance)."""
    seqs = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        seqs.append(ids + _plain(model, ids, 40))
    n = min(len(s) for s in seqs)
    x = mx.array([s[:n] for s in seqs])
    hidden = model.model(x)
    emb = head.embed(x[:, 1:-1])

    def loss(module):
        return nn.losses.cross_entropy(
            head.logits(module(hidden[:, :-2], emb)), x[:, 2:]
        ).mean()

    opt = optim.Adam(learning_rate=3e-2)
    step = nn.value_and_grad(head.module, loss)
    for _ in range(steps):
        _, grads = step(head.module)
        opt.update(head.module, grads)
        mx.eval(head.module.parameters(), opt.state)
    return head


@pytest.fixture(scope="module")
def trained(mtp_model):
    """The qwen3_5 target (hybrid caches) with a briefly trained MTP layer."""
    path, model, tokenizer = mtp_model("qwen3_5")
    return model, tokenizer, _fit(load_mtp(path, model), model, tokenizer)


@pytest.mark.parametrize("gamma", [2, 5])
def test_trained_mtp_accepts_deep_drafts_on_a_hybrid_model_and_stays_exact(
    trained, gamma
):
    model, tokenizer, head = trained
    ids = tokenizer.encode(PROMPTS[0])
    out, stats = _run(
        model, head, ids, max_tokens=40, num_draft_tokens=gamma, adaptive=False
    )
    assert out == _plain(model, ids, 40)
    assert stats.accepted_tokens >= 15
    assert max(stats.accepted_per_round) >= 2


def test_trained_mtp_prompt_cache_continues_the_next_turn_exactly(trained):
    model, tokenizer, head = trained
    first, second = tokenizer.encode(PROMPTS[0]), tokenizer.encode("\n    return")
    cache = make_prompt_cache(model) + make_prompt_cache(head)
    turn = [
        r.token
        for r in stream_generate(
            model,
            tokenizer,
            first,
            draft_model=head,
            speculative="mtp",
            max_tokens=20,
            prompt_cache=cache,
        )
    ]
    again = [
        r.token
        for r in stream_generate(
            model,
            tokenizer,
            second,
            draft_model=head,
            speculative="mtp",
            max_tokens=20,
            prompt_cache=cache,
        )
    ]
    plain = _plain(model, first, 20)
    assert turn == plain
    assert again == _plain(model, first + plain + second, 20)


VOCAB = 8
LAW_PROMPT = [3, 1, 4, 1, 5]


def _tiny(arch):
    """A tiny ``arch`` model over 8 tokens whose laws spread over the vocabulary."""
    from mlx_lm.utils import _get_classes

    from mlx_spec.testing.mtp import _mtp_config

    config = _mtp_config(arch, VOCAB)
    config["num_hidden_layers"] -= 1  # qwen3_next: linear then full attention
    model_class, args_class = _get_classes(config)
    mx.random.seed(11)
    model = model_class(args_class.from_dict(config))
    inner = getattr(model, "language_model", model)
    inner.lm_head.weight = 0.3 * mx.random.normal(inner.lm_head.weight.shape)
    mx.eval(model.parameters())
    return model


def _exact_law_of_three(model, temp=1.0) -> np.ndarray:
    """``(V, V, V)``: the target's probability of each first three tokens."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    batch = mx.array([LAW_PROMPT + list(p) for p in pairs])
    probs = np.array(mx.softmax(model(batch)[:, -3:] / temp, axis=-1), dtype=np.float64)
    law = np.empty((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        law[a, b, :] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return law


@pytest.mark.parametrize("arch", ["qwen3_next", "deepseek_v3"])
def test_mtp_sampled_first_three_tokens_follow_the_exact_law(arch):
    """Chi-square of 200 sampled 3-token openings against the exact joint law;
    drafts are drawn from the MTP's law and corrected by rejection sampling."""
    model = _tiny(arch)
    head = random_mtp(model, seed=2, moe=arch == "qwen3_next")
    law = _exact_law_of_three(model)
    mx.random.seed(5)
    runs, counts, accepted = 200, np.zeros(VOCAB**3), 0
    config = SpecConfig(
        method="mtp", max_tokens=3, temp=1.0, num_draft_tokens=2, adaptive=False
    )
    for _ in range(runs):
        stats = SpecStats()
        a, b, c = (
            e.token
            for e in speculative_events(
                mx.array(LAW_PROMPT), model, head, config=config, stats=stats
            )
        )
        counts[(a * VOCAB + b) * VOCAB + c] += 1
        accepted += stats.accepted_tokens
    assert accepted > runs // 4  # drafts were accepted, not just corrected
    assert_counts_follow_law(counts, law.reshape(-1))


def test_mtp_sampled_stream_follows_the_target_law(mtp_model):
    """A long sampled stream: randomized PIT chi-square and standardised log-likelihood."""
    path, model, tokenizer = mtp_model("glm4_moe")
    head = load_mtp(path, model)
    ids = tokenizer.encode(PROMPT)
    mx.random.seed(3)
    out, _ = _run(model, head, ids, max_tokens=150, temp=1.0)
    logits = model(mx.array([ids + out[:-1]]))[0, len(ids) - 1 :]
    laws = np.array(mx.softmax(logits, axis=-1), dtype=np.float64)
    chi2, z = stream_statistics(laws, np.array(out))
    assert chi2 < CHI2_9_999 and abs(z) < 4, (chi2, z)


# --------------------------------------------------------------------------- #
# Weights: what the loader reads, the converter keeps, and the one-line refusals
# --------------------------------------------------------------------------- #


def _params(head):
    return dict(tree_flatten(head.module.parameters()))


def _same(a, b):
    pa, pb = _params(a), _params(b)
    return pa.keys() == pb.keys() and all(
        mx.array_equal(pa[k], pb[k]).item() for k in pa
    )


@pytest.mark.parametrize("arch", MTP_ARCHITECTURES)
def test_converter_keeps_the_mtp_layer_that_mlx_lm_drops(mtp_model, tmp_path, arch):
    path, model, _ = mtp_model(arch)
    out = convert_hf(path, tmp_path / "out", log=lambda _: None)
    assert (out / MTP_FILE).is_file()
    converted, _ = mlx_lm.load(str(out))  # still a plain mlx-lm checkpoint
    x = mx.array([[5, 6, 7, 8]])
    assert mx.array_equal(converted(x), model(x)).item()
    assert _same(load_mtp(out, converted), load_mtp(path, model))


def test_quantized_conversion_quantizes_the_mtp_layer_like_the_model(
    mtp_model, tmp_path
):
    path, model, _ = mtp_model("qwen3_next")
    out = convert_hf(
        path,
        tmp_path / "q",
        quantize=True,
        q_group_size=32,
        q_bits=4,
        log=lambda _: None,
    )
    converted, _ = mlx_lm.load(str(out))
    head = load_mtp(out, converted)
    expected = load_mtp(path, model)
    # What mlx-lm does to the model: its quant_predicate gives the MoE gates 8 bits.
    predicate = model.quant_predicate

    def choose(p, m):
        return (
            hasattr(m, "to_quantized")
            and m.weight.shape[-1] % 32 == 0
            and predicate(p, m)
        )

    nn.quantize(expected.module, 32, 4, class_predicate=choose)
    assert head.module.block.mlp.gate.bits == 8 and head.module.proj.bits == 4
    assert _same(head, expected)


def test_checkpoint_without_mtp_weights_says_so_in_one_line(
    mtp_model, checkpoints, tmp_path
):
    from mlx_lm.convert import convert

    path, _, _ = mtp_model("qwen3_next")
    plain_dir = tmp_path / "mlx-community-style"
    convert(str(path), str(plain_dir))  # mlx-lm's converter drops the MTP tensors
    model, tokenizer = mlx_lm.load(str(plain_dir))
    with pytest.raises(MTPMissing) as error:
        load_mtp(plain_dir, model)
    assert str(error.value) == missing_message(plain_dir) and "\n" not in str(
        error.value
    )
    assert "mlx-lm's converter drops them" in str(error.value)
    # auto then runs without it; mtp with the original as --draft-model works.
    assert resolve_draft("auto", str(plain_dir), None, model, tokenizer) is None
    head = resolve_draft("mtp", str(plain_dir), str(path), model, tokenizer)
    ids = tokenizer.encode(PROMPT)
    assert _run(model, head, ids, max_tokens=12)[0] == _plain(model, ids, 12)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_spec.generate",
            "--model",
            str(plain_dir),
            "--prompt",
            "x",
            "--speculative",
            "mtp",
            "--max-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"mlx_spec.generate: error: {missing_message(plain_dir)}"
    ]


def test_models_without_mtp_layers_are_refused_in_one_line(load_model, checkpoints):
    model, tokenizer = load_model("llama")
    with pytest.raises(ValueError, match="model type 'llama' has no native MTP layers"):
        load_mtp(checkpoints["llama"], model)
    with pytest.raises(ValueError, match="drafts with the model's own MTP layer"):
        _run(model, None, [1, 2, 3])
    qwen, _ = load_model("qwen3_next")  # mlx-form, no MTP tensors
    with pytest.raises(MTPMissing):
        load_mtp(checkpoints["qwen3_next"], qwen)


def test_mtp_layer_is_checked_against_its_target(mtp_model, tmp_path):
    path, model, tokenizer = mtp_model("glm4_moe")
    other, _ = mlx_lm.load(str(path))
    head = load_mtp(path, model)
    with pytest.raises(ValueError, match="another model object"):
        _run(other, head, [1, 2, 3])
    qpath, qwen, _ = mtp_model("qwen3_next")
    with pytest.raises(ValueError, match="do not fit model type 'qwen3_5'"):
        load_mtp(qpath, mtp_model("qwen3_5")[1])


def test_command_line_mtp_and_auto_use_the_checkpoints_mtp_layer(mtp_model, tmp_path):
    path, model, tokenizer = mtp_model("qwen3_next")
    ids = tokenizer.encode(PROMPT)
    plain = tokenizer.decode(_plain(model, ids, 10))
    for method in ("mtp", None):
        stats = tmp_path / f"{method}.json"
        cmd = [
            sys.executable,
            "-m",
            "mlx_spec.generate",
            "--model",
            str(path),
            "--prompt",
            PROMPT,
            "--max-tokens",
            "10",
            "--ignore-chat-template",
            "--stats-json",
            str(stats),
        ]
        if method:
            cmd += ["--speculative", method]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert plain in result.stdout
        record = json.loads(stats.read_text())
        if method == "mtp":
            assert record["method"] == "mtp" and record["draft_tokens"] > 0
        else:
            assert record["method"] == "auto" and "mtp" in record["auto_rounds"]
    _, _, draft = load_pair(str(path), None, "lookup")
    assert draft is None  # methods that need no draft do not load it


def test_the_server_loads_the_checkpoints_mtp_layer_and_stays_exact(mtp_model):
    """``mlx_spec.server --speculative mtp`` drafts with the checkpoint's own
    MTP layer (no --draft-model), and every request equals plain decoding."""
    path, model, tokenizer = mtp_model("qwen3_next")
    server = start_server("--model", str(path), "--speculative", "mtp", max_tokens=20)
    try:
        expected = mlx_lm.generate(model, tokenizer, PROMPT, max_tokens=20)
        for method in (None, "mtp", "auto"):
            body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0.0}
            if method is not None:
                body["speculative"] = method
            answer = _post_json(server.url + "/v1/completions", body)
            assert answer["choices"][0]["text"] == expected, method
            assert answer["speculative_stats"]["method"] == (method or "mtp")
    finally:
        server.stop()


def _post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_a_sharded_target_drafts_without_its_mtp_layer(mtp_model):
    # The rule generate, chat and the server share: the MTP layer is not sharded.
    from mlx_spec.loading import SHARDED_MTP, draft_source

    path, model, _ = mtp_model("qwen3_next")
    path = str(path)
    assert draft_source("auto", path, None, model) == ("mtp", path)
    assert draft_source("auto", path, None, model, sharded=True) is None
    with pytest.raises(ValueError) as error:
        draft_source("mtp", path, None, model, sharded=True)
    assert str(error.value) == SHARDED_MTP
