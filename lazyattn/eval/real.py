"""The realistic evaluation sets: real reference prose, hand-written questions (docs/quality.md).

`builtin:real`: passages of the Python Language Reference as the standard library ships it
(`pydoc_data.topics.topics`, Python Software Foundation License 2.0); `builtin:real-heldout`: passages of
NumPy's function docstrings (BSD-3-Clause); `builtin:real-heldout-readme`: another genre, the README prose of
eleven MIT / BSD-3-Clause Python packages as their installed metadata ships it; `builtin:real-heldout-man`: a
third genre, Unix manual pages of permissively licensed tools (OpenSSH, curl, less, xz, zstd, sqlite3, tmux, file,
bzip2) as groff renders them; `builtin:real-heldout-cmake`: a fourth genre, CMake 3.25's manuals and release notes
(BSD-3-Clause) as reStructuredText rendered to plain text (cmake_text). The held-out sets are used only for final
reporting, never for tuning.

Each question has a short answer (a keyword, a name, a number) that its gold passage states; the distractors
are other passages of the same source that do not contain any of the answers (case-insensitive, also after
the scorer's normalisation). The passages and questions are frozen into `data/<name>.jsonl.gz` so the sets do
not change with the Python or NumPy version installed; `python -m lazyattn.eval.real` rebuilds those files
from the question lists in `real_questions.py` / `real_heldout_questions.py` / `real_readme_questions.py` /
`real_man_questions.py` / `real_cmake_questions.py` and the installed sources.

Token counts are estimated as UTF-8 bytes / 4 (English prose and code run about 4 bytes per token under the
SmolLM2 / Llama BPE tokenizers); every passage is kept within 100..1,000 estimated tokens.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazyattn.eval.metrics import normalize_answer
from lazyattn.qa.dataset import DatasetError, QAItem

DATA_DIR = Path(__file__).parent / "data"
SETS = ("real", "real-heldout", "real-heldout-readme", "real-heldout-man", "real-heldout-cmake")
MIN_TOKENS, MAX_TOKENS = 100, 1000
# Passages are cut near this many estimated tokens: 20 documents plus the prompt stay inside an 8k context.
TARGET_TOKENS = 300
MAX_DISTRACTORS = 19  # cells of up to 20 documents
# A 20-document cell stays within this many estimated tokens (SmolLM2's context is 8,192, the prompt and the
# answer need the rest), so distractors are passages of at most MAX_DISTRACTOR_TOKENS.
MAX_CELL_TOKENS = 6500
MAX_DISTRACTOR_TOKENS = 450

SOURCES = {
    "real": {
        "source": "Python Language Reference, as shipped in the standard library (pydoc_data.topics.topics)",
        "license": "Python Software Foundation License Version 2",
        "copyright": "Copyright (c) 2001 Python Software Foundation. All rights reserved.",
    },
    "real-heldout": {
        "source": "docstrings of public NumPy functions (numpy package)",
        "license": "BSD-3-Clause (NumPy license)",
        "copyright": "Copyright (c) 2005-2025, NumPy Developers. All rights reserved.",
    },
    "real-heldout-readme": {
        "source": "README prose of Python packages, as their installed METADATA ships it (README_PACKAGES)",
        "license": "MIT or BSD-3-Clause, each package's own (lazyattn/eval/data/README.md)",
        "copyright": "each package's copyright holders (lazyattn/eval/data/README.md)",
    },
    "real-heldout-man": {
        "source": "Unix manual pages of permissively licensed tools, as Debian installs them (MAN_PAGES), rendered "
        "to plain text by groff (render_man_page)",
        "license": "BSD-style, ISC, curl, BSD-3-Clause or public domain, each tool's own "
        "(lazyattn/eval/data/README.md)",
        "copyright": "each tool's copyright holders (lazyattn/eval/data/README.md)",
    },
    "real-heldout-cmake": {
        "source": "CMake 3.25's manuals and release notes, as Debian's cmake-data package installs them "
        "(/usr/share/cmake-3.25/Help: CMAKE_MANUALS, CMAKE_RELEASES), rendered to plain text by cmake_text",
        "license": "BSD-3-Clause (CMake's licence, /usr/share/doc/cmake-data/copyright)",
        "copyright": "Copyright 2000-2022 Kitware, Inc., Insight Software Consortium",
    },
}


def estimate_tokens(text: str) -> int:
    """UTF-8 bytes / 4, rounded up: the documented estimate for SmolLM2 / Llama-style BPE tokenizers."""
    return -(-len(text.encode("utf-8")) // 4)


@dataclass(frozen=True)
class Passage:
    id: str  # "<topic>#<index>"
    title: str
    text: str


def split_passages(key: str, title: str, text: str, target: int = TARGET_TOKENS) -> list[Passage]:
    """Consecutive paragraphs (blank-line separated) packed into passages of about `target` estimated tokens;
    a paragraph longer than MAX_TOKENS is cut at line breaks. A short tail joins the passage before it."""
    paragraphs: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip()):
        para = para.strip("\n")
        if not para.strip():
            continue
        while estimate_tokens(para) > MAX_TOKENS * 0.9:
            lines = para.split("\n")
            head: list[str] = []
            while lines and estimate_tokens("\n".join([*head, lines[0]])) <= target * 2:
                head.append(lines.pop(0))
            if not head:  # a single huge line: cut it at a space
                cut = para.rfind(" ", 0, target * 8)
                head, lines = [para[:cut]], [para[cut + 1 :]]
            paragraphs.append("\n".join(head))
            para = "\n".join(lines)
        if para.strip():
            paragraphs.append(para)
    chunks: list[list[str]] = [[]]
    for para in paragraphs:
        if chunks[-1] and estimate_tokens("\n\n".join([*chunks[-1], para])) > target:
            chunks.append([])
        chunks[-1].append(para)
    if len(chunks) > 1 and estimate_tokens("\n\n".join(chunks[-1])) < MIN_TOKENS:
        tail = chunks.pop()
        chunks[-1].extend(tail)
    out = []
    for i, chunk in enumerate(chunks):
        body = "\n\n".join(chunk)
        if estimate_tokens(body) < MIN_TOKENS or estimate_tokens(body) > MAX_TOKENS:
            continue  # too short to be a passage (a one-line topic), or an unsplittable block
        out.append(Passage(f"{key}#{i}", title, body))
    return out


def _dedent(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(line[3:] if line.startswith("   ") else line for line in lines)


def python_reference_passages() -> list[Passage]:
    from pydoc_data.topics import topics

    out: list[Passage] = []
    for key in sorted(topics):
        text = _dedent(topics[key])
        first = text.strip().split("\n", 1)[0].strip()
        out.extend(split_passages(key, f"Python reference: {first}", text))
    return out


# Public NumPy functions whose docstrings make the held-out passages (a fixed list: the set must not change
# with what a NumPy release adds).
# fmt: off
NUMPY_FUNCTIONS = (
    "all", "any", "append", "arange", "argmax", "argmin", "argsort", "argwhere", "around", "array", "array_equal",
    "array_split", "atleast_2d", "average", "bincount", "broadcast_to", "clip", "column_stack", "concatenate",
    "convolve", "copy", "corrcoef", "count_nonzero", "cov", "cross", "cumprod", "cumsum", "delete", "diag",
    "diagonal", "diff", "digitize", "dot", "einsum", "empty", "expand_dims", "eye", "flatnonzero", "flip", "full",
    "gradient", "histogram", "hstack", "identity", "insert", "interp", "intersect1d", "isclose", "isin", "kron",
    "lexsort", "linspace", "logspace", "meshgrid", "moveaxis", "nan_to_num", "nanmean", "nanmedian", "nonzero",
    "ones", "outer", "pad", "partition", "percentile", "polyfit", "put", "ravel", "repeat", "reshape", "resize",
    "roll", "rot90", "searchsorted", "sort", "split", "squeeze", "stack", "swapaxes", "take", "tile", "trace",
    "transpose", "trapezoid", "tril", "triu", "trim_zeros", "union1d", "unique", "unravel_index", "vander",
    "vstack", "where", "zeros",
)
# fmt: on


def numpy_passages() -> list[Passage]:
    import numpy as np

    out: list[Passage] = []
    for name in NUMPY_FUNCTIONS:
        fn = getattr(np, name, None)
        doc = getattr(fn, "__doc__", None)
        if not doc:
            continue
        lines = doc.strip("\n").split("\n")
        indent = min((len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()), default=0)
        text = "\n".join([lines[0].strip(), *(x[indent:] for x in lines[1:])]).strip()
        out.extend(split_passages(name, f"NumPy documentation: numpy.{name}", text))
    return out


# Packages whose READMEs (the long description in their METADATA) make `real-heldout-readme`: prose documentation
# of tools far from the Python reference and NumPy, all MIT or BSD-3-Clause licensed.
README_PACKAGES = (
    "rich",
    "typer",
    "python-dotenv",
    "smart_open",
    "psutil",
    "pytest-timeout",
    "colorful",
    "httpcore",
    "pyrate-limiter",
    "charset-normalizer",
    "annotated-types",
)
_MARKUP = re.compile(r"https?://\S+|<[^>]*>")


def readme_passages() -> list[Passage]:
    """Passages of each package's README, in the words of its installed METADATA; passages that are mostly
    links and HTML (badge rows, language menus) are left out: they are not prose."""
    import email
    import importlib.metadata

    out: list[Passage] = []
    for name in README_PACKAGES:
        metadata = importlib.metadata.distribution(name).read_text("METADATA") or ""
        text = email.message_from_string(metadata).get_payload()
        for p in split_passages(name, f"{name} README", text):
            if len(_MARKUP.sub("", p.text)) >= 0.5 * len(p.text):
                out.append(p)
    return out


def readme_versions() -> dict[str, str]:
    import importlib.metadata

    return {name: importlib.metadata.version(name) for name in README_PACKAGES}


# Manual pages that make `real-heldout-man`: (page, section, Debian package). Tools under BSD-style, ISC, curl,
# BSD-3-Clause (zstd's option of BSD-3-Clause or GPL-2, less's of its BSD-style Less License or GPL-3+) or
# public-domain terms; pages whose text is GPL-only or comes from elsewhere (jq's from its CC-BY manual, lz4's from
# its GPL programs/ directory) are not used.
MAN_PAGES = (
    ("ssh", "1", "openssh-client"),
    ("scp", "1", "openssh-client"),
    ("sftp", "1", "openssh-client"),
    ("ssh-keygen", "1", "openssh-client"),
    ("ssh-agent", "1", "openssh-client"),
    ("ssh-add", "1", "openssh-client"),
    ("ssh_config", "5", "openssh-client"),
    ("curl", "1", "curl"),
    ("less", "1", "less"),
    ("xz", "1", "xz-utils"),
    ("zstd", "1", "zstd"),
    ("sqlite3", "1", "sqlite3"),
    ("tmux", "1", "tmux"),
    ("file", "1", "file"),
    ("bzip2", "1", "bzip2"),
)
MAN_DIR = Path("/usr/share/man")
# groff's plain-text rendering, 100 columns, in a fixed environment, without overstrikes for bold or underline; the
# prologue turns hyphenation off and lines to ragged-right, then makes the hy and ad requests do nothing, so that
# neither the macro package nor a page turns them back on.
GROFF = ("groff", "-Tascii", "-P-cbou", "-rLL=100n", "-rLT=100n")
_ROFF_PROLOGUE = ".nh\n.ad l\n.de hy\n..\n.de ad\n..\n"
# Sections left out: the synopsis is a run of bracketed option letters, "see also" a list of page names.
MAN_SECTIONS_LEFT_OUT = ("SYNOPSIS", "SEE ALSO")


def render_man_page(path: Path) -> str:
    """The plain text of a manual page (roff source, gzipped), as groff renders it for a 100-column terminal."""
    if shutil.which("groff") is None:
        raise DatasetError("groff is not installed: the manual pages cannot be rendered")
    if not path.exists():
        raise DatasetError(f"{path} is not installed")
    source = gzip.decompress(path.read_bytes()).decode("utf-8")
    macros = "-mdoc" if re.search(r"^\.Dd\b", source, re.MULTILINE) else "-man"
    tables = ["-t"] if source.startswith("'\\\" t") else []  # the convention that asks for tbl
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    done = subprocess.run(
        [*GROFF, *tables, macros], input=_ROFF_PROLOGUE + source, capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


def man_text(rendered: str) -> str:
    """A rendered page without its running header and footer lines and the MAN_SECTIONS_LEFT_OUT, its body's
    indentation removed (section headings start at column 0, the text under them a few columns in)."""
    lines = rendered.strip("\n").split("\n")[1:-1]
    kept: list[str] = []
    skip = False
    for line in lines:
        if line and not line[0].isspace():  # a section heading
            skip = line.strip() in MAN_SECTIONS_LEFT_OUT
        if not skip:
            kept.append(line.rstrip())
    indent = min(len(x) - len(x.lstrip(" ")) for x in kept if x.startswith(" ") and x.strip())
    return "\n".join(x[indent:] if x[:indent].isspace() else x for x in kept).strip("\n")


def man_passages() -> list[Passage]:
    """Passages of each page in MAN_PAGES; those that are mostly lists of names (the option keywords ssh passes on,
    algorithm lists) are left out: they are not prose."""
    out: list[Passage] = []
    for page, section, _ in MAN_PAGES:
        text = man_text(render_man_page(MAN_DIR / f"man{section}" / f"{page}.{section}.gz"))
        out.extend(p for p in split_passages(page, f"{page}({section}) manual page", text) if not is_word_list(p.text))
    return out


def is_word_list(text: str) -> bool:
    """Whether most lines of `text` hold a single word: a list of option or algorithm names, not prose."""
    lines = [line for line in text.split("\n") if line.strip()]
    return sum(len(line.split()) == 1 for line in lines) > 0.6 * len(lines)


def man_versions() -> dict[str, str]:
    """The Debian version of each package the pages come from, and groff's."""
    if shutil.which("dpkg-query") is None:
        raise DatasetError("dpkg-query is not installed: the manual pages' package versions cannot be recorded")
    packages = dict.fromkeys([package for _, _, package in MAN_PAGES] + ["groff-base"])
    return {
        package: subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True, check=True
        ).stdout
        for package in packages
    }


# CMake's documentation that makes `real-heldout-cmake`: its manuals and release notes as Debian's cmake-data package
# installs them (reStructuredText, BSD-3-Clause). The manuals that are mostly lists of names (the command, variable,
# property, module, policy, environment variable and CPack generator indexes), the cmake-server(7) stub and the
# ccmake(1) / cmake-gui(1) pages (their options come from included files, leaving no passage of prose) are not used.
CMAKE_HELP = Path("/usr/share/cmake-3.25/Help")
CMAKE_MANUALS = (
    "cmake.1",
    "ctest.1",
    "cpack.1",
    "cmake-buildsystem.7",
    "cmake-compile-features.7",
    "cmake-developer.7",
    "cmake-file-api.7",
    "cmake-generator-expressions.7",
    "cmake-generators.7",
    "cmake-language.7",
    "cmake-packages.7",
    "cmake-presets.7",
    "cmake-qt.7",
    "cmake-toolchains.7",
)
CMAKE_RELEASES = tuple(f"3.{minor}" for minor in range(26))
# Directives whose argument is a signature (an option, a generator expression, an environment variable): the
# argument is kept as a line of text, then the directive's content.
_RST_SIGNATURES = ("option", "genex", "envvar")
# Directives shown with a heading of their own (Sphinx's words), then their content.
_RST_NOTES = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}.",
    "deprecated": "Deprecated since version {}.",
    "note": "Note:",
    "warning": "Warning:",
}
# Directives whose content is literal text, kept as it is (a parsed literal's inline markup becomes its visible text).
_RST_LITERAL = ("code-block", "parsed-literal", "productionlist")
# Any other directive (toctree, include, contents, only, raw, literalinclude, program, ...) is dropped with its content.
_RST_DIRECTIVE = re.compile(r"^(\s*)\.\. ([\w-]+)::\s*(.*)$")
_RST_INLINE = re.compile(
    r"``((?:(?!\n\s*\n).)+?)``"  # inline literal
    r"|:[\w:+-]+:`((?:(?!\n\s*\n)[^`])+)`"  # role
    r"|`((?:(?!\n\s*\n)[^`])+)`_{0,2}"  # hyperlink reference or default role
    r"|(?<![\w*])\*\*(\S(?:(?:(?!\n\s*\n).)*?\S)?)\*\*(?![\w*])"  # strong
    r"|(?<![\w*])\*([^\s*](?:(?:(?!\n\s*\n)[^*])*?[^\s*])?)\*(?![\w*])",  # emphasis
    re.DOTALL,
)


def _rst_inline(text: str) -> str:
    """Inline markup to its visible text: ``literal`` -> literal, :role:`text <target>` -> text, :role:`name` ->
    name, `text <url>`_ -> text, **strong** and *emphasis* -> their words."""

    def visible(m: re.Match[str]) -> str:
        literal, role, ref, strong, emphasis = m.groups()
        if literal is not None:
            return literal
        content = role if role is not None else ref
        if content is not None:
            target = re.match(r"(.*?\S)\s*<[^<>]*(?:<[^<>]*>[^<>]*)*>$", content, re.DOTALL)
            return (target.group(1) if target else content).lstrip("!~")
        return strong if strong is not None else emphasis

    return _RST_INLINE.sub(visible, text)


def cmake_text(rst: str) -> str:
    """The plain text of a CMake help page (reStructuredText), line by line:

    - comments, link targets and the directives not named below are dropped with their indented content;
    - a directive's option lines (":maxdepth: 1") are dropped; `.. option::`, `.. genex::` and `.. envvar::` keep their
      argument as a line; `.. versionadded:: 3.13` becomes "New in version 3.13." (Sphinx's words; likewise
      versionchanged, deprecated, note, warning); `.. code-block::`, `.. parsed-literal::` and `.. productionlist::`
      keep their content as it is (a parsed literal's inline markup is converted);
    - section underlines and overlines, transitions and simple-table borders (column-0 lines of one repeated
      punctuation character) are dropped, the heading text kept;
    - a paragraph's closing "::" becomes ":" (" ::" and a lone "::" go), and its indented literal block is kept as it
      is;
    - outside literal text, inline markup becomes its visible text (`_rst_inline`).

    Indentation is kept; trailing spaces go."""
    lines = rst.expandtabs(8).split("\n")
    out: list[tuple[str, bool]] = []  # (line, literal)

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip(" "))

    def block_end(start: int, level: int) -> int:
        """The first line after `start` that is not blank and not indented past `level`."""
        j = start
        while j < len(lines) and (not lines[j].strip() or indent(lines[j]) > level):
            j += 1
        return j

    i = 0
    literal_level: int | None = None  # inside a literal block: the indentation of its introducing paragraph
    while i < len(lines):
        line = lines[i].rstrip()
        if literal_level is not None:
            if not line or indent(line) > literal_level:
                out.append((line, True))
                i += 1
                continue
            literal_level = None
        d = _RST_DIRECTIVE.match(line)
        if d:
            level, name, argument = len(d.group(1)), d.group(2), d.group(3).strip()
            end = block_end(i + 1, level)
            j = i + 1
            while j < end and lines[j].strip() and re.match(r"\s+:[\w-]+:", lines[j]):
                j += 1  # the directive's options
            pad = " " * level
            if name in _RST_SIGNATURES:
                out.append((pad + _rst_inline(argument), False))
                i = j
            elif name in _RST_NOTES:
                out.append((pad + _RST_NOTES[name].format(argument), False))
                i = j
            elif name in _RST_LITERAL:
                out.extend((x.rstrip(), name != "parsed-literal") for x in lines[j:end])
                i = end
            else:
                i = end
            continue
        if re.match(r"\s*\.\.(\s|$)", line):  # a comment, a link target or a substitution definition
            i = block_end(i + 1, indent(line))
            continue
        if re.fullmatch(r"([=\-~^*#\"+'`:._])\1{2,}( +\1{3,})*", line):  # an underline, an overline or a border
            i += 1
            continue
        if line.strip() == "::":
            literal_level = indent(line)
            i += 1
            continue
        if line.endswith("::"):
            line = line[:-3] if line.endswith(" ::") else line[:-1]
            literal_level = indent(line)
        out.append((line, False))
        i += 1
    # inline markup may span the lines of a paragraph: convert each run of non-literal lines at once
    text: list[str] = []
    run: list[str] = []
    for line, literal in out:
        if literal:
            if run:
                text.append(_rst_inline("\n".join(run)))
                run = []
            text.append(line)
        else:
            run.append(line)
    if run:
        text.append(_rst_inline("\n".join(run)))
    rendered = "\n".join(text)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(x.rstrip() for x in rendered.split("\n"))).strip("\n")


def cmake_passages() -> list[Passage]:
    """Passages of each manual in CMAKE_MANUALS and each release note in CMAKE_RELEASES; those that are mostly
    single-word lines are left out, as for the manual pages."""
    out: list[Passage] = []
    documents = [(f"manual/{m}.rst", m, "{}({}) manual".format(*m.split("."))) for m in CMAKE_MANUALS]
    documents += [(f"release/{v}.rst", f"release-{v}", f"CMake {v} Release Notes") for v in CMAKE_RELEASES]
    for file, key, title in documents:
        path = CMAKE_HELP / file
        if not path.exists():
            raise DatasetError(f"{path} is not installed (Debian's cmake-data package)")
        text = cmake_text(path.read_text(encoding="utf-8"))
        out.extend(p for p in split_passages(key, title, text) if not is_word_list(p.text))
    return out


def cmake_versions() -> dict[str, str]:
    """The Debian version of the cmake-data package the documentation comes from."""
    if shutil.which("dpkg-query") is None:
        raise DatasetError("dpkg-query is not installed: the cmake-data package's version cannot be recorded")
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "cmake-data"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout:
        raise DatasetError("the cmake-data package is not installed")
    return {"cmake-data": done.stdout}


def states(text: str, answer: str) -> bool:
    """Whether `text` holds `answer` literally: case-insensitive, any run of whitespace matching any other."""
    return " ".join(answer.lower().split()) in _flat(text)


@functools.lru_cache(maxsize=4096)
def _flat(text: str) -> str:
    return " ".join(text.lower().split())


def contains(text: str, answer: str) -> bool:
    """Whether `text` states `answer`: case-insensitive, or as the scorer tests an output (the normalised answer
    inside the normalised text), so that an answer quoting a distractor could never be scored correct."""
    a = normalize_answer(answer)
    return states(text, answer) or (bool(a) and a in _normalized(text))


@functools.lru_cache(maxsize=4096)
def _normalized(text: str) -> str:
    return normalize_answer(text)  # each passage is searched for every question's answers: normalise it once


def resolve(passages: Sequence[Passage], where: str, answer: str, question: str = "") -> Passage:
    """The passage `where` names: "<topic>#<index>", or "<topic>" for the first passage of that topic that
    states `answer` (other passages of the topic never serve as its distractors)."""
    if "#" in where:
        found = [p for p in passages if p.id == where]
    else:
        found = [p for p in passages if p.id.split("#")[0] == where and states(p.text, answer)]
    if not found:
        raise DatasetError(f"question {question!r}: no passage {where!r} states {answer!r}")
    return found[0]


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]
    gold: str  # passage id
    distractors: tuple[str, ...]  # passage ids, in the order cells take them


def build_questions(
    passages: Sequence[Passage], questions: Sequence[tuple[str, str, Sequence[str]]], seed: int, prefix: str
) -> list[Question]:
    """One question per (passage, question, answers) (`resolve` finds the passage), with MAX_DISTRACTORS
    passages of other topics that contain none of the answers, in a seeded random order (a cell of n
    documents shows the first n - 1). Raises on an answer its gold passage does not state, one too short to
    score, one the question gives away, and a repeated question."""
    rng = random.Random(seed)
    out: list[Question] = []
    seen: set[str] = set()
    for number, (where, question, answers) in enumerate(questions):
        if normalize_answer(question) in seen:
            raise DatasetError(f"question {question!r} is repeated (up to case and punctuation)")
        seen.add(normalize_answer(question))
        gold = resolve(passages, where, answers[0], question)
        for a in answers:
            # the scorer looks for the normalised answer inside the output: "j" or "**" would prove nothing
            if len(normalize_answer(a)) < 2:
                raise DatasetError(f"question {question!r}: answer {a!r} is too short to score")
            if contains(question, a):
                raise DatasetError(f"question {question!r}: gives its answer {a!r} away")
            if not states(gold.text, a):
                raise DatasetError(f"question {question!r}: passage {gold.id} does not state {a!r}")
        topic = gold.id.split("#")[0]
        pool = [
            p
            for p in passages
            if p.id.split("#")[0] != topic
            and estimate_tokens(p.text) <= MAX_DISTRACTOR_TOKENS
            and not any(contains(f"{p.title}\n{p.text}", a) for a in answers)
        ]
        if len(pool) < MAX_DISTRACTORS:
            raise DatasetError(f"question {question!r}: only {len(pool)} passages lack its answer")
        while True:  # seeded, so the same lists give the same draws
            drawn = rng.sample(pool, MAX_DISTRACTORS)
            if estimate_tokens(gold.text) + sum(estimate_tokens(p.text) for p in drawn) <= MAX_CELL_TOKENS:
                break
        distractors = tuple(p.id for p in drawn)
        out.append(Question(f"{prefix}-{number:03d}", question, tuple(answers), gold.id, distractors))
    return out


def to_item(q: Question, passages: dict[str, Passage]) -> QAItem:
    """The QA item of a question: gold passage first, then its distractors (`arrange` moves the gold one)."""
    docs = tuple({"title": passages[i].title, "text": passages[i].text} for i in (q.gold, *q.distractors))
    return QAItem(q.question, q.answers, docs, (0,), q.id, {"passage": q.gold, "type": "single-hop"})


def build(name: str) -> tuple[dict[str, Any], list[Passage], list[Question]]:
    """(header, passages, questions) of a set, from the installed sources and the question lists."""
    if name == "real":
        from lazyattn.eval.real_questions import QUESTIONS

        passages, seed = python_reference_passages(), 1
    elif name == "real-heldout":
        from lazyattn.eval.real_heldout_questions import QUESTIONS

        passages, seed = numpy_passages(), 2
    elif name == "real-heldout-readme":
        from lazyattn.eval.real_readme_questions import QUESTIONS

        passages, seed = readme_passages(), 4
    elif name == "real-heldout-man":
        from lazyattn.eval.real_man_questions import QUESTIONS

        passages, seed = man_passages(), 7
    elif name == "real-heldout-cmake":
        from lazyattn.eval.real_cmake_questions import QUESTIONS

        passages, seed = cmake_passages(), 11
    else:
        raise DatasetError(f"unknown real set {name!r}; choose from {', '.join(SETS)}")
    questions = build_questions(passages, QUESTIONS, seed, name)
    used = {i for q in questions for i in (q.gold, *q.distractors)}
    passages = [p for p in passages if p.id in used]
    header = {
        "name": name,
        **SOURCES[name],
        "passages": len(passages),
        "questions": len(questions),
        "token_estimate": "UTF-8 bytes / 4",
        "distractors_per_question": MAX_DISTRACTORS,
    }
    if name == "real-heldout-readme":
        header["packages"] = readme_versions()
    elif name == "real-heldout-man":
        header["packages"] = man_versions()
        header["rendering"] = " ".join(GROFF) + " (-man or -mdoc, -t where the page asks for tbl), LC_ALL=C"
    elif name == "real-heldout-cmake":
        header["packages"] = cmake_versions()
        header["rendering"] = "real.cmake_text (reStructuredText to plain text)"
    return header, passages, questions


def source_meta(header: dict[str, Any]) -> dict[str, Any]:
    """Where a set's passages come from, for reports."""
    return {k: header[k] for k in ("source", "license")}


def data_path(name: str) -> Path:
    return DATA_DIR / f"{name}.jsonl.gz"


def write(name: str, path: Path | None = None) -> Path:
    """The file: a header line, one line per passage {"passage", "title", "text"}, one per question
    {"id", "question", "answers", "gold", "distractors"} (passage ids)."""
    header, passages, questions = build(name)
    path = path or data_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"header": header}, ensure_ascii=False)]
    lines += [json.dumps({"passage": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) for p in passages]
    lines += [
        json.dumps(
            {
                "id": q.id,
                "question": q.question,
                "answers": list(q.answers),
                "gold": q.gold,
                "distractors": list(q.distractors),
            },
            ensure_ascii=False,
        )
        for q in questions
    ]
    # mtime=0: the same content gives the same bytes
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0))
    return path


def read(name: str) -> tuple[dict[str, Any], dict[str, Passage], list[Question]]:
    """(header, passages by id, questions) of a shipped set."""
    if name not in SETS:
        raise DatasetError(f"unknown real set {name!r}; choose from {', '.join(SETS)}")
    passages: dict[str, Passage] = {}
    questions: list[Question] = []
    with gzip.open(data_path(name), "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())["header"]
        for line in f:
            d = json.loads(line)
            if "passage" in d:
                passages[d["passage"]] = Passage(d["passage"], d["title"], d["text"])
            else:
                questions.append(
                    Question(d["id"], d["question"], tuple(d["answers"]), d["gold"], tuple(d["distractors"]))
                )
    return header, passages, questions


def load(name: str, limit: int | None = None) -> tuple[dict[str, Any], list[QAItem]]:
    """(header, the first `limit` questions as QA items) of a shipped set."""
    header, passages, questions = read(name)
    return header, [to_item(q, passages) for q in questions[:limit]]


if __name__ == "__main__":
    import sys

    for set_name in sys.argv[1:] or SETS:
        print(f"wrote {write(set_name)}")
