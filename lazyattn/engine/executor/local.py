"""The engine's executor on one device: the model and its runner live in the engine's process."""

from __future__ import annotations

import torch

from lazyattn.engine.batch import StepPlan
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.executor.base import Executor, load_engine_model
from lazyattn.engine.model_runner import ModelRunner


class LocalExecutor(Executor):
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.model, self.model_config = load_engine_model(config, device)
        self.runner = None

    def build(self, max_model_len: int) -> None:
        self.runner = ModelRunner(self.model, self.model_config, self.config, max_model_len, self.device)

    def run(self, batch: StepPlan) -> torch.Tensor:
        return self.runner.run(batch)

    def warm_up(self) -> None:
        self.runner.warm_up()

    def shutdown(self) -> None:
        self.runner = self.model = None
