"""The corners of PROTOCOL.md, each against the real receiver process: counts across restarts,
null fields, equal fences, a second hello, export pages and the frame limit, what reads see,
and that the server has no idle or partial-frame timeout."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutbench.receivers import protocol as P
from cutbench.errors import ReceiverError
from cutbench.receivers.client import ReceiverClient
from cutbench.receivers.process import start_receiver
from cutbench.receivers.schema import EXPORT_COLUMNS
from tests.fixtures.receiver_fixtures import raw_connection, store_write_lock, wait_queued

ROOT = Path(__file__).resolve().parents[2]
WIDE = "\U0001f600" * P.MAX_TEXT  # the longest legal text, 12 bytes a character once JSON-escaped


def _send(sock: socket.socket, *msgs: dict) -> None:
    sock.sendall(b"".join(P.encode(m) for m in msgs))


def _read(sock: socket.socket, n: int, dec: P.FrameDecoder | None = None) -> list[dict]:
    dec, out = dec or P.FrameDecoder(1 << 30), []
    while len(out) < n:
        data = sock.recv(1 << 16)
        assert data, "connection closed"
        out += dec.feed(data)
    return [json.loads(b) for b in out]


def _serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cutbench.receivers", "serve", "--store",
                             f"sqlite:{tmp_path / 'r.db'}", "--listen", "127.0.0.1:0", "--ready-file", str(ready),
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.01)
    return proc, ready.read_text().strip()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()


def test_done_counts_distinct_ops_that_took_effect_and_survives_restarts(store_url: str, tmp_path: Path) -> None:
    with start_receiver(store_url, tmp_path / "rcv") as h:
        c = ReceiverClient(h.address)
        c.open_trial("alo", "at_least_once")
        c.open_trial("idem", "idempotent")
        c.open_trial("fen", "fenced")
        for op in [1, 2, 2, 3, 3, 3]:  # duplicates are rows, not more done ops
            c.publish("alo", op, 0, "d")
            c.publish("idem", op, 0, "d")
        for op in [1, 2, 3]:
            c.prepare("fen", op, 0, "d")
        c.fence("fen", 2)
        c.commit("fen", 1)
        c.commit("fen", 2)
        expected = {"alo": (3, 0), "idem": (3, 0), "fen": (2, 1)}

        def counts() -> dict:
            return {t: (c.trial_info(t)["done"], c.trial_info(t)["open_prepared"]) for t in expected}

        assert counts() == expected
        h.restart()  # a clean stop and a new process on the same store
        assert counts() == expected
        h.kill()
        h.restart()
        assert counts() == expected
        assert c.trial_info("fen")["fence"] == 2 and c.trial_info("alo")["mode"] == "at_least_once"
        with pytest.raises(ReceiverError, match="unknown_trial"):
            c.trial_info("never")


def test_reads_see_committed_writes_only(receiver) -> None:
    """A read does not see a write, of its own connection or another, before that write committed."""
    c = ReceiverClient(receiver.address, ack_timeout=10)
    c.open_trial("t", "idempotent")
    url = receiver.store_url
    with store_write_lock(url):
        c.send_effect("t", 1, 0, "d")  # decided, but its commit waits for the lock
        wait_queued(c, 0)
        time.sleep(0.1)
        info = c.trial_info("t")
        hwm = c.high_water_mark()
        page = c.export("t")
    assert info["done"] == 0 and len(page) == 0
    assert c.wait_ack(1)["arrival_seq"] == hwm + 1
    assert c.trial_info("t")["done"] == 1 and len(c.export("t")) == 1


def test_null_is_the_same_as_absent_for_optional_fields_and_id() -> None:
    assert P.validate({"v": 1, "type": "health", "id": None}) == "health"
    assert P.validate({"v": 1, "type": "commit", "trial": "t", "op_id": 1, "epoch": None}) == "commit"
    assert P.validate({"v": 1, "type": "abort", "trial": "t", "op_id": None, "from_epoch": 2}) == "abort"
    for msg in [{"v": 1, "type": "fence", "trial": "t", "fence": None}, {"v": None, "type": "health"},
                {"v": 1, "type": None}]:
        with pytest.raises(P.ProtocolError):
            P.validate(msg)


def test_a_null_id_is_answered_without_one(receiver) -> None:
    sock = raw_connection(receiver.address)
    _send(sock, {"type": "health", "id": None})
    (r,) = _read(sock, 1)
    assert r["type"] == "result" and "id" not in r


def test_an_equal_fence_is_acked_and_recorded_a_lower_one_refused(receiver) -> None:
    c = ReceiverClient(receiver.address)
    c.open_trial("f", "fenced")
    first, again = c.fence("f", 4), c.fence("f", 4)
    assert again["fence"] == 4 and again["arrival_seq"] == first["arrival_seq"] + 1
    with pytest.raises(ReceiverError, match="fence_backwards"):
        c.fence("f", 3)
    assert c.trial_info("f")["fence"] == 4
    from cutbench.receivers.stores import open_store

    with open_store(receiver.store_url) as store:
        assert list(store.fences("f").fence) == [4, 4]


def test_a_refused_hello_leaves_the_connection_unauthenticated(tmp_path: Path) -> None:
    with start_receiver(f"sqlite:{tmp_path / 'r.db'}", tmp_path, token="s3cret") as h:
        sock = raw_connection(h.address)
        _send(sock, {"type": "hello", "id": 1, "token": "s3cret"}, {"type": "health", "id": 2},
              {"type": "hello", "id": 3, "token": "wrong"}, {"type": "health", "id": 4},
              {"type": "hello", "id": 5, "token": "s3cret"}, {"type": "health", "id": 6})
        replies = {r["id"]: r for r in _read(sock, 6)}
    assert replies[2]["status"] == "ok"
    assert replies[3]["code"] == "unauthorized" and replies[4]["code"] == "unauthorized"
    assert replies[6]["status"] == "ok"


def test_every_legal_message_and_reply_fits_the_smallest_frame_limit() -> None:
    effect = {"trial": WIDE, "op_id": P.MAX_INT, "attempt": P.MAX_INT, "epoch": P.MAX_INT, "digest": WIDE}
    row = [P.MAX_INT, WIDE, P.MAX_INT, P.MAX_INT, P.MAX_INT, WIDE, P.MAX_INT, WIDE, "prepare", "suppressed",
           P.MAX_INT, 1.7976931348623157e308, "at_least_once"]
    biggest = [
        {"type": "publish", "id": P.MAX_INT, **effect},
        {"type": "hello", "id": P.MAX_INT, "token": WIDE, "client": WIDE},
        P.reply("ack", "publish", P.MAX_INT, **effect, decision="suppressed", arrival_seq=P.MAX_INT),
        P.reply("result", "export", P.MAX_INT, columns=list(EXPORT_COLUMNS), rows=[row], next_after=P.MAX_INT),
        P.reply("result", "query", P.MAX_INT, what="trial", value={"trial": WIDE, "mode": "at_least_once",
                "fence": P.MAX_INT, "done": P.MAX_INT, "open_prepared": P.MAX_INT}),
    ]
    for msg in biggest:
        assert len(P.encode(msg)) - 4 <= P.MIN_FRAME, msg["type"]


def test_export_pages_shrink_to_the_frame_limit_and_only_null_next_after_ends(tmp_path: Path) -> None:
    proc, address = _serve(tmp_path, "--max-frame", str(P.MIN_FRAME))
    try:
        c = ReceiverClient(address)
        c.open_trial("w", "at_least_once")
        for op in range(12):
            c.send_effect("w", op, 0, WIDE)
        for op in range(12):
            c.wait_ack(op)
        sock = raw_connection(address)
        after, pages = 0, []
        while after is not None:
            dec = P.FrameDecoder(1 << 30)
            _send(sock, {"type": "export", "id": 1, "trial": "w", "after_seq": after, "limit": 12})
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
                data += sock.recv(1 << 16)
            assert len(data) - 4 <= P.MIN_FRAME  # replies keep the limit too
            (page,) = [json.loads(b) for b in dec.feed(data)]
            pages.append(page)
            after = page["next_after"]
        assert len(pages) > 2 and all(len(p["rows"]) < 12 for p in pages)
        assert [r[2] for p in pages for r in p["rows"]] == list(range(12))
        assert list(c.export("w").op_id) == list(range(12))  # the client follows next_after
    finally:
        _stop(proc)


def test_the_client_accepts_replies_up_to_the_servers_frame_limit(tmp_path: Path) -> None:
    """A server allowed larger frames than the client's default sends larger export pages."""
    proc, address = _serve(tmp_path, "--max-frame", str(8 << 20))
    try:
        c = ReceiverClient(address, wait_timeout=10)  # its own limit is the default 1 MiB
        c.open_trial("w", "at_least_once")
        for op in range(400):
            c.send_effect("w", op, 0, WIDE)
        for op in range(400):
            c.wait_ack(op)
        sock = raw_connection(address)
        _send(sock, {"type": "export", "id": 1, "trial": "w"})
        (page,) = _read(sock, 1)
        assert len(P.encode(page)) > P.MAX_FRAME and page["next_after"] is None  # one page, over 1 MiB
        assert len(c.export("w")) == 400
    finally:
        _stop(proc)


def test_a_frame_may_pause_midway_without_a_timeout(receiver) -> None:
    """A checkpointed client can freeze in the middle of a frame; the rest still gets its reply."""
    sock = raw_connection(receiver.address)
    frame = P.encode({"type": "health", "id": 11})
    sock.sendall(frame[:7])
    time.sleep(1.5)
    sock.sendall(frame[7:])
    (r,) = _read(sock, 1)
    assert r["id"] == 11 and r["status"] == "ok"
