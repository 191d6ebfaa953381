"""Self-speculation: the target drafts with some of its layers skipped.

As in Draft & Verify (Zhang et al., 2023) and SWIFT (Xia et al., 2024), the
draft is the target itself run through a subset of its transformer blocks;
the full target then verifies the draft in one forward, so the output is
exact (greedy identity, and the target's law when sampling, by the engine's
rejection sampling against the draft's own law).

No model file is forked: while drafting, the model's layer list is
temporarily replaced by the kept blocks (every supported architecture,
llama, qwen2, qwen3, mistral, gemma and phi3, iterates ``model.model.layers``
zipped with the cache list and builds its mask from the first cache).

Caches are shared, not copied. The kept blocks run on the TARGET's own cache
objects, whose prefix holds the full model's exact keys and values. Drafting
appends the draft tokens' entries to those caches; the end of
:meth:`SelfDrafter.propose` trims them back, so every layer is in sync again
before the target's verification forward, which overwrites the same slots.
The lazily built draft graph stays correct: mlx-lm's ``KVCache`` writes by
slice assignment, which makes a new array node, so the draft's reads keep
their own inputs while the verify forward's writes come after them. Skipped
blocks need no cache at all.

The skipped set is chosen in the first round, once the target's cache holds
the prompt, by a short search on the last 12 context tokens. One masked
forward (tree attention) re-runs them against the whole cached context and
ranks the blocks by how little they change the hidden state (block
influence, ``1 - cos(h_in, h_out)``, as in ShortGPT); then skipping the k
least influential blocks is scored for a few k (or, for small models, every
subset of at most half the blocks) by the expected tokens per round over
the round's modelled cost (``drafters.expected_speedup``) at the set's best
draft length among those the engine may use. The acceptance rate is how
often the kept blocks, reading the full model's keys and values for the
earlier tokens (as when drafting), give the full model's greedy token at
those positions (one masked forward per set), and the draft cost is the
bytes of weights each step reads. The search leaves the cache as it found
it. Caches tree attention cannot read (rotating, quantized) are searched
on the last 64 tokens alone, in a fresh cache.
When no set is estimated to pay (speedup below 1), nothing is drafted and
decoding is plain; after 8 drafting rounds the estimate is redone with the
measured per-token acceptance, and drafting stops if it does not pay. The
search runs once more on the generated output after 48 tokens, since that
output, not the prompt, is what the draft must predict. Every call searches
afresh (no state is kept between calls), so equal inputs and seed give equal
output.
"""

import itertools
import math
import time
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..caches import copy_states, model_type, needs_journal, set_states
from ..costs import best_gamma, weight_bytes
from ..features import pipeline_stage
from .base import (
    Proposal,
    RoundState,
    align_vocab,
    check_no_drafter_cache,
    confident,
)

# Prompt tokens the layer search looks at (the last ones).
DEFAULT_SEARCH_TOKENS = 64
# Self-speculation chooses among all the target's blocks; a stage holds some.
ON_PIPELINE_STAGES = (
    "--speculative self does not run on --pipeline stages (each process holds "
    "only some of the blocks it would choose among); use --speculative lookup "
    "or a draft model, or drop --pipeline to shard the target tensor-parallel."
)
# Positions (the last of the window) at which a skip set's agreement is measured.
EVAL_POSITIONS = 12
# At most this fraction of the blocks is skipped.
MAX_SKIP_FRACTION = 0.5
# At most this many skip counts are scored (large models).
MAX_SEARCH_POINTS = 6
# Models with at most this many candidate sets have all of them scored.
MAX_EXHAUSTIVE_SETS = 8
# Generated tokens after which the search runs once more, on the output.
DEFAULT_RETUNE_AFTER = 48
# Below this estimated speedup a searched set is not used: plain decoding.
DEFAULT_MIN_SPEEDUP = 1.0
# Drafting rounds after which the speedup is re-estimated from measured acceptance.
CHECK_ROUNDS = 8


def layer_owner(model: nn.Module) -> nn.Module:
    """The module whose ``layers`` list the model's forward iterates.

    ``model.model`` for most families, ``model.backbone`` for Mamba-style ones,
    ``model.language_model.model`` for multimodal wrappers: the first module
    whose ``layers`` list holds exactly ``model.layers``.

    Raises:
        ValueError: If the model keeps its blocks elsewhere (unsupported).
    """
    blocks = list(model.layers)
    for _, module in model.named_modules():
        layers = module.get("layers") if isinstance(module, dict) else None
        if (
            module is not model
            and isinstance(layers, list)
            and len(layers) == len(blocks)
            and all(a is b for a, b in zip(layers, blocks))
        ):
            return module
    raise ValueError(
        f"--speculative self does not support model type {model_type(model)!r} "
        "(no module holds its blocks as a list); use --speculative lookup or a "
        "draft model."
    )


@contextmanager
def running_layers(model: nn.Module, layers: Sequence):
    """Run ``model`` with ``layers`` in place of its blocks (restored on exit)."""
    owner = layer_owner(model)
    original = owner.layers
    owner.layers = list(layers)
    try:
        yield
    finally:
        owner.layers = original


def self_unsupported(model: nn.Module) -> Optional[str]:
    """Why self-speculation cannot run on ``model``, or ``None`` if it can.

    Pipeline stages are refused alike on every rank: each stage's
    ``model.layers`` holds its own blocks alone, and their counts differ.
    """
    if pipeline_stage(model) is not None:
        return ON_PIPELINE_STAGES
    num_layers = len(model.layers)
    if num_layers < 2:
        return (
            "--speculative self needs a model with at least 2 layers; "
            f"this one has {num_layers}."
        )
    return None


def layer_costs(model: nn.Module) -> Tuple[List[int], int]:
    """Bytes of weights read per decode step: ``(per block (L,), output head)``."""
    blocks = [weight_bytes(layer) for layer in model.layers]
    head = None
    for name, module in model.named_modules():
        if name.split(".")[-1] == "lm_head":
            head = module
    if head is None:  # tied embeddings
        owner = layer_owner(model)
        head = owner.get("embed_tokens", owner.get("embeddings"))
    return blocks, weight_bytes(head)


class _Skipped:
    """Stands in for a skipped block: returns its input hidden state unchanged.

    Used where the model indexes its caches by block position (hybrid and
    sliding-window families build masks from fixed layer indices), so the
    block list keeps its length; attributes still read the real block.
    """

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, h, *args, **kwargs):
        return h

    def __getattr__(self, name):
        return getattr(self.layer, name)


def kept_blocks(
    model: nn.Module, kept: Sequence[int], cache: List
) -> Tuple[List, List]:
    """``(blocks, caches)`` that run only the ``kept`` blocks of ``model``.

    Plain KV-cache models get the kept blocks and their caches alone; models
    with recurrent or sliding-window caches keep every position, skipped
    blocks replaced by :class:`_Skipped` (their caches are left untouched).
    """
    keep = set(kept)
    if needs_journal(cache):
        blocks = [
            layer if i in keep else _Skipped(layer)
            for i, layer in enumerate(model.layers)
        ]
        return blocks, list(cache)
    return [model.layers[i] for i in kept], [cache[i] for i in kept]


def draft_cost(blocks: Sequence[int], head: int, kept: Sequence[int]) -> float:
    """Cost of a draft step relative to a full forward (bytes of weights read)."""
    return (sum(blocks[i] for i in kept) + head) / (sum(blocks) + head)


class _Tap:
    """A block wrapper that records its input and output hidden states."""

    def __init__(self, layer, record: List):
        self.layer = layer
        self.record = record

    def __call__(self, h, *args, **kwargs):
        out = self.layer(h, *args, **kwargs)
        self.record.append((h, out))
        return out

    def __getattr__(self, name):
        return getattr(self.layer, name)


def block_influence(
    model: nn.Module, tokens: mx.array, cache: Optional[List] = None
) -> Tuple[mx.array, mx.array]:
    """One full forward of ``tokens`` ``(W,)``, filling ``cache`` if given.

    Returns:
        ``(influence (L,), greedy (W,))``: ``1 - mean cos(h_in, h_out)`` of each
        block, and the full model's argmax at each position.
    """
    record: List = []
    with running_layers(model, [_Tap(layer, record) for layer in model.layers]):
        logits = model(tokens[None], cache=cache)[0]
    if not all(isinstance(out, mx.array) for _, out in record):
        raise ValueError(
            f"--speculative self does not support model type {model_type(model)!r} "
            "(its blocks return several values); use --speculative lookup or a "
            "draft model."
        )
    return _influence(record), mx.argmax(logits, axis=-1)


def _influence(record: List) -> mx.array:
    """``1 - mean cos(h_in, h_out)`` per block, from :class:`_Tap` records ``(L,)``."""
    scores = []
    for h_in, h_out in record:
        dot = (h_in * h_out).sum(-1)
        norms = mx.linalg.norm(h_in, axis=-1) * mx.linalg.norm(h_out, axis=-1)
        scores.append(1 - (dot / mx.maximum(norms, 1e-6)).mean())
    return mx.stack(scores)


def _rerun_tail(model: nn.Module, cache: List, tail: mx.array) -> mx.array:
    """Re-run the cache's last ``P`` tokens ``tail`` ``(P,)`` in one masked forward.

    Query j (the token in slot ``S - P + j``) reads the cached keys and
    values of the slots before it and its own new entry in slot ``S + j``,
    as a draft step at that position does. The caller trims the cache back
    to ``S``. Returns the model output ``(P, V)``.
    """
    from ..attention.tree import masked_forward

    size, num = cache[0].offset, tail.shape[0]
    start = size - num
    steps = mx.arange(num)[:, None]
    slots = mx.arange(size + num)[None]
    mask = (slots < start + steps) | (slots == size + steps)  # (P, S + P)
    return masked_forward(model, cache, tail, mx.arange(start, size), mask)


def agreement(
    model: nn.Module,
    kept: Sequence[int],
    tokens: mx.array,
    greedy: mx.array,
    cache: List,
    positions: int,
) -> mx.array:
    """How often the kept blocks give the full model's argmax, as when drafting.

    At each of the last ``positions`` positions t of ``tokens`` ``(W,)``, the
    kept blocks read the FULL model's keys and values for the tokens before t
    (as a draft does on the target's caches), and their argmax is compared
    with ``greedy[t]``. A teacher-forced forward of the kept blocks alone
    would instead pair draft queries with draft keys and can be far off.
    All positions run in one masked forward (tree attention); models it does
    not support run them one by one (:func:`agreement_stepwise`).

    Args:
        cache: Full-model ``KVCache`` list whose last ``W`` entries hold
          ``tokens`` (unchanged on return); only the masked forward accepts
          a cache with more entries before them.
    """
    kept_cache = [cache[i] for i in kept]
    if not _masked_forward_ready(model, kept_cache):
        return agreement_stepwise(model, kept, tokens, greedy, cache, positions)
    size, num = cache[0].offset, tokens.shape[0]
    count = min(positions, num, size - 1)  # the first slot has nothing before it
    try:
        with running_layers(model, [model.layers[i] for i in kept]):
            logits = _rerun_tail(model, kept_cache, tokens[num - count :])
        rate = (mx.argmax(logits, axis=-1) == greedy[num - count :]).astype(mx.float32)
        rate = rate.mean()
        mx.eval(rate)
    finally:
        for c in kept_cache:
            c.trim(c.offset - size)
    return rate


def context_influence(
    model: nn.Module, cache: List, tail: mx.array
) -> Tuple[mx.array, mx.array]:
    """:func:`block_influence` on the cache's last tokens ``tail`` ``(P,)``, in context.

    One masked forward (:func:`_rerun_tail`) re-runs them against the full
    context already in the target's ``cache`` (unchanged on return), so no
    separate forward of a window without its context is needed.
    """
    from ..attention.tree import prepare_tree_model

    prepare_tree_model(model)
    size = cache[0].offset
    record: List = []
    try:
        with running_layers(model, [_Tap(layer, record) for layer in model.layers]):
            logits = _rerun_tail(model, cache, tail)
        influence = _influence(record)
        greedy = mx.argmax(logits, axis=-1)
        mx.eval(influence, greedy)
    finally:
        for c in cache:
            c.trim(c.offset - size)
    return influence, greedy


def _masked_forward_ready(model: nn.Module, cache: List) -> bool:
    """Whether tree attention can run ``model`` on ``cache`` (prepares it if so)."""
    from ..attention.tree import prepare_tree_model

    if any(type(c) is not KVCache for c in cache):
        return False
    try:
        prepare_tree_model(model)
    except ValueError:
        return False
    return True


def agreement_stepwise(
    model: nn.Module,
    kept: Sequence[int],
    tokens: mx.array,
    greedy: mx.array,
    cache: List,
    positions: int,
) -> mx.array:
    """:func:`agreement` with one forward of the kept blocks per position."""
    # Fresh views: slice assignment mutates the cache's own array objects.
    saved = [
        (c.keys[..., : c.offset, :], c.values[..., : c.offset, :], c.offset)
        for c in cache
    ]
    kept_cache = [cache[i] for i in kept]
    num = tokens.shape[0]
    hits = []
    try:
        with running_layers(model, [model.layers[i] for i in kept]):
            # Latest position first: each step only overwrites slots no longer read.
            for t in range(num - 1, max(num - 1 - positions, 0), -1):
                for c in kept_cache:
                    c.trim(c.offset - t)
                logits = model(tokens[None, t : t + 1], cache=kept_cache)[0, -1]
                hits.append(mx.argmax(logits) == greedy[t])
            rate = mx.stack(hits).astype(mx.float32).mean()
            mx.eval(rate)
    finally:
        for c, (keys, values, offset) in zip(cache, saved):
            c.keys, c.values, c.offset = (
                keys[..., :offset, :],
                values[..., :offset, :],
                offset,
            )
    return rate


def position_states(
    model: nn.Module, tokens: mx.array, cache: List, positions: int
) -> List:
    """The full model's cache states before each of the last ``positions`` tokens.

    Fills the fresh ``cache`` with ``tokens`` ``(W,)``: the head in one
    forward, then one forward per position, copying the states (new array
    objects, no data copy) before each. Works for every cache type.
    """
    num = tokens.shape[0]
    count = min(positions, num - 1)  # the first position has nothing before it
    if num - count > 0:
        model(tokens[None, : num - count], cache=cache)
    states = []
    for t in range(num - count, num):
        states.append(copy_states(cache))
        model(tokens[None, t : t + 1], cache=cache)
    mx.eval(states)
    return states


def agreement_from_states(
    model: nn.Module,
    kept: Sequence[int],
    tokens: mx.array,
    greedy: mx.array,
    cache: List,
    states: List,
) -> mx.array:
    """:func:`agreement` for any cache type, from :func:`position_states`.

    At each scored position the caches are set to the full model's states
    before it and the kept blocks run on that token, as when drafting.
    """
    num, count = tokens.shape[0], len(states)
    blocks, caches = kept_blocks(model, kept, cache)
    hits = []
    with running_layers(model, blocks):
        for t, state in zip(range(num - count, num), states):
            set_states(cache, state)
            logits = model(tokens[None, t : t + 1], cache=caches)[0, -1]
            hits.append(mx.argmax(logits) == greedy[t])
    rate = mx.stack(hits).astype(mx.float32).mean()
    mx.eval(rate)
    return rate


def skippable(num_layers: int) -> List[int]:
    """Blocks that may be skipped: all but the first and last (with 4+ blocks)."""
    if num_layers >= 4:
        return list(range(1, num_layers - 1))
    return list(range(num_layers))


def candidate_sets(
    candidates: Sequence[int], influence: Sequence[float], max_skip: int
) -> List[Tuple[int, ...]]:
    """The skip sets to score.

    Every subset of at most ``max_skip`` candidates when there are at most
    :data:`MAX_EXHAUSTIVE_SETS` of them (small models); otherwise the ``k``
    least influential blocks for up to :data:`MAX_SEARCH_POINTS` values of k.
    """
    total = sum(math.comb(len(candidates), k) for k in range(1, max_skip + 1))
    if total <= MAX_EXHAUSTIVE_SETS:
        return [
            s
            for k in range(1, max_skip + 1)
            for s in itertools.combinations(candidates, k)
        ]
    # Least influential first; ties go to the later block.
    order = sorted(candidates, key=lambda i: (influence[i], -i))
    counts = {
        max(1, round(max_skip * j / MAX_SEARCH_POINTS))
        for j in range(1, MAX_SEARCH_POINTS + 1)
    }
    return [tuple(sorted(order[:k])) for k in sorted(counts)]


def choose_skipped_layers(
    model: nn.Module,
    tokens: mx.array,
    gammas: Sequence[int],
    cache: Optional[List] = None,
) -> Tuple[List[int], Dict]:
    """Pick the blocks to skip from a short search on ``tokens`` ``(W,)``.

    One full forward gives each block's influence and the full model's greedy
    tokens; each candidate set (see :func:`candidate_sets`) costs one forward
    of its kept blocks. The set maximising :func:`expected_speedup` at its
    best draft length in ``gammas`` wins (ties: the first scored, i.e. fewer
    skipped blocks).

    With ``cache``, the target's own caches whose last entries hold
    ``tokens``, the last :data:`EVAL_POSITIONS` tokens are re-run in context
    by masked forwards (:func:`context_influence`, :func:`agreement`) and the
    cache is left as it was; otherwise (or when tree attention cannot read
    that cache) ``tokens`` are run alone on a fresh cache.

    Returns:
        ``(skipped, report)``: sorted block indices, and the search's estimates
        (``alpha``, ``cost``, ``gamma``, ``speedup`` of the chosen set and of
        every set).
    """
    num_layers = len(model.layers)
    candidates = skippable(num_layers)
    max_skip = max(1, min(len(candidates), int(MAX_SKIP_FRACTION * num_layers)))
    blocks, head = layer_costs(model)
    if tokens.size < 2:
        # Nothing to measure: skip a run of middle blocks.
        mid = len(candidates) // 2
        skipped = sorted(
            candidates[max(0, mid - max_skip // 2) :][: max(1, max_skip // 2)]
        )
        return skipped, {"searched": False}

    in_context = (
        cache is not None
        and _masked_forward_ready(model, cache)
        and cache[0].offset >= 2
    )
    states = None
    if in_context:
        tokens = tokens[-min(EVAL_POSITIONS, cache[0].offset - 1) :]
        influence, greedy = context_influence(model, cache, tokens)
    else:
        cache = make_prompt_cache(model)
        if needs_journal(cache):  # recurrent or sliding-window layers
            influence, greedy = block_influence(model, tokens, make_prompt_cache(model))
            states = position_states(model, tokens, cache, EVAL_POSITIONS)
        else:
            influence, greedy = block_influence(model, tokens, cache)
        mx.eval(influence, greedy, [c.state for c in cache])
    sets = candidate_sets(candidates, influence.tolist(), max_skip)
    alphas = []
    for skip in sets:
        kept = [i for i in range(num_layers) if i not in skip]
        if states is not None:
            alphas.append(
                agreement_from_states(model, kept, tokens, greedy, cache, states)
            )
            continue
        alphas.append(agreement(model, kept, tokens, greedy, cache, EVAL_POSITIONS))
    alphas = mx.stack(alphas).tolist()
    best, scored = None, []
    for skip, alpha in zip(sets, alphas):
        cost = draft_cost(blocks, head, [i for i in range(num_layers) if i not in skip])
        gamma, speedup = best_gamma(alpha, cost, gammas)
        scored.append(
            {
                "skip": list(skip),
                "alpha": alpha,
                "cost": cost,
                "gamma": gamma,
                "speedup": speedup,
            }
        )
        if best is None or speedup > best["speedup"]:
            best = scored[-1]
    report = dict(best, searched=True, in_context=in_context, scored=scored)
    del report["skip"]
    return best["skip"], report


class SelfDrafter:
    """The target with some blocks skipped, drafting on the target's own caches.

    Args:
        target: The target and its caches (shared, never copied).
        vocab_size: Width of the target's logits.
        skipped: Blocks to skip; ``None`` chooses them on the prompt.
        gammas: Draft lengths the engine may ask for; the layer search and
          the check score a set at its best one. Default: ``(4,)``.
        search_tokens: Tokens the search looks at (the last ones).
        retune_after: Once this many tokens are generated, search once more
          on the latest tokens, which are then mostly the target's own output
          (its acceptance is what matters); ``0`` never re-tunes. Only for
          automatically chosen layers. Default: ``48``.
        min_speedup: When the best searched set's estimated speedup is
          below this, propose nothing (plain decoding) until a re-tune finds
          a better one. Default: ``1.0``.
        p_min: Stop drafting once the draft's top probability falls below
          this (one host sync per draft step); ``0`` never stops early.
    """

    name = "self"
    is_tree = False

    def __init__(
        self,
        target,
        vocab_size: int,
        *,
        skipped: Optional[Sequence[int]] = None,
        gammas: Sequence[int] = (4,),
        search_tokens: int = DEFAULT_SEARCH_TOKENS,
        retune_after: int = DEFAULT_RETUNE_AFTER,
        min_speedup: float = DEFAULT_MIN_SPEEDUP,
        p_min: float = 0.0,
    ):
        self.target = target
        self.min_speedup = min_speedup
        self.p_min = p_min
        self.drafting = True
        self.retune_after = retune_after
        self.auto = skipped is None
        self.prompt_len = 0
        self.vocab_size = vocab_size
        self.gammas = tuple(gammas)
        self.search_tokens = search_tokens
        reason = self_unsupported(target.model)
        if reason is not None:
            raise ValueError(reason)
        layer_owner(target.model)
        self.search: Dict = {}
        self.layer_costs = layer_costs(target.model)
        self.realized = [0, 0, 0]
        self.skipped: Optional[List[int]] = None
        if skipped is not None:
            self._use(skipped)

    @property
    def step_cost(self) -> float:
        """A draft step's cost relative to a full forward (weight bytes read)."""
        if self.skipped is None:
            return 1.0
        return draft_cost(*self.layer_costs, self.kept)

    def set_skipped(self, skipped: Sequence[int]):
        """Skip exactly these blocks from now on (no search, no re-tuning)."""
        self.auto = False
        self.drafting = True
        self._use(skipped)

    def _use(self, skipped: Sequence[int]):
        num_layers = len(self.target.model.layers)
        skipped = sorted(set(int(i) for i in skipped))
        if any(not 0 <= i < num_layers for i in skipped) or len(skipped) >= num_layers:
            raise ValueError(
                f"skipped layers {skipped} are out of range: distinct indices in "
                f"[0, {num_layers - 1}], keeping at least one of the {num_layers} layers."
            )
        self.skipped = skipped
        self.kept = [i for i in range(num_layers) if i not in set(skipped)]

    def prefill(self, tokens: mx.array, step_size: int):
        """Note the prompt; the first round searches once the target holds it."""
        self.prompt_len = int(tokens.size) + 1

    def _search(self, context: List[int]):
        """Search on the last tokens of ``context``, which the target's cache ends with."""
        window = mx.array(context[-self.search_tokens :], mx.uint32)
        model, cache = self.target.model, self.target.cache
        skipped, search = choose_skipped_layers(model, window, self.gammas, cache)
        self._adopt(dict(search, skipped=skipped))

    def _adopt(self, search: Dict):
        self.search = search
        self._use(search["skipped"])
        speedup = search.get(
            "realized_speedup", search.get("speedup", self.min_speedup)
        )
        self.drafting = speedup >= self.min_speedup
        self.realized = [0, 0, 0]  # rounds, draft tokens tested, accepted

    def report(self, stats):
        """Record the skipped blocks in ``stats`` (``[]`` when not drafting)."""
        stats.skipped_layers = list(self.skipped or []) if self.drafting else []

    def drafts_nothing(self, gamma: int, seq_len: int) -> bool:
        """Whether :meth:`propose` for a context of ``seq_len`` tokens drafts nothing.

        Known without the context's values, so the engine may queue such a
        round's target step before it reads the previous round's token.
        """
        if self.skipped is None:
            return False  # the first round searches on the prompt
        retune = self.auto and self.retune_after
        if retune and seq_len - self.prompt_len >= self.retune_after:
            return False  # the re-tune searches on the output
        return gamma < 1 or not self.drafting

    def propose(self, state: RoundState, gamma: int) -> Proposal:
        """Draft ``gamma`` tokens with the kept blocks, then rewind their caches.

        The target cache holds ``seq[:-1]``; the kept blocks' caches get
        ``seq[-1], d_1..d_{γ-1}`` appended while drafting and are trimmed back
        before returning, so the verify forward finds every layer in sync.
        """
        generated = len(state.seq) - self.prompt_len
        retune = self.auto and self.retune_after and generated >= self.retune_after
        setup_time = 0.0
        if self.skipped is None or retune:
            tic = time.perf_counter()
            self._search(state.seq[:-1])  # the target's cache holds seq[:-1]
            setup_time = time.perf_counter() - tic  # the search syncs
            if retune:
                self.retune_after = 0  # once
                self.search["retuned_at"] = generated
        if gamma < 1 or not self.drafting:
            return Proposal(mx.array([], mx.uint32), None, setup_time=setup_time)
        model = self.target.model
        start = self.target.offset
        self.target.mark()  # drafting is rewound to here below
        blocks, caches = kept_blocks(model, self.kept, self.target.cache)
        inputs = mx.array(state.seq[-1:], mx.uint32)
        tokens, laws = [], []
        with running_layers(model, blocks):
            for i in range(gamma):
                logits = align_vocab(
                    model(inputs[None], cache=caches)[0, -1:], self.vocab_size
                )
                token, law = state.choose(logits, tokens)
                mx.async_eval(token)
                tokens.append(token)
                laws.append(law)
                inputs = token
                if i + 1 < gamma and not confident(logits, self.p_min):
                    break
        self.target.rollback.trim_to(start)  # every layer back in sync
        logprobs = None if laws[0] is None else mx.concatenate(laws, axis=0)
        return Proposal(
            mx.concatenate(tokens),
            logprobs,
            forwards=len(tokens),
            setup_time=setup_time,
        )

    def commit(
        self, state: RoundState, proposal: Proposal, num_accepted: int, path=None
    ):
        """Check the realized speedup; the target trims the shared caches.

        The search's acceptance estimate comes from a few teacher-forced
        positions, so it can be far off. After
        :data:`CHECK_ROUNDS` drafting rounds it is replaced by the measured
        per-token acceptance (accepted over tested draft tokens; a round
        tests up to its first rejection), and drafting stops if the set
        does not pay at its best draft length.
        """
        if not (
            self.auto and self.drafting and proposal.size and "cost" in self.search
        ):
            return
        tested = num_accepted + (num_accepted < proposal.size)
        self.realized = [
            a + b for a, b in zip(self.realized, (1, tested, num_accepted))
        ]
        rounds, tested, accepted = self.realized
        if rounds == CHECK_ROUNDS:
            alpha = accepted / tested
            gamma, speedup = best_gamma(alpha, self.search["cost"], self.gammas)
            self.search.update(
                realized_alpha=alpha, realized_gamma=gamma, realized_speedup=speedup
            )
            self.drafting = speedup >= self.min_speedup

    @property
    def acceptance_estimate(self) -> Optional[float]:
        """Per-token acceptance of the skipped set: measured, else searched."""
        return self.search.get("realized_alpha", self.search.get("alpha"))

    def caches(self) -> List:
        return []

    def sync(self, seq: List[int], base: int):
        """Nothing to do: the drafter has no cache of its own."""


def make_self_drafter(
    config, target, draft_model, cache, kv, vocab_size
) -> SelfDrafter:
    """Drafter factory for ``--speculative self`` (see ``registry.FACTORIES``).

    ``config.skip_layers`` (if the config has it) fixes the skipped blocks;
    otherwise they are chosen on the prompt. A draft model, if given, is not used.
    """
    check_no_drafter_cache(cache, "self")
    skipped = getattr(config, "skip_layers", None)
    return SelfDrafter(
        target,
        vocab_size,
        skipped=skipped,
        gammas=(
            range(1, config.max_draft_tokens + 1)
            if config.adaptive
            else (config.num_draft_tokens,)
        ),
        p_min=config.draft_p_min,
    )
