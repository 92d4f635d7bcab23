"""The service as a process: CLI, exposure rules, error semantics, shutdown, client recovery."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutbench.errors import InvalidArgument
from cutbench.receivers import client as client_module
from cutbench.receivers import protocol as P
from cutbench.errors import ReceiverError, ReceiverUnavailable
from cutbench.receivers.client import ReceiverClient
from cutbench.receivers.process import start_receiver
from cutbench.receivers.stores import open_store
from tests.fixtures.receiver_fixtures import raw_connection, read_frames

ROOT = Path(__file__).resolve().parents[2]


def _serve(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cutbench.receivers", "serve", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.01)
    return path.read_text().strip()


def test_cli_serves_a_unix_socket_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    sock_path, ready = tmp_path / "r.sock", tmp_path / "ready"
    proc = _serve("--store", f"sqlite:{tmp_path / 'r.db'}", "--listen", f"unix:{sock_path}",
                  "--ready-file", str(ready))
    try:
        address = _wait_file(ready, proc)
        assert address == f"unix:{sock_path}"
        with ReceiverClient(address) as c:
            c.open_trial("t", "at_least_once")
            for op in range(50):
                c.send_effect("t", op, 0, "x")
            proc.send_signal(signal.SIGTERM)
            # everything sent before SIGTERM is committed and acked before the server exits
            acks = [c.wait_ack(op, timeout=10) for op in range(50)]
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert {a["decision"] for a in acks} == {"applied"}
    assert not sock_path.exists()
    assert len(open_store(f"sqlite:{tmp_path / 'r.db'}").export()) == 50


@pytest.mark.parametrize(
    "args, message",
    [
        (["--listen", "0.0.0.0:0"], "--allow-remote"),
        (["--listen", "0.0.0.0:0", "--allow-remote"], "token"),
        (["--listen", "example.org:0", "--allow-remote"], "token"),
        (["--listen", "nonsense"], "HOST:PORT"),
        (["--listen", "127.0.0.1:0", "--token", "t" * 300], "the protocol carries at most 256"),
        (["--store", "mysql://x", "--listen", "127.0.0.1:0"], "sqlite:PATH"),
    ],
)
def test_cli_refuses_unsafe_or_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    if "--store" not in args:
        args = ["--store", f"sqlite:{tmp_path / 'r.db'}", *args]
    proc = _serve(*args)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 2 and message in out, out


def test_remote_bind_needs_the_token_from_every_client(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        start_receiver(f"sqlite:{tmp_path / 'r.db'}", tmp_path, listen="0.0.0.0:0")
    with start_receiver(f"sqlite:{tmp_path / 'r.db'}", tmp_path, listen="0.0.0.0:0", token="s3cret",
                        allow_remote=True) as h:
        port = h.address.rsplit(":", 1)[1]
        with pytest.raises(ReceiverError, match="unauthorized"):
            ReceiverClient(f"127.0.0.1:{port}", token="wrong").health()
        sock = raw_connection(f"127.0.0.1:{port}")
        sock.sendall(P.encode({"type": "health", "id": 1}))  # no hello: refused, connection kept
        sock.sendall(P.encode({"type": "hello", "id": 2, "token": "s3cret"}))
        sock.sendall(P.encode({"type": "health", "id": 3}))
        r1, r2, r3 = read_frames(sock, 3)
        assert r1["code"] == "unauthorized" and r2["type"] == "result" and r3["status"] == "ok"
        with ReceiverClient(f"127.0.0.1:{port}", token="s3cret") as c:
            assert c.health()["status"] == "ok"
    assert "s3cret" not in " ".join(open(f"/proc/{os.getpid()}/cmdline").read().split("\0"))


def test_bad_messages_get_errors_and_bad_framing_closes_only_that_connection(receiver) -> None:
    good = ReceiverClient(receiver.address)
    good.open_trial("t", "at_least_once")
    sock = raw_connection(receiver.address)
    bodies = [b"not json", b"[]", json.dumps({"v": 1, "type": "launch"}).encode(),
              json.dumps({"v": 1, "type": "publish", "id": 9, "trial": "never", "op_id": 1, "attempt": 1,
                          "epoch": 0, "digest": ""}).encode(),
              json.dumps({"v": 1, "type": "health", "id": 10}).encode()]
    sock.sendall(b"".join(struct.pack(">I", len(b)) + b for b in bodies))
    replies = read_frames(sock, len(bodies))
    # writes are answered after their commit, so the health reply may overtake the publish error
    replies.sort(key=lambda r: r.get("id", -1))
    assert [r.get("code") for r in replies] == ["bad_json", "bad_message", "unknown_type", "unknown_trial", None]
    assert "never" in replies[3]["message"] and replies[3]["id"] == 9 and replies[3]["re"] == "publish"
    assert replies[4]["id"] == 10 and replies[4]["status"] == "ok"
    # a length prefix over the maximum: error reply, then the server closes the connection
    sock.sendall(struct.pack(">I", P.MAX_FRAME + 1) + b"xx")
    (err,) = read_frames(sock, 1)
    assert err["code"] == "frame_too_large"
    assert sock.recv(10) == b""
    assert good.publish("t", 1, 0, "d")["decision"] == "applied"  # other clients never affected


def test_resend_after_a_dead_socket_shows_duplicates_only_under_at_least_once(receiver) -> None:
    c = ReceiverClient(receiver.address)
    # The high-water mark is polled on another connection: polling on ``c`` could
    # read the ack before the socket dies, and the test would then race the server.
    ctl = ReceiverClient(receiver.address)
    c.open_trial("alo", "at_least_once")
    c.open_trial("idem", "idempotent")
    for trial in ("alo", "idem"):
        c.send_effect(trial, 1, 0, "d")
        # The ack is lost: what CRIU's --tcp-close does to the restored socket. The socket is shut and
        # dropped, not only shut: an ack the server wrote before the shutdown would still be read from it.
        c._sock.shutdown(socket.SHUT_RDWR)
        c._drop()
        deadline = time.monotonic() + 5
        while ctl.high_water_mark() < 2 + (trial == "idem") * 2:  # delivered and committed
            assert time.monotonic() < deadline
        ack = c.wait_ack(1, trial=trial)
        assert ack["attempt"] == 2
    df = c.export()
    assert c.resends == 2
    assert list(df[df.trial == "alo"].decision) == ["applied", "applied"]
    assert list(df[df.trial == "idem"].decision) == ["applied", "suppressed"]
    assert list(df.attempt) == [1, 2, 1, 2]


def test_client_rides_through_a_restart_on_the_same_address(receiver) -> None:
    c = ReceiverClient(receiver.address)
    c.open_trial("t", "idempotent")
    c.publish("t", 1, 0, "d")
    hwm = c.high_water_mark()
    address = receiver.address
    receiver.kill()
    receiver.restart()
    assert receiver.address == address
    assert c.publish("t", 2, 0, "d")["decision"] == "applied"
    assert c.high_water_mark() > hwm  # the high-water mark never goes back across restarts
    assert c.health()["boot"] == 2


def test_unreachable_receiver_raises_after_the_timeout(monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once closed
    c = ReceiverClient(f"127.0.0.1:{port}", max_backoff=0.05)
    c.send_effect("t", 1, 0, "d")  # does not raise: the effect stays pending

    class Clock:
        """The client's clock, moved on only by the client's own sleeps: when it gives up is a fact of its code,
        whatever the host's load."""

        now = 1000.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            cls.now += seconds

    monkeypatch.setattr(client_module, "time", Clock)
    with pytest.raises(ReceiverUnavailable):
        c.wait_ack(1, timeout=0.5)  # it raises (a hang would be caught by the test's timeout) ...
    # ... and not before its timeout: only once its next retry (at most max_backoff away) would land past it.
    assert Clock.now - 1000.0 > 0.5 - 0.05
    assert c.pending == [("t", 1)]


def test_wire_export_matches_the_store_export(store_url: str, tmp_path: Path) -> None:
    with start_receiver(store_url, tmp_path / "rcv") as h, ReceiverClient(h.address) as c:
        c.open_trial("big", "at_least_once")
        c.open_trial("other", "idempotent")
        for op in range(2500):  # more than one export page
            c.send_effect("big", op, 1, "x" * 40)
        for op in range(2500):
            c.wait_ack(op, trial="big")
        c.publish("other", 1, 0, "y")
        wire = c.export("big")
        wire_all = c.export()
    with open_store(store_url) as store:
        direct = store.export("big")
    assert len(wire) == 2500 and len(wire_all) == 2501
    assert wire.equals(direct)


def test_client_validates_arguments_at_the_boundary() -> None:
    with pytest.raises(InvalidArgument):
        ReceiverClient("no-port")
    c = ReceiverClient("127.0.0.1:9")
    with pytest.raises(InvalidArgument):
        c.send_effect("t", -1, 0, "d")
    with pytest.raises(InvalidArgument):
        c.open_trial("t", "exactly_once")
    with pytest.raises(InvalidArgument):
        c.abort("t")
    with pytest.raises(InvalidArgument):
        c.wait_ack(5)


def test_unstorable_text_is_refused_at_validation_and_affects_no_other_connection(receiver) -> None:
    """A lone surrogate is valid JSON but no store can hold it: an error reply for that request only."""
    good = ReceiverClient(receiver.address)
    good.open_trial("iso", "at_least_once")
    sock = raw_connection(receiver.address)
    bad = [{"v": 1, "type": "publish", "id": 1, "trial": "iso", "op_id": 1, "attempt": 1, "epoch": 0, "digest": "\ud800"},
           {"v": 1, "type": "open_trial", "id": 2, "trial": "x\udfff", "mode": "idempotent"}]
    sock.sendall(b"".join(struct.pack(">I", len(b)) + b for b in (json.dumps(m).encode() for m in bad)))
    replies = sorted(read_frames(sock, 2), key=lambda r: r.get("id", -1))
    assert [r.get("code") for r in replies] == ["bad_argument", "bad_argument"]
    assert "lone surrogates" in replies[0]["message"]
    assert good.publish("iso", 2, 0, "d")["decision"] == "applied"
    assert list(good.export("iso")["op_id"]) == [2]


def _cutbench(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cutbench", *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def test_both_doors_show_the_one_serve_command_and_its_options() -> None:
    from cutbench.receivers.command import serve_command

    options = [opt for param in serve_command.params for opt in param.opts]
    assert {"--store", "--listen", "--token", "--allow-remote", "--ready-file", "--max-frame"} <= set(options)
    for proc, usage in [(_cutbench("receiver", "serve", "--help"), "Usage: cutbench receiver serve [OPTIONS]"),
                        (_serve("--help"), "Usage: python -m cutbench.receivers serve [OPTIONS]")]:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and usage in out, out
        assert all(opt in out for opt in options), out
        assert "CUTBENCH_RECEIVER_TOKEN" in out and "postgresql://" in out
    # Bad arguments are cutbench's exit 254 through `cutbench`, 2 through `python -m cutbench.receivers`.
    for args, message in [(["--max-frame", "100"], "--max-frame"), (["--listen", "nonsense"], "HOST:PORT")]:
        proc = _cutbench("receiver", "serve", "--store", "sqlite:/nonexistent/r.db", *args)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 254 and message in out, out


@pytest.mark.postgres
def test_cutbench_receiver_serve_on_a_postgresql_store(pg_url: str, tmp_path: Path) -> None:
    """The README's PostgreSQL form: --store takes the libpq URI as it is."""
    ready = tmp_path / "ready"
    proc = _cutbench("receiver", "serve", "--store", pg_url, "--listen", "127.0.0.1:0", "--ready-file", str(ready))
    try:
        with ReceiverClient(_wait_file(ready, proc)) as c:
            assert c.health()["store"] == "postgresql"
            c.open_trial("pg", "idempotent")
            assert c.publish("pg", 1, 0, "d")["decision"] == "applied"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.kill()
        proc.wait()
    with open_store(pg_url) as store:
        assert list(store.export().trial) == ["pg"]


@pytest.mark.parametrize("harness_reaped", [True, False], ids=["harness-reaped", "harness-a-zombie"])
def test_a_receiver_outlives_no_harness_killed_outright(tmp_path, harness_reaped):
    """SIGKILL of the harness that started it: the receiver sees its starter gone and shuts down cleanly.

    The test process is a subreaper, as every harness session makes it: the
    orphaned receiver is re-parented here, so its exit leaves a zombie (which
    ``kill(pid, 0)`` still finds) until reaped. The harness itself is left a
    zombie too in one case: dead all the same.
    """
    import os
    import subprocess
    import sys
    import time

    from cutbench.procs import become_subreaper, is_zombie_or_gone

    become_subreaper()
    code = ("import sys, time\nfrom pathlib import Path\nfrom cutbench.receivers.process import start_receiver\n"
            "h = start_receiver('sqlite:' + sys.argv[1] + '/r.sqlite', Path(sys.argv[1]))\n"
            "print(h._proc.pid, flush=True)\ntime.sleep(120)\n")
    harness = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    receiver = int(harness.stdout.readline())
    harness.kill()
    if harness_reaped:
        harness.wait()
    try:
        deadline = time.monotonic() + 15
        while not is_zombie_or_gone(receiver):
            if time.monotonic() > deadline:
                os.kill(receiver, 9)
                raise AssertionError("the receiver outlived the harness that started it")
            time.sleep(0.1)
    finally:
        harness.wait()
        try:
            os.waitpid(receiver, 0)  # re-parented here: reap it
        except ChildProcessError:
            pass
    assert "stopped after" in (tmp_path / "receiver.log").read_text()  # the clean shutdown, not a kill


def test_a_restore_reads_what_a_crashed_workload_sent_only_after_the_receiver_stored_it(receiver) -> None:
    """The harness's :meth:`settle` before a restore after ``leave_running``: while the crashed workload's
    connection is open its last frames may be unread; the read waits until the receiver shows no connection of
    the workload's name, and then for a write of its own queued after them, so the effect sent last is seen."""
    import threading

    from cutbench.errors import HarnessFault
    from cutbench.harness.runner.coordinator import TrialCoordinator
    from cutbench.receivers.client import workload_client_name

    trial = "r/t0001"
    harness = ReceiverClient(receiver.address, client_name="harness")
    harness.open_trial(trial, "at_least_once")
    workload = ReceiverClient(receiver.address, client_name=workload_client_name(trial))
    workload.open_trial(trial, "at_least_once")
    assert sorted(harness.clients()) == ["harness", workload_client_name(trial)]
    co = TrialCoordinator(harness, trial, "at_least_once", "audit", control=None, phases=("publish",),
                          workload_domains=("cpu", "receiver"), covers=("cpu",))
    with pytest.raises(HarnessFault, match="still held the crashed workload's connection"):
        co.settle(timeout_s=0.2)

    def crash() -> None:
        time.sleep(0.3)
        workload.send_effect(trial, 4, 0, "d4")  # its last frame: sent, never acknowledged
        workload.close()

    threading.Thread(target=crash).start()
    co.settle()
    assert workload_client_name(trial) not in harness.clients()
    assert list(harness.export(trial)["op_id"]) == [4]
    harness.close()
