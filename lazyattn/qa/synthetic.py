"""The built-in evaluation set: short fact documents about fictional people, towns and companies.

Nothing can be downloaded where lazyattn is tested, and a model must not answer from memory, so questions
are about entities invented here: names are built from syllables ("Velmora Quistan", "Ostrabeck",
"Darnel Holdings"). Each item is made from its own random stream (split, seed, index):

- **single-hop**: one gold document about an entity holds the answer ("In which town was Velmora Quistan
  born?"); the distractors are documents about other entities *of the same type*, stating the same
  relations with different values.
- **two-hop**: two gold documents, in reasoning order: the first links the entity to a second one, whose
  document holds the answer ("In which country was Velmora Quistan born?" needs her birthplace, then the
  town's country). Distractors are other such chains, of the same two types.

Every value in an item (names, years, occupations, industries) is distinct, so an answer appears in the gold
documents and in no distractor. Documents are one or two sentences (~25 tokens), so ten of them stay a
small prompt.

Splits: every proper name belongs to exactly one split, by a hash bit of the name, and each split draws only
its own names. An "eval" item and a "train" item therefore never share an entity, hence never a document or
a question, whatever the seeds (fine-tuning data drawn with split="train" cannot leak into evaluation).

Items are generated with all gold documents first and distractors after, then `arrange`d: the distractors
are drawn one after another from the item's stream, so fewer documents show a prefix of the same
distractors, and the gold positions (first / middle / last) differ only in where the gold block sits.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lazyattn.qa.dataset import DatasetError, QAItem, arrange

SPLITS = ("eval", "train")
# Named sizes of the built-in set (questions); `lazyattn eval --dataset builtin:medium`.
SIZES = {"small": 60, "medium": 300, "large": 1500}
MAX_DOCS = 20  # value pools below hold enough distinct occupations/industries for this many entities
DEFAULT_HOPS = (1, 1, 2)  # item i is single- or two-hop by hops[i % len(hops)]: two single-hop, one two-hop

# Plain syllables: names should read like names (and tokenise like them), not like noise.
_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "z"]
_VOWELS = ["a", "a", "e", "e", "i", "o", "o", "u", "ai", "ea"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "nd"]
_SURNAME_ENDS = ["", "ton", "er", "ick", "ova", "ane", "el"]
_TOWN_ENDS = ["beck", "mere", "ford", "holm", "vale", "wick", "stead", "port", "burg", "moor"]
_COUNTRY_ENDS = ["ia", "ara", "land", "ora", "esh", "any"]
_COMPANY_ENDS = ["Group", "Holdings", "Works", "Partners", "Company", "Industries"]
_OCCUPATIONS = [
    "painter",
    "sculptor",
    "chemist",
    "architect",
    "surgeon",
    "cartographer",
    "violinist",
    "botanist",
    "astronomer",
    "engineer",
    "poet",
    "lawyer",
    "historian",
    "geologist",
    "pilot",
    "baker",
    "jeweller",
    "linguist",
    "photographer",
    "economist",
    "pharmacist",
    "carpenter",
    "novelist",
    "veterinarian",
]
_INDUSTRIES = [
    "shipbuilding",
    "glassmaking",
    "software",
    "textile",
    "brewing",
    "mining",
    "printing",
    "pottery",
    "clockmaking",
    "paper",
    "furniture",
    "steel",
    "chocolate",
    "perfume",
    "insurance",
    "railway",
    "fishing",
    "tea",
    "shoemaking",
    "toy",
    "publishing",
    "telescope",
]


def split_of(name: str) -> str:
    """The split a proper name belongs to (a fixed hash bit: the same in every process and version)."""
    return SPLITS[hashlib.sha256(name.lower().encode()).digest()[0] & 1]


class _Pools:
    """One item's random stream and the values it has used (everything in an item is distinct)."""

    def __init__(self, rng: random.Random, split: str) -> None:
        self.rng, self.split = rng, split
        self.names: list[str] = []
        self.years: set[int] = set()
        self.words: set[str] = set()

    def _syllable(self) -> str:
        return self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)

    def name(self, make: Callable[[], str]) -> str:
        """A name of this split, not equal to, inside, or containing any name already used in the item
        (so that "answer contained in the output" cannot be met by another entity's name)."""
        while True:
            name = make()
            low = name.lower()
            if split_of(name) == self.split and not any(low in n.lower() or n.lower() in low for n in self.names):
                self.names.append(name)
                return name

    def person_name(self) -> str:
        def make() -> str:
            first = (self._syllable() + self._syllable() + self.rng.choice(["", "a", "o"])).capitalize()
            last = (self._syllable() + self._syllable() + self.rng.choice(_SURNAME_ENDS)).capitalize()
            return f"{first} {last}"

        return self.name(make)

    def town_name(self) -> str:
        return self.name(lambda: (self._syllable() + self.rng.choice(_TOWN_ENDS)).capitalize())

    def country_name(self) -> str:
        return self.name(lambda: (self._syllable() + self._syllable() + self.rng.choice(_COUNTRY_ENDS)).capitalize())

    def river_name(self) -> str:
        return self.name(lambda: (self._syllable() + self._syllable()).capitalize())

    def company_name(self) -> str:
        return self.name(
            lambda: f"{(self._syllable() + self._syllable()).capitalize()} {self.rng.choice(_COMPANY_ENDS)}"
        )

    def year(self, low: int, high: int) -> str:
        while (y := self.rng.randint(low, high)) in self.years:
            pass
        self.years.add(y)
        return str(y)

    def word(self, pool: Sequence[str]) -> str:
        choice = self.rng.choice([w for w in pool if w not in self.words])
        self.words.add(choice)
        return choice


# -- entities: each one document; `facts` maps a relation to its value -------------------------------------


@dataclass(frozen=True)
class _Entity:
    kind: str  # "person", "town", "company"
    name: str
    text: str
    facts: dict[str, str]

    def document(self) -> dict[str, str]:
        return {"title": self.name, "text": self.text}


def _person(p: _Pools, town: str | None = None, company: str | None = None) -> _Entity:
    name = p.person_name()
    facts = {
        "occupation": p.word(_OCCUPATIONS),
        "birthplace": town or p.town_name(),
        "birth_year": p.year(1820, 1995),
        "employer": company or p.company_name(),
    }
    first = name.split()[0]
    article = "an" if facts["occupation"][0] in "aeiou" else "a"
    text = (
        f"{name} is {article} {facts['occupation']} who was born in {facts['birthplace']} in "
        f"{facts['birth_year']}. {first} works for {facts['employer']}."
    )
    return _Entity("person", name, text, facts)


def _town(p: _Pools, name: str | None = None) -> _Entity:
    name = name or p.town_name()
    facts = {"country": p.country_name(), "river": p.river_name(), "founded": p.year(1100, 1850)}
    text = (
        f"{name} is a town in {facts['country']} on the river {facts['river']}. It was founded in {facts['founded']}."
    )
    return _Entity("town", name, text, facts)


def _company(p: _Pools, name: str | None = None, founder: str | None = None, town: str | None = None) -> _Entity:
    name = name or p.company_name()
    industry = p.word(_INDUSTRIES)
    facts = {
        "industry": industry,
        "headquarters": town or p.town_name(),
        "founder": founder or p.person_name(),
        "founded": p.year(1850, 2015),
    }
    text = (
        f"{name} is a {industry} company headquartered in {facts['headquarters']}. It was founded by "
        f"{facts['founder']} in {facts['founded']}."
    )
    return _Entity("company", name, text, facts)


_MAKE = {"person": _person, "town": _town, "company": _company}

# Single hop: (entity kind, relation, question).
_SINGLE = [
    ("person", "birthplace", "In which town was {name} born?"),
    ("person", "birth_year", "In which year was {name} born?"),
    ("person", "employer", "Which company does {name} work for?"),
    ("person", "occupation", "What is the occupation of {name}?"),
    ("town", "country", "In which country is {name}?"),
    ("town", "river", "On which river is {name}?"),
    ("town", "founded", "In which year was {name} founded?"),
    ("company", "headquarters", "In which town is {name} headquartered?"),
    ("company", "founder", "Who founded {name}?"),
    ("company", "founded", "In which year was {name} founded?"),
    ("company", "industry", "In which industry is {name}?"),
]
# Two hops: (first kind, its relation naming the second entity, second kind, the answer's relation, question).
_TWO_HOP = [
    ("person", "birthplace", "town", "country", "In which country was {name} born?"),
    ("person", "birthplace", "town", "river", "On which river is the town where {name} was born?"),
    ("person", "employer", "company", "founder", "Who founded the company that {name} works for?"),
    ("person", "employer", "company", "headquarters", "In which town is the company {name} works for headquartered?"),
    ("company", "founder", "person", "birthplace", "In which town was the founder of {name} born?"),
    ("company", "headquarters", "town", "country", "In which country is {name} headquartered?"),
]


def _chain(p: _Pools, first: str, link: str, second: str) -> tuple[_Entity, _Entity]:
    """Two entities of kinds `first` and `second`, the first's `link` relation naming the second."""
    target = _MAKE[second](p)
    head = {
        "birthplace": lambda: _person(p, town=target.name),
        "employer": lambda: _person(p, company=target.name),
        "founder": lambda: _company(p, founder=target.name),
        "headquarters": lambda: _company(p, town=target.name),
    }[link]()
    assert head.kind == first
    return head, target


def _item(split: str, seed: int, index: int, num_docs: int, hops: int) -> QAItem:
    rng = random.Random(f"lazyattn-synthetic/{split}/{seed}/{index}")  # str seeds hash stably (sha512)
    p = _Pools(rng, split)
    if hops == 1:
        kind, relation, question = rng.choice(_SINGLE)
        gold = [_MAKE[kind](p)]
        answer = gold[0].facts[relation]
        distractors = [_MAKE[kind](p) for _ in range(num_docs - 1)]
        label = f"{kind}.{relation}"
    else:
        first, link, second, relation, question = rng.choice(_TWO_HOP)
        gold = list(_chain(p, first, link, second))
        answer = gold[1].facts[relation]
        distractors = []
        while len(distractors) < num_docs - 2:
            distractors.extend(_chain(p, first, link, second))
        distractors = distractors[: num_docs - 2]
        label = f"{first}.{link}>{second}.{relation}"
    docs = [e.document() for e in gold + distractors]
    return QAItem(
        question=question.format(name=gold[0].name),
        answers=(answer,),
        documents=tuple(docs),
        gold=tuple(range(len(gold))),
        id=f"{split}-{seed}-{index}",
        extra={"type": "single-hop" if hops == 1 else "two-hop", "relation": label},
    )


def generate(
    n: int,
    num_docs: int = 5,
    gold_position: str = "first",
    seed: int = 0,
    split: str = "eval",
    hops: Sequence[int] = DEFAULT_HOPS,
) -> list[QAItem]:
    """`n` items of `num_docs` documents, gold block at `gold_position` (first, middle, last), deterministic in
    (split, seed, index): the same arguments give the same items in any process; item i does not depend on n.

    `split` namespaces the seed and the entity names: "eval" and "train" items never share an entity."""
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 0:
        raise DatasetError(f"number of items must be >= 0, got {n}")
    if not hops or any(h not in (1, 2) for h in hops):
        raise DatasetError(f"hops must be a non-empty sequence of 1 and 2, got {list(hops)}")
    if not max(hops) <= num_docs <= MAX_DOCS:
        raise DatasetError(f"num_docs must be in [{max(hops)}, {MAX_DOCS}] (two-hop items need 2), got {num_docs}")
    return [arrange(_item(split, seed, i, num_docs, hops[i % len(hops)]), num_docs, gold_position) for i in range(n)]
