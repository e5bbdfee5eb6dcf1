"""A Hugging Face checkpoint's tokenizer: `tokenizer.json` read by the tokenizers library, with the special tokens,
BOS rule, chat template and EOS ids of the files beside it."""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from lazyattn.errors import CheckpointError, InvalidRequestError
from lazyattn.model.tokenizer_base import TokenizerBase, check_text, special_pattern


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or as a serialised AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _pick_chat_template(value: Any) -> str | None:
    """A template is a string, or a list of named ones ({"name", "template"}); the one named "default" wins."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


class Tokenizer(TokenizerBase):
    """A checkpoint directory's tokenizer: `tokenizer.json` (required) plus, when present,
    `tokenizer_config.json` (special tokens, `add_bos_token`, chat template), `chat_template.jinja` /
    `chat_template.json` (where newer checkpoints keep the template), and `generation_config.json` (EOS ids)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        path = self.directory / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(
                f"{self.directory}: no tokenizer.json. lazyattn reads only the fast-tokenizer file; a checkpoint "
                "with just tokenizer.model can be converted with transformers' "
                "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)"
            )
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception for a malformed file
            raise CheckpointError(f"{path}: not a valid tokenizer file ({e})") from e

        config = _read_json(self.directory / "tokenizer_config.json") or {}
        generation = _read_json(self.directory / "generation_config.json") or {}
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.pad_token = _token_content(config.get("pad_token"))
        self.unk_token = _token_content(config.get("unk_token"))
        self.chat_template = self._find_chat_template(config)

        bos = self.bos_token_id
        if isinstance(config.get("add_bos_token"), bool):
            self.add_bos_token = config["add_bos_token"] and bos is not None
        else:
            # No explicit flag (Llama 3): tokenizer.json's post-processor decides, as in transformers.
            probe = self._tok.encode("a", add_special_tokens=True).ids
            self.add_bos_token = bos is not None and bool(probe) and probe[0] == bos

        eos_ids: list[int] = []
        if self.eos_token is not None and (eos := self.token_to_id(self.eos_token)) is not None:
            eos_ids.append(eos)
        # generation_config.json lists every token that ends a turn (Llama 3.1: end_of_text, eom, eot).
        extra = generation.get("eos_token_id")
        for i in extra if isinstance(extra, list) else [extra]:
            if isinstance(i, int) and i not in eos_ids:
                eos_ids.append(i)
        self._eos_token_ids = eos_ids

    def _find_chat_template(self, config: dict[str, Any]) -> str | None:
        jinja_file = self.directory / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8")
        as_json = _read_json(self.directory / "chat_template.json")
        if as_json is not None and (t := _pick_chat_template(as_json.get("chat_template"))) is not None:
            return t
        return _pick_chat_template(config.get("chat_template"))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        check_text(text)
        # The post-processor is bypassed on purpose: BOS is the only special token a decoder-only prompt needs,
        # and `add_bos_token` already says whether it belongs.
        ids = self._tok.encode(text, add_special_tokens=False).ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos_token and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    @property
    def special_token_pattern(self) -> re.Pattern[str] | None:
        if not hasattr(self, "_special_re"):
            specials = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
            self._special_re = special_pattern(specials)
        return self._special_re

    def _encode_with_plain_specials(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        # Encoding the spans one by one would not give `encode`'s tokens: merges and pre-tokenizers (a
        # Metaspace that prepends "▁" only at offset 0) see across span boundaries. So the text is encoded in
        # one call by a copy of the tokenizer that reads no special-token text at all, in which each control
        # token of a trusted span is replaced by an alias: an added token with the same matching options, so
        # it splits the text exactly where the special token would, then mapped back to the special's id.
        variant = self._plain_specials_variant()
        pieces = []
        for text, trusted in spans:
            if variant.key in text:  # a random per-process key: only reachable by guessing 64 bits
                raise InvalidRequestError("the text contains a sequence reserved by the tokenizer")
            pieces.append(self.special_token_pattern.sub(lambda m: variant.alias[m.group()], text) if trusted else text)
        ids = variant.tokenizer.encode("".join(pieces), add_special_tokens=False).ids
        return [variant.original_id.get(i, i) for i in ids]

    def _plain_specials_variant(self) -> _PlainSpecials:
        with _VARIANT_LOCK:
            if getattr(self, "_variant", None) is None:
                self._variant = _PlainSpecials(self._tok)
            return self._variant

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        kind = self._piece_kind()
        if kind == "byte_level" and token_id not in self._added_ids():
            try:
                return bytes(_UNICODE_TO_BYTE[c] for c in piece)
            except KeyError:  # not a byte-level piece after all
                return piece.encode()
        if kind == "metaspace" and token_id not in self._added_ids():
            if (m := _BYTE_PIECE.fullmatch(piece)) is not None:  # a byte-fallback piece, <0xE2>
                return bytes([int(m.group(1), 16)])
            return piece.replace("\u2581", " ").encode()
        return super().token_bytes(token_id)

    def _piece_kind(self) -> str:
        """How the vocabulary writes bytes, from the decoder: "byte_level" (GPT-2's byte-to-character map),
        "metaspace" (SentencePiece: U+2581 for a space, <0xXX> byte-fallback pieces) or "text"."""
        if getattr(self, "_kind", None) is None:
            decoder = json.loads(self._tok.to_str()).get("decoder") or {}
            steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
            types = {step.get("type") for step in steps}
            replaces = {(step.get("pattern") or {}).get("String") for step in steps if step.get("type") == "Replace"}
            is_metaspace = bool({"Metaspace", "ByteFallback"} & types) or "\u2581" in replaces
            self._kind = "byte_level" if "ByteLevel" in types else "metaspace" if is_metaspace else "text"
        return self._kind

    def _added_ids(self) -> frozenset[int]:
        """Added tokens (specials and the like): their pieces are plain text in every vocabulary kind."""
        if getattr(self, "_added", None) is None:
            self._added = frozenset(self._tok.get_added_tokens_decoder())
        return self._added

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_token_ids)


_VARIANT_LOCK = threading.Lock()


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for the
    characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class _PlainSpecials:
    """A copy of a tokenizer that reads no special-token text, plus one alias per special token (see
    `Tokenizer._encode_with_plain_specials`). Built on first use: most requests never need it."""

    def __init__(self, tok: tokenizers.Tokenizer) -> None:
        self.key = secrets.token_hex(8)
        self.tokenizer = tokenizers.Tokenizer.from_str(tok.to_str())
        self.tokenizer.encode_special_tokens = True  # special-token text is split like any other text
        specials = {i: t for i, t in tok.get_added_tokens_decoder().items() if t.special}
        # Private-use characters around the key: nothing a normalizer or pre-tokenizer rewrites.
        self.alias = {t.content: f"\ue000{self.key}-{i}\ue001" for i, t in specials.items()}
        self.tokenizer.add_tokens(
            [
                tokenizers.AddedToken(
                    self.alias[t.content],
                    single_word=t.single_word,
                    lstrip=t.lstrip,
                    rstrip=t.rstrip,
                    normalized=t.normalized,
                    special=False,
                )
                for t in specials.values()
            ]
        )
        self.original_id = {self.tokenizer.token_to_id(self.alias[t.content]): i for i, t in specials.items()}
