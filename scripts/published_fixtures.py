"""Build the reference fixtures of published drafter formats with the reference code.

Run with a throwaway virtualenv that has ``torch`` and ``speculators`` (never
the project's own environment; CI needs neither)::

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.14.1 "transformers>=5,<=5.19" \\
        safetensors pydantic pydantic-settings loguru numpy huggingface-hub \\
        rich typer click openai psutil protobuf aiohttp httpx "datasets<=5.1.0"
    /tmp/refvenv/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    /tmp/refvenv/bin/python scripts/published_fixtures.py tests/fixtures/published \\
        --eagle-source EAGLE/eagle/model

The committed fixtures were built with speculators 0.9.0, torch 2.14.1,
transformers 5.19.0 and the EAGLE authors' repository at commit cb7e084;
rebuilding with those gives the same bytes (every draw is seeded).

For each variant it builds a small random checkpoint with speculators' own
model classes (``Eagle3DraftModel``, ``DFlashDraftModel``), saves it in the
format's folder layout, and records the reference outputs for fixed inputs
in ``<variant>.io.safetensors`` beside its folder:

- EAGLE-3: logits of three training-time-test steps (the reference's
  unrolled drafting: step ``k`` at position ``t`` is the chain drafted from
  pair ``t`` fed the tokens ``ids[t+1..t+k]``), for given target features
  and tokens;
- DFlash: the block logits at chosen anchors, over the context before each.

SpecForge-format and DFlash-authors-format folders hold the same reference
weights under those formats' names and configs (neither package is on PyPI).
With ``--eagle-source DIR`` (the ``eagle/model`` folder of a checkout of the
EAGLE authors' repository) it also builds original EAGLE-1/2 heads with
their ``cnets1.Model`` and records their outputs and chained drafts.
With ``--check-export DIR`` it instead loads an EAGLE-3 head exported by
mlx-spec into ``Eagle3DraftModel`` and compares its step logits with the
``DIR.io.safetensors`` mlx-spec wrote beside it; ``--record`` also keeps
the reference's logits there (``reference_step_logits``), so a test without
torch checks them. The committed ``mlx-spec-eagle3`` fixture, one of our own
``train-draft --kind eagle3`` heads as ``mlx_spec export`` writes it, is
made with::

    python scripts/export_for_reference.py --own tests/fixtures/published/mlx-spec-eagle3
    /tmp/refvenv/bin/python scripts/published_fixtures.py \
        tests/fixtures/published/mlx-spec-eagle3 --check-export --record
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HIDDEN = 16
VOCAB = 64
DRAFT_VOCAB = 32
TARGET_LAYERS = 6
TOKENS = 7
STEPS = 3


def io_path(folder: Path) -> Path:
    """Where a checkpoint folder's inputs and reference outputs are kept: beside it."""
    return folder.parent / f"{folder.name}.io.safetensors"


def _layer_config(model_type: str, **extra):
    from transformers import LlamaConfig
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    cls = Qwen3Config if model_type == "qwen3" else LlamaConfig
    fields = dict(
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=1,
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    fields.update(extra)
    config = cls(**fields)
    config._attn_implementation = "eager"
    return config


def _speculators_config(algorithm: str, tokens: int):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm=algorithm,
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=tokens)],
        default_proposal_method="greedy",
        verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
    )


def _randomize(model, seed: int):
    """Every parameter drawn small and seeded (norm weights near 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def _vocab_map(draft: int, seed: int):
    """``(d2t, t2d)``: ``draft`` sorted target ids as offsets, and the target mask."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(VOCAB, generator=gen)[:draft]).values
    d2t = ids - torch.arange(draft)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def _save_folder(model, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "config.py").unlink(missing_ok=True)  # speculators' own source


def _capture_step_logits(model):
    """Hook ``lm_head``: the list it fills with each call's output."""
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    return seen


def eagle3_variant(out: Path, name: str, seed: int, layer_type: str, **options):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    layer_extra = options.pop("layer_extra", {})
    layers = options.pop("num_layers", 1)
    draft_vocab = options.pop("draft_vocab", DRAFT_VOCAB)
    ids = options.pop("layer_ids", [2, 3, 5])
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=_layer_config(
            layer_type, num_hidden_layers=layers, **layer_extra
        ),
        draft_vocab_size=draft_vocab,
        eagle_aux_hidden_state_layer_ids=ids,
        speculators_config=_speculators_config("eagle3", STEPS),
        **options,
    )
    torch.manual_seed(seed)
    model = Eagle3DraftModel(config).eval()
    _randomize(model, seed)
    if draft_vocab < VOCAB:
        d2t, t2d = _vocab_map(draft_vocab, seed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    folder = out / name
    _save_folder(model, folder)
    gen = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(1, TOKENS, len(ids) * HIDDEN, generator=gen)
    input_ids = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
    seen = _capture_step_logits(model)
    with torch.no_grad():
        model(
            hidden_states=hidden,
            input_ids=input_ids,
            document_ids=torch.zeros(1, TOKENS, dtype=torch.long),
            ttt_steps=STEPS,
        )
    save_file(
        {
            "hidden_states": hidden[0].contiguous(),
            "input_ids": input_ids[0].to(torch.int32).contiguous(),
            "step_logits": torch.stack([s[0] for s in seen]).contiguous(),
        },
        str(io_path(folder)),
    )
    return model, folder


def specforge_copy(model, source: Path, folder: Path):
    """The reference weights under SpecForge's names and flat Llama config."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(source / "model.safetensors"))
    renamed = {
        (k.replace("layers.0.", "midlayer.") if k.startswith("layers.0.") else k): v
        for k, v in weights.items()
    }
    save_file(renamed, str(folder / "model.safetensors"))
    spec = json.loads((source / "config.json").read_text())
    layer = dict(spec["transformer_layer_config"])
    layer.update(
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=spec["draft_vocab_size"],
        # SpecForge names the same layers by their outputs (SGLang adds one).
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": [
                i - 1 for i in spec["eagle_aux_hidden_state_layer_ids"]
            ],
            "use_aux_hidden_state": True,
        },
    )
    (folder / "config.json").write_text(json.dumps(layer, indent=2) + "\n")
    shutil.copy(io_path(source), io_path(folder))


def _fixed_anchors(anchors):
    def select(loss_mask, num_anchors, block_size):
        a = torch.tensor(anchors, dtype=torch.long)
        return a, torch.ones(len(anchors), dtype=torch.bool)

    return select


def dflash_variant(out: Path, name: str, seed: int, draft_vocab: int, authors: bool):
    import speculators.models.dflash.core as core
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    block, anchors, ids = 4, [1, 3], [1, 3, 4]
    mask_id = VOCAB - 1
    config = DFlashSpeculatorConfig(
        transformer_layer_config=_layer_config("qwen3", num_hidden_layers=2),
        draft_vocab_size=draft_vocab,
        block_size=block,
        aux_hidden_state_layer_ids=ids,
        mask_token_id=mask_id,
        speculators_config=_speculators_config("dflash", block - 1),
    )
    torch.manual_seed(seed)
    model = DFlashDraftModel(config).eval()
    _randomize(model, seed)
    if draft_vocab < VOCAB:
        d2t, t2d = _vocab_map(draft_vocab, seed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    else:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.verifier_lm_head.weight)
    folder = out / name
    _save_folder(model, folder)
    if authors:  # the authors' config: ids name block outputs, no lm_head
        spec = json.loads((folder / "config.json").read_text())
        layer = dict(spec["transformer_layer_config"])
        layer.update(
            architectures=["DFlashDraftModel"],
            num_target_layers=TARGET_LAYERS,
            dflash_config={
                "block_size": block,
                "mask_token_id": mask_id,
                "target_layer_ids": [i - 1 for i in ids],
            },
        )
        (folder / "config.json").write_text(json.dumps(layer, indent=2) + "\n")
        weights = load_file(str(folder / "model.safetensors"))
        weights = {k: v for k, v in weights.items() if k not in ("lm_head.weight",)}
        save_file(weights, str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(1, TOKENS, len(ids) * HIDDEN, generator=gen)
    input_ids = torch.randint(0, VOCAB - 1, (1, TOKENS), generator=gen)
    core.select_anchors = _fixed_anchors(anchors)
    with torch.no_grad():
        _, logits, _, _, _ = model._backbone_forward(
            hidden,
            input_ids,
            torch.ones(1, TOKENS),
            torch.zeros(1, TOKENS, HIDDEN),
            torch.zeros(1, TOKENS, dtype=torch.long),
            max_anchors=len(anchors),
        )
    save_file(
        {
            "hidden_states": hidden[0].contiguous(),
            "input_ids": input_ids[0].to(torch.int32).contiguous(),
            "anchors": torch.tensor(anchors, dtype=torch.int32),
            "block_logits": logits[0].reshape(len(anchors), block, -1).contiguous(),
            # The target's own rows the drafter reads (embedding, output layer).
            "verifier_embed": model.embed_tokens.weight.detach().contiguous(),
            "verifier_lm_head": model.verifier_lm_head.weight.detach().contiguous(),
        },
        str(io_path(folder)),
    )


def eagle1_variant(out: Path, name: str, seed: int, source: Path, **options):
    """An original EAGLE-1/2 head, built with the EAGLE authors' ``cnets1.Model``."""
    sys.path.insert(0, str(source))
    import cnets1
    import configs

    config = configs.EConfig(
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=options.get("num_layers", 1),
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    # transformers 5 fills rope_scaling with its rope_parameters; the
    # authors' code reads the transformers 4 field (None: plain rope).
    config.rope_scaling = None
    if options.get("qkv_bias"):
        config.qkv_bias = True
    model = cnets1.Model(config, bias=True).eval()
    _randomize(model, seed)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    config.to_json_file(str(folder / "config.json"))
    gen = torch.Generator().manual_seed(seed + 1)
    lm_head = 0.3 * torch.randn(VOCAB, HIDDEN, generator=gen)  # the target's
    hidden = torch.randn(1, TOKENS, HIDDEN, generator=gen)
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
    chain = torch.randint(0, VOCAB, (STEPS - 1,), generator=gen)
    with torch.no_grad():
        out_hidden, past = model(hidden, input_ids=ids, use_cache=True)
        h, steps = out_hidden[:, -1:], []
        for token in chain:  # the authors' chained drafting from the last pair
            h, past = model(
                h, input_ids=token.view(1, 1), past_key_values=past, use_cache=True
            )
            steps.append(h[0, -1] @ lm_head.T)
    save_file(
        {
            "hidden_states": hidden[0].contiguous(),
            "input_ids": ids[0].to(torch.int32).contiguous(),
            "logits": (out_hidden[0] @ lm_head.T).contiguous(),
            "chain_tokens": chain.to(torch.int32).contiguous(),
            "chain_logits": torch.stack(steps).contiguous(),
            "verifier_embed": model.embed_tokens.weight.detach().contiguous(),
            "verifier_lm_head": lm_head.contiguous(),
        },
        str(io_path(folder)),
    )


def build(out: Path, eagle_source=None):
    out.mkdir(parents=True, exist_ok=True)
    model, folder = eagle3_variant(out, "eagle3-llama-d2t", 1, "llama")
    specforge_copy(model, folder, out / "specforge-llama")
    eagle3_variant(
        out,
        "eagle3-qwen3-norm-before-residual",
        2,
        "qwen3",
        draft_vocab=VOCAB,
        norm_before_residual=True,
    )
    # transformers' llama layers rotate every channel even with a
    # partial_rotary_factor in the config; this variant pins that too.
    eagle3_variant(
        out,
        "eagle3-two-layers-fc-norm-norm-output",
        3,
        "llama",
        num_layers=2,
        fc_norm=True,
        norm_output=True,
        layer_extra={"partial_rotary_factor": 0.5},
    )
    eagle3_variant(
        out,
        "eagle3-llama3-rope-norm-before-fc",
        4,
        "llama",
        norm_before_fc=True,
        layer_extra={
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    )
    dflash_variant(out, "speculators-dflash-d2t", 5, DRAFT_VOCAB, authors=False)
    dflash_variant(out, "dflash-authors", 6, VOCAB, authors=True)
    if eagle_source is not None:
        eagle1_variant(out, "eagle-authors", 7, eagle_source)
        eagle1_variant(
            out,
            "eagle-authors-two-layers-qkv-bias",
            8,
            eagle_source,
            num_layers=2,
            qkv_bias=True,
        )


def check_export(folder: Path, record: bool = False) -> float:
    """Load an exported head in speculators; the largest relative logit difference.

    With ``record``, the reference's logits join the io file beside ``folder``.
    """
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    # The verifier's own config and weights live on the hub, out of reach here;
    # everything the head itself holds loads through from_pretrained.
    Eagle3DraftModel.load_verifier_weights = lambda self: None
    config = Eagle3SpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"
    # from_pretrained reads a named verifier's config from the hub, only to
    # check the layer ids against its depth.
    config.speculators_config.verifier.name_or_path = None
    model = Eagle3DraftModel.from_pretrained(str(folder), config=config)
    model = model.eval().float()
    io = load_file(str(io_path(folder)))
    seen = _capture_step_logits(model)
    hidden, ids = io["hidden_states"][None], io["input_ids"][None].long()
    with torch.no_grad():
        model(
            hidden_states=hidden,
            input_ids=ids,
            document_ids=torch.zeros_like(ids),
            ttt_steps=io["step_logits"].shape[0],
        )
    ref = torch.stack([s[0] for s in seen])
    ours = io["step_logits"]
    if model.d2t is not None and model.t2d is not None:  # one draft vocabulary map
        ids = torch.arange(model.d2t.shape[0]) + model.d2t
        if not torch.equal(ids, torch.nonzero(model.t2d).flatten()):
            raise SystemExit("exported head: d2t and t2d disagree")
    if record:
        save_file(
            {**io, "reference_step_logits": ref.contiguous()}, str(io_path(folder))
        )
    return float(((ref - ours).abs().max() / ours.abs().max()).item())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="fixture folder to (re)write")
    parser.add_argument(
        "--check-export",
        action="store_true",
        help="treat OUT as an EAGLE-3 head exported by mlx-spec and check it",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="with --check-export: keep the reference's logits beside OUT",
    )
    parser.add_argument(
        "--eagle-source",
        type=Path,
        help="the EAGLE authors' eagle/model folder (with cnets1.py), for "
        "the EAGLE-1/2 fixtures",
    )
    args = parser.parse_args(argv)
    if args.check_export:
        diff = check_export(args.out, record=args.record)
        print(f"exported head: max relative logit difference {diff:.2e}")
        sys.exit(0 if diff < 1e-4 else 1)
    build(args.out, args.eagle_source)
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.out} ({total / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
