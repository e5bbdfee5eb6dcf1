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

from pathlib import Path

from lazyattn.qa import catalogues

DJANGO_VERSION = "5.2.19"
# label -> the catalogue's language code; "en" is the English original of every catalogue
LANGUAGES = {"english": "en", "french": "fr", "german": "de", "spanish": "es", "italian": "it"}
# builtin:icl-language-more: five other languages, none of the above, so that a setting chosen on one set is checked
# on labels (and label tokens) it was not chosen on
MORE_LANGUAGES = {"dutch": "nl", "portuguese": "pt", "swedish": "sv", "polish": "pl", "turkish": "tr"}
SOURCE = {
    "source": f"messages of Django {DJANGO_VERSION}'s translation catalogues, labelled with their language",
    "license": "BSD-3-Clause (the Django licence, LICENSE of the django distribution)",
    "copyright": "Copyright (c) Django Software Foundation and individual contributors. All rights reserved.",
}


def messages(root: Path, languages: dict[str, str] = LANGUAGES) -> dict[str, list[tuple[str, str]]]:
    """Per label, (English original, text) of every usable message of Django's catalogues under `root` (an unpacked
    Django wheel): `catalogues.messages`."""
    return catalogues.messages(root, languages, "django")
