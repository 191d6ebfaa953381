"""Continuous batching with speculation: every active sequence in one round.

This module arranges rows (admission, prefill, the ragged caches, one
forward for all); the rules of a round are the single-sequence engine's. A
round of :class:`SpecBatchGenerator`:

1. each row plans its arm and draft length ``γ`` (:mod:`.batch_plan`): its
   arm's adaptive controller (:mod:`mlx_spec.planner`) chooses ``γ``, for
   prompt lookup over its own context and the server's earlier requests
   (:mod:`.index`), the draft model, or nothing (a plain step); the round's
   width ``K <= max γ`` is chosen for the whole batch, since every row pays
   for it (draft-model rows sit a round out when their draft steps do not pay);
2. the rows that draft with the draft model do so together: one batched
   draft forward per step, ``K`` steps, each row drawing from its own law
   (:meth:`mlx_spec.verify.Law.draft_choice`);
3. the target verifies every row in ONE forward of width ``1 + K`` (row
   ``b`` holds its pending token, its drafts, then filler), and acceptance
   runs on device for each group of rows that share a law
   (:meth:`mlx_spec.verify.Law.accept_rows`, the rules of
   :mod:`mlx_spec.acceptance` with the rows as a leading axis);
4. one host sync reads every row's accepted count, next token and drafts;
5. each row's caches keep only its own accepted tokens
   (:class:`~.batch_cache.RaggedBatch`: the rest become masked gaps), and its
   controller records the round (:meth:`.rows.Row.record`).

Between rounds, requests join (after a prompt prefill of their own, on
their single-sequence prompt cache) and leave (EOS, ``max_tokens``, a stop
word or a disconnect seen by the caller). Each step prefills at most
``prefill_step_size`` prompt tokens, oldest request first: a long prompt
takes one chunk per round, so the rows decoding wait one chunk at most,
while short prompts queued together share one step instead of waiting a
round each. A prompt that begins like another request's (a system prompt, a
document several clients ask about) starts from that request's caches,
waiting, ready or decoding, and reads only the rest.

Per row the output is exactly the single-sequence engine's: greedy rows
emit the target's argmax chain, sampled rows follow the target's law
(rejection sampling against the law each draft token was drawn from), and
the attention of each row sees exactly its own tokens.
"""

import time
from collections import deque
from typing import Any, List, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache

from ..acceptance import one_hot_logprobs
from ..costs import model_step_cost
from ..drafters.base import align_vocab, vocab_subset
from ..drafters.fit import check_drafter, drafter_kind
from ..models import num_caches, output_size
from ..sampling import normalize
from ..stats import SpecStats
from ..verify import Law, token_kind
from .batch_accept import emitted_tokens, gather_logprobs, law_groups, sample_rows
from .batch_cache import RaggedBatch
from .batch_plan import RowPlanner
from .index import CrossRequestIndex
from .rows import Row, SeqOutput, SeqSpec, seq_info

# Methods a batch runs; the others are served one request at a time.
BATCH_METHODS = ("none", "lookup", "draft", "auto")
DEFAULT_MAX_BATCH = 32
# A prompt starts from another request's caches when they share at least
# this many tokens (a system prompt, a document several requests ask about).
MIN_SHARED_PREFIX = 16


class SpecBatchGenerator:
    """Continuous batching with speculative decoding (see the module docstring).

    Example::

        gen = SpecBatchGenerator(model, draft_model, index=CrossRequestIndex())
        uid = gen.insert(SeqSpec(prompt, SpecConfig(method="draft", max_tokens=64)))
        while gen.has_work:
            for out in gen.next():
                ...  # out.tokens, out.finish_reason, out.cache

    Args:
        model: The target model (plain ``KVCache`` layers only).
        draft_model: An optional draft model with the target's tokenizer.
        index: The cross-request index shared by lookup and ``auto``.
        prefill_step_size: Prompt tokens per prefill chunk.
        max_batch: Most sequences decoding together.
        timed: Plan rounds by their measured wall time; ``False`` plans by
          the fixed cost model, so a seeded sampled batch gives the same text.
    """

    def __init__(
        self,
        model,
        draft_model=None,
        *,
        index: Optional[CrossRequestIndex] = None,
        prefill_step_size: int = 512,
        max_batch: int = DEFAULT_MAX_BATCH,
        timed: bool = True,
    ):
        self.model = model
        self.draft_model = draft_model
        self.index = index
        self.prefill_step_size = prefill_step_size
        self.max_batch = max_batch
        self.vocab_size = output_size(model)
        self.num_target_caches = num_caches(model)
        self.draft_step_cost = (
            model_step_cost(draft_model, model) if draft_model is not None else 0.0
        )
        # A distilled draft drafts over its vocabulary subset's columns.
        self.draft_subset = vocab_subset(draft_model)
        self._uid = 0
        self.waiting: deque = deque()  # prefilling, in order
        self.ready: List[Row] = []  # prefilled, joining at the next round
        self.active: List[Row] = []  # target-batch order
        self.drafting: List[Row] = []  # draft-batch order (uses_draft rows)
        self.target = RaggedBatch(self.num_target_caches, 0)
        self.draft: Optional[RaggedBatch] = None
        self.rounds = 0
        self.planner = RowPlanner(self.draft_step_cost, index, timed)

    # ------------------------------------------------------------------ #
    # Requests

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.ready or self.active)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.ready) + len(self.active)

    def insert(self, spec: SeqSpec, stats: Optional[SpecStats] = None) -> int:
        """Queue a request; returns its uid. ``stats`` is filled as it runs."""
        if spec.method not in BATCH_METHODS:
            raise ValueError(
                f"method '{spec.method}' is not batched; use one of {BATCH_METHODS}."
            )
        uses_draft = self.draft_model is not None and spec.method in ("draft", "auto")
        check_drafter(spec.method, drafter_kind(self.draft_model))
        if not spec.prompt:
            raise ValueError("the prompt is empty; give at least one token.")
        stats = stats if stats is not None else SpecStats()
        stats.method = spec.method
        stats.num_draft_tokens = spec.config.num_draft_tokens
        stats.prompt_tokens = stats.prompt_tokens or len(spec.prompt)
        price = self.planner.price
        seq = Row(self._uid, spec, uses_draft, stats, self.draft_step_cost, price)
        self._uid += 1
        seq.single = self._initial_cache(spec, uses_draft)
        held = spec.cached if spec.cache is not None else 0
        seq.prefilled = min(held, len(spec.prompt) - 1)
        seq.held = seq.prefilled
        self.waiting.append(seq)
        return seq.uid

    def _initial_cache(self, spec: SeqSpec, uses_draft: bool) -> List[Any]:
        """The request's cache, holding at most ``prompt[:-1]``."""
        cache = spec.cache
        expected = self.num_target_caches
        if uses_draft:
            expected += num_caches(self.draft_model)
        if cache is None or spec.cached == 0:
            cache = make_prompt_cache(self.model)
            if uses_draft:
                cache += make_prompt_cache(self.draft_model)
        elif len(cache) != expected:
            raise ValueError(
                f"the prompt cache has {len(cache)} layers; this method needs "
                f"{expected}."
            )
        held = spec.cached if spec.cache is not None else 0
        if held >= len(spec.prompt):  # recompute the last prompt token
            trim_prompt_cache(cache, held - len(spec.prompt) + 1)
        return cache

    def remove(
        self, uid: int, kept: Optional[int] = None
    ) -> Optional[Tuple[List[Any], List[int]]]:
        """Drop a request; return its prompt cache and the tokens it holds.

        Args:
            uid: The request.
            kept: Generated tokens the client got (a stop word may cut the
              last round short); default: all.

        Returns:
            ``(cache, tokens)`` for the prompt cache, or ``None`` if the
            request was still waiting or unknown.
        """
        for queue in (self.waiting, self.ready):
            for s in list(queue):
                if s.uid == uid:
                    queue.remove(s)
                    return None
        for b, s in enumerate(self.active):
            if s.uid == uid:
                return self._leave([b], [kept])[0]
        return None

    def _leave(self, rows: List[int], kept: List[Optional[int]]):
        """Extract the caches of ``rows`` and drop them from the batch."""
        out = []
        for b, k in zip(rows, kept):
            s = self.active[b]
            k = s.generated if k is None else min(k, s.generated)
            tokens = s.seq[: s.prompt_size + k]
            length = min(int(self.target.lengths[b]), len(tokens))
            if s.uses_draft:
                length = min(length, s.draft_len)
            cache = self.target.extract(b, length)
            if s.uses_draft:
                cache += self.draft.extract(self.drafting.index(s), length)
            mx.eval([c.state for c in cache])
            out.append((cache, tokens[:length]))
            if self.index is not None and not s.spec.isolation:
                start = s.spec.index_from
                start = s.spec.cached if start is None else start
                self.index.add(s.seq[min(start, s.prompt_size) : len(tokens)])
        gone = {self.active[b].uid for b in rows}
        keep = [b for b, s in enumerate(self.active) if s.uid not in gone]
        self.target = self.target.select(keep)
        self.active = [self.active[b] for b in keep]
        if self.draft is not None:
            dkeep = [j for j, s in enumerate(self.drafting) if s.uid not in gone]
            self.draft = self.draft.select(dkeep)
            self.drafting = [self.drafting[j] for j in dkeep]
        return out

    # ------------------------------------------------------------------ #
    # Steps

    def next(self) -> List[SeqOutput]:
        """Join ready requests, run one round, then prefill up to one chunk's
        worth of tokens (:meth:`_prefill_step`)."""
        with mx.stream(generation_stream):
            self._join()
            outputs = self._round() if self.active else []
            outputs += self._prefill_step()
        return outputs

    def _prefill_step(self) -> List[SeqOutput]:
        """Prefill waiting prompts in arrival order, ``prefill_step_size``
        tokens at most: the chunk of a long prompt, or several short ones."""
        outputs, budget = [], self.prefill_step_size
        while self.waiting and budget > 0:
            s = self.waiting[0]
            self._share_prefix(s)
            before = s.prefilled
            outputs += self._prefill_chunk(budget)
            budget -= s.prefilled - before
        return outputs

    def _share_prefix(self, s: Row):
        """Start ``s``'s prefill from the longest prefix of its prompt that
        another request's caches hold (prefilled, waiting to join or
        decoding), so concurrent requests read a shared prefix once.

        The prefix's keys and values are those a prefill of ``s`` computes
        (causal attention: a token's depend only on the tokens before it).
        """
        limit = len(s.seq) - 1
        best, source = s.prefilled, None
        for row, held in self._holders(s):
            n = common_prefix(s.seq, row.seq, min(limit, held))
            if n > best:
                best, source = n, row
        if source is None or best - s.prefilled < MIN_SHARED_PREFIX:
            return
        T = self.num_target_caches
        if source in self.active:
            cache = self.target.extract(self.active.index(source), best)
            if s.uses_draft:
                cache += self.draft.extract(self.drafting.index(source), best)
        else:
            kept = source.single if s.uses_draft else source.single[:T]
            cache = [prefix_cache(c, best) for c in kept]
        s.single, s.prefilled = cache, best

    def _holders(self, s: Row):
        """``(row, tokens)``: rows whose caches hold their first ``tokens``
        tokens for every model ``s`` needs."""
        for row in list(self.waiting) + self.ready:
            if row is not s and (row.uses_draft or not s.uses_draft):
                yield row, row.prefilled
        for b, row in enumerate(self.active):
            if row.uses_draft or not s.uses_draft:
                held = int(self.target.lengths[b])
                yield row, min(held, row.draft_len) if s.uses_draft else held

    def prefill_waiting(self):
        """Process waiting prompts now, as many as the batch has room for, so
        that an offline batch decodes them all from its first round (a server
        interleaves prefill with rounds instead)."""
        with mx.stream(generation_stream):
            while self.waiting and len(self.ready) + len(self.active) < self.max_batch:
                self._share_prefix(self.waiting[0])
                self._prefill_chunk()

    def _join(self):
        room = self.max_batch - len(self.active)
        joining, self.ready = self.ready[:room], self.ready[room:]
        if not joining:
            return
        now = time.perf_counter()
        targets = [s.single[: self.num_target_caches] for s in joining]
        self.target = RaggedBatch.concat(
            [self.target, RaggedBatch.from_caches(targets)]
        )
        self.active += joining
        drafters = [s for s in joining if s.uses_draft]
        if drafters:
            caches = [s.single[self.num_target_caches :] for s in drafters]
            parts = [RaggedBatch.from_caches(caches)]
            if self.draft is not None:
                parts.insert(0, self.draft)
            self.draft = RaggedBatch.concat(parts)
            self.drafting += drafters
            for s in drafters:
                s.draft_len = len(s.seq) - 1
        for s in joining:
            s.single = None
            s.started = now
        mx.eval([c.state for c in self.target.caches])

    def _prefill_chunk(self, size: Optional[int] = None) -> List[SeqOutput]:
        """One chunk (``size`` tokens at most, default ``prefill_step_size``)
        of the oldest waiting prompt on its own cache."""
        if not self.waiting:
            return []
        s = self.waiting[0]
        tic = time.perf_counter()
        total = len(s.seq) - 1
        size = self.prefill_step_size if size is None else size
        chunk = s.seq[s.prefilled : min(s.prefilled + size, total)]
        if chunk:
            tokens = mx.array(chunk, mx.uint32)[None]
            self.model(tokens, cache=s.single[: self.num_target_caches])
            if s.uses_draft:
                self.draft_model(tokens, cache=s.single[self.num_target_caches :])
            mx.eval([c.state for c in s.single])
            s.prefilled += len(chunk)
        s.stats.prompt_time += time.perf_counter() - tic
        rest = total + 1 - s.held
        done = rest if s.prefilled >= total else s.prefilled - s.held
        out = [SeqOutput(s.uid, progress=(done, rest))]
        if s.prefilled >= total:
            self.waiting.popleft()
            self.ready.append(s)
            mx.clear_cache()
        return out

    # ------------------------------------------------------------------ #
    # A round

    def _draft(self, seqs: List[Row], steps: int):
        """Draft with the draft model for the rows whose arm is ``draft``.

        Every row of the draft batch takes part (a batched forward computes
        them all): drafting rows feed their pending tokens and then their
        drafts; the others only catch up on pending tokens.

        Returns:
            ``(tokens (Bd, G), laws (Bd, G, V) or None)`` in draft-batch
            order, and the tokens its forwards read.
        """
        rows = self.drafting
        plans = {s.uid: s for s in seqs}
        active = [plans[s.uid].arm == "draft" for s in rows]
        pending = [s.seq[s.draft_len :] for s in rows]
        width = max(len(p) for p, a in zip(pending, active) if a)
        fed = [len(p) if a else min(len(p), width) for p, a in zip(pending, active)]
        first = np.zeros((len(rows), width), np.uint32)
        for j, (p, n) in enumerate(zip(pending, fed)):
            first[j, :n] = p[:n]
        params = [s.spec.params for s in rows]
        subset = self.draft_subset

        def draft_logits(inputs):
            # (Bd, L) -> (Bd, L, V), or (Bd, L, k) over the draft's subset.
            if subset is None:
                return self.draft_model(inputs, cache=self.draft.caches)
            hidden = self.draft_model.model(inputs, cache=self.draft.caches)
            return subset.subset_logits(hidden)

        self.draft.prepare()
        logits = draft_logits(mx.array(first))
        self.draft.commit(width, fed)
        last = mx.array([max(n - 1, 0) for n in fed])
        logits = mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
        tokens, laws = [], []
        for k in range(steps):
            if subset is not None:  # each row's law over the subset's columns
                column, law = sample_rows(normalize(logits), params)
                token = subset.to_target(column)
            else:
                logprobs = normalize(align_vocab(logits, self.vocab_size))
                token, law = sample_rows(logprobs, params)
            mx.async_eval(token)
            tokens.append(token)
            laws.append(law)
            if k + 1 < steps:
                self.draft.prepare()
                step = token[:, None].astype(mx.uint32)
                logits = draft_logits(step)[:, 0]
                self.draft.commit(1, [1 if a else 0 for a in active])
        for s, n in zip(rows, fed):
            s.draft_len += n
        read = len(rows) * (width + steps - 1)
        drafts = mx.stack(tokens, axis=1).astype(mx.uint32)
        if laws[0] is None:
            return drafts, None, read
        laws = mx.stack(laws, axis=1)  # (Bd, G, C)
        return drafts, laws if subset is None else subset.widen(laws), read

    def _round(self) -> List[SeqOutput]:
        seqs = self.active
        B = len(seqs)
        tic = time.perf_counter()
        steps = self.planner.plan(seqs, len(self.drafting))
        drafts_dev, draft_laws, read = None, None, 0
        if steps > 0:
            drafts_dev, draft_laws, read = self._draft(seqs, steps)
        width = 1 + max(s.size for s in seqs)
        K = width - 1
        host = np.zeros((B, width), np.uint32)
        for b, s in enumerate(seqs):
            host[b, 0] = s.seq[-1]
            if s.arm == "lookup":
                host[b, 1 : 1 + s.size] = s.proposal
        inputs = mx.array(host)
        model_rows = [b for b, s in enumerate(seqs) if s.arm == "draft"]
        if model_rows:
            where = {s.uid: j for j, s in enumerate(self.drafting)}
            index = mx.array([where.get(s.uid, 0) for s in seqs])
            drafted = drafts_dev[index][:, :K]
            if drafted.shape[1] < K:
                drafted = mx.pad(drafted, [(0, 0), (0, K - drafted.shape[1])])
            drafted = mx.concatenate([mx.zeros((B, 1), mx.uint32), drafted], axis=1)
            sizes_np = np.array([s.size for s in seqs])
            cols = np.arange(width)[None, :]
            use = np.zeros((B, width), bool)
            use[model_rows] = True
            use &= (cols >= 1) & (cols <= sizes_np[:, None])
            inputs = mx.where(mx.array(use), drafted, inputs)

        self.target.prepare()
        logits = self.model(inputs, cache=self.target.caches)
        logprobs = normalize(logits)
        drafts = inputs[:, 1:]
        sizes = mx.array([s.size for s in seqs])
        num_accepted, next_token = self._accept(
            seqs, logprobs, drafts, sizes, draft_laws, index if model_rows else None
        )
        emitted = emitted_tokens(drafts, num_accepted, next_token)
        emitted_lp = gather_logprobs(logprobs, emitted)
        packed = mx.concatenate(
            [
                num_accepted[:, None].astype(mx.int32),
                next_token[:, None].astype(mx.int32),
                drafts.astype(mx.int32),
            ],
            axis=1,
        )
        # The round's single host sync.
        mx.eval(packed, emitted_lp)
        values = packed.tolist()
        lps = emitted_lp.tolist()
        self.target.commit(width, [1 + v[0] for v in values])
        if drafts_dev is not None:
            self._commit_draft(seqs, values, steps)
        self.rounds += 1
        if self.rounds % 256 == 0:
            mx.clear_cache()
        outputs = self._emit(seqs, values, lps, logprobs, tic)
        self.planner.observe(B, steps, width, read, time.perf_counter() - tic)
        return outputs

    def _accept(self, seqs, logprobs, drafts, sizes, draft_laws, draft_index):
        """Per-row ``(num_accepted, next_token)``, each law group vectorised."""
        groups = law_groups([s.spec.params for s in seqs])
        B = len(seqs)
        parts = []
        for params, rows in groups.items():
            whole = len(rows) == B
            index = None if whole else mx.array(rows)
            lp = logprobs if whole else logprobs[index]
            d = drafts if whole else drafts[index]
            sz = sizes if whole else sizes[index]
            q = None  # greedy rows need no draft law
            if params is not None:
                q = self._draft_law(seqs, rows, d, draft_laws, draft_index)
            n, nxt = Law(params).accept_rows(d, lp, q, sz)
            parts.append((rows, n, nxt.astype(mx.int32)))
        if len(parts) == 1:
            return parts[0][1], parts[0][2]
        num_accepted = mx.zeros((B,), mx.int32)
        next_token = mx.zeros((B,), mx.int32)
        for rows, n, nxt in parts:
            index = mx.array(rows)
            num_accepted[index] = n
            next_token[index] = nxt
        return num_accepted, next_token

    def _draft_law(self, seqs, rows, drafts, draft_laws, draft_index):
        """``(R, K, V)``: each row's draft log-law (point masses for lookup)."""
        K = drafts.shape[1]
        law = one_hot_logprobs(drafts, self.vocab_size)
        model_rows = [i for i, b in enumerate(rows) if seqs[b].arm == "draft"]
        if not model_rows or K == 0:
            return law
        q = draft_laws[draft_index[mx.array(rows)]][:, :K]
        if q.shape[1] < K:
            q = mx.pad(
                q, [(0, 0), (0, K - q.shape[1]), (0, 0)], constant_values=-mx.inf
            )
        use = np.zeros(len(rows), bool)
        use[model_rows] = True
        return mx.where(mx.array(use)[:, None, None], q, law)

    def _commit_draft(self, seqs, values, steps):
        """Draft rows keep their pending tokens and accepted drafts only."""
        plan = {s.uid: (s, v) for s, v in zip(seqs, values)}
        lengths = []
        for s in self.drafting:
            t, v = plan[s.uid]
            if t.arm == "draft":
                s.draft_len = len(s.seq) + min(v[0], steps - 1)
            lengths.append(s.draft_len)
        self.draft.truncate(lengths)

    def _emit(self, seqs, values, lps, logprobs, tic) -> List[SeqOutput]:
        """Extend each sequence, update its controller and stats, find finishes."""
        now = time.perf_counter()
        outputs, done, kept = [], [], []
        B = len(seqs)
        for b, (s, v) in enumerate(zip(seqs, values)):
            n, nxt, drafts = v[0], v[1], v[2 : 2 + s.size]
            tokens = drafts[:n] + [nxt]
            s.record(n)
            if s.from_index:
                s.cross_drafted += s.size
                s.cross_accepted += n
            out = SeqOutput(s.uid)
            rows = [] if s.spec.top_logprobs > 0 else None
            for i, tok in enumerate(tokens):
                kind = token_kind(i, n, s.size, n == s.size)
                s.seq.append(tok)
                s.generated += 1
                out.tokens.append(tok)
                out.logprobs.append(lps[b][i])
                out.kinds.append(kind)
                if rows is not None:
                    rows.append(logprobs[b, i])
                if tok in s.spec.stop_tokens:
                    out.finish_reason = "stop"
                    break
                if s.generated >= s.config.max_tokens:
                    out.finish_reason = "length"
                    break
            out.rows = rows
            st = s.stats
            forwards = max(s.size, 1) if s.arm == "draft" else 0
            st.add_round(s.size, min(n, len(out.tokens)), forwards)
            st.generated_tokens = s.base_generated + s.generated
            st.generation_time = s.base_time + now - s.started
            s.batch_rows += B
            outputs.append(out)
            if out.finish_reason is not None:
                done.append(b)
                kept.append(None)
        if done:
            for b, (cache, tokens) in zip(done, self._leave(done, kept)):
                out = next(o for o in outputs if o.uid == seqs[b].uid)
                out.cache, out.cache_tokens = cache, tokens
                out.info = seq_info(seqs[b])
        return outputs

    def info(self, uid: int) -> Optional[dict]:
        """Serving facts of a running request (batch size, cross-request use)."""
        for s in list(self.active) + list(self.ready) + list(self.waiting):
            if s.uid == uid:
                return seq_info(s)
        return None


def common_prefix(a: List[int], b: List[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = 0
    for x, y in zip(a[:limit], b[:limit]):
        if x != y:
            break
        n += 1
    return n


def prefix_cache(cache: KVCache, length: int) -> KVCache:
    """A new ``KVCache`` holding the first ``length`` tokens of ``cache``."""
    out = KVCache()
    if length > 0:
        out.keys = cache.keys[..., :length, :]
        out.values = cache.values[..., :length, :]
        out.offset = length
    return out
