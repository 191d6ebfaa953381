"""The package's import graph: no cycles, drafters stay below the engine, and
the core never imports the UI.

The checkout's ``ui/`` is the package's ``mlx_spec.ui`` (setup.py maps it), so
its modules count as ``mlx_spec.ui.*`` and an import of ``ui.X`` as one of
``mlx_spec.ui.X``.

Every import counts, also the ones inside functions, so a cycle cannot hide
behind a lazy import.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mlx_spec"
UI = PACKAGE.parent / "ui"
UI_PACKAGE = "mlx_spec.ui"


def _module_name(path: Path, root: Path, prefix: str) -> str:
    parts = (prefix, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Dict[str, Path]:
    modules = {_module_name(p, PACKAGE, "mlx_spec"): p for p in PACKAGE.rglob("*.py")}
    modules.update({_module_name(p, UI, UI_PACKAGE): p for p in UI.rglob("*.py")})
    return modules


def _as_installed(module: str) -> str:
    """``ui.X`` (the checkout's name) -> ``mlx_spec.ui.X``."""
    if module == "ui" or module.startswith("ui."):
        return "mlx_spec." + module
    return module


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> Dict[str, Set[str]]:
    """``module -> modules of mlx_spec it imports`` (``from pkg import mod`` is an
    edge to ``pkg.mod``; importing any other name of ``pkg`` is an edge to ``pkg``)."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node)
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.append(full if full in modules else source)
            for target in map(_as_installed, targets):
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for succ in graph[todo.pop()]:
            if succ not in seen:
                seen.add(succ)
                todo.append(succ)
    return seen


def test_no_import_cycles_inside_the_package():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_relative_imports_resolve_to_modules():
    graph = import_graph()
    assert "mlx_spec.drafters.base" in graph["mlx_spec.drafters.model"]
    assert "mlx_spec.costs" in graph["mlx_spec.drafters.model"]
    assert "mlx_spec.drafters.registry" in graph["mlx_spec.engine"]


DRAFTER_MODULES = sorted(
    name
    for name in _modules()
    if name.startswith("mlx_spec.drafters.") and not name.endswith(".registry")
)


@pytest.mark.parametrize("drafter", DRAFTER_MODULES)
def test_drafters_never_reach_the_registry_or_the_engine(drafter):
    graph = import_graph()
    reached = reachable(graph, drafter) | {drafter}
    forbidden = {
        "mlx_spec.drafters.registry",
        "mlx_spec.engine",
        "mlx_spec.planner",
        "mlx_spec.verify",
    }
    assert not reached & forbidden


def test_registry_imports_no_drafter():
    assert import_graph()["mlx_spec.drafters.registry"] == set()


def test_every_registered_method_has_a_factory():
    from mlx_spec.config import METHODS
    from mlx_spec.drafters.registry import FACTORIES, factory_of

    assert METHODS == ("none", *FACTORIES)
    for method in FACTORIES:
        assert callable(factory_of(method))


def test_ui_imports_resolve_to_mlx_spec_ui_modules():
    graph = import_graph()
    assert "mlx_spec.ui.render" in graph["mlx_spec.ui.handlers"]  # relative
    assert "mlx_spec.ui.app" in graph["mlx_spec.ui.__main__"]
    assert "mlx_spec.engine" in graph["mlx_spec.ui.render"]
    assert _as_installed("ui.session") == "mlx_spec.ui.session"


def _is_ui(module: str) -> bool:
    return module == UI_PACKAGE or module.startswith(UI_PACKAGE + ".")


def test_the_core_never_reaches_the_ui():
    graph = import_graph()
    reaching = {
        name: sorted(filter(_is_ui, reachable(graph, name)))
        for name in graph
        if not _is_ui(name)
    }
    assert {name: ui for name, ui in reaching.items() if ui} == {}


def test_the_ui_rule_finds_a_planted_import_of_the_ui():
    graph = {
        "mlx_spec.engine": {"mlx_spec.x"},
        "mlx_spec.x": {"mlx_spec.ui.app"},
        "mlx_spec.ui.app": set(),
    }
    assert list(filter(_is_ui, reachable(graph, "mlx_spec.engine"))) == [
        "mlx_spec.ui.app"
    ]


def test_importing_the_package_loads_no_server_module():
    """``import mlx_spec`` loads the engine, not the server (``batch_generate``
    loads the continuous-batching engine on first use)."""
    import subprocess
    import sys

    code = (
        "import sys, mlx_spec\n"
        "print([m for m in sys.modules if m.startswith('mlx_spec.serve')])\n"
        "mlx_spec.batch_generate\n"
        "print('mlx_spec.serve.batch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_importing_the_package_loads_no_front_end():
    """``import mlx_spec`` loads the engine, not the commands, server, UI,
    benchmarks, training or test fixtures."""
    import subprocess
    import sys

    code = (
        "import sys, mlx_spec\n"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('mlx_spec.')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    front_ends = {"bench", "cli", "serve", "testing", "train", "ui"}
    loaded = set(ast.literal_eval(out))
    assert {"engine", "generation"} <= loaded and not front_ends & loaded, out
