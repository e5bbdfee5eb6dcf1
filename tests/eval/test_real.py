"""The shipped realistic sets (lazyattn/eval/real.py): every answer in its gold passage and in no distractor of
any cell, passage lengths, sizes, no repeated questions; and the CLI loads them."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter

import pytest

from lazyattn.cli import main
from lazyattn.eval import real
from lazyattn.eval.metrics import accuracy, normalize_answer
from lazyattn.qa.dataset import DatasetError, arrange, read_jsonl

MIN_QUESTIONS = {
    "real": 300,
    "real-heldout": 100,
    "real-heldout-readme": 80,
    "real-heldout-man": 80,
    "real-heldout-cmake": 100,
}


def _shipped(name):
    if not real.data_path(name).exists():
        pytest.fail(f"{real.data_path(name)} is missing: run python -m lazyattn.eval.real {name}")
    return real.read(name)


@pytest.fixture(scope="module", params=real.SETS)
def shipped(request):
    return request.param, *_shipped(request.param)


def test_sizes_and_no_repeated_questions(shipped):
    name, header, passages, questions = shipped
    assert len(questions) >= MIN_QUESTIONS[name]
    assert header["questions"] == len(questions)
    texts = [normalize_answer(q.question) for q in questions]
    assert len(set(texts)) == len(texts)
    assert len({q.id for q in questions}) == len(questions)


def test_passage_lengths_within_100_to_1000_estimated_tokens(shipped):
    _, _, passages, _ = shipped
    lengths = [real.estimate_tokens(p.text) for p in passages.values()]
    assert min(lengths) >= 100 and max(lengths) <= 1000


def _states(doc, answers):
    """Independent of real.contains: lower-case substring (whitespace runs as one space) for each answer, and
    the scorer's own test (an output quoting the document would count as correct)."""
    flat = " ".join(doc["text"].lower().split())
    stated = [" ".join(a.lower().split()) in flat for a in answers]
    return stated, accuracy(f"{doc['title']}\n{doc['text']}", answers) == 1.0


def test_answer_in_gold_and_in_no_distractor_of_any_cell(shipped):
    _, _, passages, questions = shipped
    for q in questions:
        item = real.to_item(q, passages)
        assert len(item.documents) == real.MAX_DISTRACTORS + 1
        assert sum(real.estimate_tokens(d["text"]) for d in item.documents) <= real.MAX_CELL_TOKENS
        assert len(set(q.distractors)) == len(q.distractors) and q.gold not in q.distractors
        for a in q.answers:
            assert 1 <= len(a.split()) <= 5, (q.id, a)
        # every document a cell can show: the gold one states every answer, no distractor any
        stated, _ = _states(item.documents[0], q.answers)
        assert all(stated), (q.id, q.answers)
        for doc in item.documents[1:]:
            stated, scored = _states(doc, q.answers)
            assert not any(stated) and not scored, (q.id, q.answers, doc["title"])
        # and each cell shows the gold document where asked, the rest from those distractors
        for n in (5, 10, 20):
            for position, expected in (("first", 0), ("middle", (n - 1) // 2), ("last", n - 1)):
                cell = arrange(item, n, position)
                assert len(cell.documents) == n and cell.gold == (expected,)
                assert cell.documents[expected] == item.documents[0]
                others = [d for i, d in enumerate(cell.documents) if i != expected]
                assert others == list(item.documents[1:n])


@pytest.mark.parametrize("name", real.SETS)
def test_the_shipped_file_is_what_the_builder_makes_now(name):
    """The frozen data matches the question lists (passages can only be compared on the Python / NumPy / manual
    pages and groff they were cut from, so this compares questions, answers and gold passage texts)."""
    header, passages, questions = _shipped(name)
    try:
        _, built_passages, built = real.build(name)
    except DatasetError as e:  # another Python or NumPy version, no man pages / groff or no CMake help: sources differ
        pytest.skip(str(e))
    by_id = {p.id: p for p in built_passages}
    if any(by_id.get(q.gold) != passages[q.gold] for q in questions):
        pytest.skip("the installed sources differ from those the set was cut from")
    assert [(q.question, q.answers, q.gold, q.distractors) for q in questions] == [
        (q.question, q.answers, q.gold, q.distractors) for q in built
    ]


def test_readme_passages_come_from_the_listed_packages_with_their_licences_recorded():
    header, passages, questions = _shipped("real-heldout-readme")
    assert list(header["packages"]) == list(real.README_PACKAGES)
    assert {p.split("#")[0] for p in passages} <= set(real.README_PACKAGES)
    assert {q.gold.split("#")[0] for q in questions} == set(real.README_PACKAGES)  # every package asked about
    # the data README names each package with its licence and copyright line
    notes = (real.DATA_DIR / "README.md").read_text()
    for name in real.README_PACKAGES:
        row = next((line for line in notes.splitlines() if line.startswith(f"| `{name}` ")), None)
        assert row is not None and ("MIT" in row or "BSD-3-Clause" in row) and "Copyright" in row, name


def test_man_passages_come_from_the_listed_pages_with_their_licences_recorded():
    header, passages, questions = _shipped("real-heldout-man")
    pages = [page for page, _, _ in real.MAN_PAGES]
    packages = {package for _, _, package in real.MAN_PAGES}
    assert set(header["packages"]) == packages | {"groff-base"} and all(header["packages"].values())
    assert {p.split("#")[0] for p in passages} <= set(pages)
    asked = Counter(q.gold.split("#")[0] for q in questions)
    assert set(asked) == set(pages) and max(asked.values()) <= 15  # every page asked about, none dominating
    sections = {page: section for page, section, _ in real.MAN_PAGES}
    for p in passages.values():
        page = p.id.split("#")[0]
        assert p.title == f"{page}({sections[page]}) manual page"
        assert "\b" not in p.text and p.text.isascii()  # no overstrikes left by the renderer
        assert not real.is_word_list(p.text)
    # the data README names each page's package with its licence and copyright line
    notes = (real.DATA_DIR / "README.md").read_text()
    for package in packages:
        row = next((line for line in notes.splitlines() if line.startswith(f"| `{package}` ")), None)
        assert row is not None and header["packages"][package] in row and "opyright" in row, package


def test_man_cells_of_ten_documents_fit_smollm2_context():
    """Manual pages hold option names and paths: budget 1.4 SmolLM2 tokens per estimated token, and leave 1,024
    tokens of SmolLM2's 8,192 for the prompt and the answer."""
    _, passages, questions = _shipped("real-heldout-man")
    for q in questions:
        cell = [q.gold, *q.distractors[:9]]
        assert sum(real.estimate_tokens(passages[i].text) for i in cell) * 1.4 <= 8192 - 1024, q.id


@pytest.mark.parametrize(
    ("name", "docs", "position"), [("real-heldout-man", 10, "middle"), ("real-heldout-cmake", 5, "last")]
)
def test_cli_writes_the_held_out_set_cells(tmp_path, name, docs, position):
    """`lazyattn eval --dataset builtin:NAME` reads the shipped file: every question, with the gold passage where
    asked (slot 4 either way) among its first distractors."""
    _, passages, questions = _shipped(name)
    path = tmp_path / "cells.jsonl"
    args = ["eval", "--dataset", f"builtin:{name}", "--num-docs", str(docs), "--gold-position", position]
    assert main([*args, "--write-dataset", str(path)]) == 0
    items = read_jsonl(path)
    assert [i.question for i in items] == [q.question for q in questions]
    for item, q in zip(items, questions, strict=True):
        assert item.gold == (4,) and item.documents[4]["text"] == passages[q.gold].text
        assert [d["text"] for i, d in enumerate(item.documents) if i != 4] == [
            passages[d].text for d in q.distractors[: docs - 1]
        ]


def test_cmake_passages_come_from_the_listed_documents_with_their_licence_recorded():
    header, passages, questions = _shipped("real-heldout-cmake")
    documents = [*real.CMAKE_MANUALS, *(f"release-{v}" for v in real.CMAKE_RELEASES)]
    assert list(header["packages"]) == ["cmake-data"] and header["packages"]["cmake-data"]
    assert header["license"].startswith("BSD-3-Clause") and "Kitware" in header["copyright"]
    assert {p.split("#")[0] for p in passages} <= set(documents)
    asked = Counter(q.gold.split("#")[0] for q in questions)
    assert set(real.CMAKE_MANUALS) <= set(asked) and max(asked.values()) <= 12  # every manual asked about
    assert len(asked) >= 30  # spread over many documents
    for p in passages.values():
        assert not real.is_word_list(p.text)
        assert not any(m in p.text for m in (":command:`", ":variable:`", ":prop_tgt:`", ".. toctree::"))
    # the data README names the package with its version, licence and copyright line
    notes = (real.DATA_DIR / "README.md").read_text()
    row = next((line for line in notes.splitlines() if line.startswith("| `real-heldout-cmake.jsonl.gz` ")), None)
    assert row is not None and header["packages"]["cmake-data"] in row and "BSD-3-Clause" in row
    assert header["copyright"] in row


def test_cmake_cells_of_ten_documents_fit_smollm2_context():
    """CMake's prose holds option and variable names: the same budget as the manual pages."""
    _, passages, questions = _shipped("real-heldout-cmake")
    for q in questions:
        cell = [q.gold, *q.distractors[:9]]
        assert sum(real.estimate_tokens(passages[i].text) for i in cell) * 1.4 <= 8192 - 1024, q.id


def test_cmake_text_renders_restructuredtext_as_plain_text():
    rst = "\n".join(
        [
            ".. cmake-manual-description: A Manual",
            "",
            "tool(1)",
            "*******",
            "",
            ".. only:: html",
            "",
            "   .. contents::",
            "",
            "Options",
            "=======",
            "",
            ".. toctree::",
            "   :maxdepth: 1",
            "",
            "   /command/add_library",
            "",
            ".. include:: OPTIONS_BUILD.txt",
            "",
            ".. _`Tool Options`:",
            "",
            ".. option:: --fresh",
            "",
            " .. versionadded:: 3.24",
            "",
            " Uses the :command:`add_library` command, the :variable:`CMAKE_<LANG>_FLAGS <CMAKE_<LANG>_FLAGS>`",
            " variable, the :prop_tgt:`target property <TYPE>`, see `the guide <https://example.org>`_",
            " and ``-D <var>=<value>``; **strong** and *emphasis*. Example::",
            "",
            "   set(x `a` *b*)",
            "",
            ".. code-block:: cmake",
            "",
            "  add_library(``x``)",
            "",
            "Back to prose.",
        ]
    )
    assert real.cmake_text(rst) == "\n".join(
        [
            "tool(1)",
            "",
            "Options",
            "",
            "--fresh",
            "",
            " New in version 3.24.",
            "",
            " Uses the add_library command, the CMAKE_<LANG>_FLAGS",
            " variable, the target property, see the guide",
            " and -D <var>=<value>; strong and emphasis. Example:",
            "",
            "   set(x `a` *b*)",
            "",
            "  add_library(``x``)",
            "",
            "Back to prose.",
        ]
    )


def test_man_text_drops_header_footer_and_synopsis_and_dedents():
    rendered = "\n".join(
        [
            "TOOL(1)            General Commands Manual            TOOL(1)",
            "",
            "NAME",
            "       tool - does things",
            "",
            "SYNOPSIS",
            "       tool [-abc] [-f file]",
            "",
            "DESCRIPTION",
            "       tool reads a file.",
            "",
            "       -f file",
            "              Reads file.",
            "",
            "SEE ALSO",
            "       other(1)",
            "",
            "tool 1.0                  2024-01-01                      TOOL(1)",
            "",
        ]
    )
    assert real.man_text(rendered) == "\n".join(
        ["NAME", "tool - does things", "", "DESCRIPTION", "tool reads a file.", "", "-f file", "       Reads file."]
    )


def test_word_lists_are_told_from_prose():
    assert real.is_word_list("AddressFamily\nBatchMode\nBindAddress\n\nCiphers\nTCPKeepAlive to keep it")
    assert not real.is_word_list("-4      Forces ssh to use IPv4 addresses only.\nBatchMode\n-q      Quiet mode.")


def test_render_man_page_does_not_hyphenate_or_justify(tmp_path):
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    words = " ".join(["internationalization characteristically incomprehensibilities"] * 30)
    source = f".TH TOOL 1\n.SH DESCRIPTION\n.hy\n.ad b\n{words}\n"
    page = tmp_path / "tool.1.gz"
    page.write_bytes(gzip.compress(source.encode()))
    lines = real.render_man_page(page).splitlines()
    body = [line.strip() for line in lines[1:-1] if line.strip() and line.strip() != "DESCRIPTION"]
    assert len(body) > 5 and all(len(line) <= 100 for line in lines)
    assert not any(line.endswith("-") for line in body)  # the page asks for hyphenation: none happens
    assert not any("  " in line for line in body)  # nor justification (it would pad lines with spaces)
    assert " ".join(" ".join(body).split()) == words


def test_builder_rejects_bad_questions():
    ps = [
        real.Passage("a#0", "A", "The frobnicate keyword starts block number one. " * 20),
        *[real.Passage(f"d{i}#0", "D", f"Other text number {i}. " * 30) for i in range(real.MAX_DISTRACTORS)],
    ]
    (q,) = real.build_questions(ps, [("a", "Which keyword starts a block?", ["frobnicate"])], 0, "t")
    assert q.gold == "a#0" and set(q.distractors) == {f"d{i}#0" for i in range(real.MAX_DISTRACTORS)}
    bad = [
        ("a", "Which keyword is missing?", ["absent"]),  # not in the gold passage
        ("a", "Which frobnicate keyword?", ["frobnicate"]),  # the question gives it away
        ("a", "Which letter?", ["k"]),  # too short to score
        ("a", "Which word do all passages share?", ["number"]),  # no passage is left to distract
    ]
    for entry in bad:
        with pytest.raises(DatasetError):
            real.build_questions(ps, [entry], 0, "t")
    with pytest.raises(DatasetError, match="repeated"):
        real.build_questions(ps, [("a", "Q?", ["frobnicate"])] * 2, 0, "t")


def test_split_passages_respects_the_token_bounds():
    text = "\n\n".join(f"Paragraph {i} " + "word " * (20 + 13 * (i % 7)) for i in range(40))
    ps = real.split_passages("t", "T", text)
    assert len(ps) > 3
    assert all(real.MIN_TOKENS <= real.estimate_tokens(p.text) <= real.MAX_TOKENS for p in ps)
    assert " ".join(p.text for p in ps).split() == text.split()  # nothing lost, order kept


def test_estimate_tokens_is_bytes_over_four():
    assert real.estimate_tokens("abcd") == 1 and real.estimate_tokens("abcde") == 2
    assert real.estimate_tokens("é" * 4) == 2  # two bytes each
