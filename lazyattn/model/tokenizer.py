"""Tokenizers: a Hugging Face checkpoint's `tokenizer.json` (hf_tokenizer.py), a GGUF file's vocabulary
(gguf_tokenizer.py), and the byte tokenizer of the built-in `tiny` model (byte_tokenizer.py), behind one interface
(tokenizer_base.py). `load_tokenizer` picks the one a model path names. Chat templates are compiled in
`chat_template.py`; streaming detokenisation is `detokenizer.py`.
"""

from __future__ import annotations

from pathlib import Path

from lazyattn.errors import CheckpointError
from lazyattn.model import adapter, gguf_tokenizer, hub
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.model.hf_tokenizer import Tokenizer
from lazyattn.model.tokenizer_base import TokenizerBase, check_text, special_pattern

__all__ = ["TINY", "Tokenizer", "TokenizerBase", "check_text", "load_tokenizer", "special_pattern"]

TINY = "tiny"


def load_tokenizer(path: str | Path) -> TokenizerBase:
    """`"tiny"` gives the built-in ByteTokenizer; a .gguf file (or a named model) its own; else a checkpoint
    directory."""
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
