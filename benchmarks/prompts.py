"""The fixed benchmark prompt suite.

Four prompt sets, each a few short excerpts of Python standard-library modules
that the default pair's trainer holds out (``HELDOUT_MODULES`` in
``models/data.py``: bisect, calendar, csv, difflib, fractions, graphlib,
heapq, json, pprint, shlex, statistics, string, textwrap, tomllib, uuid).
Every prompt below comes from one of those modules, so neither model has
seen the text in training. If the trainer's held-out list changes, keep every
``module`` here inside it (``tests/test_benchmarks.py`` checks this).

* ``code_completion``: a function cut off partway through its body.
* ``docstring_to_code``: a signature and docstring; the model writes the body.
* ``editing``: a function, then a comment asking for it again with one
  change and the first changed line; the model repeats the rest.
* ``free_text``: English prose (docstrings and module notes) to continue.

The first prompt of each set is the ``--quick`` subset.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

PROMPT_SETS = ("code_completion", "docstring_to_code", "editing", "free_text")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        name: Short unique identifier.
        prompt_set: One of :data:`PROMPT_SETS`.
        module: The held-out stdlib module the text comes from.
        text: The prompt text (no chat template: the default pair is a base model).
    """

    name: str
    prompt_set: str
    module: str
    text: str


_CODE_COMPLETION = [
    Prompt(
        "bisect_right",
        "code_completion",
        "bisect",
        '''def bisect_right(a, x, lo=0, hi=None, *, key=None):
    """Return the index where to insert item x in list a, assuming a is sorted.

    The return value i is such that all e in a[:i] have e <= x, and all e in
    a[i:] have e > x.
    """

    if lo < 0:
        raise ValueError('lo must be non-negative')
    if hi is None:
        hi = len(a)
    if key is None:
        while lo < hi:
''',
    ),
    Prompt(
        "heapq_nsmallest",
        "code_completion",
        "heapq",
        '''def nsmallest(n, iterable, key=None):
    """Find the n smallest elements in a dataset.

    Equivalent to:  sorted(iterable, key=key)[:n]
    """

    # Short-cut for n==1 is to use min()
    if n == 1:
        it = iter(iterable)
        sentinel = object()
''',
    ),
    Prompt(
        "calendar_monthrange",
        "code_completion",
        "calendar",
        '''def isleap(year):
    """Return True for leap years, False for non-leap years."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def monthrange(year, month):
    """Return weekday (0-6 ~ Mon-Sun) and number of days (28-31) for
       year, month."""
    if not 1 <= month <= 12:
''',
    ),
]

_DOCSTRING_TO_CODE = [
    Prompt(
        "statistics_median",
        "docstring_to_code",
        "statistics",
        '''def median(data):
    """Return the median (middle value) of numeric data.

    When the number of data points is odd, return the middle data point.
    When the number of data points is even, the median is interpolated by
    taking the average of the two middle values.
    """
''',
    ),
    Prompt(
        "shlex_quote",
        "docstring_to_code",
        "shlex",
        '''def quote(s):
    """Return a shell-escaped version of the string *s*.

    An empty string becomes two single quotes; a string with no unsafe
    characters is returned unchanged.
    """
''',
    ),
    Prompt(
        "textwrap_indent",
        "docstring_to_code",
        "textwrap",
        '''def indent(text, prefix, predicate=None):
    """Adds 'prefix' to the beginning of selected lines in 'text'.

    If 'predicate' is provided, 'prefix' will only be added to the lines
    where 'predicate(line)' is True. If 'predicate' is not provided,
    it will default to adding 'prefix' to all non-empty lines that do not
    consist solely of whitespace characters.
    """
''',
    ),
]

_EDITING = [
    Prompt(
        "heapq_heappushpop_rename",
        "editing",
        "heapq",
        '''def heappushpop(heap, item):
    """Fast version of a heappush followed by a heappop."""
    if heap and heap[0] < item:
        item, heap[0] = heap[0], item
        _siftup(heap, 0)
    return item

# The same function again, with the argument `heap` renamed to `queue`:

def heappushpop(queue, item):
''',
    ),
    Prompt(
        "statistics_median_low_rename",
        "editing",
        "statistics",
        '''def median_low(data):
    """Return the low median of numeric data."""
    data = sorted(data)
    n = len(data)
    if n == 0:
        raise StatisticsError("no median for empty data")
    if n % 2 == 1:
        return data[n // 2]
    else:
        return data[n // 2 - 1]

# The same function again, with `data` renamed to `values`:

def median_low(values):
''',
    ),
    Prompt(
        "calendar_leapdays_docstring",
        "editing",
        "calendar",
        '''def leapdays(y1, y2):
    """Return number of leap years in range [y1, y2).
       Assume y1 <= y2."""
    y1 -= 1
    y2 -= 1
    return (y2//4 - y1//4) - (y2//100 - y1//100) + (y2//400 - y1//400)

# The same function again, with a one-line docstring:

def leapdays(y1, y2):
    """Return the number of leap years in range [y1, y2)."""
''',
    ),
]

_FREE_TEXT = [
    Prompt(
        "difflib_module_notes",
        "free_text",
        "difflib",
        '''"""
Module difflib -- helpers for computing deltas between objects.

Function get_close_matches(word, possibilities, n=3, cutoff=0.6):
    Use SequenceMatcher to return list of the best "good enough" matches.

Function context_diff(a, b):
    For two lists of strings, return a delta in context diff format.

''',
    ),
    Prompt(
        "textwrap_dedent_doc",
        "free_text",
        "textwrap",
        '''"""Remove any common leading whitespace from every line in `text`.

This can be used to make triple-quoted strings line up with the left
edge of the display, while still presenting them in the source code
in indented form.

''',
    ),
    Prompt(
        "fractions_doc",
        "free_text",
        "fractions",
        '''"""This class implements rational numbers.

In the two-argument form of the constructor, Fraction(8, 6) will
produce a rational number equivalent to 4/3. Both arguments must
be Rational. The numerator defaults to 0 and the denominator
defaults to 1 so that Fraction(3) == 3 and Fraction() == 0.

''',
    ),
]

PROMPTS: List[Prompt] = _CODE_COMPLETION + _DOCSTRING_TO_CODE + _EDITING + _FREE_TEXT


def prompt_suite(
    *, quick: bool = False, sets: Optional[Sequence[str]] = None
) -> List[Prompt]:
    """The prompts to run.

    Args:
        quick: Keep only the first prompt of each set. Default: ``False``.
        sets: Prompt sets to keep. Default: all of :data:`PROMPT_SETS`.

    Returns:
        Prompts in suite order.
    """
    sets = list(sets) if sets else list(PROMPT_SETS)
    unknown = [s for s in sets if s not in PROMPT_SETS]
    if unknown:
        raise ValueError(
            f"unknown prompt set(s) {unknown}; choose from {', '.join(PROMPT_SETS)}."
        )
    chosen: List[Prompt] = []
    for name in sets:
        members = [p for p in PROMPTS if p.prompt_set == name]
        chosen += members[:1] if quick else members
    return chosen


def by_set(prompts: Sequence[Prompt]) -> Dict[str, List[Prompt]]:
    """Group prompts by set, keeping suite order."""
    out: Dict[str, List[Prompt]] = {}
    for p in prompts:
        out.setdefault(p.prompt_set, []).append(p)
    return out
