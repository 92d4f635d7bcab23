"""Durable stores behind one small protocol: SQLite (embedded default) and PostgreSQL.

The store is the single truth: the oracle reads it directly with ``export``,
also while the server is stopped or after it was killed. Both stores run the
same SQL (only placeholders and two column types differ); every batch of
writes is one transaction, and the server acks only after ``write`` returned,
i.e. after the commit was made durable (SQLite WAL with ``synchronous=FULL``,
PostgreSQL with its default ``synchronous_commit=on``).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from cutbench.errors import InvalidArgument, Unavailable

from .ledger import Changes, Ledger
from .schema import EXPORT_COLUMNS, FENCE_COLUMNS, ROW_COLUMNS, rows_to_frame

if TYPE_CHECKING:
    import pandas


class Store(Protocol):
    """What the receiver and the oracle need from a store."""

    url: str

    def load_ledger(self) -> Ledger:
        """Return the mode state (trials, fences, applied/prepared ops, last seq) as stored."""

    def begin_boot(self) -> int:
        """Record a server start; return its boot number (1, 2, ...), durably."""

    def write(self, changes: Changes) -> None:
        """Apply one batch in one transaction and commit it durably; raise on failure."""

    def export_rows(self, trial: str | None = None, after_seq: int = 0, limit: int | None = None) -> list[tuple]:
        """Return delivery rows (``EXPORT_COLUMNS`` order) with arrival_seq > after_seq, ascending."""

    def trial_info(self, trial: str) -> dict[str, Any] | None:
        """Return one trial's ``mode``, ``fence``, ``done`` and ``open_prepared`` as stored; None if never opened."""

    def export(self, trial: str | None = None) -> "pandas.DataFrame":
        """Return every delivery (optionally of one trial) as a DataFrame ordered by arrival_seq."""

    def fences(self, trial: str | None = None) -> "pandas.DataFrame":
        """Return every fence event (arrival_seq, trial, fence, received_at) in order."""

    def close(self) -> None:
        """Release the connection; safe to call twice."""


_DDL = """
CREATE TABLE IF NOT EXISTS deliveries (
    arrival_seq {pk} PRIMARY KEY,
    trial TEXT NOT NULL,
    op_id BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    digest TEXT NOT NULL,
    connection_id BIGINT NOT NULL,
    client TEXT NOT NULL,
    kind TEXT NOT NULL,
    decision TEXT NOT NULL,
    decided_seq BIGINT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL,
    sender BIGINT NOT NULL DEFAULT -1
);
CREATE INDEX IF NOT EXISTS deliveries_trial_op ON deliveries (trial, op_id);
CREATE TABLE IF NOT EXISTS trials (
    trial TEXT PRIMARY KEY,
    mode TEXT NOT NULL,
    fence BIGINT,
    opened_seq BIGINT NOT NULL,
    opened_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (
    arrival_seq BIGINT PRIMARY KEY,
    trial TEXT NOT NULL,
    fence BIGINT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value BIGINT NOT NULL
)
"""

# Columns of ``deliveries`` added after stores were first made, with their DDL (the migration adds them).
_ADDED_COLUMNS = {"sender": "BIGINT NOT NULL DEFAULT -1"}

# One statement, so one snapshot: the counts and the fence belong to the same committed state.
# ``done``: distinct ops of the trial that took effect (a row applied or committed), whatever the mode.
_TRIAL_INFO = (
    "SELECT t.mode, t.fence, "
    "(SELECT COUNT(DISTINCT d.op_id) FROM deliveries d WHERE d.trial = t.trial "
    "AND d.decision IN ('applied', 'committed')), "
    "(SELECT COUNT(*) FROM deliveries d WHERE d.trial = t.trial AND d.decision = 'prepared') "
    "FROM trials t WHERE t.trial = ?"
)

_SELECT_ROWS = (
    "SELECT " + ", ".join("d." + c for c in ROW_COLUMNS) + ", t.mode "
    "FROM deliveries d JOIN trials t ON t.trial = d.trial WHERE d.arrival_seq > ?"
)


class SqlStore:
    """The shared implementation; subclasses open the connection and name the dialect."""

    placeholder = "?"
    pk_type = "INTEGER"
    if_not_exists = ""  # what ADD COLUMN says to tolerate a column another opener just added

    def __init__(self, url: str):
        self.url = url
        self._conn: Any = self._connect()
        self._create_schema()

    # -- dialect hooks ------------------------------------------------------------------

    def _connect(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    # -- helpers ------------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence = ()) -> list[tuple]:
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(sql), params)
            rows = [tuple(r) for r in cur.fetchall()]
        finally:
            cur.close()
        self._conn.commit()  # end the read transaction (PostgreSQL would hold its snapshot)
        return rows

    def _create_schema(self) -> None:
        cur = self._conn.cursor()
        for stmt in _DDL.format(pk=self.pk_type).split(";"):
            cur.execute(stmt)
        # A store made before a column existed gets it, at its default (-1: the sender was not said). PostgreSQL
        # says IF NOT EXISTS itself (two receivers may open one old store at once); a SQLite file has one opener.
        cur.execute("SELECT * FROM deliveries WHERE 1 = 0")
        have = {d[0] for d in cur.description}
        for column, ddl in _ADDED_COLUMNS.items():
            if column not in have:
                cur.execute(f"ALTER TABLE deliveries ADD COLUMN {self.if_not_exists}{column} {ddl}")
        for key in ("last_seq", "boots"):
            if not self._query_in(cur, "SELECT value FROM meta WHERE key = ?", (key,)):
                cur.execute(self._sql("INSERT INTO meta (key, value) VALUES (?, 0)"), (key,))
        cur.close()
        self._conn.commit()

    def _query_in(self, cur: Any, sql: str, params: Sequence) -> list[tuple]:
        cur.execute(self._sql(sql), params)
        return cur.fetchall()

    # -- Store protocol -----------------------------------------------------------------

    def load_ledger(self) -> Ledger:
        trials = self._query("SELECT trial, mode, fence FROM trials")
        # at_least_once trials need no per-op state: skip their (possibly many) rows.
        open_rows = self._query(
            "SELECT d.arrival_seq, d.trial, d.op_id, d.epoch, d.decision FROM deliveries d "
            "JOIN trials t ON t.trial = d.trial WHERE t.mode <> 'at_least_once' "
            "AND d.decision IN ('applied', 'committed', 'prepared') ORDER BY d.arrival_seq"
        )
        (last_seq,) = self._query("SELECT value FROM meta WHERE key = 'last_seq'")[0]
        return Ledger.rebuild(trials, open_rows, int(last_seq))

    def begin_boot(self) -> int:
        cur = self._conn.cursor()
        try:
            cur.execute("UPDATE meta SET value = value + 1 WHERE key = 'boots'")
            cur.execute("SELECT value FROM meta WHERE key = 'boots'")
            (boot,) = cur.fetchone()
            self._conn.commit()
        except BaseException:
            self._conn.rollback()
            raise
        finally:
            cur.close()
        return int(boot)

    def write(self, changes: Changes) -> None:
        cur = self._conn.cursor()
        try:
            if changes.trials:
                cur.executemany(
                    self._sql("INSERT INTO trials (trial, mode, fence, opened_seq, opened_at) VALUES (?, ?, NULL, ?, ?)"),
                    changes.trials,
                )
            if changes.rows:
                marks = ", ".join("?" * len(ROW_COLUMNS))
                cur.executemany(
                    self._sql(f"INSERT INTO deliveries ({', '.join(ROW_COLUMNS)}) VALUES ({marks})"), changes.rows
                )
            if changes.decisions:
                cur.executemany(
                    self._sql("UPDATE deliveries SET decision = ?, decided_seq = ? WHERE arrival_seq = ?"),
                    changes.decisions,
                )
            if changes.fences:
                cur.executemany(
                    self._sql("INSERT INTO fences (arrival_seq, trial, fence, received_at) VALUES (?, ?, ?, ?)"),
                    changes.fences,
                )
                cur.executemany(
                    self._sql("UPDATE trials SET fence = ? WHERE trial = ?"),
                    [(f, t) for _, t, f, _ in changes.fences],
                )
            cur.execute(self._sql("UPDATE meta SET value = ? WHERE key = 'last_seq'"), (changes.last_seq,))
            self._conn.commit()
        except BaseException:
            try:
                self._conn.rollback()
            except Exception:
                pass  # the connection may be gone; the caller rebuilds from the store anyway
            raise
        finally:
            cur.close()

    def export_rows(self, trial: str | None = None, after_seq: int = 0, limit: int | None = None) -> list[tuple]:
        sql = _SELECT_ROWS
        params: list[Any] = [after_seq]
        if trial is not None:
            sql += " AND d.trial = ?"
            params.append(trial)
        sql += " ORDER BY d.arrival_seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._query(sql, params)

    def trial_info(self, trial: str) -> dict[str, Any] | None:
        found = self._query(_TRIAL_INFO, (trial,))
        if not found:
            return None
        mode, fence, done, open_prepared = found[0]
        return {"trial": trial, "mode": mode, "fence": None if fence is None else int(fence), "done": int(done),
                "open_prepared": int(open_prepared)}

    def export(self, trial: str | None = None) -> "pandas.DataFrame":
        return rows_to_frame(self.export_rows(trial), EXPORT_COLUMNS)

    def fences(self, trial: str | None = None) -> "pandas.DataFrame":
        sql, params = "SELECT " + ", ".join(FENCE_COLUMNS) + " FROM fences", []
        if trial is not None:
            sql += " WHERE trial = ?"
            params.append(trial)
        return rows_to_frame(self._query(sql + " ORDER BY arrival_seq", params), FENCE_COLUMNS)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> "SqlStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SQLiteStore(SqlStore):
    """SQLite file in WAL mode with ``synchronous=FULL``: each commit fsyncs the WAL."""

    def __init__(self, url: str, path: Path):
        self.path = path
        super().__init__(url)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # check_same_thread=False: the server writes from one executor thread, reads from another
        # connection; a single connection is never used by two threads at once.
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise Unavailable(f"SQLite store {self.path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn


class PostgresStore(SqlStore):
    """PostgreSQL through psycopg 3; server defaults give fsync'd commits."""

    placeholder = "%s"
    pk_type = "BIGINT"
    if_not_exists = "IF NOT EXISTS "

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise Unavailable("PostgreSQL store needs psycopg 3: pip install 'cutbench[pg]'") from None
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = psycopg.connect(self.url, connect_timeout=5)
                break
            except psycopg.OperationalError as exc:
                # A cluster that is just starting refuses briefly; anything persistent is reported.
                if time.monotonic() > deadline:
                    raise Unavailable(f"cannot connect to PostgreSQL store: {exc}") from None
                time.sleep(0.1)
        with conn.cursor() as cur:
            cur.execute("SHOW synchronous_commit")
            (sync,) = cur.fetchone()  # type: ignore[misc]  # SHOW always returns its one row
        conn.commit()
        if sync == "off":
            raise Unavailable("PostgreSQL store: synchronous_commit=off would ack before fsync")
        return conn


def open_store(url: str) -> Store:
    """Open (creating the schema if needed) the store named by ``url``.

    ``sqlite:PATH`` (also ``sqlite:///abs/path``) or ``postgresql://...``
    (``postgres://`` too). Returns a ``SQLiteStore`` or ``PostgresStore``.
    """
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"store url must be a non-empty string, got {url!r}")
    if url.startswith("sqlite:"):
        rest = url[len("sqlite:"):]
        if rest.startswith("//"):
            rest = rest[2:]
        if not rest:
            raise InvalidArgument(f"store url {url!r}: sqlite: needs a file path, e.g. sqlite:/tmp/r.db")
        return SQLiteStore(url, Path(rest))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    raise InvalidArgument(f"store url {url!r}: expected sqlite:PATH or postgresql://...")
