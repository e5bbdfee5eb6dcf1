"""Small random checkpoints (transformers' save_pretrained) with a tokenizer, shared by engine tests."""

from __future__ import annotations

import json

import pytest

from lazyattn.model.tokenizer import Tokenizer
from tests.model.checkpoints import write_checkpoint
from tests.model.test_tokenizer import CHATML_TEMPLATE, write_hf_tokenizer


def write_tokenizer(directory, vocab_size: int = 300) -> None:
    """A byte-level BPE tokenizer.json trained on a few sentences, ids below the model's vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 8,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        "the quick brown fox jumps over the lazy dog",
        "documents are cached once and placed anywhere",
        "rotary position embeddings rotate queries and keys",
    ] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> (directory, transformers model); built once per flavour per session."""
    built = {}

    def get(name: str):
        if name not in built:
            d = tmp_path_factory.mktemp(name)
            model = write_checkpoint(name, d)
            write_tokenizer(d)
            built[name] = (d, model)
        return built[name]

    return get


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_hf_tokenizer(tmp_path_factory.mktemp("llama3")))


@pytest.fixture(scope="module")
def chatml(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_hf_tokenizer(tmp_path_factory.mktemp("chatml"), CHATML_TEMPLATE, bos=None, eos="<|im_end|>"))
