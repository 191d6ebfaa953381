"""Draft shapes by measured speed: layers, output vocabulary and γ.

``python -m mlx_spec.bench.draft_shapes --model TARGET --drafts D1 D2 ... --corpus C``

For each trained distilled draft (``mlx_spec train-draft --kind draft``), each
output-vocabulary size ``V`` and each draft length ``γ``:

- **acceptance** is replayed from one teacher-forced forward over the
  greedy completions of the corpus's fixed held-out set, train-draft's for the
  same ``--heldout-tokens`` (:func:`mlx_spec.train.corpus_data.heldout_set`),
  or over the target's greedy completions of a ``--prompts`` file (by set),
  with :func:`mlx_spec.train.draft.greedy_matches` and
  :func:`~mlx_spec.train.draft.replay_chains`, as train-draft's held-out
  evaluation. A ``V`` below the draft's own vocabulary restricts its argmax
  to the ``V`` of its rows that train-draft's own rule would pick: the most
  frequent tokens of the corpus's *training* split
  (:func:`~mlx_spec.train.draft.token_counts`, stop tokens always kept);
- **cost** is measured here: one draft decode step over ``V`` output rows
  (``c``) and the target's forward over ``w`` tokens (``v(w)``), both on a KV
  cache of the same context, in interleaved passes (medians), in units of
  the target's 1-token forward (:class:`mlx_spec.bench.measure.ForwardTimer`);
- **speed** over plain decoding: ``τ / (v(γ + 1) + γ·c)`` here, and
  ``τ / (1 + γ·c)`` where verifying up to :data:`FLAT_VERIFY_WIDTH` tokens
  costs one forward (Apple silicon, see benchmarks/README.md).
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from mlx_spec_entry import guarded

from ..drafters.distilled import KIND, draft_vocabulary, load_draft
from ..drafters.heads import HEAD_KEY, read_head_config
from ..options import one_line_errors
from ..train.completions import Completions
from ..train.corpus import Corpus
from ..train.corpus_data import DEFAULT_HELDOUT_TOKENS, HELDOUT_TOKENS_HELP
from ..train.draft import (
    DEFAULT_MAX_LENGTH,
    greedy_alpha,
    greedy_matches,
    replay_chains,
    token_counts,
)
from ..train.draft_batches import plan_batches
from ..train.head_data import token_rows
from .measure import DEFAULT_CONTEXT, ForwardTimer, fit_linear
from .options import BARE_CHAIN
from .prompts import Prompt, encode, has_chat_template, load_prompt_file

PROG = "python -m mlx_spec.bench.draft_shapes"
DEFAULT_GAMMAS = tuple(range(1, 9))
DEFAULT_PASSES = 15
DEFAULT_BATCH_TOKENS = 4096
DEFAULT_PROMPT_TOKENS = 128
# Completion positions where the bands of α by position start.
POSITION_BANDS = (0, 32, 64, 128, 256)
# Where a forward is bound by reading weights, verifying this many tokens
# costs about one 1-token forward (benchmarks/README.md, "What carries across hardware").
FLAT_VERIFY_WIDTH = 9
TARGET = "target"


def log(message: str):
    print(f"[draft-shapes] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- #
# Vocabularies and acceptance
# --------------------------------------------------------------------------- #


def frequent_rows(
    token_ids: Sequence[int], counts: np.ndarray, size: int, always: Sequence[int] = ()
) -> np.ndarray:
    """Rows of a draft vocabulary holding its ``size`` most frequent tokens.

    The choice is train-draft's (:func:`mlx_spec.drafters.distilled.draft_vocabulary`)
    made among the draft's own tokens.

    Args:
        token_ids: ``(k,)`` the draft's target ids, increasing.
        counts: ``(vocab,)`` token counts (:func:`mlx_spec.train.draft.token_counts`).
        size: How many rows to keep (at most ``k``).
        always: Ids kept whatever their count (the stop tokens), if the draft has them.

    Returns:
        ``(size,)`` increasing row indices.
    """
    ids = [int(t) for t in token_ids]
    own = set(ids)
    chosen = draft_vocabulary(
        {t: int(counts[t]) for t in ids}, size, [t for t in always if t in own]
    )
    return token_rows(ids, len(counts))[chosen]


def coverage(token_ids: Sequence[int], tokens: np.ndarray) -> float:
    """Share of ``tokens`` ``(n,)`` that are among ``token_ids``."""
    if not len(tokens):
        return 0.0
    return float(np.isin(tokens, np.asarray(token_ids)).mean())


def greedy_completions(
    model, prompts, eos: Sequence[int], max_tokens: int
) -> Completions:
    """The target's greedy completions of ``prompts``, decoded one by one as
    plain mlx-lm decodes them.

    Args:
        model: The target.
        prompts: ``(prompt_set, ids)`` per prompt, ``ids`` the encoded prompt.
        eos: Stop tokens (kept as the completion's last token).
        max_tokens: Longest completion.

    Returns:
        :class:`Completions` of temperature 0, without laws.
    """
    from mlx_lm.generate import generate_step

    data = Completions()
    for prompt_set, ids in prompts:
        out: List[int] = []
        for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
            out.append(int(token))
            if out[-1] in eos:
                break
        sequence = np.array(list(ids) + out, np.int32)
        data.tokens.append(sequence)
        data.starts.append(len(ids))
        data.temps.append(0.0)
        data.prompt_sets.append(prompt_set)
        data.law_ids.append(np.zeros((len(sequence), 0), np.int32))
        data.law_logp.append(np.zeros((len(sequence), 0), np.float16))
    return data


def alpha_by_set(
    matches: Sequence[np.ndarray], sets: Sequence[str]
) -> Dict[str, float]:
    """Greedy α per prompt set: ``matches[i]`` ``(n,)`` belong to set ``sets[i]``."""
    grouped: Dict[str, List[np.ndarray]] = {}
    for m, name in zip(matches, sets):
        grouped.setdefault(name, []).append(m)
    return {name: greedy_alpha(ms) for name, ms in sorted(grouped.items())}


def alpha_by_band(
    matches: Sequence[np.ndarray], sets: Sequence[str], starts: Sequence[int]
) -> Dict[str, List[Optional[float]]]:
    """Greedy α per prompt set (and ``all``) by completion position band.

    ``matches[i]`` ``(n,)`` belongs to set ``sets[i]`` (``sets`` may be
    empty: ``all`` only); band ``b`` holds the
    completion positions ``starts[b]`` up to the next start (the last band
    has no end). ``None`` where a set has no position in a band.
    """
    ends = [*starts[1:], None]
    out: Dict[str, List[Optional[float]]] = {}
    for name in ["all", *sorted(set(sets))]:
        mine = (
            matches
            if name == "all"
            else [m for m, s in zip(matches, sets) if s == name]
        )
        out[name] = [
            greedy_alpha(parts) if sum(map(len, parts)) else None
            for parts in ([m[a:b] for m in mine] for a, b in zip(starts, ends))
        ]
    return out


def greedy_completion_tokens(data) -> np.ndarray:
    """Every completion token of the greedy sequences of ``data`` (:class:`Completions`): ``(n,)``."""
    parts = [
        t[s:] for t, s, temp in zip(data.tokens, data.starts, data.temps) if temp == 0
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


# --------------------------------------------------------------------------- #
# Speed from acceptance and costs
# --------------------------------------------------------------------------- #


def speedup(tau: float, gamma: int, step: float, verify: float) -> float:
    """Tokens per round over the round's cost in 1-token target forwards:
    ``τ / (verify + γ·step)``."""
    return tau / (verify + gamma * step)


def speed_rows(
    matches: Sequence[np.ndarray],
    gammas: Sequence[int],
    step: float,
    verify: Dict[int, float],
) -> List[Dict]:
    """Per γ: tokens per round and speed over plain decoding, here and flat.

    Args:
        matches: Per held-out completion, ``(n,)`` bool greedy matches.
        gammas: Draft lengths.
        step: A draft step in 1-token target forwards (``c``).
        verify: ``{w: v(w)}`` a ``w``-token target forward in 1-token ones,
          for every ``w = γ + 1``.

    Returns:
        One dict per γ: ``gamma``, ``tau``, ``by_position``, ``verify``
        (``v(γ + 1)``), ``speed_here`` and ``speed_flat`` (``None`` past
        :data:`FLAT_VERIFY_WIDTH`).
    """
    rows = []
    for gamma in gammas:
        replay = replay_chains(matches, gamma)
        tau = replay["tokens_per_forward"]
        flat = gamma + 1 <= FLAT_VERIFY_WIDTH
        rows.append(
            {
                "gamma": gamma,
                "tau": tau,
                "by_position": replay["by_position"],
                "verify": verify[gamma + 1],
                "speed_here": speedup(tau, gamma, step, verify[gamma + 1]),
                "speed_flat": speedup(tau, gamma, step, 1.0) if flat else None,
            }
        )
    return rows


def best(rows: Sequence[Dict], column: str) -> Optional[Dict]:
    """The row with the highest ``column`` (rows without it are skipped)."""
    scored = [r for r in rows if r.get(column) is not None]
    return max(scored, key=lambda r: r[column]) if scored else None


# --------------------------------------------------------------------------- #
# Costs measured here
# --------------------------------------------------------------------------- #


class SubsetStep:
    """A draft's decode step over some rows of its vocabulary, for timing.

    What a greedy chain runs (:class:`mlx_spec.drafters.model.ModelDrafter`):
    the draft's layers, then logits over the kept rows, ``(B, L, k')``. It
    shares the draft's layers and cache layout, so
    :func:`mlx_spec.bench.measure.prefilled_cache` fills its cache.

    Args:
        draft: A loaded :class:`~mlx_spec.drafters.distilled.DistilledDraft`.
        rows: ``(k',)`` rows of its output layer to keep (``None``: all).
    """

    def __init__(self, draft, rows: Optional[Sequence[int]] = None):
        self.draft = draft
        self.model = draft.model
        self.args = draft.args
        self.make_cache = draft.make_cache
        self.head = draft.lm_head if rows is None else draft.lm_head.subset(rows)

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return self.head.subset_logits(self.draft.hidden(inputs, cache))


def measure_costs(
    target,
    steps: Dict[str, SubsetStep],
    max_width: int,
    *,
    context: int = DEFAULT_CONTEXT,
    passes: int = DEFAULT_PASSES,
    chain: Optional[int] = None,
    progress=None,
) -> Dict:
    """Target forwards of widths ``1..max_width`` and 1-token draft steps, timed here.

    Every pass times each once, in turn, so load bursts spread over all of
    them; each value is the median over the passes.

    Args:
        target: The target model.
        steps: Name -> a draft step to time (:class:`SubsetStep`).
        max_width: The widest verification (``max γ + 1``).
        context: Tokens in every KV cache.
        passes: Interleaved passes.
        chain: Pipelined forwards per sample (default: the benchmark's).
        progress: Called with one line per pass.

    Returns:
        ``verify``: ``{w: v(w)}`` and ``step``: ``{name: c}`` in 1-token
        target forwards; ``verify_spread`` and ``step_spread``: the
        interquartile ranges of their samples, in the same unit (the noise);
        ``verify_line``: the line ``a + b·w`` through ``v(w)``
        (:func:`~mlx_spec.bench.measure.fit_linear`); ``seconds``: the
        medians, ``{name: {width: s}}``.
    """
    timer = ForwardTimer(context=context, chain=chain or BARE_CHAIN)
    widths = range(1, max_width + 1)
    for i in range(passes):
        if progress:
            progress(f"timing pass {i + 1}/{passes}")
        warmup = 1 if i == 0 else 0
        for width in widths:
            timer.sample(TARGET, target, width, repeats=1, warmup=warmup)
        for name, step in steps.items():
            timer.sample(name, step, 1, repeats=1, warmup=warmup)
    seconds, samples = timer.table(), timer.samples()
    timer.close()
    unit = seconds[TARGET][1]
    verify = {w: seconds[TARGET][w] / unit for w in widths}
    line = fit_linear(list(verify), list(verify.values()))
    return {
        "verify": verify,
        "verify_spread": {w: spread(samples[TARGET][w]) / unit for w in widths},
        "verify_line": {
            "a": line.a,
            "b": line.b,
            "max_rel_residual": line.max_rel_residual,
        },
        "step": {name: seconds[name][1] / unit for name in steps},
        "step_spread": {name: spread(samples[name][1]) / unit for name in steps},
        "seconds": seconds,
    }


def spread(times: Sequence[float]) -> float:
    """Interquartile range of ``times`` (0 for fewer than two)."""
    if len(times) < 2:
        return 0.0
    q1, q3 = np.percentile(np.asarray(times, float), [25, 75])
    return float(q3 - q1)


# --------------------------------------------------------------------------- #
# The study
# --------------------------------------------------------------------------- #


def heldout_batches(data, batch_tokens: int, max_length: int) -> List[List[int]]:
    """The greedy sequences of ``data`` grouped into forwards (by padded length)."""
    greedy = [i for i, temp in enumerate(data.temps) if temp == 0]
    lengths = [len(data.tokens[i]) for i in greedy]
    return [
        [greedy[j] for j in batch]
        for batch in plan_batches(lengths, batch_tokens, max_length)
    ]


def shape_study(
    target,
    drafts: Dict[str, object],
    heldout,
    counts: np.ndarray,
    *,
    vocabs: Sequence[int] = (),
    gammas: Sequence[int] = DEFAULT_GAMMAS,
    always: Sequence[int] = (),
    context: int = DEFAULT_CONTEXT,
    passes: int = DEFAULT_PASSES,
    max_length: int = DEFAULT_MAX_LENGTH,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    progress=None,
) -> Dict:
    """Acceptance, cost and speed of every (draft, vocabulary, γ).

    Args:
        target: The target model.
        drafts: Name -> loaded distilled draft.
        heldout: The corpus's held-out split (:class:`Completions`); only
          its greedy sequences are read.
        counts: ``(vocab,)`` token counts of the training split.
        vocabs: Vocabulary sizes to try besides each draft's own (each at
          most the smallest draft vocabulary).
        gammas: Draft lengths.
        always: Token ids every vocabulary keeps (the stop tokens).
        context, passes: Of the timing (:func:`measure_costs`).
        max_length: Held-out sequences are cut to this many tokens.
        batch_tokens: Padded tokens per teacher-forced forward.
        progress: Called with one line per stage.

    Returns:
        The report (see :func:`markdown`): ``shapes`` (one per draft and
        vocabulary, each with its rows per γ), ``verify``, ``best`` and
        the held-out size.
    """
    say = progress or (lambda line: None)
    batches = heldout_batches(heldout, batch_tokens, max_length)
    written = greedy_completion_tokens(heldout)
    shapes, steps, matches = [], {}, {}
    for name, draft in drafts.items():
        ids = np.array(draft.lm_head.token_ids)
        sizes = sorted({len(ids), *vocabs}, reverse=True)
        subsets = [
            None if v == len(ids) else frequent_rows(ids, counts, v, always)
            for v in sizes
        ]
        say(f"held-out matches of {name} at V = {sizes}")
        to_draft = token_rows(ids, len(counts))
        owners: List[int] = []  # the held-out sequence of each match array
        found = greedy_matches(
            draft, heldout, batches, to_draft, max_length, subsets, owners
        )
        sets = [heldout.prompt_sets[i] for i in owners] if heldout.prompt_sets else []
        for v, rows, m in zip(sizes, subsets, found):
            key = f"{name}:V{v}"
            kept = ids if rows is None else ids[rows]
            shapes.append(
                {
                    "key": key,
                    "draft": name,
                    "layers": len(draft.layers),
                    "vocab": v,
                    "coverage": coverage(kept, written),
                    "alpha": greedy_alpha(m),
                    "alpha_by_set": alpha_by_set(m, sets) if sets else {},
                    "alpha_by_band": alpha_by_band(m, sets, POSITION_BANDS),
                }
            )
            steps[key] = SubsetStep(draft, rows)
            matches[key] = m
    costs = measure_costs(
        target,
        steps,
        max(gammas) + 1,
        context=context,
        passes=passes,
        progress=say,
    )
    for shape in shapes:
        shape["step"] = costs["step"][shape["key"]]
        shape["step_spread"] = costs["step_spread"][shape["key"]]
        shape["rows"] = speed_rows(
            matches[shape["key"]], gammas, shape["step"], costs["verify"]
        )
    return {
        "heldout_sequences": len(next(iter(matches.values()), [])),
        "heldout_tokens": int(len(written)),
        "position_bands": list(POSITION_BANDS),  # where each alpha_by_band entry starts
        "context": context,
        "passes": passes,
        "verify": costs["verify"],
        "verify_spread": costs["verify_spread"],
        "verify_line": costs["verify_line"],
        "seconds": costs["seconds"],
        "shapes": shapes,
        "best": {
            column: best_choice(shapes, column)
            for column in ("speed_here", "speed_flat")
        },
    }


def best_choice(shapes: Sequence[Dict], column: str) -> Optional[Dict]:
    """The (draft, vocabulary, γ) with the highest ``column``, flattened."""
    flat = [
        {**{k: s[k] for k in ("draft", "layers", "vocab", "step")}, **row}
        for s in shapes
        for row in s["rows"]
    ]
    return best(flat, column)


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #


def _x(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _alphas(values: Sequence[Optional[float]]) -> str:
    """Table cells of acceptances (``–`` where there is none)."""
    return " | ".join("–" if a is None else f"{a:.3f}" for a in values)


def markdown(report: Dict) -> str:
    """The study as markdown: verification costs, one row per (draft, V) with
    its best γ per speed column, one row per (draft, V, γ), and the best of all."""
    verify, line = report["verify"], report["verify_line"]
    widths = sorted(verify)
    lines = [
        f"Held-out: {report['heldout_sequences']} greedy completions, "
        f"{report['heldout_tokens']} tokens. Costs: context {report['context']}, "
        f"medians of {report['passes']} interleaved passes, in 1-token target forwards.",
        "",
        "| w | " + " | ".join(str(w) for w in widths) + " |",
        "|---|" + "---|" * len(widths),
        "| v(w) | " + " | ".join(f"{verify[w]:.2f}" for w in widths) + " |",
        "| spread | "
        + " | ".join(f"{report['verify_spread'][w]:.2f}" for w in widths)
        + " |",
        "",
        f"A line through v(w): {line['a']:.2f} + {line['b']:.3f}·w, largest relative "
        f"residual {line['max_rel_residual']:.2f}. Spread: the interquartile range "
        "of the passes (the noise of the machine's load).",
        "",
        "| draft | layers | V | coverage | α | c | c spread | best γ here | speed here "
        "| best γ, flat verify | speed, flat verify |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["shapes"]:
        here, flat = best(s["rows"], "speed_here"), best(s["rows"], "speed_flat")
        lines.append(
            f"| {s['draft']} | {s['layers']} | {s['vocab']} | {s['coverage']:.3f} "
            f"| {s['alpha']:.3f} | {s['step']:.3f} | {s['step_spread']:.3f} "
            f"| {here['gamma']} | {_x(here['speed_here'])} "
            f"| {flat['gamma'] if flat else '–'} | {_x(flat and flat['speed_flat'])} |"
        )
    # Acceptance by prompt set, where the held-out sequences come from several.
    by_set = [s for s in report["shapes"] if len(s.get("alpha_by_set", {})) > 1]
    if by_set:
        names = sorted({n for s in by_set for n in s["alpha_by_set"]})
        lines += [
            "",
            "| draft | V | " + " | ".join(f"α {n}" for n in names) + " |",
            "|---|---|" + "---|" * len(names),
        ]
        for s in by_set:
            alphas = [s["alpha_by_set"].get(n) for n in names]
            lines.append(f"| {s['draft']} | {s['vocab']} | {_alphas(alphas)} |")
    # Acceptance by where in the completion a token stands.
    bands = [f"{a}-{b - 1}" for a, b in zip(POSITION_BANDS, POSITION_BANDS[1:])]
    bands.append(f"{POSITION_BANDS[-1]}+")
    lines += [
        "",
        "| draft | V | prompt set | " + " | ".join(f"α at {b}" for b in bands) + " |",
        "|---|---|---|" + "---|" * len(bands),
    ]
    for s in report["shapes"]:
        for name, alphas in s["alpha_by_band"].items():
            lines.append(
                f"| {s['draft']} | {s['vocab']} | {name} | {_alphas(alphas)} |"
            )
    lines += [
        "",
        "| draft | V | γ | τ | by position | v(γ+1) | speed here | speed, flat verify |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["shapes"]:
        for r in s["rows"]:
            by_position = " ".join(
                "–" if p is None else f"{p:.2f}" for p in r["by_position"]
            )
            lines.append(
                f"| {s['draft']} | {s['vocab']} | {r['gamma']} | {r['tau']:.2f} "
                f"| {by_position} | {r['verify']:.2f} | {_x(r['speed_here'])} "
                f"| {_x(r['speed_flat'])} |"
            )
    lines.append("")
    titles = {
        "speed_here": "Best here",
        "speed_flat": f"Best where verifying up to {FLAT_VERIFY_WIDTH} tokens "
        "costs one forward",
    }
    for column, title in titles.items():
        b = report["best"].get(column)
        if b is not None:
            lines.append(
                f"- **{title}:** {b['draft']} ({b['layers']} layers), V = {b['vocab']}, "
                f"γ = {b['gamma']}: τ {b['tau']:.2f}, c {b['step']:.3f}, "
                f"{_x(b[column])} plain."
            )
    return "\n".join(lines) + "\n"


def as_json(report: Dict) -> str:
    return json.dumps(report, indent=2, default=float) + "\n"


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False
    )
    parser.add_argument(
        "--model", default=None, help="The target. Default: the default target."
    )
    parser.add_argument(
        "--drafts",
        nargs="+",
        required=True,
        metavar="DIR",
        help="Distilled drafts (mlx_spec train-draft --kind draft) for the target.",
    )
    parser.add_argument(
        "--corpus",
        required=True,
        metavar="DIR",
        help="The corpus the drafts trained on (its held-out split is measured, "
        "unless --prompts; its training split ranks the rows of --vocabs).",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="Measure acceptance on the target's greedy completions of these "
        "prompts (JSON lines, as benchmarks.run --prompts) instead of the "
        "corpus's held-out split.",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=DEFAULT_PROMPT_TOKENS,
        metavar="N",
        help=f"Longest greedy completion of a --prompts prompt "
        f"(default: {DEFAULT_PROMPT_TOKENS}).",
    )
    parser.add_argument(
        "--vocabs",
        type=int,
        nargs="+",
        default=[],
        metavar="V",
        help="Output-vocabulary sizes to try besides each draft's own "
        "(each at most every draft's vocabulary).",
    )
    parser.add_argument(
        "--gammas",
        type=int,
        nargs="+",
        default=list(DEFAULT_GAMMAS),
        metavar="G",
        help=f"Draft lengths (default: {' '.join(map(str, DEFAULT_GAMMAS))}).",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help=f"Tokens in the KV caches timed (default: {DEFAULT_CONTEXT}).",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=DEFAULT_PASSES,
        help=f"Interleaved timing passes (default: {DEFAULT_PASSES}).",
    )
    parser.add_argument(
        "--heldout-tokens",
        type=int,
        default=DEFAULT_HELDOUT_TOKENS,
        metavar="N",
        help=f"Measure on {HELDOUT_TOKENS_HELP}: train-draft's set for the same N.",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help=f"Held-out sequences are cut to this many tokens (default: "
        f"{DEFAULT_MAX_LENGTH}, train-draft's).",
    )
    parser.add_argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="Folder of the corpus's derived data (default: the user cache).",
    )
    parser.add_argument(
        "--out", default=None, metavar="FILE.md", help="Also write the table here."
    )
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="Also write the report here."
    )
    return one_line_errors(parser)


def read_draft_shape(path: str) -> Dict[str, int]:
    """``layers`` and ``vocab`` of a draft folder, from its config (no weights read).

    Raises:
        ValueError: One line: no such folder, or no distilled draft in it.
    """
    if not Path(path).expanduser().exists():
        raise ValueError(f"--drafts: '{path}' does not exist.")
    config = read_head_config(path)
    if config is None or config[HEAD_KEY].get("kind") != KIND:
        raise ValueError(
            f"--drafts: '{path}' holds no distilled draft (no config.json of kind "
            f"'{KIND}'); train one with mlx_spec train-draft --kind draft."
        )
    shape = config.get("draft", {})
    return {"layers": int(shape["num_layers"]), "vocab": int(shape["draft_vocab_size"])}


def check_args(args) -> Tuple[Dict[str, Dict[str, int]], Optional[List[Prompt]]]:
    """One-line ``ValueError`` for a bad option; the drafts' shapes by name and
    the ``--prompts`` file's prompts (``None`` without ``--prompts``)."""
    from ..config import check_size
    from ..outdir import check_out_dir, check_out_file
    from ..validation import check_gammas

    check_gammas(args.gammas, "--gammas")
    for flag, values, low in (
        ("--vocabs", args.vocabs, 1),
        ("--context", [args.context], 1),
        ("--passes", [args.passes], 1),
        ("--max-length", [args.max_length], 2),
        ("--heldout-tokens", [args.heldout_tokens], 1),
        ("--prompt-tokens", [args.prompt_tokens], 1),
    ):
        for value in values:  # mlx sizes are 32-bit: 2**70 was a TypeError
            check_size(flag, value, low)
    for flag in ("out", "json"):  # written at the end: checked now
        if getattr(args, flag):
            check_out_file(getattr(args, flag), f"--{flag}")
    if args.cache:
        check_out_dir(args.cache, force=True, flag="--cache")
    shapes = {}
    for path in args.drafts:
        shape = read_draft_shape(path)
        too_big = [v for v in args.vocabs if v > shape["vocab"]]
        if too_big:
            raise ValueError(
                f"--vocabs {too_big[0]} is larger than the vocabulary of the draft in "
                f"'{path}' ({shape['vocab']} rows)."
            )
        name = Path(path).name or path
        shapes[path if name in shapes else name] = shape
    try:
        Corpus(args.corpus).existing_manifest()
    except ValueError as e:
        raise ValueError(f"--corpus: {e}") from None
    prompts = None if args.prompts is None else load_prompt_file(args.prompts)
    return shapes, prompts


def prompt_completions(args, prompts: List[Prompt], model, tokenizer) -> Completions:
    """The target's greedy completions of ``prompts``, read from ``--prompts``."""
    chat = has_chat_template(tokenizer)
    encoded = [(p.prompt_set, encode(p, tokenizer, chat=chat)) for p in prompts]
    log(f"greedy completions of {len(prompts)} prompts from {args.prompts}")
    eos = [int(t) for t in tokenizer.eos_token_ids]
    return greedy_completions(model, encoded, eos, args.prompt_tokens)


def train_counts(corpus, vocab_size: int) -> np.ndarray:
    """Token counts of the corpus's training split, as train-draft counts them: ``(vocab,)``."""
    records = list(corpus.sequences("train"))
    data = Completions(
        tokens=[r.tokens for r in records], starts=[len(r.prompt) for r in records]
    )
    return token_counts(data, vocab_size)


def main(argv: Optional[Sequence[str]] = None):
    from ..loading import default_target, load_model
    from ..train.corpus_data import heldout_set

    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    try:
        names, prompts = check_args(args)
        model, tokenizer = load_model(args.model or default_target())
        drafts = {
            name: load_draft(path, model) for name, path in zip(names, args.drafts)
        }
        corpus = Corpus(args.corpus)
        if prompts is not None:
            heldout = prompt_completions(args, prompts, model, tokenizer)
        else:
            heldout = heldout_set(
                model,
                corpus,
                args.heldout_tokens,
                feature_layers=(),
                cache=args.cache,
                log=log,
            )
    except ValueError as e:
        parser.error(str(e))
    if not any(temp == 0 for temp in heldout.temps):
        parser.error(
            f"--corpus: '{args.corpus}' has no greedy held-out sequence "
            "(grow it, or raise --heldout-tokens)."
        )
    counts = train_counts(corpus, int(model.args.vocab_size))
    report = shape_study(
        model,
        drafts,
        heldout,
        counts,
        vocabs=args.vocabs,
        gammas=sorted(set(args.gammas)),
        always=sorted(int(t) for t in tokenizer.eos_token_ids),
        context=args.context,
        passes=args.passes,
        max_length=args.max_length,
        progress=log,
    )
    text = markdown(report)
    print(text, end="")
    if args.out:
        Path(args.out).expanduser().write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).expanduser().write_text(as_json(report), encoding="utf-8")


if __name__ == "__main__":
    guarded(main)
