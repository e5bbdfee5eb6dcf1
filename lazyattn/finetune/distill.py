"""Distillation from full attention (docs/finetune.md, Distillation): no labels, the model teaches itself.

Teacher: the same checkpoint reading the concatenated prompt with ordinary causal attention, frozen — with
LoRA, the model with its adapter disabled (`teacher="base"`, the default); the model as training starts, frozen
(`teacher="start"`: with an initial adapter, that adapter on); or the model being trained, adapter on, under full
attention and without gradient (`teacher="self"`: a moving target that follows what the labelled rows teach full
mode). Student: the block row (masks.py) with the adapter, or for a share of rows (`full_share`, frozen teachers
only) the full row, which holds full mode where the teacher has it. Loss: forward
KL(teacher ‖ student) of the next-token distributions at the question and answer positions (optionally the
answer positions only), both softened by `temperature` and scaled by temperature² so gradients keep their size.

The answers are the teacher's own: greedy, under full attention, up to `answer_tokens` tokens, generated once
before training by the teacher as training starts (a questions file may give them instead).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from lazyattn.engine.prompt import DEFAULT_LAYOUT, PromptLayout, RenderedPrompt, render_chat, render_completion
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.config import SPANS as SPANS  # the settings live in config.py, torch-free
from lazyattn.finetune.config import TEACHERS as TEACHERS
from lazyattn.finetune.config import DistillConfig as DistillConfig
from lazyattn.finetune.corpus import passages, read_documents
from lazyattn.finetune.data import Example
from lazyattn.finetune.prompts import Prompt, make_prompts, read_questions
from lazyattn.model.tokenizer import TokenizerBase


def kl_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean over positions of KL(softmax(teacher/T) ‖ softmax(student/T)) · T²; logits [N, V], computed in fp32."""
    log_q = torch.log_softmax(student.float() / temperature, -1)
    log_p = torch.log_softmax(teacher.float() / temperature, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean() * temperature**2


def load_prompts(cfg: DistillConfig, seed: int = 0) -> list[Prompt]:
    if cfg.few_shot is not None:
        from lazyattn.finetune import few_shot

        return few_shot.make_prompts(few_shot.read_examples(cfg.few_shot), cfg.prompts, seed)
    docs = read_documents(cfg.documents) if cfg.documents is not None else []
    if cfg.questions is not None:
        return read_questions(cfg.questions, docs)
    return make_prompts(passages(docs, cfg.passage_chars), cfg.prompts, cfg.docs_per_prompt, seed, cfg.kinds)


def teacher_examples(
    model: torch.nn.Module,
    tokenizer: TokenizerBase,
    prompts: Sequence[Prompt],
    answer_tokens: int,
    device: torch.device,
    layouts: Sequence[PromptLayout] = (DEFAULT_LAYOUT,),
    max_tokens: int | None = None,
    batch_tokens: int = 32768,
) -> list[Example]:
    """Distillation examples: prompt k rendered as the engine renders it in layout k mod len(layouts), its
    answer the teacher's greedy
    continuation under full attention (ended by the end-of-turn token when the teacher ended it) unless the
    prompt carries one. Prompts longer than `max_tokens` with their answer are dropped. Generation batches hold
    at most `batch_tokens` padded prompt tokens (eager attention keeps a batch x heads x length² score tensor)."""
    rendered = [render_prompt(tokenizer, p, layouts[k % len(layouts)]) for k, p in enumerate(prompts)]
    eos = tokenizer.eos_token_ids
    answers: list[list[int] | None] = [
        tokenizer.encode(p.answer) + eos[:1] if p.answer is not None else None for p in prompts
    ]
    todo = [i for i, a in enumerate(answers) if a is None]
    if max_tokens is not None:
        todo = [i for i in todo if rendered[i].num_tokens + answer_tokens <= max_tokens]
    todo.sort(key=lambda i: rendered[i].num_tokens)  # similar lengths together: little padding
    while todo:
        rows = 1  # ascending lengths: the last row of a batch is its longest
        while rows < len(todo) and (rows + 1) * (rendered[todo[rows]].num_tokens + answer_tokens) <= batch_tokens:
            rows += 1
        chunk, todo = todo[:rows], todo[rows:]
        for i, answer in zip(chunk, greedy(model, [rendered[i].token_ids for i in chunk], answer_tokens, eos, device)):
            answers[i] = answer
    examples = [Example(r.segments, r.final, a, distill=True) for r, a in zip(rendered, answers) if a]
    if max_tokens is not None:
        examples = [e for e in examples if e.num_tokens <= max_tokens]
    if not examples:
        raise InvalidRequestError(f"no distillation prompt fits in {max_tokens} tokens", param="max_tokens")
    return examples


def render_prompt(tokenizer: TokenizerBase, prompt: Prompt, layout: PromptLayout) -> RenderedPrompt:
    """`prompt` as the engine renders it: a chat request in `layout`, or a plain prompt whose documents are each
    their text and a blank line, after its own system text where it has one."""
    if not prompt.plain:
        return render_chat(tokenizer, [{"role": "user", "content": prompt.question}], prompt.documents, layout)
    layout = dataclasses.replace(layout, untitled_document_format="{text}\n\n")
    if prompt.system is not None:
        layout = dataclasses.replace(layout, completion_system_prompt=prompt.system)
    return render_completion(tokenizer, prompt.question, prompt.documents, layout)


@torch.no_grad()
def greedy(
    model: torch.nn.Module, prompts: Sequence[list[int]], max_new: int, eos: Sequence[int], device: torch.device
) -> list[list[int]]:
    """Greedy continuations under ordinary causal attention (left-padded batch, KV cache); each ends with its
    first end-of-sequence token, or after `max_new` tokens."""
    length = max(map(len, prompts))
    ids = torch.zeros(len(prompts), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, length - len(p) :] = torch.tensor(p)
        mask[i, length - len(p) :] = 1
    was_training = model.training
    model.eval()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=eos[0] if eos else 0,
            eos_token_id=list(eos) or None,
        )
    model.train(was_training)
    answers = []
    for row in out[:, length:].tolist():
        ends = [k for k, t in enumerate(row) if t in eos]
        answers.append(row[: ends[0] + 1] if ends else row)
    return answers


def span_mask(
    examples: Sequence[Example], lengths: Sequence[int], width: int, span: str = "question+answer"
) -> torch.Tensor:
    """[B, width] bool: positions whose logits are distilled, in rows of `lengths` tokens that end with the final
    segment and the answer — from the first final-segment token (or the last prompt token, for `answer`) to the
    token before the last one, i.e. the logits that predict the rest of the question and the answer."""
    out = torch.zeros(len(examples), width, dtype=torch.bool)
    for i, (e, n) in enumerate(zip(examples, lengths)):
        if not e.distill:
            continue
        end = n - 1
        start = end - len(e.answer) if span == "answer" else end - len(e.answer) - len(e.final) + 1
        out[i, start:end] = True
    return out
