"""Tokenizers: a Hugging Face checkpoint's `tokenizer.json`, a GGUF file's vocabulary, and the byte tokenizer of
the built-in `tiny` model. Chat templates are compiled in `chat_template.py`; streaming detokenisation is
`detokenizer.py`.

Both tokenizers share one interface (`TokenizerBase`), so the prompt renderer and the engine never ask which
one they hold. `encode` parses special-token strings found in the text (`<|eot_id|>`, `<s>`), as Hugging Face
does: that is how a rendered chat template turns back into the right special ids. Text a user wrote must not
get that treatment (typing `<|eot_id|>` would forge a turn boundary), so `encode_spans` reads control tokens
only in the spans the caller trusts, and `encode_plain` none at all.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import tokenizers

from lazyattn.errors import CheckpointError, InvalidRequestError
from lazyattn.model.chat_template import compile_chat_template

if TYPE_CHECKING:
    from lazyattn.model.tokenizer_cache import TokenizerCache

TINY = "tiny"

# A lone UTF-16 surrogate ("\ud800" in a JSON string decodes to one) has no UTF-8 encoding, so no tokenizer can
# read text holding one: it is the request's error, found before a tokenizer fails on it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, param: str | None = None) -> None:
    """Raise InvalidRequestError if `text` cannot be encoded as UTF-8 (a lone surrogate)."""
    m = _SURROGATE.search(text)
    if m is not None:
        raise InvalidRequestError(
            f"{param or 'the text'} is not valid Unicode: a lone surrogate "
            f"(U+{ord(m.group()):04X}) at character {m.start()}",
            param=param,
        )


def special_pattern(tokens: Sequence[str]) -> re.Pattern[str] | None:
    # Longest first: a special never matches as a prefix of a longer one (the tokenizers library also takes
    # the leftmost-longest match).
    ordered = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None


# ---------------------------------------------------------------------------------------------------------------
# Chat templates: the same sandboxed Jinja environment Hugging Face gives templates, so Hub templates render as
# they do there (trim_blocks/lstrip_blocks, loop controls, raise_exception, strftime_now, a non-escaping tojson).


class TokenizerBase(ABC):
    """What the engine needs from a tokenizer. `bos_token_id` is None for models without one (Qwen)."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    chat_template: str | None = None
    # Whether `encode(..., add_special_tokens=True)` starts the text with BOS; the prompt renderer follows it.
    add_bos_token: bool = False
    # Documents' token ids, looked up by `encode_document` (tokenizer_cache.py); the engine gives its tokenizer
    # one (EngineConfig.tokenizer_cache_tokens). None: every document is tokenised every time.
    cache: TokenizerCache | None = None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Special-token text in `text` becomes control tokens: for text the model's own template wrote."""

    @property
    @abstractmethod
    def special_token_pattern(self) -> re.Pattern[str] | None:
        """Matches the special-token texts that `encode` reads as control tokens (None: there are none)."""

    def encode_spans(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        """Encode the concatenation of `spans`, (text, trusted) pairs, reading special-token text as a control
        token only inside trusted spans; in an untrusted span (or across a span boundary) it is plain text.
        Whenever no special-token text touches an untrusted span, the result is `encode` of the concatenation:
        that very call."""
        untrusted, at = [], 0
        for text, trusted in spans:
            check_text(text)
            if not trusted and text:
                untrusted.append((at, at + len(text)))
            at += len(text)
        joined = "".join(text for text, _ in spans)
        pattern = self.special_token_pattern
        if (
            pattern is None
            or not untrusted
            or not any(
                start < m.end() and m.start() < end for m in pattern.finditer(joined) for start, end in untrusted
            )
        ):
            return self.encode(joined)
        return self._encode_with_plain_specials(spans)

    def encode_plain(self, text: str) -> list[int]:
        """Text a user wrote: special-token text in it is plain text, never a control token."""
        return self.encode_spans([(text, False)])

    @abstractmethod
    def _encode_with_plain_specials(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        """`encode_spans` when some untrusted span holds special-token text."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, as the logprobs of the OpenAI API report them. A byte-level token can be
        part of a UTF-8 character, which its decoded text shows only as U+FFFD; subclasses that know the token's
        bytes say so. Here: the decoded text's UTF-8."""
        return self.decode([token_id], skip_special_tokens=False).encode()

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def eos_token_ids(self) -> list[int]: ...

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token else None

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render a conversation to text (not token ids). `extra` reaches the template as variables
        (e.g. `enable_thinking=False` for Qwen3, `tools=[...]`)."""
        if self.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; send a plain prompt to /v1/completions instead", param="messages"
            )
        template = compile_chat_template(self.chat_template)
        special = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
        }
        context = {k: v for k, v in special.items() if v is not None}
        context.update(extra)
        context["messages"] = list(messages)
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return template.render(**context)
        except jinja2.TemplateError as e:  # raise_exception(...) in the template: the conversation is not allowed
            raise InvalidRequestError(f"the chat template rejected the conversation: {e}", param="messages") from e
        except (TypeError, KeyError, AttributeError, ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            # What a template's own expressions raise on values it did not expect (a kwarg of the wrong type,
            # sandbox limits such as range()'s): the request's values, not the server, are at fault.
            raise InvalidRequestError(
                f"the chat template could not render these messages: {e}", param="messages"
            ) from e


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face checkpoint tokenizer


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


def load_tokenizer(path: str | Path) -> TokenizerBase:
    """`"tiny"` gives the built-in ByteTokenizer; a .gguf file (or a named model) its own; else a checkpoint
    directory."""
    from lazyattn.model import adapter, gguf_tokenizer, hub
    from lazyattn.model.byte_tokenizer import ByteTokenizer

    if str(path) == TINY:
        return ByteTokenizer()

    path = hub.resolve_model(str(path))
    if adapter.is_adapter_dir(path):  # an adapter reads text as its base model does
        return load_tokenizer(adapter.read_adapter(path).base)
    if path.lower().endswith(".gguf"):
        return gguf_tokenizer.gguf_tokenizer(path)
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face checkpoint or 'tiny')")
    return Tokenizer(path)
