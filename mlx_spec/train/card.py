"""The model card (``README.md``) of a trained draft, written from its records."""

from typing import Dict, List, Optional


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


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
        "of the target's embedding output (float32 for a float32 target on a CPU).",
        "",
        "## Data",
        "",
        f"Self-distillation: the target answered built-in prompts (`mlx_spec.train.prompts`: "
        "chat requests from templates, code, editing and summarize tasks built from the "
        "Python standard library)"
        + (
            ", and requests it wrote itself (`--self-instruct`, set `self`),"
            if "self" in data.get("train_sets", {})
            else ""
        )
        + " through its chat template, with mlx-lm's `BatchGenerator`.",
        "",
        f"- training: {data.get('train_prompts')} prompts {data.get('train_sets', '')}, "
        f"{data.get('train_prompt_tokens')} prompt tokens, "
        f"{data.get('train_completion_tokens')} completion tokens "
        f"({_fmt(100 * data.get('sampled_share', 0), 0)}% of completions sampled at "
        f"temperature {data.get('sampled_temp')}, the rest greedy; at most "
        f"{data.get('max_tokens')} tokens each);",
        f"- held out (no shared topic or module): {data.get('heldout_prompts')} prompts, "
        f"{data.get('heldout_completion_tokens')} completion tokens;",
        f"- soft labels: the target's top-{data.get('top_k')} next-token law at every "
        "completion token;",
        f"- generation took {data.get('generation_minutes')} min of wall time.",
        "",
        "## Training",
        "",
        f"- {training.get('steps')} AdamW steps of about {tc.get('batch_tokens')} padded "
        f"tokens, peak learning rate {tc.get('lr')}, warm-up {tc.get('warmup')}, cosine "
        f"decay; loss = {tc.get('soft_weight')} x soft cross-entropy to the teacher's "
        f"top-K law + {_fmt(1 - tc.get('soft_weight', 0.5), 2)} x cross-entropy of the "
        "written token, over completion tokens;",
        f"- {training.get('tokens_seen')} completion tokens seen; final training loss "
        f"{_fmt(training.get('final_loss'))};",
        f"- time of this run: {config.get('timing', {}).get('summary', '-')}.",
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
    lines += [
        "## Reproduce",
        "",
        "```sh",
        command,
        "```",
        "",
        "The command resumes where it stopped (completions in `data/`, checkpoints in "
        "`checkpoints/`, both git-ignored).",
        "",
    ]
    return "\n".join(lines)
