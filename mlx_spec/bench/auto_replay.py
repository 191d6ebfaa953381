"""``auto``'s choices replayed on recorded greedy matches, priced by a fixed cost model.

Usage::

    python -m mlx_spec.bench.auto_replay --corpus models/smollm2-135m-corpus
    python -m mlx_spec.bench.auto_replay --corpus C --max-tokens 96 --noise 0.15
    python -m mlx_spec.bench.auto_replay --corpus C --heldout-tokens 10000
    python -m mlx_spec.bench.auto_replay --corpus C --draft-step 0.05 --verify-slope 0.01

Under greedy decoding a draft model's chain round is decided by the draft's
argmax given the true prefix at every position (its teacher-forced matches,
:func:`mlx_spec.train.draft.greedy_matches`): a round of γ drafts at
completion position ``j`` accepts the run of matches starting at ``j``, at
most γ. Prompt lookup needs only the tokens. So ``auto`` can be replayed
round by round without timing anything: its real
:class:`~mlx_spec.drafters.auto.AutoDrafter`,
:class:`~mlx_spec.planner.RoundPlanner` and controllers, with a draft-model
arm that reads the matches and the real lookup arm, on a clock that advances
by each round's modelled cost (:class:`CostModel`, in 1-token target
forwards). The controllers see what they would online: the arm, the tokens
accepted and the round's cost. The tree arm is left out (its rounds depend
on the draft's laws off the true path).

It reads the greedy sequences of the corpus's fixed held-out set (never
trained on; train-draft's for the same ``--heldout-tokens``, see
:func:`mlx_spec.train.corpus_data.heldout_set`, so only the shards it holds
are read) and reports per prompt family: the draft's greedy acceptance, and tokens per
modelled time against plain decoding (1 token per unit) for ``auto`` and
for the draft model at each fixed γ. The default costs are those ``auto``
measured on a 2-core CPU (a draft step 0.12, each verified token 0.085).
"""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import numpy as np

from mlx_spec_entry import guarded

from ..config import SpecConfig
from ..drafters.auto import AutoDrafter
from ..drafters.base import Proposal, RoundState, empty_proposal
from ..drafters.lookup import LookupDrafter
from ..planner import RoundPlanner
from ..train.corpus_data import DEFAULT_HELDOUT_TOKENS, HELDOUT_TOKENS_HELP

DEFAULT_GAMMAS = (1, 2, 3, 4)


@dataclass(frozen=True)
class CostModel:
    """A round's cost in 1-token target forwards.

    Attributes:
        draft_step: One draft-model forward of one token.
        verify_slope: Each verified token beyond the first.
        catch_up: Each token beyond the first that a draft forward reads (the
          draft catches up on plain rounds' tokens), relative to a draft step.
    """

    draft_step: float = 0.12
    verify_slope: float = 0.085
    catch_up: float = 0.085

    def round(self, forwards: int, width: int, read: int = 1) -> float:
        """A round of ``forwards`` draft forwards (the first reading ``read``
        tokens) and one verification of ``width`` tokens."""
        draft = self.draft_step * (forwards + self.catch_up * max(read - 1, 0))
        return draft + 1.0 + self.verify_slope * (width - 1)


class MatchedDraft:
    """A draft model's chain arm that drafts from teacher-forced matches.

    Its proposal holds the true tokens while the matches run and a wrong token
    after, so a round accepts exactly what the real draft's would.

    Args:
        tokens: The whole sequence ``(P + N,)``: prompt, then completion.
        start: ``P``, where the completion starts.
        matches: ``(N,)`` bool: the draft's argmax given the true prefix is
          completion token ``j``.
        step_cost: The arm's modelled draft step (the cost model's prior).
    """

    name = "draft"
    is_tree = False
    catches_up = True

    def __init__(self, tokens, start: int, matches, step_cost: float):
        self.tokens = [int(t) for t in tokens]
        self.start = start
        self.matches = np.asarray(matches, bool)
        self.step_cost = step_cost
        self.seen = start - 1  # tokens of seq in the draft's cache (after prefill)
        self.read = 1  # tokens the last proposal's first forward read

    def drafts_nothing(self, gamma: int, seq_len: int) -> bool:
        return gamma < 1

    def propose(self, state: RoundState, gamma: int) -> Proposal:
        if gamma < 1:
            return empty_proposal()
        j = len(state.seq) - self.start  # the completion position drafted first
        run = 0
        while run < gamma and j + run < len(self.matches) and self.matches[j + run]:
            run += 1
        truth = self.tokens[len(state.seq) : len(state.seq) + run]
        wrong = [self.tokens[len(state.seq) + run] + 1] if run < gamma else []
        tokens = truth + wrong + [0] * (gamma - run - len(wrong))
        self.read = len(state.seq) - self.seen
        return Proposal(
            mx.array(tokens, mx.uint32), None, forwards=gamma, caught_up=self.read - 1
        )

    def commit(self, state, proposal, num_accepted: int, path=None):
        if proposal.size:
            self.seen = len(state.seq) + min(num_accepted, proposal.size - 1)

    def prefill(self, tokens, step_size: int):
        pass

    def caches(self) -> List:
        return []

    def sync(self, seq, base: int):
        pass


class _NoMatches(LookupDrafter):
    """Lookup that finds no match: auto's plain rounds without its copies."""

    def will_draft(self, seq) -> bool:
        return False


@dataclass
class Replay:
    """One replayed generation: tokens, modelled time, and per round its arm,
    the tokens it drafted and how many of them were accepted."""

    tokens: int
    time: float
    rounds: List[str]
    drafted: List[int]
    accepted: List[int]
    fitted: Optional[dict] = None  # the cost model auto fitted (MeasuredCosts.report)

    def rejected(self, arm: str) -> int:
        """Drafted tokens of ``arm``'s rounds that were rejected (each cost
        verification width and earned nothing)."""
        return sum(
            d - a
            for r, d, a in zip(self.rounds, self.drafted, self.accepted)
            if r == arm
        )


def _accepted(proposal: Proposal, truth: Sequence[int]) -> int:
    """Leading proposal tokens equal to ``truth``."""
    n = 0
    for drafted, true in zip(proposal.tokens.tolist(), truth):
        if drafted != true:
            break
        n += 1
    return n


def replay_auto(
    tokens: Sequence[int],
    start: int,
    matches,
    costs: CostModel = CostModel(),
    *,
    max_tokens: Optional[int] = None,
    lookup: bool = True,
    noise: float = 0.0,
    seed: int = 0,
    queued_ahead: bool = False,
) -> Replay:
    """Replay ``auto`` (draft chain, lookup and plain rounds) on one completion.

    Args:
        tokens: Prompt and completion ``(P + N,)``; the completion is the
          target's greedy output.
        start: ``P``.
        matches: ``(N,)`` teacher-forced greedy matches of the draft.
        costs: The modelled cost of a round.
        max_tokens: Tokens to generate. Default: the completion's ``N``.
        lookup: Let lookup draft its matches (else it finds none and only
          runs the plain rounds).
        noise: The spread of the costs the controllers see: each is the
          modelled cost times ``exp(noise * z)``, ``z`` standard normal
          (drawn from ``seed``); the replay's time adds the modelled costs.
        queued_ahead: Time a plain step queued ahead in the round that
          queued it, as a CPU does (``mx.async_eval`` returns once most of
          a forward ran): that round measures two steps, the queued one none.

    Returns:
        The :class:`Replay`; ``tokens / time`` is its speed against plain
        decoding.
    """
    tokens = [int(t) for t in tokens]
    total = len(tokens) - start if max_tokens is None else max_tokens
    total = min(total, len(tokens) - start)
    config = SpecConfig(method="auto", max_tokens=total)
    draft = MatchedDraft(tokens, start, matches, costs.draft_step)
    finder = LookupDrafter if lookup else _NoMatches
    arms = {"draft": draft, "lookup": finder(max_len=max(config.num_draft_tokens, 1))}
    arms["lookup"].chain_only()
    auto = AutoDrafter(arms, config)
    rng = np.random.default_rng(seed)
    now, seen = [0.0], [0.0]  # modelled time, and what the controllers measure
    planner = RoundPlanner(config, auto, timed=True, clock=lambda: seen[0])
    seq = tokens[:start]
    queued, rounds, drafted, accepted = False, [], [], []
    ran_ahead = False  # this round's step ran in the round before
    while len(seq) - start < total:
        remaining = total - (len(seq) - start)
        is_tree, size = planner.begin_round(seq)
        state = RoundState(seq, 0, None, True, None)
        proposal = empty_proposal()
        if not queued and remaining > 1:
            proposal = auto.propose(state, min(size, remaining - 1))
        arm = auto.current if auto.current != "lookup" or proposal.size else "plain"
        read = draft.read if proposal.forwards else 1
        jitter = float(np.exp(noise * rng.standard_normal())) if noise else 1.0
        if planner.times_drafts(proposal):
            drafts = costs.round(proposal.forwards, 1, read) - 1.0
            planner.drafts_took(proposal, drafts * jitter)
        queued = (
            proposal.size == 0 and remaining > 1 and planner.queues_plain_round(seq)
        )
        truth = tokens[len(seq) : len(seq) + proposal.size]
        n = _accepted(proposal, truth)
        auto.commit(state, proposal, n)
        planner.end_round(size, proposal, n)
        cost = costs.round(proposal.forwards, proposal.size + 1, read)
        now[0] += cost
        seen[0] += 0.0 if ran_ahead else cost * jitter
        ran_ahead = queued and queued_ahead
        if ran_ahead:
            seen[0] += costs.round(0, 1) * jitter
        seq = seq + tokens[len(seq) : len(seq) + min(n + 1, remaining)]
        rounds.append(arm)
        drafted.append(proposal.size)
        accepted.append(n)
    fitted = planner.costs.report() if planner.costs.rounds else None
    return Replay(len(seq) - start, now[0], rounds, drafted, accepted, fitted)


def replay_fixed(matches, gamma: int, costs: CostModel = CostModel()) -> Replay:
    """The draft model at a fixed γ on one completion's matches."""
    n, j, time, rounds, drafted, accepted = len(matches), 0, 0.0, [], [], []
    read = 1  # a round that accepts every draft leaves the draft a token behind
    while j < n:
        g = min(gamma, n - j - 1)
        run = 0
        while run < g and matches[j + run]:
            run += 1
        time += costs.round(g, g + 1, read)
        read = 2 if g and run == g else 1
        j += run + 1
        rounds.append("draft" if g else "plain")
        drafted.append(g)
        accepted.append(run)
    return Replay(n, time, rounds, drafted, accepted)


def family_speeds(
    records: Sequence[Dict],
    costs: CostModel = CostModel(),
    *,
    gammas: Sequence[int] = DEFAULT_GAMMAS,
    max_tokens: Optional[int] = None,
    noise: float = 0.0,
    queued_ahead: bool = False,
) -> Dict[str, Dict[str, float]]:
    """Speed against plain per family (all tokens over all modelled time).

    Args:
        records: Each with ``family``, ``tokens``, ``start`` and ``matches``.
        max_tokens: Replay each record's first tokens only.
        noise: Of the costs auto measures (see :func:`replay_auto`).
        queued_ahead: How auto's clock sees a queued plain step (see
          :func:`replay_auto`).

    Returns:
        ``family -> {"auto": x, "γ=1": x, ..., "alpha": greedy acceptance,
        "lookup waste": y, "fit v(8)": v, "fit draft": c}``, with an
        ``"all"`` family over every record; ``y`` is the share of auto's
        modelled time spent verifying lookup drafts that were rejected, ``v``
        and ``c`` the medians over the records of auto's fitted cost of
        verifying 8 tokens and of a draft step (in its fitted 1-token steps,
        to read against the modelled costs).
    """
    out: Dict[str, Dict[str, List[float]]] = {}
    fits: Dict[str, Dict[str, List[float]]] = {}
    for i, r in enumerate(records):
        n = len(r["matches"]) if max_tokens is None else max_tokens
        matches = np.asarray(r["matches"], bool)[:n]
        runs = {
            "auto": replay_auto(
                r["tokens"],
                r["start"],
                matches,
                costs,
                max_tokens=len(matches),
                noise=noise,
                seed=i,
                queued_ahead=queued_ahead,
            )
        }
        fitted = runs["auto"].fitted
        for g in gammas:
            runs[f"γ={g}"] = replay_fixed(matches, g, costs)
        for family in (r["family"], "all"):
            row = out.setdefault(family, {"alpha": [0, 0]})
            row["alpha"][0] += int(matches.sum())
            row["alpha"][1] += len(matches)
            for label, run in runs.items():
                tot = row.setdefault(label, [0, 0.0])
                tot[0] += run.tokens
                tot[1] += run.time
            waste = row.setdefault("lookup waste", [0.0, 0.0])
            waste[0] += costs.verify_slope * runs["auto"].rejected("lookup")
            waste[1] += runs["auto"].time
            fit = fits.setdefault(family, {"fit v(8)": [], "fit draft": []})
            if fitted is not None:
                fit["fit v(8)"].append(fitted["verify_by_width"][8])
                if "draft" in fitted["draft_step"]:
                    fit["fit draft"].append(fitted["draft_step"]["draft"])
    return {
        family: {
            **{label: a / max(b, 1e-12) for label, (a, b) in row.items()},
            **{
                k: float(np.median(v)) if v else float("nan")
                for k, v in fits[family].items()
            },
        }
        for family, row in out.items()
    }


def corpus_records(
    model,
    draft,
    corpus,
    *,
    max_length: int,
    heldout_tokens: int = DEFAULT_HELDOUT_TOKENS,
    cache: Optional[Path] = None,
) -> List[Dict]:
    """The greedy sequences of the corpus's fixed held-out set with the draft's matches.

    Args:
        heldout_tokens: The held-out set's budget, as train-draft's
          ``--heldout-tokens`` (:func:`~mlx_spec.train.corpus_data.heldout_set`).
        cache: Folder of the corpus's derived data (default: the user cache).

    Returns:
        Per sequence: ``family``, ``tokens`` ``(P + N,)``, ``start`` ``P`` and
        ``matches`` ``(N,)`` (cut to ``max_length`` tokens in all).
    """
    from ..train.corpus_data import heldout_set
    from ..train.draft import greedy_matches
    from ..train.head_data import token_rows
    from .draft_shapes import DEFAULT_BATCH_TOKENS, heldout_batches

    data = heldout_set(model, corpus, heldout_tokens, feature_layers=(), cache=cache)
    batches = heldout_batches(data, DEFAULT_BATCH_TOKENS, max_length)
    rows = token_rows(np.array(draft.lm_head.token_ids), int(model.args.vocab_size))
    found = greedy_matches(draft, data, batches, rows, max_length)[0]
    greedy = [i for b in batches for i in b if data.temps[i] == 0.0]
    records = []
    for i, matches in zip(greedy, found):
        start = int(data.starts[i])
        tokens = np.asarray(data.tokens[i])[: start + len(matches)]
        records.append(
            dict(
                family=data.prompt_sets[i], tokens=tokens, start=start, matches=matches
            )
        )
    return records


def markdown(speeds: Dict[str, Dict[str, float]], costs: CostModel) -> str:
    """The table of :func:`family_speeds`, one row per family."""
    labels = [k for k in next(iter(speeds.values())) if k != "alpha"]
    lines = [
        f"Modelled costs: a draft step {costs.draft_step}, each verified token "
        f"{costs.verify_slope} of a 1-token target forward (verifying 8: "
        f"{1 + 7 * costs.verify_slope:.3f}); tokens per modelled time against "
        "plain decoding, and the costs auto fitted (medians over sequences).",
        "",
        "| family | greedy α | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 2) + "|",
    ]
    for family in sorted(speeds, key=lambda f: (f == "all", f)):
        row = speeds[family]
        cells = " | ".join(f"{row[k]:.3f}" for k in labels)
        lines.append(f"| {family} | {row['alpha']:.3f} | {cells} |")
    return "\n".join(lines) + "\n"


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_spec.bench.auto_replay",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument("--corpus", required=True, help="A corpus folder.")
    parser.add_argument("--model", default=None, help="Default: the default target.")
    parser.add_argument(
        "--draft", default=None, help="A distilled draft. Default: the shipped one."
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="Replay only each sequence's first tokens. Default: all of them.",
    )
    parser.add_argument(
        "--heldout-tokens",
        type=int,
        default=DEFAULT_HELDOUT_TOKENS,
        metavar="N",
        help=f"Replay {HELDOUT_TOKENS_HELP}: train-draft's set for the same N.",
    )
    parser.add_argument("--draft-step", type=float, default=CostModel.draft_step)
    parser.add_argument("--verify-slope", type=float, default=CostModel.verify_slope)
    parser.add_argument("--catch-up", type=float, default=CostModel.catch_up)
    parser.add_argument(
        "--queued-ahead",
        action="store_true",
        help="Time a plain step queued ahead in the round that queued it, as "
        "a CPU does (its mx.async_eval returns once most of a forward ran).",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="Spread of the costs auto measures (log-normal). Default: 0.",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None):
    from ..drafters.distilled import load_draft
    from ..loading import default_model_pair, load_model
    from ..options import one_line_errors
    from ..train.corpus import Corpus
    from ..train.draft import DEFAULT_MAX_LENGTH

    parser = setup_arg_parser()
    one_line_errors(parser)
    args = parser.parse_args(argv)
    if args.max_tokens is not None and args.max_tokens < 2:
        parser.error(f"--max-tokens must be >= 2, got {args.max_tokens}")
    if args.heldout_tokens < 1:
        parser.error(f"--heldout-tokens must be >= 1, got {args.heldout_tokens}")
    if min(args.draft_step, args.verify_slope, args.catch_up, args.noise) < 0:
        parser.error(
            "--draft-step, --verify-slope, --catch-up and --noise must be >= 0"
        )
    costs = CostModel(args.draft_step, args.verify_slope, args.catch_up)
    try:
        target, draft = args.model, args.draft
        if target is None or draft is None:
            default_target, default_draft = default_model_pair("draft")
            target, draft = target or default_target, draft or default_draft
        if draft is None:
            raise ValueError("no draft found: give --draft DIR")
        model, _ = load_model(str(target))
        drafter = load_draft(str(Path(draft)), model)
        corpus = Corpus(args.corpus)
        corpus.existing_manifest()
        records = corpus_records(
            model,
            drafter,
            corpus,
            max_length=DEFAULT_MAX_LENGTH,
            heldout_tokens=args.heldout_tokens,
        )
    except ValueError as e:
        parser.error(str(e))
    if not records:
        parser.error(f"--corpus: '{args.corpus}' has no greedy held-out sequence")
    speeds = family_speeds(
        records,
        costs,
        max_tokens=args.max_tokens,
        noise=args.noise,
        queued_ahead=args.queued_ahead,
    )
    print(markdown(speeds, costs), end="")


if __name__ == "__main__":
    guarded(main)
