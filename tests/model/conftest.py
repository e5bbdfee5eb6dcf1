from pathlib import Path

import pytest
import torch

from lazyattn.errors import CheckpointError
from lazyattn.model import hub
from tests.model.checkpoints import write_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> (directory, transformers model); each flavour is written once per session."""
    pytest.importorskip("transformers")
    made: dict[str, tuple[Path, torch.nn.Module]] = {}

    def get(name: str) -> tuple[Path, torch.nn.Module]:
        if name not in made:
            directory = tmp_path_factory.mktemp(name)
            made[name] = (directory, write_checkpoint(name, directory))
        return made[name]

    return get


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, fetched once into the cache; skipped (with the reason) only when it is
    neither cached nor downloadable."""
    try:
        return Path(hub.resolve_model("smollm2"))
    except CheckpointError as e:
        if "could not be downloaded" in str(e):
            pytest.skip(f"SmolLM2 is neither cached nor downloadable here: {e}")
        raise
