"""An incremental n-gram index over a growing token sequence (prompt lookup's store).

The proposer matches the last ``n`` tokens of the context (prompt plus
accepted output), for ``n`` from ``ngram_max`` down to ``ngram_min``, against
earlier occurrences and proposes the tokens that followed them. Several
distinct continuations can be proposed at once; :func:`build_token_tree`
merges them into one token tree (shared prefixes become shared nodes) that is
verified in a single forward.

The index is a hash map per ``n`` from an n-gram to the start positions of its
most recent occurrences. :meth:`NGramIndex.extend` inserts each accepted token
in ``O(ngram_max**2)`` and :meth:`NGramIndex.propose` costs
``O((ngram_max - ngram_min + 1) * max_occurrences * max_len)``: neither ever
scans the context, so a round costs the same at 100 or 100,000 tokens.
``NGramIndex.ops`` counts the work done (dict operations and tokens copied) so
tests can check that without timing.

Defaults (``ngram_min=1``, ``ngram_max=3``, ``max_len=10``) follow the common
practice in prompt-lookup decoding: Hugging Face matches n-grams of at most 2
tokens and proposes 10, the original prompt-lookup-decoding recipe matches at
most 3 tokens, llama.cpp's lookup example tries 1 to 4. Longer n-grams are
tried first, so a unigram match is only used when nothing longer matches; the
adaptive controller and the verifier decide whether such a weak guess is worth
drafting at all.
"""

from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

DEFAULT_NGRAM_MIN = 1
DEFAULT_NGRAM_MAX = 3
DEFAULT_MAX_LEN = 10
DEFAULT_MAX_CANDIDATES = 1
DEFAULT_MAX_OCCURRENCES = 8
NGRAM_LIMIT = 16
MAX_LEN_LIMIT = 256
MAX_CANDIDATES_LIMIT = 64
MAX_OCCURRENCES_LIMIT = 1024


def check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


class NGramIndex:
    """Incremental n-gram index over a growing token sequence.

    Args:
        tokens (Sequence[int], optional): Initial context, usually the prompt.
        ngram_min (int): Shortest n-gram to match, in ``[1, ngram_max]``.
          Default: ``1``.
        ngram_max (int): Longest n-gram to match, in ``[ngram_min, 16]``.
          Default: ``3``.
        max_occurrences (int): How many of the most recent earlier
          occurrences of each matched n-gram :meth:`propose` examines, in
          ``[1, 1024]``. Bounds both the cost of a proposal and the memory
          per distinct n-gram. Default: ``8``.

    Attributes:
        ops (int): Work counter: one per dict or set operation plus one per
          token copied. Monotone; reset it freely.
        last_match_len (int): The n of the longest match used by the last
          :meth:`propose` call, ``0`` when nothing matched.
    """

    def __init__(
        self,
        tokens: Sequence[int] = (),
        *,
        ngram_min: int = DEFAULT_NGRAM_MIN,
        ngram_max: int = DEFAULT_NGRAM_MAX,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ):
        self.ngram_max = check_int("ngram_max", ngram_max, 1, NGRAM_LIMIT)
        self.ngram_min = check_int("ngram_min", ngram_min, 1, ngram_max)
        self.max_occurrences = check_int(
            "max_occurrences", max_occurrences, 1, MAX_OCCURRENCES_LIMIT
        )
        self.ops = 0
        self.last_match_len = 0
        self._tokens: List[int] = []
        # _index[n][ngram] = start positions of its most recent occurrences,
        # oldest first; one extra slot for the context's own suffix.
        self._index: Dict[int, Dict[Tuple[int, ...], deque]] = {
            n: {} for n in range(self.ngram_min, self.ngram_max + 1)
        }
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> List[int]:
        """The indexed context (a copy)."""
        return list(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append accepted tokens to the context and index the new n-grams.

        Costs ``O(ngram_max**2)`` per token, whatever the context length.

        Args:
            tokens (Sequence[int]): Newly accepted token ids.
        """
        seq = self._tokens
        cap = self.max_occurrences + 1
        for tok in tokens:
            seq.append(int(tok))
            end = len(seq)
            for n, table in self._index.items():
                if end < n:
                    continue
                key = tuple(seq[end - n : end])
                positions = table.get(key)
                if positions is None:
                    positions = table[key] = deque(maxlen=cap)
                    self.ops += 1
                positions.append(end - n)
                self.ops += n + 2

    def propose(
        self,
        max_len: int = DEFAULT_MAX_LEN,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
    ) -> List[List[int]]:
        """Propose continuations of the context from earlier n-gram matches.

        For ``n`` from ``ngram_max`` down to ``ngram_min``, the most recent
        ``max_occurrences`` earlier occurrences of the last ``n`` tokens are
        visited newest first; each yields the (up to) ``max_len`` tokens that
        followed it. Continuations starting at an already visited position or
        equal to an earlier one are skipped. Candidates from longer matches
        therefore come first, and within one ``n`` the most recent first.

        Args:
            max_len (int): Longest continuation, in ``[1, 256]``.
              Default: ``10``.
            max_candidates (int): Most continuations to return, in
              ``[1, 64]``. Default: ``1``.

        Returns:
            list[list[int]]: Up to ``max_candidates`` distinct, non-empty
            continuations, best first; empty when nothing matches.
        """
        check_int("max_len", max_len, 1, MAX_LEN_LIMIT)
        check_int("max_candidates", max_candidates, 1, MAX_CANDIDATES_LIMIT)
        seq = self._tokens
        length = len(seq)
        out: List[List[int]] = []
        seen_starts = set()
        seen = set()
        self.last_match_len = 0
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if length <= n:
                continue
            key = tuple(seq[length - n :])
            positions = self._index[n].get(key)
            self.ops += n + 1
            # The newest entry is the suffix itself: it has no continuation.
            for i in range(len(positions) - 2, -1, -1):
                start = positions[i] + n
                self.ops += 1
                if start in seen_starts:
                    continue
                seen_starts.add(start)
                cont = tuple(seq[start : start + max_len])
                self.ops += len(cont) + 1
                if cont in seen:
                    continue
                seen.add(cont)
                out.append(list(cont))
                self.ops += len(cont)
                if not self.last_match_len:
                    self.last_match_len = n
                if len(out) == max_candidates:
                    return out
        return out


def build_token_tree(
    candidates: Sequence[Sequence[int]], *, max_nodes: Optional[int] = None
) -> Tuple[List[int], List[int]]:
    """Merge candidate continuations into one token tree.

    The root (the last accepted token) is implicit. Candidates are inserted in
    order, so candidate ``0`` occupies nodes ``0..len-1`` and a single
    candidate gives a plain chain. Shared prefixes become shared nodes.

    Args:
        candidates (Sequence[Sequence[int]]): Continuations, best first.
        max_nodes (int, optional): Node budget; insertion stops once the tree
          has this many nodes (later candidates are truncated or dropped).

    Returns:
        tuple[list[int], list[int]]: ``tokens`` ``(N,)`` and ``parents``
        ``(N,)``: the index of each node's parent, ``-1`` for children of the
        root. Topological: ``parents[i] < i``.
    """
    if max_nodes is not None:
        check_int("max_nodes", max_nodes, 0, 1 << 30)
    tokens: List[int] = []
    parents: List[int] = []
    children: Dict[Tuple[int, int], int] = {}
    for cand in candidates:
        parent = -1
        for tok in cand:
            key = (parent, int(tok))
            node = children.get(key)
            if node is None:
                if max_nodes is not None and len(tokens) >= max_nodes:
                    break
                node = children[key] = len(tokens)
                tokens.append(int(tok))
                parents.append(parent)
            parent = node
    return tokens, parents


# --------------------------------------------------------------------------- #
# The drafter plugged into the engine (``--speculative lookup``).


def extend_periodic(continuation: Sequence[int], max_len: int) -> List[int]:
    """Extend a continuation cut short by the end of the context, as an overlapping copy.

    :meth:`NGramIndex.propose` cuts a continuation only at ``max_len`` or at
    the end of the context. In the latter case the copy source overlaps the
    copy itself (as in LZ77): the matched text repeats with period
    ``len(continuation)``, so the copy continues by repeating it. This keeps
    proposals full length inside loops and immediate repetitions.
    """
    out = list(continuation)
    if out and len(out) < max_len:
        out = (out * (max_len // len(out) + 1))[:max_len]
    return out
