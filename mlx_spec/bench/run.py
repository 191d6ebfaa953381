"""Benchmark mlx-spec against mlx-lm, side by side, in one process: the driver.

Usage::

    python -m mlx_spec.bench.run --quick --out bench_out
    python -m mlx_spec.bench.run --model mlx-community/Qwen2.5-7B-Instruct-4bit \\
        --draft-model mlx-community/Qwen2.5-0.5B-Instruct-4bit --out bench_out

Every method sees the same models, prompts, seeds and token budget:
``mlx_lm`` (plain ``mlx_lm.generate.stream_generate``), ``mlx_lm_speculative``
(mlx-lm's own speculative mode, same draft and γ) and every mlx-spec method
that exists (``mlx_spec.drafters.registry.METHODS``, discovered at run time).

The runs come in *blocks*: one prompt, one repeat, one temperature and, when
sampling, one draw (``--draws`` seeds per prompt, as a sampled answer and its
length depend on the seed). A block runs plain ``mlx_lm`` first, every other
configuration in an order that rotates from block to block, and plain
``mlx_lm`` again last. Speedups are *paired*: each run's tokens/s over the
mean of its block's two ``mlx_lm`` runs, then the median over blocks. After
each run one of the bare forwards the rounds are made of is timed again
(round robin), so they see the same machine noise.

After the timed blocks, a separate *profiled pass* runs each mlx-spec method
once per prompt with ``profile=True`` (a sync per round that splits its time
into drafting, verification and host work), so the timed runs stay clean.

This module owns the schedule (which configurations run, in which order, with
the bare forwards sampled in between, then the profiled pass) and the
command's entry point. One run is driven and timed in
:mod:`mlx_spec.bench.runner`, the bare forwards in :mod:`mlx_spec.bench.measure`, the
rows in :mod:`mlx_spec.bench.rows`, the issues' goals in :mod:`mlx_spec.bench.goals`,
the command line in :mod:`mlx_spec.bench.options`, the report in
:mod:`mlx_spec.bench.report` and the charts in :mod:`mlx_spec.bench.plots`.

Definitions (also written to ``results.json`` and ``benchmarks/README.md``):

* ``decode_tokens_per_s``: tokens generated after the first round / time from
  the first token to the last (no prompt processing).
* ``tokens_per_s``: generated tokens / wall time from the call to the last
  token (end to end, prompt processing included).
* ``speedup_vs_plain``: median over blocks of the decode tokens/s of a run
  over that of the block's ``mlx_lm`` runs.
* ``overhead``: median over rounds of a round's time / the bare cost of what
  it is made of (draft forwards + one target forward of its verified width),
  with pipelined bare forwards timed in this run: medians per sampled width,
  ``T(w) = a + b * w`` between sampled neighbours. Plain ``mlx_lm`` is the
  calibration: it comes out at ~1.0.
"""

import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlx_spec.config import (
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_TREE_BUDGET,
    DEFAULT_TREE_TOP_K,
)
from mlx_spec.drafters import registry
from mlx_spec.home import model_folders
from mlx_spec.loading import (
    check_model_path,
    default_model_pair,
    load_draft,
    load_pair,
)
from mlx_spec_entry import guarded

from .goals import check_goals
from .machine import machine_info, param_count
from .measure import (
    QWEN2_SHAPES,
    ForwardTimer,
    bare_costs,
    cost_curves,
    load_cost_curves,
)
from .options import BARE_CHAIN, resolve_settings, setup_arg_parser
from .progress import Progress
from .prompts import (
    by_set,
    encode,
    has_chat_template,
    load_prompt_file,
    prompt_suite,
)
from .rows import (
    DEFINITIONS,
    add_time_split,
    build_rows,
    check_rows,
    overhead_calibration,
    plain_drift,
    project,
)
from .runner import (
    BASELINES,
    MLX_LM_SPECULATIVE,
    PLAIN,
    PLAIN_METHODS,
    SWEEP_METHODS,
    Config,
    Run,
    Setup,
    discover_methods,
    generate_once,
)

__all__ = ["benchmark", "main", "setup_arg_parser"]

WARMUP_MAX_TOKENS = 16
QUICK_WARMUP_MAX_TOKENS = 8
# Methods left out of the default list under --quick, to keep it short:
# always, and when there is a draft model (self-speculation then rarely wins).
QUICK_LEFT_OUT = ("none",)
QUICK_LEFT_OUT_WITH_DRAFT = ("self",)
# The slowest methods run at the first temperature only under --quick.
QUICK_FIRST_TEMP_ONLY = ("tree", "medusa")


def _choose_methods(requested, drafters, skipped, has_draft, quick) -> tuple:
    """The methods to run, and why each wanted one that cannot run is skipped.

    By default: both baselines and every method of the registry
    (``mlx_spec.drafters.registry.METHODS``) that runs here, but
    :data:`QUICK_LEFT_OUT` (and, with a draft model,
    :data:`QUICK_LEFT_OUT_WITH_DRAFT`) under ``--quick``.
    """
    known = BASELINES + registry.METHODS
    left_out, said = set(), set()  # said: left out with a note in methods_skipped
    if quick and not requested:
        said = set(QUICK_LEFT_OUT_WITH_DRAFT) if has_draft else set()
        left_out = set(QUICK_LEFT_OUT) | said
    if requested:
        wanted = list(requested)
    else:
        wanted = list(BASELINES) + [m for m in registry.METHODS if m not in left_out]
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ValueError(
            f"unknown method(s) {unknown}; choose from {', '.join(known)}."
        )
    chosen, notes = [], dict(skipped)
    for m in wanted:
        if m == MLX_LM_SPECULATIVE and not has_draft:
            notes[m] = "no draft model"
        elif m == MLX_LM_SPECULATIVE and m not in drafters:
            notes.setdefault(m, "not available")
        elif m in registry.METHODS and m not in drafters:
            notes.setdefault(m, "not available")
        elif m not in chosen:
            chosen.append(m)
    notes = {m: notes[m] for m in notes if m in wanted}
    notes.update(
        {m: "left out under --quick (name it in --methods to run it)" for m in said}
    )
    return chosen, notes


def _configs(methods: Sequence[str], settings: dict) -> List[Config]:
    """Every benchmarked configuration, γ sweep included.

    Plain mlx_lm is always among them: every block runs it first and last.
    The sweep runs ``draft`` with adaptive control off at every γ of the
    sweep (the main γ too: its default row is adaptive), and mlx-lm's
    speculative mode at the sweep's other γ.
    """
    gamma = settings["num_draft_tokens"]
    configs = []
    for temp in settings["temps"]:
        configs.append(Config(PLAIN, temp, None))
        for m in methods:
            if m == PLAIN or (
                settings["quick"]
                and not settings.get("methods_named")
                and m in QUICK_FIRST_TEMP_ONLY
                and temp != settings["temps"][0]
            ):
                continue
            configs.append(Config(m, temp, None if m in PLAIN_METHODS else gamma))
        if temp not in settings["sweep_temps"]:
            continue
        for m in SWEEP_METHODS:
            if m not in methods:
                continue
            for g in settings["gamma_sweep"]:
                if m == MLX_LM_SPECULATIVE and g != gamma:
                    configs.append(Config(m, temp, g))
                elif m != MLX_LM_SPECULATIVE:
                    configs.append(Config(m, temp, g, fixed=True))
    return configs


def block_order(configs: Sequence[Config], shift: int) -> List[Config]:
    """mlx_lm first and last; the other configurations rotated by ``shift``."""
    plain = [c for c in configs if c[0] == PLAIN]
    others = [c for c in configs if c[0] != PLAIN]
    if others:
        shift %= len(others)
        others = others[shift:] + others[:shift]
    return plain + others + plain


def _warm_up(setup, configs, ids, settings, drafters, progress) -> None:
    """Run every configuration ``warmup`` times on a short generation."""
    most = QUICK_WARMUP_MAX_TOKENS if settings["quick"] else WARMUP_MAX_TOKENS
    saved, setup.max_tokens = setup.max_tokens, min(most, setup.max_tokens)
    warm = sorted(set(configs), key=lambda c: (c.temp, c.method, c.gamma or 0, c.fixed))
    progress.start(settings["warmup"] * len(warm), "warm-up")
    for _ in range(settings["warmup"]):
        for c in warm:
            generate_once(setup, c, ids, settings["seed"], drafters.get(c.method))
            progress.update(f"warm-up {c.label()} temp={c.temp}")
    progress.close()
    setup.max_tokens = saved


def _interleaved_runs(
    setup, configs, prompts, ids, settings, drafters, timer, widths, progress
) -> List[Run]:
    """Every block: one prompt, repeat, temperature and draw, all its configurations.

    After each run, one bare forward (the next width, round robin) is timed,
    so the bare forwards see the same machine noise as the generations.
    """
    runs: List[Run] = []
    cycle = [(name, w) for name, ws in widths.items() for w in ws]
    sampled = 0
    temps = settings["temps"]
    per_block = {t: [c for c in configs if c.temp == t] for t in temps}
    draws = {t: settings["draws"] if t > 0 else 1 for t in temps}
    n_runs = sum(draws[t] * len(block_order(c, 0)) for t, c in per_block.items())
    progress.start(settings["repeats"] * len(prompts) * n_runs, "benchmark")
    block = 0
    for rep in range(settings["repeats"]):
        for pi, p in enumerate(prompts):
            for t, draw in ((t, d) for t in temps for d in range(draws[t])):
                # Draw 0 keeps the seed of a run without --draws.
                seed = settings["seed"] + 1000 * (rep + settings["repeats"] * draw) + pi
                order = block_order(per_block[t], block)
                for position, c in enumerate(order):
                    result = generate_once(
                        setup, c, ids[p.name], seed, drafters.get(c.method)
                    )
                    runs.append(
                        Run(
                            method=c.method,
                            temp=t,
                            gamma=c.gamma,
                            fixed=c.fixed,
                            prompt=p.name,
                            prompt_set=p.prompt_set,
                            repeat=rep,
                            draw=draw,
                            seed=seed,
                            block=block,
                            position=position,
                            **result,
                        )
                    )
                    if cycle:
                        _sample_one(timer, setup, cycle[sampled % len(cycle)])
                    sampled += 1
                    progress.update(
                        f"rep {rep + 1} {p.name} {c.label()} temp={t}"
                        + (f" draw {draw + 1}" if draws[t] > 1 else "")
                    )
                block += 1
    progress.close()
    return runs


def _profiled_runs(setup, configs, prompts, ids, settings, drafters, progress):
    """Each mlx-spec method's default configuration once per prompt, profiled.

    A separate pass: profiling adds a sync per round, so its timings stay out
    of the timed blocks. ``--quick`` profiles the first prompt at the first
    temperature only. Returns one dict per generation (see
    :func:`mlx_spec.bench.rows.add_time_split`).
    """
    if settings["quick"]:
        prompts = prompts[:1]
    chosen = [
        c
        for c in configs
        if c.method not in BASELINES + PLAIN_METHODS
        and not c.fixed
        and not (settings["quick"] and c.temp != settings["temps"][0])
    ]
    progress.start(len(chosen) * len(prompts), "profiled pass")
    out = []
    for pi, p in enumerate(prompts):
        for c in chosen:
            result = generate_once(
                setup,
                c,
                ids[p.name],
                settings["seed"] + pi,
                drafters.get(c.method),
                profile=True,
            )
            out.append(
                {
                    **c._asdict(),
                    "prompt": p.name,
                    "prompt_set": p.prompt_set,
                    **result["profile"],
                }
            )
            progress.update(f"profile {p.name} {c.label()} temp={c.temp}")
    progress.close()
    return out


def _context_note(model, ids, max_tokens) -> Optional[str]:
    longest = max(len(v) for v in ids.values()) + max_tokens
    limit = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    if limit and longest > limit:
        return (
            f"the longest prompt plus --max-tokens is {longest} tokens, beyond the "
            f"target's max_position_embeddings ({limit})"
        )
    return None


def bare_widths(configs: Sequence[Config], setup: Setup) -> Dict[str, List[int]]:
    """Widths to time per model: those the configurations verify and draft."""
    target = {1, 2}
    draft = {1}
    for c in configs:
        if c.method in PLAIN_METHODS:
            continue
        target.add((c.gamma or DEFAULT_NUM_DRAFT_TOKENS) + 1)
        if c.method in ("tree", "auto"):
            budget = setup.method_options.get("tree_budget", DEFAULT_TREE_BUDGET)
            target.add(int(budget) + 1)
            draft.add(int(setup.method_options.get("tree_top_k", DEFAULT_TREE_TOP_K)))
    out = {"target": sorted(target)}
    if setup.draft is not None:
        out["draft"] = sorted(draft)
    return out


def _sample_bare(timer: ForwardTimer, setup: Setup, widths, first: bool) -> None:
    """One more sample of every bare forward in ``widths``."""
    for name, ws in widths.items():
        for w in ws:
            _sample_one(timer, setup, (name, w), warmup=1 if first else 0)


def _sample_one(timer: ForwardTimer, setup: Setup, which, warmup: int = 0) -> None:
    name, width = which
    model = setup.model if name == "target" else setup.draft
    timer.sample(name, model, width, repeats=1, warmup=warmup)


def _parse_method_drafts(items: Sequence[str]) -> Dict[str, str]:
    """``METHOD=PATH`` items of ``--method-draft`` as a dict."""
    out = {}
    for item in items:
        method, sep, path = item.partition("=")
        if not sep or not method or not path:
            raise ValueError(f"--method-draft {item!r}: expected METHOD=PATH.")
        if method not in registry.METHODS + (MLX_LM_SPECULATIVE,):
            known = ", ".join(registry.METHODS + (MLX_LM_SPECULATIVE,))
            raise ValueError(
                f"--method-draft {item!r}: unknown method '{method}'; choose from "
                f"{known}."
            )
        check_model_path(path, f"--method-draft {method}")  # before the target loads
        out[method] = path
    return out


def _heads_module():
    """``mlx_spec.drafters.heads`` when this version of mlx-spec has heads."""
    try:
        from mlx_spec.drafters import heads
    except ImportError:
        return None
    return heads


def _is_head(drafter) -> bool:
    return bool(getattr(drafter, "is_head", False))


def _target_mtp(model_path: str, model) -> tuple:
    """The target's own MTP layers, or ``None`` and why not.

    Read from the checkpoint (``mlx_spec.mtp.load_mtp``) when this version of
    mlx-spec has MTP support; most families have no MTP layers.
    """
    try:
        from mlx_spec.mtp import load_mtp
    except ImportError:
        return None, None
    try:
        return load_mtp(model_path, model), None
    except ValueError as e:
        return None, str(e).strip().splitlines()[0]


def default_heads(model, note) -> List[object]:
    """The heads in the user's and the shipped models (:mod:`mlx_spec.home`)
    trained for ``model``; ``note(text)`` hears why another was skipped."""
    heads = _heads_module()
    if heads is None:
        return []
    out = []
    for path in model_folders():
        config = heads.read_head_config(path)
        if config is None or config[heads.HEAD_KEY].get("kind") == "draft":
            continue  # not a head (a distilled draft is the draft model)
        try:
            out.append(heads.load_head(path, model))
        except ValueError as e:
            note(f"not using the head in {path.name}: {e}")
    return out


def _prompts(args, settings, tokenizer) -> tuple:
    """The prompts to run and whether they go through the chat template."""
    template = has_chat_template(tokenizer)
    if args.prompts:
        prompts = load_prompt_file(args.prompts)
        if args.prompt_sets:
            prompts = [p for p in prompts if p.prompt_set in args.prompt_sets]
            if not prompts:
                raise ValueError(
                    f"--prompts {args.prompts}: no prompt in sets {args.prompt_sets}."
                )
        if settings["quick"]:
            prompts = [ps[0] for ps in by_set(prompts).values()]
        return prompts, template
    chat = {"chat": True, "base": False}.get(args.suite, template)
    if chat and not template:
        raise ValueError(
            "--suite chat needs a model with a chat template; use --suite base."
        )
    prompts = prompt_suite(quick=settings["quick"], sets=args.prompt_sets, chat=chat)
    return prompts, chat


def benchmark(args) -> dict:
    """Run the benchmark described by parsed ``args``; return the results dict."""
    started = time.perf_counter()
    settings = resolve_settings(args)
    # Read once, before anything loads: a bad file fails at once, and one
    # changed or gone during the run is not read again at its end.
    given_curves = (
        load_cost_curves(args.cost_curves_from) if args.cost_curves_from else {}
    )
    method_draft_paths = _parse_method_drafts(args.method_draft)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path, default_draft = default_model_pair()
        draft_path = draft_path or default_draft
    progress = Progress(enabled=not args.no_progress)
    progress.note(
        f"loading {model_path}" + (f" + draft {draft_path}" if draft_path else "")
    )
    model, tokenizer, draft = load_pair(model_path, draft_path)
    setup = Setup(
        model,
        tokenizer,
        draft,
        settings["max_tokens"],
        settings["method_options"],
        drafts={
            m: load_draft(path, model, tokenizer)
            for m, path in method_draft_paths.items()
        },
    )
    setup.heads = [load_draft(path, model, tokenizer) for path in args.head]
    if not all(_is_head(h) for h in setup.heads):
        raise ValueError("--head takes a head directory (from mlx_spec train-draft).")
    if _is_head(draft):  # --draft-model DIR may hold a head
        setup.heads.insert(0, draft)
        setup.draft = draft = None
    elif args.model is None and not setup.heads:
        setup.heads = default_heads(model, progress.note)
    no_drafter = {}  # a kind of drafter this target cannot have -> why
    if not any(getattr(h, "kind", None) == "mtp" for h in setup.heads):
        mtp, no_drafter["mtp"] = _target_mtp(model_path, model)
        if mtp is not None:
            setup.heads.append(mtp)
    for head in setup.heads:
        progress.note(f"draft head: {setup.describe(head)}")

    prompts, chat = _prompts(args, settings, tokenizer)
    ids = {p.name: encode(p, tokenizer, chat=chat) for p in prompts}
    settings["chat_template"] = chat
    note = _context_note(model, ids, settings["max_tokens"])
    if note:
        settings["context_note"] = note
        progress.note("note: " + note)
    drafters, skipped = discover_methods(setup, ids[prompts[0].name])
    for method, why in no_drafter.items():
        if method in skipped and why:
            skipped[method] = why
    methods, skipped = _choose_methods(
        args.methods,
        drafters,
        skipped,
        setup.draft_for(MLX_LM_SPECULATIVE) is not None,
        settings["quick"],
    )
    if not methods:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise ValueError(f"no method to run: {reasons}")
    for m, why in skipped.items():
        progress.note(f"skipping method {m}: {why}")

    configs = _configs(methods, settings)
    _warm_up(setup, configs, ids[prompts[0].name], settings, drafters, progress)
    # Bare forwards on a cache as long as a typical mid-generation context.
    lengths = sorted(len(v) for v in ids.values())
    context = lengths[len(lengths) // 2] + settings["max_tokens"] // 2
    timer = ForwardTimer(context=context, seed=settings["seed"], chain=BARE_CHAIN)
    widths = bare_widths(configs, setup)
    for i in range(settings["forward_repeats"]):
        _sample_bare(timer, setup, widths, first=i == 0)
    runs = _interleaved_runs(
        setup, configs, prompts, ids, settings, drafters, timer, widths, progress
    )
    timer.close()
    profiles = []
    if settings["profile"]:
        profiles = _profiled_runs(
            setup, configs, prompts, ids, settings, drafters, progress
        )
    costs = bare_costs(timer)
    rows = build_rows(runs, settings["repeats"], costs, settings["num_draft_tokens"])
    add_time_split(rows, profiles)
    warnings = check_rows(rows)
    bare = timer.table()
    pair_ratio = None
    if costs is not None and costs.draft is not None:
        pair_ratio = costs.draft(1) / costs.target(1)
    fits = {name: timer.fit(name) for name in bare}

    curves, projections = given_curves, []
    if not args.cost_curves_from and args.cost_curves:
        shapes = {k: QWEN2_SHAPES[k] for k in args.cost_shapes}
        curves = cost_curves(shapes, context=context, progress=progress.note)
    if curves:
        projections = project(rows, curves, pair_ratio)

    samples = {
        r.prompt: tokenizer.decode(r.tokens)
        for r in runs
        if r.method == PLAIN and r.temp == 0 and r.repeat == 0 and r.position == 0
    }
    return {
        "rows": rows,
        "goals": check_goals(rows, settings["num_draft_tokens"]),
        "warnings": warnings,
        "overhead_calibration": overhead_calibration(rows),
        "plain_drift": plain_drift(runs),
        "projections": projections,
        "cost_curves": curves,
        "bare_forward_s": {
            k: {str(w): t for w, t in v.items()} for k, v in bare.items()
        },
        "bare_forward_samples_s": {
            k: {str(w): t for w, t in v.items()} for k, v in timer.samples().items()
        },
        "bare_forward_fit": {k: f.as_dict() for k, f in fits.items() if f},
        "draft_to_target_forward_ratio": pair_ratio,
        "machine": machine_info(),
        "models": {
            "target": str(model_path),
            "draft": str(draft_path) if draft is not None else None,
            "target_params": param_count(model),
            "draft_params": param_count(draft) if draft is not None else None,
            "method_drafts": method_draft_paths,
            "heads": [
                {"kind": getattr(h, "kind", None), "path": getattr(h, "path", None)}
                for h in setup.heads
            ],
            "drafter_of": {
                m: setup.describe(d) for m, d in drafters.items() if m in methods
            },
        },
        "settings": {
            **settings,
            "methods": methods,
            "bare_forward_context": context,
            "prompts": [p.name for p in prompts],
            "prompt_sets": list(by_set(prompts)),
            "prompt_file": args.prompts,
            "elapsed_s": time.perf_counter() - started,
        },
        "methods_skipped": skipped,
        "definitions": DEFINITIONS,
        "runs": [r.raw() for r in runs],
        "profiles": profiles,
        "samples_mlx_lm_greedy": samples,
    }


def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None) -> None:
    """Command-line entry point (also ``mlx_spec bench``).

    Args:
        argv: The arguments. Default: ``sys.argv[1:]``.
        prog: The command's name in its error lines. Default: the parser's,
            ``python -m mlx_spec.bench.run``.
    """
    from .report import RESULTS_MD, write_outputs

    parser = setup_arg_parser()
    parser.prog = prog or parser.prog
    args = parser.parse_args(argv)
    try:
        try:
            results = benchmark(args)
        except ValueError as e:
            parser.exit(2, f"{parser.prog}: error: {e}\n")
        paths = write_outputs(results, Path(args.out), charts=not args.no_charts)
    except KeyboardInterrupt:  # each output file is whole or absent
        parser.exit(130, "\n")
    print((Path(args.out) / RESULTS_MD).read_text())
    for warning in results["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)


if __name__ == "__main__":
    guarded(main)
