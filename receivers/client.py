"""Blocking receiver client for workloads, built to survive CRIU checkpoint/restore.

Single-threaded on purpose: no background threads means nothing is mid-flight
in another thread when CRIU freezes the process. The client holds one socket
and no files. After a restore the socket is usually dead (CRIU restores with
``--tcp-close``): the next send fails or the next read sees EOF. The client
then reconnects with exponential backoff and resends every effect it has not
seen acknowledged, with ``attempt`` incremented. Under ``at_least_once`` those
resends are exactly where duplicates come from, which is what the benchmark
wants to observe.
"""

from __future__ import annotations

import errno
import os
import random
import select
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cutbench.errors import CutbenchError, InvalidArgument, ReceiverError, ReceiverUnavailable
from cutbench.validate import check_int, check_positive, check_text

from . import protocol as P
from .schema import EXPORT_COLUMNS, rows_to_frame

if TYPE_CHECKING:
    import pandas


def workload_client_name(trial: str) -> str:
    """The client name a trial's workload says ``hello`` with: the harness waits for no open connection of this
    name before it reads what a crashed incarnation sent (its last frames may still be unread)."""
    return f"workload {trial}"


class _Lost(Exception):
    """Internal: the connection is gone; reconnect and resend."""


def _check_int(name: str, value: Any, low: int = 0) -> int:
    return check_int(name, value, low, P.MAX_INT)


def _check_text(name: str, value: Any, allow_empty: bool = False) -> str:
    return check_text(name, value, max_len=P.MAX_TEXT, allow_empty=allow_empty)


def _check_seconds(name: str, value: Any) -> float:
    return float(check_positive(name + " (seconds)", value))


class ReceiverClient:
    """Connection to a receiver at ``address`` (``HOST:PORT`` or ``unix:PATH``).

    ``ack_timeout``: how long a live connection may stay silent while acks are
    owed before it is treated as dead (reconnect and resend). ``wait_timeout``:
    default overall limit of ``wait_ack`` and control calls. ``connect_timeout``
    bounds one connection attempt; ``max_backoff`` caps the pause between them.
    ``max_frame`` is the largest reply accepted; it grows to the server's limit
    (from ``hello``) when that is larger. ``sender``, where given, says which
    incarnation of the process is sending: each effect frame carries it as it
    goes out, a resend after a restore included (the effect's ``epoch`` stays
    the one it was made in).
    Connecting is lazy: nothing happens until the first call.
    """

    def __init__(self, address: str, *, token: str | None = None, ack_timeout: float = 2.0,
                 connect_timeout: float = 5.0, max_backoff: float = 0.5, wait_timeout: float = 30.0,
                 client_name: str | None = None, max_frame: int = P.MAX_FRAME,
                 sender: Callable[[], int] | None = None):
        try:
            self._kind, self._host, self._port = P.parse_listen(address)
        except CutbenchError as exc:
            raise InvalidArgument(f"receiver address: {exc}") from None
        self.address = address
        self.token = token
        self.ack_timeout = _check_seconds("ack_timeout", ack_timeout)
        self.connect_timeout = _check_seconds("connect_timeout", connect_timeout)
        self.max_backoff = _check_seconds("max_backoff", max_backoff)
        self.wait_timeout = _check_seconds("wait_timeout", wait_timeout)
        self.client_name = _check_text("client_name", client_name or f"pid:{os.getpid()}")
        self.max_frame = max_frame
        self._sock: socket.socket | None = None
        self._poller: select.poll | None = None
        self._decoder = P.FrameDecoder(max_frame)
        self._next_id = 1
        # (trial, op_id) -> {"msg": publish/prepare message, "sent": bool}; insertion order = resend order
        self._unacked: dict[tuple[str, int], dict[str, Any]] = {}
        self._ack_for_id: dict[int, tuple[str, int]] = {}
        self._acked: dict[tuple[str, int], dict[str, Any]] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self.connection_id: int | None = None
        self.connects = 0  # successful (re)connections
        self.resends = 0  # effects sent again after a reconnect
        self._given_up: str | None = None  # set by give_up(), from any thread
        self._sender = sender

    # -- effects ----------------------------------------------------------------------

    def send_effect(self, trial: str, op_id: int, epoch: int, digest: str, *, kind: str = "publish") -> None:
        """Send one effect and remember it as un-acked; returns without waiting for the ack.

        ``kind`` is ``publish`` (any mode) or ``prepare`` (fenced trials). A
        connection failure here is not raised: ``wait_ack`` reconnects and resends.
        """
        _check_text("trial", trial)
        _check_int("op_id", op_id)
        _check_int("epoch", epoch)
        _check_text("digest", digest, allow_empty=True)
        if kind not in ("publish", "prepare"):
            raise InvalidArgument(f"kind must be 'publish' or 'prepare', got {kind!r}")
        key = (trial, op_id)
        old = self._unacked.get(key)
        attempt = old["msg"]["attempt"] + 1 if old is not None else 1
        self._acked.pop(key, None)
        entry = {"msg": {"v": P.VERSION, "type": kind, "trial": trial, "op_id": op_id, "attempt": attempt,
                         "epoch": epoch, "digest": digest}, "sent": False}
        self._unacked[key] = entry
        try:
            if self._sock is None:
                self._connect(time.monotonic() + self.connect_timeout, tries=1)  # also sends the entry
            else:
                self._transmit(key, entry)
        except (_Lost, ReceiverUnavailable):
            self._drop()

    def wait_ack(self, op_id: int, timeout: float | None = None, *, trial: str | None = None) -> dict[str, Any]:
        """Block until effect ``op_id`` is acked; return the ack (with ``decision``, ``arrival_seq``).

        Reconnects and resends on connection loss. ``trial`` disambiguates when
        the same op_id was sent to several trials. Raises ``ReceiverUnavailable``
        after ``timeout`` (default ``wait_timeout``) seconds, ``ReceiverError``
        if the receiver refused the effect (e.g. the trial was never opened).
        """
        key = self._key_for(op_id, trial)
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else _check_seconds("timeout", timeout))
        while key not in self._acked:
            if key not in self._unacked:
                raise InvalidArgument(f"op {op_id} of trial {key[0]!r} is neither pending nor acked")
            deadline = self._progress(deadline)
        reply = self._acked.pop(key)
        if reply.get("type") == "error":
            raise ReceiverError.from_reply(reply)
        return reply

    def forget(self, op_id: int, *, trial: str | None = None) -> bool:
        """Stop owing effect ``op_id``: it is neither resent on a reconnect nor waited for. For a restored
        client whose durable reply log says its crashed incarnation had that effect acknowledged (a resend
        would be a second delivery). Returns whether it was pending."""
        keys = [k for k in self._unacked if k[1] == op_id and (trial is None or k[0] == trial)]
        for k in keys:
            del self._unacked[k]
        for msg_id in [i for i, k in self._ack_for_id.items() if k in keys]:
            del self._ack_for_id[msg_id]
        return bool(keys)

    def publish(self, trial: str, op_id: int, epoch: int, digest: str, timeout: float | None = None) -> dict[str, Any]:
        """Run ``send_effect`` then ``wait_ack``; returns the ack."""
        self.send_effect(trial, op_id, epoch, digest)
        return self.wait_ack(op_id, timeout, trial=trial)

    def prepare(self, trial: str, op_id: int, epoch: int, digest: str, timeout: float | None = None) -> dict[str, Any]:
        """Fenced mode phase one: a prepared (not yet applied) delivery; returns the ack."""
        self.send_effect(trial, op_id, epoch, digest, kind="prepare")
        return self.wait_ack(op_id, timeout, trial=trial)

    @property
    def pending(self) -> list[tuple[str, int]]:
        """Return (trial, op_id) of every effect sent but not yet acknowledged, in send order."""
        return list(self._unacked)

    def _key_for(self, op_id: int, trial: str | None) -> tuple[str, int]:
        _check_int("op_id", op_id)
        if trial is not None:
            return (trial, op_id)
        keys = {k for k in (*self._unacked, *self._acked) if k[1] == op_id}
        if len(keys) != 1:
            what = "was never sent" if not keys else f"is pending in several trials {sorted(k[0] for k in keys)}"
            raise InvalidArgument(f"op {op_id} {what}; pass trial=")
        return keys.pop()

    # -- control calls ----------------------------------------------------------------

    def open_trial(self, trial: str, mode: str) -> dict[str, Any]:
        """Declare ``trial`` and its delivery mode (idempotent); returns the ack."""
        if mode not in P.MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(P.MODES)}, got {mode!r}")
        return self._request({"type": "open_trial", "trial": _check_text("trial", trial), "mode": mode})

    def fence(self, trial: str, fence: int) -> dict[str, Any]:
        """Publish the fence: ops with op_id <= ``fence`` may commit. Never moves backwards."""
        return self._request({"type": "fence", "trial": _check_text("trial", trial),
                              "fence": _check_int("fence", fence)})

    def commit(self, trial: str, op_id: int, epoch: int | None = None) -> dict[str, Any]:
        """Commit the latest prepared delivery of ``op_id`` (of ``epoch`` if given).

        Returns the ack: ``decision`` is ``committed`` (``already`` true on a
        repeat) or ``rejected`` with a ``reason`` (past the fence, nothing prepared).
        """
        msg: dict[str, Any] = {"type": "commit", "trial": _check_text("trial", trial),
                               "op_id": _check_int("op_id", op_id)}
        if epoch is not None:
            msg["epoch"] = _check_int("epoch", epoch)
        return self._request(msg)

    def abort(self, trial: str, *, op_id: int | None = None, from_epoch: int | None = None) -> dict[str, Any]:
        """Abort open prepared deliveries of one op, or of every epoch >= ``from_epoch``; ack has ``aborted``."""
        if (op_id is None) == (from_epoch is None):
            raise InvalidArgument("abort needs exactly one of op_id= or from_epoch=")
        msg: dict[str, Any] = {"type": "abort", "trial": _check_text("trial", trial)}
        if op_id is not None:
            msg["op_id"] = _check_int("op_id", op_id)
        else:
            msg["from_epoch"] = _check_int("from_epoch", from_epoch)
        return self._request(msg)

    def high_water_mark(self) -> int:
        """Return the largest arrival_seq durably committed so far (0 on an empty store)."""
        return int(self._request({"type": "query", "what": "high_water_mark"})["value"])

    def trial_info(self, trial: str) -> dict[str, Any]:
        """Return one trial's committed state: ``mode``, ``fence``, ``done`` (distinct ops that took
        effect: a row applied or committed) and ``open_prepared``. ``ReceiverError`` if never opened."""
        return self._request({"type": "query", "what": "trial", "trial": _check_text("trial", trial)})["value"]

    def clients(self) -> list[str]:
        """The client names (``hello``'s ``client``) of the receiver's open connections, this one's included."""
        return list(self._request({"type": "query", "what": "clients"})["value"])

    def health(self) -> dict[str, Any]:
        """Return the server's health reply (status, pid, boot, high_water_mark, connections, ...)."""
        return self._request({"type": "health"})

    def export(self, trial: str | None = None) -> "pandas.DataFrame":
        """Return every delivery (optionally of one trial) over the wire, same frame as ``Store.export``."""
        if trial is not None:
            _check_text("trial", trial)
        rows: list[list] = []
        after = 0
        while True:
            msg: dict[str, Any] = {"type": "export", "after_seq": after}
            if trial is not None:
                msg["trial"] = trial
            page = self._request(msg)
            rows.extend(page["rows"])
            if page.get("next_after") is None:
                return rows_to_frame(rows, page.get("columns") or EXPORT_COLUMNS)
            after = page["next_after"]

    def close(self) -> None:
        """Close the connection. Un-acked effects stay remembered for a later call."""
        self._drop()

    def __enter__(self) -> "ReceiverClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- machinery ----------------------------------------------------------------------

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def _send(self, msg: dict[str, Any]) -> None:
        if self._sock is None:
            raise _Lost()
        try:
            self._sock.sendall(P.encode(msg), socket.MSG_NOSIGNAL)
        except OSError as exc:  # BrokenPipe, ECONNRESET, timeout, EBADF after a restore
            raise _Lost() from exc

    def _transmit(self, key: tuple[str, int], entry: dict[str, Any]) -> None:
        rid = self._new_id()
        entry["msg"]["id"] = rid
        self._ack_for_id[rid] = key
        entry["sent"] = True
        if self._sender is not None:  # who sends it now: after a restore, the restored process
            entry["msg"]["sender"] = _check_int("sender", self._sender())
        self._send(entry["msg"])

    def _request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send a control request, reconnecting and retrying on connection loss; return its reply."""
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else timeout)
        msg = {"v": P.VERSION, **msg}
        while True:
            if self._sock is None:
                deadline = self._reconnect(deadline)
            rid = self._new_id()
            msg["id"] = rid
            try:
                self._send(msg)
                while rid not in self._replies:
                    self._await_frame(deadline, f"no reply to {msg['type']} from {self.address} in time")
            except _Lost:
                self._drop()
                continue
            reply = self._replies.pop(rid)
            if reply.get("type") == "error":
                raise ReceiverError.from_reply(reply)
            return reply

    def _progress(self, deadline: float) -> float:
        """Make one step towards acks: (re)connect if needed, else read for a while. Returns the deadline."""
        if self._sock is None:
            return self._reconnect(deadline)
        try:
            self._await_frame(deadline, f"no ack from {self.address} within the timeout; "
                                        f"{len(self._unacked)} effects pending")
        except _Lost:
            self._drop()
        return deadline

    def give_up(self, reason: str) -> None:
        """Stop waiting for a receiver that is known to be gone: every wait of this client, the one in progress
        included (within ``ack_timeout``), raises ``ReceiverUnavailable(reason)``. Safe from another thread."""
        self._given_up = reason

    def _await_frame(self, deadline: float, timeout_message: str) -> None:
        """Read frames for up to ``ack_timeout``. None came: past ``deadline`` raise
        ``ReceiverUnavailable(timeout_message)``, else ``_Lost`` (a silent connection is dead)."""
        if self._given_up is not None:
            raise ReceiverUnavailable(self._given_up)
        if not self._pump(min(deadline, time.monotonic() + self.ack_timeout)):
            if time.monotonic() >= deadline:
                raise ReceiverUnavailable(timeout_message)
            raise _Lost()

    def _reconnect(self, deadline: float) -> float:
        """Connect (with backoff) and resend; returns the deadline, extended so resends get a fair wait."""
        self._connect(deadline)
        # Time frozen in a checkpoint counts on the monotonic clock: give the resent effects at
        # least one ack_timeout after a successful reconnect before declaring the receiver gone.
        return max(deadline, time.monotonic() + self.ack_timeout)

    def _connect(self, deadline: float, tries: int | None = None) -> None:
        delay = 0.01
        attempt = 0
        while True:
            attempt += 1
            if self._given_up is not None:
                raise ReceiverUnavailable(self._given_up)
            try:
                self._open_socket(max(0.05, min(self.connect_timeout, deadline - time.monotonic())))
                self._hello(max(0.05, min(self.connect_timeout, deadline - time.monotonic())))
                for key, entry in list(self._unacked.items()):
                    if entry["sent"]:
                        entry["msg"]["attempt"] += 1
                        self.resends += 1
                    self._transmit(key, entry)
                self.connects += 1
                return
            except (OSError, _Lost) as exc:
                self._drop()
                last = exc
            if (tries is not None and attempt >= tries) or time.monotonic() + delay > deadline:
                raise ReceiverUnavailable(f"cannot reach receiver at {self.address}: {last!r:.200}")
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.max_backoff)

    def _open_socket(self, timeout: float) -> None:
        if self._kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self._host)
            except OSError:
                sock.close()
                raise
        else:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking sends with a bound: a receiver that stops reading must not hang us forever.
        sock.settimeout(max(self.ack_timeout, 1.0))
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._decoder = P.FrameDecoder(self.max_frame)
        self._ack_for_id.clear()
        self._replies.clear()

    def _hello(self, timeout: float) -> None:
        rid = self._new_id()
        msg: dict[str, Any] = {"v": P.VERSION, "type": "hello", "id": rid, "client": self.client_name}
        if self.token:
            msg["token"] = self.token
        self._send(msg)
        deadline = time.monotonic() + timeout
        while rid not in self._replies:
            if not self._pump(deadline):
                raise _Lost()
        reply = self._replies.pop(rid)
        if reply.get("type") == "error":
            self._drop()
            raise ReceiverError.from_reply(reply)
        self.connection_id = reply.get("connection_id")
        server_max = reply.get("max_frame")
        if isinstance(server_max, int) and not isinstance(server_max, bool) and server_max > self._decoder.max_frame:
            # The server sizes its replies (export pages) to its own frame limit: accept what it may send.
            self._decoder.max_frame = server_max

    def _pump(self, until: float) -> bool:
        """Read and dispatch frames until at least one arrives or ``until``; False if none came."""
        sock = self._sock
        if sock is None or self._poller is None:
            raise _Lost()
        poller = self._poller
        while True:
            wait_ms = max(0, int((until - time.monotonic()) * 1000))
            if not poller.poll(wait_ms):
                if time.monotonic() >= until:
                    return False
                continue
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                raise _Lost() from exc
            if not data:
                raise _Lost()  # EOF: the receiver went away (or CRIU closed the socket)
            frames = self._decoder.feed(data)
            if self._decoder.broken is not None:
                raise _Lost()
            for body in frames:
                self._dispatch(body)
            if frames:
                return True

    def _dispatch(self, body: bytes) -> None:
        try:
            msg = P.parse_body(body)
        except P.ProtocolError:
            return  # a reply we cannot read: ignore it; the wait for it times out and retries
        rid = P.request_id(msg)
        if rid is None:
            return
        key = self._ack_for_id.pop(rid, None)
        if key is not None:
            entry = self._unacked.get(key)
            if entry is not None and entry["msg"].get("id") == rid:
                del self._unacked[key]
                self._acked[key] = msg
            return
        self._replies[rid] = msg

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        self._poller = None
        if sock is not None:
            try:
                sock.close()
            except OSError as exc:  # EBADF can happen on a socket CRIU did not restore
                if exc.errno != errno.EBADF:
                    raise
