"""The document registry on each of its databases: in memory, a SQLite file, and a PostgreSQL server the tests start.

What a server relies on: scopes (404 across them), content-derived ids, one row for concurrent registrations of one
document (also by two registries on one database, as two servers), capacity, entries and deletions that outlive the
process, and the schema's version.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from lazyattn.errors import QueueFullError, RegistryError, UnknownDocumentError
from lazyattn.server import registry as registry_module
from lazyattn.server.registry import (
    MEMORY,
    SCHEMA_VERSION,
    DocumentRegistry,
    document_id,
    resolve_registry_url,
    sqlite_url,
)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "memory":
        return MEMORY
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state/registry.sqlite"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def durable_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/registry.sqlite"
    return request.getfixturevalue("postgres_url")


def rows(url: str) -> list[tuple]:
    """The documents table as the database has it, read without the registry."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT scope, id, title, text FROM documents"))]
    finally:
        engine.dispose()


def test_scoped_and_idempotent(url):
    reg = DocumentRegistry(url, max_documents=2)
    try:
        a = reg.add("s1", "T", "text", 2)
        assert reg.add("s1", "T", "text", 2) == a and a.id == document_id("s1", "T", "text")
        b = reg.add("s2", "T", "text", 2)
        assert a.id != b.id and reg.count() == 2
        with pytest.raises(UnknownDocumentError) as e:
            reg.get("s2", a.id, param="documents[3].id")  # another scope's id: the 404 of an unknown one
        assert e.value.param == "documents[3].id" and e.value.status_code == 404
        assert reg.get("s1", a.id) == a and [d.id for d in reg.list("s1")] == [a.id]
        with pytest.raises(QueueFullError, match="registry is full"):
            reg.add("s1", None, "another", 3)
        assert reg.add("s1", "T", "text", 2) == a  # a registered one is no new entry: never refused
        assert reg.remove("s1", a.id) == a
        assert reg.list("s1") == [] and a.as_input() == {"title": "T", "text": "text"}
        with pytest.raises(UnknownDocumentError):
            reg.remove("s1", a.id)
        c = reg.add(None, None, "unscoped", 1)  # no scope is its own scope, apart from every named one
        assert reg.list(None) == [c] and c.scope is None and c.as_input() == {"text": "unscoped"}
        with pytest.raises(UnknownDocumentError):
            reg.get("s1", c.id)
        with pytest.raises(ValueError):  # the empty scope would read as none: never made by tenancy.cache_scope
            reg.add("", None, "unscoped", 1)
    finally:
        reg.close()


def test_get_many_keeps_order_and_names_the_missing_one(url):
    reg = DocumentRegistry(url)
    try:
        docs = [reg.add("s", None, f"text {i}", i) for i in range(3)]
        ids = [docs[2].id, docs[0].id, docs[2].id]
        assert reg.get_many("s", ids, ["a", "b", "c"]) == [docs[2], docs[0], docs[2]]
        with pytest.raises(UnknownDocumentError) as e:
            reg.get_many("s", [docs[1].id, "doc-nope"], ["documents[0].id", "documents[4].id"])
        assert e.value.param == "documents[4].id"
    finally:
        reg.close()


def test_concurrent_registrations_of_one_document_make_one_row(durable_url):
    # Two registries on one database, as two servers; 16 threads register the same document in one scope.
    regs = [DocumentRegistry(durable_url), DocumentRegistry(durable_url)]
    barrier = threading.Barrier(16)

    def register(i: int):
        barrier.wait()
        return regs[i % 2].add("tenant", "Title", "the same text", 5)

    try:
        with ThreadPoolExecutor(16) as pool:
            docs = list(pool.map(register, range(16)))
        assert len({d.id for d in docs}) == 1 and len({d.created for d in docs}) == 1
        assert rows(durable_url) == [("tenant", docs[0].id, "Title", "the same text")]
    finally:
        for reg in regs:
            reg.close()


def test_capacity_holds_under_concurrent_registrations(durable_url):
    regs = [DocumentRegistry(durable_url, max_documents=5), DocumentRegistry(durable_url, max_documents=5)]
    barrier = threading.Barrier(12)

    def register(i: int) -> bool:
        barrier.wait()
        try:
            regs[i % 2].add("s", None, f"document {i}", 1)
            return True
        except QueueFullError:
            return False

    try:
        with ThreadPoolExecutor(12) as pool:
            accepted = list(pool.map(register, range(12)))
        assert sum(accepted) == 5 and len(rows(durable_url)) == 5
    finally:
        for reg in regs:
            reg.close()


def test_entries_and_deletions_outlive_the_registry(durable_url):
    reg = DocumentRegistry(durable_url)
    kept = reg.add("s", "Kept", "stays", 3)
    gone = reg.add("s", "Gone", "goes", 4)
    reg.remove("s", gone.id)
    reg.close()
    again = DocumentRegistry(durable_url)
    try:
        assert again.list("s") == [kept]
        with pytest.raises(UnknownDocumentError):
            again.get("s", gone.id)
    finally:
        again.close()


def test_schema_version_is_recorded_and_a_newer_one_is_refused(durable_url):
    DocumentRegistry(durable_url).close()
    engine = sa.create_engine(durable_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT version FROM schema_version")).scalars().all() == [SCHEMA_VERSION]
            conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
    finally:
        engine.dispose()
    with pytest.raises(RegistryError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this lazyattn knows"):
        DocumentRegistry(durable_url)


def test_migrations_run_once_in_order(durable_url, monkeypatch):
    reg = DocumentRegistry(durable_url)
    doc = reg.add("s", None, "from version 1", 2)
    reg.close()
    applied = []

    def to_v2(conn):
        applied.append(2)
        conn.execute(sa.text("ALTER TABLE documents ADD COLUMN note TEXT"))

    monkeypatch.setattr(registry_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(registry_module.MIGRATIONS, SCHEMA_VERSION + 1, to_v2)
    for _ in range(2):  # the second open finds the database migrated already
        DocumentRegistry(durable_url).close()
    assert applied == [2]
    reg = DocumentRegistry(durable_url)
    try:
        assert reg.list("s") == [doc]  # the data came through
    finally:
        reg.close()


def test_sqlite_file_is_durable_on_commit(tmp_path):
    # WAL and synchronous=FULL: a commit is on disk when add() returns, whatever happens to the process next.
    path = tmp_path / "registry.sqlite"
    reg = DocumentRegistry(f"sqlite:///{path}")
    try:
        doc = reg.add("s", None, "acknowledged", 1)
        # Another connection, outside SQLAlchemy, while the registry still holds its own open.
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert conn.execute("SELECT id FROM documents").fetchall() == [(doc.id,)]
    finally:
        reg.close()


def test_urls(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYATTN_CACHE", str(tmp_path / "cache"))
    assert resolve_registry_url() == f"sqlite:///{tmp_path}/cache/state/registry.sqlite"
    assert resolve_registry_url(state_dir=tmp_path / "st") == f"sqlite:///{tmp_path}/st/registry.sqlite"
    assert resolve_registry_url("postgresql://db/x", tmp_path) == "postgresql://db/x"
    for bad, message in [
        ("nonsense", "not a registry URL"),
        ("mysql://host/db", "unsupported registry database 'mysql'"),
        ("sqlite://", "names no file"),
    ]:
        with pytest.raises(RegistryError, match=message):
            DocumentRegistry(bad)


def test_an_unreachable_database_is_a_registry_error():
    pytest.importorskip("psycopg")
    with socket.socket() as s:  # a local port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryError, match="unavailable") as e:
        DocumentRegistry(f"postgresql://postgres:secret@127.0.0.1:{port}/postgres?connect_timeout=2")
    assert e.value.status_code == 503 and "secret" not in str(e.value)


def test_the_sqlite_file_is_its_owners_alone(tmp_path):
    """The registry holds every tenant's documents: the file and its -wal and -shm are made 0600, whatever the
    umask lets through."""
    path = tmp_path / "state" / "registry.sqlite"
    umask = os.umask(0o022)
    try:
        reg = DocumentRegistry(sqlite_url(path))
        try:
            reg.add(None, None, "a tenant's text", 3)
            files = sorted(tmp_path.joinpath("state").iterdir())
            assert [f.name for f in files] == ["registry.sqlite", "registry.sqlite-shm", "registry.sqlite-wal"]
            assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {f.name: "0o600" for f in files}
        finally:
            reg.close()
    finally:
        os.umask(umask)
