"""The built-in distillation corpus "jargon-file": The Jargon File 4.4.7 (Eric S. Raymond et al., public domain),
real English prose written outside this project that shares no source with the evaluation sets (the Python
Language Reference, NumPy docstrings): lexicon entries on hacker slang, with their history and anecdotes, and the
essays and folklore around them.

Frozen in `lazyattn/finetune/data/jargon-file.jsonl.gz` (one `{"id", "title", "text"}` per line, the format
`--documents FILE.jsonl` reads). Rebuild it from the plain-text edition Debian ships in its `jargon-text` package:

    apt-get download jargon-text && dpkg -x jargon-text_*.deb jt
    python -m lazyattn.finetune.jargon jt/usr/share/doc/jargon-text/jargon.txt.gz

Documents: every lexicon entry (title = the headword) and every section of the chapters and appendices (title = its
heading), with the three-space indent removed, `{cross-reference}` braces dropped, and the letter indexes, tables of
contents and tables left out. Entries shorter than MIN_CHARS (most read "See {foo}.") are left out too.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

from lazyattn.finetune.corpus import JARGON_DATA as DATA
from lazyattn.finetune.corpus import Document

MIN_CHARS = 250
_ENTRY = re.compile(r"^   :(.+?):\s*(.*)$")  # "   :headword: n." opens a lexicon entry
_TABLE = re.compile(r"[\u2500-\u257f]")  # box-drawing characters: the revision-history table


def parse(text: str) -> list[Document]:
    """The documents of the plain-text Jargon File, in file order."""
    docs: list[Document] = []
    title: str | None = None
    lines: list[str] = []
    skipping = started = False  # nothing is kept before Chapter 1 (title page, table of contents)

    def flush() -> None:
        body = _clean(lines)
        if title is not None and len(body) >= MIN_CHARS:
            docs.append(Document(f"{len(docs)}", title, body))
        lines.clear()

    for line in text.replace("\u00a0", " ").splitlines():
        if _TABLE.search(line):
            continue
        if line.strip() and not line.startswith(" "):  # a chapter, section or appendix heading
            flush()
            started = started or line.startswith("Chapter 1.")
            skipping = line.strip() == "Glossary"  # its body until the first entry is the letter index
            title = line.strip() if started and not skipping else None
            continue
        entry = _ENTRY.match(line)
        if entry:
            flush()
            skipping, title = False, entry.group(1).strip()
            lines.append(entry.group(2))
            continue
        if line.startswith("  ") and not line.startswith("   ") and line.strip():
            flush()  # "  C": a letter of the lexicon, followed by its index of headwords
            skipping, title = True, None
            continue
        if line.strip() == "Table of Contents":
            skipping = True  # a section's own contents list, up to its first prose paragraph
            continue
        if skipping and len(line.strip()) > 60:
            skipping = False
        if started and not skipping:
            lines.append(line)
    flush()
    return docs


def _clean(lines: list[str]) -> str:
    text = "\n".join(line[3:] if line.startswith("   ") else line.strip() for line in lines)
    text = re.sub(r"\{([^{}]*)\}", r"\1", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def build(source: str | Path, out: Path = DATA) -> int:
    raw = Path(source).read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    docs = parse(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same source gives the same bytes
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
        for d in docs:
            gz.write((json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n").encode())
    return len(docs)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m lazyattn.finetune.jargon PATH/jargon.txt.gz")
    print(f"wrote {build(sys.argv[1])} documents to {DATA}")
