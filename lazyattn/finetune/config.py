"""The fine-tuning recipe's settings (docs/finetune.md): plain data, no torch, so `lazyattn finetune -h` reads its
defaults without loading the training code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:
    from lazyattn.engine.prompt import PromptLayout

BUILTIN = "builtin"  # the generated evaluation set's training split (data.py)
# Every projection of a Llama-family block: attention and MLP.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SAVE_DTYPES = ("float32", "bfloat16", "float16")
# transformers' attention over the training rows: PyTorch's fused kernels (memory linear in the row length) or a
# rows x heads x length² score tensor per layer; both read masks.py's additive 4-D masks as given
ATTENTION = ("sdpa", "eager")
TEACHERS = ("base", "self", "start")
SPANS = ("question+answer", "answer")
# The questions made from documents (prompts.py); "cloze" is the one that writes its answer.
QUESTION_KINDS = ("about", "continue", "quote", "summary", "cloze")
DEFAULT_KINDS = ("about", "continue", "quote", "summary")


@dataclass(frozen=True)
class DistillConfig:
    documents: str | None = None  # a folder, a JSONL of documents, or "stdlib-docstrings"
    questions: str | None = None  # a JSONL of questions; None: made from the documents
    # labelled texts made into few-shot prompts (few_shot.py): "sphinx-languages" or a JSONL of {"text", "label"}
    few_shot: str | None = None
    prompts: int = 2000  # prompts made from the documents (ignored with `questions`)
    docs_per_prompt: Sequence[int] = (2, 3, 4, 5, 6, 8)
    passage_chars: int = 1500  # longer documents are cut into passages of about this size
    answer_tokens: int = 48  # the teacher's greedy answer, at most this long
    temperature: float = 1.0
    teacher: str = "base"
    # Share of distillation rows read with ordinary causal attention, matched to the teacher like the block rows:
    # with a frozen teacher they hold full mode where it starts (a `self` teacher would match them trivially).
    full_share: float = 0.0
    span: str = "question+answer"  # positions whose next-token distributions are matched
    kinds: Sequence[str] = field(default=DEFAULT_KINDS)
    held_out: int = 64  # prompts kept out of training to measure the KL before and after (when there are enough)

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.documents, self.questions, self.few_shot)) != 1:
            raise InvalidRequestError(
                "distillation reads exactly one of --documents, --questions and --few-shot", param="documents"
            )
        if self.teacher not in TEACHERS:
            raise InvalidRequestError(f"teacher must be one of {', '.join(TEACHERS)}", param="teacher")
        if not 0.0 <= self.full_share <= 1.0:
            raise InvalidRequestError(f"full_share must be in [0, 1], got {self.full_share}", param="full_share")
        if self.full_share > 0 and self.teacher == "self":
            raise InvalidRequestError(
                "distilled full rows need a frozen teacher (--teacher base or start): the model being trained "
                "under full attention is already its own target there",
                param="full_share",
            )
        if self.span not in SPANS:
            raise InvalidRequestError(f"span must be one of {', '.join(SPANS)}", param="span")
        if self.temperature <= 0 or self.answer_tokens <= 0 or self.prompts <= 0:
            raise InvalidRequestError("temperature, answer_tokens and prompts must be positive", param="distill")
        unknown = [k for k in self.kinds if k not in QUESTION_KINDS]
        if not self.kinds or unknown:
            raise InvalidRequestError(
                f"question kinds must be some of {', '.join(QUESTION_KINDS)}; got {', '.join(self.kinds) or 'none'}",
                param="question_kinds",
            )
        if not self.docs_per_prompt or min(self.docs_per_prompt) <= 0:
            raise InvalidRequestError("docs_per_prompt must hold positive counts", param="docs_per_prompt")


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
    # Start from this LoRA adapter over `model` (a directory or a named adapter such as "smollm2-block") instead of a
    # fresh one: its rank, alpha and targets are kept.
    init_adapter: str | None = None
    merge: bool = False  # also fold the adapter into the weights (out/ = merged model, out/adapter/ = adapter)
    device: str | None = None  # default: cuda if available
    seed: int = 0
    max_tokens: int = 4096  # longer examples are dropped
    attention: str = "sdpa"  # one of ATTENTION
    max_seconds: float | None = None  # stop after this much training time (then save as usual)
    save_dtype: str = "bfloat16"
    progress: bool = True
    # Each example is rendered in one of these, in turn (None: the engine's DEFAULT_LAYOUT alone).
    layouts: Sequence[PromptLayout] | None = field(default=None, repr=False)
    # Block rows as lazy mode with `ape_prefix=True` computes them: documents read the first segment (masks.py).
    ape_prefix: bool = False
    distill: DistillConfig | None = None  # distil from full attention on these documents / questions
    labelled_share: float | None = None  # share of rows from `data` when distilling (None: 0 with distill)
    labelled_weight: float = 1.0  # weight of the cross-entropy term beside the KL term

    def __post_init__(self) -> None:
        for name in ("full_share", "labelled_share"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise InvalidRequestError(f"{name} must be in [0, 1], got {value}", param=name)
        if self.labelled_share is not None and self.distill is None and self.labelled_share < 1.0:
            raise InvalidRequestError("labelled_share below 1 needs distillation (--distill)", param="labelled_share")
        for name in ("steps", "batch_size", "lora_rank"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive, got {getattr(self, name)}", param=name)
        if self.layouts is not None and not self.layouts:
            raise InvalidRequestError("layouts must hold at least one PromptLayout", param="layouts")
        if self.init_adapter is not None and self.full_finetune:
            raise InvalidRequestError("init_adapter continues a LoRA adapter, not full fine-tuning", "init_adapter")
        if self.attention not in ATTENTION:
            raise InvalidRequestError(f"attention must be one of {', '.join(ATTENTION)}", param="attention")
        if self.save_dtype not in SAVE_DTYPES:
            raise InvalidRequestError(f"save_dtype must be one of {', '.join(SAVE_DTYPES)}", param="save_dtype")

    @property
    def labelled_rows(self) -> float:
        """Probability that a row is drawn from the labelled set (else from the distillation set)."""
        if self.distill is None:
            return 1.0
        return self.labelled_share or 0.0

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (2e-5 if self.full_finetune else 5e-4)
