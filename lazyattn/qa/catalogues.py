"""Labelled texts from gettext translation catalogues (`locale/<code>/LC_MESSAGES/*.mo`), which Python packages with
a translated interface ship compiled: each message's English original and its translation, labelled with the
catalogue's language, a fact about the text. `builtin:icl-language` reads Django's (lazyattn/eval/icl_language.py),
`lazyattn finetune --few-shot sphinx-languages` Sphinx's in other languages (lazyattn/finetune/few_shot.py).
"""

from __future__ import annotations

import gettext
import re
from pathlib import Path

MIN_WORDS, MAX_WORDS = 4, 40
# placeholders ("%(value)s", "{name}"), markup and entities: not prose
_NOT_PROSE = re.compile(r"[%{}<>&]")


def prose(text: str, markup: re.Pattern[str] | None = None) -> str | None:
    """`text` on one line when it is a sentence-like message of MIN_WORDS..MAX_WORDS words, else None. `markup`: a
    package's own markup, left out too (Trac's messages mark their links "[1:text]")."""
    text = " ".join(text.split())
    if _NOT_PROSE.search(text) or (markup and markup.search(text)) or not MIN_WORDS <= len(text.split()) <= MAX_WORDS:
        return None
    return text


def catalogue(root: Path, code: str, package: str) -> dict[str, str]:
    """English original -> translation, over every catalogue of language `code` under `root` (an unpacked wheel of
    `package`: the folder holding `django/` for Django), in path order. Plural forms and messages with a context are
    left out (their keys are not plain strings)."""
    out: dict[str, str] = {}
    for path in sorted((root / package).glob(f"**/locale/{code}/LC_MESSAGES/*.mo")):
        with path.open("rb") as f:
            # GNUTranslations has no public way to list its messages; _catalog is the parsed .mo file
            for original, translated in gettext.GNUTranslations(f)._catalog.items():  # type: ignore[attr-defined]
                if isinstance(original, str) and original and "\x04" not in original and isinstance(translated, str):
                    out.setdefault(original, translated)
    return out


def messages(
    root: Path, languages: dict[str, str], package: str, markup: re.Pattern[str] | None = None
) -> dict[str, list[tuple[str, str]]]:
    """Per label, (English original, text) of every usable message: prose in both the original and the
    translation (`prose`, with the package's `markup`), and a translation that differs from the original, sorted. A
    text found under two labels (the same spelling in two languages) is left out, it tells nothing; a repeated one is
    kept once."""
    catalogues = {code: catalogue(root, code, package) for code in languages.values() if code != "en"}
    if not any(catalogues.values()):
        raise FileNotFoundError(f"{root}: no translation catalogues under {root / package}")
    originals = sorted({original for cat in catalogues.values() for original in cat})
    found: dict[str, list[tuple[str, str]]] = {label: [] for label in languages}
    for original in originals:
        english = prose(original, markup)
        if english is None:
            continue
        for label, code in languages.items():
            if code == "en":
                found[label].append((english, english))
            elif original in catalogues[code]:
                text = prose(catalogues[code][original], markup)
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
