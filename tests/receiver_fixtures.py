"""Shared fixtures of the receiver tests: a throwaway PostgreSQL cluster and store URLs.

Test modules import the fixtures they use (``from tests.receiver_fixtures import ...``).
Without PostgreSQL server binaries the PostgreSQL tests skip, except where CI
(``CI`` set) or ``CUTBENCH_REQUIRE_POSTGRES=1`` demands them: then they fail.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterator

import pytest

from receivers.pgcluster import find_pg_bin, start_cluster


def postgres_required() -> bool:
    """True when a missing PostgreSQL must fail the tests instead of skipping them."""
    return bool(os.environ.get("CI")) or os.environ.get("CUTBENCH_REQUIRE_POSTGRES") == "1"


def _missing(reason: str) -> None:
    if postgres_required():
        pytest.fail(f"{reason} (required here because CI or CUTBENCH_REQUIRE_POSTGRES=1 is set)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator:
    """One throwaway cluster for the whole session; each test gets its own database."""
    if find_pg_bin() is None:
        _missing("PostgreSQL server binaries (initdb/pg_ctl) not found; run sh .ci/provision-postgres.sh")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg 3 is not installed (pip install 'cutbench[pg]')")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """URL of a fresh, empty database in the session's cluster."""
    return pg_cluster.create_database()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request, tmp_path: Path) -> str:
    """A fresh store of each kind: ``sqlite:`` file and a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'receiver.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def receiver(tmp_path: Path):
    """A running receiver process on a fresh SQLite store; stopped after the test."""
    from receivers.process import start_receiver

    handle = start_receiver(f"sqlite:{tmp_path / 'receiver.db'}", tmp_path / "rcv")
    try:
        yield handle
    finally:
        handle.stop()


class Publisher(threading.Thread):
    """A well-behaved client publishing ops ``first, first+1, ...`` until stopped; records acks."""

    def __init__(self, address: str, trial: str, first: int = 0, **client_kw):
        super().__init__(daemon=True)
        from receivers.client import ReceiverClient

        self.client = ReceiverClient(address, **client_kw)
        self.trial = trial
        self.next_op = first
        self.acked: dict[int, dict] = {}
        self.ack_times: list[float] = []
        self.error: BaseException | None = None
        self._stop_evt = threading.Event()

    def run(self) -> None:
        import time

        try:
            while not self._stop_evt.is_set():
                op = self.next_op
                ack = self.client.publish(self.trial, op, 0, f"d{op}", timeout=30)
                self.acked[op] = ack
                self.ack_times.append(time.monotonic())
                self.next_op += 1
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
        finally:
            self.client.close()

    def stop(self, timeout: float = 60) -> None:
        self._stop_evt.set()
        self.join(timeout)
        assert not self.is_alive(), "publisher did not stop"
