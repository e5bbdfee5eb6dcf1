"""Nothing outside lazyattn/engine/ reaches into an engine: no private attribute of an engine object (`engine._x`,
`LLMEngine._x`, `llm.engine._x`), and no hop to its executor or its runner (`.executor`, `.runner`). The server and
the cluster go through the `EngineClient` protocol (engine/client.py), eval and bench through `LLM` and `LLMEngine`'s
public methods and options (e.g. `reference_attention` for the fidelity reference)."""

from __future__ import annotations

import ast
from pathlib import Path

import lazyattn

PACKAGE = Path(lazyattn.__file__).parent
ENGINE_PACKAGE = PACKAGE / "engine"

# What names an engine object, or the engine's layers below its public face.
ENGINE_NAMES = {"engine", "llm", "LLMEngine", "LLM", "executor", "runner", "scheduler"}
INTERNALS = {"executor", "runner"}


def _names_engine(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and (name in ENGINE_NAMES or name.endswith("_engine"))


def reaches_in(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, expression) of each read of an engine's private attribute or of its executor or runner."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Attribute):
            continue
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if node.attr in INTERNALS or (private and _names_engine(node.value)):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_check_sees_the_ways_in():
    assert reaches_in("t = LLMEngine._tokenizer(config)") == [(1, "LLMEngine._tokenizer")]
    assert [e for _, e in reaches_in("llm.engine.executor.runner.backend = b")] == [
        "llm.engine.executor.runner",
        "llm.engine.executor",
    ]
    assert reaches_in("self.engine._read(step)") == [(1, "self.engine._read")]
    assert reaches_in("x = self._streams; engine.step(); llm.engine.stats(); engine.__class__") == []


def clients_engine(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, expression) of each hop from an engine client (a loop) to the engine behind it (`loop.engine`)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr == "engine":
            base = node.value
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if name.endswith(("loop", "client")):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_server_and_the_cluster_use_the_client_protocol_only():
    """What the server reads of an engine is declared by `EngineClient`: it never takes the engine from behind a
    loop (the facade the cluster once built for that is gone)."""
    assert clients_engine("r = Renderer(engine_loop.engine.tokenizer)") == [(1, "engine_loop.engine")]
    offenders = []
    for package in ("server", "cluster"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for line, expr in clients_engine(path.read_text(), str(path)):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {expr}")
    assert not offenders, "the engine behind a client, read by the server or the cluster:\n" + "\n".join(offenders)


def test_nothing_outside_the_engine_reaches_into_it():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ENGINE_PACKAGE in path.parents:
            continue
        for line, expr in reaches_in(path.read_text(), str(path)):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {expr}")
    assert not offenders, "engine internals read from outside lazyattn/engine/:\n" + "\n".join(offenders)
