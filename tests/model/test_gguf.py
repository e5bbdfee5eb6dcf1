"""GGUF checkpoints written here from small random transformers models (llama.cpp's layout, see gguf_files.py):
the model against the original transformers model (unquantised files) and against transformers' own GGUF loader
(every quantisation type it reads), tokenizers against transformers' GGUF tokenizers, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lazyattn.errors import CheckpointError
from lazyattn.model import load_model
from lazyattn.model.gguf import SUPPORTED_TYPES, llama3_scaling
from lazyattn.model.tokenizer import load_tokenizer
from tests.model.checkpoints import SMALL, hf_logits, hf_model
from tests.model.gguf_files import random_blocks, write_gguf
from tests.model.runner import PagedRunner, Run
from tests.model.test_parity import TOL, random_tokens, rel_err
from tests.model.test_tokenizer import CORPUS, LLAMA3_SPECIALS

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOKENS = [1] + random_tokens(24, seed=5)


def our_logits(path, tokens=TOKENS) -> torch.Tensor:
    model, cfg = load_model(path, dtype=torch.float32)
    runner = PagedRunner(model, cfg)
    return runner.run([Run(tokens, runner.segment(len(tokens)))])[0]


def transformers_gguf(path) -> torch.nn.Module:
    """transformers' own reading of the file: its dequantisation, names, q/k un-permutation and config."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def llama3_divisors(config) -> np.ndarray:
    """llama.cpp's rope_freqs: the plain inverse frequencies over transformers' Llama-3-scaled ones."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = config.hidden_size // config.num_attention_heads
    base = config.rope_parameters["rope_theta"]
    plain = 1.0 / base ** (torch.arange(0, head_dim, 2).double() / head_dim)
    return (plain / scaled.double()).float().numpy()


@pytest.mark.parametrize("name", ["llama", "llama31", "mistral", "qwen2", "qwen3", "tied"])
def test_unquantised_file_is_the_original_model(name, tmp_path):
    """F32 GGUF of every flavour == the transformers model it was written from (q/k rows permuted and back,
    Llama-3 RoPE scaling carried as rope_freqs, tied embeddings, Qwen2 biases, Qwen3 q/k norms)."""
    hf = hf_model(name)
    extra = {}
    if name == "llama31":
        extra["rope_freqs.weight"] = (llama3_divisors(hf.config), "F32")
    path = write_gguf(hf, tmp_path / f"{name}.gguf", "F32", extra_tensors=extra)
    assert rel_err(our_logits(path), hf_logits(hf, TOKENS)) < TOL


@pytest.mark.parametrize(
    ("name", "qtype"), [("llama", "Q8_0"), ("llama", "Q4_0"), ("tied", "Q4_1"), ("qwen2", "F16"), ("mistral", "BF16")]
)
def test_quantised_file_matches_transformers_gguf_loader(name, qtype, tmp_path):
    hf = hf_model(name)
    path = write_gguf(hf, tmp_path / f"{name}-{qtype}.gguf", qtype)
    got, want = our_logits(path), hf_logits(transformers_gguf(path), TOKENS)
    assert (got - want).abs().max() < 1e-4
    assert rel_err(got, hf_logits(hf, TOKENS)) > 1e-6 or qtype in ("F16", "BF16")  # really quantised


def test_k_quants_match_transformers_gguf_loader(tmp_path):
    """Q2_K..Q6_K blocks (random bytes: gguf cannot quantise to them) on one layer of K-quant-sized rows."""
    cfg = transformers.LlamaConfig(**{**SMALL, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    shapes = {
        "attn_q": (256, "Q4_K"),
        "attn_k": (128, "Q5_K"),
        "attn_v": (128, "Q6_K"),
        "attn_output": (256, "Q2_K"),
        "ffn_gate": (512, "Q3_K"),
    }
    raw = {
        f"blk.0.{n}.weight": (random_blocks(rows, 256, t, seed=i), t) for i, (n, (rows, t)) in enumerate(shapes.items())
    }
    path = write_gguf(hf.eval(), tmp_path / "kquants.gguf", "F32", extra_tensors=raw)
    got, want = our_logits(path), hf_logits(transformers_gguf(path), TOKENS)
    assert (got - want).abs().max() < 1e-4 * max(1.0, want.abs().max().item())
    assert want.std() > 0.1


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_types_transformers_cannot_read_stay_within_their_step(qtype, tmp_path):
    """Q5_0/Q5_1 (no transformers reader): every weight within half a quantisation step of the original."""
    hf = hf_model("llama")
    path = write_gguf(hf, tmp_path / f"{qtype}.gguf", qtype)
    model, _ = load_model(path, dtype=torch.float32)
    ours = dict(model.named_parameters())
    for hf_name, (name, lo, hi) in model.hf_weight_map().items():
        orig = hf.state_dict()[hf_name]
        got = ours[name].narrow(0, lo, hi - lo)
        if orig.ndim == 1:
            assert torch.equal(got, orig)
            continue
        blocks = orig.reshape(orig.shape[0], -1, 32)
        step = (blocks.amax(-1) - blocks.amin(-1)) / 31  # 5 bits over the block's range
        err = (got - orig).abs().reshape(blocks.shape)
        assert (err <= step[..., None] * 1.01 + 1e-7).all(), hf_name


def test_llama31_rope_freqs_give_back_the_scaling():
    """Llama-3.1-8B's RoPE (head_dim 128, θ 5e5, factor 8, original context 8192) recovered from its divisors."""
    cfg = transformers.LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    got = llama3_scaling(llama3_divisors(cfg), 500000.0, 128, "test")
    assert got == {
        "rope_type": "llama3",
        "factor": pytest.approx(8.0),
        "low_freq_factor": 1.0,
        "high_freq_factor": pytest.approx(4.0, rel=1e-3),
        "original_max_position_embeddings": 8192,
    }
    assert llama3_scaling(np.ones(64, dtype=np.float32), 500000.0, 128, "test") is None
    with pytest.raises(CheckpointError, match="rope_freqs"):
        llama3_scaling(np.linspace(1, 3, 64).astype(np.float32)[::-1], 500000.0, 128, "test")


def test_unsupported_architecture_type_and_file(tmp_path):
    import gguf

    hf = hf_model("llama")
    path = write_gguf(hf, tmp_path / "ok.gguf", "F32")
    blob = bytearray(path.read_bytes())
    at = blob.find(b"llama")  # general.architecture's value is the first "llama" in the file
    blob[at : at + 5] = b"gemma"
    (tmp_path / "gemma.gguf").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="'gemma' is not supported"):
        load_model(tmp_path / "gemma.gguf")

    raw = {"blk.0.ffn_up.weight": (random_blocks(160, 64, "IQ4_NL", seed=0), "IQ4_NL")}
    write_gguf(hf, tmp_path / "iq.gguf", "F32", extra_tensors=raw)
    with pytest.raises(CheckpointError, match="IQ4_NL"):
        load_model(tmp_path / "iq.gguf")
    assert "IQ4_NL" not in SUPPORTED_TYPES and gguf.GGMLQuantizationType.IQ4_NL

    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        load_model(tmp_path / "junk.gguf")


# --- tokenizers --------------------------------------------------------------------------------------------

NUMBERS = ["In 2026 there were 12345 requests, 678 of them at 3.14159 ms; it's what we'll see, isn't it?"]
TEXTS = (
    CORPUS
    + NUMBERS
    + [
        "<|im_start|>user\nHi 12345 there!<|im_end|>\n",
        "  leading spaces and\n\nnewlines\t tabs",
        "Numbers 3.14159 and 2026, MIXED case WORDS",
    ]
)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_level_vocab() -> dict:
    """A small trained byte-level BPE as GGUF tokenizer metadata. Its corpus has numbers and contractions, so
    merges span digit runs and apostrophes, where the pre-tokenizers' split rules differ."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=LLAMA3_SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((CORPUS + NUMBERS) * 10, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return {
        "model": "gpt2",
        "tokens": tokens,
        "types": [3 if t in LLAMA3_SPECIALS else 1 for t in tokens],
        "merges": merges,
        "bos": vocab["<|begin_of_text|>"],
        "eos": vocab["<|im_end|>"],
        "add_bos": False,
        "chat_template": CHATML,
    }


def sentencepiece_vocab() -> dict:
    """A small SentencePiece-style BPE vocabulary: <unk>, <s>, </s>, 256 byte pieces, learned pieces scored by
    merge order (as SentencePiece scores BPE pieces), no merges list."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    learned = sorted(tok.get_vocab(), key=tok.get_vocab().get)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + learned
    types = [2, 3, 3] + [6] * 256 + [1] * len(learned)
    scores = [0.0] * 259 + [-float(i) for i in range(len(learned))]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores, "bos": 1, "eos": 2, "unk": 0}


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2", "sentencepiece"])
def test_tokenizer_matches_transformers_gguf_tokenizer(pre, tmp_path):
    tok_meta = sentencepiece_vocab() if pre == "sentencepiece" else {**byte_level_vocab(), "pre": pre}
    path = write_gguf(hf_model("llama"), tmp_path / f"{pre}.gguf", "F32", tokenizer=tok_meta)
    ours = load_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS + ["héllo wörld 😀 naïve"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids, skip_special_tokens=False)
    assert ours.bos_token_id == tok_meta["bos"] and ours.eos_token_ids == [tok_meta["eos"]]
    assert ours.add_bos_token == (pre == "sentencepiece")  # llama.cpp's default for each vocabulary kind
    if pre != "sentencepiece":
        messages = [{"role": "user", "content": "Who wrote it?"}]
        assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    meta = {**byte_level_vocab(), "pre": "some-new-model"}
    path = write_gguf(hf_model("llama"), tmp_path / "pre.gguf", "F32", tokenizer=meta)
    with pytest.raises(CheckpointError, match="pre-tokenizer 'some-new-model'"):
        load_tokenizer(path)


def valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("pre", ["llama-bpe", "gpt2", "sentencepiece"])
def test_token_bytes_join_up_to_the_text(pre, tmp_path):
    """Each token's own bytes (logprobs' `bytes`), even where a token is part of a UTF-8 character (é, 😀 split
    over byte tokens): joined in order they are the text's UTF-8, plus the space SentencePiece puts in front."""
    tok_meta = sentencepiece_vocab() if pre == "sentencepiece" else {**byte_level_vocab(), "pre": pre}
    path = write_gguf(hf_model("llama"), tmp_path / f"{pre}.gguf", "F32", tokenizer=tok_meta)
    tok = load_tokenizer(path)
    split = 0
    for text in ["héllo wörld 😀 naïve", "12345 it's", "∑ → ü"]:
        pieces = [tok.token_bytes(i) for i in tok.encode(text)]
        split += sum(not valid_utf8(p) for p in pieces)
        want = (" " + text if pre == "sentencepiece" else text).encode()
        assert b"".join(pieces) == want, text
    assert split > 0  # some tokens hold part of a character
    assert tok.token_bytes(tok_meta["eos"]) == tok_meta["tokens"][tok_meta["eos"]].encode()  # a special: its text
