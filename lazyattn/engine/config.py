"""The engine's one configuration object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from lazyattn.engine.request_options import RequestOptions, check_ape, check_parallel, check_relink
from lazyattn.envs import EnvSettings, read_env
from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

# How documents are placed (docs/design.md, Modes): the one list the CLI, the server, eval and bench check against.
MODES = ("lazy", "block", "prefix", "full")
DTYPES = ("float32", "bfloat16", "float16")
# The KV pool's dtypes (docs/design.md, "FP8 KV cache"); kernels/kv_dtype.py maps them to torch dtypes.
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8_e4m3")


_SAME = object()  # _option's cli_default when the CLI's default is the field's


def _option(
    default,
    help: str,
    shown: str | None = None,
    flags: tuple[str, ...] = (),
    choices: tuple[str, ...] = (),
    cli_default=_SAME,
):
    """A field the CLI offers as an option (cli.py generates it) and its metadata: the help, the words for the
    default where the value says nothing (None; otherwise the value is shown), extra flags, the accepted values,
    and `cli_default` where the CLI's default differs (None: decided by cli.engine_options)."""
    meta = {"help": help, "shown": shown, "flags": flags, "choices": choices}
    if cli_default is not _SAME:
        meta["default"] = cli_default
    return field(default=default, metadata={"cli": meta})


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings. Fields with `cli` metadata are `lazyattn generate/serve/bench/eval` options of the
    same name (cli.py), their defaults and help written here once."""

    model: str = _option(
        "tiny",
        "'tiny' (built in, random weights), 'smollm2' (fetched once), a Hugging Face checkpoint directory or a .gguf "
        "file",
    )
    mode: str = _option("lazy", "how documents are placed (see docs/design.md)", choices=MODES)
    # The CLI's default is the GPU where one is present (cli.engine_options); the Python API's is the CPU.
    device: str = _option("cpu", "cuda or cpu", shown="cuda if available", cli_default=None)
    dtype: str | None = _option(
        None,
        "weights dtype, and the KV cache's unless --kv-cache-dtype says otherwise",
        shown="bfloat16 on CUDA, float32 on the CPU",
        choices=DTYPES,
    )
    # The KV pool's dtype (docs/design.md, "FP8 KV cache"): 'auto' is the model's; 'fp8_e4m3' stores every K/V element
    # in one byte (scale 1.0), quantized as it is cached, so the same memory holds twice the documents of bfloat16,
    # in every tier.
    kv_cache_dtype: str = _option(
        "auto",
        "KV cache dtype: auto (the model's), bfloat16 or fp8_e4m3 (docs/design.md, FP8 KV cache)",
        choices=KV_CACHE_DTYPES,
    )
    page_size: int = _option(64, "tokens per KV page")
    kv_cache_gb: float | None = _option(None, "KV budget, GiB", shown="from free GPU memory")
    gpu_memory_utilization: float = _option(0.9, "share of GPU memory the engine may use, KV included")
    # tokens per forward step (chunked prefill budget)
    max_num_batched_tokens: int = _option(8192, "prompt tokens prefilled per step, at most")
    max_num_seqs: int = _option(256, "sequences decoded together, at most")
    max_model_len: int | None = _option(None, "context limit in tokens, documents included", shown="the model's")
    max_waiting: int | None = None  # waiting-queue limit (the server answers 503 past it)
    seed: int = _option(0, "seed of random weights and unseeded sampling")
    random_weights: bool = False  # read only config.json and draw weights from `seed` (benchmarks)
    cuda_graphs: bool = True  # capture decode steps on CUDA
    warm_up: bool = True  # on CUDA: compile/tune kernels and capture graphs before the first request
    progress: bool = True  # progress bars (loading, generate)
    relink_tokens: int = _option(
        0, "lazy mode: recompute the first K rows of each placed document in context (docs/design.md, Relink)"
    )
    relink_last_tokens: int = _option(
        0, "lazy mode: recompute the last K rows of each placed document in context (docs/design.md, Relink)"
    )
    # lazy and block mode: the final segment's scores against document keys become s / T + ln S (docs/design.md,
    # "APE"); 1.0: off. T < 1 sharpens the attention to the documents, S > 1 gives them more weight in total.
    ape_temperature: float = _option(
        1.0, "lazy/block mode: the question's attention temperature T on the documents, 1: off (docs/design.md, APE)"
    )
    ape_scale: float = _option(
        1.0, "lazy/block mode: the question's attention scale S on the documents, 1: off (docs/design.md, APE)"
    )
    # lazy and block mode: ln S per document, raised by tilt/2 on the first and lowered by tilt/2 on the last
    # (docs/design.md, "APE"); 0: off. tilt > 0 weighs earlier documents more against the question's nearness to the
    # later ones.
    ape_tilt: float = _option(
        0.0,
        "lazy/block mode: ln S from +tilt/2 on the first document to -tilt/2 on the last, 0: off (docs/design.md, APE)",
    )
    # lazy mode: encode each document after the first segment with that segment visible (its shared attention sink),
    # cached once per (first segment, document) and read at any slot (docs/design.md, "APE")
    ape_prefix: bool = _option(
        False,
        "lazy mode: encode each document after the first segment, its shared attention sink (docs/design.md, APE)",
    )
    # lazy mode: every document read from the first segment's end (Adaptive Parallel Encoding's layout), the final
    # segment after the longest (docs/design.md, "APE")
    ape_parallel: bool = _option(
        False,
        "lazy mode: read every document from the first segment's end, the question after the longest "
        "(docs/design.md, APE)",
    )
    # Host tier for evicted documents (docs/design.md, "The host tier"); 0: off; None: off on the CPU, on CUDA a
    # quarter of the available host memory, at most 64 GiB.
    host_cache_gb: float | None = _option(
        None,
        "host-memory tier for documents evicted from the GPU, GiB; 0: off (docs/design.md, The host tier)",
        shown="off on the CPU, on CUDA a quarter of available host memory, at most 64",
    )
    # Disk tier for documents' KV (docs/design.md, "The disk tier"): written through when a document is encoded, read
    # back on a GPU and host miss, kept across restarts and shared by the engines that name the same directory. Off
    # unless a directory is given: it writes every encoded document, so the operator picks the volume.
    disk_cache_dir: str | None = _option(
        None,
        "directory of the disk tier for documents' KV, kept across restarts (docs/design.md, The disk tier)",
        shown="off",
    )
    disk_cache_gb: float = _option(64.0, "disk tier budget, GiB; least recently used files go first")
    # The disk tier reads a file only where that is expected to be no slower than encoding the document: it keeps
    # estimates of its read bandwidth (seeded here, else by its first read) and of the engine's encode throughput.
    disk_read_gbps: float | None = _option(
        None,
        "disk tier's read bandwidth to assume until reads measure it, GB/s (docs/design.md, The disk tier)",
        shown="measured by the first read",
    )
    disk_always_read: bool = _option(
        False, "read every disk-tier hit, even where encoding is expected to be faster (compute-bound restarts)"
    )
    tensor_parallel_size: int = _option(
        1,
        "GPUs one engine spans, one worker process each (docs/design.md, Tensor parallelism)",
        flags=("--tp",),
    )
    # Schedule step N+1 while the GPU runs step N (docs/design.md, "Overlapped scheduling"); None: on CUDA,
    # with or without tensor parallelism, off on the CPU, where the host is the device and nothing overlaps.
    async_scheduling: bool | None = _option(
        None,
        "schedule the next step while the GPU runs this one (docs/design.md, Overlapped scheduling)",
        shown="on CUDA, also with tensor parallelism; off on the CPU",
    )
    # Documents' token ids kept by the tokenizer, so that a recurring document is tokenised once (docs/design.md,
    # "Document token ids"); 0: off. A stored token costs at most ~36 bytes of host memory (a Python int and its
    # tuple slot; ids below 257 are shared ints: ~27 bytes measured with SmolLM2), so the default 2**22 (~4M tokens,
    # ~150 MB at most, plus the texts) covers more documents than a GPU's KV pool usually holds at little cost.
    tokenizer_cache_tokens: int = _option(
        2**22,
        "documents' token ids kept so that a recurring document is tokenised once, in tokens (~36 bytes each); 0: off",
    )
    # Batch-invariant numerics (docs/design.md, "Deterministic mode"): a request's token ids and logprobs do not
    # depend on what shares its batch, on how its prefill is chunked, or on preemption; one fixed-tile path for
    # every linear and for attention, at a throughput cost.
    deterministic: bool = _option(
        False,
        "batch-invariant numerics: the same tokens and logprobs whatever shares the batch, however the prefill "
        "is chunked (docs/design.md, Deterministic mode)",
    )
    # Decode steps read a page run that several sequences list (a shared document) once for all of them
    # (kernels/shared_decode.py; docs/design.md, "Shared-document decode"). Steps without such a run, deterministic
    # mode and the CPU backend take the plain decode kernel.
    shared_decode: bool = _option(
        True,
        "decode steps read each document's pages once for all the sequences that list it "
        "(docs/design.md, Shared-document decode)",
    )
    # A step that decodes some sequences and prefills others (continuous batching at a full batch: each step admits
    # the requests that replace the ones that ended) runs as two forward passes, the prefill part first, then the
    # decode rows as a decode step, which replays a decode graph and reads shared documents once (engine/
    # step_launch.py). Off: one pass, eager once the step outgrows the prefill graphs, whose attention reads every
    # listed page once per row. None: on CUDA, where it doubles lazy's sustainable rate at a 1 s p99 TTFT for a few
    # ms more TTFT at light load (docs/benchmarks.md, "Steady state"), off on the CPU, where there are no graphs to
    # replay.
    split_mixed_steps: bool | None = _option(
        None,
        "run a step that decodes some sequences and prefills others as a prefill pass, then a decode pass (decode "
        "graphs and shared-document decode for its decode rows)",
        shown="on CUDA, off on the CPU",
    )
    # Python's cyclic garbage collector: a full collection walks every object the process holds, ~300K once torch,
    # Triton and the engine are imported and built, in whichever step triggers it (its time: docs/benchmarks.md,
    # "Kernel constants"; benchmarks/host_step.py). On: what exists once the engine is built and warmed up is frozen
    # out of collections (gc.freeze) until shutdown, so that a full collection walks only what requests made since.
    # Off by default: frozen objects another part of the process drops meanwhile are collected only after shutdown
    # unfreezes them, and an engine dropped without shutdown (as the bench drops each mode's) is frozen itself, so
    # its device memory never comes back. With several engines the heap is unfrozen when the last one shuts down.
    gc_freeze: bool = _option(
        False,
        "freeze what exists once the engine is built out of Python's garbage collections (gc.freeze) until shutdown",
    )
    # While the engine holds requests, Python's automatic collection is off: the young generations are collected
    # between steps when Python's counts say they are due, the full collection (which walks every object: ~110 ms on a
    # 2-core CPU host with the tiny engine built) runs when the engine goes idle or after gc_full_interval_s of
    # continuous load (engine/gc_control.py; docs/design.md, "Garbage collection"). None: on CUDA, where such a
    # stall holds up the whole batch and the requests that arrive meanwhile; off on the CPU, where the host is the
    # device and the tests build and drop many engines.
    gc_control: bool | None = _option(
        None,
        "while requests run, collect only Python's young generations, between steps; the full collection when idle "
        "or every --gc-full-interval-s (docs/design.md, Garbage collection)",
        shown="on CUDA, off on the CPU",
    )
    # The bound on how long cyclic garbage that outlived two young collections can stay under continuous load. The
    # engine's requests make little (none on the CPU path: 40 requests, nothing for a full collection to free), so
    # the bound is on memory another part of the process may leave; 300 s makes one full collection's stall rare.
    gc_full_interval_s: float = _option(
        300.0, "under continuous load with --gc-control, a full garbage collection at most this often, seconds"
    )
    # Attention through the PyTorch reference (kernels/reference.py) on any device, in place of the Triton kernels on
    # CUDA: the ground truth `lazyattn eval --fidelity` compares the kernels against (docs/quality.md, "Fidelity").
    # Slow; CUDA graphs would capture it as they capture any backend, so the fidelity reference turns them off.
    reference_attention: bool = False
    # Every step ends with a check of the document cache's, its tiers' and the scheduler's bookkeeping whole
    # (engine/invariants.py): O(pages) host time a step, for tests and for chasing a bug in serving.
    check_invariants: bool = _option(
        False,
        "check the document cache's and the scheduler's invariants after every step (slow; for tests and debugging)",
        shown="off; on where LAZYATTN_CHECK_INVARIANTS=1",
    )
    # The LAZYATTN_* environment variables, read once when the config is made (lazyattn/envs.py): the engine passes
    # them down and activates the kernels' toggles at construction, so captured graphs and eager steps agree.
    env: EnvSettings = field(default_factory=read_env)

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
        if not self.disk_cache_gb > 0:
            raise InvalidRequestError(f"disk_cache_gb must be > 0, got {self.disk_cache_gb}", "disk_cache_gb")
        if self.disk_read_gbps is not None and not self.disk_read_gbps > 0:
            raise InvalidRequestError(f"disk_read_gbps must be > 0, got {self.disk_read_gbps}", "disk_read_gbps")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise InvalidRequestError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidRequestError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}",
                "kv_cache_dtype",
            )
        check_relink(self.mode, self.relink_tokens)
        check_relink(self.mode, self.relink_last_tokens, "relink_last_tokens")
        check_ape(self.mode, self.ape_temperature, self.ape_scale, self.ape_prefix, self.ape_tilt)
        check_parallel(self.mode, self.ape_parallel, (self.relink_tokens, self.relink_last_tokens))
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
        if self.split_mixed_steps not in (None, True, False):
            raise InvalidRequestError(
                f"split_mixed_steps must be true, false or None, got {self.split_mixed_steps!r}", "split_mixed_steps"
            )
        if self.gc_control not in (None, True, False):
            raise InvalidRequestError(f"gc_control must be true, false or None, got {self.gc_control!r}", "gc_control")
        if not self.gc_full_interval_s > 0:
            raise InvalidRequestError(
                f"gc_full_interval_s must be > 0, got {self.gc_full_interval_s}", "gc_full_interval_s"
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

        if tp > 1 and self.reference_attention:
            raise InvalidRequestError(
                "reference_attention (the float32 reference of eval --fidelity) is not supported with tensor "
                "parallelism: run it on one device",
                "tensor_parallel_size",
            )
        if tp > 1 and self.disk_cache_dir is not None:
            raise InvalidRequestError(
                "disk_cache_dir (the disk tier) is not supported with tensor parallelism yet: every rank holds part "
                "of each page",
                "disk_cache_dir",
            )

    @property
    def request_defaults(self) -> RequestOptions:
        """What a request that sets none of its options gets (engine/request_options.py)."""
        return RequestOptions(
            self.relink_tokens,
            float(self.ape_temperature),
            float(self.ape_scale),
            self.ape_prefix,
            float(self.ape_tilt),
            self.relink_last_tokens,
            self.ape_parallel,
        )

    @property
    def ape_on(self) -> bool:
        """Whether requests default to a temperature, scale or tilt on the documents (CUDA graphs then carry
        them)."""
        return self.ape_temperature != 1 or self.ape_scale != 1 or self.ape_tilt != 0

    @property
    def async_scheduling_on(self) -> bool:
        """Whether the engine overlaps scheduling: as asked, or by default where it helps (CUDA, with or without
        tensor parallelism)."""
        return self.device.startswith("cuda") if self.async_scheduling is None else self.async_scheduling

    @property
    def split_mixed_steps_on(self) -> bool:
        """Whether a step that decodes and prefills runs as two passes: as asked, or by default on CUDA."""
        return self.device.startswith("cuda") if self.split_mixed_steps is None else self.split_mixed_steps

    @property
    def gc_control_on(self) -> bool:
        """Whether the engine holds automatic garbage collection off while busy: as asked, or by default on CUDA."""
        return self.device.startswith("cuda") if self.gc_control is None else self.gc_control

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # here, so that the CLI starts without loading torch

        if self.dtype is None:
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}", "dtype")
        return getattr(torch, self.dtype)

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The KV pool's dtype: `kv_cache_dtype`, where 'auto' is the model's (`torch_dtype`)."""
        from lazyattn.kernels.kv_dtype import resolve

        return resolve(self.kv_cache_dtype, self.torch_dtype)


def cli_flags(options: Mapping[str, Any]) -> str:
    """The `lazyattn serve` (and generate, bench, eval) flags that set these EngineConfig options, in their order;
    an option at its default is left out. An option the CLI does not offer is an error: it could not be served."""
    offered = {f.name: f for f in fields(EngineConfig) if "cli" in f.metadata}
    flags = []
    for name, value in options.items():
        f = offered.get(name)
        if f is None:
            raise InvalidRequestError(f"{name} is not an option of lazyattn serve", name)
        if value == f.metadata["cli"].get("default", f.default):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(flags)
