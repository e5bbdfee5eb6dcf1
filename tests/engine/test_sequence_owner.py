"""Only the scheduler changes a sequence once it exists (docs/design.md, "One step"): no module under
lazyattn/engine/ but scheduler.py assigns to a `Sequence` field, to what a field holds (`seq.metrics.first_token`,
`seq.run.tokens[-1]`) or grows or shrinks one in place (`seq.output.append`). Admission and the output processor return
what changes (`Admitted`, `NewToken`) and the scheduler applies it; intake builds sequences with their fields set in
the constructor, which is no change.

A sequence is recognised by its name (`seq`, `sequence`, `*.seq`) or a `Sequence` annotation in the same function."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import lazyattn
from lazyattn.engine.sequence import Sequence

ENGINE_PACKAGE = Path(lazyattn.__file__).parent / "engine"
OWNER = ENGINE_PACKAGE / "scheduler.py"
FIELDS = {f.name for f in dataclasses.fields(Sequence)}
SEQUENCE_NAMES = {"seq", "sequence"}
# Methods that change a list, dict, set or deque in place.
MUTATORS = {
    "append",
    "appendleft",
    "extend",
    "insert",
    "pop",
    "popleft",
    "remove",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "sort",
    "reverse",
}


def _annotated_sequences(func: ast.AST) -> set[str]:
    """Names a function annotates as `Sequence` (its parameters, annotated assignments)."""
    names = set()
    for node in ast.walk(func):
        if isinstance(node, ast.arg) and node.annotation is not None:
            target, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, annotation = node.target.id, node.annotation
        else:
            continue
        if ast.unparse(annotation).strip("'\"") == "Sequence":
            names.add(target)
    return names


def _reaches_field(node: ast.expr, sequences: set[str]) -> bool:
    """Whether `node` is a sequence's field or lies inside one (`seq.output`, `seq.run.tokens[-1]`, `w.seq.text`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        base = node.value
        if isinstance(node, ast.Attribute) and node.attr in FIELDS:
            if isinstance(base, ast.Name) and base.id in sequences:
                return True
            if isinstance(base, ast.Attribute) and base.attr in SEQUENCE_NAMES:
                return True
        node = base
    return False


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _flat(e)]
    return _flat(target.value) if isinstance(target, ast.Starred) else [target]


def _targets(node: ast.AST) -> list[ast.expr]:
    """What a statement assigns to or deletes, tuples unpacked."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        return [t for target in node.targets for t in _flat(target)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return _flat(node.target)
    return []


def changes(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, expression) of each change of a sequence's state in `source`."""
    found = []
    tree = ast.parse(source, filename)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    seen: set[int] = set()
    for scope in [*scopes, tree]:  # innermost names first; module-level code with the conventional names only
        sequences = SEQUENCE_NAMES | (_annotated_sequences(scope) if scope is not tree else set())
        for node in ast.walk(scope):
            if id(node) in seen:
                continue
            hits = [t for t in _targets(node) if _reaches_field(t, sequences)]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and _reaches_field(node.func.value, sequences)
            ):
                hits.append(node.func)
            if hits:
                seen.add(id(node))
                found += [(node.lineno, ast.unparse(h)) for h in hits]
    return sorted(found)


def test_the_check_sees_every_kind_of_change():
    src = """
def f(seq, w, item: Sequence, other):
    seq.text += "a"
    seq.finish_reason, seq.stop_reason = "stop", 3
    state = seq.mode_state = None
    seq.metrics.first_token = 1.0
    seq.run.tokens[-1] = 7
    seq.output.append(1)
    w.seq.logprobs.append({})
    item.parts = []
    del seq.logprobs[:]
"""
    assert [e for _, e in changes(src)] == [
        "seq.text",
        "seq.finish_reason",
        "seq.stop_reason",
        "seq.mode_state",
        "seq.metrics.first_token",
        "seq.run.tokens[-1]",
        "seq.output.append",
        "w.seq.logprobs.append",
        "item.parts",
        "seq.logprobs[:]",
    ]
    reads = """
def g(seq, run, other):
    n = len(seq.output) + 1
    text = seq.detokenizer.feed(3)
    run.tokens.append(0)
    other.text = "x"
    picked.append((seq, None))
    seqs = [Sequence(1, "r", 0, [], [], None)]
"""
    assert changes(reads) == []


def test_only_the_scheduler_changes_a_sequence():
    offenders = []
    for path in sorted(ENGINE_PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        for line, expr in changes(path.read_text(), str(path)):
            offenders.append(f"{path.relative_to(ENGINE_PACKAGE.parent.parent)}:{line}: {expr}")
    assert not offenders, (
        "a sequence changed outside engine/scheduler.py (return what changes, for Scheduler.update to apply):\n"
        + "\n".join(offenders)
    )


def test_the_scheduler_is_seen_changing_sequences():
    """The check reads the scheduler's changes, so it would read anyone else's."""
    found = {expr for _, expr in changes(OWNER.read_text(), str(OWNER))}
    assert {"seq.status", "seq.output.append", "seq.finish_reason", "seq.run.tokens[-1]"} <= found
