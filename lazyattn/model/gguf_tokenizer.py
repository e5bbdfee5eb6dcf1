"""A GGUF file's tokenizer: its vocabulary, merges, special tokens and chat template, rebuilt as the Hugging Face
files (`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`) that the ordinary `Tokenizer` reads.

Going through the same files keeps one tokenizer code path: BOS handling, special-token parsing, the chat
template and EOS ids behave for a GGUF model exactly as for the checkpoint directory it was converted from.

Two vocabulary kinds (`tokenizer.ggml.model`):
- `gpt2`: byte-level BPE with the file's merges; how text is split before merging depends on
  `tokenizer.ggml.pre` (the regex the merges were learned with), so an unknown one is refused rather than
  guessed;
- `llama`: SentencePiece BPE with byte fallback; the merges are implied by the token scores.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from lazyattn.errors import CheckpointError
from lazyattn.model.gguf import GGUFFile, eos_token_ids, open_gguf
from lazyattn.model.hf_tokenizer import Tokenizer

# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4

# Split regexes of the byte-level pre-tokenizers, by `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = ("default", "gpt2")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact")  # every digit alone, then GPT-2's split
_LLAMA3 = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3")
_QWEN2 = ("qwen2", "deepseek-r1-qwen")
PRE_TOKENIZERS = _GPT2 + _DIGITS_THEN_GPT2 + _LLAMA3 + _QWEN2


def gguf_tokenizer(path: str | Path) -> Tokenizer:
    f = open_gguf(path)
    with tempfile.TemporaryDirectory(prefix="lazyattn-gguf-tokenizer-") as d:
        write_tokenizer_files(f, Path(d))
        tok = Tokenizer(d)
    tok.directory = f.path
    return tok


def write_tokenizer_files(f: GGUFFile, directory: Path) -> None:
    kind = f.get("tokenizer.ggml.model")
    tokens: list[str] | None = f.get("tokenizer.ggml.tokens")
    if not tokens:
        raise CheckpointError(f"{f.path.name}: no tokenizer vocabulary (tokenizer.ggml.tokens)")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tok = _byte_level_bpe(f, tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(f, tokens, types)
    else:
        raise CheckpointError(f"{f.path.name}: tokenizer model {kind!r} is not supported (gpt2 or llama)")
    # Control tokens (<|im_start|>, <s>) are matched whole in text, as special; user-defined ones whole too.
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
    )
    tok.save(str(directory / "tokenizer.json"))

    def token(key: str) -> str | None:
        i = f.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    # llama.cpp's default when the flag is absent: BOS for SentencePiece vocabularies, none for byte-level.
    add_bos = f.get("tokenizer.ggml.add_bos_token")
    config: dict[str, Any] = {
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(kind == "llama" if add_bos is None else add_bos),
    }
    if (template := f.get("tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_ids(f)}))


def _byte_level_bpe(f: GGUFFile, tokens: list[str]) -> HFTokenizer:
    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"{f.path.name}: pre-tokenizer {pre!r} is not supported; supported: {', '.join(PRE_TOKENIZERS)}"
        )
    merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    # Llama 3 looks a whole pre-token up in the vocabulary before merging (its tokenizer.json says so).
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _LLAMA3))
    if pre in _GPT2:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in _DIGITS_THEN_GPT2:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        split = _LLAMA3_SPLIT if pre in _LLAMA3 else _QWEN2_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        if pre in _QWEN2:
            tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(f: GGUFFile, tokens: list[str], types: list[int]) -> HFTokenizer:
    scores = f.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise CheckpointError(f"{f.path.name}: a SentencePiece vocabulary needs one score per token")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = f.get("tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges else _merges_from_scores(tokens, scores, types)
    unk = f.get("tokenizer.ggml.unknown_token_id")
    tok = HFTokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            unk_token=None if unk is None else tokens[int(unk)],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = f.get("tokenizer.ggml.add_space_prefix", True)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece merges: every split of a normal token into two tokens, best-scoring result first.

    SentencePiece BPE merges the adjacent pair whose concatenation has the highest score, so ordering the
    pairs by that score (ties by the ids of the parts) gives a BPE merge list that tokenises the same way.
    """
    ids = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, str, str]] = []
    for t, score, ty in zip(tokens, scores, types):
        if ty != 1:  # only normal tokens are merge results
            continue
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in ids and right in ids:
                found.append((-float(score), ids[left], ids[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]
