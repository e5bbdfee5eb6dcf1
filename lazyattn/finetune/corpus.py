"""The user's documents for distillation (docs/finetune.md, Distillation): a folder of .txt/.md files, a JSONL
file of documents, or a built-in corpus ("jargon-file", "stdlib-docstrings"); cut into passages of a size RAG
prompts use.

- folder: every `*.txt` / `*.md` file below it, sorted; id = the path relative to the folder, title = the file
  name without its suffix.
- JSONL: one `{"text": ..., "title": ..., "id": ...}` per line (title and id optional; id defaults to the line
  number).
- "jargon-file": The Jargon File 4.4.7 (public domain), real prose that shares no source with the evaluation sets
  (jargon.py, frozen in lazyattn/finetune/data/).
- "stdlib-docstrings": the docstrings (`inspect.getdoc`) of the Python standard library's public modules,
  classes and functions on the running interpreter (PSF licence). `pydoc_data` (whose topics are an evaluation
  set), `pydoc` and `builtins` are left out; still the same project's documentation as `builtin:real` (the Python
  Language Reference), and `pdb`'s docstrings repeat its "pdb" passage.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import importlib.util
import inspect
import io
import json
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazyattn.errors import InvalidRequestError

STDLIB_DOCSTRINGS = "stdlib-docstrings"
JARGON_FILE = "jargon-file"
# The built-in corpus, frozen as `--documents FILE.jsonl` reads it (rebuilt by lazyattn/finetune/jargon.py).
JARGON_DATA = Path(__file__).resolve().parent / "data" / "jargon-file.jsonl.gz"
DOCUMENT_SUFFIXES = (".txt", ".md")
# Modules that act when imported (open a browser, print, start Tk), are test suites, or hold evaluation text.
_STDLIB_SKIP = frozenset(
    [
        "antigravity",
        "this",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "test",
        "pydoc",
        "pydoc_data",
        "builtins",
        "ensurepip",
        "venv",
        "lib2to3",
        "__hello__",
        "__phello__",
        "xxsubtype",
        "xxlimited",
    ]
)
_MIN_DOC_CHARS = 200  # shorter docstrings ("Return self+value.") teach little about reading prose


@dataclass(frozen=True)
class Document:
    id: str
    title: str | None
    text: str

    def as_prompt_document(self) -> dict[str, str] | str:
        """The form render_chat takes."""
        return {"title": self.title, "text": self.text} if self.title else self.text


def read_documents(source: str) -> list[Document]:
    """The documents of `source`: "jargon-file", "stdlib-docstrings", a folder, or a JSONL file."""
    if source == STDLIB_DOCSTRINGS:
        return stdlib_docstrings()
    if source == JARGON_FILE:
        return _read_jsonl(JARGON_DATA)
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_SUFFIXES)
        docs = [Document(str(p.relative_to(path)), p.stem, p.read_text(encoding="utf-8").strip()) for p in files]
    elif path.is_file():
        docs = _read_jsonl(path)
    else:
        raise InvalidRequestError(
            f"{source!r}: not {JARGON_FILE!r}, {STDLIB_DOCSTRINGS!r}, a folder of .txt/.md files or a JSONL file",
            param="documents",
        )
    docs = [d for d in docs if d.text]
    if not docs:
        raise InvalidRequestError(f"{source!r} holds no non-empty document", param="documents")
    return docs


def jsonl_rows(path: Path, param: str) -> Iterator[tuple[int, Any]]:
    """(line index from 0, parsed row) of each non-blank line of a JSONL file, gzip-compressed where its name ends in
    .gz; a line that is not JSON is refused with its path and line number."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{path}:{n + 1}: not JSON ({e})", param=param) from e


def _read_jsonl(path: Path) -> list[Document]:
    """A JSONL file of documents, gzip-compressed where its name ends in .gz."""
    docs = []
    for n, row in jsonl_rows(path, "documents"):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise InvalidRequestError(f'{path}:{n + 1}: expected {{"text": ..., "title": ...}}', param="documents")
        title = row.get("title")
        docs.append(Document(str(row.get("id", n)), str(title) if title else None, row["text"].strip()))
    return docs


def passages(docs: list[Document], max_chars: int) -> list[Document]:
    """Documents cut at paragraph (else line, else word) boundaries into passages of at most ~`max_chars`;
    the parts of a cut document are titled "title (part i)" and keep its id with a "#i" suffix."""
    out = []
    for doc in docs:
        parts = _split(doc.text, max_chars)
        if len(parts) == 1:
            out.append(doc)
            continue
        for i, part in enumerate(parts, 1):
            title = f"{doc.title} (part {i})" if doc.title else None
            out.append(Document(f"{doc.id}#{i}", title, part))
    return out


def _split(text: str, max_chars: int) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    for sep in ("\n\n", "\n", " "):
        pieces = [p for p in text.split(sep) if p.strip()]
        if len(pieces) > 1:
            break
    else:
        return [text[i : i + max_chars] for i in range(0, len(text), max_chars)]
    parts, current = [], ""
    for piece in pieces:
        if current and len(current) + len(sep) + len(piece) > max_chars:
            parts.append(current)
            current = ""
        current = f"{current}{sep}{piece}" if current else piece
    parts.append(current)
    return [q for p in parts for q in _split(p.strip(), max_chars)]


def stdlib_docstrings(min_chars: int = _MIN_DOC_CHARS) -> list[Document]:
    """Docstrings of the standard library's public top-level modules and of the public classes and functions
    they define (not those they import), titled by qualified name; sorted, so the corpus is deterministic for
    one interpreter."""
    docs: dict[str, str] = {}
    for name in _stdlib_module_names():
        module = _quiet_import(name)
        if module is None:
            continue
        _add(docs, name, module, min_chars)
        for attr, value in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(value, "__module__", None) != name:
                continue
            if inspect.isclass(value) or inspect.isfunction(value):
                _add(docs, f"{name}.{attr}", value, min_chars)
            if inspect.isclass(value):
                for method, member in sorted(vars(value).items()):
                    if not method.startswith("_") and inspect.isfunction(member):
                        _add(docs, f"{name}.{attr}.{method}", member, min_chars)
    return [Document(key, key, text) for key, text in docs.items()]


def _stdlib_module_names() -> list[str]:
    """Public top-level standard-library modules and the public modules of its packages."""
    names = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _STDLIB_SKIP:
            continue
        names.append(name)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            for info in pkgutil.walk_packages(spec.submodule_search_locations, prefix=f"{name}."):
                parts = info.name.split(".")
                if not any(p.startswith("_") or p in ("test", "tests") for p in parts):
                    names.append(info.name)
    return names


def _add(docs: dict[str, str], key: str, obj, min_chars: int) -> None:
    text = inspect.getdoc(obj)
    if text and len(text) >= min_chars and text not in docs.values():
        docs[key] = re.sub(r"\n{3,}", "\n\n", text.strip())


def _quiet_import(name: str):
    """The module, or None where it does not import here (another platform's, a missing extension)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failure just leaves the module out
            return None
