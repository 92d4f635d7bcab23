"""What the outside world sees of one program across its incarnations (:class:`Observer`): its effects, its
last words, the trial's effects table.

The program is started as it is, in the trial's directory, with its stdout and stderr piped to readers
here. The stream the scenario names (a pipe, a file the program appends to and that is tailed here, a
socket it connects to, or a server's responses to cutbench's own clients: :mod:`.clients`) becomes effects
``(stream, index, payload)`` through the workload's effects rule, each tagged with the incarnation that
showed it. A CRIU restore continues the program's output into fresh pipes (:meth:`Observer.inherited_fds`,
for ``--inherit-fd``).
"""

from __future__ import annotations

import copy
import functools
import os
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.harness.observer.clients import ServerClients
from cutbench.procs import Child, spawn
from cutbench.receivers.schema import EXPORT_COLUMNS, rows_to_frame
from cutbench.workloads import program as program_api

# Extra columns of a program's effects: which stream, the effect's index in it, and the payload as seen
# (cut to PAYLOAD_CHARS: the digest is the identity; the text is for a reader of the table).
PROGRAM_COLUMNS = ("stream", "index", "payload")
PAYLOAD_CHARS = 200
TAIL_LINES = 40  # of each of the program's pipes, for its last words
FILE_POLL_S = 0.005
CHECK_BYTES = 4096  # of what a tailed file held, compared at each poll to see that it was not rewritten
READ_BYTES = 65536  # a pipe's whole buffer
IDLE_CHECK_S = 0.1  # how often an idle pipe's reader looks whether the observer was closed
READ_WAIT_S = 0.002  # between reads of a pipe that had less: the effects are seen at most this much later


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


class Observer(ServerClients):
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
        self.stream = params["stream"]  # the scenario's stream: where cuts of phase "size" count its bytes
        # Every stream watched (the scenario's first, then its ``streams``), each with its own rule's parameters.
        self.watched = program_api.Program.watched(params)
        self.files = {name: path for name in self.watched if (path := program_api.Program.stream_file(name))}
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
        # Of each watched stream: lines and bytes read (a cut of phase "size" counts the scenario's stream's) and
        # its first lines, for "matched nothing" on a control run.
        self.read_lines: dict[str, int] = dict.fromkeys(self.watched, 0)
        self.read_bytes: dict[str, int] = dict.fromkeys(self.watched, 0)
        self.heads: dict[str, list[str]] = {name: [] for name in self.watched}
        self.readers: list[threading.Thread] = []
        self._pipe_readers: dict[int, list[threading.Thread]] = {}  # each incarnation's, to wait for its last lines
        # Each watched pipe's reader of the running incarnation and its parser (each reader owns its parser: a
        # restored incarnation's reader continues a copy of its predecessor's, once that one read to its end).
        self._stream_readers: dict[str, tuple[threading.Thread, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._tailers: list[threading.Thread] = []
        self._listener: socket.socket | None = None  # stream "socket": where the program connects
        self._acceptor: threading.Thread | None = None
        self._pending: list[tuple[int, int]] = []  # (read end, write end) of pipes handed to a restore
        self.pipe_inodes: dict[str, int] = {}  # the running incarnation's pipes (what a CRIU image of it names)
        # A program in a container (started by an engine): its engine keeps its stdout and stderr, asked for its
        # last words while the container is there (``_said`` keeps what it said last, for after its removal).
        self._words: Callable[[], str] | None = None
        self._said = ""

    # -- counting -------------------------------------------------------------
    def distinct(self) -> int:
        """How many distinct effects the outside world has seen."""
        with self.lock:
            return len(self.keys)

    def last_words(self, settle_s: float = 0.0) -> str:
        """The program's last lines on stderr (stdout's where stderr said nothing), after up to ``settle_s`` for its
        pipes' readers to reach their end; a program in a container: the last lines its engine kept of both,
        waited for up to ``settle_s`` while there are none (an engine copies a container's output into its log a
        moment after the container wrote it, or ended)."""
        deadline = time.monotonic() + settle_s
        if self._words is None and settle_s > 0:
            # A program that ended: its last lines may still be in its pipes, which its readers drain to their end.
            with self.lock:
                draining = list(self._pipe_readers.get(self.incarnation, ()))
            for thread in draining:
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._words is not None:
            said = self._words().strip()
            while not said and not self._said and time.monotonic() < deadline:
                time.sleep(0.1)
                said = self._words().strip()
            self._said = said or self._said
            return "\n".join(self._said.splitlines()[-20:])
        with self.lock:
            lines = list(self.tails["stderr"]) or list(self.tails["stdout"])
        return "\n".join(lines[-20:])

    def last_line(self) -> str:
        """Return ``": <its last line>"`` of :meth:`last_words` (to end a message with), "" when it said nothing."""
        words = self.last_words(settle_s=2.0)
        return f": {words.splitlines()[-1]}" if words.strip() else ""

    # -- pipes ----------------------------------------------------------------
    def start(self, argv: list[str], launch: Callable[..., Child] | None = None) -> Child:
        """Start the program (``argv`` in its directory) as a new incarnation, its stdout and stderr piped to
        readers here, a fresh effects rule on its stream; return its handle. Raises ``OSError`` when it cannot
        be started, :class:`~cutbench.workloads.api.WorkloadError` when the rule cannot be made.

        ``launch`` (a container engine's ``launch(argv, *, cwd, env)``) starts it in a container instead: its
        engine keeps its stdout and stderr, so its effects come from a file, a socket or its server only
        (checked before any trial), and its last words from the engine. A batch system's launch names the files
        its stdout and stderr go to (the handle's ``files``): those are read as the pipes."""
        if launch is not None:
            image = self.params["image"]  # its own image: its own PATH; else the host's /usr, and the harness's PATH
            env = dict(self.params["env"]) if image else {"PATH": os.environ.get("PATH", os.defpath), **self.params["env"]}
            child = launch(argv, cwd=str(self.directory), env=env, image=image)
            self.incarnation += 1
            self.pipe_inodes, self._words = {}, child.output_tail
            # A batch job's stdout and stderr are files (SlurmChild.files): read as its pipes would be.
            for name, path in getattr(child, "files", {}).items():
                if name in self.watched:
                    self.files[name] = path
            self._tail()
            return child
        # Before any pipe: a factory that raises leaks none.
        rules = {name: self._make_rule(name) for name in program_api.PIPES if name in self.watched}
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
            self._read(name, r, self.incarnation, {"rule": rules.get(name)})
        self._tail()
        return child

    def _tail(self) -> None:
        """Start tailing each watched file (once: a file outlives the program's incarnations)."""
        if self._tailers:
            return
        for name, path in self.files.items():
            thread = threading.Thread(target=self._guarded, args=(f"reading {path}", functools.partial(self._tail_file, name)),
                                      name="cutbench-tail", daemon=True)
            self._tailers.append(thread)
            thread.start()

    def restoring(self) -> None:
        """A restore of the program begins: what it shows from now on is the next incarnation's. (A CRIU restore
        of its pipes counts it in :meth:`inherited_fds`; a container engine's restore hands over no pipe.)"""
        if not self.pipe_inodes:
            with self.lock:
                self.incarnation += 1

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
            after = self._stream_readers.get(name)
            self._read(name, r, self.incarnation, {"rule": None, "after": after} if after is not None else {"rule": None})
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
        self._pipe_readers.setdefault(incarnation, []).append(thread)
        if name in self.watched:
            self._stream_readers[name] = (thread, parsing)
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
                parsing["rule"] = copy.deepcopy(its.get("rule")) or self._make_rule(name)
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
            if name not in self.watched:
                return
            self._count(name, lines, size)
        rule = parsing.get("rule")
        if rule is not None:
            self._effects(rule, lines, incarnation, name)

    def _take_lines(self, rule: program_api.LineParser, lines: list[str], size: int, stream: str = "",
                    watched: str = "") -> None:
        """Lines of a watched stream (``watched``; the scenario's stream by default) read by a file's, a socket's or
        a client's reader: counted, and turned into effects of the incarnation running now (``stream``: their
        stream's name in the effects, a request's id for a server's clients)."""
        with self.lock:
            self._count(watched or self.stream, lines, size)
            incarnation = self.incarnation
        self._effects(rule, lines, incarnation, stream or watched)

    def _count(self, name: str, lines: list[str], size: int) -> None:
        """More lines of watched stream ``name`` read, ``size`` bytes with their newlines (the caller holds the lock)."""
        self.read_lines[name] += len(lines)
        self.read_bytes[name] += size
        head = self.heads[name]
        if len(head) < 5:
            head.extend(lines[: 5 - len(head)])

    @property
    def lines(self) -> int:
        """Lines of the watched streams read, all told."""
        return sum(self.read_lines.values())

    @property
    def bytes(self) -> int:
        """Bytes of the scenario's stream read (where a cut of phase "size" lands)."""
        return self.read_bytes[self.stream]

    def silent(self) -> list[str]:
        """The watched streams that showed no effect (a server's effects carry their request's id as their stream:
        any of them counts for the server's one stream)."""
        with self.lock:
            shown = {s.stream for s in self.seen}
        if self.http is not None and shown:
            shown.add(self.stream)
        return [name for name in self.watched if name not in shown]

    def nothing_matched(self, name: str = "") -> str:
        """Why a run that showed no effect on stream ``name`` (the scenario's by default) cannot be judged: its
        rule and what the stream held."""
        name = name or self.stream
        shown = "; ".join(repr(line[:120]) for line in self.heads[name]) or "nothing"
        which = "workload.params.effects or parser" if name == self.stream else f"the rule of streams entry {name!r}"
        return (f"the effects rule matched nothing in the {self.read_lines[name]} lines of {name} (its first lines: "
                f"{shown}): check {which}")

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

    def _make_rule(self, stream: str = "") -> program_api.LineParser:
        """A fresh effects rule of watched stream ``stream`` (the scenario's by default)."""
        return program_api.Program.rule(self.watched[stream or self.stream])

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

    # -- a file it appends to ----------------------------------------------------
    def _tail_file(self, name: str) -> None:
        """Read watched stream ``name``'s file as it grows, as ``tail -F`` does: a file replaced (a new inode: the
        program started again and moved the old one aside) or cut shorter than what was read (a restart that
        truncates its log to its checkpoint) is read again from where it differs, and what follows counts as seen
        again."""
        path = self.directory / self.files[name]
        kept = b""  # what was read so far, to its last whole line: where a rewritten file differs is found in it
        inode: int | None = None
        rule = self._make_rule(name)
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
                    kept, rule = kept[:same], self._make_rule(name)
                    for old in kept.split(b"\n")[:-1]:
                        rule(old.decode(errors="replace"))
                inode = st.st_ino
                end = data.rfind(b"\n") + 1
                if end:
                    kept += data[:end]
                    self._take_lines(rule, [raw.decode(errors="replace") for raw in data[:end].split(b"\n")[:-1]], end,
                                     watched=name)
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
        for tailer in self._tailers:
            tailer.join(max(0.1, deadline - time.monotonic()))

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server's ``{port}``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
