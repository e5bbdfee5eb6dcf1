"""Small GGUF files written from the random transformers models of checkpoints.py, the way llama.cpp's converter
writes them (its tensor names, q/k rows permuted for the `llama` architecture, 1-D tensors in F32), so that
transformers' own GGUF loader can read them back as the independent reference. Tests only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# transformers parameter name (after "model.layers.N.") -> llama.cpp tensor name (after "blk.N.")
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def gguf_name(hf_name: str) -> str:
    stem, kind = hf_name.rsplit(".", 1)
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}.{kind}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: per head, the two halves of the rows interleaved (RoPE pairs made adjacent)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    model: torch.nn.Module,
    path: Path,
    qtype: str | dict[str, str] = "F32",
    tokenizer: dict | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write `model` (a transformers CausalLM) as a GGUF file.

    qtype: one type for every 2-D weight, or {gguf name suffix: type} (first match wins, default F32);
    raw quantised bytes can be given instead through extra_tensors as {name: (uint8 rows, type)}.
    tokenizer: {"model", "tokens", "types", "merges"/"scores", "bos", "eos", "pre", "chat_template", ...}.
    """
    import gguf

    cfg = model.config
    arch = ARCH[cfg.architectures[0]] if cfg.architectures else ARCH[type(model).__name__]
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if tokenizer is not None:
        _add_tokenizer(w, tokenizer)

    raw = dict(extra_tensors or {})
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = gguf_name(hf_name)
        if name in raw:
            rows, t = raw.pop(name)
            w.add_tensor(name, rows, raw_dtype=gguf.GGMLQuantizationType[t])
            continue
        data = tensor.detach().float().numpy()
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            data = llama_cpp_permute(data, heads if ".attn_q." in name else kv_heads)
        t = "F32" if data.ndim == 1 else _type_for(name, qtype)
        qt = gguf.GGMLQuantizationType[t]
        w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(data), qt), raw_dtype=qt)
    for name, (rows, t) in raw.items():  # tensors with no transformers counterpart (rope_freqs)
        w.add_tensor(name, rows, raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _type_for(name: str, qtype: str | dict[str, str]) -> str:
    if isinstance(qtype, str):
        return qtype
    return next((t for suffix, t in qtype.items() if suffix in name), "F32")


def _add_tokenizer(w, tok: dict) -> None:
    w.add_tokenizer_model(tok["model"])
    if "pre" in tok:
        w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    if "merges" in tok:
        w.add_token_merges(tok["merges"])
    if "scores" in tok:
        w.add_token_scores(tok["scores"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    if "unk" in tok:
        w.add_unk_token_id(tok["unk"])
    if "add_bos" in tok:
        w.add_add_bos_token(tok["add_bos"])
    if "chat_template" in tok:
        w.add_chat_template(tok["chat_template"])


def random_blocks(rows: int, cols: int, qtype: str, seed: int) -> np.ndarray:
    """Quantised rows [rows, bytes] of random blocks whose every fp16 field is small and finite.

    gguf cannot quantise to the K types, so their tests use random block bytes. All bytes are drawn below
    0x2C: read as the high byte of an fp16 scale that bounds it under 0.08, whatever the block layout, while
    the 4-6 bit codes still take many values.
    """
    import gguf

    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert cols % block_elems == 0
    rng = np.random.default_rng(seed)
    return rng.integers(0, 0x2C, size=(rows, cols // block_elems * block_bytes), dtype=np.uint8)
