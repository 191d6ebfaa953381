"""Validated configuration for speculative generation.

Every knob lives in one small dataclass. A bad value raises ``ValueError``
whose message names the field, the value and the allowed range, so the CLI,
the server and the UI can show it as a one-line error.
"""

import functools
import json
from dataclasses import asdict, dataclass
from typing import FrozenSet, List, Optional, Sequence, Tuple

from .drafters.registry import METHODS
from .limits import greedy_limit

MAX_DRAFT_TOKENS = 64
MAX_TREE_BUDGET = 256
MAX_TREE_TOP_K = 16  # also bounds a static tree's child ranks
MAX_SEED = 2**64 - 1  # mx.random.seed's range
MAX_INDEX = 2**31 - 1  # mlx slices with 32-bit indices (beyond: bad_cast)
# What mx.quantize is asked about (group size 0 crashes it: never probed).
KV_BITS_PROBED = tuple(range(1, 9))
KV_GROUP_SIZES_PROBED = (16, 32, 64, 128, 256)

DEFAULT_NUM_DRAFT_TOKENS = 4
DEFAULT_TREE_BUDGET = 16
DEFAULT_TREE_TOP_K = 4
DEFAULT_TREE_DEPTH = 5
DEFAULT_NGRAM_MIN = 1
DEFAULT_NGRAM_MAX = 3
DEFAULT_ADAPTIVE = True


def resolve_method(speculative: Optional[str]) -> str:
    """The default is ``auto``: it picks among the methods this call can use."""
    return "auto" if speculative is None else speculative


# Methods whose prompt cache holds the draft model's layers after the target's.
DRAFT_CACHE_METHODS = ("draft", "tree", "auto")
# Methods of heads (trained, or a checkpoint's MTP layer): given the head as draft
# model (its cache part is empty).
HEAD_METHODS = ("eagle", "eagle-chain", "medusa", "mtp", "dflash")


def plan_method(speculative: Optional[str], draft_model) -> Tuple[str, bool]:
    """The method a call will run and whether its cache holds draft layers.

    Args:
        speculative: The requested method (``None`` picks one).
        draft_model: The draft model on hand, or ``None``.

    Returns:
        ``(method, uses_draft)``: ``method`` as :func:`mlx_spec.stream_generate`
        resolves it; with ``uses_draft`` the caller passes the draft model and
        builds ``make_prompt_cache(model) + make_prompt_cache(draft_model)``,
        otherwise no draft model and the target's caches only.
    """
    method = resolve_method(speculative)
    uses = DRAFT_CACHE_METHODS + HEAD_METHODS
    return method, draft_model is not None and method in uses


@functools.lru_cache(maxsize=None)
def quantize_support() -> FrozenSet[Tuple[int, int]]:
    """The ``(bits, group_size)`` pairs ``mx.quantize`` accepts, probed once."""
    import mlx.core as mx

    probe = mx.zeros((1, max(KV_GROUP_SIZES_PROBED)))
    pairs = set()
    for bits in KV_BITS_PROBED:
        for group_size in KV_GROUP_SIZES_PROBED:
            try:
                mx.eval(mx.quantize(probe, group_size=group_size, bits=bits))
            except (ValueError, RuntimeError):
                continue
            pairs.add((bits, group_size))
    return frozenset(pairs)


def check_generation_options(
    *,
    seed: Optional[int] = None,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = 0,
    prefill_step_size: int = 512,
    max_kv_size: Optional[int] = None,
) -> None:
    """Check the run options outside :class:`SpecConfig` (the same names).

    Every front end calls it (``stream_generate`` too, so each request is
    checked): a seed beyond ``mx.random.seed``'s range, or KV quantisation
    that ``mx.quantize`` does not support (group size 0 killed the process
    with SIGFPE), gets one line instead of a traceback or a signal.

    Raises:
        ValueError: Naming the option, its value and the allowed range.
    """
    _check(
        seed is None or _is_int(seed) and 0 <= seed <= MAX_SEED,
        "seed",
        seed,
        "an integer from 0 to 2**64 - 1",
    )
    check_size("prefill_step_size", prefill_step_size)
    if max_kv_size is not None:
        check_size("max_kv_size", max_kv_size)
    if kv_bits is None:
        return
    pairs = quantize_support()
    bits = sorted({b for b, _ in pairs})
    _check(
        _is_int(kv_bits) and kv_bits in bits,
        "kv_bits",
        kv_bits,
        f"one of {', '.join(map(str, bits))} (what mx.quantize supports)",
    )
    groups = sorted(g for b, g in pairs if b == kv_bits)
    _check(
        _is_int(kv_group_size) and kv_group_size in groups,
        "kv_group_size",
        kv_group_size,
        f"one of {', '.join(map(str, groups))} (what mx.quantize supports)",
    )
    _check(
        _is_int(quantized_kv_start) and quantized_kv_start >= 0,
        "quantized_kv_start",
        quantized_kv_start,
        "an integer >= 0",
    )


class OptionError(ValueError):
    """A value out of its range; the message names the option, the value and the range."""

    def __init__(self, name: str, value, allowed: str):
        super().__init__(f"{name}={value!r} is out of range: {allowed}.")
        self.name, self.value, self.allowed = name, value, allowed

    def as_flag(self) -> "OptionError":
        """The same error, naming the option as its command-line flag."""
        return self.renamed(flag_name(self.name))

    def renamed(self, name: str) -> "OptionError":
        """The same error, naming the option as a front end calls it."""
        return OptionError(name, self.value, self.allowed)


def flag_name(name: str) -> str:
    """``num_draft_tokens`` -> ``--num-draft-tokens``."""
    return "--" + name.replace("_", "-")


def _check(ok: bool, name: str, value, allowed: str):
    if not ok:
        raise OptionError(name, value, allowed)


def check_size(name: str, value, lowest: int = 1) -> None:
    """A count or length that mlx indexes with: an integer from ``lowest`` to
    :data:`MAX_INDEX` (past it, ``std::bad_cast`` or an ``OverflowError``).

    Raises:
        OptionError: ``NAME=VALUE is out of range: an integer from L to 2**31 - 1.``
    """
    _check(
        _is_int(value) and lowest <= value <= MAX_INDEX,
        name,
        value,
        f"an integer from {lowest} to 2**31 - 1",
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_tree_choices(choices) -> Optional[List[Tuple[int, ...]]]:
    """Read a static tree from JSON text or a list of index paths.

    ``[[0], [1], [0, 0]]`` means: the draft's best and second-best first
    tokens, and the best child of the first one (Medusa's "choices").
    """
    if choices is None:
        return None
    if isinstance(choices, str):
        try:
            choices = json.loads(choices)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"tree_choices is not valid JSON ({e.msg}); "
                'pass a list of index paths such as "[[0], [1], [0, 0]]".'
            ) from None
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(
            "tree_choices must be a non-empty list of index paths, "
            "such as [[0], [1], [0, 0]]."
        )
    paths = []
    for path in choices:
        if (
            not isinstance(path, (list, tuple))
            or not path
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in path)
            or not all(0 <= i < MAX_TREE_TOP_K for i in path)
        ):
            raise ValueError(
                f"tree_choices entry {path!r} is not a non-empty list of child "
                f"ranks from 0 to {MAX_TREE_TOP_K - 1}."
            )
        if len(path) > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"tree_choices entry {list(path)[:4]}... is {len(path)} deep; "
                f"at most {MAX_DRAFT_TOKENS}."
            )
        paths.append(tuple(path))
        if len(paths) > MAX_TREE_BUDGET:
            raise ValueError(
                f"tree_choices lists more than {MAX_TREE_BUDGET} nodes; "
                "pass a smaller tree."
            )
    known = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in known:
            raise ValueError(
                f"tree_choices entry {list(path)} has no parent entry "
                f"{list(path[:-1])}; every prefix of a path must be listed."
            )
    if len(known) != len(paths):
        raise ValueError("tree_choices lists the same path twice.")
    return sorted(paths, key=lambda p: (len(p), p))


@dataclass
class SpecConfig:
    """Options of one speculative generation.

    Args:
        method: ``"none"`` (plain decoding), ``"draft"`` (chain from a draft
          model), ``"tree"``, ``"lookup"``, ``"self"`` or ``"auto"``.
        num_draft_tokens: Draft length γ per round (1 to 64).
        temp, top_p, top_k, min_p, min_tokens_to_keep: Sampling settings with
          the meaning of ``mlx_lm.sample_utils.make_sampler``.
        max_tokens: Maximum number of generated tokens (at least 1).
        seed: Seed for sampled generation, ``None`` for no seeding.
        tree_budget, tree_top_k, tree_depth, tree_choices: Tree shape knobs.
        ngram_min, ngram_max: Prompt-lookup n-gram lengths.
        adaptive: Choose the draft length or tree size per round.
        draft_p_min: Stop drafting when the draft's confidence drops below it.
        profile: Add a sync after drafting to split draft and verify time.
    """

    method: str = "draft"
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS
    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    min_tokens_to_keep: int = 1
    max_tokens: int = 256
    seed: Optional[int] = None
    tree_budget: int = DEFAULT_TREE_BUDGET
    tree_top_k: int = DEFAULT_TREE_TOP_K
    tree_depth: int = DEFAULT_TREE_DEPTH
    tree_choices: Optional[Sequence[Sequence[int]]] = None
    ngram_min: int = DEFAULT_NGRAM_MIN
    ngram_max: int = DEFAULT_NGRAM_MAX
    lookup_candidates: int = 1
    adaptive: bool = DEFAULT_ADAPTIVE
    draft_p_min: float = 0.0
    profile: bool = False

    def __post_init__(self):
        self.validate()

    @property
    def max_draft_tokens(self) -> int:
        """Longest chain a round drafts: γ, or up to 2γ (16 at most) if adaptive."""
        n = self.num_draft_tokens
        return max(n, min(2 * n, 16)) if self.adaptive else n

    def validate(self):
        _check(
            self.method in METHODS,
            "speculative",
            self.method,
            f"one of {', '.join(METHODS)}",
        )
        _check(
            _is_int(self.num_draft_tokens)
            and 1 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS,
            "num_draft_tokens",
            self.num_draft_tokens,
            f"an integer from 1 to {MAX_DRAFT_TOKENS}",
        )
        _check(
            _is_number(self.temp) and self.temp >= 0 and self.temp != float("inf"),
            "temp",
            self.temp,
            "a number >= 0 (0 is greedy)",
        )
        self.temp = greedy_limit(self.temp)
        _check(
            _is_number(self.top_p) and 0 <= self.top_p <= 1,
            "top_p",
            self.top_p,
            "a number with 0 <= top_p <= 1 (0 and 1 disable it, as in mlx_lm)",
        )
        _check(
            _is_int(self.top_k) and 0 <= self.top_k <= MAX_INDEX,
            "top_k",
            self.top_k,
            "an integer from 0 to 2**31 - 1 (0 disables it)",
        )
        _check(
            _is_number(self.min_p) and 0 <= self.min_p <= 1,
            "min_p",
            self.min_p,
            "a number with 0 <= min_p <= 1 (0 disables it)",
        )
        check_size("min_tokens_to_keep", self.min_tokens_to_keep, 1)
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an integer >= 1",
        )
        _check(
            _is_int(self.tree_budget) and 1 <= self.tree_budget <= MAX_TREE_BUDGET,
            "tree_budget",
            self.tree_budget,
            f"an integer from 1 to {MAX_TREE_BUDGET}",
        )
        _check(
            _is_int(self.tree_top_k) and 1 <= self.tree_top_k <= MAX_TREE_TOP_K,
            "tree_top_k",
            self.tree_top_k,
            f"an integer from 1 to {MAX_TREE_TOP_K}",
        )
        _check(
            _is_int(self.tree_depth) and 1 <= self.tree_depth <= MAX_DRAFT_TOKENS,
            "tree_depth",
            self.tree_depth,
            f"an integer from 1 to {MAX_DRAFT_TOKENS}",
        )
        self.tree_choices = parse_tree_choices(self.tree_choices)
        _check(
            _is_int(self.ngram_min) and 1 <= self.ngram_min <= 16,
            "ngram_min",
            self.ngram_min,
            "an integer from 1 to 16",
        )
        _check(
            _is_int(self.ngram_max) and 1 <= self.ngram_max <= 16,
            "ngram_max",
            self.ngram_max,
            "an integer from 1 to 16",
        )
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min={self.ngram_min} is larger than ngram_max={self.ngram_max}; "
                "make ngram_min <= ngram_max."
            )
        _check(
            _is_int(self.lookup_candidates) and 1 <= self.lookup_candidates <= 64,
            "lookup_candidates",
            self.lookup_candidates,
            "an integer from 1 to 64",
        )
        _check(
            _is_number(self.draft_p_min) and 0 <= self.draft_p_min < 1,
            "draft_p_min",
            self.draft_p_min,
            "a number with 0 <= draft_p_min < 1 (0 disables it)",
        )
        for name in ("adaptive", "profile"):
            value = getattr(self, name)
            _check(isinstance(value, bool), name, value, "True or False")
        _check(
            self.seed is None or _is_int(self.seed) and 0 <= self.seed <= MAX_SEED,
            "seed",
            self.seed,
            "an integer from 0 to 2**64 - 1, or None",
        )

    @property
    def sampling_params(self):
        """The :class:`~mlx_spec.sampling.SamplingParams` of these sampling fields."""
        from .sampling import SamplingParams

        return SamplingParams(
            self.temp, self.top_p, self.min_p, self.top_k, self.min_tokens_to_keep
        )

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def as_dict(self) -> dict:
        return asdict(self)
