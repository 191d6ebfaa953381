"""Adaptive draft length or tree budget against a sweep of fixed ones, in one run.

Usage::

    python -m mlx_spec.bench.adaptive                       # the default pair in models/
    python -m mlx_spec.bench.adaptive --methods draft lookup self --gammas 1 2 3 4 6 8
    python -m mlx_spec.bench.adaptive --methods tree eagle medusa --budgets 1 2 4 8 16 32
    python -m mlx_spec.bench.adaptive --model PATH --draft-model PATH --json out.json

For each method it runs plain ``mlx_lm`` decoding, the method at every fixed
size with adaptive control off (``adaptive=False``) and the method with
adaptive control (the default), on the same prompts, token budget and seed.
A chain method (``draft``, ``lookup``, ``self``) sweeps the draft length γ
(``--gammas``; adaptive starts from γ = 4). A tree method (``tree``,
``eagle``, ``medusa``) sweeps the node budget (``--budgets``); adaptive
picks from 1 to 64 nodes per round (up to 4 × the default budget of 16), a
drafted tree starting at 4. A Medusa head's stored tree, which ``medusa``
runs with adaptive control off, is one more fixed row. A warm-up comes
first and the order rotates from prompt to prompt so machine noise hits
every configuration alike.

Reported per method and configuration: draft tokens (tree nodes) per round,
which shows the sizes adaptive control settles on, tokens per target
forward, decode tokens/s (all tokens after the first over all decode
seconds, so the prompt and self-speculation's layer search are excluded;
one total is steadier than a median of short, noisy runs) and its ratio to
plain decoding, with the per-pass ratios' range, and the verdicts the
adaptive controller is held to: it beats the default fixed size (γ = 4, 16
nodes, or a Medusa head's stored tree) and stays within 5% of the best
fixed size. Every run's greedy output is checked against plain decoding's.

The ``draft`` method is then replayed without timing noise: the draft's
greedy chain is matched against the target's real output at every position,
which decides every round of any γ policy, and each round is priced at the
mean round time this run measured for its γ. The replay reproduces the
measured rounds of every fixed γ (checked and printed), so it shows what
the controller's choices are worth on this machine's costs, apart from noise.
"""

import argparse
import copy
import json
import time
from types import SimpleNamespace
from typing import Dict, List, Optional

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlx_spec import SpecConfig, SpecStats, speculative_generate_step
from mlx_spec.config import (
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_TREE_BUDGET,
    MAX_TREE_BUDGET,
)
from mlx_spec.costs import model_step_cost
from mlx_spec.drafters.fit import DRAFT_METHODS
from mlx_spec.drafters.heads import static_choices
from mlx_spec.loading import default_model_pair, load_draft, load_model
from mlx_spec.options import one_line_errors
from mlx_spec.planner import make_controller
from mlx_spec_entry import guarded

from .prompts import encode, has_chat_template, prompt_suite
from .run import default_heads

DEFAULT_GAMMAS = (1, 2, 3, 4, 6, 8)
DEFAULT_BUDGETS = (1, 2, 4, 8, 16, 32)
CHAIN_METHODS = ("draft", "lookup", "self")
TREE_METHODS = ("tree", "eagle", "medusa")
HEAD_METHODS = ("eagle", "medusa")  # the head kind each needs is its name
DEFAULT_METHODS = CHAIN_METHODS
DEFAULT_SETS = ("code_completion", "editing", "free_text")
DEFAULT_CHAT_SETS = ("chat", "code", "editing")


def run_once(model, drafter, ids: List[int], fields: Optional[Dict], max_tokens: int):
    """One greedy generation: ``(tokens, seconds, forwards, rounds, drafted)``.

    ``fields`` is ``None`` for plain decoding, else the :class:`SpecConfig`
    fields of the method, which runs with ``drafter`` as its draft model (a
    draft model, a head, or ``None``). ``tokens`` is the generated token
    ids; ``seconds`` the decode time, from the first token to the last, so
    it covers every round but the first; ``forwards`` the target forwards;
    ``drafted`` the draft tokens (tree nodes) proposed over all rounds.
    """
    prompt = mx.array(ids)
    times, tokens = [], []
    if fields is None:
        for token, _ in generate_step(prompt, model, max_tokens=max_tokens):
            times.append(time.perf_counter())
            tokens.append(int(token))
        forwards = rounds = len(times)
        drafted = 0
    else:
        stats = SpecStats()
        config = SpecConfig(max_tokens=max_tokens, **fields)
        for token, _, _ in speculative_generate_step(
            prompt, model, drafter, config=config, stats=stats
        ):
            times.append(time.perf_counter())
            tokens.append(int(token))
        forwards, rounds = stats.target_forwards, stats.rounds
        drafted = stats.draft_tokens
    return tokens, times[-1] - times[0], forwards, rounds, drafted


def acceptance_runs(model, draft, ids: List[int], path: List[int], depth: int):
    """How far the draft's greedy chain matches the target's path at each step.

    Args:
        ids (list[int]): The prompt.
        path (list[int]): The target's greedy continuation, ``(N,)``.
        depth (int): Longest chain to try.

    Returns:
        list[int]: ``(N,)``; entry ``i`` is how many tokens a chain drafted
        after ``ids + path[:i]`` gets accepted (at most ``depth``). Under
        greedy decoding this decides every round of every draft length.
    """
    seq = ids + path
    cache = make_prompt_cache(draft)
    mx.eval(draft(mx.array(ids[:-1])[None], cache=cache))
    runs = []
    for i in range(len(path)):
        # The cache holds seq[:P + i - 1]; its next input is seq[P + i - 1].
        position = len(ids) + i
        token, matched, steps = seq[position - 1], 0, 0
        while steps < depth:
            logits = draft(mx.array([[token]]), cache=cache)
            steps += 1
            token = int(mx.argmax(logits[0, -1]).item())
            if position + matched >= len(seq) or token != seq[position + matched]:
                break
            matched += 1
        trim_prompt_cache(cache, steps - 1)
        runs.append(matched)
    return runs


def replay(runs: List[int], choose, record, round_cost):
    """Replays the rounds of one greedy generation: ``(seconds, rounds)``.

    ``choose()`` gives each round's γ, ``record(γ, accepted, cost)`` sees its
    outcome, and ``round_cost(γ)`` prices it; the engine's cut at the token
    budget (``γ <= remaining - 1``) is kept.
    """
    position, seconds, rounds = 0, 0.0, 0
    while position < len(runs):
        gamma = min(choose(), len(runs) - position - 1)
        accepted = min(runs[position], gamma)
        cost = round_cost(gamma)
        if gamma:
            record(gamma, accepted, cost)
        seconds += cost
        position += accepted + 1
        rounds += 1
    return seconds, rounds


def _interpolate_cost(table: Dict[int, float]):
    """Round cost for any γ: linear between measured γs, extended by the end slopes."""
    points = sorted(table.items())
    if len(points) == 1:
        return lambda g: points[0][1]

    def cost(g):
        pairs = list(zip(points, points[1:]))
        (g0, c0), (g1, c1) = next(
            (pair for pair in pairs if g <= pair[1][0]), pairs[-1]
        )
        return max(c0 + (c1 - c0) * (g - g0) / (g1 - g0), 1e-9)

    return cost


def replay_report(model, draft, encoded, paths, round_costs, gammas, max_tokens):
    """Noise-free comparison of adaptive and fixed γ on the measured round costs.

    Every round is priced at the mean round time measured for its γ in this
    run; the acceptance comes from the target's and draft's real greedy
    outputs. Returns ``(rows, fixed γ rounds matching the measured rounds)``.
    """
    config = SpecConfig(method="draft", max_tokens=max_tokens)
    # The engine's chain arm for a draft model, as its controller sees it.
    arm = SimpleNamespace(is_tree=False, step_cost=model_step_cost(draft, model))
    gamma_max = config.max_draft_tokens
    cost = _interpolate_cost(round_costs)
    runs = [
        acceptance_runs(model, draft, ids, path, max(gamma_max, max(gammas)))
        for ids, path in zip(encoded, paths)
    ]
    tokens = sum(len(r) for r in runs)
    rows, replayed_rounds = {}, {}
    for g in gammas:
        totals = [replay(r, lambda: g, lambda *_: None, cost) for r in runs]
        rows[f"γ={g}"] = tokens / sum(s for s, _ in totals)
        replayed_rounds[g] = [n for _, n in totals]
    seconds = 0.0
    for r in runs:
        controller = make_controller(config, arm)
        record = lambda g, a, c: controller.update(g, a, 0.0, c, g + 1, draft_steps=0)
        seconds += replay(r, controller.choose, record, cost)[0]
    rows["adaptive"] = tokens / seconds
    return rows, replayed_rounds


def configurations(method: str, gammas, budgets, head=None) -> Dict[str, Dict]:
    """``label -> SpecConfig fields`` of every fixed size of ``method``, then adaptive.

    A chain method sweeps γ (``γ=4``), a tree method the node budget
    (``budget=16``). For ``medusa``, a ``head`` with a stored tree adds that
    tree (``stored``), which is what ``medusa`` runs with adaptive control off.
    """
    if method in TREE_METHODS:
        grid = {
            f"budget={b}": dict(method=method, tree_budget=b, adaptive=False)
            for b in budgets
        }
        if method == "medusa" and head is not None and static_choices(head.config):
            grid["stored"] = dict(method=method, adaptive=False)
    else:
        grid = {
            f"γ={g}": dict(method=method, num_draft_tokens=g, adaptive=False)
            for g in gammas
        }
    grid["adaptive"] = dict(method=method, adaptive=True)
    return grid


def default_label(method: str, head=None) -> str:
    """The fixed row ``adaptive=False`` runs by default, which adaptive must beat."""
    if method not in TREE_METHODS:
        return f"γ={DEFAULT_NUM_DRAFT_TOKENS}"
    if method == "medusa" and head is not None and static_choices(head.config):
        return "stored"
    return f"budget={DEFAULT_TREE_BUDGET}"


def without_stored_tree(head):
    """A Medusa ``head`` that builds dynamic trees even with adaptive control off.

    With ``adaptive=False`` the ``medusa`` method runs the tree stored with
    the head, whatever ``tree_budget`` says; the copy forgets that tree, so a
    fixed budget sweep can run.
    """
    if head is None or not static_choices(head.config):
        return head
    dynamic = copy.copy(head)
    dynamic.config = {k: v for k, v in head.config.items() if k != "tree_choices"}
    return dynamic


def load_drafters(args, model, tokenizer, parser) -> Dict[str, object]:
    """``method -> draft_model argument`` of every method in ``args.methods``.

    ``draft`` and ``tree`` run with ``--draft-model``, ``eagle`` and
    ``medusa`` with the ``--head`` (or ``--draft-model``) of their kind, or
    for the default target its head in ``models/``; ``lookup`` and ``self``
    with nothing.
    """
    draft, heads = None, {}
    if args.draft_model:
        draft = load_draft(str(args.draft_model), model, tokenizer)
    for path in args.head:
        head = load_draft(str(path), model, tokenizer)
        if not getattr(head, "is_head", False):
            parser.error(f"--head {path} holds no head (from mlx_spec train-draft)")
        heads[head.kind] = head
    if getattr(draft, "is_head", False):  # --draft-model DIR may hold a head
        heads.setdefault(draft.kind, draft)
        draft = None
    drafters = {}
    for method in args.methods:
        if method in DRAFT_METHODS:
            if draft is None:
                parser.error(f"--methods {method} needs --draft-model (a draft model)")
            drafters[method] = draft
        elif method in HEAD_METHODS:
            if method not in heads and args.default_pair:
                found = {h.kind: h for h in default_heads(model, lambda _: None)}
                heads[method] = found.get(method)
            if heads.get(method) is None:
                parser.error(f"--methods {method} needs --head DIR (a {method} head)")
            drafters[method] = heads[method]
        else:
            drafters[method] = None
    return drafters


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.adaptive", description=__doc__.split("\n")[0]
    )
    one_line_errors(parser)
    parser.add_argument("--model", default=None, help="Default: models/ target.")
    parser.add_argument(
        "--draft-model",
        default=None,
        help="A draft model (or a head) for draft and tree. Default: models/ draft.",
    )
    parser.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="DIR",
        help="A trained head (from mlx_spec train-draft) for the eagle or medusa "
        "method of its kind. Repeatable. Default: the heads in models/ trained "
        "for the default target, when --model is not given.",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        help=f"Chains: {', '.join(CHAIN_METHODS)}; trees: {', '.join(TREE_METHODS)}.",
    )
    parser.add_argument(
        "--gammas",
        type=int,
        nargs="+",
        default=list(DEFAULT_GAMMAS),
        help="Fixed draft lengths of the chain methods.",
    )
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=list(DEFAULT_BUDGETS),
        help="Fixed node budgets of the tree methods.",
    )
    parser.add_argument(
        "--prompt-sets",
        nargs="+",
        default=None,
        help=f"Default: {' '.join(DEFAULT_CHAT_SETS)} for a model with a chat "
        f"template, else {' '.join(DEFAULT_SETS)}.",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="One prompt per set.")
    parser.add_argument("--json", default=None, help="Also write the rows here.")
    parser.add_argument(
        "--no-replay",
        action="store_true",
        help="Skip the noise-free replay of the draft method.",
    )
    args = parser.parse_args(argv)
    known = CHAIN_METHODS + TREE_METHODS
    bad = [m for m in args.methods if m not in known]
    if bad:
        parser.error(f"--methods takes {', '.join(known)}, not {bad[0]!r}")
    if min(args.gammas) < 1:
        parser.error(f"--gammas must all be >= 1, got {min(args.gammas)}")
    if not all(1 <= b <= MAX_TREE_BUDGET for b in args.budgets):
        parser.error(
            f"--budgets must all be from 1 to {MAX_TREE_BUDGET}, "
            f"got {next(b for b in args.budgets if not 1 <= b <= MAX_TREE_BUDGET)}"
        )
    if args.max_tokens < 2 or args.repeats < 1:
        parser.error("--max-tokens must be >= 2 and --repeats >= 1")

    args.default_pair = args.model is None
    try:
        if args.default_pair:
            args.model, default_draft = default_model_pair()
            args.draft_model = args.draft_model or default_draft
        model, tokenizer = load_model(str(args.model))
        drafters = load_drafters(args, model, tokenizer, parser)
    except ValueError as e:
        parser.error(str(e))
    draft = drafters.get("draft")
    chat = has_chat_template(tokenizer)
    sets = args.prompt_sets or (DEFAULT_CHAT_SETS if chat else DEFAULT_SETS)
    try:
        prompts = prompt_suite(quick=args.quick, sets=sets, chat=chat)
    except ValueError as e:
        parser.error(str(e))
    encoded = [encode(p, tokenizer, chat=chat) for p in prompts]

    # (method, label) -> (SpecConfig fields, the drafter it runs with)
    grid = {("plain", "plain"): (None, None)}
    for method in args.methods:
        drafter = drafters[method]
        for label, fields in configurations(
            method, args.gammas, args.budgets, drafter
        ).items():
            dynamic = method == "medusa" and label.startswith("budget=")
            grid[(method, label)] = (
                fields,
                without_stored_tree(drafter) if dynamic else drafter,
            )
    keys = list(grid)
    for key in keys:  # warm-up
        run_once(model, grid[key][1], encoded[0], grid[key][0], 16)

    # Per configuration and pass (every prompt once): tokens and decode seconds.
    passes = {key: [[0, 0.0] for _ in range(args.repeats)] for key in keys}
    counts = {
        key: dict(tokens=0, forwards=0, rounds=0, drafted=0, runs=0, seconds=0.0)
        for key in keys
    }
    plain = ("plain", "plain")
    paths, mismatches = {}, []
    for rep in range(args.repeats):
        for i, ids in enumerate(encoded):
            shift = (rep + i) % len(keys)
            outputs = {}
            for key in keys[shift:] + keys[:shift]:
                fields, drafter = grid[key]
                tokens, seconds, forwards, rounds, drafted = run_once(
                    model, drafter, ids, fields, args.max_tokens
                )
                outputs[key] = tokens
                passes[key][rep][0] += len(tokens) - 1
                passes[key][rep][1] += seconds
                c = counts[key]
                c["tokens"] += len(tokens)
                c["forwards"] += forwards
                c["rounds"] += rounds
                c["drafted"] += drafted
                c["runs"] += 1
                c["seconds"] += seconds
            paths.setdefault(i, outputs[plain])
            mismatches += [
                f"{key[0]} {key[1]} on {prompts[i].name}"
                for key in keys
                if outputs[key] != outputs[plain]
            ]

    def throughput(key):  # tokens after each run's first, over decode seconds
        c = counts[key]
        return (c["tokens"] - c["runs"]) / max(c["seconds"], 1e-9)

    rows = []
    for key in keys:
        per_pass = [
            (n / s) / (pn / ps) for (n, s), (pn, ps) in zip(passes[key], passes[plain])
        ]
        rows.append(
            dict(
                method=key[0],
                config=key[1],
                tokens_per_target_forward=counts[key]["tokens"]
                / max(counts[key]["forwards"], 1),
                drafted_per_round=counts[key]["drafted"]
                / max(counts[key]["rounds"], 1),
                tokens_per_s=throughput(key),
                speedup_vs_plain=throughput(key) / throughput(plain),
                speedup_vs_plain_per_pass=per_pass,
            )
        )

    heads = [d.path for d in drafters.values() if getattr(d, "is_head", False)]
    print(
        f"model {args.model}, draft {args.draft_model}"
        + "".join(f", head {path}" for path in heads)
        + f", {args.max_tokens} tokens, "
        f"greedy, {len(prompts)} prompts x {args.repeats} passes; tok/s = all "
        "decoded tokens / all decode seconds, × plain = its ratio to plain "
        "decoding (per-pass ratios in brackets, min-max)"
    )
    print("| method | config | drafted/round | tok/fwd | tok/s | × plain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        spread = r["speedup_vs_plain_per_pass"]
        print(
            f"| {r['method']} | {r['config']} | {r['drafted_per_round']:.1f} "
            f"| {r['tokens_per_target_forward']:.2f} "
            f"| {r['tokens_per_s']:.1f} | {r['speedup_vs_plain']:.3f} "
            f"({min(spread):.2f}-{max(spread):.2f}) |"
        )
    verdicts = [
        _verdict(method, rows, default_label(method, drafters[method]))
        for method in args.methods
    ]
    identical = not mismatches
    verdicts.append(
        "greedy output identical to plain decoding in every run: "
        + ("yes" if identical else "NO: " + "; ".join(mismatches))
    )

    replayed = None
    if "draft" in args.methods and not args.no_replay:
        fixed = {g: counts[("draft", f"γ={g}")] for g in args.gammas}
        # Decode seconds start at the first token, so they miss each run's first round.
        round_costs = {
            g: c["seconds"] / max(c["rounds"] - c["runs"], 1) for g, c in fixed.items()
        }
        ordered = [paths[i] for i in range(len(encoded))]
        replayed, replayed_rounds = replay_report(
            model, draft, encoded, ordered, round_costs, args.gammas, args.max_tokens
        )
        same_rounds = all(
            c["rounds"] == args.repeats * sum(replayed_rounds[g])
            for g, c in fixed.items()
        )
        print(
            "\nreplay of the draft method without timing noise: each round priced "
            "at the mean round time measured above for its γ ("
            + ", ".join(f"γ={g} {1e3 * c:.2f} ms" for g, c in round_costs.items())
            + "; others interpolated), acceptance from the real greedy outputs"
        )
        print("| config | modelled tok/s |\n|---|---|")
        for label, value in replayed.items():
            print(f"| {label} | {value:.1f} |")
        best = max((k for k in replayed if k != "adaptive"), key=replayed.get)
        verdicts.append(
            "replay reproduces the measured rounds of every fixed γ: "
            + ("yes" if same_rounds else "NO")
        )
        verdicts.append(
            f"replay: adaptive/best fixed {best} = "
            f"{replayed['adaptive'] / replayed[best]:.3f}"
            + (
                f", adaptive/default γ={DEFAULT_NUM_DRAFT_TOKENS} = "
                f"{replayed['adaptive'] / replayed[f'γ={DEFAULT_NUM_DRAFT_TOKENS}']:.3f}"
                if f"γ={DEFAULT_NUM_DRAFT_TOKENS}" in replayed
                else ""
            )
        )
    print("\n".join(verdicts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": rows,
                    "verdicts": verdicts,
                    "replay": replayed,
                    "args": vars(args),
                },
                f,
                indent=1,
            )


def _verdict(method: str, rows: List[Dict], default: str) -> str:
    """Adaptive against the best fixed size of ``method`` and its ``default`` row."""
    mine = [r for r in rows if r["method"] == method]
    fixed = [r for r in mine if r["config"] != "adaptive"]
    adaptive = next(r for r in mine if r["config"] == "adaptive")
    best = max(fixed, key=lambda r: r["tokens_per_s"])
    within = adaptive["tokens_per_s"] / best["tokens_per_s"]
    line = (
        f"{method}: adaptive {adaptive['speedup_vs_plain']:.3f}x plain, best fixed "
        f"{best['config']} {best['speedup_vs_plain']:.3f}x "
        f"(adaptive/best = {within:.3f}, goal >= 0.95)"
    )
    for r in fixed:
        if r["config"] == default:
            beats = adaptive["tokens_per_s"] / r["tokens_per_s"]
            line += f", adaptive/default {default} = {beats:.3f} (goal > 1)"
            break
    else:
        line += f", default {default} not run"
    return line


if __name__ == "__main__":
    guarded(main)
