"""One connection never affects another: a row the store refuses fails alone in its group commit.

The store refuses the row for real: a trigger installed in the test's database
raises on one trial name, and the test holds the store's write lock while the
requests queue up, so they are decided and committed as one batch.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3

import pytest

from cutbench.receivers import protocol as P
from cutbench.errors import ReceiverError
from cutbench.receivers.client import ReceiverClient
from cutbench.receivers.process import start_receiver
from cutbench.receivers.stores import open_store
from tests.fixtures.receiver_fixtures import read_frames, sqlite_path, store_write_lock, wait_queued

POISON = "poison"  # the store refuses every delivery row of this trial, and every row with this digest


def install_poison_trigger(url: str) -> None:
    """Make the store itself refuse any delivery row of trial POISON or digest POISON (validation lets
    both pass)."""
    open_store(url).close()  # create the schema the trigger hangs on
    if url.startswith("sqlite:"):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
            db.execute("CREATE TRIGGER refuse_poison BEFORE INSERT ON deliveries "
                       f"WHEN NEW.trial = '{POISON}' OR NEW.digest = '{POISON}' "
                       "BEGIN SELECT RAISE(ABORT, 'the test trigger refuses this row'); END")
            db.commit()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN "
                   f"IF NEW.trial = '{POISON}' OR NEW.digest = '{POISON}' THEN "
                   "RAISE EXCEPTION 'the test trigger refuses this row'; END IF; "
                   "RETURN NEW; END $$ LANGUAGE plpgsql")
        db.execute("CREATE TRIGGER refuse_poison BEFORE INSERT ON deliveries FOR EACH ROW "
                   "EXECUTE FUNCTION refuse_poison()")


def test_a_row_the_store_refuses_fails_alone_and_the_rest_of_its_batch_commits(store_url: str, tmp_path) -> None:
    install_poison_trigger(store_url)
    with start_receiver(store_url, tmp_path / "rcv") as h:
        ctl = ReceiverClient(h.address, ack_timeout=10)
        for trial, mode in [("alo", "at_least_once"), ("idem", "idempotent"), ("fen", "fenced"),
                            (POISON, "at_least_once"), ("plug", "at_least_once")]:
            ctl.open_trial(trial, mode)
        others = [ReceiverClient(h.address, ack_timeout=10) for _ in range(4)]
        for c in others:
            c.health()  # connected before the store is locked
        host, port = h.address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        with store_write_lock(store_url):
            ctl.send_effect("plug", 1, 0, "p")  # its batch blocks on the lock ...
            wait_queued(ctl, 0)
            # ... while these queue up behind it and form the next batch, the bad row in the middle
            others[0].send_effect("alo", 1, 0, "a1")
            others[1].send_effect("idem", 1, 0, "i1")
            others[2].send_effect("alo", 2, 0, "a2")
            others[2].send_effect(POISON, 1, 0, "x")  # same connection as good writes on both sides
            others[2].send_effect("alo", 3, 0, "a3")
            others[3].send_effect("fen", 1, 0, "f1")
            others[3].send_effect("idem", 1, 0, "i1")  # one of the two idem op 1 is suppressed
            # One connection's frames are decided in order: the first delivery of op 2 is refused,
            # so op 2 never took effect and the second one is applied, not suppressed.
            raw.sendall(b"".join(P.encode({"type": "publish", "id": i, "trial": "idem", "op_id": 2, "attempt": 1,
                                           "epoch": 0, "digest": d}) for i, d in [(1, POISON), (2, "i2")]))
            wait_queued(ctl, 9)
        assert ctl.wait_ack(1, trial="plug")["decision"] == "applied"
        acks = {(t, op, i): c.wait_ack(op, trial=t) for i, c, t, op in
                [(0, others[0], "alo", 1), (1, others[1], "idem", 1), (2, others[2], "alo", 2),
                 (2, others[2], "alo", 3), (3, others[3], "fen", 1), (3, others[3], "idem", 1)]}
        with pytest.raises(ReceiverError) as refused:
            others[2].wait_ack(1, trial=POISON)
        op2 = {r["id"]: r for r in read_frames(raw, 2)}
        assert refused.value.code == "store_error" and "trigger" in refused.value.message
        assert op2[1]["code"] == "store_error" and op2[2]["decision"] == "applied"
        assert {k: a["decision"] for k, a in acks.items() if k[0] != "idem"} == {
            ("alo", 1, 0): "applied", ("alo", 2, 2): "applied", ("alo", 3, 2): "applied", ("fen", 1, 3): "prepared"}
        # Which connection's op 1 came first is the event loop's choice; one each way.
        assert sorted(a["decision"] for k, a in acks.items() if k[0] == "idem") == ["applied", "suppressed"]
        # Arrival numbers stay gap-free: the refused rows took none.
        seqs = sorted(a["arrival_seq"] for a in [*acks.values(), op2[2]])
        assert seqs == list(range(seqs[0], seqs[0] + 7)) and ctl.high_water_mark() == seqs[-1]
        df = ctl.export()
        assert POISON not in set(df.trial) and POISON not in set(df.digest)
        assert sorted(df[df.trial == "alo"].op_id) == [1, 2, 3]
        idem = df[df.trial == "idem"]
        assert sorted(zip(idem.op_id, idem.decision)) == [(1, "applied"), (1, "suppressed"), (2, "applied")]
        # The service goes on deciding from the truth: counts, suppression, the fenced op.
        assert ctl.trial_info("alo")["done"] == 3 and ctl.trial_info("idem")["done"] == 2
        assert others[0].publish("idem", 1, 0, "i1")["decision"] == "suppressed"
        ctl.fence("fen", 1)
        assert ctl.commit("fen", 1)["decision"] == "committed"
        assert ctl.health()["status"] == "ok" and h.running


def test_a_store_that_refuses_everything_fails_every_request_of_the_batch(tmp_path) -> None:
    """When no row can be stored, each request still gets its own store_error, and nothing is kept."""
    url = f"sqlite:{tmp_path / 'r.db'}"
    open_store(url).close()
    with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
        db.execute("CREATE TRIGGER refuse_all BEFORE INSERT ON deliveries "
                   "BEGIN SELECT RAISE(ABORT, 'the test trigger refuses every row'); END")
        db.commit()
    with start_receiver(url, tmp_path / "rcv") as h:
        ctl = ReceiverClient(h.address, ack_timeout=10)
        ctl.open_trial("t", "idempotent")
        hwm = ctl.high_water_mark()
        for op in range(5):
            ctl.send_effect("t", op, 0, "d")
        for op in range(5):
            with pytest.raises(ReceiverError, match="store_error"):
                ctl.wait_ack(op, trial="t")
        assert ctl.high_water_mark() == hwm and len(ctl.export()) == 0
        assert ctl.trial_info("t")["done"] == 0
