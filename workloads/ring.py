"""The ranks' ring over loopback TCP (:class:`Ring`): one rank's two links, tagged messages that a rank
resends after a broken connection, and the wire frames they travel in.

Every message carries the tag ``op * STRIDE + step``; a sender keeps what it sent during the current and the
previous op. When a connection breaks (a restore with ``--tcp-close`` closes every TCP connection), the
sender reconnects, the receiver says which tag it consumed last (``EXPECT``), and the sender resends what
follows. See :mod:`cutbench.workloads.ranks` for what that survives and what it cannot.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable

from cutbench.procs import is_zombie_or_gone

STRIDE = 1024  # tags: op * STRIDE + step
HEADER = struct.Struct("<4sBqI")  # magic, kind, tag, payload length
MAGIC = b"CBRG"
DATA, EXPECT, FIN = 1, 2, 3
SEND_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 300.0  # a rank that hears nothing this long gives up (the harness died)


def tag_of(op: int, step: int) -> int:
    """The wire tag of step ``step`` of op ``op``."""
    return op * STRIDE + step


def frame(kind: int, tag: int, payload: bytes = b"") -> bytes:
    """One wire frame."""
    return HEADER.pack(MAGIC, kind, tag, len(payload)) + payload


class Ring:
    """One rank's two ring links: from the left neighbour (accepted on ``listener``)
    and to the right one (connected to its port), with tagged, resendable messages.

    Single-threaded: every wait runs :meth:`_pump`, which accepts, connects,
    reads and answers handshakes. Nothing here holds a file open.
    """

    def __init__(self, rank: int, n: int, listener: socket.socket, ports: list[int], *,
                 log: Callable[[str], None], root_pid: int | None = None, idle_s: float = IDLE_TIMEOUT_S):
        self.rank, self.n = rank, n
        self.listener = listener
        self.right_port = ports[(rank + 1) % n]
        self.log = log
        self.root_pid = root_pid  # ranks > 0 give up when rank 0 is gone
        self.idle_s = idle_s
        self.left: socket.socket | None = None
        self.right: socket.socket | None = None
        self.right_ready = False  # the right neighbour told us what it has (EXPECT)
        self.right_fin = False  # the right neighbour finished: do not reconnect
        self.left_buf, self.right_buf = bytearray(), bytearray()
        self.consumed = -1  # highest tag consumed from the left
        self.inbox: dict[int, bytes] = {}
        self.sent: list[tuple[int, bytes]] = []  # resend log: (tag, frame), current and previous op
        self.dropped = 0  # duplicate messages ignored after a resend
        self.unserved = 0  # handshakes asking for messages older than the resend log
        self._next_connect = 0.0
        self._backoff = 0.01

    # -- public --------------------------------------------------------------
    def send(self, tag: int, payload: bytes) -> None:
        """Send ``payload`` to the right neighbour under ``tag`` (logged for resending)."""
        f = frame(DATA, tag, payload)
        self.sent.append((tag, f))
        floor = self._log_floor()
        self.sent = [(t, fr) for t, fr in self.sent if t >= floor]
        if self.right_ready:
            self._write_right(f)

    def recv(self, tag: int) -> bytes:
        """Block until the left neighbour's message ``tag`` arrives; return its payload."""
        deadline = time.monotonic() + self.idle_s
        while tag not in self.inbox:
            self._pump(deadline)
        return self._consume(tag)

    def recv_next(self) -> tuple[int, bytes]:
        """Block until any new message arrives from the left; return the lowest ``(tag, payload)``."""
        deadline = time.monotonic() + self.idle_s
        while not self.inbox:
            self._pump(deadline)
        tag = min(self.inbox)
        return tag, self._consume(tag)

    def close(self) -> None:
        """Tell both neighbours we are done, then close every socket."""
        for sock in (self.left, self.right):
            if sock is not None:
                try:
                    sock.sendall(frame(FIN, 0), socket.MSG_NOSIGNAL)
                except OSError:
                    pass
                sock.close()
        self.left = self.right = None
        self.listener.close()

    # -- machinery -----------------------------------------------------------
    def _consume(self, tag: int) -> bytes:
        payload = self.inbox.pop(tag)
        self.consumed = max(self.consumed, tag)
        for stale in [t for t in self.inbox if t <= self.consumed]:
            del self.inbox[stale]
        return payload

    def _log_floor(self) -> int:
        """The lowest tag the resend log still holds everything from."""
        if not self.sent:
            return 0
        return max(self.sent[-1][0] // STRIDE - 1, 0) * STRIDE

    def _pump(self, deadline: float) -> None:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"rank {self.rank}: nothing from the ring for {self.idle_s:g}s")
        if self.root_pid is not None and is_zombie_or_gone(self.root_pid):
            raise SystemExit(5)
        if self.right is None and not self.right_fin and now >= self._next_connect:
            self._connect_right(now)
        socks = [s for s in (self.listener, self.left, self.right) if s is not None]
        try:
            readable, _, _ = select.select(socks, [], [], 0.05)
        except (OSError, ValueError):  # a socket closed under us: the next round sees it
            return
        for sock in readable:
            if sock is self.listener:
                self._accept()
            elif sock is self.left:
                self._read_left()
            elif sock is self.right:
                self._read_right()

    def _connect_right(self, now: float) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.right_port), timeout=1.0)
        except OSError:
            self._next_connect = now + self._backoff
            self._backoff = min(self._backoff * 2, 0.5)
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(SEND_TIMEOUT_S)
        self.right, self.right_ready, self._backoff = sock, False, 0.01
        self.right_buf.clear()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(SEND_TIMEOUT_S)
        _closed(self.left)
        self.left = sock
        self.left_buf.clear()
        try:  # the handshake: what we consumed last, so the sender resends what follows
            sock.sendall(frame(EXPECT, self.consumed), socket.MSG_NOSIGNAL)
        except OSError:
            self._drop_left()

    def _read_left(self) -> None:
        frames = _read_frames(self.left, self.left_buf)
        if frames is None:
            self._drop_left()
            return
        for kind, tag, payload in frames:
            if kind == FIN:
                continue  # the left neighbour finished: nothing more comes from it
            if kind == DATA and tag > self.consumed and tag not in self.inbox:
                self.inbox[tag] = payload
            elif kind == DATA:
                self.dropped += 1

    def _read_right(self) -> None:
        frames = _read_frames(self.right, self.right_buf)
        if frames is None:
            self._drop_right()
            return
        for kind, tag, _payload in frames:
            if kind == FIN:
                self.right_fin = True
            elif kind == EXPECT:
                self._resend(tag)

    def _resend(self, consumed: int) -> None:
        """The right neighbour consumed up to ``consumed``: send everything after it."""
        if consumed >= 0 and self.sent and consumed + 1 < self._log_floor():
            self.unserved += 1
            self.log(f"rank {self.rank}: right neighbour needs tags after {consumed}; my resend log starts at "
                     f"{self._log_floor()}: its state and mine are from different cuts")
        self.right_ready = True
        for tag, f in self.sent:
            if tag > consumed:
                self._write_right(f)

    def _write_right(self, f: bytes) -> None:
        if self.right is None:
            return
        try:
            self.right.sendall(f, socket.MSG_NOSIGNAL)
        except OSError:
            self._drop_right()

    def _drop_left(self) -> None:
        _closed(self.left)
        self.left = None

    def _drop_right(self) -> None:
        _closed(self.right)
        self.right, self.right_ready = None, False


def _closed(sock: socket.socket | None) -> None:
    """Close ``sock`` if there is one."""
    if sock is not None:
        sock.close()


def _read_frames(sock: socket.socket | None, buf: bytearray) -> list[tuple[int, int, bytes]] | None:
    """Read what ``sock`` has; return the complete frames, or None when the connection is gone."""
    if sock is None:
        return None
    try:
        data = sock.recv(1 << 16)
    except (BlockingIOError, InterruptedError, socket.timeout):
        return []
    except OSError:
        return None
    if not data:
        return None
    buf += data
    frames = []
    while len(buf) >= HEADER.size:
        magic, kind, tag, length = HEADER.unpack_from(buf)
        if magic != MAGIC:
            return None  # not our protocol: treat as a broken link
        if len(buf) < HEADER.size + length:
            break
        frames.append((kind, tag, bytes(buf[HEADER.size : HEADER.size + length])))
        del buf[: HEADER.size + length]
    return frames
