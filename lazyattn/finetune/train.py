"""The training loop: block rows and full rows mixed, loss on the answer tokens, LoRA (peft) or every weight.

Recipe (defaults of FinetuneConfig, docs/finetune.md): Block-Attention's — the same examples are trained with
the served block semantics and, for a share of rows (`full_share`), with ordinary causal attention, so one
checkpoint serves `lazy`/`block` and keeps working in `full`/`prefix`. AdamW, linear warm-up then cosine decay,
gradient clipping at 1; bf16 autocast on CUDA (fp32 master weights), fp32 on the CPU.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from lazyattn.engine.prompt import DEFAULT_LAYOUT, PromptLayout
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune import masks
from lazyattn.finetune.base import Base, load_base
from lazyattn.finetune.data import BUILTIN, Example, encode_items, load_items
from lazyattn.model.adapter import read_adapter

# Every projection of a Llama-family block: attention and MLP.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RECIPE_FILE = "finetune.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class FinetuneConfig:
    model: str = "smollm2"
    out: str = "finetuned"
    data: str = BUILTIN  # or the path of a JSONL file in the `lazyattn eval` format
    examples: int | None = 4000  # items drawn from the built-in set (a file: the first N, None = all)
    steps: int = 400
    batch_size: int = 16
    lr: float | None = None  # None: 5e-4 for LoRA, 2e-5 for full fine-tuning
    warmup_steps: int = 20
    full_share: float = 0.25  # share of rows trained with causal attention (keeps `full` mode working)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: Sequence[str] = DEFAULT_TARGETS
    full_finetune: bool = False  # train every weight instead of LoRA adapters
    merge: bool = False  # also fold the adapter into the weights (out/ = merged model, out/adapter/ = adapter)
    device: str | None = None  # default: cuda if available
    seed: int = 0
    max_tokens: int = 4096  # longer examples are dropped
    max_seconds: float | None = None  # stop after this much training time (then save as usual)
    save_dtype: str = "bfloat16"
    progress: bool = True
    layout: PromptLayout = field(default=DEFAULT_LAYOUT, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.full_share <= 1.0:
            raise InvalidRequestError(f"full_share must be in [0, 1], got {self.full_share}", param="full_share")
        for name in ("steps", "batch_size", "lora_rank"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive, got {getattr(self, name)}", param=name)
        if self.save_dtype not in _DTYPES:
            raise InvalidRequestError(f"save_dtype must be one of {', '.join(_DTYPES)}", param="save_dtype")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (2e-5 if self.full_finetune else 5e-4)


@dataclass
class FinetuneResult:
    out: Path
    losses: list[float]  # per step, mean over the batch's answer tokens
    tokens: int  # tokens fed (padding excluded)
    seconds: float


def make_batch(
    examples: Sequence[Example], blocks: Sequence[bool], device: torch.device | str = "cpu", pad_id: int = 0
) -> dict[str, torch.Tensor]:
    """transformers inputs for rows of examples: right-padded ids, logical `position_ids`, the 4-D additive
    mask (block or causal per row), and labels = the answer tokens (-100 elsewhere; transformers shifts)."""
    length = max(e.num_tokens for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    rows = []
    for i, (e, block) in enumerate(zip(examples, blocks)):
        tokens = e.tokens
        ids[i, : len(tokens)] = torch.tensor(tokens)
        labels[i, len(tokens) - len(e.answer) : len(tokens)] = torch.tensor(e.answer)
        rows.append(masks.visible([len(s) for s in e.segments], len(e.final) + len(e.answer), block))
    mask = masks.additive(masks.padded(rows, length))
    positions = torch.arange(length).expand(len(examples), length)
    return {
        "input_ids": ids.to(device),
        "position_ids": positions.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
    }


def finetune(cfg: FinetuneConfig, command: str | None = None) -> FinetuneResult:
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(cfg.seed)
    base = load_base(cfg.model)
    items = load_items(cfg.data, cfg.examples, cfg.seed)
    examples = encode_items(base.tokenizer, items, cfg.layout, cfg.max_tokens)
    model = base.model.to(device)
    if not cfg.full_finetune:
        model = _with_lora(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg.warmup_steps, cfg.steps))
    rng = random.Random(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    tokens = 0
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="finetune", unit="step", disable=not cfg.progress, file=sys.stderr)
    for _ in bar:
        picked = []
        while len(picked) < cfg.batch_size:
            if not order:
                order = rng.sample(range(len(examples)), len(examples))
            picked.append(examples[order.pop()])
        blocks = [rng.random() >= cfg.full_share for _ in picked]
        batch = make_batch(picked, blocks, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens += sum(e.num_tokens for e in picked)
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / elapsed:,.0f}")
        if cfg.max_seconds is not None and elapsed > cfg.max_seconds:
            break
    seconds = time.perf_counter() - start
    out = Path(cfg.out)
    model.eval()
    recipe = {
        "command": command,
        "config": {k: v for k, v in asdict(cfg).items() if k != "layout"},
        "examples": len(examples),
        "steps_done": len(losses),
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "device": str(device),
        "loss_first_10": _mean(losses[:10]),
        "loss_last_10": _mean(losses[-10:]),
        "loss_per_50_steps": [_mean(losses[i : i + 50]) for i in range(0, len(losses), 50)],
    }
    if cfg.full_finetune:
        _save_model(model, base, out, cfg.save_dtype)
    else:
        adapter_dir = out / "adapter" if cfg.merge else out
        _save_adapter(model, cfg, adapter_dir)
        (adapter_dir / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
        if cfg.merge:
            merge_adapter(adapter_dir, out, cfg.save_dtype, base=_unwrapped(model, base))
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    return FinetuneResult(out, losses, tokens, seconds)


def merge_adapter(
    adapter_dir: str | Path, out: str | Path, save_dtype: str = "bfloat16", base: Base | None = None
) -> Path:
    """A full checkpoint (config.json, model.safetensors, tokenizer files) = base + adapter, via peft."""
    from peft import PeftModel

    adapter = read_adapter(adapter_dir)
    base = base or load_base(adapter.base)
    merged = PeftModel.from_pretrained(base.model.float().cpu(), str(adapter_dir)).merge_and_unload()
    out = Path(out)
    _save_model(merged, base, out, save_dtype)
    return out


# ---------------------------------------------------------------------------------------------------------------


def _with_lora(model: torch.nn.Module, cfg: FinetuneConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    unknown = sorted(set(cfg.lora_targets) - names)
    if unknown:
        raise InvalidRequestError(f"LoRA targets {unknown} are not modules of this model", param="lora_targets")
    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _unwrapped(model: torch.nn.Module, base: Base) -> Base:
    """The base after training: its weights unchanged (LoRA trains only the adapter), a fresh peft wrapper."""
    return Base(base.name, model.unload(), base.tokenizer)


def _save_adapter(model: torch.nn.Module, cfg: FinetuneConfig, directory: Path) -> None:
    dtype = _DTYPES[cfg.save_dtype]
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(dtype)
    model.peft_config["default"].base_model_name_or_path = cfg.model
    model.save_pretrained(str(directory))
    (directory / "README.md").unlink(missing_ok=True)  # peft's empty model card template
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()


def _save_model(model: torch.nn.Module, base: Base, out: Path, save_dtype: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu", _DTYPES[save_dtype])
    model.config.dtype = save_dtype
    model.save_pretrained(str(out))
    base.save_tokenizer(out)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None
