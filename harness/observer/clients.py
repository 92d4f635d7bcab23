"""cutbench's own clients of a server program (stream ``http``): the outside world a serving engine streams to.

``concurrency`` streamed requests are kept open at once and the next is admitted as one ends; each response
is read line by line as it arrives, through a fresh effects rule, its effects under the request's id. After a
broken stream a client does what the scenario's retry policy says: give up, ask again with the same request
id, or ask again as a new request (real clients do each of these).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cutbench.procs import Child
from cutbench.workloads import program as program_api

MAX_RETRIES = 3  # a client's retries of one request (same_id, new_id) before it gives up


class ServerClients:
    """The clients' half of :class:`~cutbench.harness.observer.streams.Observer` (a server's outside world).

    It reads and writes the observer's state under its lock; the attributes and methods below are the
    observer's, declared here for what the clients use of them.
    """

    lock: threading.Lock
    _stop: threading.Event
    port: int
    wait_s: float
    http: dict[str, Any] | None
    load_done: threading.Event
    broken: list[dict[str, Any]]
    _clients: list[threading.Thread]
    _requests: Iterator[int]

    def _take_lines(self, rule: program_api.LineParser, lines: list[str], size: int, stream: str = "") -> None:
        raise NotImplementedError

    def _make_rule(self, stream: str = "") -> program_api.LineParser:
        raise NotImplementedError

    def _guarded(self, what: str, body: Callable[[], None]) -> None:
        raise NotImplementedError

    def last_line(self) -> str:
        raise NotImplementedError

    def listening(self, child: Child) -> str:
        """Wait until the server accepts connections on its port; "" when it does, else why not."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return ""
            except OSError:
                pass
            if not child.alive():
                return f"the program exited ({child.returncode}) before it listened on 127.0.0.1:{self.port}{self.last_line()}"
            if time.monotonic() > deadline:
                return f"the server never listened on 127.0.0.1:{self.port} within {self.wait_s:g}s"
            time.sleep(0.02)

    def start_load(self) -> None:
        """Start the clients: ``concurrency`` at once, ``requests`` in all; :attr:`load_done` is set when every
        request ended (completed, or given up by its retry policy)."""
        assert self.http is not None
        self._requests = iter(range(1, self.http["requests"] + 1))
        self._clients = [threading.Thread(target=self._guarded, args=("a client", self._serve_requests),
                                          name=f"cutbench-client-{i}", daemon=True)
                         for i in range(self.http["concurrency"])]
        for thread in self._clients:
            thread.start()
        threading.Thread(target=self._await_clients, name="cutbench-load", daemon=True).start()

    def _await_clients(self) -> None:
        for thread in self._clients:
            thread.join()
        self.load_done.set()

    def _serve_requests(self) -> None:
        assert self.http is not None
        while not self._stop.is_set():
            with self.lock:
                n = next(self._requests, None)
            if n is None:
                return
            rid, attempt = f"r{n}", 0
            while not self._stop.is_set():
                broke = self._request(rid, n)
                if not broke:
                    break
                policy = self.http["retry"]
                with self.lock:
                    self.broken.append({"request": rid, "attempt": attempt, "why": broke, "then": policy})
                if policy == "give_up" or attempt >= MAX_RETRIES:
                    break
                attempt += 1
                if policy == "new_id":
                    rid = f"r{n}.{attempt}"
                self._await_server()

    def _await_server(self) -> None:
        """Wait (up to ``wait_s``) until the server accepts connections again (a restore or a start again)."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.02)

    def _request(self, rid: str, n: int) -> str:
        """One streamed request: its lines become effects under ``rid``; "" when the response ended cleanly, else
        why the stream broke."""
        assert self.http is not None
        body = self.http["body"].replace("{id}", rid).replace("{n}", str(n))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.wait_s)
        rule = self._make_rule()
        try:
            conn.request("POST", self.http["path"], body=body.encode(), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                return f"HTTP {response.status}"
            for raw in _body_lines(response):
                self._take_lines(rule, [raw.decode(errors="replace").rstrip("\r")], len(raw) + 1, stream=rid)
            return ""
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()


class _BrokenStream(http.client.HTTPException):
    """A response whose connection went away before its end (a chunked stream's last chunk, its length)."""


def _body_lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The lines of ``response``'s body as they arrive (without their newline), read from the connection itself;
    raises :class:`_BrokenStream` when it ends before the body does. (http.client's own ``readline`` takes a
    chunked stream cut short for a complete one.) A body without a length or chunks ends with the connection:
    whether it broke cannot be told."""
    fp = response.fp
    if fp is None:
        return
    pending = b""
    if response.chunked:
        while True:
            size_line = fp.readline()
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _BrokenStream("the stream ended before its last chunk") from None
            if size == 0:
                break
            data = fp.read(size + 2)  # the chunk and its CRLF
            if len(data) < size + 2:
                raise _BrokenStream("the stream ended inside a chunk")
            pending += data[:size]
            *lines, pending = pending.split(b"\n")
            yield from lines
    else:
        left = response.length
        while left is None or left > 0:
            raw = fp.readline() if left is None else fp.readline(left)
            if not raw:
                if left is not None:
                    raise _BrokenStream(f"the stream ended {left} bytes before its length")
                break
            if left is not None:
                left -= len(raw)
            pending += raw
            *lines, pending = pending.split(b"\n")
            yield from lines
    if pending:
        yield pending
