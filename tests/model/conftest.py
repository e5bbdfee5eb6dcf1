from pathlib import Path

import pytest
import torch

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
