"""The labelled texts of `builtin:icl-language` and `builtin:icl-language-more` (lazyattn/eval/icl.py): the messages
of Django's user interface in the language of their translation catalogue.

Django ships, for every language, the compiled gettext catalogues (`django/**/locale/<code>/LC_MESSAGES/*.mo`) of
its messages: the English original and its translation. The label of a text is the language of the catalogue it
comes from (the English original: "english"), a fact about the text. The frozen set needs no Django; rebuilding
it reads an unpacked wheel of the version in `DJANGO_VERSION`:

    pip download django==5.2.19 --no-deps -d wheels && unzip -q wheels/django-5.2.19-py3-none-any.whl -d django-5.2.19
    python -m lazyattn.eval.icl icl-language django-5.2.19
    python -m lazyattn.eval.icl icl-language-more django-5.2.19
"""

from __future__ import annotations

import gettext
import re
from pathlib import Path

DJANGO_VERSION = "5.2.19"
# label -> the catalogue's language code; "en" is the English original of every catalogue
LANGUAGES = {"english": "en", "french": "fr", "german": "de", "spanish": "es", "italian": "it"}
# builtin:icl-language-more: five other languages, none of the above, so that a setting chosen on one set is checked
# on labels (and label tokens) it was not chosen on
MORE_LANGUAGES = {"dutch": "nl", "portuguese": "pt", "swedish": "sv", "polish": "pl", "turkish": "tr"}
MIN_WORDS, MAX_WORDS = 4, 40
# placeholders ("%(value)s", "{name}"), markup and entities: not prose
_NOT_PROSE = re.compile(r"[%{}<>&]")

SOURCE = {
    "source": f"messages of Django {DJANGO_VERSION}'s translation catalogues, labelled with their language",
    "license": "BSD-3-Clause (the Django licence, LICENSE of the django distribution)",
    "copyright": "Copyright (c) Django Software Foundation and individual contributors. All rights reserved.",
}


def prose(text: str) -> str | None:
    """`text` on one line when it is a sentence-like message of MIN_WORDS..MAX_WORDS words, else None."""
    text = " ".join(text.split())
    if _NOT_PROSE.search(text) or not MIN_WORDS <= len(text.split()) <= MAX_WORDS:
        return None
    return text


def catalogue(root: Path, code: str, package: str = "django") -> dict[str, str]:
    """English original -> translation, over every catalogue of language `code` under `root` (an unpacked
    wheel of `package`: the folder holding `django/`), in path order. Plural forms and messages with a context are left
    out (their keys are not plain strings)."""
    out: dict[str, str] = {}
    for path in sorted((root / package).glob(f"**/locale/{code}/LC_MESSAGES/*.mo")):
        with path.open("rb") as f:
            # GNUTranslations has no public way to list its messages; _catalog is the parsed .mo file
            for original, translated in gettext.GNUTranslations(f)._catalog.items():  # type: ignore[attr-defined]
                if isinstance(original, str) and original and "\x04" not in original and isinstance(translated, str):
                    out.setdefault(original, translated)
    return out


def messages(
    root: Path, languages: dict[str, str] = LANGUAGES, package: str = "django"
) -> dict[str, list[tuple[str, str]]]:
    """Per label, (English original, text) of every usable message: prose in both the original and the
    translation, and a translation that differs from the original, sorted. A text found under two labels (the
    same spelling in two languages) is left out, it tells nothing; a repeated one is kept once."""
    catalogues = {code: catalogue(root, code, package) for code in languages.values() if code != "en"}
    if not any(catalogues.values()):
        raise FileNotFoundError(f"{root}: no translation catalogues under {root / package}")
    originals = sorted({original for cat in catalogues.values() for original in cat})
    found: dict[str, list[tuple[str, str]]] = {label: [] for label in languages}
    for original in originals:
        english = prose(original)
        if english is None:
            continue
        for label, code in languages.items():
            if code == "en":
                found[label].append((english, english))
            elif original in catalogues[code]:
                text = prose(catalogues[code][original])
                if text is not None and text != english:
                    found[label].append((english, text))
    labels_of: dict[str, set[str]] = {}
    for label, pairs in found.items():
        for _, text in pairs:
            labels_of.setdefault(text, set()).add(label)
    out: dict[str, list[tuple[str, str]]] = {}
    for label, pairs in found.items():
        kept = {t: (o, t) for o, t in reversed(pairs) if len(labels_of[t]) == 1}  # a repeated text: its first
        out[label] = sorted(kept.values())
    return out
