"""The page's and the API's values turned into a checked :class:`SpecConfig`.

Each value is checked for its type here, so a bad one names its field in the
page's words; :func:`mlx_spec.validation.spec_config` checks the ranges.
"""

import math
from typing import Optional

from mlx_spec.config import OptionError, SpecConfig
from mlx_spec.drafters.fit import Words
from mlx_spec.validation import DRAFTER_LATER, spec_config

from .layout import PageRequest

# The page's names of config fields, in messages.
PAGE_NAMES = {
    "speculative": "method",
    "num_draft_tokens": "γ (draft tokens per round)",
    "tree_budget": "tree budget",
    "max_tokens": "max tokens",
}
# The page's names for the choices in a drafter check's message.
PAGE_WORDS = Words(
    subject="the {method} method",
    draft_model="draft model (choose one under 'Models and method')",
    pick="pick the {methods} method",
)

DEFAULT_METHOD = "auto"
MAX_UI_TOKENS = 8192
# The words an API caller may send for a checkbox (any case).
BOOL_WORDS = {
    "true": True,
    "yes": True,
    "1": True,
    "false": False,
    "no": False,
    "0": False,
}


def as_number(value, name: str) -> float:
    """A finite number from a UI value (a number or its text), else a ``ValueError``."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number.") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ValueError(f"{name}={value!r} is not a number.")
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{name}={value!r} is not a finite number.")
    return number


def as_int(value, name: str, optional: bool = False) -> Optional[int]:
    """An integer from a UI number (3.0 will do, not 2.5), else a ``ValueError``."""
    if value is None or value == "":
        if optional:
            return None
        raise ValueError(f"{name} is empty; enter a whole number.")
    number = as_number(value, name)
    if isinstance(number, float) and not number.is_integer():
        raise ValueError(f"{name}={value!r} is not a whole number.")
    return int(number)


def as_float(value, name: str) -> Optional[float]:
    """A float from a UI number (``None`` when empty), else a ``ValueError``."""
    if value is None or value == "":
        return None
    return float(as_number(value, name))


def as_bool(value, name: str) -> bool:
    """A checkbox value: a bool, or from the API 0/1 or a word of :data:`BOOL_WORDS`."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    word = value.strip().lower() if isinstance(value, str) else None
    if word in BOOL_WORDS:
        return BOOL_WORDS[word]
    raise ValueError(
        f"{name}={value!r} is not true or false (also accepted: yes/no, 1/0)."
    )


def check_max_tokens(value: int, name: str) -> None:
    """The page's own cap on max tokens (below the config's), named ``name``."""
    if not 1 <= value <= MAX_UI_TOKENS:
        raise OptionError(name, value, f"an integer from 1 to {MAX_UI_TOKENS} here")


def parse_options(
    method, num_draft_tokens, tree_budget, temp, top_p, max_tokens, seed, adaptive=False
) -> SpecConfig:
    """UI values to a checked :class:`SpecConfig`, before anything runs.

    Each value is checked for its type here, so a bad one names its field;
    :func:`~mlx_spec.validation.spec_config` checks the ranges, its messages
    naming the page's fields. Empty temp and top-p take the config's defaults.
    """
    max_tokens = as_int(max_tokens, "max tokens")
    check_max_tokens(max_tokens, "max tokens")
    sampling = dict(temp=as_float(temp, "temp"), top_p=as_float(top_p, "top_p"))
    fields = dict(
        num_draft_tokens=as_int(num_draft_tokens, PAGE_NAMES["num_draft_tokens"]),
        tree_budget=as_int(tree_budget, PAGE_NAMES["tree_budget"]),
        max_tokens=max_tokens,
        seed=as_int(seed, "seed", optional=True),
        adaptive=as_bool(adaptive, "adaptive"),
        **{k: v for k, v in sampling.items() if v is not None},
    )
    try:
        return spec_config(method, DRAFTER_LATER, **fields)
    except OptionError as e:
        raise e.renamed(PAGE_NAMES.get(e.name, e.name)) from None


def page_options(page: PageRequest) -> SpecConfig:
    """:func:`parse_options` of the page's settings."""
    return parse_options(
        page.method,
        page.gamma,
        page.tree_budget,
        page.temp,
        page.top_p,
        page.max_tokens,
        page.seed,
        page.adaptive,
    )
