"""The labelled texts of `builtin:icl-language` and `builtin:icl-language-more` (lazyattn/eval/icl.py): the messages
of Django's user interface in the language of their translation catalogue; and of `builtin:icl-language-heldout` and
`builtin:icl-language-heldout-wagtail`: the messages of Trac's (an issue tracker and wiki) and of Wagtail's (a content
management system) in five more languages each, for final reporting only.

Django, Trac and Wagtail ship, for every language, the compiled gettext catalogues
(`<package>/**/locale/<code>/LC_MESSAGES/*.mo`) of their messages: the English original and its translation. The
label of a text is the language of the catalogue it comes from (the English original: "english"), a fact about the
text. The frozen sets need none of the packages; rebuilding one reads an unpacked wheel of the version in
`DJANGO.version`, `TRAC.version` or `WAGTAIL.version`:

    pip download django==5.2.19 --no-deps -d wheels && unzip -q wheels/django-5.2.19-py3-none-any.whl -d django-5.2.19
    python -m lazyattn.eval.icl icl-language django-5.2.19
    python -m lazyattn.eval.icl icl-language-more django-5.2.19
    pip download trac==1.6 --no-deps -d wheels && unzip -q wheels/Trac-1.6-py3-none-any.whl -d trac-1.6
    python -m lazyattn.eval.icl icl-language-heldout trac-1.6
    pip download wagtail==8.0.1 --no-deps -d wheels && unzip -q wheels/wagtail-8.0.1-py3-none-any.whl -d wagtail-8.0.1
    python -m lazyattn.eval.icl icl-language-heldout-wagtail wagtail-8.0.1
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lazyattn.qa import catalogues


@dataclass(frozen=True)
class Catalogues:
    """Where a language set's messages come from: the package whose catalogues hold them (the folder of its unpacked
    wheel), its version, the source, licence and copyright a set's header records, and the package's own markup,
    whose messages are left out (`catalogues.prose`)."""

    package: str
    version: str
    source: dict[str, str]
    markup: re.Pattern[str] | None = None

    @staticmethod
    def of(
        name: str, package: str, version: str, licence: str, copyright: str, markup: str | None = None
    ) -> Catalogues:
        """The catalogues of `package` (`name` as a header names it) at `version`, under `licence`."""
        return Catalogues(
            package,
            version,
            {
                "source": f"messages of {name} {version}'s translation catalogues, labelled with their language",
                "license": licence,
                "copyright": copyright,
            },
            re.compile(markup) if markup else None,
        )


# label -> the catalogue's language code; "en" is the English original of every catalogue
LANGUAGES = {"english": "en", "french": "fr", "german": "de", "spanish": "es", "italian": "it"}
# builtin:icl-language-more: five other languages, none of the above, so that a setting chosen on one set is checked
# on labels (and label tokens) it was not chosen on
MORE_LANGUAGES = {"dutch": "nl", "portuguese": "pt", "swedish": "sv", "polish": "pl", "turkish": "tr"}
DJANGO = Catalogues.of(
    "Django",
    "django",
    "5.2.19",
    "BSD-3-Clause (the Django licence, LICENSE of the django distribution)",
    "Copyright (c) Django Software Foundation and individual contributors. All rights reserved.",
)
# builtin:icl-language-heldout: the five languages of Trac's catalogues with the most usable messages that no other
# set uses (none of the above, nor the training texts of lazyattn/finetune/few_shot.py), and no English: built after
# every few-shot setting was chosen, to check the way a setting is picked (docs/quality.md), not to pick one
HELDOUT_LANGUAGES = {"slovenian": "sl", "norwegian": "nb", "hungarian": "hu", "finnish": "fi", "czech": "cs"}
TRAC = Catalogues.of(
    "Trac",
    "trac",
    "1.6",
    "BSD-3-Clause (the Trac licence, COPYING of the Trac distribution)",
    "Copyright (C) 2003-2023 Edgewall Software. All rights reserved.",
    markup=r"[\[\]]",  # "[1:Note:] See [2:TracQuery]", "[edit|preview]": links and placeholders
)
# builtin:icl-language-heldout-wagtail: the same rule over Wagtail's catalogues (a content management system's
# interface), five languages that no set above and no training text uses; built once the grid of candidates that
# `lazyattn eval --pick-on` is shown (docs/quality.md) had its last change, to decide it
WAGTAIL_LANGUAGES = {"romanian": "ro", "arabic": "ar", "icelandic": "is_IS", "uyghur": "ug", "tetum": "tet"}
WAGTAIL = Catalogues.of(
    "Wagtail",
    "wagtail",
    "8.0.1",
    "BSD-3-Clause (the Wagtail licence, LICENSE of the wagtail distribution)",
    "Copyright (c) 2014-present Torchbox Ltd and individual contributors. All rights reserved.",
)


def messages(
    root: Path, languages: dict[str, str] = LANGUAGES, source: Catalogues = DJANGO
) -> dict[str, list[tuple[str, str]]]:
    """Per label, (English original, text) of every usable message of `source`'s catalogues under `root` (an unpacked
    wheel of it): `catalogues.messages`."""
    return catalogues.messages(root, languages, source.package, source.markup)
