"""The package's import graph: no circles between modules or between packages (so the packages stack in floors, each
importing only the ones below it), and the floors below the engine never import it.

Every `import` of a lazyattn module counts, at the top of a file, inside a function (a lazy import) or under
TYPE_CHECKING: a circle of lazy imports still ties the modules into one piece. Importing `lazyattn.x.y` runs the
packages' `__init__` files first, but that is Python's order, not a dependency of the importer: an edge goes to
the module named, and `from lazyattn.x import y` goes to `lazyattn.x.y` when `y` is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lazyattn

PACKAGE = Path(lazyattn.__file__).parent

# Layers that sit below the engine (docs/design.md, Parts): the engine builds on them, never the reverse.
BELOW_ENGINE = ("lazyattn.cache", "lazyattn.kernels")
ENGINE = "lazyattn.engine"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["lazyattn", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        # Recursive: the package's import chains are a few dozen modules deep at most.
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_graph_sees_the_package():
    graph = import_graph()
    assert "lazyattn.engine.llm_engine" in graph
    assert "lazyattn.cache.page_pool" in graph["lazyattn.engine.llm_engine"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import circles (each a set of modules that import one another):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the top-level packages (lazyattn.engine, lazyattn.eval, ...); a module directly in
    lazyattn (the CLI, the package's __init__) stays a node of its own."""

    def package(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else name

    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        packages.setdefault(package(name), set()).update(package(d) for d in deps)
    return {p: deps - {p} for p, deps in packages.items()}


def test_packages_stack_in_floors():
    """No two packages import each other, through any chain: a package that needs one above it takes what it needs
    as an argument (the CLI gives `serve` its Ray starter) or the shared part moves a floor down (`qa/`)."""
    # modules with no circle between them can still tie two packages together (as eval and finetune once were)
    modules = {"lazyattn.eval.x": {"lazyattn.finetune.y"}, "lazyattn.finetune.y": {"lazyattn.eval.z"}}
    assert cycles({**modules, "lazyattn.eval.z": set()}) == []
    assert cycles(package_graph({**modules, "lazyattn.eval.z": set()})) == [["lazyattn.eval", "lazyattn.finetune"]]
    found = cycles(package_graph(import_graph()))
    assert not found, "packages that import one another: " + "; ".join(" <-> ".join(c) for c in found)


def test_layers_below_the_engine_do_not_import_it():
    upward = sorted(
        f"{name} imports {dep}"
        for name, deps in import_graph().items()
        if any(_within(name, floor) for floor in BELOW_ENGINE)
        for dep in deps
        if _within(dep, ENGINE)
    )
    assert not upward, "\n".join(upward)
