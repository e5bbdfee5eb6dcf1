"""A throwaway PostgreSQL server for the registry's tests, started from the binaries at hand.

Candidates, in order: the server that the `pgserver` wheel ships (in the `test` extra, so CI has it), then the
system's (`initdb` on PATH, /usr/lib/postgresql/*/bin). PostgreSQL refuses to run as root, so as root it runs as
`nobody`, from a data directory under the system's temp directory (pytest's own is private to root); where nobody
cannot reach the wheel's binaries (a virtual environment under /root), a copy of them is made there too. It
listens on 127.0.0.1 only, on a free port, with fsync off (the tests stop it; they never test PostgreSQL's own
durability).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Postgres:
    url: str  # postgresql://postgres@127.0.0.1:PORT/postgres
    process: subprocess.Popen
    root: Path

    def new_database(self) -> str:
        """A fresh, empty database on this server; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # "fast" shutdown: no waiting for clients
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _candidate_bindirs() -> list[Path]:
    found = []
    spec = importlib.util.find_spec("pgserver")  # its path only: importing it would set up its own server machinery
    if spec is not None and spec.origin is not None:
        found.append(Path(spec.origin).parent / "pginstall" / "bin")
    if (initdb := shutil.which("initdb")) is not None:
        found.append(Path(initdb).resolve().parent)
    found += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    return [d for d in dict.fromkeys(found) if (d / "initdb").exists() and (d / "postgres").exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(bindir: Path, copy: bool = False) -> Postgres:
    root = Path(tempfile.mkdtemp(prefix="lazyattn-pg-"))
    as_user: dict = {}
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        as_user = dict(user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    data = root / "data"
    try:
        if copy:
            # The layout the binaries find their files by: pginstall/{bin,lib,share}, and the wheel's bundled
            # libraries in site-packages/pgserver.libs (their rpath is $ORIGIN/../../../pgserver.libs).
            site, copied = bindir.parents[2], root / "site"
            for part in ("bin", "lib", "share"):
                shutil.copytree(bindir.parent / part, copied / "pgserver" / "pginstall" / part, symlinks=True)
            if (site / "pgserver.libs").is_dir():
                shutil.copytree(site / "pgserver.libs", copied / "pgserver.libs", symlinks=True)
            bindir = copied / "pgserver" / "pginstall" / "bin"
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            capture_output=True,
            text=True,
            timeout=120,
            **as_user,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
        port = _free_port()
        log = open(root / "postgres.log", "wb")  # noqa: SIM115 (the server writes it until it stops)
        process = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(root)]
            + ["-c", "fsync=off", "-c", "max_connections=200"],
            stdout=log,
            stderr=subprocess.STDOUT,
            **as_user,
        )
        log.close()
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _wait_ready(url, process, root / "postgres.log")
        return Postgres(url, process, root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited: {log.read_text(errors='replace').strip()[-500:]}")
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2).close()
            return
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError("postgres did not accept connections within 60 s")
        time.sleep(0.1)


def start_postgres() -> tuple[Postgres | None, str]:
    """A running server, or None and why none could start (the reason a test skips with)."""
    if importlib.util.find_spec("psycopg") is None:
        return None, "psycopg is not installed (pip install 'lazyattn[test]')"
    bindirs = _candidate_bindirs()
    if not bindirs:
        return None, "no PostgreSQL server binaries: neither pgserver (pip install 'lazyattn[test]') nor the system's"
    failures = []
    attempts = [(bindir, False) for bindir in bindirs]
    if os.geteuid() == 0 and "pginstall" in bindirs[0].parts:
        attempts.insert(1, (bindirs[0], True))
    for bindir, copy in attempts:
        try:
            return _start(bindir, copy), ""
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            failures.append(f"{bindir}{' (copied)' if copy else ''}: {e}")
    return None, "PostgreSQL could not start: " + "; ".join(failures)


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[Postgres | None, str]]:
    server, reason = start_postgres()
    try:
        yield server, reason
    finally:
        if server is not None:
            server.stop()
