"""The builtin:icl-language sets (lazyattn/eval/icl.py, icl_language.py): the messages read from Django's, Trac's and
Wagtail's catalogues, each shipped set balanced and its labels confirmed by the texts' own function words, the
plain-text prompt with one segment per demonstration, and a run through the CLI on the tiny model."""

from __future__ import annotations

import json
import random
import re
import struct
from collections import Counter
from pathlib import Path

import pytest

from lazyattn.cli import main
from lazyattn.engine.prompt import PromptLayout, encode_document, render_completion
from lazyattn.eval import icl, icl_language
from lazyattn.eval.metrics import first_label, label_accuracy
from lazyattn.model.tokenizer import load_tokenizer
from lazyattn.qa import catalogues

SET = icl.LANGUAGE
LABELS = {
    "icl-language": ("english", "french", "german", "spanish", "italian"),
    "icl-language-more": ("dutch", "portuguese", "swedish", "polish", "turkish"),
    "icl-language-heldout": ("slovenian", "norwegian", "hungarian", "finnish", "czech"),
    "icl-language-heldout-wagtail": ("romanian", "arabic", "icelandic", "uyghur", "tetum"),
}
SETS = [icl.LANGUAGE, icl.MORE_LANGUAGES, icl.HELDOUT_LANGUAGES, icl.WAGTAIL_LANGUAGES]
SOURCES = {
    "icl-language": icl_language.DJANGO,
    "icl-language-more": icl_language.DJANGO,
    "icl-language-heldout": icl_language.TRAC,
    "icl-language-heldout-wagtail": icl_language.WAGTAIL,
}

# Function words no two of a set's languages share: an independent check of a label, where a text has any.
FUNCTION_WORDS = {
    "icl-language": {
        "english": "the and of to is are this that with for you your not has have was were can please enter",
        "french": "les du une et est sont cette pour vous votre pas ne avec été sur",
        "german": "der die das den dem ein eine einen und ist sind nicht sie bitte mit für wurde zu von",
        "spanish": "el los las y es son para por su este esta",
        "italian": "il lo gli di della e è sono che per non questo questa",
    },
    "icl-language-more": {
        "dutch": "het een van zijn niet voor met deze dit uw wordt worden is geen bij je op uit moet geldige voer",
        "portuguese": "os um uma da dos das não para com por seu sua este esta é ao e em foi está introduza válido "
        "válida válidos válidas",
        "swedish": "och att är för som det inte på av till eller ett har kan fyll giltig giltiga måste ingen vara "
        "värde värden skickades",
        "polish": "nie jest się dla lub oraz został być który która w z proszę poprawny poprawną wpisz wartości",
        "turkish": "bir ve bu için ile değil olarak lütfen veya geçerli girin alanı değer değeri sayısal olamaz hata",
    },
    "icl-language-heldout": {
        "slovenian": "ni ali ste ki če hočete lahko mogoče prepričani zbrisati ne mora so pri brez vseh tej tem bo",
        "norwegian": "til å kan og denne dette du har ikke vil av at er en som blitt fra ved eller være i under hvert",
        "hungarian": "az nem egy nincs kell és vagy már ezt lehet mint erre ettől majd ki",
        "finnish": "ei on ole ja olla jo tai tämän eivät tulee voi haluatko tämä jossa että joka ilman kanssa uusi",
        "czech": "byly být opravdu chcete smazat pro vaše musí nebo může tento tuto již není ve jste ještě "
        "nejsou která které byla bylo",
    },
    "icl-language-heldout-wagtail": {
        "romanian": "de în pentru nu și sau fost este să un o cu din care acest această au fi dvs pe vor poate",
        "arabic": "في من على هذه هذا لا أن التي الذي إلى عن أو تم",
        "icelandic": "að og er í við ekki þessa þessi fyrir eða með á um til sem þú hefur verður var",
        "uyghur": "بۇ ئۈچۈن بىلەن ۋە ئەگەر ياكى بولسا قىلىش",
        "tetum": "ka iha sira hosi ida ho atu ita boot nia ne hodi ba ne'e",
    },
}


@pytest.fixture(scope="module", params=SETS, ids=lambda s: s.name)
def language_set(request):
    return request.param


@pytest.fixture(scope="module")
def shipped(language_set):
    if not language_set.data_path.exists():
        pytest.fail(f"{language_set.data_path} is missing: see lazyattn/eval/icl_language.py")
    return icl.read(language_set)


def test_sizes_labels_and_no_overlap(shipped, language_set):
    header, demos, questions = shipped
    labels = tuple(header["labels"])
    assert labels == language_set.labels == LABELS[language_set.name]
    assert header["questions"] == len(questions) == len(labels) * icl.TESTS_PER_LABEL
    assert Counter(d.label for d in demos.values()) == {label: icl.DEMOS_PER_LABEL for label in labels}
    assert Counter(q.example.label for q in questions) == {label: icl.TESTS_PER_LABEL for label in labels}
    assert [q.example.label for q in questions[: len(labels)]] == list(labels)  # interleaved for --limit
    texts = [q.example.text for q in questions] + [d.text for d in demos.values()]
    assert len(set(texts)) == len(texts)
    # a test input is never a translation of a demonstration, nor are two demonstrations one message
    demo_sources = [d.source for d in demos.values()]
    assert len(set(demo_sources)) == len(demo_sources)
    assert not {q.example.source for q in questions} & set(demo_sources)
    for e in [q.example for q in questions] + list(demos.values()):
        assert catalogues.prose(e.text) == e.text
        # the source is the English original: the English text itself, never a translation's own text
        assert (e.text == e.source) == (e.label == "english")


def test_labels_agree_with_the_texts_function_words(shipped, language_set):
    _, demos, questions = shipped
    words = {label: set(w.split()) for label, w in FUNCTION_WORDS[language_set.name].items()}
    agree = 0
    for e in [q.example for q in questions] + list(demos.values()):
        tokens = re.findall(r"\w+", e.text.lower())
        score = {label: sum(t in ws for t in tokens) for label, ws in words.items()}
        assert all(score[e.label] >= s for s in score.values()), (e.label, score, e.text)  # never contradicted
        agree += score[e.label] > max(s for label, s in score.items() if label != e.label)
    assert agree >= 0.75 * (len(questions) + len(demos))  # the others have no function word of the lists


def test_orders_are_balanced_and_reproducible_from_the_seed(shipped, language_set):
    _, demos, questions = shipped
    labels, seed = language_set.labels, language_set.seed
    by_label: dict[str, list[icl.Example]] = {}
    for d in demos.values():
        by_label.setdefault(d.label, []).append(d)
    for q in questions:
        assert sorted(q.order) == sorted(demos)
        assert Counter(demos[i].label for i in q.order[: len(labels)]) == dict.fromkeys(labels, 1)
    for q in questions[:20]:
        assert icl.shuffled_order(by_label, random.Random(f"{seed}:{q.example.id}")) == q.order
    assert len({q.order for q in questions}) == len(questions)


def _write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU .mo catalogue (the format msgfmt writes: header, two tables of (length, offset), the strings)."""
    keys = sorted(messages)
    ids = [k.encode() for k in keys]
    strs = [messages[k].encode() for k in keys]
    start = 7 * 4 + 16 * len(keys)
    table, data = [], b""
    for s in ids + strs:
        table.append((len(s), start + len(data)))
        data += s + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"".join(struct.pack("<2I", n, o) for n, o in table) + data)


def _fake_package(
    root: Path, n: int, codes: tuple[str, ...] = ("fr", "de", "es", "it"), package: str = "django"
) -> None:
    """Two apps' catalogues per language: n messages each, with a placeholder, a plural, a too-short message, an
    untranslated one and one in Trac's link markup that must all be left out (the last one: where the package's
    markup is known)."""
    for code in codes:
        for app in ("contrib/admin", "forms"):
            messages = {"": "Content-Type: text/plain; charset=UTF-8\n"}
            for i in range(n):
                messages[f"{app} message number {i} is here"] = f"{code} {app} translated text {i} ok"
            messages["Enter %(value)s please now"] = f"{code} %(value)s ok ok"
            messages["One item selected here\x00Many items selected here"] = f"{code} one\x00{code} many"
            messages["Too short"] = f"{code} court"
            messages["Same in every language here"] = "Same in every language here"
            messages["[1:Note:] See [2:TracGuide] for help"] = f"[1:{code} note:] {code} [2:TracGuide] help ok"
            _write_mo(root / package / app / "locale" / code / "LC_MESSAGES" / "messages.mo", messages)


def test_messages_are_read_from_the_catalogues(tmp_path):
    _fake_package(tmp_path, 3)
    found = icl_language.messages(tmp_path)
    assert sorted(found) == sorted(icl_language.LANGUAGES)
    for label, pairs in found.items():
        code = icl_language.LANGUAGES[label]
        # 3 per app; the placeholder, the plural and the short one left out, the untranslated one but in English;
        # Django's markup is not Trac's: its bracketed message is prose here
        assert len(pairs) == (8 if code == "en" else 7), label
        for original, text in pairs:
            if code == "en":
                assert text == original
            else:
                assert text.startswith((f"{code} ", f"[1:{code} ")) and original.endswith(("is here", "for help"))
    with pytest.raises(FileNotFoundError):
        icl_language.messages(tmp_path / "missing")


def test_trac_messages_leave_its_link_markup_out(tmp_path):
    _fake_package(tmp_path, 3, ("sl", "cs"), package="trac")
    found = icl_language.messages(tmp_path, {"slovenian": "sl", "czech": "cs"}, icl_language.TRAC)
    assert {label: len(pairs) for label, pairs in found.items()} == {"slovenian": 6, "czech": 6}
    assert not any("[" in text or "[" in original for pairs in found.values() for original, text in pairs)
    with pytest.raises(FileNotFoundError):
        icl_language.messages(tmp_path, {"slovenian": "sl"})  # Django's catalogues: none under this root


def test_the_build_is_deterministic_balanced_and_keeps_translations_apart(tmp_path, language_set):
    languages = language_set.details["languages"]
    package = next(k for k in language_set.details if k != "languages")  # the source's version is under its name
    codes = tuple(c for c in languages.values() if c != "en")
    _fake_package(tmp_path, 40, codes, package)  # 80 messages per language
    first, second = icl.build(language_set, tmp_path), icl.build(language_set, tmp_path)
    assert first == second
    header, demos, questions = first
    assert Counter(q.example.label for q in questions) == dict.fromkeys(language_set.labels, icl.TESTS_PER_LABEL)
    assert Counter(d.label for d in demos) == dict.fromkeys(language_set.labels, icl.DEMOS_PER_LABEL)
    demo_sources = {d.source for d in demos}
    assert len(demo_sources) == len(demos) and not demo_sources & {q.example.source for q in questions}
    source = SOURCES[language_set.name]
    assert header[package] == source.version and header["languages"] == languages
    assert {k: header[k] for k in source.source} == source.source


def test_the_shipped_file_is_what_the_builder_makes_from_the_package(shipped, language_set):
    source = SOURCES[language_set.name]
    # rebuilt from the installed package where it is the shipped version
    package = pytest.importorskip(source.package)
    if package.__version__ != source.version:
        pytest.skip(f"{source.package} {package.__version__} installed, the set is cut from {source.version}")
    root = Path(package.__file__).parent.parent
    header, demos, questions = shipped
    built_header, built_demos, built = icl.build(language_set, root)
    assert built_header == header and built == questions and built_demos == list(demos.values())


def test_the_prompt_is_plain_text_with_each_demonstration_its_own_segment(shipped, language_set):
    _, demos, questions = shipped
    tokenizer = load_tokenizer("tiny")
    layout = PromptLayout(**language_set.layout)
    _, items = icl.load(limit=2, s=language_set)
    for item, q in zip(items, questions):
        assert item.question == f"Text: {q.example.text}\nLanguage:"  # a demonstration without its label
        assert [d["text"] for d in item.documents] == [
            f"Text: {demos[i].text}\nLanguage: {demos[i].label}" for i in q.order
        ]
        rendered = render_completion(tokenizer, item.question, item.documents, layout)
        assert rendered.segments[1:] == [encode_document(tokenizer, d, layout) for d in item.documents]
        assert tokenizer.decode(rendered.segments[0]).strip() == layout.completion_system_prompt.strip()
        assert tokenizer.decode(rendered.final) == item.question


@pytest.mark.parametrize(
    "output, expected",
    [("french", "french"), ("german\n\n Text", "german"), (" Italian.", "italian"), ("españ", None), ("", None)],
)
def test_the_completion_is_scored_by_its_first_label(output, expected):
    assert first_label(output, SET.labels) == expected
    assert label_accuracy(output, [expected or "english"], SET.labels) == float(expected is not None)


ARGS = ["eval", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--max-tokens", "3", "--no-progress"]


@pytest.mark.parametrize("s", SETS, ids=lambda s: s.name)
def test_a_few_shot_run_through_the_cli_is_plain_text(tmp_path, s):
    code = main(
        ARGS
        + ["--dataset", f"builtin:{s.name}", "--limit", "3", "--num-docs", "5,10"]
        + ["--modes", "full,lazy", "--out", str(tmp_path)]
    )
    assert code == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["dataset"]["builtin"] == s.name and data["meta"]["plain_prompt"] is True
    assert data["meta"]["layout"]["completion_system_prompt"] == s.layout["completion_system_prompt"]
    _, items = icl.load(limit=3, s=s)
    answers = {i.id: i.answers for i in items}
    by_run = {(c["run"], c["num_docs"]): c for c in data["cells"]}
    assert set(by_run) == {(r, n) for r in ("full", "lazy") for n in (5, 10)}
    for c in data["cells"]:
        for r in c["items"]:
            assert r["accuracy"] == label_accuracy(r["output"], answers[r["id"]], s.labels)
    assert by_run[("lazy", 10)]["cached_tokens_mean"] > 0 and by_run[("full", 10)]["cached_tokens_mean"] == 0
    diffs = [c["accuracy_diff"] for c in data["comparisons"]]  # the one run compared: the closest, its worst cell
    assert data["closest"] == {"run": "lazy", "baseline": "full", "worst": min(diffs), "mean": sum(diffs) / len(diffs)}


def test_a_plain_prompt_is_not_for_fidelity_runs(capsys):
    assert main(ARGS + ["--dataset", "builtin:icl-language", "--limit", "1", "--fidelity", "--plain-prompt"]) == 2
    assert "--plain-prompt is for accuracy and calibration runs only" in capsys.readouterr().err
