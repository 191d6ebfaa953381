"""The built-in training prompts: chat, code, editing and extraction tasks.

Every prompt is generated, never handwritten one by one: chat requests come
from templates filled with topic lists, and the code, editing and extraction
tasks are built from the Python standard library installed on this machine
(function names, signatures, docstrings and short function bodies, read
with :mod:`ast`, nothing imported). The benchmark prompt sets are written
separately by hand; these stay distinct from them.

Each source item (a chat topic, a stdlib module) belongs to one split, chosen
by a hash of its name: the held-out prompts share no topic or module with
the training prompts, so acceptance measured on them is honest.

Typical use::

    from mlx_spec.train.prompts import builtin_prompts, mixed_prompts
    pool = builtin_prompts("train")          # every training prompt
    batch = mixed_prompts(2000, "train")     # a seeded mix of the four sets
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import os
import random
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

PROMPT_SETS = ("chat", "code", "editing", "summarize")
SPLITS = ("train", "heldout")
# One source item in HELDOUT_EVERY goes to the held-out split.
HELDOUT_EVERY = 16
# Default share of each prompt set in a mix (chat matters most: it is the goal).
DEFAULT_SHARES = {"chat": 0.4, "code": 0.25, "editing": 0.2, "summarize": 0.15}
# Sizes of the stdlib snippets used in prompts.
MAX_EDIT_LINES = 24
MIN_EDIT_LINES = 4
MAX_EDIT_CHARS = 1100
MIN_PASSAGE_CHARS = 280
MAX_PASSAGE_CHARS = 1400
# Stdlib folders that are tests, demos or vendored code.
_SKIPPED_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "pydoc_data",
    "venv",
}


@dataclass(frozen=True)
class Prompt:
    """One chat request.

    Attributes:
        prompt_set: ``"chat"``, ``"code"``, ``"editing"``, ``"summarize"`` (the
          benchmark suite's set names), or a prompt file's own label.
        messages: The conversation, ``({"role": ..., "content": ...}, ...)``.
        source: The topic or stdlib module it was built from (decides the split).
    """

    prompt_set: str
    messages: Tuple[Dict[str, str], ...]
    source: str = ""

    @property
    def text(self) -> str:
        """The last user message."""
        return self.messages[-1]["content"]

    def as_dict(self) -> dict:
        return {"prompt_set": self.prompt_set, "messages": list(self.messages)}


def split_of(source: str) -> str:
    """``"heldout"`` for one source in :data:`HELDOUT_EVERY`, else ``"train"``."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "heldout" if digest[0] % HELDOUT_EVERY == 0 else "train"


def _user(prompt_set: str, text: str, source: str) -> Prompt:
    return Prompt(prompt_set, ({"role": "user", "content": text},), source)


# --------------------------------------------------------------------------- #
# Chat: templates x topic lists
# --------------------------------------------------------------------------- #

TOPICS = {
    "science": [
        "photosynthesis",
        "black holes",
        "plate tectonics",
        "the water cycle",
        "DNA replication",
        "vaccines",
        "climate change",
        "the immune system",
        "gravity",
        "electricity",
        "magnetism",
        "the periodic table",
        "evolution by natural selection",
        "the speed of light",
        "volcanoes",
        "earthquakes",
        "the solar system",
        "the moon's phases",
        "ocean tides",
        "antibiotics",
        "the human heart",
        "sleep cycles",
        "nuclear fusion",
        "renewable energy",
        "the greenhouse effect",
        "rainbows",
        "sound waves",
        "bacteria and viruses",
        "the nervous system",
        "coral reefs",
        "quantum entanglement",
        "the big bang",
        "enzymes",
        "erosion",
        "weather fronts",
        "the carbon cycle",
        "stem cells",
        "radioactivity",
    ],
    "technology": [
        "the internet",
        "cloud computing",
        "machine learning",
        "blockchain",
        "password managers",
        "two-factor authentication",
        "solid state drives",
        "electric cars",
        "3D printing",
        "GPS",
        "Wi-Fi",
        "smartphone batteries",
        "open source software",
        "virtual reality",
        "compilers",
        "databases",
        "version control",
        "web browsers",
        "encryption",
        "search engines",
        "operating systems",
        "computer memory",
        "email spam filters",
        "recommendation systems",
        "self-driving cars",
        "QR codes",
        "data compression",
        "computer viruses",
        "domain names",
        "APIs",
    ],
    "daily life": [
        "saving money",
        "meal planning",
        "time management",
        "public speaking",
        "learning a new language",
        "keeping houseplants alive",
        "decluttering",
        "making friends in a new city",
        "staying motivated",
        "budgeting",
        "moving to a new apartment",
        "preparing for a job interview",
        "writing a resume",
        "negotiating a salary",
        "morning routines",
        "reducing screen time",
        "working from home",
        "organizing a closet",
        "hosting a dinner party",
        "taking better notes",
        "commuting by bike",
        "caring for a puppy",
        "planning a birthday party",
        "reading more books",
        "starting a vegetable garden",
        "cleaning a kitchen",
        "packing for a trip",
    ],
    "health": [
        "drinking enough water",
        "stretching",
        "running for beginners",
        "healthy breakfasts",
        "reducing stress",
        "posture at a desk",
        "getting better sleep",
        "strength training",
        "eating more vegetables",
        "meditation",
        "walking every day",
        "sunscreen",
        "healthy snacks",
        "back pain prevention",
        "eye strain",
        "cutting down on sugar",
    ],
    "history": [
        "the Roman Empire",
        "the printing press",
        "the Industrial Revolution",
        "the Renaissance",
        "ancient Egypt",
        "the Silk Road",
        "the Cold War",
        "the invention of the telephone",
        "the first moon landing",
        "the French Revolution",
        "the Great Wall of China",
        "the Vikings",
        "the history of the bicycle",
        "the history of chess",
        "the invention of paper",
        "ancient Greek philosophy",
        "the Maya",
        "the history of coffee",
        "the steam engine",
        "the history of maps",
    ],
    "food": [
        "bread baking",
        "fermentation",
        "making pasta from scratch",
        "spices",
        "coffee brewing",
        "tea",
        "sourdough starters",
        "grilling vegetables",
        "knife skills",
        "soups",
        "rice",
        "lentils",
        "chocolate",
        "olive oil",
        "cheese making",
        "pickling",
        "salads",
        "pancakes",
        "curry",
        "tofu",
    ],
    "nature": [
        "honey bees",
        "migratory birds",
        "rainforests",
        "deserts",
        "octopuses",
        "whales",
        "mushrooms",
        "wolves",
        "tides pools",
        "glaciers",
        "owls",
        "ants",
        "penguins",
        "redwood trees",
        "butterflies",
        "river deltas",
    ],
    "arts": [
        "impressionist painting",
        "jazz",
        "writing poetry",
        "photography",
        "learning the guitar",
        "classical music",
        "street art",
        "pottery",
        "film editing",
        "theater",
        "calligraphy",
        "origami",
        "knitting",
        "comic books",
        "architecture",
        "graphic design",
        "dance",
    ],
    "economics": [
        "inflation",
        "interest rates",
        "supply and demand",
        "the stock market",
        "index funds",
        "compound interest",
        "taxes",
        "credit scores",
        "small businesses",
        "trade",
        "unemployment",
        "insurance",
        "startups",
    ],
    "learning": [
        "studying for exams",
        "learning to code",
        "memorization techniques",
        "learning mathematics",
        "reading comprehension",
        "critical thinking",
        "writing essays",
        "learning to draw",
        "teaching children to read",
        "online courses",
        "spaced repetition",
        "learning to type faster",
    ],
}

AUDIENCES = [
    "a ten-year-old",
    "a complete beginner",
    "a high school student",
    "a busy professional",
    "my grandmother",
    "a university student",
]
FORMATS = [
    "in three bullet points",
    "in one short paragraph",
    "in under 80 words",
    "as a numbered list",
    "in two sentences",
    "with a simple example",
]
FORMS = [
    "a short poem",
    "a haiku",
    "a limerick",
    "a short story of five sentences",
    "a motivational quote",
    "a tweet",
    "a riddle",
    "a dialogue between two friends",
    "a product description",
    "a diary entry",
    "a short speech",
    "a fun fact list",
]
PEOPLE = ["manager", "landlord", "teacher", "neighbor", "coworker", "friend", "doctor"]
SITUATIONS = [
    "a late payment",
    "a schedule change",
    "a broken heater",
    "a missed deadline",
    "a noisy party",
    "a thank-you for their help",
    "a request for time off",
    "a meeting next week",
    "a lost package",
    "a shared project",
]
PLACES = [
    "Lisbon",
    "Kyoto",
    "a small mountain village",
    "Mexico City",
    "the Scottish Highlands",
    "Vancouver",
    "Cape Town",
    "a national park",
    "Istanbul",
    "a seaside town",
    "Prague",
    "Buenos Aires",
    "Reykjavik",
    "Marrakech",
    "Seoul",
    "New Orleans",
]
INGREDIENTS = [
    "chickpeas",
    "spinach",
    "eggs",
    "potatoes",
    "rice",
    "mushrooms",
    "tomatoes",
    "zucchini",
    "lentils",
    "oats",
    "apples",
    "salmon",
    "tofu",
    "carrots",
    "beans",
]

# Templates over one topic; "{audience}", "{fmt}" and "{form}" are filled too.
TOPIC_TEMPLATES = [
    "Explain {topic} to {audience}.",
    "What is the most important thing to know about {topic}?",
    "Give me three interesting facts about {topic}.",
    "Explain {topic} {fmt}.",
    "What are common misconceptions about {topic}?",
    "Write {form} about {topic}.",
    "Why does {topic} matter? Answer {fmt}.",
    "I'm curious about {topic}. Where should I start?",
    "Summarize what you know about {topic} {fmt}.",
    "What questions would a beginner ask about {topic}? List five.",
    "Describe {topic} using an analogy.",
    "What are the pros and cons of {topic}?",
    "Tell me a short story that teaches something about {topic}.",
    "Create a short quiz with three questions about {topic}, with answers.",
    "How would you explain {topic} in a job interview?",
    "Give a step-by-step introduction to {topic}.",
    "What is a good book or resource type for learning about {topic}, and why?",
    "Write a friendly paragraph introducing {topic} to {audience}.",
    "What are the key terms someone should learn about {topic}? Define each briefly.",
    "Can you give me tips related to {topic}?",
]
# Templates over two topics of the same category.
PAIR_TEMPLATES = [
    "What is the difference between {a} and {b}?",
    "Compare {a} and {b} {fmt}.",
    "How are {a} and {b} related?",
    "Which is easier to learn about first, {a} or {b}? Explain.",
]
# Everyday requests with their own slots.
REQUEST_TEMPLATES = [
    ("Plan a {n}-day trip to {place}.", "place"),
    ("What should I pack for a week in {place}?", "place"),
    ("Suggest a simple recipe using {x} and {y}.", "ingredient"),
    ("What can I cook for dinner with {x}, {y} and some pasta?", "ingredient"),
    ("Write a polite email to my {person} about {situation}.", "person"),
    ("Help me write a short text message to a {person} about {situation}.", "person"),
    ("Give me a {n}-week plan to get better at {topic}.", "topic"),
    ("I have {n} minutes a day. How can I use them to learn about {topic}?", "topic"),
]


def _chat_prompts() -> List[Prompt]:
    """Every chat prompt, in a fixed order."""
    rng = random.Random(1234)
    out = []
    for category, topics in sorted(TOPICS.items()):
        for topic in topics:
            source = f"chat:{topic}"
            for i, template in enumerate(TOPIC_TEMPLATES):
                text = template.format(
                    topic=topic,
                    audience=AUDIENCES[(i + len(topic)) % len(AUDIENCES)],
                    fmt=FORMATS[(i * 7 + len(topic)) % len(FORMATS)],
                    form=FORMS[(i * 5 + len(topic)) % len(FORMS)],
                )
                out.append(_user("chat", _capitalize(text), source))
        for a, b in itertools.combinations(topics, 2):
            if rng.random() > 0.12:  # a sample of the pairs keeps the pool balanced
                continue
            template = rng.choice(PAIR_TEMPLATES)
            text = template.format(a=a, b=b, fmt=rng.choice(FORMATS))
            # A pair belongs to the split of its first topic (and is dropped
            # if its second topic is in the other split).
            if split_of(f"chat:{a}") == split_of(f"chat:{b}"):
                out.append(_user("chat", _capitalize(text), f"chat:{a}"))
    all_topics = [t for ts in TOPICS.values() for t in ts]
    for template, kind in REQUEST_TEMPLATES:
        for j in range(60):
            n = 2 + j % 6
            if kind == "place":
                item = PLACES[j % len(PLACES)]
                text = template.format(n=n, place=item)
            elif kind == "ingredient":
                x, y = rng.sample(INGREDIENTS, 2)
                item, text = x, template.format(x=x, y=y)
            elif kind == "person":
                item = PEOPLE[j % len(PEOPLE)]
                text = template.format(person=item, situation=rng.choice(SITUATIONS))
            else:
                item = rng.choice(all_topics)
                text = template.format(n=n, topic=item)
            out.append(_user("chat", text, f"chat:{item}"))
    return _dedupe(out)


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- #
# Code, edits and passages from the standard library (parsed, not imported)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Function:
    module: str
    name: str
    args: str  # "a, b=1, *args"
    summary: str  # first sentence of the docstring
    source: str  # dedented source, '' when too long for an edit prompt
    params: Tuple[str, ...]
    is_class: bool


def stdlib_files() -> List[Path]:
    """The stdlib's ``*.py`` files (no tests, demos or site-packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        for name in names:
            if name.endswith(".py") and not name.startswith(("test_", "__main__")):
                files.append(Path(folder) / name)
    return sorted(files)


def _module_name(path: Path) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _first_sentence(doc: str) -> str:
    first = " ".join(doc.strip().split("\n\n")[0].split())
    end = first.find(". ")
    sentence = first if end < 0 else first[: end + 1]
    return sentence.rstrip(".")


def _good_summary(summary: str) -> bool:
    words = summary.split()
    return (
        4 <= len(words) <= 30
        and summary[:1].isalpha()
        and not summary.lower().startswith(("deprecated", "internal", "helper", "xxx"))
        and ">>>" not in summary
        and "(" not in summary[:1]
    )


def _strip_docstring(node: ast.AST) -> ast.AST:
    body = getattr(node, "body", [])
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
        and len(body) > 1
    ):
        node.body = body[1:]
    return node


def _function_source(node: ast.FunctionDef) -> str:
    """The function re-printed without its docstring ('' if too big or small)."""
    if node.end_lineno - node.lineno > 3 * MAX_EDIT_LINES:
        return ""  # too long even without its docstring and comments
    try:
        code = ast.unparse(_strip_docstring(ast.parse(ast.unparse(node)).body[0]))
    except (SyntaxError, ValueError, RecursionError):
        return ""
    lines = code.splitlines()
    if not MIN_EDIT_LINES <= len(lines) <= MAX_EDIT_LINES or len(code) > MAX_EDIT_CHARS:
        return ""
    return code


@lru_cache(maxsize=1)
def _stdlib_items() -> Tuple[Tuple[_Function, ...], Tuple[Tuple[str, str], ...]]:
    """Public documented functions/classes and long docstrings of the stdlib."""
    functions, passages = [], []
    for path in stdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = _module_name(path)
        if module.split(".")[-1].startswith("_"):
            continue
        doc = ast.get_docstring(tree)
        if doc:
            passages.append((module, doc))
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node) or ""
            if len(doc) >= MIN_PASSAGE_CHARS:
                passages.append((module, doc))
            summary = _first_sentence(doc) if doc else ""
            if isinstance(node, ast.ClassDef):
                if _good_summary(summary):
                    functions.append(
                        _Function(module, node.name, "", summary, "", (), True)
                    )
                continue
            args = ast.unparse(node.args)
            params = tuple(
                a.arg for a in node.args.args + node.args.kwonlyargs if a.arg != "self"
            )
            source = _function_source(node)
            if _good_summary(summary) or source:
                functions.append(
                    _Function(
                        module,
                        node.name,
                        args,
                        summary if _good_summary(summary) else "",
                        source,
                        params,
                        False,
                    )
                )
    return tuple(functions), tuple(passages)


CODE_TEMPLATES = [
    "Write a Python function `{name}({args})` that does the following: {summary}.",
    "Implement `{name}({args})` in Python. Its job: {summary}. Include a docstring.",
    "In Python, how would you write a function named `{name}` that does this: {summary}?",
    "Explain what the Python standard library function `{module}.{name}({args})` does, "
    "and show a short example of calling it.",
    "Write two pytest test cases for a function `{name}({args})` whose behaviour is: "
    "{summary}.",
    "Show me how to use `{module}.{name}` in a small Python script.",
    "Write a Python function `{name}({args})` ({summary}) without using the "
    "`{module}` module.",
    "What arguments does `{module}.{name}` take, and what does it return? ({summary})",
]
CLASS_TEMPLATES = [
    "Write a minimal Python class `{name}`: {summary}.",
    "Explain the purpose of the class `{module}.{name}` in the standard library: "
    "{summary}. Give an example.",
    "Sketch a Python class named `{name}` whose description is: {summary}. "
    "Keep it under 30 lines.",
]


def _code_prompts() -> List[Prompt]:
    functions, _ = _stdlib_items()
    rng = random.Random(4321)
    out = []
    for f in functions:
        if not f.summary:
            continue
        summary = f.summary[:1].lower() + f.summary[1:]
        templates = CLASS_TEMPLATES if f.is_class else CODE_TEMPLATES
        for template in rng.sample(templates, 2):
            text = template.format(
                name=f.name, args=f.args, summary=summary, module=f.module
            )
            out.append(_user("code", text, f"module:{f.module}"))
    return _dedupe(out)


EDIT_TEMPLATES = [
    "Rename the function `{name}` to `{new_name}` in this code. Show the whole "
    "function.\n\n```python\n{code}\n```",
    "Add type hints to this Python function and show the full result.\n\n"
    "```python\n{code}\n```",
    "Add a Google-style docstring to this function. Return the complete "
    "code.\n\n```python\n{code}\n```",
    "Rename the parameter `{param}` to `{new_param}` everywhere in this "
    "function.\n\n```python\n{code}\n```",
    "Rewrite this function so that it logs a message with the `logging` module "
    "when it is called. Keep everything else the same.\n\n```python\n{code}\n```",
    "Here is a Python function:\n\n```python\n{code}\n```\n\nAdd a short comment "
    "above each line that is not obvious, and repeat the function.",
    "Refactor this function for readability without changing what it does. "
    "Show the new version.\n\n```python\n{code}\n```",
    "Make this function raise `TypeError` if `{param}` is None, and otherwise "
    "keep it unchanged.\n\n```python\n{code}\n```",
    "Explain what this code does, line by line.\n\n```python\n{code}\n```",
    "Find possible bugs or edge cases in this function.\n\n```python\n{code}\n```",
]
_NEW_NAME_PREFIXES = ("compute_", "get_", "do_", "run_", "make_")


def _new_identifier(name: str, salt: int) -> str:
    """A different identifier for ``name`` (deterministic)."""
    if salt % 2 == 0:
        prefix = _NEW_NAME_PREFIXES[salt // 2 % len(_NEW_NAME_PREFIXES)]
        return prefix + name if not name.startswith(prefix) else name + "_new"
    return name + ("_value" if salt % 3 else "_arg")


def _edit_prompts() -> List[Prompt]:
    functions, _ = _stdlib_items()
    rng = random.Random(2468)
    out = []
    for f in functions:
        if not f.source:
            continue
        for salt, template in enumerate(rng.sample(EDIT_TEMPLATES, 2)):
            needs_param = "{param}" in template
            if needs_param and not f.params:
                continue
            param = f.params[salt % len(f.params)] if f.params else ""
            text = template.format(
                code=f.source,
                name=f.name,
                new_name=_new_identifier(f.name, salt + len(f.name)),
                param=param,
                new_param=_new_identifier(param, salt + 1) if param else "",
            )
            out.append(_user("editing", text, f"module:{f.module}"))
    return _dedupe(out)


EXTRACT_TEMPLATES = [
    "Summarize the following passage in one sentence.\n\n{passage}",
    "List the key points of this text as bullet points.\n\n{passage}",
    "What is the main purpose described in this passage?\n\n{passage}",
    "Extract every function, class or module name mentioned in this text, as a "
    "list.\n\n{passage}",
    "Suggest a short title for this passage and explain your choice.\n\n{passage}",
    "Rewrite this documentation in plain English for a beginner.\n\n{passage}",
    "Read the text below and answer: what inputs and outputs does it mention?\n\n"
    "{passage}",
    "Turn this passage into three questions a student could answer from it.\n\n"
    "{passage}",
]


def _passage(doc: str) -> str:
    text = textwrap.dedent(doc).strip()
    if len(text) > MAX_PASSAGE_CHARS:
        cut = text.rfind("\n\n", 0, MAX_PASSAGE_CHARS)
        text = text[: cut if cut > MIN_PASSAGE_CHARS else MAX_PASSAGE_CHARS].rstrip()
    return text


def _extract_prompts() -> List[Prompt]:
    _, passages = _stdlib_items()
    rng = random.Random(1357)
    out = []
    for module, doc in passages:
        passage = _passage(doc)
        if len(passage) < MIN_PASSAGE_CHARS:
            continue
        for template in rng.sample(EXTRACT_TEMPLATES, 2):
            out.append(
                _user("summarize", template.format(passage=passage), f"module:{module}")
            )
    return _dedupe(out)


def _dedupe(prompts: Iterable[Prompt]) -> List[Prompt]:
    seen, out = set(), []
    for p in prompts:
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out


_BUILDERS = {
    "chat": lru_cache(maxsize=1)(_chat_prompts),
    "code": lru_cache(maxsize=1)(_code_prompts),
    "editing": lru_cache(maxsize=1)(_edit_prompts),
    "summarize": lru_cache(maxsize=1)(_extract_prompts),
}


def builtin_prompts(
    split: str = "train", sets: Sequence[str] = PROMPT_SETS
) -> List[Prompt]:
    """Every built-in prompt of ``split`` in ``sets``, in a fixed order.

    Args:
        split: ``"train"`` or ``"heldout"``. Default: ``"train"``.
        sets: Prompt sets to include. Default: all of :data:`PROMPT_SETS`.

    Returns:
        The prompts; the same on every call with the same Python installed.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}.")
    unknown = [s for s in sets if s not in _BUILDERS]
    if unknown:
        raise ValueError(
            f"unknown prompt set(s) {unknown}; use any of {', '.join(PROMPT_SETS)}."
        )
    return [p for s in sets for p in _BUILDERS[s]() if split_of(p.source) == split]


def mixed_prompts(
    count: int,
    split: str = "train",
    *,
    seed: int = 0,
    shares: Optional[Dict[str, float]] = None,
) -> List[Prompt]:
    """A seeded mix of ``count`` prompts, the sets interleaved by ``shares``.

    Each set's pool is shuffled with the seed, and the sets take turns in
    proportion to their shares (the set furthest behind its share goes
    next), so the first ``n`` prompts of a longer mix are the mix of ``n``:
    asking for more prompts only adds prompts at the end.

    Args:
        count: Number of prompts (fewer if the pools run out).
        split: ``"train"`` or ``"heldout"``. Default: ``"train"``.
        seed: Shuffling seed. Default: ``0``.
        shares: Prompt set -> weight. Default: :data:`DEFAULT_SHARES`.
    """
    shares = dict(DEFAULT_SHARES if shares is None else shares)
    total = sum(shares.values())
    pools = {}
    for name in sorted(shares):
        pool = list(builtin_prompts(split, (name,)))
        random.Random(f"{seed}:{name}").shuffle(pool)
        pools[name] = pool
    taken = {name: 0 for name in pools}
    picked: List[Prompt] = []
    while len(picked) < count:
        open_sets = [n for n in sorted(pools) if taken[n] < len(pools[n])]
        if not open_sets:
            break
        turn = len(picked) + 1
        name = max(open_sets, key=lambda n: turn * shares[n] / total - taken[n])
        picked.append(pools[name][taken[name]])
        taken[name] += 1
    return picked


def load_prompt_file(path: str) -> List[Prompt]:
    """Prompts from a JSON-lines file: ``prompt_set`` and ``prompt`` or ``messages``.

    The format is the one ``mlx_spec.bench.run --prompts FILE`` reads.
    """
    prompts = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg}).") from None
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise ValueError(
                f"{path}:{number}: each line needs 'prompt' (text) or 'messages'."
            )
        if "messages" in row:
            messages = tuple(dict(m) for m in row["messages"])
        else:
            messages = ({"role": "user", "content": str(row["prompt"])},)
        prompt_set = str(row.get("prompt_set", "file"))
        prompts.append(Prompt(prompt_set, messages, f"file:{number}"))
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    return prompts


def prompt_counts(prompts: Sequence[Prompt]) -> Dict[str, int]:
    """Prompt set -> number of prompts."""
    counts: Dict[str, int] = {}
    for p in prompts:
        counts[p.prompt_set] = counts.get(p.prompt_set, 0) + 1
    return counts
