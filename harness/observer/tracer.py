"""A program's system calls that make its effects visible or durable, counted, and the program held at one.

Run as a process of its own, one per start of a program (``python -m cutbench.harness.observer.tracer``, by
:class:`~cutbench.harness.observer.syscalls.Tracer`): its ``waitpid`` then sees its tracees only (the harness is a
subreaper whose other children it must never reap), and its ptrace stops cost the harness's threads nothing.

The program starts waiting (its command behind ``sh -c 'read _ < "$0"; exec "$@"' FIFO``: a fifo in its
directory, which works in a container too, where the wrapper is the init of a PID namespace and cannot stop
itself). The tracer seizes it (``PTRACE_SEIZE``, following its threads and children) and says so; the harness
writes the fifo, the wrapper becomes the program, and the tracer counts each call of ``--calls`` on
a target that counts: its stdout or stderr pipe, a socket, a file within ``--dir`` (its database, its journal,
its checkpoint file), and the root process's ``exit_group``. Each counted call is one line of JSON on stdout
(``{"n": 17, "call": "write", "target": "stdout", "bytes": 41, "head": "done 17 ab…"}``).

A stop at every call is what tracing costs (a program's threads make tens of thousands of ``futex`` calls), so
the kernel counts until near the held call (:class:`Counters`): a thread stops only after a call whose name
counts, and is counted there by target as at a stop. ``MARGIN`` counted calls before the held one (or as many
as it traces threads, if more) the tracer disables the counters and stops at every call (``full``). A thread
that was inside such a call then is a *suspect* until its counter's signal has come (the call counts then), and
a freeze or release waits for the suspects (``DRAIN_S``), as a signal that came after the tracer let go would
kill the program. Such a signal may come after other threads' later calls: a call whose count the signals still
due could push past the held one is *parked* at its entry until they have come (``DRAIN_S`` at most). Without
the counters (an older kernel, no tracefs, ``--stops``) every call stops from the
start. The first line says which (``{"mode": "counters"}``).

With ``--stop-at K`` the program is held just before its K-th counted call: the thread that makes it is stopped
at the call's entry, the call is skipped and the thread rewound onto it (``orig_rax = -1`` at entry; at exit the
instruction pointer back over the ``syscall`` instruction and ``rax`` the call's number), so the call runs once,
when the thread goes on. Its other threads run on untraced-for-calls (a GPU tool's lock needs the program's CUDA
threads). It says ``{"held": K, …}`` and waits for one command on stdin:

- ``freeze``: stop the whole tree (``SIGSTOP``, a group stop) and detach from every thread, leaving it stopped
  with nothing of the tracer in it (CRIU can then seize it; a ``SIGCONT`` continues it at the held call, the
  original or a restored copy alike);
- ``release``: detach and let it go on (the held call runs now).

It ends once it has detached, or when the traced processes are gone, or when stdin closes (the harness went
away: the kernel detaches the tracees and they run on). x86-64 only (the rewind knows its ``syscall``
instruction and registers). Of cutbench it imports only the calls' table (:mod:`cutbench.harness.model.boundaries`),
so that it starts in a moment.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import select
import signal
import struct
import sys
import time
import threading
from pathlib import Path
from typing import Any

from cutbench.harness.model.boundaries import CALLS

# ptrace requests and options (linux/ptrace.h).
PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH, PTRACE_SYSCALL = 7, 12, 13, 17, 24
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_GETSIGINFO, PTRACE_GET_SYSCALL_INFO = 0x4206, 0x4207, 0x4202, 0x420E
OPTIONS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10  # TRACESYSGOOD, TRACEFORK, TRACEVFORK, TRACECLONE, TRACEEXEC
EVENT_EXEC, EVENT_EXIT, EVENT_STOP = 4, 6, 128
OPTION_EXIT = 0x40  # TRACEEXIT: a process that counts with counters has its exit_group counted at its exit
SYSCALL_ENTRY, SYSCALL_EXIT = 1, 2
WALL = 0x40000000  # __WALL: threads too
STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

NAMES = {nr: name for name, (nr, _) in CALLS.items()}
EXIT_GROUP = CALLS["exit_group"][0]
TGKILL = 234  # x86-64: a signal to one thread
HEAD = 48  # bytes of a write read for its boundary's name
# How many counted calls before the held one the tracer stops every call again (see the module docstring), at
# least: as many as it traces threads, each of which may have one call in flight at the switch.
MARGIN = 3
# How long a freeze or a release waits for a thread that may still have a counter's signal to come.
DRAIN_S = 1.0

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
libc.syscall.restype = ctypes.c_long
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


class Regs(ctypes.Structure):
    """The x86-64 ``struct user_regs_struct``."""

    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
        "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")]


class SyscallInfo(ctypes.Structure):
    """The ``struct ptrace_syscall_info`` (entry: nr and args; exit: rval) as one flat layout."""

    _fields_ = [("op", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 3), ("arch", ctypes.c_uint32),
                ("ip", ctypes.c_uint64), ("sp", ctypes.c_uint64), ("nr", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6), ("ret_data", ctypes.c_uint32)]


def ptrace(request: int, tid: int, addr: int = 0, data: int | ctypes.c_void_p | None = 0) -> int:
    """One ptrace request; raises OSError with errno."""
    result = libc.ptrace(request, tid, ctypes.c_void_p(addr), data if isinstance(data, ctypes.c_void_p)
                         else ctypes.c_void_p(data))
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def say(**fields: object) -> None:
    """One line of JSON to the harness."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def signed(value: int) -> int:
    """Return a register's 64 bits as a signed number (``orig_rax`` is -1 outside a call)."""
    return value - 2**64 if value >= 2**63 else value


class Counters:
    """The kernel's count of the calls whose names count, one perf event per traced process.

    Each is a tracepoint event on ``raw_syscalls:sys_enter``, filtered to those call numbers, with a period of 1
    and ``sigtrap``: the thread that makes such a call gets a ``SIGTRAP`` (``TRAP_PERF``) as the call returns, a
    ptrace signal stop in which the tracer reads the call from its registers (the arguments are still there) and
    suppresses the signal. ``inherit`` follows its threads and children; ``remove_on_exec`` (which ``sigtrap``
    requires) ends it at an ``exec``, after which the tracer watches the new program. Closing an event removes it
    from the process and its children: nothing of it stays in the program.
    """

    PERF_EVENT_OPEN, TYPE_TRACEPOINT, FD_CLOEXEC = 298, 2, 8
    ENABLE, DISABLE, SET_FILTER = 0x2400, 0x2401, 0x40082406
    # disabled (until its filter is set: unfiltered, every call would signal), inherit, remove_on_exec, sigtrap
    FLAGS = 1 << 0 | 1 << 1 | 1 << 36 | 1 << 37
    TRAP_PERF = 6
    SIG_DATA = 0x6375746265  # in each signal's si_perf_data: the tracer's, not one of the program's own events
    TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

    def __init__(self, calls: set[int], tracepoint: int):
        self.filter = " || ".join(f"id == {nr}" for nr in sorted(calls)).encode()
        self.tracepoint = tracepoint
        self.fds: list[int] = []

    @classmethod
    def open(cls, calls: set[int]) -> "tuple[Counters | None, str]":
        """Return counters for ``calls`` once one event opened on the tracer itself, else None and why not."""
        tracepoint = cls._tracepoint()
        if tracepoint is None:
            return None, "no tracefs with raw_syscalls:sys_enter (a kernel without syscall tracepoints?)"
        counters = cls(calls, tracepoint)
        try:
            counters.watch(os.getpid(), enable=False)
        except OSError as exc:
            return None, f"perf_event_open refused a sigtrap tracepoint event: {exc}"
        # Kept, never enabled, for the tracer's life: while one event holds the tracepoint registered, opening
        # the program's at each exec and their removal at the next cost it no registration (tens of ms each).
        return counters, ""

    @classmethod
    def _tracepoint(cls) -> int | None:
        for root in cls.TRACEFS:
            path = Path(root) / "events/raw_syscalls/sys_enter/id"
            if not path.exists() and root == cls.TRACEFS[0] and Path(root).is_dir():
                libc.mount(b"nodev", root.encode(), b"tracefs", 0, None)  # not mounted yet: as root, mount it
            try:
                return int(path.read_text())
            except (OSError, ValueError):
                continue
        return None

    def watch(self, tid: int, *, enable: bool = True) -> None:
        """Count the calls of ``tid`` (and of the threads and children it makes from now on); raises OSError."""
        attr = bytearray(136)  # struct perf_event_attr, PERF_ATTR_SIZE_VER8
        struct.pack_into("IIQQQQQ", attr, 0, self.TYPE_TRACEPOINT, len(attr), self.tracepoint, 1, 0, 0, self.FLAGS)
        struct.pack_into("Q", attr, 120, self.SIG_DATA)
        fd = libc.syscall(self.PERF_EVENT_OPEN, ctypes.create_string_buffer(bytes(attr), len(attr)), tid, -1, -1,
                          self.FD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if libc.ioctl(fd, self.SET_FILTER, self.filter) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"filter {self.filter.decode()!r}: {os.strerror(err)}")
        self.fds.append(fd)
        if enable and libc.ioctl(fd, self.ENABLE, None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"enable: {os.strerror(err)}")

    def disable(self) -> None:
        """Disable every event: no more signals are made (one already on its way still comes). The events go
        with the tracer's descriptors when it ends, right after it lets the program go: closing the last one
        unregisters the tracepoint, which would stop the thread the tracer holds at the switch for tens of ms."""
        for fd in self.fds:
            libc.ioctl(fd, self.DISABLE, None)

    @classmethod
    def signalled(cls, tid: int) -> bool:
        """Whether ``tid``, in a ``SIGTRAP`` signal stop, was stopped by one of these events."""
        info = ctypes.create_string_buffer(128)
        try:
            ptrace(PTRACE_GETSIGINFO, tid, 0, ctypes.cast(info, ctypes.c_void_p))
        except OSError:
            return False
        _, _, code = struct.unpack_from("iii", info.raw, 0)
        return code == cls.TRAP_PERF and struct.unpack_from("Q", info.raw, 24)[0] == cls.SIG_DATA


class Tracer:
    """The loop over the tree's stops (see the module docstring)."""

    def __init__(self, root: int, calls: set[int], directory: str, stop_at: int, count_from: int,
                 hold_tid: int = 0, counters: Counters | None = None):
        self.root, self.calls, self.stop_at, self.count = root, calls, stop_at, count_from
        # A restored copy held again (--attached): only this thread's call is the held one; the program's other
        # threads are past the boundary already (they ran on while it was held), and their calls pass.
        self.hold_tid = hold_tid
        self.directory = os.path.realpath(directory)
        self.tracees: set[int] = set()
        self.started = False  # the wrapper's exec seen: the program's own calls count from here
        self.rewind: dict[int, int] = {}  # tid -> the number of the call skipped at its entry, to run again
        self.held: int | None = None  # the tid held at the boundary
        # Its stdout and stderr, where they are pipes to a reader (the harness's): /dev/null shows nothing.
        self.pipes = {link: name for link, name in ((self._link(root, fd), name) for fd, name in ((1, "stdout"), (2, "stderr")))
                      if link.startswith("pipe:")}
        self.info = SyscallInfo()
        self.command: str | None = None
        self.said_error = False
        # Counted by the kernel's counters until near the held call, then by a stop at every call (``full``).
        self.counters = counters
        self.full = counters is None or bool(stop_at and count_from >= stop_at - 1 - MARGIN)
        self.switching: set[int] = set()  # threads interrupted at the switch, their first stop not seen yet
        self.suspects: set[int] = set()  # threads that may have a counter's signal still to come
        self.parked: list[tuple[int, int, list[int]]] = []  # entries at the held call, waiting for those signals
        self.exits: set[int] = set()  # threads whose exit_group was counted at its entry
        self.drain_until: float | None = None
        self.ending = False  # told to end (SIGTERM): the program is let go, as by ``release``
        self.stops = 0  # what the tracing cost the program: how many times one of its threads stopped
        self.tgids: dict[int, int] = {}
        self.log: Any = None  # --log: every stop and counted-name entry, for a hold that does not come
    @staticmethod
    def _link(pid: int, fd: int) -> str:
        try:
            return os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            return ""

    # -- what a call is --------------------------------------------------------------------------
    def target(self, pid: int, nr: int, args: list[int]) -> tuple[str, int, str] | None:
        """Return ``(target, bytes, head)`` of a call that counts, else None."""
        kind = CALLS[NAMES[nr]][1]
        if kind == "exit":
            return ("process", 0, "") if pid == self.root else None
        if kind.startswith("paths:"):
            paths = [self._path(pid, args[int(i)]) for i in kind[6:].split(",")]
            inside = [p for p in paths if p is not None]
            if not inside:
                return None
            return " -> ".join(inside), 0, ""
        if kind == "map":
            name = self._mapped(pid, args[0])
            return (name, int(args[1]), "") if name else None
        where = self._fd_target(pid, int(args[0]))
        if where is None:
            return None
        if kind == "fd":
            return where, int(args[2]), self._head(pid, args[1], int(args[2]))
        if kind == "iov":
            return where, self._iov_bytes(pid, args[1], int(args[2])), ""
        return where, 0, ""

    def _fd_target(self, pid: int, fd: int) -> str | None:
        link = self._link(pid, fd)
        if link in self.pipes:
            return self.pipes[link]
        if link.startswith("socket:"):
            return "socket"
        return self._inside(link)

    def _inside(self, path: str) -> str | None:
        if path == self.directory or not path.startswith(self.directory + "/"):
            return None
        return "file:" + path[len(self.directory) + 1:]

    def _path(self, pid: int, address: int) -> str | None:
        raw = self._read(pid, address, 4096).split(b"\0", 1)[0].decode(errors="replace")
        if not raw:
            return None
        if not raw.startswith("/"):
            try:
                raw = os.path.join(os.readlink(f"/proc/{pid}/cwd"), raw)
            except OSError:
                return None
        return self._inside(os.path.normpath(raw))

    def _mapped(self, pid: int, address: int) -> str | None:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                span, *rest = line.split(maxsplit=5)
                low, high = (int(x, 16) for x in span.split("-"))
                if low <= address < high and len(rest) == 5:
                    return self._inside(rest[4])
        except (OSError, ValueError):
            return None
        return None

    def _read(self, pid: int, address: int, size: int) -> bytes:
        try:
            mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            return b""
        try:
            return os.pread(mem, size, address)
        except (OSError, ValueError, OverflowError):
            return b""
        finally:
            os.close(mem)

    def _head(self, pid: int, address: int, size: int) -> str:
        return self._read(pid, address, min(size, HEAD)).decode(errors="replace")

    def _iov_bytes(self, pid: int, address: int, count: int) -> int:
        raw = self._read(pid, address, 16 * min(count, 64))
        return sum(int.from_bytes(raw[i + 8:i + 16], "little") for i in range(0, len(raw) - 15, 16))

    # -- the loop ------------------------------------------------------------------------------------
    def seize(self, *, attached: bool = False) -> None:
        """Seize the waiting wrapper and start tracing its calls; the harness then lets it become the program.
        ``attached``: seize every thread of a program that is the program already (a restored copy, stopped, its
        held thread rewound onto its call): its calls count from ``count_from``, and the harness continues it."""
        tids = [int(t) for t in os.listdir(f"/proc/{self.root}/task")] if attached else [self.root]
        for tid in tids:
            ptrace(PTRACE_SEIZE, tid, 0, OPTIONS | (OPTION_EXIT if self.counters is not None else 0))
            self.tracees.add(tid)
            ptrace(PTRACE_INTERRUPT, tid)  # its first stop, where its calls start to be traced
            if attached and not self.full:
                self._watch(tid)
        self.started = attached
        say(seized=self.root)

    def run(self) -> int:
        """Trace until the tree is gone or a command detached from it; return the exit status for the process."""
        signal.signal(signal.SIGTERM, self._terminated)
        while self.tracees:
            if self.held is not None or self.ending:
                if self.held is not None:
                    self._await_command()
                if self.command in ("freeze", "release") and self._drained():
                    return self._detach(stop=self.command == "freeze")
            polling = self.held is not None or self.ending or bool(self.parked)
            try:
                tid, status = os.waitpid(-1, WALL | (os.WNOHANG if polling else 0))
            except ChildProcessError:
                break
            if tid == 0:
                self._unpark()
                if (self.ending or self.parked) and self.held is None:
                    time.sleep(0.001)
                continue
            self._stop(tid, status)
            self._unpark()
        say(ended=self.count, stops=self.stops)
        return 0

    def _terminated(self, signum: int, frame: object) -> None:
        """SIGTERM (the harness closes the tracer, or its stdin closed): let the program go, as ``release``
        does, once no counter's signal can still reach it (which, untraced, would kill it). Every thread is
        interrupted, so that a blocking ``waitpid`` returns with a stop (raising out of it could lose one)."""
        if self.ending:
            return
        self.ending = True
        self.command = self.command or "release"
        self._switch(0)

    def _await_command(self) -> None:
        """While held: look for the harness's command without blocking the other threads' stops long."""
        if self.command is None and select.select([sys.stdin], [], [], 0.002)[0]:
            line = sys.stdin.readline()
            self.command = line.strip() if line else "release"  # stdin closed: let it go

    def _drained(self) -> bool:
        """Whether no thread may still get a counter's signal (none interrupted at the switch and not yet seen,
        none inside a counted call), or the wait for them is over (``DRAIN_S``)."""
        if not (self.suspects or self.switching):
            return True
        if self.drain_until is None:
            self.drain_until = time.monotonic() + DRAIN_S
        return time.monotonic() > self.drain_until

    def _stop(self, tid: int, status: int) -> None:
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.tracees.discard(tid)
            self.tgids.pop(tid, None)
            self.rewind.pop(tid, None)
            self.suspects.discard(tid)
            self.switching.discard(tid)
            return
        if not os.WIFSTOPPED(status):
            return
        sig, event = os.WSTOPSIG(status), status >> 16
        self.tracees.add(tid)  # a new thread or child reports its first stop
        self.stops += 1
        if self.log is not None:
            self.log.write(f"{time.monotonic():.6f} stop tid={tid} sig={sig} event={event} held={self.held} "
                           f"full={self.full} count={self.count}\n")
        if sig == signal.SIGTRAP | 0x80:
            if self._syscall(tid):
                return  # held: it stays stopped
            self._resume(tid)
        elif event:  # a fork, clone or exec; a new tracee's first stop, the seize's interrupt, a group stop
            if event == EVENT_EXEC:
                self.tgids.pop(tid, None)  # a thread that execs becomes its process's leader
                self.started = self.started or self._tgid(tid) == self.root  # the wrapper became the program
                if self.started and not self.full:
                    self._watch(tid)  # its counter ended with the exec (remove_on_exec)
            elif event == EVENT_EXIT:
                self._exiting(tid)
            elif event == EVENT_STOP and tid in self.switching:
                self.switching.discard(tid)
                if signed(self._regs(tid).orig_rax) in self.calls:
                    self.suspects.add(tid)  # stopped inside such a call: its counter's signal may be to come
            self._resume(tid)
        elif sig == signal.SIGTRAP and Counters.signalled(tid):
            self._counted(tid)
            self._resume(tid)  # the counter's signal is the tracer's, not the program's: suppressed
        else:
            self._resume(tid, sig)  # a signal for the program: delivered as it would be

    def _resume(self, tid: int, sig: int = 0) -> None:
        # Every call stops while counting at stops (``full``), but for a held program's other threads, which run
        # free (its CUDA threads serve a GPU tool's lock), unless a counter's signal may still come to them.
        stops = self.full and (self.held is None or tid in self.suspects)
        try:
            ptrace(PTRACE_SYSCALL if stops else PTRACE_CONT, tid, 0, sig)
        except OSError:
            pass  # gone meanwhile

    def _watch(self, tid: int) -> None:
        assert self.counters is not None
        try:
            self.counters.watch(tid)
        except OSError as exc:  # it worked on the tracer itself: count this program at stops from here on
            say(mode="stops", why=f"perf_event_open on pid {tid}: {exc}")
            self._switch(tid)

    def _switch(self, tid: int) -> None:
        """Count at stops from now on: the counters disabled, every other thread interrupted so that it stops at
        its calls from its next resume. ``tid`` is stopped already (0: none is)."""
        self.full = True  # already so when ending while counting at stops: the interrupts wake the loop
        if self.counters is not None:
            self.counters.disable()
        for other in self.tracees - {tid}:
            try:
                ptrace(PTRACE_INTERRUPT, other)
                self.switching.add(other)
            except OSError:
                pass

    def _counted(self, tid: int) -> None:
        """A counter's signal: ``tid`` has just made a call whose name counts; count it if it counts."""
        self.suspects.discard(tid)
        if self.held is not None or not self.started:
            return
        regs = self._regs(tid)
        nr = signed(regs.orig_rax)
        boundary = self._count(tid, nr, [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9])
        if boundary is not None:
            say(**boundary)
            # Each other thread may have one call in flight whose signal comes after the switch, and it counts
            # then: switching that many calls early (and MARGIN at least) keeps the held call one to stop at.
            if not self.full and self.stop_at and self.count >= self.stop_at - 1 - max(MARGIN, len(self.tracees)):
                self._switch(tid)

    def _exiting(self, tid: int) -> None:
        """A thread about to exit: the root process's ``exit_group``, if its entry was not counted, counts here."""
        if tid in self.exits or not self.started or self.held is not None:
            return
        regs = self._regs(tid)
        if signed(regs.orig_rax) == EXIT_GROUP:
            boundary = self._count(tid, EXIT_GROUP, [regs.rdi, 0, 0, 0, 0, 0])
            if boundary is not None:
                say(**boundary)

    def _count(self, tid: int, nr: int, args: list[int]) -> dict[str, object] | None:
        """Count the call ``nr`` of ``tid`` if it counts; return its boundary, else None."""
        if nr not in self.calls or (self.hold_tid and tid != self.hold_tid):
            return None
        what = self.target(self._tgid(tid), nr, args)
        if what is None:
            return None
        self.count += 1
        where, size, head = what
        return {"n": self.count, "call": NAMES[nr], "target": where, "bytes": size, "head": head}

    @staticmethod
    def _regs(tid: int) -> Regs:
        regs = Regs()
        try:
            ptrace(PTRACE_GETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
        except OSError:
            regs.orig_rax = 2**64 - 1
        return regs

    def _syscall(self, tid: int) -> bool:
        """Handle a syscall stop; True when ``tid`` is now held at the boundary."""
        try:
            ptrace(PTRACE_GET_SYSCALL_INFO, tid, ctypes.sizeof(self.info), ctypes.c_void_p(ctypes.addressof(self.info)))
        except OSError as exc:
            if exc.errno != errno.ESRCH and not self.said_error:  # gone meanwhile is no error; a kernel without it is
                self.said_error = True
                say(error=f"PTRACE_GET_SYSCALL_INFO: {exc}")
            return False
        if self.info.op == SYSCALL_EXIT:
            nr = self.rewind.pop(tid, None)
            if nr is None:
                return False
            regs = self._regs(tid)
            regs.rax, regs.orig_rax, regs.rip = nr, nr, regs.rip - 2  # back onto its `syscall` instruction
            ptrace(PTRACE_SETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
            self.held = tid
            return True
        if self.info.op != SYSCALL_ENTRY:
            return False
        self.suspects.discard(tid)  # a new call: what the last one brought has come
        if not self.started or self.held is not None or self.rewind:
            return False  # held: the other threads' calls come after the boundary
        nr, args = int(self.info.nr), list(self.info.args)
        due = self.switching | self.suspects  # threads each of which may still bring one counted call
        if self.full and self.stop_at and nr in self.calls and self.count + 1 + len(due) >= self.stop_at \
                and not self._drained():
            # A counter's signal still to come counts a call made before this one, however late it comes: where
            # those could reach the held call, this one waits for them, stopped at its entry (_unpark).
            self.parked.append((tid, nr, args))
            return True
        return self._entry(tid, nr, args)

    def _unpark(self) -> None:
        """Count the entries parked at the held call once no counter's signal may still come (or ``DRAIN_S`` is
        over), in the order they came; returns nothing."""
        if not self.parked or not self._drained():
            return
        parked, self.parked = self.parked, []
        for tid, nr, args in parked:
            self._entry(tid, nr, args)
            self._resume(tid)

    def _entry(self, tid: int, nr: int, args: list[int]) -> bool:
        """Count call ``nr`` of ``tid`` at its entry, and hold it there if it is the plan's; returns False (a held
        call is rewound and held at its exit stop)."""
        if self.held is not None or self.rewind:
            return False  # held: the other threads' calls come after the boundary
        if self.log is not None:
            self.log.write(f"{time.monotonic():.6f} entry tid={tid} nr={nr} args={args[:3]}\n")
        boundary = self._count(tid, nr, args)
        if boundary is None:
            return False
        if nr == EXIT_GROUP:
            self.exits.add(tid)
        if not self.stop_at or self.count < self.stop_at:
            say(**boundary)
            return False
        regs = self._regs(tid)
        regs.orig_rax = 2**64 - 1  # -1: the kernel skips the call; it runs when the thread goes on
        ptrace(PTRACE_SETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
        self.rewind[tid] = nr
        say(held=self.count, pid=self._tgid(tid), tid=tid, **boundary)
        return False  # on to its exit stop, where it is rewound and held
    def _tgid(self, tid: int) -> int:
        """Return the process of thread ``tid`` (kept: it is asked at every stop that may count)."""
        known = self.tgids.get(tid)
        if known is not None:
            return known
        try:
            for line in Path(f"/proc/{tid}/status").read_text().splitlines():
                if line.startswith("Tgid:"):
                    self.tgids[tid] = int(line.split()[1])
                    return self.tgids[tid]
        except (OSError, ValueError):
            pass
        return tid

    def _detach(self, *, stop: bool) -> int:
        """Detach from every thread: stopped, in a group stop of its whole tree (``stop``), or running on."""
        if self.counters is not None:
            self.counters.disable()
        processes = {self._tgid(t) for t in self.tracees}
        if stop:
            # The held thread's own process is stopped by a SIGSTOP sent to that thread: it takes it on its way back
            # to user mode and starts the group stop there, at its call. A SIGSTOP sent to the process goes to
            # another thread, which may take it late (one blocked in the CUDA driver, on an H100): the held thread,
            # let go meanwhile, made its call untraced and ran on (the GPT-2 server's copy not held again).
            held_pid = self._tgid(self.held) if self.held is not None else 0
            for pid in processes:
                try:
                    if pid == held_pid:
                        if libc.syscall(TGKILL, pid, self.held, signal.SIGSTOP) != 0:
                            raise ProcessLookupError(pid)
                    else:
                        os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
        pending = set(self.tracees)
        for tid in list(pending):
            if tid == self.held:
                continue
            try:
                ptrace(PTRACE_INTERRUPT, tid)
            except OSError:
                pending.discard(tid)
        if self.held is not None:
            # The held thread goes back to user mode at its call: with the group stop pending it stops there.
            self._resume_held(stop)
        while pending:
            try:
                tid, status = os.waitpid(-1, WALL)
            except ChildProcessError:
                break
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                pending.discard(tid)
                continue
            sig, event = os.WSTOPSIG(status), status >> 16
            if stop and event != EVENT_STOP and sig == signal.SIGSTOP:
                ptrace(PTRACE_CONT, tid, 0, sig)  # the group stop's own signal: let it stop the group
                continue
            if stop and not (event == EVENT_STOP and sig in STOP_SIGNALS):
                ptrace(PTRACE_CONT, tid, 0, 0 if sig in (signal.SIGTRAP, signal.SIGTRAP | 0x80) else sig)
                continue  # not in the group stop yet: it gets there
            try:
                ptrace(PTRACE_DETACH, tid, 0, 0)
            except OSError:
                pass
            pending.discard(tid)
        say(frozen=stop, count=self.count, stops=self.stops)
        return 0

    def _resume_held(self, stop: bool) -> None:
        tid, self.held = self.held, None
        if tid is None:
            return
        try:
            if stop:
                ptrace(PTRACE_CONT, tid, 0, 0)
            else:
                ptrace(PTRACE_DETACH, tid, 0, 0)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the waiting wrapper to seize")
    parser.add_argument("--calls", default=",".join(CALLS), help="comma-separated names of the calls that count "
                                                                   "(default: all of them)")
    parser.add_argument("--dir", required=True, help="the program's directory: the files within it count")
    parser.add_argument("--stop-at", type=int, default=0, help="hold the program before this counted call (0: never)")
    parser.add_argument("--count-from", type=int, default=0, help="the calls counted before (a restored program's)")
    parser.add_argument("--attached", action="store_true",
                        help="--pid is the program itself, stopped (a restored copy held again at its call)")
    parser.add_argument("--hold-tid", type=int, default=0, help="with --attached: the thread whose call is held")
    parser.add_argument("--log", default="", help="append every stop the tracer sees to this file (a diagnosis)")
    parser.add_argument("--stops", action="store_true",
                        help="count at a stop of every call, without the kernel's counters (as where there are none)")
    args = parser.parse_args(argv)
    calls = {CALLS[name][0] for name in args.calls.split(",") if name}
    counters, why = (None, "--stops") if args.stops else Counters.open(calls)
    tracer = Tracer(args.pid, calls, args.dir, args.stop_at, args.count_from, args.hold_tid, counters)
    if tracer.full and counters is not None:
        tracer.counters, why = None, "the held call is near"
    say(mode="stops" if tracer.counters is None else "counters", why=why)
    if args.log:
        tracer.log = open(args.log, "a", buffering=1)
    try:
        tracer.seize(attached=args.attached)
    except OSError as exc:
        say(error=f"cannot trace pid {args.pid}: {exc}")
        return 1
    watch = threading.Thread(target=_watch_stdin, daemon=True) if args.stop_at == 0 else None
    if watch is not None:
        watch.start()
    return tracer.run()


def _watch_stdin() -> None:
    """A recording tracer whose harness went away (stdin closed) ends, letting its tracees go (as SIGTERM)."""
    while sys.stdin.read(1):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
