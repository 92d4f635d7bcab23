"""``echo_peer`` / ``echo_peer_noseq``: a workload that exchanges a message with a peer every op.

The peer is a separate process the harness starts as the workload's
companion (``python -m cutbench.workloads.echo_peer CONFIG``): outside the checkpointed
process tree, so a cut never rolls it back. It is a stateless echo service
over loopback TCP — an external service like the receiver, reached through a
protocol that has to survive the workload's restores on its own; that
protocol is what this pair tests, so neither declares a ``peer`` domain.

Each op: the counter's update (``admit`` … ``record``), then ``send`` a
request derived from the op's digest, ``recv`` the peer's answer and check
it, then ``publish``/``ack``/``commit`` as ``counter`` does.

After a ``leave_running`` crash the restored socket is closed: the workload
reconnects. ``echo_peer`` numbers its requests and, on reconnect, resends the
request it has no answer for; replies carry the number, so stale ones are
ignored. ``echo_peer_noseq`` has no sequence numbers: it cannot tell whether
the peer saw its request, and having passed ``send`` before the cut it
believes the request went out, so it only waits for the answer — while the
peer, on its new connection, waits for a request. Neither moves: the
harness's watchdog reports a ``deadlock``.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from cutbench.workloads.common import MASK
from cutbench.workloads.counter import Counter
from cutbench.workloads.runtime import WorkloadConfig

ANSWER_MULT = 0x9E3779B97F4A7C15
ADDR_FILE = "peer.addr"
IO_TIMEOUT_S = 1.0


def answer(value: int) -> int:
    """The peer's answer to a request carrying ``value``."""
    return (value * ANSWER_MULT + 1) & MASK


class EchoPeer(Counter):
    """Correct twin: sequence-numbered requests, resent after a reconnect (see module docstring)."""

    name: ClassVar[str] = "echo_peer"
    phases: ClassVar[tuple[str, ...]] = ("admit", "launch", "device_done", "record", "send", "recv", "publish", "ack", "commit")
    companions: ClassVar[tuple[str, ...]] = ("cutbench.workloads.echo_peer",)
    sequenced: ClassVar[bool] = True

    def setup(self) -> None:
        """Counter's setup, then find the peer's address and connect."""
        super().setup()
        addr_file = Path(self.rt.config.control_path).with_name(ADDR_FILE)
        deadline = time.monotonic() + 30.0
        while not addr_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"peer did not publish its address in {addr_file}")
            time.sleep(0.01)
        host, _, port = addr_file.read_text().strip().rpartition(":")
        self.peer = (host, int(port))
        self.sock: socket.socket | None = None
        self.buf = b""
        self.reconnects = 0
        self._connect()

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.buf = b""
        while True:
            try:
                self.sock = socket.create_connection(self.peer, timeout=IO_TIMEOUT_S)
                return
            except OSError:
                time.sleep(0.05)

    def _send(self, line: str) -> None:
        """Send one request line; a send that fails is known not to have happened, so retry it."""
        while True:
            try:
                assert self.sock is not None
                self.sock.sendall(line.encode())
                return
            except OSError:
                self._connect()

    def _readline(self) -> str | None:
        """One line from the peer; None when the connection is gone, "" on a timeout."""
        while b"\n" not in self.buf:
            try:
                assert self.sock is not None
                chunk = self.sock.recv(4096)
            except socket.timeout:
                return ""
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def _exchange_answer(self, op: int, request: str) -> int:
        """Wait for the answer to ``request`` (op ``op``), reconnecting as the protocol says."""
        while True:
            line = self._readline()
            if line is None or (line == "" and self.sequenced):
                self._connect()
                self.reconnects += 1
                if self.sequenced:
                    self._send(request)  # unanswered: resend; the number makes it safe
                else:
                    self.rt.log(f"peer connection lost; reconnected; waiting for the answer to op {op} (request already sent)")
                continue
            if line == "":
                continue  # noseq: a slow answer, keep waiting
            if not self.sequenced:
                return int(line)
            seq, _, value = line.partition(" ")
            if int(seq) == op:
                return int(value)
            # an answer to an earlier request (sent again before a restore): ignore

    def run_op(self, op: int) -> None:
        """Counter's update, the peer exchange, then publish, ack, commit."""
        self.compute(op)
        value = int(self.last_digest[:16], 16)
        request = f"{op} {value}\n" if self.sequenced else f"{value}\n"
        self._send(request)
        self.point(op, "send")
        got = self._exchange_answer(op, request)
        if got != answer(value):
            raise RuntimeError(f"op {op}: peer answered {got}, expected {answer(value)}")
        self.point(op, "recv")
        self.deliver(op, self.last_digest)
        self.commit(op)

    def report(self) -> dict[str, Any]:
        """Counter's report plus how often the peer connection was re-established."""
        return {**super().report(), "peer_reconnects": self.reconnects}


class EchoPeerNoSeq(EchoPeer):
    """Known bad: the same exchange without sequence numbers (``deadlock`` after a rollback)."""

    name: ClassVar[str] = "echo_peer_noseq"
    sequenced: ClassVar[bool] = False


# -- the peer process -----------------------------------------------------------


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when the harness that started it exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _answer_line(line: bytes) -> bytes:
    parts = line.decode().split()
    if len(parts) == 2:
        return f"{parts[0]} {answer(int(parts[1]))}\n".encode()
    return f"{answer(int(parts[0]))}\n".encode()


def _serve(conn: socket.socket, alive: Any) -> None:
    """Answer every request line on ``conn`` until it closes (or the trial ends)."""
    conn.settimeout(IO_TIMEOUT_S)
    buf = b""
    with conn:
        while alive():
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                try:
                    conn.sendall(_answer_line(line))
                except (OSError, ValueError):
                    return


def main(argv: list[str] | None = None) -> int:
    """The peer: listen on loopback, publish the address next to the control file, answer requests."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cutbench.workloads.echo_peer CONFIG.json", file=sys.stderr)
        return 2
    _die_with_parent()
    config = WorkloadConfig.load(args[0])
    control = Path(config.control_path)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(IO_TIMEOUT_S)
        host, port = server.getsockname()[:2]
        tmp = control.with_name(ADDR_FILE + ".tmp")
        tmp.write_text(f"{host}:{port}")
        tmp.replace(control.with_name(ADDR_FILE))
        alive = control.exists  # the harness removes the trial directory at the end
        while alive():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            _serve(conn, alive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
