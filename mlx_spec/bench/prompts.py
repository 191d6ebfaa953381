"""The fixed benchmark prompt suites, and prompts from a file.

**Chat suite** (models with a chat template, such as the default
SmolLM2-135M-Instruct): short handwritten requests, sent as one user message
through the model's chat template. Four sets, each a different kind of work:

* ``chat``: general questions and instructions, answered in free prose.
* ``code``: write a Python function from a description.
* ``editing``: a given text or piece of code, to be written out again with
  one change. Most of the answer is copied from the prompt, which is where
  prompt lookup shines.
* ``summarize``: a given passage, to be summarised or to have facts extracted
  from it. The answer reuses the passage's words without copying it whole: a
  middle ground between ``chat`` and ``editing``, and the shape of
  retrieval-augmented answering, a common use of small local models.

None of these prompts may appear among the drafter training prompts
(``mlx_spec.train.prompts``; ``tests/test_benchmarks.py`` checks it), so the
distilled draft is measured on requests it never saw.

**Base suite** (models without a chat template): raw text to continue, four
sets of excerpts of Python standard-library modules:

* ``code_completion``: a function cut off partway through its body.
* ``docstring_to_code``: a signature and docstring; the model writes the body.
* ``editing``: a function, then a comment asking for it again with one
  change and the first changed line; the model repeats the rest.
* ``free_text``: English prose (docstrings and module notes) to continue.

The first prompt of each set is the ``--quick`` subset. ``--prompts FILE``
replaces both suites with JSON lines (:func:`load_prompt_file`).
"""

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..loading import read_json_lines_file

CHAT_SETS = ("chat", "code", "editing", "summarize")
BASE_SETS = ("code_completion", "docstring_to_code", "editing", "free_text")
# Every set name of both suites, chat suite first.
PROMPT_SETS = tuple(dict.fromkeys(CHAT_SETS + BASE_SETS))


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: raw ``text``, or chat ``messages``.

    Attributes:
        name: Short unique identifier.
        prompt_set: The set it belongs to (a workload kind).
        text: Raw text, tokenized as it is (no chat template).
        messages: ``((role, content), ...)``, applied through the chat template
            with the generation prompt added.
        module: Base suite only: the stdlib module the text comes from.
    """

    name: str
    prompt_set: str
    text: Optional[str] = None
    messages: Optional[Tuple[Tuple[str, str], ...]] = None
    module: Optional[str] = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def user_text(self) -> str:
        """The prompt's own words: the text, or the messages' contents joined."""
        if self.messages is None:
            return self.text or ""
        return "\n".join(content for _, content in self.messages)


def _base(name: str, prompt_set: str, module: str, text: str) -> Prompt:
    return Prompt(name, prompt_set, text=text, module=module)


def _chat(name: str, prompt_set: str, request: str) -> Prompt:
    return Prompt(name, prompt_set, messages=(("user", request),))


# --------------------------------------------------------------------------- #
# Chat suite
# --------------------------------------------------------------------------- #

_CHAT = [
    _chat(
        "sleep_tips",
        "chat",
        "What are three practical tips for sleeping better? Keep each one short.",
    ),
    _chat(
        "weather_climate",
        "chat",
        "In two or three sentences, what is the difference between weather and "
        "climate?",
    ),
    _chat(
        "stale_bread",
        "chat",
        "Why does bread go stale, and how can I keep it fresh for longer?",
    ),
    _chat(
        "interview_prep",
        "chat",
        "I have an interview tomorrow for a job as a library assistant. What "
        "questions should I be ready to answer?",
    ),
]

_CODE = [
    _chat(
        "is_palindrome",
        "code",
        "Write a Python function is_palindrome(s) that returns True when the "
        "string reads the same forwards and backwards, ignoring case and spaces.",
    ),
    _chat(
        "dedupe_in_order",
        "code",
        "Write a Python function that takes a list and returns a new list with "
        "the duplicates removed, keeping the first occurrence of each item in "
        "its original order.",
    ),
    _chat(
        "word_count",
        "code",
        "Write a Python function word_count(text) that returns a dictionary "
        "mapping each lowercase word to the number of times it appears.",
    ),
    _chat(
        "celsius_fahrenheit",
        "code",
        "Write two Python functions: one converts a temperature from Celsius to "
        "Fahrenheit, the other converts it back.",
    ),
]

_EDITING = [
    _chat(
        "meeting_thursday",
        "editing",
        "Rewrite this note so that the meeting is on Thursday instead of "
        "Tuesday. Change nothing else.\n\n"
        "Hi Sam,\n"
        "Just a reminder that our project meeting is on Tuesday at 10 am in "
        "room 4B. Please bring the latest budget figures and the draft "
        "timeline. If you cannot make it, let me know by Monday.\n"
        "Thanks,\n"
        "Alex",
    ),
    _chat(
        "rename_total",
        "editing",
        "Rename the variable total to running_sum in this function and write "
        "out the whole function:\n\n"
        "```python\n"
        "def average(values):\n"
        "    total = 0\n"
        "    for value in values:\n"
        "        total += value\n"
        "    return total / len(values)\n"
        "```",
    ),
    _chat(
        "greeting_hello_tom",
        "editing",
        'Change the greeting of this email from "Dear Mr. Jones" to "Hello Tom" '
        "and keep the rest as it is.\n\n"
        "Dear Mr. Jones,\n"
        "Thank you for your order of twelve blue mugs. They will ship on Friday "
        "and should arrive within five working days. Please contact us if "
        "anything is missing.\n"
        "Best regards,\n"
        "Anna",
    ),
    _chat(
        "garden_spelling",
        "editing",
        "Fix the spelling mistakes in this paragraph and write it out again:\n\n"
        "Our garden was beautifull this summer. The tomatos grew tall, the "
        "beans climbed the fence, and the sunflowers turned to follow the sun "
        "every day.",
    ),
    _chat(
        "shopping_list_oats",
        "editing",
        "Here is a shopping list. Write it out again with rice replaced by "
        "oats.\n\n"
        "- bread\n"
        "- eggs\n"
        "- rice\n"
        "- tomatoes\n"
        "- olive oil",
    ),
]

_SUMMARIZE = [
    _chat(
        "honeybees",
        "summarize",
        "Summarize this passage in two sentences.\n\n"
        "Honeybees live in colonies of tens of thousands. A single queen lays "
        "the eggs, while female workers gather nectar and pollen, build wax "
        "comb, and care for the young. Male drones exist mainly to mate with "
        "queens from other colonies. In winter the workers cluster around the "
        "queen and shiver their wing muscles to keep the hive warm, living on "
        "the honey they stored during the summer.",
    ),
    _chat(
        "club_dates",
        "summarize",
        "List every person and date mentioned in this text, one per line.\n\n"
        "The hiking club was founded by Maria Lopez on 3 March 1998. Its first "
        "trip, led by Tom Becker, went to the lakes on 12 April of the same "
        "year. In 2010 Priya Shah took over as chair, and the club celebrated "
        "its twentieth anniversary on 3 March 2018.",
    ),
    _chat(
        "library_hours",
        "summarize",
        "What are the opening hours on Saturday, according to this notice?\n\n"
        "From 1 June the town library opens from 9 am to 6 pm on weekdays and "
        "from 10 am to 4 pm on Saturdays. It stays closed on Sundays and public "
        "holidays. The reading room closes thirty minutes before the library.",
    ),
]

CHAT_PROMPTS: List[Prompt] = _CHAT + _CODE + _EDITING + _SUMMARIZE


# --------------------------------------------------------------------------- #
# Base suite
# --------------------------------------------------------------------------- #

_CODE_COMPLETION = [
    _base(
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
    _base(
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
    _base(
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
    _base(
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
    _base(
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
    _base(
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

_BASE_EDITING = [
    _base(
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
    _base(
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
    _base(
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
    _base(
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
    _base(
        "textwrap_dedent_doc",
        "free_text",
        "textwrap",
        '''"""Remove any common leading whitespace from every line in `text`.

This can be used to make triple-quoted strings line up with the left
edge of the display, while still presenting them in the source code
in indented form.

''',
    ),
    _base(
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

BASE_PROMPTS: List[Prompt] = (
    _CODE_COMPLETION + _DOCSTRING_TO_CODE + _BASE_EDITING + _FREE_TEXT
)
PROMPTS: List[Prompt] = CHAT_PROMPTS + BASE_PROMPTS


def suite_sets(chat: bool) -> Tuple[str, ...]:
    """The prompt sets of the chat suite, or of the base suite."""
    return CHAT_SETS if chat else BASE_SETS


def prompt_suite(
    *, quick: bool = False, sets: Optional[Sequence[str]] = None, chat: bool = False
) -> List[Prompt]:
    """The prompts to run.

    Args:
        quick: Keep only the first prompt of each set. Default: ``False``.
        sets: Prompt sets to keep. Default: every set of the suite.
        chat: The chat suite (for a model with a chat template) instead of the
            base suite. Default: ``False``.

    Returns:
        Prompts in suite order.
    """
    names = suite_sets(chat)
    sets = list(sets) if sets else list(names)
    unknown = [s for s in sets if s not in names]
    if unknown:
        kind = "chat" if chat else "base (no chat template)"
        raise ValueError(
            f"unknown prompt set(s) {unknown} for the {kind} suite; choose from "
            f"{', '.join(names)}."
        )
    pool = CHAT_PROMPTS if chat else BASE_PROMPTS
    chosen: List[Prompt] = []
    for name in sets:
        members = [p for p in pool if p.prompt_set == name]
        chosen += members[:1] if quick else members
    return chosen


def load_prompt_file(path: str) -> List[Prompt]:
    """Prompts from a JSON-lines file, one object per line.

    Each line holds ``prompt_set`` (any name) and either ``prompt`` (a user
    request, sent through the chat template when the model has one, else as
    raw text) or ``messages`` (``[{"role": ..., "content": ...}, ...]``,
    chat template required); ``name`` is optional. Blank lines are skipped.

    Raises:
        ValueError: One line naming the file, the line and what is wrong.
    """
    lines = read_json_lines_file(path, "--prompts")
    prompts: List[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--prompts {path} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg}).") from None
        prompts.append(_prompt_from_json(item, where, len(prompts)))
    if not prompts:
        raise ValueError(f"--prompts {path}: the file holds no prompt.")
    names = [p.name for p in prompts]
    if len(set(names)) != len(names):
        raise ValueError(f"--prompts {path}: prompt names must be unique.")
    return prompts


def _prompt_from_json(item, where: str, index: int) -> Prompt:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object.")
    prompt_set = item.get("prompt_set")
    if not isinstance(prompt_set, str) or not prompt_set:
        raise ValueError(f"{where}: 'prompt_set' must be a non-empty string.")
    name = str(item.get("name") or f"{prompt_set}_{index}")
    has_prompt, has_messages = "prompt" in item, "messages" in item
    if has_prompt == has_messages:
        raise ValueError(f"{where}: give exactly one of 'prompt' and 'messages'.")
    if has_prompt:
        if not isinstance(item["prompt"], str) or not item["prompt"]:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string.")
        return Prompt(name, prompt_set, text=item["prompt"], messages=None)
    messages = item["messages"]
    ok = isinstance(messages, list) and messages
    ok = ok and all(
        isinstance(m, dict)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in messages
    )
    if not ok:
        raise ValueError(
            f"{where}: 'messages' must be a non-empty list of "
            '{"role": ..., "content": ...} objects.'
        )
    pairs = tuple((m["role"], m["content"]) for m in messages)
    return Prompt(name, prompt_set, messages=pairs)


def has_chat_template(tokenizer) -> bool:
    """Whether ``tokenizer`` (an mlx-lm ``TokenizerWrapper``) has a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode(prompt: Prompt, tokenizer, *, chat: bool) -> List[int]:
    """Token ids of ``prompt``.

    Chat ``messages`` always go through the chat template, with the generation
    prompt added; raw ``text`` does too, as one user message, when ``chat``
    (the chat suite, or a ``--prompts`` file on a model with a template).

    Raises:
        ValueError: A chat prompt for a model without a chat template.
    """
    messages = prompt.messages
    if messages is None and chat:
        messages = (("user", prompt.text),)
    if messages is None:
        return list(tokenizer.encode(prompt.text))
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"prompt '{prompt.name}' is a chat conversation but the model has no "
            "chat template; give raw 'prompt' text instead."
        )
    conversation = [{"role": r, "content": c} for r, c in messages]
    return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True))


def by_set(prompts: Sequence[Prompt]) -> Dict[str, List[Prompt]]:
    """Group prompts by set, keeping suite order."""
    out: Dict[str, List[Prompt]] = {}
    for p in prompts:
        out.setdefault(p.prompt_set, []).append(p)
    return out
