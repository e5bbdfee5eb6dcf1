"""What runs the engine's forward passes: an `Executor` loads the model, builds the KV pool(s) and the model
runner(s), and runs each scheduled batch. The engine picks one from its config and sees only this interface.

`LocalExecutor` (executor/local.py): one process, one device. `TensorParallelExecutor` (executor/tensor_parallel.py):
the driver in the engine's process and a worker process per other rank (docs/design.md, "Tensor parallelism").
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import torch

from lazyattn.engine.batch import StepPlan
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.model_runner import ModelRunner
from lazyattn.kernels.kv_dtype import is_fp8
from lazyattn.model.config import ModelConfig
from lazyattn.model.llama import CausalLM
from lazyattn.model.loader import load_model
from lazyattn.parallel.group import TensorParallelGroup


def load_engine_model(
    config: EngineConfig, device: torch.device, tensor_parallel: TensorParallelGroup | None = None
) -> tuple[CausalLM, ModelConfig]:
    """The model `config` names, on `device`, as every executor and worker loads it (this rank's shard under tensor
    parallelism; decode fusion as the engine's settings say). Over an FP8 cache, V is scaled per (layer, kv head)
    by a power of two folded into the weights, and K too where it could saturate (CausalLM.fold_v_scales,
    fold_k_scales; docs/design.md "FP8 KV cache"); the config's weights identity says so, so that no cache of the
    unscaled model's pages is read as this one's."""
    model, model_config = load_model(
        config.model,
        dtype=config.torch_dtype,
        device=device,
        seed=config.seed,
        random_init=config.random_weights,
        decode_fusion=config.env.decode_fusion,
        tensor_parallel=tensor_parallel,
    )
    if is_fp8(config.kv_torch_dtype):
        model.fold_v_scales()
        model.fold_k_scales()
        # The rule's name, not whether this rank's heads were scaled: every rank's pages follow the same rule.
        model_config = dataclasses.replace(model_config, weights_id=model_config.weights_id + "|fp8 v, k scales")
    return model, model_config


class Executor(ABC):
    """Construction loads the weights; `build` sizes the KV pool(s) once the engine knows its context limit; then
    `run` per step. `shutdown` gives the device memory (and any processes) back; idempotent."""

    model: CausalLM | None  # this process's model (the driver's shard under tensor parallelism)
    model_config: ModelConfig  # the whole model's config
    runner: ModelRunner | None  # this process's runner, once built: its KV pool and CUDA graphs

    @abstractmethod
    def build(self, max_model_len: int) -> None:
        """Allocate the KV pool(s), the same page count on every rank, and the runner(s)."""

    @abstractmethod
    def run(self, batch: StepPlan) -> torch.Tensor:
        """Forward the batch; fp32 logits [n, vocab] of the works that sample, in batch order."""

    @abstractmethod
    def warm_up(self) -> None:
        """Compile and tune kernels and capture graphs (CUDA), leaving the KV pool zeroed."""

    @abstractmethod
    def shutdown(self) -> None: ...

    @property
    def num_pages(self) -> int:
        """Page ids of the pool (every rank holds this many)."""
        return self.runner.num_pages

    @property
    def page_bytes(self) -> int:
        """A page id's bytes, over all ranks."""
        return self.runner.page_bytes

    @property
    def local_kv(self) -> torch.Tensor | None:
        """The whole KV pool, when it lies in this process (the host tier copies its pages); else None."""
        return self.runner.backend.kv
