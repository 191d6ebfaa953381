"""The model cards (``README.md``) of trained drafters, written from their records.

:func:`model_card` writes a distilled draft's card (``--kind draft``) and
:func:`head_card` an EAGLE or Medusa head's; both read the ``config.json``
that training wrote, so a card says what the drafter's own record says.
"""

from typing import Dict, List, Optional

from ..features import FINAL


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _prompt_sets(sets: Dict[str, int]) -> str:
    """The training prompts by set, e.g. ``"1229 chat, 768 code"``."""
    return ", ".join(f"{n} {name}" for name, n in sets.items())


def _sampling(data: Dict) -> str:
    """How the completions were written: sampled share, temperature and length cap."""
    return (
        f"{_fmt(100 * data.get('sampled_share', 0), 0)}% of the completions sampled "
        f"at temperature {data.get('sampled_temp')}, the rest greedy; at most "
        f"{data.get('max_tokens')} tokens each"
    )


def _chain_table(rows: List[Dict]) -> List[str]:
    depth = max(len(r["by_position"]) for r in rows)
    head = "| γ | tokens / target forward | accepted / drafted | " + " | ".join(
        f"pos {i + 1}" for i in range(depth)
    )
    lines = [head + " |", "|" + "---|" * (3 + depth)]
    for r in rows:
        cells = [_fmt(p) for p in r["by_position"]] + [""] * (
            depth - len(r["by_position"])
        )
        lines.append(
            f"| {r['gamma']} | {_fmt(r['tokens_per_forward'], 2)} | "
            f"{_fmt(r['acceptance'])} | " + " | ".join(cells) + " |"
        )
    return lines


def model_card(config: Dict, command: str, evaluation: Optional[Dict]) -> str:
    """Markdown of the card: data, training, acceptance, speed, command."""
    training = config.get("training", {})
    data = config.get("data", {})
    draft = config.get("draft", {})
    target = config.get("target", {})
    tc = training.get("config", {})
    evals = training.get("evals", [])
    lines = [
        f"# {config.get('name', 'Distilled draft')}",
        "",
        f"A draft model for `{config.get('target_path', 'the target')}`, distilled from it "
        "with MLX by `mlx_spec train-draft --kind draft`. Load it with "
        "`--draft-model` next to that target; mlx-spec checks the target's fingerprint "
        "and refuses any other model in one line.",
        "",
        "## Shape",
        "",
        f"- {draft.get('num_layers')} decoder layer(s) of the target's architecture "
        f"(hidden {target.get('hidden_size')}), initialised from target layers "
        f"{draft.get('init_layers')}, plus the target's final norm;",
        "- the target's own input embedding, shared at load time (not stored);",
        f"- an output layer over the {draft.get('draft_vocab_size')} most frequent tokens "
        f"of the training completions ({_fmt(100 * training.get('draft_vocab_coverage', 0), 1)}% "
        "of their tokens), initialised from the target's output rows; its logits are "
        "scattered to the full vocabulary with -inf elsewhere, so under rejection sampling "
        "the draft's law is zero outside the subset and decoding stays exact;",
        "- weights stored as float16 (`draft.safetensors`); loading casts them to the dtype "
        "of the target's embedding output (float32 for a float32 target on a CPU), and "
        "next to a quantized target (the macOS conversion) quantizes the layers as the "
        "target's blocks and the output layer as the target's.",
        "",
        "## Data",
        "",
        *_draft_data_lines(data),
        "",
        "## Training",
        "",
        f"- {training.get('steps')} AdamW steps of about {tc.get('batch_tokens')} padded "
        f"tokens, peak learning rate {tc.get('lr')}, warm-up {tc.get('warmup')}, cosine "
        f"decay; loss = {_loss_text(tc)}, over completion tokens;",
        *_rollout_lines(tc),
        *(
            [f"- warm-started from the draft in `{tc['init_from']}`{_grown(training)};"]
            if tc.get("init_from")
            else []
        ),
        *_origin_lines(config, "- the chain of warm starts began with `{}`;"),
        f"- {training.get('tokens_seen')} completion tokens seen; final training loss "
        f"{_fmt(training.get('final_loss'))};",
        f"- time of the last run of each stage: {config.get('timing', {}).get('summary', '-')}.",
        "",
    ]
    if evals:
        lines += [
            "Held-out evaluation during training (teacher-forced on greedy held-out "
            "completions: α is the share of positions where the draft's top token is the "
            "target's; tokens per forward replays fixed-γ greedy rounds):",
            "",
            "| step | held-out loss | α (greedy) | best γ | tokens / forward |",
            "|---|---|---|---|---|",
        ]
        for e in evals:
            lines.append(
                f"| {e['step']} | {_fmt(e['heldout_loss'])} | {_fmt(e['alpha'])} | "
                f"{e['best_gamma']} | {_fmt(e['best_tokens_per_forward'], 2)} |"
            )
        lines.append("")
    if evaluation:
        acc = evaluation.get("greedy", [])
        if acc:
            lines += [
                "## Measured with mlx-spec's engine",
                "",
                f'`mlx_spec.stream_generate(..., speculative="draft", num_draft_tokens=γ, '
                f"adaptive=False)` on {evaluation.get('prompts')} held-out chat prompts, "
                f"{evaluation.get('max_tokens')} tokens each, greedy. `pos i`: acceptance "
                "of draft position i given the round reached it.",
                "",
                *_chain_table(acc),
                "",
            ]
        sampled = evaluation.get("sampled", [])
        if sampled:
            lines += [
                f"Sampled at temperature {sampled[0]['temp']} (rejection sampling on the "
                "draft's law):",
                "",
                *_chain_table(sampled),
                "",
            ]
        ratio = evaluation.get("step_ratio")
        if ratio:
            lines += [
                f"Speed: one draft step takes {ratio['draft_ms']} ms and one target step "
                f"{ratio['target_ms']} ms ({ratio['context']}-token context, measured "
                f"interleaved in one run): ratio **{_fmt(ratio['ratio'])}**.",
                "",
            ]
        e2e = evaluation.get("end_to_end")
        if e2e:
            lines += [
                f"End to end (greedy, γ = {e2e['gamma']}, {e2e['prompts']} held-out chat "
                f"prompts, {e2e['max_tokens']} tokens, interleaved with plain decoding in "
                f"one run): {e2e['draft_tps']} tok/s against {e2e['none_tps']} tok/s, "
                f"**{e2e['speedup']}x**; outputs identical: {e2e['identical']}.",
                "",
            ]
        machine = evaluation.get("machine")
        if machine:
            lines += [f"Machine: {machine}.", ""]
    lines += learning_curve_lines(config.get("data", {}))
    lines += [
        "## Reproduce",
        "",
        "```sh",
        command,
        "```",
        "",
        "The command resumes where it stopped (checkpoints in `checkpoints/`, "
        + (
            "git-ignored; the target's laws over the corpus are cached outside git)."
            if "corpus" in data
            else "completions in the data folder, `--data` or `data/`, both git-ignored)."
        ),
        "",
    ]
    return "\n".join(lines)


def _loss_text(tc: Dict) -> str:
    """The draft's loss, by the labels it learned from (``--labels``)."""
    if tc.get("labels") == "written":
        return (
            "cross-entropy of the written token alone (`--labels written`: no forward "
            "of the target; greedy rows' tokens are its argmax and sampled rows' are "
            "draws from its law, so this estimates the soft cross-entropy)"
        )
    soft = tc.get("soft_weight", 0.5)
    return (
        f"{soft} x soft cross-entropy to the teacher's top-K law + "
        f"{_fmt(1 - soft, 2)} x cross-entropy of the written token"
    )


def _grown(training: Dict) -> str:
    """How a draft grown by layers started, for its warm-start line."""
    old = training.get("grown_from_layers")
    if not old:
        return ""
    lr = training.get("config", {}).get("grown_lr")
    at = f" and trained at peak learning rate {lr}" if lr else ""
    return f" (its target layers {old}; the new layers started as identities{at})"


def _origin_lines(config: Dict, line: str) -> List[str]:
    """The command a chain of warm starts began with, if the drafter was warm-started."""
    command = config.get("origin", {}).get("command")
    return [line.format(command)] if command else []


def heldout_set_text(data: Dict) -> Optional[str]:
    """Which held-out sequences of a corpus measured the drafter ("the first N
    held-out sequences in shard order, T completion tokens (...)"); ``None`` for
    a run from before ``--heldout-tokens`` (it took the whole split)."""
    count, tokens = data.get("heldout_prompts"), data.get("heldout_completion_tokens")
    budget = data.get("heldout_budget")
    if budget is None:
        return None
    if data.get("heldout_all"):
        return (
            f"all {count} held-out sequences of the corpus, {tokens} completion "
            f"tokens: fewer than the budget `--heldout-tokens {budget}`, so this set "
            "still grows with the corpus until it reaches it"
        )
    return (
        f"the first {count} held-out sequences in shard order, {tokens} completion "
        f"tokens (budget `--heldout-tokens {budget}`: the same sequences however "
        "the corpus grows)"
    )


def selection_text(data: Dict) -> Optional[str]:
    """Which training shards of a corpus a run read, new and replayed (``None``
    for a run from before selections were recorded: it read the first shards)."""
    sel = data.get("selection")
    if not sel:
        return None
    budget = f"`--corpus-tokens {sel['budget']}`" if sel.get("budget") else "no budget"
    seen = f"{sel['seen_tokens']} distinct training tokens of the corpus seen so far"
    if sel["mode"] == "newest":
        return (
            f"shards {sel['shards']} (`--corpus-select newest`, {budget}): "
            f"{sel['new_shards']} not trained on before ({sel['new_tokens']} tokens), "
            f"then {sel['replay_shards']} replayed from those trained on before "
            f"({sel['replay_tokens']} tokens, seed {sel.get('seed')}); {seen}"
        )
    return (
        f"shards {sel['shards']}, the first in order ({budget}), "
        f"{sel['new_tokens']} of their tokens not trained on before; {seen}"
    )


def _draft_data_lines(data: Dict) -> List[str]:
    """The draft card's data section: the corpus, or the completions written for the run."""
    how = "by prompt source" if "corpus" in data else "no shared topic or module"
    held = heldout_set_text(data) or (
        f"{data.get('heldout_prompts')} prompts, "
        f"{data.get('heldout_completion_tokens')} completion tokens"
    )
    labels = (
        "- labels: the written tokens alone (`--labels written`), with no prefill of "
        "the target;"
        if data.get("labels") == "written"
        else f"- soft labels: the target's top-{data.get('top_k')} next-token law at "
        "every completion token;"
    )
    split = [f"- held out ({how}): {held};", labels]
    training = (
        f"- training: {data.get('train_prompts')} prompts "
        f"({_prompt_sets(data.get('train_sets', {}))}), "
        f"{data.get('train_prompt_tokens')} prompt tokens, "
        f"{data.get('train_completion_tokens')} completion tokens"
    )
    if "corpus" in data:  # written by mlx_spec corpus grow (its card says how)
        return [
            f"Self-distillation on the corpus `{data['corpus']}`: the target's own "
            "completions, kept as token ids by `mlx_spec corpus grow` (its card says "
            "how they were written)"
            + (
                "."
                if data.get("labels") == "written"
                else "; the target's laws come from one prefill."
            ),
            "",
            training + ";",
            *(
                [f"- trained on {selection_text(data)};"]
                if data.get("selection")
                else []
            ),
            *split,
        ]
    return [
        "Self-distillation: the target answered built-in prompts (`mlx_spec.train.prompts`: "
        "chat requests from templates, code, editing and summarize tasks built from the "
        "Python standard library)"
        + (
            ", and requests it wrote itself (`--self-instruct`, set `self`),"
            if "self" in data.get("train_sets", {})
            else ""
        )
        + " through its chat template, with mlx-lm's `BatchGenerator`.",
        "",
        training + f" ({_sampling(data)});",
        *split,
        f"- generation took {data.get('generation_minutes')} min of wall time.",
    ]


def head_card(config: Dict, command: str) -> str:
    """Markdown of a head's card (``--kind eagle|eagle3|medusa``): reads, data, loss, acceptance.

    Args:
        config: The head directory's ``config.json``: its ``training`` record
          (see :meth:`mlx_spec.train.heads.HeadTrainer.save_head`) and the
          ``data`` it was trained on (as :func:`model_card` reads it).
        command: The command that reproduces the head.
    """
    training = config.get("training", {})
    head = training.get("config", {})
    data = config.get("data", {})
    evals = training.get("evals", [])
    last = evals[-1] if evals else {}
    loss = training.get("final_loss")
    lines = [
        f"# {head.get('kind', 'eagle').upper()} head for "
        f"{data.get('model', 'its target')}",
        "",
        "Trained with `mlx_spec train-draft` (self-distillation: the target's own "
        "completions, its hidden states and next-token laws as teacher).",
        "",
        f"- Reads: {_head_reads(head)}.",
        *_architecture_lines(head),
        f"- Training: {training.get('steps')} steps, {training.get('tokens_seen')} "
        f"supervised positions, {training.get('train_seconds', 0) / 60:.1f} min of "
        "optimizer time.",
        f"- Data: {training.get('train_sequences')} training / "
        f"{training.get('heldout_sequences')} held-out sequences; draft vocabulary "
        f"covers {training.get('draft_vocab_coverage', 0):.1%} of the target's top "
        "choices on the training completions.",
        *_head_data_lines(data),
        *(
            [f"- Warm-started from the head in `{head['init_from']}`."]
            if head.get("init_from")
            else []
        ),
        *_origin_lines(config, "- The chain of warm starts began with `{}`."),
        f"- Final loss: {'n/a' if loss is None else loss}.",
        f"- Held-out greedy acceptance by depth: {last.get('accept_by_depth')}, "
        f"tokens per chain round: {last.get('tokens_per_round')}"
        + _tree_text(last)
        + ".",
        "",
        "Held-out acceptance during training (step: tokens per chain round):",
        "",
        *(f"- {e['step']}: {e.get('tokens_per_round')}" for e in evals),
        "",
        *learning_curve_lines(data),
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
    ]
    return "\n".join(lines)


_CURVE_COLUMNS = (
    ("alpha", "α"),
    ("best_tokens_per_forward", "tokens per forward"),
    ("accept_by_depth", "acceptance by depth"),
    ("conditional_by_depth", "conditional by depth"),
    ("tokens_per_round", "τ (chain)"),
    ("tree_nodes", "tree nodes"),
    ("tree_tokens_per_round", "τ (tree)"),
)


def learning_curve_lines(data: Dict) -> List[str]:
    """The learning curve across runs: held-out acceptance against corpus tokens."""
    curve = data.get("learning_curve") or []
    if not curve:
        return []
    columns = [(k, name) for k, name in _CURVE_COLUMNS if any(k in p for p in curve)]
    held = (
        "measured on the corpus's first held-out sequences in shard order, never "
        "trained on: all of them, or up to `--heldout-tokens`. Shards are only "
        "appended, so points with equal held-out tokens were measured on the same "
        "sequences"
        if any("heldout_budget" in p for p in curve)
        else "held-out split of the corpus, never trained on; it grows with the "
        "corpus, so compare points measured on the same held-out tokens"
    )
    seen = seen_column(curve)
    labels = any("labels" in p for p in curve)  # points from before --labels: laws
    lines = [
        f"Learning curve (each run warm-starts from the last; {held}):",
        "",
        "| date | corpus tokens | held-out tokens | "
        + ("tokens seen | " if seen else "")
        + "steps | "
        + ("labels | " if labels else "")
        + " | ".join(n for _, n in columns)
        + " |",
        "|---" * (4 + bool(seen) + labels + len(columns)) + "|",
    ]
    for i, p in enumerate(curve):
        cells = [str(p.get(k, "")) for k, _ in columns]
        lines.append(
            f"| {p.get('date', '')} | {p.get('corpus_tokens', '')} | "
            f"{p.get('heldout_tokens', '')} | "
            + (f"{seen[i]} | " if seen else "")
            + f"{p.get('steps', '')} | "
            + (f"{p.get('labels', 'laws')} | " if labels else "")
            + " | ".join(cells)
            + " |"
        )
    if seen:
        lines += [
            "",
            "Corpus tokens: what the run trained on; tokens seen: distinct training "
            "tokens of the corpus trained on by it and the runs before it.",
        ]
    if labels:
        lines += [
            "",
            "Labels: laws, the target's top-K laws from a prefill and the written "
            "tokens; written, the written tokens alone (`--labels written`).",
        ]
    return lines + [""]


def seen_column(curve: List[Dict]) -> List[int]:
    """Distinct corpus tokens seen at each point (empty if no point records it).

    A point from before selections were recorded read the first shards, so
    what it had seen is the most corpus tokens of any point up to it.
    """
    if not any("seen_tokens" in p for p in curve):
        return []
    out, most = [], 0
    for p in curve:
        most = max(most, int(p.get("corpus_tokens") or 0))
        out.append(int(p.get("seen_tokens", most)))
    return out


def _architecture_lines(head: Dict) -> List[str]:
    """An EAGLE-3-shaped head's line: what it is, and that it exports."""
    if head.get("kind") != "eagle3":
        return []
    return [
        "- Architecture: EAGLE-3 (`fc` fuses the blocks, one decoder layer over "
        "[embedding; feature], its own norm and output layer over the draft "
        "vocabulary; trained with the training-time test, "
        f"{head.get('train_steps')} steps unrolled). `mlx_spec export` writes it "
        "in speculators' format, which vLLM and SGLang load.",
    ]


def _tree_text(last: Dict) -> str:
    """The card's words on the held-out τ of a static tree (none if not measured;
    Medusa heads older than ``tree_nodes`` estimated it assuming independent heads)."""
    if "tree_nodes" not in last:
        return ""
    how = ""
    if last.get("tree_fit") == "cross-fitted":  # older evals scored it in-sample
        how = (
            " (its τ taken on each half of the sequences with the tree fitted "
            "to the other half)"
        )
    return (
        f", per round of a static tree of {last['tree_nodes']} nodes fitted to them"
        f"{how}: {last['tree_tokens_per_round']}"
    )


def _head_reads(head: Dict) -> str:
    """The target features a head reads, from its training config."""
    if head.get("kind") == "medusa":
        return f"the target's final hidden state ({head.get('num_heads')} heads)"
    names = [
        "the final hidden state" if i == FINAL else f"block {i}"
        for i in head.get("feature_layers", [FINAL])
    ]
    return "the target's " + ", ".join(names)


def _head_data_lines(data: Dict) -> List[str]:
    """The head card's line on the training prompts and completions (none if unknown)."""
    if "train_sets" not in data:
        return []
    sets = _prompt_sets(data["train_sets"])
    if "self" in data["train_sets"]:
        sets += " (`self`: requests the target wrote itself)"
    tokens = (
        f"{data.get('train_prompt_tokens')} prompt and "
        f"{data.get('train_completion_tokens')} completion tokens"
    )
    if "corpus" in data:  # written by mlx_spec corpus grow (its card says how)
        held = heldout_set_text(data)
        return [
            f"- Prompts: {sets}; {tokens} of the corpus `{data['corpus']}`.",
            *(
                [f"- Trained on {selection_text(data)}."]
                if data.get("selection")
                else []
            ),
            *([f"- Measured on {held}, never trained on."] if held else []),
        ]
    return [
        f"- Prompts: {sets}; {tokens} ({_sampling(data)}), "
        f"written in {data.get('generation_minutes')} min.",
    ]


def _rollout_lines(tc: Dict) -> List[str]:
    """The card's line on rollouts (none when training was teacher-forced only)."""
    k = tc.get("rollout_steps") or 0
    if not k:
        return []
    temp = tc.get("rollout_temp") or 0
    how = f"sampled at temperature {temp}" if temp else "greedy"
    return [
        f"- rollouts on {_fmt(tc.get('rollout_share'), 2)} of the steps: the draft wrote "
        f"{k} tokens ({how}) after about one completion position in 8, and trained also on "
        "the target's top-K law at the positions reading them;"
    ]
