"""Drafting from earlier requests: a bounded index over the server's recent text.

Agent loops, tool calls and edits repeat text across requests: the same
system prompt, tool outputs quoted back, the same call emitted again.
SuffixDecoding (Arctic Inference, in vLLM) drafts from a suffix tree over
earlier prompts and outputs next to one over the current request. This is
the same idea with an n-gram index, as prompt lookup already uses for the
current context:

- every finished request adds its text (the prompt part that was not
  served from the prompt cache, so a shared system prompt is indexed once,
  plus the output) as one document;
- :meth:`CrossRequestIndex.propose` takes the tail of a sequence, finds the
  earlier occurrences of its last ``ngram`` tokens, extends each match
  backwards (up to ``max_match``) and proposes what followed the longest,
  newest one, stopping at the end of its document;
- memory is capped: past ``max_tokens`` tokens the oldest documents are
  evicted (in chunks, so the cost is amortised), together with their index
  entries.

The index is hash chains, as in zlib's LZ77 matcher: ``head[key]`` is the
newest position of an n-gram and ``prev[pos]`` the previous position of the
same n-gram, so a token costs one dict entry at most and two array slots,
and a proposal walks at most ``max_occurrences`` links. Proposals only
change which tokens are drafted; verification keeps the output exact.
"""

from array import array
from typing import List, Sequence, Tuple

DEFAULT_MAX_TOKENS = 1 << 17
DEFAULT_NGRAM = 3
DEFAULT_MAX_MATCH = 64
DEFAULT_MAX_OCCURRENCES = 16
# The cap holds at least this many tokens per n-gram token, and at most MAX_CAP.
MIN_CAP_PER_NGRAM = 16
MAX_CAP = 1 << 30
_SEPARATOR = -1
_KEY_BITS = 24  # token ids below 2**24 pack into one exact key
# Evict down to this fraction of the cap, so eviction runs rarely.
_EVICT_TO = 0.75


def _check_int(name: str, value, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise ValueError(
            f"{name} must be an integer in [{low}, {high}], got {value!r}."
        )
    return value


def cap_range(ngram: int = DEFAULT_NGRAM) -> Tuple[int, int]:
    """The ``max_tokens`` an index over n-grams of ``ngram`` tokens may have."""
    return MIN_CAP_PER_NGRAM * ngram, MAX_CAP


class CrossRequestIndex:
    """An n-gram index over recent documents, capped at ``max_tokens`` tokens.

    Args:
        max_tokens: Most tokens held; the oldest documents are evicted
          beyond it. Default: ``131072``.
        ngram: Tokens a match needs at least (the hashed n-gram length).
          Default: ``3``.
        max_match: Longest match measured (backwards). Default: ``64``.
        max_occurrences: Earlier occurrences examined per proposal.
          Default: ``16``.

    Attributes:
        documents: Documents added so far (evicted ones included).
        evicted_tokens: Tokens evicted so far.
    """

    def __init__(
        self,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        ngram: int = DEFAULT_NGRAM,
        max_match: int = DEFAULT_MAX_MATCH,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ):
        self.ngram = _check_int("ngram", ngram, 1, 16)
        self.max_tokens = _check_int("max_tokens", max_tokens, *cap_range(ngram))
        self.max_match = _check_int("max_match", max_match, ngram, 1 << 16)
        self.max_occurrences = _check_int(
            "max_occurrences", max_occurrences, 1, 1 << 12
        )
        self.documents = 0
        self.evicted_tokens = 0
        self._tokens = array("i")  # global position p is _tokens[p - _base]
        self._prev = array("q")  # previous position of the n-gram ending at p
        self._base = 0
        self._head = {}  # n-gram key -> newest position where it ends

    def __len__(self) -> int:
        """Tokens held (separators included)."""
        return len(self._tokens)

    @property
    def nbytes(self) -> int:
        """Approximate bytes held: token and link arrays plus the hash table.

        A dict entry costs about 170 bytes with its key and value objects
        (measured with tracemalloc on CPython 3.11).
        """
        arrays = self._tokens.itemsize * len(self._tokens)
        arrays += self._prev.itemsize * len(self._prev)
        return arrays + 170 * len(self._head)

    def _key(self, tokens: Sequence[int]) -> int:
        key = 0
        for t in tokens:
            key = (key << _KEY_BITS) | t
        return key

    def add(self, tokens: Sequence[int]) -> None:
        """Index one document (a request's new prompt tokens and its output)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return
        if any(t < 0 or t >= 1 << _KEY_BITS for t in tokens):
            raise ValueError(f"token ids must be in [0, 2**{_KEY_BITS}).")
        n, base = self.ngram, self._base
        seq, prev, head = self._tokens, self._prev, self._head
        for t in tokens + [_SEPARATOR]:
            seq.append(t)
            pos = base + len(seq) - 1
            link = -1
            if t != _SEPARATOR and len(seq) >= n:
                gram = seq[len(seq) - n :]
                if _SEPARATOR not in gram:
                    key = self._key(gram)
                    link = head.get(key, -1)
                    head[key] = pos
            prev.append(link)
        self.documents += 1
        if len(seq) > self.max_tokens:
            self._evict(len(seq) - int(self.max_tokens * _EVICT_TO))

    def _evict(self, count: int) -> None:
        """Drop the oldest ``count`` tokens (rounded up to a document end)."""
        seq = self._tokens
        end = count
        while end < len(seq) and seq[end - 1] != _SEPARATOR:
            end += 1
        n, base = self.ngram, self._base
        new_base = base + end
        # Forget n-grams whose newest occurrence is evicted.
        for i in range(n - 1, end):
            if seq[i] == _SEPARATOR:
                continue
            gram = seq[i - n + 1 : i + 1]
            if _SEPARATOR in gram:
                continue
            key = self._key(gram)
            if self._head.get(key, new_base) < new_base:
                del self._head[key]
        del seq[:end]
        del self._prev[:end]
        self._base = new_base
        self.evicted_tokens += end

    def propose(self, context: Sequence[int], max_len: int) -> Tuple[List[int], int]:
        """The continuation of ``context``'s tail in earlier documents.

        Args:
            context: The current sequence (only its last ``max_match``
              tokens are read).
            max_len: Longest continuation.

        Returns:
            ``(tokens, match_len)``: up to ``max_len`` tokens that followed
            the longest (then newest) earlier match of ``context``'s tail,
            and that match's length; ``([], 0)`` without a match of at
            least ``ngram`` tokens.
        """
        n = self.ngram
        if max_len < 1 or len(context) < n or not self._head:
            return [], 0
        tail = [int(t) for t in context[-self.max_match :]]
        pos = self._head.get(self._key(tail[-n:]), -1)
        seq, prev, base = self._tokens, self._prev, self._base
        best, best_len = -1, 0
        longest = min(len(tail), self.max_match)
        for _ in range(self.max_occurrences):
            if pos < base:
                break
            i = pos - base
            length = n
            limit = min(longest, i + 1)
            while length < limit and seq[i - length] == tail[-length - 1]:
                length += 1
            if length > best_len:
                best, best_len = i, length
                if length == longest:
                    break
            pos = prev[i]
        if best < 0:
            return [], 0
        out = []
        for t in seq[best + 1 : best + 1 + max_len]:
            if t == _SEPARATOR:
                break
            out.append(t)
        return out, (best_len if out else 0)
