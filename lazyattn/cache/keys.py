"""Segment keys: what a cached segment's KV depends on, hashed (docs/design.md, The document cache).

A key hashes the model's weights, the RoPE configuration, the tenant's salt and the token ids (plus, in prefix mode,
the key of the page before it). Every tier of the document cache (GPU, host, disk) indexes segments by it.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

_KEY_VERSION = b"lazyattn-segment-key-v2\x00"


def _field(s: str | None) -> bytes:
    # A presence byte tells None from "", a length prefix keeps field boundaries unambiguous.
    if s is None:
        return b"\x00"
    b = s.encode("utf-8")
    return b"\x01" + len(b).to_bytes(8, "little") + b


@functools.lru_cache(maxsize=64)  # one compiled format per id count (a miss is cheap next to the hash)
def _packer(n: int, code: str) -> struct.Struct:
    return struct.Struct(f"<{n}{code}")


def token_bytes(token_ids: Sequence[int]) -> tuple[bytes, bytes]:
    """The key's encoding of token ids, as (header, body), hashed one after the other: their count, a width byte,
    then each id as a little-endian int32 when all fit (every vocabulary id does), else as int64, so the encoding
    is one-to-one on int64 sequences whatever the host. Raises struct.error for a value that is no int64 (or no
    integer).

    Why not int64 throughout: hashing is about half of a key's time, and half the bytes halve it. Why struct: from
    a Python list it is faster than array or numpy (docs/benchmarks.md, "Kernel constants")."""
    n = len(token_ids)
    try:
        return n.to_bytes(8, "little") + b"\x04", _packer(n, "i").pack(*token_ids)
    except struct.error:
        return n.to_bytes(8, "little") + b"\x08", _packer(n, "q").pack(*token_ids)


# Token ids the keyer's memo holds (KeyMemo): ~8 MiB of list slots, 512 documents of 2048 tokens.
KEY_MEMO_TOKENS = 1 << 20
_MEMO_MIN_TOKENS = 256  # shorter segments (prefix mode's pages, system prompts) key in a few µs: not worth a slot
_MEMO_PROBES = 32  # ids sampled, evenly spaced, for a slot's probe


class KeyMemo:
    """Keys of recently keyed segments, so that a document which recurs is not packed and hashed again.

    A slot is found by a cheap probe (salt, length, a hash of ~32 evenly spaced ids) and holds a copy of the ids
    its key was computed from; it answers only if that copy equals the ids asked about, element by element, so a
    probe collision costs a comparison and a miss, never a wrong key. The comparison is what makes it pay: list
    equality checks identity before value, so ids whose int objects are the ones the slot holds (the same
    document list passed again, or lists copied from one) compare in a fraction of the time it takes to pack and
    hash them (docs/benchmarks.md, "Kernel constants"). Fresh int objects of equal value compare in about the
    time a key takes: the memo then neither gains nor costs much. A value that equals an int without being one
    (np.int64(7)) is that token id and gets its key, as struct would give it.

    Least recently used slots go first once the copies exceed `max_tokens`. Not thread-safe: the engine's thread
    owns it, as it owns the keyer."""

    def __init__(self, max_tokens: int = KEY_MEMO_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0  # ids held by the slots
        self.hits = 0
        self._slots: OrderedDict[tuple, tuple[list[int], str]] = OrderedDict()

    def probe(self, token_ids: Sequence[int], salt: str | None) -> tuple | None:
        """The slot a segment maps to; None for segments the memo does not keep (short ones, or not lists)."""
        n = len(token_ids)
        if n < _MEMO_MIN_TOKENS or n > self.max_tokens or type(token_ids) is not list:
            return None
        return salt, n, hash(tuple(token_ids[:: n // _MEMO_PROBES]))

    def get(self, probe: tuple, token_ids: list[int]) -> str | None:
        slot = self._slots.get(probe)
        if slot is None or slot[0] != token_ids:
            return None
        self._slots.move_to_end(probe)
        self.hits += 1
        return slot[1]

    def put(self, probe: tuple, token_ids: list[int], key: str) -> None:
        old = self._slots.pop(probe, None)
        if old is not None:
            self.tokens -= len(old[0])
        self._slots[probe] = (list(token_ids), key)
        self.tokens += len(token_ids)
        while self.tokens > self.max_tokens:
            _, (ids, _) = self._slots.popitem(last=False)
            self.tokens -= len(ids)

    def __len__(self) -> int:
        return len(self._slots)


class SegmentKeyer:
    """`segment_key` for one model: (token ids, salt, parent) -> key. The model and RoPE fields, then each salt,
    are hashed once here and the hash state copied per key; the engine keys every segment of every request
    (~10K tokens for five documents) before it can schedule it, all on the time to first token, so documents
    keyed recently are remembered too (KeyMemo; `memo_tokens=0` turns that off)."""

    def __init__(self, model_fingerprint: str, rope_fingerprint: str, memo_tokens: int = KEY_MEMO_TOKENS) -> None:
        self._model = hashlib.sha256(_KEY_VERSION)  # sha256 over blake2b: SHA-NI makes it the faster here
        self._model.update(_field(model_fingerprint) + _field(rope_fingerprint))
        self._salted: dict[str | None, hashlib._Hash] = {}  # the state after (salt, no parent), per recent salt
        self.memo = KeyMemo(memo_tokens)

    def __call__(self, token_ids: Sequence[int], salt: str | None, parent: str | None = None) -> str:
        probe = self.memo.probe(token_ids, salt) if parent is None else None
        if probe is not None:
            key = self.memo.get(probe, token_ids)  # type: ignore[arg-type]  (probe says: a list)
            if key is not None:
                return key
        header, body = token_bytes(token_ids)
        h = self._state(salt, parent)
        h.update(header)
        h.update(body)
        key = h.hexdigest()
        if probe is not None:
            self.memo.put(probe, token_ids, key)  # type: ignore[arg-type]
        return key

    def _state(self, salt: str | None, parent: str | None) -> hashlib._Hash:
        """A copy of the hash state after the model fields, the salt and the parent."""
        if parent is None:
            base = self._salted.get(salt)
            if base is None:
                if len(self._salted) >= 1024:  # one state per tenant salt, not one per salt ever seen
                    self._salted.clear()
                base = self._salted[salt] = self._model.copy()
                base.update(_field(salt) + _field(None))
            return base.copy()
        h = self._model.copy()
        h.update(_field(salt) + _field(parent))
        return h


def segment_key(
    model_fingerprint: str,
    rope_fingerprint: str,
    salt: str | None,
    token_ids: Sequence[int],
    parent: str | None = None,
) -> str:
    """Hex sha256 over (version, model, rope, salt, parent, token ids): each string field length-prefixed, the ids
    as `token_bytes` encodes them.

    `parent` is the key of the previous page in prefix mode (vLLM-style chained page hashes), so a page
    key covers the whole prefix; None for block/lazy segments, which are position-independent.
    """
    return SegmentKeyer(model_fingerprint, rope_fingerprint, memo_tokens=0)(token_ids, salt, parent)
