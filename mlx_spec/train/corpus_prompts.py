"""The corpus's prompt families: wider than the built-in training prompts.

Like :mod:`mlx_spec.train.prompts`, every prompt is generated, never written
one by one: templates over its topic lists and over the Python standard
library (function summaries, sources and docstrings, read with :mod:`ast`).
On top of the four built-in sets, the corpus adds:

- ``long``: chat requests whose answers run long (guides, essays, plans);
- ``advice``: first-person requests about the asker's own situation
  (:mod:`mlx_spec.train.advice_prompts`);
- ``polyglot``: code in other languages, from stdlib function summaries, and
  stdlib functions translated from Python;
- ``tasks``: everyday programming requests in many languages, SQL, regular
  expressions and the shell (:mod:`mlx_spec.train.task_prompts`);
- ``json``: structured output and extraction as JSON;
- ``rewrite``: rewriting passages (tone, length, word swaps);
- ``multiturn``: a follow-up request to one of the corpus's own completed
  conversations (built by :func:`follow_up_prompts` from stored ids);
- ``self``: requests the target writes itself
  (:mod:`mlx_spec.train.self_instruct`).

Each prompt keeps its source (topic or module), so its split follows
:func:`~mlx_spec.train.prompt.split_of` and no held-out topic trains.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from .advice_prompts import advice_prompts
from .chat_prompts import AUDIENCES, TOPICS, first_upper
from .prompt import Prompt, dedupe, split_of, user_prompt
from .prompts import builtin_prompts
from .stdlib_prompts import doc_passage, stdlib_items
from .task_prompts import task_prompts

# Share of each family in the stream (multiturn and self come on top, see grow).
DEFAULT_SHARES = {
    "chat": 0.10,
    "advice": 0.18,
    "long": 0.06,
    "code": 0.06,
    "polyglot": 0.08,
    "tasks": 0.12,
    "editing": 0.10,
    "summarize": 0.08,
    "json": 0.12,
    "rewrite": 0.10,
}
FAMILIES = tuple(DEFAULT_SHARES) + ("multiturn", "self")
# Families of chat in prose (the held-out chat prompts a drafter is measured on).
CHAT_FAMILIES = ("chat", "advice", "long", "self")
# What each family asks for, in a few words (the corpus card's column).
FAMILY_NOTES = {
    "chat": "questions over topic lists",
    "advice": "first-person requests about the asker's own situation",
    "long": "requests for long answers: guides, essays, plans",
    "code": "Python functions from stdlib summaries",
    "polyglot": "code in other languages",
    "tasks": "everyday programming requests, SQL, regexes and the shell",
    "editing": "edits of stdlib functions",
    "summarize": "summaries and extraction from stdlib docs",
    "json": "structured output as JSON",
    "rewrite": "rewriting passages",
    "multiturn": "follow-ups to the corpus's own conversations",
    "self": "requests the target wrote itself",
}

LANGUAGES = [
    "JavaScript",
    "TypeScript",
    "Rust",
    "Go",
    "C",
    "C++",
    "Java",
    "C#",
    "Ruby",
    "Bash",
    "Kotlin",
    "Swift",
    "PHP",
    "Lua",
    "Haskell",
    "Scala",
]
TONES = [
    "more formal",
    "friendlier",
    "more concise",
    "more enthusiastic",
    "neutral, encyclopedic",
    "plain, simple",
]

LONG_TEMPLATES = [
    "Write a detailed guide to {topic} for {audience}, with headings.",
    "Write an essay of five paragraphs about {topic}.",
    "Explain {topic} thoroughly: what it is, how it works, why it matters and "
    "common mistakes people make.",
    "Write a blog post about {topic} with an introduction, three sections and a "
    "conclusion.",
    "Create a lesson plan for teaching {topic} to {audience}.",
    "Write a long, friendly letter to {audience} explaining {topic}.",
    "Write a FAQ about {topic} with eight questions and their answers.",
    "Describe the history, the present and the future of {topic}.",
]
POLYGLOT_TEMPLATES = [
    "Write a {lang} function named `{name}` that does the following: {summary}.",
    "Implement this in {lang}: {summary}. Include a short usage example.",
    "In {lang}, how would you write a function that does this: {summary}? "
    "Explain the code briefly.",
    "Write a {lang} unit test for a function `{name}` whose job is: {summary}.",
]
TRANSLATE_TEMPLATES = [
    "Translate this Python function to {lang}:\n\n```python\n{code}\n```",
    "Rewrite this Python code in idiomatic {lang} and explain the differences.\n\n"
    "```python\n{code}\n```",
]
JSON_FUNCTION_TEMPLATES = [
    "Describe the Python function `{module}.{name}({args})` as a JSON object with "
    'the keys "name", "parameters" (a list of objects with "name" and "meaning") '
    'and "returns". Reply with JSON only.',
    "Write a JSON Schema for the arguments of the function `{name}({args})`, "
    "whose job is: {summary}.",
    'Return a JSON object with the keys "module", "function", "summary" and '
    '"example_call" for `{module}.{name}`: {summary}.',
]
JSON_PASSAGE_TEMPLATES = [
    'Read this text and return a JSON object with the keys "title", "summary" and '
    '"keywords" (a list of strings).\n\n{passage}',
    "Extract every function, class or module name mentioned in this text as a "
    "JSON array of strings.\n\n{passage}",
    'From the text below, return JSON of the form {{"inputs": [...], "outputs": '
    '[...], "errors": [...]}}.\n\n{passage}',
    "Turn the key facts of this passage into a JSON list of objects with the keys "
    '"fact" and "importance" (low, medium or high).\n\n{passage}',
]
JSON_TOPIC_TEMPLATES = [
    'Give three facts about {topic} as a JSON array of objects with the keys "fact" '
    'and "why_it_matters".',
    'Return a JSON object describing {topic} with the keys "definition", '
    '"examples" (a list) and "difficulty" (1 to 5).',
    "Make a JSON quiz about {topic}: a list of four objects with a question, "
    "four choices and the index of the right answer.",
]
REWRITE_TEMPLATES = [
    "Rewrite this text in a {tone} tone.\n\n{passage}",
    "Shorten this text to about half its length, keeping the key facts.\n\n"
    "{passage}",
    "Rewrite this documentation as a short email to a colleague.\n\n{passage}",
    "Rewrite this text for {audience}.\n\n{passage}",
    "Rewrite this passage as a bulleted list of its points.\n\n{passage}",
    'Replace every occurrence of the word "{word}" with "{new_word}" in this '
    "text and write it out again. Change nothing else.\n\n{passage}",
]
FOLLOW_UPS = [
    "Can you make that shorter?",
    "Give me a concrete example.",
    "Explain that again for {audience}.",
    "Turn that into a numbered list.",
    "What would be a good next step?",
    "Summarize your answer in one sentence.",
    "Rewrite your answer in a {tone} tone.",
    "What are the most common mistakes here?",
    "Thanks! Can you expand on the second point?",
    "Can you put that in a table?",
]
CODE_FOLLOW_UPS = [
    "Add type hints and a docstring to that code.",
    "Write two tests for it.",
    "Translate it to {lang}.",
    "Explain how it works, step by step.",
    "Can you make it handle empty input?",
    "Can you make it faster?",
]
# Words a rewrite may swap (long enough, not code).
_WORD = re.compile(r"\b[a-z]{5,12}\b")


def _rng(name: str) -> random.Random:
    return random.Random(f"corpus:{name}")


def _long_prompts() -> List[Prompt]:
    rng = _rng("long")
    out = []
    for topics in TOPICS.values():
        for topic in topics:
            for template in rng.sample(LONG_TEMPLATES, 3):
                text = template.format(topic=topic, audience=rng.choice(AUDIENCES))
                out.append(user_prompt("long", first_upper(text), f"chat:{topic}"))
    return dedupe(out)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _polyglot_prompts() -> List[Prompt]:
    functions, _ = stdlib_items()
    rng = _rng("polyglot")
    out = []
    for f in functions:
        source = f"module:{f.module}"
        if f.summary and not f.is_class:
            template = rng.choice(POLYGLOT_TEMPLATES)
            text = template.format(
                lang=rng.choice(LANGUAGES), name=f.name, summary=_lower_first(f.summary)
            )
            out.append(user_prompt("polyglot", text, source))
        if f.source:
            template = rng.choice(TRANSLATE_TEMPLATES)
            text = template.format(lang=rng.choice(LANGUAGES), code=f.source)
            out.append(user_prompt("polyglot", text, source))
    return dedupe(out)


def _json_prompts() -> List[Prompt]:
    functions, passages = stdlib_items()
    rng = _rng("json")
    out = []
    for f in functions:
        if f.summary and not f.is_class:
            text = rng.choice(JSON_FUNCTION_TEMPLATES).format(
                module=f.module,
                name=f.name,
                args=f.args,
                summary=_lower_first(f.summary),
            )
            out.append(user_prompt("json", text, f"module:{f.module}"))
    for module, doc in passages:
        passage = doc_passage(doc)
        if len(passage) >= 200:
            text = rng.choice(JSON_PASSAGE_TEMPLATES).format(passage=passage)
            out.append(user_prompt("json", text, f"module:{module}"))
    for topics in TOPICS.values():
        for topic in topics:
            for template in JSON_TOPIC_TEMPLATES:
                out.append(
                    user_prompt("json", template.format(topic=topic), f"chat:{topic}")
                )
    return dedupe(out)


def _swap_word(passage: str, rng: random.Random) -> Optional[Tuple[str, str]]:
    """Two of the most frequent words of ``passage``: one to replace, its replacement."""
    words = [w for w, _ in Counter(_WORD.findall(passage)).most_common(8)]
    if len(words) < 2:
        return None
    word, other = rng.sample(words, 2)
    return word, other


def _rewrite_prompts() -> List[Prompt]:
    _, passages = stdlib_items()
    rng = _rng("rewrite")
    out = []
    for module, doc in passages:
        passage = doc_passage(doc)
        if len(passage) < 200:
            continue
        for template in rng.sample(REWRITE_TEMPLATES, 2):
            swap = _swap_word(passage, rng) if "{word}" in template else ("", "")
            if swap is None:
                continue
            text = template.format(
                passage=passage,
                tone=rng.choice(TONES),
                audience=rng.choice(AUDIENCES),
                word=swap[0],
                new_word=swap[1],
            )
            out.append(user_prompt("rewrite", text, f"module:{module}"))
    return dedupe(out)


_FAMILIES = {
    "advice": lru_cache(maxsize=1)(advice_prompts),
    "long": lru_cache(maxsize=1)(_long_prompts),
    "polyglot": lru_cache(maxsize=1)(_polyglot_prompts),
    "json": lru_cache(maxsize=1)(_json_prompts),
    "rewrite": lru_cache(maxsize=1)(_rewrite_prompts),
    "tasks": lru_cache(maxsize=1)(task_prompts),
}


def family_prompts(family: str) -> List[Prompt]:
    """Every prompt of a template family (both splits), in a fixed order."""
    if family in _FAMILIES:
        return _FAMILIES[family]()
    return builtin_prompts("train", (family,)) + builtin_prompts("heldout", (family,))


def prompt_stream(
    seed: int = 0, shares: Optional[Dict[str, float]] = None
) -> List[Prompt]:
    """Every template prompt, the families interleaved by ``shares`` (seeded).

    The order depends only on ``seed`` and the Python installed, so a run
    that skips the prompts already in the corpus goes on where the last
    one stopped. A family that runs out leaves the others to go on.
    """
    shares = dict(DEFAULT_SHARES if shares is None else shares)
    pools = {}
    for name in sorted(shares):
        pool = list(family_prompts(name))
        random.Random(f"{seed}:{name}").shuffle(pool)
        pools[name] = pool
    total = sum(shares.values())
    taken = {name: 0 for name in pools}
    out: List[Prompt] = []
    while True:
        open_sets = [n for n in sorted(pools) if taken[n] < len(pools[n])]
        if not open_sets:
            return out
        turn = len(out) + 1
        name = max(open_sets, key=lambda n: turn * shares[n] / total - taken[n])
        out.append(pools[name][taken[name]])
        taken[name] += 1


def follow_up_text(parent_hash: int, code: bool) -> str:
    """The follow-up request for a stored conversation (fixed by its hash)."""
    rng = random.Random(parent_hash)
    templates = CODE_FOLLOW_UPS + FOLLOW_UPS[:4] if code else FOLLOW_UPS
    return rng.choice(templates).format(
        audience=rng.choice(AUDIENCES),
        tone=rng.choice(TONES),
        lang=rng.choice(LANGUAGES),
    )


def turn_suffix(tokenizer) -> Tuple[str, str]:
    """Chat-template text between an assistant's answer and a new user turn, and after it.

    For ChatML: ``("<|im_end|>\\n<|im_start|>user\\n", "<|im_end|>\\n<|im_start|>assistant\\n")``.
    """
    marks = ["\u2063A\u2063", "\u2063B\u2063", "\u2063C\u2063"]
    messages = [
        {"role": "user", "content": marks[0]},
        {"role": "assistant", "content": marks[1]},
        {"role": "user", "content": marks[2]},
    ]
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    if not all(m in text for m in marks):
        raise ValueError("the target's chat template drops a turn of a conversation.")
    b_end = text.index(marks[1]) + len(marks[1])
    c_at = text.index(marks[2])
    return text[b_end:c_at], text[c_at + len(marks[2]) :]


def is_code_family(prompt_set: str) -> bool:
    return prompt_set in ("code", "polyglot", "editing", "tasks")


def source_split(source: str) -> bool:
    """Whether a prompt of ``source`` is held out."""
    return split_of(source) == "heldout"


def families_of(prompts: Sequence[Prompt]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for p in prompts:
        counts[p.prompt_set] = counts.get(p.prompt_set, 0) + 1
    return counts
