"""Both stores behind one protocol: durability settings, round trip, export shape, rebuild."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cutbench.errors import InvalidArgument
from cutbench.receivers import protocol as P
from cutbench.receivers.ledger import Changes, Command
from cutbench.receivers.schema import EXPORT_COLUMNS
from cutbench.receivers.stores import PostgresStore, SQLiteStore, open_store


def _cmd(mtype: str, **fields) -> Command:
    msg = {"v": 1, "type": mtype, **fields}
    P.validate(msg)
    return Command(mtype, msg, 3_000_001, "pid:1", 1700000000.5)


def _pub(trial: str, op: int, epoch: int = 0) -> Command:
    return _cmd("publish", trial=trial, op_id=op, attempt=1, epoch=epoch, digest=f"h{op}")


def _write(store, *cmds: Command) -> list[dict]:
    led = store.load_ledger()
    ch = Changes()
    out = [led.apply(c, ch) for c in cmds]
    store.write(ch)
    return out


def test_export_is_empty_but_typed_on_a_new_store(store_url: str) -> None:
    with open_store(store_url) as store:
        df = store.export()
    assert list(df.columns) == list(EXPORT_COLUMNS) and len(df) == 0
    assert str(df.arrival_seq.dtype) == "int64" and str(df.received_at.dtype) == "float64"


def test_round_trip_survives_reopen(store_url: str) -> None:
    with open_store(store_url) as store:
        assert store.begin_boot() == 1
        _write(store, _cmd("open_trial", trial="i", mode="idempotent"), _cmd("open_trial", trial="f", mode="fenced"),
               _pub("i", 1), _pub("i", 1), _pub("f", 5, epoch=2), _cmd("fence", trial="f", fence=9))
        _write(store, _cmd("commit", trial="f", op_id=5), _cmd("commit", trial="f", op_id=10))
    with open_store(store_url) as store:  # a new process would see exactly this
        assert store.begin_boot() == 2
        df = store.export()
        # the reopened ledger still knows op 1 was applied: a replay is suppressed
        assert _write(store, _pub("i", 1))[0]["decision"] == "suppressed"
        assert store.load_ledger().last_seq == 9
        fences = store.fences("f")
    assert list(df.decision) == ["applied", "suppressed", "committed", "rejected"]
    assert list(df.arrival_seq) == [3, 4, 5, 8]
    assert list(df["mode"]) == ["idempotent", "idempotent", "fenced", "fenced"]
    row = df.iloc[2]
    assert (row.trial, row.op_id, row.epoch, row.digest, row.kind, row.decided_seq) == ("f", 5, 2, "h5", "publish", 7)
    assert row.connection_id == 3_000_001 and row.client == "pid:1" and row.received_at == 1700000000.5
    assert list(fences.fence) == [9] and list(fences.arrival_seq) == [6]


def test_a_store_made_before_senders_gets_the_column_and_keeps_its_rows(store_url: str) -> None:
    with open_store(store_url) as store:
        _write(store, _cmd("open_trial", trial="t", mode="at_least_once"), _pub("t", 1))
        store._conn.cursor().execute("ALTER TABLE deliveries DROP COLUMN sender")  # as an older cutbench made it
        store._conn.commit()
    with open_store(store_url) as store:  # the next start adds it: old rows say -1, new ones who sent them
        _write(store, _cmd("publish", trial="t", op_id=2, attempt=1, epoch=0, digest="h2", sender=1))
        df = store.export()
    assert list(zip(df.op_id, df.sender)) == [(1, -1), (2, 1)]


def _integrity_error(url: str) -> type[Exception]:
    """What the store's database raises for a row whose primary key is taken: the driver's own error, passed on."""
    if url.startswith("sqlite:"):
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.errors.UniqueViolation


def test_failed_transaction_leaves_nothing(store_url: str) -> None:
    with open_store(store_url) as store:
        _write(store, _cmd("open_trial", trial="a", mode="at_least_once"))
        led = store.load_ledger()
        ch = Changes()
        led.apply(_pub("a", 1), ch)
        ch.rows.append(ch.rows[0])  # duplicate primary key: the whole batch must roll back
        with pytest.raises(_integrity_error(store_url), match="UNIQUE constraint failed|duplicate key value"):
            store.write(ch)
        assert len(store.export()) == 0
        assert store.load_ledger().last_seq == 1
        _write(store, _pub("a", 2))  # and the store is usable afterwards
        assert list(store.export().op_id) == [2]


def test_sqlite_is_wal_with_full_sync(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'r.db'}") as store:
        assert isinstance(store, SQLiteStore)
        conn = store._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # a plain sqlite3 reader (e.g. the oracle, or a human) can read the file
    assert sqlite3.connect(tmp_path / "r.db").execute("SELECT count(*) FROM deliveries").fetchone() == (0,)


@pytest.mark.postgres
def test_postgres_commits_synchronously(pg_url: str) -> None:
    with open_store(pg_url) as store:
        assert isinstance(store, PostgresStore)
        assert store._query("SHOW synchronous_commit") == [("on",)]
        assert store._query("SHOW fsync") == [("on",)]


@pytest.mark.parametrize("url", ["", "mysql://x", "sqlite:", 42])
def test_bad_store_urls_are_refused(url) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url)
