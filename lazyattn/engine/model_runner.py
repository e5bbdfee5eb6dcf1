"""The model on its device: the KV page pool's memory, the RoPE tables, the attention backend, CUDA graphs, the
warm-up, and the turning of a scheduled batch into one forward pass (packed tokens, positions, slots, page tables).
"""

from __future__ import annotations

import math

import torch

from lazyattn.cache.page_pool import allocate_kv, bytes_per_page, pages_for_budget, pages_from_free_memory
from lazyattn.engine.batch import Copy, StepPlan, Work
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.cuda_graphs import DecodeGraphs
from lazyattn.engine.graph_inputs import SharedDecode, StepInputs, paged_batch
from lazyattn.engine.prefill_graphs import PrefillGraphs
from lazyattn.engine.sequence import Run
from lazyattn.kernels.backend import ForwardBatch, ReferenceBackend
from lazyattn.kernels.paged import EntryPages, cdiv, page_fill
from lazyattn.kernels.rope import RopeTables
from lazyattn.kernels.selector import make_backend
from lazyattn.model.config import ModelConfig
from lazyattn.model.llama import CausalLM

CPU_DEFAULT_KV_GB = 0.5


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        model_config: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        device: torch.device,
        num_pages: int | None = None,
    ) -> None:
        """`model_config` describes `model` as built (one rank's shard under tensor parallelism); `num_pages`
        overrides the pool sizing (tensor parallelism: every rank gets the count all ranks can hold)."""
        self.model = model
        self.model_config = model_config
        self.config = config
        self.device = device
        self.max_model_len = max_model_len
        mc, ps, dtype = model_config, config.page_size, config.kv_torch_dtype
        self.page_size = ps
        self.page_bytes = bytes_per_page(mc.num_layers, mc.num_kv_heads, mc.head_dim, ps, dtype)
        self.num_pages = pool_pages(config, device, self.page_bytes) if num_pages is None else num_pages
        # Zeroed, so that never-written page tails hold finite values (masked scores times V stay 0).
        kv = allocate_kv(
            mc.num_layers, self.num_pages, ps, mc.num_kv_heads, mc.head_dim, dtype, device, config.env.kv_layout
        )
        model.set_deterministic(config.deterministic)
        tables = RopeTables.build(mc.rope, max_model_len, device)
        self.backend = (
            ReferenceBackend(kv, tables, mc.attn_scale, config.deterministic)
            if config.reference_attention
            else make_backend(kv, tables, mc.attn_scale, config.deterministic)
        )
        # Decode steps over shared documents attend by a plan (kernels/shared_decode.py) where the backend takes one;
        # deterministic mode keeps its one batch-invariant kernel.
        self.shared = None
        if config.shared_decode and not config.deterministic and self.backend.shared_decode:
            self.shared = SharedDecode(group=mc.num_heads // mc.num_kv_heads)
        self.graphs = None  # decode steps replay CUDA graphs when set
        self.prefill_graphs = None  # and small prefill steps (engine/prefill_graphs.py)
        self.graph_replays = 0  # forward passes that replayed a graph (engine/step_report.py)
        if device.type == "cuda" and config.cuda_graphs:
            widest = min(cdiv(max_model_len, ps), self.num_pages)
            # With a temperature or scale on documents by default the graphs carry their tables (engine/cuda_graphs.py)
            ape = config.ape_on
            self.graphs = DecodeGraphs(
                model, self.backend, min(config.max_num_seqs, 256), widest, device, ape, self.shared
            )
            # Deterministic mode: no prefill graphs (their buckets fix split counts for the prefill kernels, which that
            # mode does not run); decode graphs replay the same batch-invariant kernels, padding rows apart.
            if not config.deterministic:
                self.prefill_graphs = PrefillGraphs(
                    model,
                    self.backend,
                    widest,
                    device,
                    plan=config.env.prefill_plan,
                    ape=ape,
                    q_dtype=config.torch_dtype,
                )

    def run(self, plan: StepPlan) -> torch.Tensor:
        """Forward the batch; fp32 logits [n, vocab] of the works that sample, in batch order."""
        return self.execute(self.describe(plan))

    @torch.inference_mode()
    def execute(self, step: StepInputs) -> torch.Tensor:
        """run's device half, what every tensor-parallel rank runs (parallel/): block copies, then the forward pass
        (a graph replay for a decode step or a small prefill step)."""
        self._copy_rotate(step)
        bucket = None if self.prefill_graphs is None else self.prefill_graphs.bucket(step)
        if bucket is not None:
            self.graph_replays += 1
            return self.prefill_graphs.run(step, bucket)
        if self.graphs is not None and self.graphs.fits(step):
            self.graph_replays += 1
            return self.graphs.run(step)
        input_ids, fb = self.to_device(step)
        if step.fed_back is not None:
            step.fed_back.write(input_ids)
        hidden = self.model(input_ids, fb, self.backend)
        return self.model.compute_logits(hidden[fb.logits_indices])

    def prepare(self, batch: StepPlan) -> tuple[torch.Tensor, ForwardBatch]:
        return self.to_device(self.describe(batch))

    def describe(self, batch: StepPlan) -> StepInputs:
        """The step's packed tokens, positions, slots and page tables as host lists."""
        ps = self.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        entries: list[EntryPages] = []
        q_lens: list[int] = []
        q_starts: list[int] = []
        logits_rows: list[int] = []
        for w in batch.works:
            run = w.run
            tokens += run.tokens[w.lo : w.hi]
            positions += range(run.start_pos + run.rope_shift + w.lo, run.start_pos + run.rope_shift + w.hi)
            f = run.first_slot
            slots += [run.pages[i // ps] * ps + i % ps for i in range(f + w.lo, f + w.hi)]
            entries.append(w.context.then(run.pages[: cdiv(f + w.hi, ps)], page_fill(w.hi, ps, f), f))
            q_lens.append(w.hi - w.lo)
            q_starts.append(run.start_pos + w.lo)
            if w.samples:
                logits_rows.append(len(tokens) - 1)
        step = StepInputs(
            tokens, positions, slots, entries, q_lens, q_starts, logits_rows, batch.is_decode, fed_back=batch.fed_back
        )
        for c in batch.copies:
            step.copy_src += c.src
            step.copy_dst += c.dst
            step.copy_deltas += c.deltas
        return step

    def to_device(self, step: StepInputs) -> tuple[torch.Tensor, ForwardBatch]:
        dev = self.device
        fb = ForwardBatch(
            positions=torch.tensor(step.positions, dtype=torch.int64).to(dev, non_blocking=True),
            slot_mapping=torch.tensor(step.slots, dtype=torch.int64).to(dev, non_blocking=True),
            attn=paged_batch(step.entries, step.q_lens, step.q_starts, dev),
            is_decode=step.is_decode,
            logits_indices=torch.tensor(step.logits_rows, dtype=torch.int64).to(dev, non_blocking=True),
        )
        plan = None if self.shared is None else self.shared.plan(step)
        if plan is not None:
            fb.shared = plan.to(dev)
        return torch.tensor(step.tokens, dtype=torch.int64).to(dev, non_blocking=True), fb

    def _copy_rotate(self, step: StepInputs) -> None:
        if not step.copy_src:
            return

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32).to(self.device)

        self.backend.copy_rotate(as_tensor(step.copy_src), as_tensor(step.copy_dst), as_tensor(step.copy_deltas))

    # -- warm-up ------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Compile and tune every kernel launch shape a request can reach, and capture every decode graph, so that
        no request pays for it: one long document encode (the plain prefill launch, the largest activations), the
        same document encoded after a short first segment (ape_prefix's encode), then for batches of 1, 2, 4 … 64
        short final segments over two placed documents (split-KV prefill, whose merge is compiled per split count)
        and one decode step each, logits through the greedy pick, and one block-mode copy.

        Writes into pages it does not allocate, then zeroes the pool: call it before serving, with no page in use.
        """
        ps = self.page_size
        vocab = self.model_config.vocab_size
        max_batch = min(64, self.config.max_num_seqs, max(1, (self.num_pages - 8) // 4))
        spare = self.num_pages - max_batch - 4  # pages left for the long document
        doc_len = max(ps, min(self.config.max_num_batched_tokens, self.max_model_len // 2, spare * ps // 2))
        short_len, final_len = 2 * ps + 3, 8
        if doc_len + short_len + final_len + 1 > self.max_model_len or spare < cdiv(doc_len, ps) + 3:
            return  # a model or pool too small for the warm-up shapes: nothing worth compiling ahead
        free = iter(range(self.num_pages))
        documents = []
        for length, salt in ((doc_len, 1), (short_len, 2)):
            run = Run([(7 * i + salt) % vocab for i in range(length)], 0, [next(free) for _ in range(cdiv(length, ps))])
            documents.append(run)
        self.run(StepPlan(tuple(Work(d, 0, len(d.tokens), EntryPages([], [], [])) for d in documents)))
        # a document encoded after a first segment (ape_prefix): a long prefill over a short context
        after = Run(documents[0].tokens, short_len, documents[0].pages)
        first = EntryPages(documents[1].pages, [0] * len(documents[1].pages), page_fill(short_len, ps))
        self.run(StepPlan((Work(after, 0, doc_len, first),)))
        context = EntryPages(
            [p for d in documents for p in d.pages],
            [0] * len(documents[0].pages) + [doc_len] * len(documents[1].pages),
            page_fill(doc_len, ps) + page_fill(short_len, ps),
        )
        if self.config.ape_on:  # the kernels' variants that read the temperature tables (docs/design.md, "APE")
            n0, n1 = len(documents[0].pages), len(documents[1].pages)
            context.inv_temps = [1.0] * n0 + [1.0 / self.config.ape_temperature] * n1
            context.log_scales = [0.0] * n0 + [math.log(self.config.ape_scale)] * n1
        start = doc_len + short_len
        finals = [Run([(11 * i + j) % vocab for j in range(final_len)], start, [next(free)]) for i in range(max_batch)]
        n = 1
        while n <= max_batch:
            runs = finals[:n]
            self.run(StepPlan(tuple(Work(r, 0, final_len, context, samples=True) for r in runs)))
            for r in runs:
                r.tokens.append(0)
            logits = self.run(StepPlan(tuple(Work(r, final_len, final_len + 1, context, samples=True) for r in runs)))
            for r in runs:
                del r.tokens[final_len:]
            n *= 2
        self._greedy(logits)  # one compile serves every batch: the row count is the grid, not an argument
        pages = documents[1].pages
        copy_to = [next(free) for _ in pages]
        copy = StepPlan(copies=(Copy(-1, pages, copy_to, [doc_len] * len(pages)),))
        self._copy_rotate(self.describe(copy))
        if self.graphs is not None:
            self.graphs.capture_all()
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture_all()
        self.backend.kv.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _greedy(self, logits: torch.Tensor) -> None:
        """The greedy pick's kernels (kernels/greedy.py) over a step's logits, as the sampler takes them for an
        all-greedy batch on CUDA."""
        if logits.is_cuda and not self.config.deterministic:
            from lazyattn.kernels.greedy import greedy_pick

            greedy_pick(logits if logits.stride(-1) == 1 else logits.contiguous())


def pool_pages(config: EngineConfig, device: torch.device, page_bytes: int) -> int:
    """Pages of the KV pool: from `kv_cache_gb`, or from free GPU memory after the weights are loaded (they count
    against the share), or a fixed CPU default."""
    if config.kv_cache_gb is not None:
        return pages_for_budget(int(config.kv_cache_gb * 2**30), page_bytes)
    if device.type == "cuda":
        return pages_from_free_memory(config.gpu_memory_utilization, device, page_bytes)
    return pages_for_budget(int(CPU_DEFAULT_KV_GB * 2**30), page_bytes)
