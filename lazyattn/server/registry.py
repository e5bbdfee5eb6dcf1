"""The document registry: documents registered ahead of requests and referred to by id, kept in a database.

Where it lives (`--registry-url`, else `--state-dir`; docs/server.md, Server state):
- `sqlite:///<path>`: an embedded SQLite file, by default `<cache>/state/registry.sqlite` under the model cache
  directory. Several servers on one host may share the file.
- `postgresql://user:password@host:port/db` (psycopg 3): one registry for several servers or ingresses.
- `memory`: nothing kept, for tests and throwaway servers.

An entry holds the document's text and title, not its token ids or KV: a request renders a registered document
from its text, as if it had been sent inline, so after a restart (or with another model) a document whose KV is not
cached is encoded again on first use. `num_tokens` is what the registering server counted.

Every entry belongs to a scope (`tenancy.cache_scope`). An id is only found in its own scope: another tenant gets
the same 404 as for an id that never existed, so ids reveal nothing across tenants. Ids are derived from the scope
and the content, so registering the same document twice in a scope gives the same id, and (scope, id) is the
table's primary key: concurrent registrations of one document, by one server or several, insert one row.

Every method blocks on the database (the server calls them through a thread pool, never on its event loop) and is
safe from several threads. Each write is one transaction, committed before the method returns: SQLite in WAL mode
with synchronous=FULL, so an acknowledged registration or deletion survives a crash of the process or the machine.

The schema is versioned: `schema_version` holds one row, and `MIGRATIONS[v]` brings a database from version v - 1
to v. Opening a database migrates it to `SCHEMA_VERSION` in one transaction; one written by a newer lazyattn
(an unknown version) is refused with a RegistryError rather than misread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from lazyattn.errors import QueueFullError, RegistryError, UnknownDocumentError

MEMORY = "memory"
STATE_DIR = "state"  # under the cache directory
REGISTRY_FILE = "registry.sqlite"
SCHEMA_VERSION = 1

_metadata = sa.MetaData()
_schema_version = sa.Table("schema_version", _metadata, sa.Column("version", sa.Integer, nullable=False))
# The latest schema. Migration 1 creates these tables as they are at version 1: before changing them for a version 2,
# freeze the version-1 definitions inside `_create_v1` and add the change as MIGRATIONS[2].
_documents = sa.Table(
    "documents",
    _metadata,
    # "" for no scope (None): a real scope is JSON (`tenancy.cache_scope`), never empty, so the two never meet.
    sa.Column("scope", sa.Text, primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("title", sa.Text, nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("num_tokens", sa.Integer, nullable=False),
    sa.Column("created", sa.BigInteger, nullable=False),  # Unix seconds
)


def _create_v1(conn: Connection) -> None:
    _documents.create(conn)


MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _create_v1}


@dataclass(frozen=True)
class RegisteredDocument:
    id: str
    scope: str | None
    title: str | None
    text: str
    num_tokens: int
    created: int

    def as_input(self) -> dict[str, str]:
        """The document as a request's `documents` entry: renders to the tokens it was registered with."""
        return {"text": self.text} if self.title is None else {"title": self.title, "text": self.text}


def document_id(scope: str | None, title: str | None, text: str) -> str:
    digest = hashlib.sha256(json.dumps([scope, title, text]).encode()).hexdigest()
    return f"doc-{digest[:32]}"


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def resolve_registry_url(registry_url: str | None = None, state_dir: Path | str | None = None) -> str:
    """`lazyattn serve`'s registry: --registry-url, else the SQLite file in --state-dir, else in the cache
    directory's state/ (`$LAZYATTN_CACHE/state/registry.sqlite`)."""
    if registry_url:
        return registry_url
    if state_dir is None:
        from lazyattn.model.hub import cache_dir

        state_dir = cache_dir() / STATE_DIR
    return sqlite_url(Path(state_dir) / REGISTRY_FILE)


class DocumentRegistry:
    def __init__(self, url: str = MEMORY, max_documents: int | None = None) -> None:
        self.url = url
        self.max_documents = max_documents
        self._engine = _create_engine(url)
        # An in-memory database is one connection shared by every thread: its transactions must not interleave.
        self._lock = threading.Lock() if url == MEMORY else contextlib.nullcontext()
        try:
            self._migrate()
        except BaseException:
            self._engine.dispose()
            raise

    def close(self) -> None:
        self._engine.dispose()

    # -- documents --------------------------------------------------------------------------------------------

    def add(self, scope: str | None, title: str | None, text: str, num_tokens: int) -> RegisteredDocument:
        """The entry for this document in `scope`, inserted unless it is there already (then returned as stored).
        Raises QueueFullError when a new entry would pass `max_documents`."""
        doc_id = document_id(scope, title, text)
        row = {"scope": _key(scope), "id": doc_id, "title": title, "text": text, "num_tokens": num_tokens}
        with self._write() as conn:
            existing = self._get(conn, scope, doc_id)
            if existing is not None:
                return existing
            # Serialised with every other writer (see _write), so the count cannot change before the insert.
            if self.max_documents is not None and self._count(conn) >= self.max_documents:
                raise self.full_error()
            # Insert-or-nothing: the primary key keeps one row however many servers insert it at once; the row read
            # back is the one that won.
            conn.execute(_insert_or_nothing(conn, {**row, "created": int(time.time())}))
            stored = self._get(conn, scope, doc_id)
        assert stored is not None
        return stored

    def full_error(self) -> QueueFullError:
        # A 429 like a full queue: the server is at capacity, not the request at fault.
        return QueueFullError(f"the document registry is full ({self.max_documents} documents); delete some")

    def would_accept(self, scope: str | None, doc_id: str) -> bool:
        """Whether `add` would not be refused for capacity right now (a hint: `add` decides)."""
        if self.max_documents is None:
            return True
        with self._read() as conn:
            if self._get(conn, scope, doc_id) is not None:
                return True
            return self._count(conn) < self.max_documents

    def get(self, scope: str | None, doc_id: str, param: str = "id") -> RegisteredDocument:
        return self.get_many(scope, [doc_id], [param])[0]

    def get_many(self, scope: str | None, ids: Sequence[str], params: Sequence[str]) -> list[RegisteredDocument]:
        """The entries of `ids` in `scope`, in order, in one query. An unknown id raises UnknownDocumentError naming
        its `params` entry (the request field it came from)."""
        if not ids:
            return []
        with self._read() as conn:
            rows = conn.execute(
                sa.select(_documents).where(_documents.c.scope == _key(scope), _documents.c.id.in_(set(ids)))
            ).all()
        found = {row.id: _document(row) for row in rows}
        for doc_id, param in zip(ids, params):
            if doc_id not in found:
                error = UnknownDocumentError(f"no document with id {doc_id!r}")
                error.param = param
                raise error
        return [found[doc_id] for doc_id in ids]

    def remove(self, scope: str | None, doc_id: str) -> RegisteredDocument:
        with self._write() as conn:
            doc = self._get(conn, scope, doc_id)
            if doc is None:
                raise UnknownDocumentError(f"no document with id {doc_id!r}")
            conn.execute(sa.delete(_documents).where(_documents.c.scope == _key(scope), _documents.c.id == doc_id))
        return doc

    def list(self, scope: str | None) -> list[RegisteredDocument]:
        with self._read() as conn:
            rows = conn.execute(
                sa.select(_documents)
                .where(_documents.c.scope == _key(scope))
                .order_by(_documents.c.created, _documents.c.id)
            ).all()
        return [_document(row) for row in rows]

    def count(self) -> int:
        """Entries of every scope."""
        with self._read() as conn:
            return self._count(conn)

    # -- transactions -----------------------------------------------------------------------------------------

    @staticmethod
    def _count(conn: Connection) -> int:
        return conn.execute(sa.select(sa.func.count()).select_from(_documents)).scalar_one()

    @staticmethod
    def _get(conn: Connection, scope: str | None, doc_id: str) -> RegisteredDocument | None:
        row = conn.execute(
            sa.select(_documents).where(_documents.c.scope == _key(scope), _documents.c.id == doc_id)
        ).first()
        return None if row is None else _document(row)

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._lock, _unavailable(self.url), self._engine.connect() as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """A transaction that holds the database's write lock from its start, so a read-then-write (capacity, insert
        or get) cannot race another writer: SQLite's BEGIN IMMEDIATE, PostgreSQL's transaction-scoped advisory lock
        (taken only by registry writers; readers never wait for it)."""
        with (
            self._lock,
            _unavailable(self.url),
            self._engine.connect().execution_options(lazyattn_write=True) as conn,
            conn.begin(),
        ):
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            yield conn

    def _migrate(self) -> None:
        with self._write() as conn:
            _schema_version.create(conn, checkfirst=True)
            version = conn.execute(sa.select(_schema_version.c.version)).scalar()
            if version is None:
                version = 0
                conn.execute(sa.insert(_schema_version).values(version=0))
            if version > SCHEMA_VERSION:
                raise RegistryError(
                    f"the document registry at {safe_url(self.url)} has schema version {version}, newer than this "
                    f"lazyattn knows ({SCHEMA_VERSION}): it was written by a later release. Run that release, or "
                    f"point --state-dir / --registry-url elsewhere"
                )
            for v in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[v](conn)
            if version != SCHEMA_VERSION:
                conn.execute(sa.update(_schema_version).values(version=SCHEMA_VERSION))


# The advisory-lock key registry writers share on a PostgreSQL server ("lazyattn" in ASCII, as a bigint).
_PG_LOCK_KEY = int.from_bytes(b"lazyattn", "big") & (2**63 - 1)


def _key(scope: str | None) -> str:
    if scope == "":  # would read as no scope
        raise ValueError("a registry scope is None or a non-empty string (tenancy.cache_scope)")
    return "" if scope is None else scope


def _document(row: sa.Row) -> RegisteredDocument:
    scope = None if row.scope == "" else row.scope
    return RegisteredDocument(row.id, scope, row.title, row.text, row.num_tokens, row.created)


def _insert_or_nothing(conn: Connection, row: dict) -> sa.Executable:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(_documents).values(**row).on_conflict_do_nothing(index_elements=["scope", "id"])


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@contextlib.contextmanager
def _unavailable(url: str) -> Iterator[None]:
    """A database that cannot serve now (unreachable server, a file locked for 30 s, a full disk, every pooled
    connection busy for 30 s) as a RegistryError: a 503 the client retries."""
    try:
        yield
    except PoolTimeoutError as e:
        raise RegistryError(f"the document registry at {safe_url(url)} is busy: no connection free for 30 s") from e
    except DBAPIError as e:
        if not (isinstance(e, OperationalError) or e.connection_invalidated):
            raise  # a bug here, not the database's state: a 500
        raise RegistryError(f"the document registry at {safe_url(url)} is unavailable: {e.orig}") from e


def _create_engine(url: str) -> Engine:
    if url == MEMORY:
        # One connection (StaticPool) so every thread sees the same in-memory database.
        engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool, connect_args={"check_same_thread": False})
        _sqlite_transactions(engine, wal=False)
        return engine
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise RegistryError(f"not a registry URL: {url!r} (use sqlite:///PATH, postgresql://..., or memory)") from e
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        # psycopg 3 whatever driver the URL names by default (SQLAlchemy's default is psycopg2).
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        try:
            return sa.create_engine(parsed, pool_pre_ping=True)
        except (ImportError, NoSuchModuleError) as e:
            raise RegistryError(f"a PostgreSQL registry needs psycopg 3: pip install 'psycopg[binary]' ({e})") from e
    if backend != "sqlite":
        raise RegistryError(f"unsupported registry database {backend!r}: use sqlite:///PATH or postgresql://...")
    if parsed.database in (None, "", ":memory:"):
        raise RegistryError(f"{url!r} names no file: use sqlite:///PATH, or `memory` for a registry kept in memory")
    path = Path(parsed.database)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RegistryError(f"cannot create the registry's directory {path.parent}: {e.strerror or e}") from e
    try:
        # The documents' texts are the tenants' data: the file is its owner's alone. SQLite makes the -wal, -shm and
        # -journal files with the database file's mode, so creating it here (empty: a database with no tables yet)
        # decides all of them. An existing file keeps the mode it has.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as e:
        raise RegistryError(f"cannot create the registry's file {path}: {e.strerror or e}") from e
    # Another process may hold the write lock for a while (a burst of registrations): wait for it, up to 30 s.
    engine = sa.create_engine(parsed, connect_args={"timeout": 30})
    _sqlite_transactions(engine, wal=True)
    return engine


def _sqlite_transactions(engine: Engine, wal: bool) -> None:
    """Transactions as the registry needs them, which Python's sqlite3 module does not do by itself: BEGIN emitted
    here (IMMEDIATE for writers, taking the write lock at once so two writers never deadlock upgrading a read lock),
    WAL (readers do not wait for a writer; several processes on one host may share the file) and synchronous=FULL
    (a commit is on disk before it returns: an acknowledged registration survives power loss)."""

    @sa.event.listens_for(engine, "connect")
    def connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # the driver sends no BEGIN of its own
        cursor = dbapi_connection.cursor()
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("lazyattn_write") else "BEGIN")
