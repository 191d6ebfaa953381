"""The speculative generation loop.

Each round: the drafter proposes γ tokens (lazily, async-evaluated), the
target scores ``[last, d_1..d_γ]`` in one forward, acceptance runs on
device, and the host syncs once to read ``(num_accepted, next_token,
drafts)``. Both caches are then rewound to the accepted tokens. A round
that drafts nothing, followed by another known to draft nothing (self
paused), queues that next target step on its lazy token before the sync,
as mlx_lm's plain decoding does.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START, generation_stream

from .acceptance import match_accept, rejection_accept, tree_accept
from .config import SpecConfig
from .drafters import (
    VERIFY_SLOPE,
    Proposal,
    RoundState,
    best_gamma,
    make_drafter,
    static_round_cost,
)
from .models import CachedModel, KVSettings, output_size
from .sampling import SamplingParams, normalize, processed_logprobs, sampling_params_of
from .stats import SpecStats
from .tree import Tree, commit_path, tree_forward

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

ACCEPTED, RECOVERED, BONUS, TARGET = "accepted", "recovered", "bonus", "target"


@dataclass
class TokenEvent:
    """One emitted token with where it came from.

    ``kind`` is ``"accepted"`` (a draft token the target kept),
    ``"recovered"`` (the target's token after a rejection), ``"bonus"``
    (the target's token after all drafts were accepted) or ``"target"``
    (a plain target step with no draft).
    """

    token: int
    logprobs: mx.array
    from_draft: bool
    kind: str
    round: int
    rejected: List[int] = field(default_factory=list)


class Law:
    """How tokens are chosen: greedy, exact rejection sampling, or sample-and-match.

    Exact rejection sampling needs the sampler's law; an opaque ``sampler``
    callable falls back to sample-and-match, which is also exact.
    """

    def __init__(self, params: Optional[SamplingParams], sampler: Optional[Callable]):
        self.params = params
        self.sampler = sampler
        if params is not None and params.greedy:
            self.mode = "greedy"
        elif params is not None:
            self.mode = "rejection"
        else:
            self.mode = "match"

    def draft_choice(self, logprobs: mx.array) -> Tuple[mx.array, Optional[mx.array]]:
        """Pick a draft token from ``logprobs`` ``(1, V)``; return it and its law."""
        if self.mode == "greedy":
            return mx.argmax(logprobs, axis=-1), None
        if self.mode == "rejection":
            law = processed_logprobs(logprobs, self.params)
            return mx.random.categorical(law), law
        return self.sampler(logprobs), None

    def node_choices(self, target_logprobs: mx.array) -> mx.array:
        """The target's own token at each row ``(N, V) -> (N,)``: argmax or a sample."""
        if self.mode == "greedy":
            return mx.argmax(target_logprobs, axis=-1)
        if self.mode == "match":
            return self.sampler(target_logprobs)
        return mx.random.categorical(processed_logprobs(target_logprobs, self.params))

    def accept(self, proposal: Proposal, target_logprobs: mx.array):
        """Return ``(num_accepted, next_token)`` on device.

        Args:
            proposal: The round's draft tokens ``(γ,)`` and their law.
            target_logprobs: The target's logprobs ``(γ + 1, V)``.
        """
        drafts = proposal.tokens
        if self.mode == "greedy":
            return match_accept(drafts, mx.argmax(target_logprobs, axis=-1))
        if self.mode == "match":
            return match_accept(drafts, self.sampler(target_logprobs))
        law = processed_logprobs(target_logprobs, self.params)
        if proposal.size == 0:
            return mx.array(0, mx.int32), mx.random.categorical(law[0])
        return rejection_accept(drafts, law, proposal.logprobs)


def _process(
    logits: mx.array, history: Optional[mx.array], processors: List[LogitsProcessor]
) -> mx.array:
    """Apply logits processors row by row (each row has its own history)."""
    if not processors:
        return normalize(logits)
    rows = []
    for i in range(logits.shape[0]):
        row = logits[i : i + 1]
        for processor in processors:
            row = processor(history[: history.shape[0] - logits.shape[0] + 1 + i], row)
        rows.append(row)
    return normalize(mx.concatenate(rows, axis=0))


def _validate_vocab(model, draft_model, tokenizer_size: Optional[int]):
    """Check the draft can be compared with the target; return the target width."""
    target_width = output_size(model)
    if draft_model is None:
        return target_width
    draft_width = output_size(draft_model)
    needed = tokenizer_size if tokenizer_size is not None else target_width
    if draft_width < needed:
        raise ValueError(
            f"the draft model emits {draft_width} logits but the tokenizer has "
            f"{needed} tokens; use a draft that shares the target's tokenizer."
        )
    return target_width


def speculative_generate_step(
    prompt: mx.array,
    model: nn.Module,
    draft_model: Optional[nn.Module] = None,
    *,
    num_draft_tokens: int = 4,
    max_tokens: int = 256,
    sampler: Optional[Callable] = None,
    logits_processors: Optional[List[LogitsProcessor]] = None,
    prompt_cache: Optional[List[Any]] = None,
    prefill_step_size: int = 512,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    config: Optional[SpecConfig] = None,
    stats: Optional[SpecStats] = None,
    tokenizer_size: Optional[int] = None,
) -> Generator[Tuple[int, mx.array, bool], None, None]:
    """A generator of ``(token, logprobs, from_draft)``, like mlx_lm's.

    Args:
        prompt: The prompt tokens, shape ``(L,)``.
        model: The target model.
        draft_model: The draft model (same tokenizer).
        num_draft_tokens: Draft tokens per round. Default: ``4``.
        max_tokens: Maximum number of tokens. Default: ``256``.
        sampler: A sampler; one from :func:`mlx_spec.make_sampler` (or
          ``mlx_lm``'s, after :func:`mlx_spec.register`) allows exact rejection
          sampling; any other callable uses sample-and-match. Default: greedy.
        logits_processors: mlx_lm logits processors, applied per position.
        prompt_cache: Target caches followed by draft caches (trimmable);
          updated in place. On return it holds the prompt and every yielded
          token, as mlx_lm's plain decoding leaves it.
        prefill_step_size: Prompt tokens per prefill chunk. Default: ``512``.
        kv_bits, kv_group_size, quantized_kv_start: KV-cache quantisation,
          as in ``mlx_lm.generate``.
        config: A :class:`SpecConfig`; overrides ``num_draft_tokens`` and
          ``max_tokens`` when given. Without one the draft length is fixed,
          as in ``mlx_lm``.
        stats: A :class:`SpecStats` to fill in place.
        tokenizer_size: The tokenizer's vocabulary size, to check the draft.

    Yields:
        Tuple[int, mx.array, bool]: One token, the target's log-probabilities
          for it ``(V,)``, and whether the draft proposed it.
    """
    events = speculative_events(
        prompt,
        model,
        draft_model,
        num_draft_tokens=num_draft_tokens,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=logits_processors,
        prompt_cache=prompt_cache,
        prefill_step_size=prefill_step_size,
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        quantized_kv_start=quantized_kv_start,
        config=config,
        stats=stats,
        tokenizer_size=tokenizer_size,
    )
    return ((e.token, e.logprobs, e.from_draft) for e in events)


def speculative_events(
    prompt,
    model,
    draft_model=None,
    *,
    num_draft_tokens: int = 4,
    max_tokens: int = 256,
    sampler=None,
    logits_processors=None,
    prompt_cache=None,
    prefill_step_size: int = 512,
    kv_bits=None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    config: Optional[SpecConfig] = None,
    stats: Optional[SpecStats] = None,
    tokenizer_size: Optional[int] = None,
    history_tokens: Optional[List[int]] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
) -> Generator[TokenEvent, None, None]:
    """Validate eagerly, then return the generator of :class:`TokenEvent`."""
    if config is None:  # mlx_lm's semantics: a fixed draft length
        config = SpecConfig(
            method="draft",
            num_draft_tokens=num_draft_tokens,
            max_tokens=max_tokens,
            adaptive=False,
        )
    if isinstance(prompt, (list, tuple)):
        prompt = mx.array(prompt)
    if prompt.size == 0:
        raise ValueError("the prompt is empty; give at least one token.")
    if prefill_step_size < 1:
        raise ValueError(
            f"prefill_step_size={prefill_step_size} is out of range: an integer >= 1."
        )

    kv = KVSettings(kv_bits, kv_group_size, quantized_kv_start)
    num_target_layers = len(model.layers)
    target_cache = (
        prompt_cache[:num_target_layers] if prompt_cache is not None else None
    )
    drafter_cache = (
        prompt_cache[num_target_layers:] if prompt_cache is not None else None
    )
    target = CachedModel(model, target_cache, kv, "target model")
    vocab_size = _validate_vocab(model, draft_model, tokenizer_size)
    drafter = make_drafter(config, target, draft_model, drafter_cache, kv, vocab_size)
    if history_tokens:
        if len(history_tokens) != target.offset:
            raise ValueError(
                f"history_tokens holds {len(history_tokens)} tokens but prompt_cache "
                f"holds {target.offset}; pass exactly the tokens already in the cache."
            )
        if hasattr(drafter, "add_history"):
            drafter.add_history(list(history_tokens))
    params = sampling_params_of(sampler)
    if sampler is None:
        params = SamplingParams(
            config.temp,
            config.top_p,
            config.min_p,
            config.top_k,
            config.min_tokens_to_keep,
        )
    law = Law(params, sampler)
    if logits_processors and hasattr(drafter, "chain_only"):
        drafter.chain_only()  # processors need one token history per position
    if logits_processors and getattr(drafter, "is_tree", False):
        raise ValueError(
            f"logits_processors are not supported by the '{config.method}' method yet; "
            "use --speculative draft."
        )
    stats = stats if stats is not None else SpecStats()
    stats.method = config.method
    stats.num_draft_tokens = config.num_draft_tokens
    return _generate(
        prompt.astype(mx.uint32),
        target,
        drafter,
        law,
        config,
        logits_processors or [],
        prefill_step_size,
        stats,
        prompt_cache,
        prompt_progress_callback,
    )


@dataclass
class RoundResult:
    """What the host learns from a round's sync.

    Attributes:
        num_accepted: Accepted draft tokens.
        path: Accepted proposal nodes, in order (chain: ``0..n-1``).
        emitted: Accepted tokens followed by the recovered or bonus token.
        rows: Row of the target's logprobs that predicted each emitted token.
        rejected: Draft tokens the recovered token replaced (for display).
        bonus: Whether the last token is a bonus (nothing left to reject).
    """

    num_accepted: int
    path: List[int]
    emitted: List[int]
    rows: List[int]
    rejected: List[int]
    bonus: bool


def _verify_chain(target, root, proposal, law, processors, history):
    """Score ``[root, d_1..d_γ]`` in one target forward and accept on device."""
    logits = target(mx.concatenate([root, proposal.tokens]))
    verify_history = None
    if processors:
        verify_history = mx.concatenate([history, proposal.tokens])
    target_logprobs = _process(logits, verify_history, processors)
    num_accepted, next_token = law.accept(proposal, target_logprobs)
    packed = mx.concatenate(
        [
            num_accepted.reshape(1).astype(mx.uint32),
            next_token.reshape(1).astype(mx.uint32),
            proposal.tokens.astype(mx.uint32),
        ]
    )
    gamma = proposal.size

    def decode(values) -> RoundResult:
        n, token, drafts = values[0], values[1], values[2:]
        return RoundResult(
            n,
            list(range(n)),
            drafts[:n] + [token],
            list(range(n + 1)),
            drafts[n:],
            n == gamma,
        )

    return packed, target_logprobs, decode


def _verify_tree(target, root, proposal, law):
    """Score the root and a draft tree in one tree-attention forward."""
    draft_tree = getattr(proposal, "tree", None)  # reuse the drafter's mask
    if draft_tree is None:
        draft_tree = Tree.from_parents(
            proposal.tokens.astype(mx.uint32), proposal.parents
        )
    tree = draft_tree.with_root(root)
    logits = tree_forward(target.model, target.cache, tree)
    target_logprobs = normalize(logits)
    choices = law.node_choices(target_logprobs)
    deepest, num_accepted, next_token = tree_accept(
        tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, choices
    )
    packed = mx.concatenate(
        [
            mx.stack([deepest, num_accepted, next_token]).astype(mx.int32),
            tree.tokens.astype(mx.int32),
            tree.parents,
        ]
    )
    size = tree.size

    def decode(values) -> RoundResult:
        deepest, n, token = values[:3]
        tokens, parents = values[3 : 3 + size], values[3 + size :]
        nodes = []
        node = deepest
        while node > 0:
            nodes.append(node)
            node = parents[node]
        nodes.reverse()
        children = [tokens[i] for i in range(size) if parents[i] == deepest]
        return RoundResult(
            n,
            [v - 1 for v in nodes],
            [tokens[v] for v in nodes] + [token],
            [0] + nodes,
            children,
            not children,
        )

    return packed, target_logprobs, decode


class RoundPlanner:
    """Which drafter (arm) runs each round, and its draft length or tree budget.

    Fixed by default; with ``config.adaptive`` each arm gets its own
    :class:`AdaptiveController`, fed with the arm's acceptance and the cost
    of each round as a function of its verified width (draft steps,
    verification and host work together, so no time is attributed by
    guesswork and no extra sync is needed). Under greedy decoding that cost
    is the round's wall time (the output cannot depend on it); when sampling
    it comes from :func:`static_round_cost`, so a seed always gives the same
    text.
    """

    def __init__(self, config: SpecConfig, drafter, timed: bool):
        self.config = config
        self.drafter = drafter
        self.timed = timed
        self.controllers = {}
        self.arm = drafter
        self.pending = None  # the last round, until its cost is known
        self.planned = None  # the next round's (is_tree, size), once chosen
        self.tic = 0.0

    def _controller(self, arm):
        if not self.config.adaptive:
            return None
        key = getattr(arm, "name", "drafter")
        if key not in self.controllers:
            self.controllers[key] = _make_controller(self.config, arm)
        return self.controllers[key]

    def plan(self) -> Tuple[bool, int]:
        """Pick the next round's arm and size ahead of its start (see :meth:`begin_round`)."""
        if self.planned is None:
            select = getattr(self.drafter, "select", None)
            self.arm = select() if select is not None else self.drafter
            is_tree = getattr(self.arm, "is_tree", False)
            controller = self._controller(self.arm)
            if controller is None:
                config = self.config
                size = config.tree_budget if is_tree else config.num_draft_tokens
            else:
                size = controller.choose_budget() if is_tree else controller.choose()
            self.planned = (is_tree, size)
        return self.planned

    def begin_round(self) -> Tuple[bool, int]:
        """Start a round with its planned arm; return ``(is_tree, size)``.

        A measured round costs the time from its start to the next round's
        start, so per-round host work (commit, streaming) counts too.
        """
        now = time.perf_counter()
        if self.pending is not None:
            self._record(now - self.tic)
        self.tic = now
        planned = self.plan()
        self.planned = None
        return planned

    def queues_plain_round(self, seq_len: int) -> bool:
        """Plan the next round; True if it is known to draft nothing.

        Its target step can then be queued before this round's sync, as in
        plain decoding. Only for a single drafter that says so for a context
        of ``seq_len`` tokens without reading them (``drafts_nothing``).
        """
        if getattr(self.drafter, "select", None) is not None:
            return False  # auto picks an arm per round; keep commits in order
        is_tree, size = self.plan()
        drafts_nothing = getattr(self.arm, "drafts_nothing", None)
        return (
            not is_tree and drafts_nothing is not None and drafts_nothing(size, seq_len)
        )

    def end_round(self, size: int, proposal, accepted: int):
        """Note the round's outcome; it is recorded once its cost is known."""
        self.pending = (size, proposal, accepted)
        if not self.timed:
            step = getattr(self.arm, "step_cost", 0.0)
            self._record(static_round_cost(step, proposal.forwards, proposal.size + 1))

    def _record(self, cost: float):
        size, proposal, accepted = self.pending
        self.pending = None
        if self.timed:
            cost = max(cost - proposal.setup_time, 0.0)  # a one-off search
        if hasattr(self.drafter, "observe"):
            self.drafter.observe(accepted + 1, cost)
        drafted, width = proposal.size, proposal.size + 1
        controller = self._controller(self.arm)
        if controller is None:
            return
        if getattr(self.arm, "is_tree", False):
            if drafted:
                controller.update_tree(size, accepted, 0.0, cost, width)
        elif drafted or controller.gamma_min == 0:
            # With γ 0 allowed, a round that drafted nothing prices plain decoding.
            controller.update(drafted, accepted, 0.0, cost, width, draft_steps=0)


def _make_controller(config: SpecConfig, arm):
    """A controller for one arm, starting from the arm's own cost and acceptance.

    A chain round's cost grows by a draft step plus a verified token per γ
    (:func:`static_round_cost`), which prices widths until two are measured.
    An arm with an acceptance estimate (self's layer search) also starts at
    the γ that estimate favours, capped at the fixed default. An arm that
    can draft nothing for a round at no later cost (``drafts_nothing``:
    self, whose draft is the target) may choose γ 0, a plain round, when
    drafting does not pay in measured time; a draft model would have to
    catch up later, so its arms keep γ ≥ 1.
    """
    from .adaptive import AdaptiveController

    if arm.is_tree:
        budgets = {b for b in (4, 8, 16, 24, 32, 48, 64) if b <= config.tree_budget * 4}
        return AdaptiveController(
            tree_budgets=sorted(budgets | {config.tree_budget}),
            init_budget=config.tree_budget,
        )
    gamma_max = config.max_draft_tokens
    step = getattr(arm, "step_cost", 0.0)
    # γ 0 (plain rounds) only for arms that can pause without a catch-up cost.
    gamma_min = 0 if hasattr(arm, "drafts_nothing") else 1
    options = dict(
        gamma_min=gamma_min, gamma_max=gamma_max, verify_slope=VERIFY_SLOPE + step
    )
    alpha = getattr(arm, "acceptance_estimate", None)
    if alpha is None:
        options["init_gamma"] = min(config.num_draft_tokens, gamma_max)
    else:
        # Searched estimates run high: start no longer than the fixed default.
        gamma, _ = best_gamma(alpha, step, range(1, gamma_max + 1))
        gamma = min(gamma, config.num_draft_tokens)
        options.update(prior_acceptance=alpha, init_gamma=gamma)
    return AdaptiveController(**options)


def _generate(
    prompt,
    target,
    drafter,
    law,
    config,
    processors,
    prefill_step_size,
    stats,
    prompt_cache,
    progress=None,
):
    base = target.offset
    seq: List[int] = prompt.tolist()
    history = prompt if processors else None
    caller_owns_cache = prompt_cache is not None
    planner = RoundPlanner(config, drafter, timed=law.mode == "greedy")
    generated = 0
    round_index = 0

    def choose(logits, drafted):
        hist = None
        if processors:
            hist = mx.concatenate([history, *drafted]) if drafted else history
        return law.draft_choice(_process(logits, hist, processors))

    with mx.stream(generation_stream):
        try:
            tic = time.perf_counter()
            drafter.prefill(prompt[:-1], prefill_step_size)
            total = int(prompt.size)
            report = progress and (lambda done, _: progress(done, total))
            target.prefill(prompt[:-1], prefill_step_size, report)
            if progress is not None:
                progress(total, total)
            stats.prompt_tokens = int(prompt.size)
            stats.prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()

            queued = None  # a plain round's successor, built before its sync
            while generated < config.max_tokens:
                remaining = config.max_tokens - generated
                is_tree, size = planner.begin_round()
                state = RoundState(seq, base, choose)
                round_tic = time.perf_counter()
                prefix_len = base + len(seq) - 1
                if queued is not None:
                    (proposal, verified), queued = queued, None
                    verify_tic = round_tic
                else:
                    proposal = Proposal(mx.array([], mx.uint32), None)
                    if remaining > 1:
                        proposal = drafter.propose(
                            state, size if is_tree else min(size, remaining - 1)
                        )
                    if config.profile:
                        mx.eval(proposal.tokens, proposal.logprobs)
                        draft_time = time.perf_counter() - round_tic
                        stats.draft_time = (stats.draft_time or 0.0) + draft_time
                    verify_tic = time.perf_counter()
                    root = mx.array(seq[-1:], mx.uint32)
                    if proposal.parents is None:
                        verified = _verify_chain(
                            target, root, proposal, law, processors, history
                        )
                    else:
                        verified = _verify_tree(target, root, proposal, law)
                packed, target_logprobs, decode = verified
                extra = proposal.sync_data
                if extra is not None:
                    packed = mx.concatenate(
                        [packed.astype(mx.int32), extra.astype(mx.int32)]
                    )
                elif (
                    proposal.size == 0
                    and remaining > 1
                    and not (processors or config.profile)
                    and planner.queues_plain_round(len(seq) + 1)
                ):
                    # Two plain rounds in a row: queue the next target step on
                    # this round's lazy token before syncing, as mlx_lm does.
                    empty = Proposal(mx.array([], mx.uint32), None)
                    step = _verify_chain(target, packed[1:2], empty, law, None, None)
                    mx.async_eval(step[0], step[1])
                    queued = (empty, step)

                # The round's single host sync.
                sync_tic = time.perf_counter()
                mx.eval(packed, target_logprobs)
                values = packed.tolist()
                if extra is not None:
                    values, proposal.sync_values = (
                        values[: -extra.size],
                        values[-extra.size :],
                    )
                done = time.perf_counter()
                if config.profile:
                    stats.verify_time = (stats.verify_time or 0.0) + done - verify_tic
                else:
                    stats.sync_time += done - sync_tic

                result = decode(values)
                n, drafted = result.num_accepted, proposal.size
                if proposal.parents is None:
                    # With a step queued, nothing was drafted and it holds the next slot.
                    if queued is None:
                        target.trim_to(prefix_len + 1 + n)
                else:
                    commit_path(
                        target.cache,
                        prefix_len,
                        [0] + [i + 1 for i in result.path],
                        kv_bits=target.kv.kv_bits,
                        kv_group_size=target.kv.kv_group_size,
                        quantized_kv_start=target.kv.quantized_kv_start,
                    )
                drafter.commit(state, proposal, n, result.path)
                planner.end_round(size, proposal, n)
                stats.rounds += 1
                stats.target_forwards += 1
                stats.draft_forwards += proposal.forwards
                stats.draft_tokens += drafted
                stats.accepted_tokens += n
                if drafted > 0:
                    stats.accepted_per_round.append(n)
                    stats.drafted_per_round.append(drafted)
                    if proposal.parents is not None:
                        stats.tree_sizes.append(drafted)

                if processors:
                    history = mx.concatenate(
                        [history, mx.array(result.emitted, mx.uint32)]
                    )
                for i, tok in enumerate(result.emitted):
                    if i < n:
                        kind, rejected = ACCEPTED, []
                    elif drafted == 0:
                        kind, rejected = TARGET, []
                    elif result.bonus:
                        kind, rejected = BONUS, []
                    else:
                        kind, rejected = RECOVERED, result.rejected
                    seq.append(tok)
                    generated += 1
                    stats.generated_tokens = generated
                    stats.generation_time = time.perf_counter() - tic
                    row = target_logprobs[result.rows[i]]
                    yield TokenEvent(tok, row, i < n, kind, round_index, rejected)
                    if generated == config.max_tokens:
                        break
                round_index += 1
                if round_index % 256 == 0:
                    mx.clear_cache()
        finally:
            if hasattr(drafter, "report"):
                drafter.report(stats)
            _finish(target, drafter, seq, base, caller_owns_cache, prompt_cache)


def _finish(target, drafter, seq, base, caller_owns_cache, prompt_cache):
    """Leave the caches holding exactly the prompt and the yielded tokens."""
    target.trim_to(base + len(seq))
    if caller_owns_cache:
        missing = seq[target.offset - base :]
        if missing:
            target(mx.array(missing, mx.uint32))
            mx.eval([c.state for c in target.cache])
        drafter.sync(seq, base)
        prompt_cache[:] = target.cache + drafter.caches()
