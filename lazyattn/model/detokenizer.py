"""Incremental (streaming) detokenisation with stop strings."""

from __future__ import annotations

from collections.abc import Sequence

from lazyattn.model.tokenizer_base import TokenizerBase


class IncrementalDecoder:
    """Turns generated token ids, fed one at a time, into text deltas that are safe to emit.

    Decoding tokens one by one is wrong twice over: a UTF-8 character can span tokens (byte-level BPE), and
    some decoders change a token's text depending on its left neighbour (SentencePiece's leading space). So
    each step decodes a window that starts at the ids decoded in the previous step, and emits what lies
    beyond the text of that left context; text ending in U+FFFD (an incomplete character) is held until the
    next token completes it.

    Stop strings: text is searched as it grows; on a match `stopped` is set, `text` ends before the stop
    string, and nothing after it is emitted. While the text's tail could still become a stop string, that
    tail is held back, so a stream never shows the start of a stop string that then completes.
    """

    # How many of the prompt's last ids give the first output tokens their left context.
    _CONTEXT = 5

    def __init__(
        self,
        tokenizer: TokenizerBase,
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        min_tokens: int = 0,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = tuple(s for s in stop if s)
        self._min_tokens = min_tokens
        # The prompt's last ids only provide left context; they are never emitted.
        self._ids: list[int] = list(prompt_token_ids[-self._CONTEXT :])
        self._prefix_offset = 0  # window start
        self._read_offset = len(self._ids)  # ids before this are already in `_raw`
        self._raw = ""  # all decoded output text (may run past a stop string)
        self._emitted = 0  # chars of `_raw` handed out by feed()/finish()
        self._end: int | None = None  # where `text` ends once a stop string matched
        self.num_tokens = 0
        self.stopped: str | None = None  # the stop string that matched

    @property
    def text(self) -> str:
        """Output text so far (held-back tail included; stop string and what follows excluded)."""
        return self._raw if self._end is None else self._raw[: self._end]

    def feed(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (often "")."""
        if self.stopped is not None:
            return ""
        self._ids.append(int(token_id))
        self.num_tokens += 1
        window = self._ids[self._prefix_offset :]
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(window)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._append(full_text[len(prefix_text) :])
            # The ids just decoded become the next window's left context.
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: decode whatever is pending (an incomplete character becomes U+FFFD) and release
        the held-back tail."""
        if self.stopped is None and self._read_offset < len(self._ids):
            prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
            full_text = self._decode(self._ids[self._prefix_offset :])
            self._append(full_text[len(prefix_text) :])
            self._prefix_offset = self._read_offset = len(self._ids)
        return self._release(final=True)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""

    def _append(self, new_text: str) -> None:
        start = len(self._raw)
        self._raw += new_text
        if not self._stop or self.num_tokens < self._min_tokens:
            return
        # Only windows that overlap the new text can hold a new match; take the earliest.
        longest = max(len(s) for s in self._stop)
        search_from = max(0, start - longest + 1)
        best: tuple[int, str] | None = None
        for s in self._stop:
            at = self._raw.find(s, search_from)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            self._end, self.stopped = best

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if not final and self.stopped is None:
            end -= self._stop_prefix_len()
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._raw)), best, -1):
                if self._raw.endswith(s[:n]):
                    best = n
                    break
        return best
