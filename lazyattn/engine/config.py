"""The engine's one configuration object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

MODES = ("lazy", "block", "prefix", "full")


def check_relink(mode: str, relink_tokens: int) -> None:
    """Relink is a lazy-mode option: prefix and full read every document in context already, and block mode's
    private copies are not relinked (docs/design.md, "Relink")."""
    if not isinstance(relink_tokens, int) or isinstance(relink_tokens, bool) or relink_tokens < 0:
        raise InvalidRequestError(f"relink_tokens must be an integer >= 0, got {relink_tokens!r}", "relink_tokens")
    if relink_tokens and mode != "lazy":
        why = (
            "block mode reads private re-rotated copies; relink is implemented for lazy mode only"
            if mode == "block"
            else f"{mode} mode attends to every document in context already"
        )
        raise InvalidRequestError(f"relink_tokens={relink_tokens} needs mode 'lazy': {why}", "relink_tokens")


def check_ape(mode: str, temperature: float, scale: float, prefix: bool = False) -> None:
    """The attention temperature and scale on documents (docs/design.md, "APE") are options of the block semantics:
    lazy and block mode; prefix and full attend to every document in context already. The shared prefix (documents
    encoded after the first segment) is lazy mode's: block mode's private copies are rotated from position 0."""
    if not isinstance(prefix, bool):
        raise InvalidRequestError(f"ape_prefix must be true or false, got {prefix!r}", "ape_prefix")
    if prefix and mode != "lazy":
        raise InvalidRequestError(
            f"ape_prefix needs mode 'lazy': {mode} mode "
            + ("copies documents encoded at position 0" if mode == "block" else "attends to everything in context"),
            "ape_prefix",
        )
    for name, value in (("ape_temperature", temperature), ("ape_scale", scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise InvalidRequestError(f"{name} must be a finite number > 0, got {value!r}", name)
    if (temperature != 1 or scale != 1) and mode not in ("lazy", "block"):
        param = "ape_temperature" if temperature != 1 else "ape_scale"
        raise InvalidRequestError(
            f"ape_temperature={temperature}, ape_scale={scale} need mode 'lazy' or 'block': {mode} mode attends "
            "to every document in context already",
            param,
        )


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"
    mode: str = "lazy"
    device: str = "cpu"
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on CPU
    page_size: int = 64
    kv_cache_gb: float | None = None  # explicit KV budget; otherwise sized from free GPU memory
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192  # tokens per forward step (chunked prefill budget)
    max_num_seqs: int = 256  # sequences running at once
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_waiting: int | None = None  # waiting-queue limit (the server answers 503 past it)
    seed: int = 0
    random_weights: bool = False  # read only config.json and draw weights from `seed` (benchmarks)
    cuda_graphs: bool = True  # capture decode steps on CUDA
    warm_up: bool = True  # on CUDA: compile/tune kernels and capture graphs before the first request
    progress: bool = True  # progress bars (loading, generate)
    relink_tokens: int = 0  # lazy mode: default recomputed rows per placed document (docs/design.md, "Relink")
    # lazy and block mode: the final segment's scores against document keys become s / T + ln S (docs/design.md,
    # "APE"); 1.0: off. T < 1 sharpens the attention to the documents, S > 1 gives them more weight in total.
    ape_temperature: float = 1.0  # T: attention temperature on the documents after the first segment
    ape_scale: float = 1.0  # S: attention scale on the documents after the first segment
    # lazy mode: encode each document after the first segment with that segment visible (its shared attention sink),
    # cached once per (first segment, document) and read at any slot (docs/design.md, "APE")
    ape_prefix: bool = False
    # Host tier for evicted documents (docs/design.md, "The host tier"); 0: off; None: off on the CPU, on CUDA a
    # quarter of the available host memory, at most 64 GiB.
    host_cache_gb: float | None = None
    tensor_parallel_size: int = 1  # GPUs (ranks) one engine spans (docs/design.md, "Tensor parallelism")
    # Schedule step N+1 while the GPU runs step N (docs/design.md, "Overlapped scheduling"); None: on CUDA,
    # with or without tensor parallelism, off on the CPU, where the host is the device and nothing overlaps.
    async_scheduling: bool | None = None
    # Documents' token ids kept by the tokenizer, so that a recurring document is tokenised once (docs/design.md,
    # "Document token ids"); 0: off. A stored token costs at most ~36 bytes of host memory (a Python int and its
    # tuple slot; ids below 257 are shared ints: ~27 bytes measured with SmolLM2), so the default 2**22 (~4M tokens,
    # ~150 MB at most, plus the texts) covers more documents than a GPU's KV pool usually holds at little cost.
    tokenizer_cache_tokens: int = 2**22

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}", "mode")
        if self.page_size < 16 or self.page_size & (self.page_size - 1):
            raise InvalidRequestError(f"page_size must be a power of two >= 16, got {self.page_size}", "page_size")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidRequestError("gpu_memory_utilization must be in (0, 1]", "gpu_memory_utilization")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise InvalidRequestError("kv_cache_gb must be positive", "kv_cache_gb")
        if self.host_cache_gb is not None and not self.host_cache_gb >= 0:
            raise InvalidRequestError(f"host_cache_gb must be >= 0, got {self.host_cache_gb}", "host_cache_gb")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise InvalidRequestError("max_num_batched_tokens and max_num_seqs must be >= 1")
        check_relink(self.mode, self.relink_tokens)
        check_ape(self.mode, self.ape_temperature, self.ape_scale, self.ape_prefix)
        t = self.tokenizer_cache_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidRequestError(
                f"tokenizer_cache_tokens must be an integer >= 0, got {t!r}", "tokenizer_cache_tokens"
            )
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise InvalidRequestError(
                f"tensor_parallel_size must be an integer >= 1, got {tp!r}", "tensor_parallel_size"
            )
        if self.async_scheduling not in (None, True, False):
            raise InvalidRequestError(
                f"async_scheduling must be true, false or None, got {self.async_scheduling!r}", "async_scheduling"
            )
        if tp > 1 and self.host_cache_gb:
            raise InvalidRequestError(
                "host_cache_gb (the host tier) is not supported with tensor parallelism yet: "
                "every rank would need its own tier",
                "host_cache_gb",
            )

    @property
    def ape_on(self) -> bool:
        """Whether requests default to a temperature or scale on the documents (CUDA graphs then carry them)."""
        return self.ape_temperature != 1 or self.ape_scale != 1

    @property
    def async_scheduling_on(self) -> bool:
        """Whether the engine overlaps scheduling: as asked, or by default where it helps (CUDA, with or without
        tensor parallelism)."""
        return self.device.startswith("cuda") if self.async_scheduling is None else self.async_scheduling

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # here, so that the CLI starts without loading torch

        if self.dtype is None:
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]
        except KeyError:
            raise InvalidRequestError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}") from None
