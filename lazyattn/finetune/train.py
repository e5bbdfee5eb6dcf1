"""The training loop: block rows and full rows mixed, loss on the answer tokens, LoRA (peft) or every weight;
with distillation (distill.py), block rows that match the full-attention teacher (KL), alone or mixed in.

Recipe (FinetuneConfig's defaults, config.py; docs/finetune.md): Block-Attention's — the same examples are trained
with the served block semantics and, for a share of rows (`full_share`), with ordinary causal attention, so one
checkpoint serves `lazy`/`block` and keeps working in `full`/`prefix`. AdamW, linear warm-up then cosine decay,
gradient clipping at 1; bf16 autocast on CUDA (fp32 master weights), fp32 on the CPU.
"""

from __future__ import annotations

import contextlib
import copy
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

from lazyattn.engine.prompt_layout import DEFAULT_LAYOUT, NAMED_LAYOUTS, PromptLayout
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune import distill, masks
from lazyattn.finetune.base import Base, load_base
from lazyattn.finetune.config import DEFAULT_TARGETS as DEFAULT_TARGETS  # the settings live in config.py, torch-free
from lazyattn.finetune.config import FinetuneConfig as FinetuneConfig
from lazyattn.finetune.data import Example, encode_items, load_items
from lazyattn.model.adapter import read_adapter
from lazyattn.model.hub import resolve_model

RECIPE_FILE = "finetune.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class FinetuneResult:
    out: Path
    losses: list[float]  # per step: labelled_weight x cross-entropy (answer tokens) + KL (distilled tokens)
    tokens: int  # tokens fed (padding excluded)
    seconds: float
    terms: dict[str, list[float]] = field(default_factory=dict)  # "ce", "kl": per step where the batch had it
    held_out_kl_before: float | None = None  # distillation loss on held-out prompts, before and after training
    held_out_kl_after: float | None = None


def make_batch(
    examples: Sequence[Example],
    blocks: Sequence[bool],
    device: torch.device | str = "cpu",
    pad_id: int = 0,
    ape_prefix: bool = False,
) -> dict[str, torch.Tensor]:
    """transformers inputs for rows of examples (masks.row: block or causal per row, block rows with the shared
    prefix when `ape_prefix`): right-padded ids, the rows' `position_ids`, the 4-D additive mask, and labels = the
    answer tokens of labelled rows (-100 elsewhere, and on distillation rows; transformers shifts)."""
    rows = [masks.row(e.segments, e.final + e.answer, block, ape_prefix) for e, block in zip(examples, blocks)]
    length = max(len(r.tokens) for r in rows)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    positions = torch.arange(length).repeat(len(examples), 1)
    labels = torch.full_like(ids, -100)
    for i, (e, r) in enumerate(zip(examples, rows)):
        n = len(r.tokens)
        ids[i, :n] = torch.tensor(r.tokens)
        positions[i, :n] = torch.tensor(r.positions)
        if not e.distill:
            labels[i, n - len(e.answer) : n] = torch.tensor(e.answer)
    mask = masks.additive(masks.padded([r.visible for r in rows], length))
    return {
        "input_ids": ids.to(device),
        "position_ids": positions.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
    }


def row_lengths(examples: Sequence[Example], blocks: Sequence[bool], ape_prefix: bool = False) -> list[int]:
    """The length of each example's row in make_batch."""
    return [
        masks.row_length([len(s) for s in e.segments], len(e.final) + len(e.answer), block, ape_prefix)
        for e, block in zip(examples, blocks)
    ]


class Objective:
    """One step's loss for a mixed batch: cross-entropy on the labelled rows' answer tokens (weight
    `labelled_weight`) plus the KL to the full-attention teacher on the distillation rows (distill.py).

    Logits are computed only where a loss needs them (the vocabulary projection of every document token would
    cost more than the rest of a small model)."""

    def __init__(self, model: torch.nn.Module, cfg: FinetuneConfig, frozen: torch.nn.Module | None = None) -> None:
        self.model = model
        self.distill = cfg.distill  # None: labelled rows only
        self.ape_prefix = cfg.ape_prefix  # block rows read the first segment (masks.row)
        self.frozen = frozen  # a frozen copy that teaches (`start`, or `base` for a full fine-tune), else None

    def __call__(self, examples: Sequence[Example], blocks: Sequence[bool], device: torch.device) -> LossTerms:
        batch = make_batch(examples, blocks, device, ape_prefix=self.ape_prefix)
        labels = batch.pop("labels")
        lm = _causal_lm(self.model)
        terms = LossTerms()
        with _autocast(device):
            hidden = lm.model(**batch, use_cache=False).last_hidden_state
            targets = labels[:, 1:] != -100
            if targets.any():
                logits = lm.lm_head(hidden[:, :-1][targets]).float()
                terms.ce = torch.nn.functional.cross_entropy(logits, labels[:, 1:][targets])
            if any(e.distill for e in examples):
                lengths = row_lengths(examples, blocks, self.ape_prefix)
                span = distill.span_mask(examples, lengths, hidden.shape[1], self.distill.span).to(device)
                student = lm.lm_head(hidden[span])
                teacher = self.teacher_logits([e for e in examples if e.distill], device)
                terms.kl = distill.kl_loss(student, teacher, self.distill.temperature)
        return terms

    @torch.no_grad()
    def teacher_logits(self, examples: Sequence[Example], device: torch.device) -> torch.Tensor:
        """The teacher's logits at the distilled positions: full attention over the examples' tokens. The student's
        row may be longer (copies of the first segment), but both end with the final segment and the answer, so
        the two select the same positions in the same order."""
        batch = make_batch(examples, [False] * len(examples), device)
        batch.pop("labels")
        lengths = [e.num_tokens for e in examples]
        span = distill.span_mask(examples, lengths, batch["input_ids"].shape[1], self.distill.span).to(device)
        if self.frozen is not None:
            context, model = contextlib.nullcontext(), self.frozen
        else:
            context, model = _teacher_weights(self.model, self.distill.teacher), self.model
        lm = _causal_lm(model)
        was_training = model.training
        model.eval()
        with context, _autocast(device):
            logits = lm.lm_head(lm.model(**batch, use_cache=False).last_hidden_state[span])
        model.train(was_training)
        return logits

    @torch.no_grad()
    def mean_kl(self, examples: Sequence[Example], device: torch.device, batch_size: int = 8) -> float:
        """The distillation loss over `examples` (block rows), weighted by token count; no gradient."""
        total = count = 0.0
        for start in range(0, len(examples), batch_size):
            rows = examples[start : start + batch_size]
            lengths = [e.num_tokens for e in rows]  # the count of distilled positions depends on no layout
            n = int(distill.span_mask(rows, lengths, max(lengths), self.distill.span).sum())
            total += self(rows, [True] * len(rows), device).kl.item() * n
            count += n
        return total / count


@dataclass
class LossTerms:
    ce: torch.Tensor | None = None
    kl: torch.Tensor | None = None

    def total(self, labelled_weight: float) -> torch.Tensor:
        if self.ce is None:
            return self.kl
        return labelled_weight * self.ce if self.kl is None else labelled_weight * self.ce + self.kl


def finetune(cfg: FinetuneConfig, command: str | None = None) -> FinetuneResult:
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(cfg.seed)
    if cfg.init_adapter is not None:
        _init_adapter_path(cfg)  # before anything is loaded
    base = load_base(cfg.model, cfg.attention)
    model = base.model.to(device)
    labelled: list[Example] = []
    layouts = list(cfg.layouts) if cfg.layouts is not None else [DEFAULT_LAYOUT]
    if cfg.labelled_rows > 0:
        items = load_items(cfg.data, cfg.examples, cfg.seed)
        labelled = encode_items(base.tokenizer, items, layouts, cfg.max_tokens)
    if not cfg.full_finetune:
        model = _with_lora(model, cfg)
    distilled: list[Example] = []
    held_out: list[Example] = []
    frozen = None
    if cfg.distill is not None:
        teacher = cfg.distill.teacher
        if teacher == "start" or (teacher == "base" and cfg.full_finetune):
            frozen = copy.deepcopy(model).eval().requires_grad_(False)  # the weights as training starts
        prompts = distill.load_prompts(cfg.distill, cfg.seed)
        with _teacher_weights(model, teacher):  # the answers are the teacher's own
            distilled = distill.teacher_examples(
                model, base.tokenizer, prompts, cfg.distill.answer_tokens, device, layouts, cfg.max_tokens
            )
        if len(distilled) > 2 * cfg.distill.held_out:
            held_out, distilled = distilled[: cfg.distill.held_out], distilled[cfg.distill.held_out :]
    objective = Objective(model, cfg, frozen)
    kl_before = objective.mean_kl(held_out, device) if held_out else None
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg.warmup_steps, cfg.steps))
    rng = random.Random(cfg.seed)
    pools = {"labelled": _Pool(labelled, rng), "distill": _Pool(distilled, rng)}
    losses: list[float] = []
    terms: dict[str, list[float]] = {"ce": [], "kl": []}
    tokens = 0
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="finetune", unit="step", disable=not cfg.progress, file=sys.stderr)
    share = cfg.labelled_rows
    for _ in bar:
        # A row's source is drawn only when mixing, so a labelled-only run keeps its data order.
        mixed = [0.0 < share < 1.0 and rng.random() < share for _ in range(cfg.batch_size)]
        picked = [pools["labelled" if share == 1.0 or m else "distill"].next() for m in mixed]
        blocks = [_block_row(e, cfg, rng) for e in picked]
        step = objective(picked, blocks, device)
        loss = step.total(cfg.labelled_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        for name in terms:
            if (value := getattr(step, name)) is not None:
                terms[name].append(value.item())
        tokens += sum(e.num_tokens for e in picked)
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / elapsed:,.0f}")
        if cfg.max_seconds is not None and elapsed > cfg.max_seconds:
            break
    seconds = time.perf_counter() - start
    model.eval()
    kl_after = objective.mean_kl(held_out, device) if held_out else None
    out = Path(cfg.out)
    recipe = {
        "command": command,
        "config": {**asdict(cfg), "layouts": [_layout_name(layout) for layout in layouts]},
        "examples": len(labelled),
        "distill_examples": len(distilled),
        "steps_done": len(losses),
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "device": str(device),
        "loss_first_10": _mean(losses[:10]),
        "loss_last_10": _mean(losses[-10:]),
        "loss_per_50_steps": [_mean(losses[i : i + 50]) for i in range(0, len(losses), 50)],
    }
    for name, values in terms.items():
        if values:
            recipe[f"{name}_per_50_steps"] = [_mean(values[i : i + 50]) for i in range(0, len(values), 50)]
    if held_out:
        recipe["held_out_kl"] = {"prompts": len(held_out), "before": round(kl_before, 4), "after": round(kl_after, 4)}
        recipe["distill_samples"] = [_sample(base.tokenizer, e) for e in distilled[:5]]
    if cfg.full_finetune:
        _save_model(model, base, out, cfg.save_dtype)
    else:
        adapter_dir = out / "adapter" if cfg.merge else out
        _save_adapter(model, cfg, adapter_dir)
        (adapter_dir / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
        if cfg.merge:
            merge_adapter(adapter_dir, out, cfg.save_dtype, base=_unwrapped(model, base))
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    return FinetuneResult(out, losses, tokens, seconds, terms, kl_before, kl_after)


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
    from peft import LoraConfig, PeftModel, get_peft_model

    if cfg.init_adapter is not None:
        return PeftModel.from_pretrained(model, _init_adapter_path(cfg), is_trainable=True)

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


def _init_adapter_path(cfg: FinetuneConfig) -> str:
    """The directory of `cfg.init_adapter`, checked to be an adapter over `cfg.model`."""
    path = resolve_model(cfg.init_adapter)
    base = read_adapter(path).base
    if base != cfg.model:
        raise InvalidRequestError(
            f"{cfg.init_adapter} is an adapter over {base!r}, not over --model {cfg.model!r}", param="init_adapter"
        )
    return path


def _teacher_weights(model: torch.nn.Module, teacher: str):
    """The context in which `model` computes what the teacher does as training starts: the adapter off for
    `base` (a LoRA model; a full fine-tune starts at the base), as it is for `start` and `self`."""
    if teacher == "base" and hasattr(model, "disable_adapter"):
        return model.disable_adapter()
    return contextlib.nullcontext()


def _block_row(example: Example, cfg: FinetuneConfig, rng: random.Random) -> bool:
    """Whether `example` is trained as a block row: labelled rows are full rows for `full_share` of them, distilled
    rows for the distillation's `full_share` (no draw at 0, so recipes without it keep their data order)."""
    share = cfg.distill.full_share if example.distill else cfg.full_share
    return not share or rng.random() >= share


class _Pool:
    """Examples drawn in a fresh random order each pass."""

    def __init__(self, examples: list[Example], rng: random.Random) -> None:
        self.examples, self.rng, self.order = examples, rng, []

    def next(self) -> Example:
        if not self.order:
            self.order = self.rng.sample(range(len(self.examples)), len(self.examples))
        return self.examples[self.order.pop()]


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers CausalLM under a peft wrapper (its LoRA layers are injected in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _layout_name(layout: PromptLayout) -> str | dict:
    """A named layout's name (NAMED_LAYOUTS), any other layout's fields."""
    return next((name for name, named in NAMED_LAYOUTS.items() if named == layout), asdict(layout))


def _sample(tokenizer, e: Example) -> dict[str, str]:
    return {"prompt_end": tokenizer.decode(e.final)[-200:], "teacher_answer": tokenizer.decode(e.answer)}


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
