"""A trial of a program that knows nothing of cutbench (the ``program`` workload: docs/programs.md).

The program is started as it is, in the trial's directory, with its stdout
and stderr piped to readers in the harness: outside the checkpointed tree,
like a log collector or a client would be. :class:`Observer` turns the
stream the scenario names (a pipe, or a file the program appends to, tailed
here) into effects ``(stream, index, payload)`` with the workload's effects
rule, tags each with the incarnation that showed it, and keeps the program's
last words. :class:`ProgramRunner` places the cut after the k-th effect, at
a time or at a size of the stream (plus the plan's async offset), drives the same pipeline as any trial, and
hands the backends the hooks a program needs (:class:`ProgramHooks`): a CRIU
restore continues the program's output into fresh pipes (``--inherit-fd``);
``restart`` starts it again from the beginning; ``app`` starts it with its
own restart flag. The effects become the trial's effects table, numbered by
the reference's order, and the oracle judges them as any workload's.
"""

from __future__ import annotations

import copy
import http.client
import math
import re
import select
import socket
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import HarnessFault, WorkloadError
from cutbench.harness.model.trial import TrialRecord
from cutbench.harness.nemesis.base import CutContext
from cutbench.harness.nemesis.pipeline import execute_cut
from cutbench.harness.runner.trial import POLL_S, RECEIVER_GONE, TrialRunner, _TrialState
from cutbench.procs import Child, spawn
from cutbench.receivers.schema import EXPORT_COLUMNS, rows_to_frame
from cutbench.workloads import api as workload_api
from cutbench.workloads import program as program_api

# Extra columns of a program's effects: which stream, the effect's index in it, and the payload as seen
# (cut to PAYLOAD_CHARS: the digest is the identity; the text is for a reader of the table).
PROGRAM_COLUMNS = ("stream", "index", "payload")
PAYLOAD_CHARS = 200
TAIL_LINES = 40  # of each of the program's pipes, for its last words
FILE_POLL_S = 0.005
CHECK_BYTES = 4096  # of what a tailed file held, compared at each poll to see that it was not rewritten
READ_BYTES = 65536  # a pipe's whole buffer
MAX_RETRIES = 3  # a client's retries of one request (same_id, new_id) before it gives up
IDLE_CHECK_S = 0.1  # how often an idle pipe's reader looks whether the observer was closed
READ_WAIT_S = 0.002  # between reads of a pipe that had less: the effects are seen at most this much later
# A cut's place and a program's progress in words, by the cut's phase (the units of ProgramRunner._measure).
PLACES = {"effect": "effect {:.0f}", "time": "{:g} ms", "size": "{:.0f} bytes"}
PROGRESS = {"effect": "{:.0f} effect(s)", "time": "{:.0f} ms since its start", "size": "{:.0f} bytes of {stream}"}


@dataclass
class Seen:
    """One effect as the outside world saw it."""

    t: float  # unix time it was read
    incarnation: int  # 0: the first start; +1 at each restore or start again
    key: str  # "stream#index", the effect's identity
    stream: str
    index: str
    digest: str
    payload: str


class Observer:
    """What the outside world sees of one program across its incarnations: effects and last words.

    For a server (``stream = "http"``) the outside world is cutbench's own clients: :meth:`start_load` keeps
    ``concurrency`` streamed requests open at once, admitting the next as one ends, each read line by line
    through a fresh effects rule, its effects under the request's id as their stream. ``wait_s`` bounds how
    long a client waits for a server that went away (a restore, a start again) before its retry policy
    applies.
    """

    def __init__(self, params: dict[str, Any], directory: Path, *, wait_s: float = 60.0):
        self.params = params
        self.directory = directory
        self.stream = params["stream"]
        self.file = program_api.Program.stream_file(params)
        self.http = program_api.Program.http_settings(params) if self.stream == program_api.HTTP else None
        self.port = 0
        self.wait_s = wait_s
        self.load_done = threading.Event()
        self.broken: list[dict[str, Any]] = []  # each broken stream: request, attempt, what the client did
        self._clients: list[threading.Thread] = []
        self._requests: Iterator[int] = iter(())
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.keys: set[str] = set()
        self.shown: dict[int, int] = {}  # effects shown, by incarnation (a restart's catch-up polls it)
        self.incarnation = -1
        self.tails: dict[str, deque[str]] = {p: deque(maxlen=TAIL_LINES) for p in program_api.PIPES}
        self.rule_error = ""  # a parser that raised: the harness's input, never a finding
        self.lines = 0  # lines of the effect stream read, for "matched nothing" on a control run
        self.bytes = 0  # bytes of the effect stream read (where a cut of phase "size" lands)
        self.head: list[str] = []  # its first lines, to show with that
        self.readers: list[threading.Thread] = []
        # The effect stream's reader of the running incarnation and its parser (each reader owns its parser: a
        # restored incarnation's reader continues a copy of its predecessor's, once that one read to its end).
        self._stream_reader: tuple[threading.Thread, dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._tailer: threading.Thread | None = None
        self._listener: socket.socket | None = None  # stream "socket": where the program connects
        self._acceptor: threading.Thread | None = None
        self._pending: list[tuple[int, int]] = []  # (read end, write end) of pipes handed to a restore
        self.pipe_inodes: dict[str, int] = {}  # the running incarnation's pipes (what a CRIU image of it names)

    # -- counting -------------------------------------------------------------
    def distinct(self) -> int:
        """How many distinct effects the outside world has seen."""
        with self.lock:
            return len(self.keys)

    def last_words(self) -> str:
        """The program's last lines on stderr (stdout's where stderr said nothing)."""
        with self.lock:
            lines = list(self.tails["stderr"]) or list(self.tails["stdout"])
        return "\n".join(lines[-20:])

    def last_line(self) -> str:
        """``": <its last line>"`` of :meth:`last_words` (to end a message with), "" when it said nothing."""
        words = self.last_words()
        return f": {words.splitlines()[-1]}" if words.strip() else ""

    # -- pipes ----------------------------------------------------------------
    def start(self, argv: list[str]) -> Child:
        """Start the program (``argv`` in its directory) as a new incarnation, its stdout and stderr piped to
        readers here, a fresh effects rule on its stream; return its handle. Raises ``OSError`` when it cannot
        be started, :class:`~cutbench.workloads.api.WorkloadError` when the rule cannot be made."""
        rule = self._make_rule() if self.file is None else None  # before any pipe: a factory that raises leaks none
        ends = {name: os.pipe() for name in program_api.PIPES}
        try:
            env = {**os.environ, **self.params["env"]}
            child = spawn(argv, cwd=str(self.directory), env=env, stdout=ends["stdout"][1], stderr=ends["stderr"][1])
        except BaseException:
            for r, w in ends.values():
                os.close(r)
                os.close(w)
            raise
        self.incarnation += 1
        self.pipe_inodes = {name: os.fstat(r).st_ino for name, (r, _w) in ends.items()}
        for name, (r, w) in ends.items():
            os.close(w)  # the program holds the write ends: EOF when it (and its children) are gone
            self._read(name, r, self.incarnation, {"rule": rule})
        if self.file is not None and self._tailer is None:
            self._tailer = threading.Thread(target=self._guarded, args=(f"reading {self.file}", self._tail_file),
                                            name="cutbench-tail", daemon=True)
            self._tailer.start()
        return child

    def inherited_fds(self) -> list[tuple[str, int]]:
        """Fresh pipes for a CRIU restore of the program, whose image holds the running incarnation's pipes:
        ``[("pipe:[INODE]", write end)]`` for ``--inherit-fd``, their readers already running as the next
        incarnation. :meth:`restored` closes the write ends once the restore returned.

        The restored program goes on with its output, so its effect stream's reader continues a copy of the
        parser of the reader before it, once that one has read all the dumped program wrote (it was killed:
        its pipe ends). After ``leave_running`` that includes what the original printed after the dump: a rule
        that counts lines (no ``index`` group) counts those too."""
        self.incarnation += 1
        out, inodes = [], {}
        for name, inode in self.pipe_inodes.items():
            r, w = os.pipe()
            self._pending.append((r, w))
            inodes[name] = os.fstat(r).st_ino
            self._read(name, r, self.incarnation, {"rule": None, "after": self._stream_reader} if name == self.stream else {"rule": None})
            out.append((f"pipe:[{inode}]", w))
        self.pipe_inodes = inodes
        return out

    def restored(self) -> None:
        """The restore returned: close this side's write ends of the pipes handed to it."""
        for _r, w in self._pending:
            try:
                os.close(w)
            except OSError:
                pass
        self._pending.clear()

    def _read(self, name: str, fd: int, incarnation: int, parsing: dict[str, Any]) -> None:
        thread = threading.Thread(target=self._reader, args=(name, fd, incarnation, parsing), daemon=True,
                                  name=f"cutbench-{name}-{incarnation}")
        self.readers.append(thread)
        if name == self.stream:
            self._stream_reader = (thread, parsing)
        thread.start()

    def _reader(self, name: str, fd: int, incarnation: int, parsing: dict[str, Any]) -> None:
        """Read one pipe of one incarnation to its end. ``parsing["rule"]`` is this reader's parser; with
        ``parsing["after"]`` (a restored incarnation) it is a copy of that earlier reader's, made once that one
        read to its end."""
        try:
            after = parsing.get("after")
            if after is not None:  # given to the effect stream's reader of a restored incarnation only
                earlier, its = after
                earlier.join(self.wait_s)
                parsing["rule"] = copy.deepcopy(its.get("rule")) or self._make_rule()
            with os.fdopen(fd, "rb", buffering=0) as pipe:
                for lines, size in self._batches(pipe):
                    self._lines(name, [raw.decode(errors="replace") for raw in lines], incarnation, parsing, size)
        except Exception as exc:  # never a finding: the harness's own reading failed (the trial is unknown)
            with self.lock:
                self.rule_error = self.rule_error or f"reading the program's {name}: {type(exc).__name__}: {exc}"

    def _batches(self, source: Any, whole_lines: bool = False) -> Iterator[tuple[list[bytes], int]]:
        """The lines of ``source`` (a pipe opened unbuffered, or a connected socket) as they come, one batch per
        read, with their size in bytes (newlines included); to its end, or until the observer is closed and
        ``source`` is idle (a process of the program that left its group, ``setsid``, may hold a pipe open after
        the trial: no EOF ever). A last line without its newline is a line, unless ``whole_lines``: then only
        its bytes count (a connection cut mid-line, as a collector drops it)."""
        read = source.recv if isinstance(source, socket.socket) else source.read
        buffered = b""
        while True:
            if not select.select([source], [], [], IDLE_CHECK_S)[0]:
                if self._stop.is_set():
                    break
                continue
            try:
                chunk = read(READ_BYTES)
            except ConnectionResetError:  # the program's end went away without a FIN (a kill, a closed restore)
                break
            if not chunk:
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            if lines:  # a chunk's lines at once: one lock, one pass (the observer must not slow the program)
                yield lines, sum(map(len, lines)) + len(lines)
            if len(chunk) < READ_BYTES:
                # Let a chatty program's lines gather: one wake-up per READ_WAIT_S, not per line (what a reader
                # woken for every line costs the program is the observer's cost).
                time.sleep(READ_WAIT_S)
        if buffered:
            yield ([] if whole_lines else [buffered]), len(buffered)

    def _lines(self, name: str, lines: list[str], incarnation: int, parsing: dict[str, Any], size: int) -> None:
        with self.lock:
            self.tails[name].extend(lines[-TAIL_LINES:])
            if name != self.stream:
                return
            self._count(lines, size)
        rule = parsing.get("rule")
        if rule is not None:
            self._effects(rule, lines, incarnation)

    def _take_lines(self, rule: program_api.LineParser, lines: list[str], size: int, stream: str = "") -> None:
        """Lines of the effect stream read by a file's, a socket's or a client's reader: counted, and turned into
        effects of the incarnation running now (``stream``: a request's id, for a server's clients)."""
        with self.lock:
            self._count(lines, size)
            incarnation = self.incarnation
        self._effects(rule, lines, incarnation, stream)

    def _count(self, lines: list[str], size: int) -> None:
        """More lines of the effect stream read, ``size`` bytes with their newlines (the caller holds the lock)."""
        self.lines += len(lines)
        self.bytes += size
        if len(self.head) < 5:
            self.head.extend(lines[: 5 - len(self.head)])

    def nothing_matched(self) -> str:
        """Why a run that showed no effect cannot be judged: the rule and what the stream held."""
        shown = "; ".join(repr(line[:120]) for line in self.head) or "nothing"
        return (f"the effects rule matched nothing in the {self.lines} lines of {self.stream} (its first lines: "
                f"{shown}): check workload.params.effects or parser")

    def _effects(self, rule: program_api.LineParser, lines: list[str], incarnation: int, stream: str = "") -> None:
        found: list[tuple[str, str]] = []
        for line in lines:
            try:
                found.extend((str(index), str(payload)) for index, payload in rule(line))
            except Exception as exc:  # the scenario's parser: said before any trial, never a finding
                with self.lock:
                    self.rule_error = self.rule_error or (f"the effects parser raised {type(exc).__name__}: {exc} on "
                                                          f"{line!r} (it returns (index, payload) pairs)")
                return
        if not found:
            return
        now, stream = time.time(), stream or self.stream
        seen = [Seen(now, incarnation, f"{stream}#{index}", stream, index, program_api.digest(payload),
                     payload[:PAYLOAD_CHARS]) for index, payload in found]
        with self.lock:
            self.seen.extend(seen)
            self.keys.update(s.key for s in seen)
            self.shown[incarnation] = self.shown.get(incarnation, 0) + len(seen)

    def _guarded(self, what: str, body: Callable[[], None]) -> None:
        """Run ``body``, the loop of a thread of the observer's (a tailer, an acceptor, a client). What it raises is
        the harness's own failure, said as ``what``: the trial is unknown, never a finding."""
        try:
            body()
        except Exception as exc:
            with self.lock:
                self.rule_error = self.rule_error or f"{what}: {type(exc).__name__}: {exc}"

    def _make_rule(self) -> program_api.LineParser:
        return program_api.Program.rule(self.params)

    # -- a socket the program connects to -----------------------------------------------
    def listen(self, port: int) -> None:
        """Listen on 127.0.0.1:``port`` (0: a free one) for the program (stream ``socket``) and accept its
        connections from now on; :attr:`port` is then where. Raises ``OSError`` when the port is taken."""
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._guarded, args=("accepting the program's connections",
                                                                      self._accepting), name="cutbench-accept", daemon=True)
        self._acceptor.start()

    def _accepting(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            if select.select([self._listener], [], [], IDLE_CHECK_S)[0]:
                self._read_connection(self._listener.accept()[0])
        # Closing: connections the program made and the kernel queued (it may have sent everything and exited)
        # are read too, not dropped with the listener.
        self._listener.setblocking(False)
        while True:
            try:
                conn = self._listener.accept()[0]
            except OSError:  # BlockingIOError: the queue is empty
                return
            conn.setblocking(True)
            self._read_connection(conn)

    def _read_connection(self, conn: socket.socket) -> None:
        thread = threading.Thread(target=self._connection, args=(conn,), name="cutbench-socket", daemon=True)
        with self.lock:
            self.readers.append(thread)
        thread.start()

    def _connection(self, conn: socket.socket) -> None:
        """Read one connection of the program to its end through a fresh effects rule. A program CRIU restored
        writes on into the same connection (restored established), so its rule goes on; one started again
        connects anew. Each batch belongs to the incarnation running when it was read."""
        try:
            with conn:
                rule = self._make_rule()
                for raw, size in self._batches(conn, whole_lines=True):
                    self._take_lines(rule, [line.decode(errors="replace") for line in raw], size)
        except Exception as exc:  # never a finding: the harness's own reading failed (the trial is unknown)
            with self.lock:
                self.rule_error = self.rule_error or f"reading the program's socket: {type(exc).__name__}: {exc}"

    # -- a server: cutbench's own clients ------------------------------------------------
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

    # -- a file it appends to ----------------------------------------------------
    def _tail_file(self) -> None:
        """Read the stream's file as it grows, as ``tail -F`` does: a file replaced (a new inode: the program
        started again and moved the old one aside) or cut shorter than what was read (a restart that truncates
        its log to its checkpoint) is read again from where it differs, and what follows counts as seen again."""
        assert self.file is not None
        path = self.directory / self.file
        kept = b""  # what was read so far, to its last whole line: where a rewritten file differs is found in it
        inode: int | None = None
        rule = self._make_rule()
        while True:
            stopping = self._stop.is_set()
            try:
                with open(path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    same, data = _unread(fh, st.st_size if st.st_ino == inode else None, kept)
            except OSError:
                same, data = -1, b""
            if same >= 0:
                if same < len(kept):  # rewritten from there: the parser as it stood at that line, its effects seen
                    kept, rule = kept[:same], self._make_rule()
                    for old in kept.split(b"\n")[:-1]:
                        rule(old.decode(errors="replace"))
                inode = st.st_ino
                end = data.rfind(b"\n") + 1
                if end:
                    kept += data[:end]
                    self._take_lines(rule, [raw.decode(errors="replace") for raw in data[:end].split(b"\n")[:-1]], end)
            if stopping:
                return
            self._stop.wait(FILE_POLL_S)

    def close(self, timeout: float = 5.0) -> None:
        """Read what is left (the pipes to their end, the file once more) and stop the readers and clients."""
        self.restored()
        self._stop.set()  # the tailer reads once more; a client stops retrying; no connection is accepted
        deadline = time.monotonic() + timeout
        if self._acceptor is not None:
            self._acceptor.join(max(0.0, deadline - time.monotonic()))
        if self._listener is not None:
            self._listener.close()
        with self.lock:
            readers = list(self.readers)
        for thread in [*readers, *self._clients]:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._tailer is not None:
            self._tailer.join(max(0.1, deadline - time.monotonic()))

    # -- the trial's table --------------------------------------------------------
    def frame(self, trial: str, order: dict[str, int] | None, mode: str = "at_least_once") -> pd.DataFrame:
        """The effects as the trial's effects table: the receiver's columns plus :data:`PROGRAM_COLUMNS`.

        ``order`` numbers the identities by the reference (op *i*: its *i*-th effect); an identity it does not
        hold gets a number after them, in the order first seen. None (a control run): numbered in stream and
        index order (numbers as numbers), which does not depend on how concurrent clients interleaved.
        A repeat of an identity is a further ``attempt``; ``epoch`` and ``sender`` are the incarnation.

        ``mode`` is how the outside world takes a repeat (the arm's receiver mode): ``at_least_once`` sees every
        one (a terminal, a client: each is ``applied``); ``idempotent`` keeps each effect once, as a store keyed
        by step does: a repeat with the payload first seen is ``suppressed`` (recomputed work, not a
        duplicate), and one with another payload stays ``applied`` (the outside world was shown two values).
        """
        with self.lock:
            seen = list(self.seen)
        if order is None:  # a control run: its distinct effects in stream and index order (clients interleave)
            keys = sorted({(s.stream, s.index) for s in seen}, key=lambda k: (_natural(k[0]), _natural(k[1])))
            order = {f"{stream}#{index}": i for i, (stream, index) in enumerate(keys, 1)}
        numbers = dict(order)
        start = len(numbers)
        counts: dict[str, int] = {}
        rows = []
        first: dict[str, str] = {}  # each identity's first payload digest
        for seq, s in enumerate(seen, 1):
            if s.key not in numbers:
                start += 1
                numbers[s.key] = start
            counts[s.key] = counts.get(s.key, 0) + 1
            kept = first.setdefault(s.key, s.digest)
            decision = "suppressed" if mode == "idempotent" and counts[s.key] > 1 and s.digest == kept else "applied"
            rows.append((seq, trial, numbers[s.key], counts[s.key], s.incarnation, s.digest, s.incarnation, "",
                         "publish", decision, seq, s.t, s.incarnation, mode, s.stream, s.index, s.payload))
        return rows_to_frame(rows, EXPORT_COLUMNS + PROGRAM_COLUMNS)


def _natural(text: str) -> tuple[tuple[int, Any], ...]:
    """``text`` as a sort key in which its runs of digits compare as numbers ("r2" before "r10")."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|\D+", text))


def _unread(fh: Any, size: int | None, kept: bytes) -> tuple[int, bytes]:
    """What of a tailed file is new: how much of ``kept`` (what was read of it, to a line's end) the open file
    ``fh`` still holds, and its bytes from there on.

    A file that is the one read before (its ``size`` given; None for another file), no shorter, and still holds
    the last
    :data:`CHECK_BYTES` read is read on from where the reading stopped (each poll reads what grew, not the
    whole file); otherwise it is read whole and compared with ``kept``, and the reading goes back to the
    start of the line where they first differ (all of it for another file).
    """
    if size is not None and size >= len(kept):
        k = min(len(kept), CHECK_BYTES)
        fh.seek(len(kept) - k)
        grown = fh.read()
        if grown[:k] == kept[len(kept) - k:]:
            return len(kept), grown[k:]
        fh.seek(0)
    data = fh.read()
    same = len(os.path.commonprefix([kept, data])) if size is not None else 0
    if same < len(kept):
        same = kept.rfind(b"\n", 0, same) + 1
    return same, data[same:]


class ProgramHooks:
    """What a backend may ask of a program trial (``CutContext.program``): start it again, its progress, and
    its pipes for a restore. See :class:`cutbench.harness.nemesis.base.ProgramControl`."""

    def __init__(self, runner: "ProgramRunner"):
        self.runner = runner
        self.resume_args: tuple[str, ...] = tuple(runner.spec.params["resume"])
        # A server started again redoes nothing by itself (its clients ask again, or not): nothing to catch up.
        self.catches_up = runner.observer.http is None
        self.at_cut = runner.observer.distinct()  # made as the cut begins: where a requeue must get back to

    def start(self, extra_args: Sequence[str] = ()) -> Child:
        """Start the program again in its directory (its command, then ``extra_args``: its own restart flag) as a
        new incarnation; without ``extra_args`` it starts from the beginning (a fresh start). Returns its handle."""
        return self.runner.launch(list(extra_args))

    def shown(self) -> int:
        """Effects the running incarnation has shown so far."""
        obs = self.runner.observer
        with obs.lock:
            return obs.shown.get(obs.incarnation, 0)

    def inherited_fds(self) -> list[tuple[str, int]]:
        """Fresh pipes in place of the ones the dumped program wrote to: ``[("pipe:[INODE]", write end)]``."""
        return self.runner.observer.inherited_fds()

    def restored(self) -> None:
        """The restore returned (or failed): this side's ends of the fresh pipes are closed."""
        self.runner.observer.restored()


class ProgramRunner(TrialRunner):
    """One trial of a ``program`` workload (see the module docstring)."""

    @classmethod
    def runs(cls, workload: type) -> bool:
        """Programs (``program = True`` on the workload class)."""
        return bool(getattr(workload, "program", False))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.observer = Observer(self.spec.params, self.tdir, wait_s=self.spec.stage_timeout_s)
        if self.observer.http is not None:
            self.observer.port = self.spec.params["port"] or free_port()
        self.fresh_starts = 0
        self.started_at: float | None = None  # monotonic time of the first start (cuts of phase "time" count from it)
        self.served = False  # a server whose clients all finished (it is then stopped: a server never exits)

    def _hwm(self) -> int | None:
        return len(self.observer.seen)

    def launch(self, extra_args: list[str]) -> Child:
        """Start the program (its command and ``extra_args``) as the next incarnation."""
        command = program_api.Program.command_for(self.spec.params, self.observer.port)
        child = self.observer.start([*command, *extra_args])
        if self.started_at is None:
            self.started_at = time.monotonic()
        if not extra_args:
            self.fresh_starts += 1
        return child

    def observe(self) -> tuple[TrialRecord, pd.DataFrame]:
        """Start, cut, restore and watch the program; return what the outside world saw (record and effects)."""
        spec, params = self.spec, self.spec.params
        started = time.monotonic()
        self.tdir.mkdir(parents=True)
        backend = self.s.threads.backend(spec.backend)
        state = _TrialState()
        child: Child | None = None
        order: dict[str, int] | None = None
        try:
            if not self.plain_launch:
                reference = self.s.references.get(self.cls, spec.params, spec.array)
                order = {key: op for op, key in reference.keys.items()}
            for name in params["files"]:
                source = Path(name)
                (shutil.copytree if source.is_dir() else shutil.copy2)(source, self.tdir / source.name)
            if self.observer.stream == program_api.SOCKET:
                self.observer.listen(params["port"])
            with self.timeline.stage("spawn"):
                child = self.child = self.launch([])
            if self.observer.http is not None:
                with self.timeline.stage("listen"):
                    why = self.observer.listening(child)
                if why:
                    raise HarnessFault("listen", why)
                self.observer.start_load()
            plan = spec.cut_plan()
            for i, cut in enumerate(plan.cuts):
                reached = self._reach_cut(child, cut, i)
                if reached:
                    state.status, state.error = ("deadlock", reached) if reached.startswith("no effect") else ("unknown", reached)
                    break
                if not self._cut(backend, child, i, cut, state):
                    break
            if state.status not in ("unknown", "deadlock") and not state.down:
                self._program_to_end(child, state)
        except HarnessFault as exc:
            state.status, state.error = "unknown", exc.reason
        except Exception as exc:  # harness-side failure: no verdict possible
            state.status, state.error = "unknown", f"harness: {type(exc).__name__}: {exc}"
        finally:
            if child is not None and child.alive():
                child.kill()
            if child is not None:
                child.kill_groups()
            for target in self.cut_targets:
                target.kill()
            self.observer.close()
        if self.observer.rule_error:
            state.status, state.error = "unknown", self.observer.rule_error
        # The program ran to its end (a refused cut lets it go on: its effects and artefacts are judged too).
        completed = state.status in ("completed", "refused") and child is not None and (child.returncode == 0 or self.served)
        if completed and self.plain_launch and not self.observer.distinct():
            state.status, state.error, completed = "unknown", self.observer.nothing_matched(), False
        if completed and self.plain_launch and self.observer.broken:
            state.status, completed = "unknown", False
            state.error = (f"a stream broke during an uninterrupted run ({self.observer.broken[0]['request']}: "
                           f"{self.observer.broken[0]['why']}): the server cannot be the reference")
        checksum: str = ""
        compared: dict[str, str] = {}
        if completed:
            try:
                checksum, compared = self._artefacts()
            except (HarnessFault, WorkloadError, OSError) as exc:  # the scenario's comparison, the harness's copies
                state.status, completed = "unknown", False
                state.error = exc.reason if isinstance(exc, HarnessFault) else f"the final artefacts: {exc}"
        distinct = self.observer.distinct()
        host_op = len(order) if (order and completed) else distinct
        report = {"host_op": host_op, "checksum": checksum, "effects_seen": len(self.observer.seen),
                  "effect_lines": self.observer.lines, "incarnations": self.observer.incarnation + 1,
                  **({"artefacts": compared} if compared else {})} if completed else None
        effects = self.observer.frame(self.receiver_trial, order, spec.receiver_mode)
        again = int((effects["attempt"] > 1).sum()) if len(effects) else 0
        if again:
            state.facts["recomputed_ops"] = again  # effects the outside world saw once more
        if state.status == "refused" and not completed and child is not None and child.returncode not in (0, None):
            # A refusal after which the program did not run to its end was not a clean refusal.
            state.status, state.error = "unknown", f"{state.error}; then the program ended with exit {child.returncode}"
        words = self.observer.last_words()
        record = TrialRecord(
            trial_id=spec.trial_id, status=state.status, error=state.error, failed_stage=state.failed_stage,
            # A server the harness stopped once its clients were done ended as it should: exit 0.
            exit_code=0 if self.served else child.returncode if child else None, restores=state.restores, cut_outcomes=state.outcomes,
            report=report, marker_op=host_op if completed else 0, progress_op=distinct, progress_phase="effect" if distinct else "",
            workload_domains=sorted(program_api.Program.domains | program_api.Program.domains_for(params)),
            covered_domains=sorted(backend.capabilities.covers), duration_s=time.monotonic() - started,
            facts=state.facts, log_tail=words if state.status != "completed" or not completed else "",
            fresh_starts=self.fresh_starts,
        )
        if state.status == "completed" and not completed:
            record.status, record.error = "unknown", f"the program ended with exit {record.exit_code}{self.observer.last_line()}"
            record.log_tail = words
        shutil.rmtree(self.tdir, ignore_errors=True)
        return record, effects

    def _artefacts(self) -> tuple[str, dict[str, str]]:
        """The digest of the program's final artefacts, and for each compared by a callable and found apart, how
        far it is from the reference's copy ("0.003 > tolerance 1e-06"). The first uninterrupted run's copies are the
        reference's: they are kept (under the run's ``references/``) for the runs after it. Raises
        :class:`HarnessFault` when the copies are gone, :class:`WorkloadError` when a comparison fails."""
        params = self.spec.params
        artefacts = program_api.Program.artefacts(params)
        compared = [a for a in artefacts if a.compare]
        if not compared:
            return program_api.artefacts_digest(self.tdir, artefacts), {}
        refs = self.s.references
        key = workload_api.reference_key(self.cls.name, params, workload_api.resolve_array(self.cls, self.spec.array))
        recording = refs.recordings.get(key)
        kept = Path(recording.artefacts_dir) if recording is not None and recording.artefacts_dir else refs.artefact_dirs.get(key)
        if kept is None:  # the first uninterrupted run: its artefacts are the reference's
            if not self.plain_launch:
                raise HarnessFault("judge", f"no reference copies of {', '.join(a.path for a in compared)}")
            kept = ((refs.artefacts_root or self.s.workdir / "references") / f"{key}.artefacts").resolve()
            shutil.rmtree(kept, ignore_errors=True)  # an interrupted recording's copies are not this one's
            for a in compared:
                if (self.tdir / a.path).is_file():
                    (kept / a.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.tdir / a.path, kept / a.path)
            kept.mkdir(parents=True, exist_ok=True)
            refs.artefact_dirs[key] = kept
            return program_api.artefacts_digest(self.tdir, artefacts, {a.path: True for a in compared}), {}
        if not kept.is_dir():
            raise HarnessFault("judge", f"the reference's copies of the artefacts are gone ({kept})")
        within: dict[str, bool] = {}
        apart: dict[str, str] = {}
        for a in compared:
            ref, got = kept / a.path, self.tdir / a.path
            if not ref.is_file() or not got.is_file():
                within[a.path] = ref.is_file() == got.is_file()  # both absent: as the reference left it
                if ref.is_file():
                    apart[a.path] = "absent"
                continue
            try:
                difference = float(a.load(params["parser_path"])(ref, got))
            except WorkloadError:
                raise
            except Exception as exc:
                raise WorkloadError(f"workload.params.artefacts: {a.path}: compare = {a.compare!r} raised "
                                    f"{type(exc).__name__}: {exc}") from None
            if math.isnan(difference):
                raise WorkloadError(f"workload.params.artefacts: {a.path}: compare = {a.compare!r} returned NaN "
                                    "(a distance: a number, or infinity for files that cannot be compared)")
            within[a.path] = difference <= a.tolerance
            if not within[a.path]:
                apart[a.path] = f"{difference:g} > tolerance {a.tolerance:g}"
        return program_api.artefacts_digest(self.tdir, artefacts, within), apart

    def _cut(self, backend: Any, child: Child, i: int, cut: Any, state: _TrialState) -> bool:
        """Carry out cut ``i`` on the running program; return whether the trial goes on after it."""
        self.s.images.settle()
        ctx = CutContext(images_dir=Path(self.spec.images_dir) / f"cutbench-{self.s.run_id}-{self.spec.trial_id}-c{i}",
                         timeline=self.timeline, cut_index=i, cut=cut, stage_timeout_s=self.spec.stage_timeout_s,
                         prepare_timeout_s=self.spec.prepare_timeout_s, phases=self.phases,
                         program=ProgramHooks(self))
        outcome = execute_cut(backend, child, ctx, release=lambda: None, before_resume=lambda: None,
                              keep_images=self.spec.keep_images, discard=self.s.images.discard)
        state.outcomes.append(asdict(outcome))
        for key, value in ctx.facts.items():
            state.facts[key] = state.facts.get(key, 0) + value if isinstance(value, (int, float)) else value
        if outcome.status == "restored":
            state.restores += 1
            return True
        if outcome.status in ("refused", "failed", "error"):
            state.status = {"refused": "refused", "failed": "lost", "error": "unknown"}[outcome.status]
            state.error, state.failed_stage = outcome.error, outcome.stage
            state.down = outcome.status == "failed"
            return False
        return True

    def _measure(self, phase: str) -> float:
        """How far the program is, in ``phase``'s unit: effects seen, ms since it first started, bytes of its
        effect stream read."""
        if phase == "time":
            assert self.started_at is not None
            return (time.monotonic() - self.started_at) * 1000.0
        with self.observer.lock:
            return self.observer.bytes if phase == "size" else len(self.observer.keys)

    def _progress(self, phase: str, value: float) -> str:
        """``value`` of :meth:`_measure` in words: "12 effect(s)", "840 ms since its start", "192 bytes of stdout"."""
        return PROGRESS[phase].format(value, stream=self.observer.stream)

    def _goal(self, cut: Any) -> float:
        """Where ``cut`` lands, in its phase's unit (:meth:`_measure`): op k of "time" at k x ``cut_time_ms``,
        of "size" at k x ``cut_bytes``, of "effect" at k."""
        unit = {"time": "cut_time_ms", "size": "cut_bytes"}.get(cut.phase)
        return float(cut.op * self.spec.params[unit]) if unit else float(cut.op)

    def _reach_cut(self, child: Child, cut: Any, i: int) -> str:
        """Wait until the program reached ``cut``'s place (:meth:`_goal`), then the plan's async offset; ""
        when reached, else why not (``no effect …``: the watchdog, after an earlier cut)."""
        deadline = time.monotonic() + self.spec.stage_timeout_s
        goal = self._goal(cut)
        place = PLACES[cut.phase].format(goal)

        def moved() -> tuple[float, float]:  # for the watchdog: new effects, or the stream growing (time, size)
            return self._measure("effect"), self._measure("size") if cut.phase != "effect" else 0.0

        last, last_change = moved(), time.monotonic()
        with self.timeline.stage("reach_cut", i) as extra:
            while True:
                now_at = self._measure(cut.phase)
                if now_at >= goal:
                    time.sleep(cut.async_offset_ms / 1000.0)
                    extra["detail"] = f"async +{cut.async_offset_ms:g}ms after {place}"
                    return ""
                if self.observer.rule_error:
                    return self.observer.rule_error
                rc = child.poll()
                if rc is not None:
                    return (f"the program exited ({rc}) after {self._progress(cut.phase, now_at)}, before cut {i} at "
                            f"{place}{self.observer.last_line()}")
                t, now = time.monotonic(), moved()
                if now != last:
                    last, last_change = now, t
                elif i > 0 and t - last_change > self.spec.watchdog_s:
                    return f"no effect for {self.spec.watchdog_s:g}s before cut {i}"
                if t > deadline:
                    return (f"the program did not reach {place} within {self.spec.stage_timeout_s:g}s (it showed "
                            f"{self._progress(cut.phase, now_at)})")
                time.sleep(POLL_S)

    def _program_to_end(self, child: Child, state: _TrialState) -> None:
        """Wait for the program (the restored or started-again one) to exit; fold how it ended into the status."""
        spec = self.spec
        deadline = time.monotonic() + spec.trial_timeout_s
        last, last_change = len(self.observer.seen), time.monotonic()
        rc: int | None = None
        with self.timeline.stage("run_to_end") as extra:
            while True:
                rc = child.poll()
                if rc is not None:
                    extra["detail"] = f"exit {rc}"
                    break
                if self.observer.load_done.is_set():  # a server's clients are done: it is stopped, it never exits
                    child.kill()
                    self.served, rc = True, 0
                    extra["detail"] = f"served {len(self.observer.seen)} effects"
                    break
                now, t = len(self.observer.seen), time.monotonic()
                if now != last:
                    last, last_change = now, t
                elif t - last_change > spec.watchdog_s:
                    child.kill()
                    extra["detail"] = "watchdog"
                    state.status, state.error = "deadlock", f"no effect for {spec.watchdog_s:g}s (the program showed {now})"
                    return
                if t > deadline:
                    child.kill()
                    state.status, state.error = "unknown", f"trial timeout {spec.trial_timeout_s:g}s"
                    return
                if self._receiver_gone():
                    child.kill()
                    state.status, state.error = "unknown", RECEIVER_GONE
                    return
                time.sleep(POLL_S * 2)
        if rc != 0 and state.status == "completed" and state.restores:
            # The tool brought the program back and it died on its own afterwards: the restore's failure (its
            # uninterrupted control runs ran to their end), in the program's own last words.
            state.status, state.failed_stage = "lost", "after_restore"
            state.error = f"the restored program ended with exit {rc}{self.observer.last_line()}"


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server's ``{port}``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_program(params: dict[str, Any]) -> None:
    """Raise :class:`WorkloadError` before any trial for a program that cannot be started as the scenario says:
    its command not found, a file it starts with missing, an effects parser or an artefact comparison that
    cannot be made, the port it is given already taken."""
    if params["stream"] in (program_api.HTTP, program_api.SOCKET) and params["port"]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", params["port"]))
            except OSError as exc:
                raise WorkloadError(f"workload.params.port = {params['port']}: already taken on 127.0.0.1 "
                                    f"({exc.strerror}); give another, or 0 for a free one") from None
    why = program_api.Program.missing_command(params)
    if why:
        raise WorkloadError(f"workload.params.command = {params['command']!r}: {why}")
    missing = program_api.Program.missing_files(params)
    if missing:
        raise WorkloadError(f"workload.params.files: {', '.join(missing)} not found")
    program_api.Program.rule(params)
    for artefact in program_api.Program.artefacts(params):
        if artefact.compare:
            artefact.load(params["parser_path"])
