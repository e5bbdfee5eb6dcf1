"""Guided choice: a sequence's output constrained to one of the strings a request lists (`guided_choice`, as vLLM
names it).

Each choice is tokenized once, on its own, into the ids the model must produce; the choices' ids form a prefix tree.
At every step the sampler may pick only a token that continues some choice from the output so far (`allowed`), and
a choice that no other continues ends the sequence with its last token (`ends`, finish reason "stop"). Where one
choice is a prefix of another (`yes`, `yes sir`), the shorter one may also end by the model's EOS. Everything is a
function of the output ids, so a preempted sequence recomputed from its ids, or a sequence of a request sampled n
times, is constrained exactly as a fresh one.

A choice is produced in its own tokenization only: the string `" french"` is the ids that the tokenizer gives it
alone, as plain text (special-token text in it stays text), never another split of the same text. Logprobs stay the
model's own (the raw distribution), as for every other constraint the sampler applies (docs/design.md, "Guided
choice").
"""

from __future__ import annotations

from collections.abc import Sequence

from lazyattn.errors import InvalidRequestError
from lazyattn.model.tokenizer import TokenizerBase


class ChoiceGuide:
    """The prefix tree of a request's choices, as token ids."""

    def __init__(self, choices: Sequence[Sequence[int]], eos_token_ids: Sequence[int]) -> None:
        if not choices or any(not c for c in choices):
            raise ValueError("a guide needs at least one choice, each of at least one token")
        # node: {token: child}; a node is terminal where a choice ends there
        self._root: dict[int, dict] = {}
        self._terminal: set[int] = set()  # id() of terminal nodes
        for ids in choices:
            node = self._root
            for t in ids:
                node = node.setdefault(int(t), {})
            self._terminal.add(id(node))
        self.eos_token_ids = tuple(eos_token_ids)

    @classmethod
    def of(cls, tokenizer: TokenizerBase, choices: Sequence[str]) -> ChoiceGuide:
        """The guide of `choices` (strings, as SamplingParams.validate accepts them) under `tokenizer`."""
        ids = [tokenizer.encode_plain(c) for c in choices]  # special-token text in a choice is plain text
        for c, t in zip(choices, ids):
            if not t:
                raise InvalidRequestError(f"guided_choice {c!r} is no tokens under this tokenizer", "guided_choice")
        return cls(ids, tokenizer.eos_token_ids)

    def _node(self, output: Sequence[int]) -> dict | None:
        node = self._root
        for t in output:
            node = node.get(t)
            if node is None:
                return None
        return node

    def allowed(self, output: Sequence[int], ignore_eos: bool = False) -> list[int]:
        """The tokens that may follow `output`: those that continue a choice, and EOS where `output` is a whole
        choice that another continues (unless `ignore_eos`). Empty only for an output that is no choice's prefix,
        which the sampler never produces."""
        node = self._node(output)
        if node is None:
            return []
        allowed = list(node)
        if id(node) in self._terminal and not ignore_eos:
            allowed += [t for t in self.eos_token_ids if t not in node]
        return allowed

    def ends(self, output: Sequence[int]) -> bool:
        """Whether `output` is a whole choice that no other choice continues: nothing may follow it."""
        node = self._node(output)
        return node is not None and not node and id(node) in self._terminal
