"""The built-in code, editing and extraction prompts, built from the Python
standard library installed here (parsed with :mod:`ast`, nothing imported).
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Tuple

from .prompt import Prompt, dedupe, user_prompt

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
def stdlib_items() -> Tuple[Tuple[_Function, ...], Tuple[Tuple[str, str], ...]]:
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


def code_prompts() -> List[Prompt]:
    functions, _ = stdlib_items()
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
            out.append(user_prompt("code", text, f"module:{f.module}"))
    return dedupe(out)


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


def edit_prompts() -> List[Prompt]:
    functions, _ = stdlib_items()
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
            out.append(user_prompt("editing", text, f"module:{f.module}"))
    return dedupe(out)


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


def doc_passage(doc: str) -> str:
    text = textwrap.dedent(doc).strip()
    if len(text) > MAX_PASSAGE_CHARS:
        cut = text.rfind("\n\n", 0, MAX_PASSAGE_CHARS)
        text = text[: cut if cut > MIN_PASSAGE_CHARS else MAX_PASSAGE_CHARS].rstrip()
    return text


def extract_prompts() -> List[Prompt]:
    _, passages = stdlib_items()
    rng = random.Random(1357)
    out = []
    for module, doc in passages:
        passage = doc_passage(doc)
        if len(passage) < MIN_PASSAGE_CHARS:
            continue
        for template in rng.sample(EXTRACT_TEMPLATES, 2):
            out.append(
                user_prompt(
                    "summarize", template.format(passage=passage), f"module:{module}"
                )
            )
    return dedupe(out)
