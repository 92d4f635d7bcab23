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
import sys
import threading
from pathlib import Path

from cutbench.harness.model.boundaries import CALLS

# ptrace requests and options (linux/ptrace.h).
PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH, PTRACE_SYSCALL = 7, 12, 13, 17, 24
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_GET_SYSCALL_INFO = 0x4206, 0x4207, 0x420E
OPTIONS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10  # TRACESYSGOOD, TRACEFORK, TRACEVFORK, TRACECLONE, TRACEEXEC
EVENT_EXEC, EVENT_STOP = 4, 128
SYSCALL_ENTRY, SYSCALL_EXIT = 1, 2
WALL = 0x40000000  # __WALL: threads too
STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

NAMES = {nr: name for name, (nr, _) in CALLS.items()}
HEAD = 48  # bytes of a write read for its boundary's name

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


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


class Tracer:
    """The loop over the tree's stops (see the module docstring)."""

    def __init__(self, root: int, calls: set[int], directory: str, stop_at: int, count_from: int,
                 hold_tid: int = 0):
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
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                mem.seek(address)
                return mem.read(size) or b""
        except (OSError, ValueError, OverflowError):
            return b""

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
            ptrace(PTRACE_SEIZE, tid, 0, OPTIONS)
            self.tracees.add(tid)
            ptrace(PTRACE_INTERRUPT, tid)  # its first stop, where its calls start to be traced
        self.started = attached
        say(seized=self.root)

    def run(self) -> int:
        """Trace until the tree is gone or a command detached from it; return the exit status for the process."""
        while self.tracees:
            if self.held is not None:
                self._await_command()
                if self.command in ("freeze", "release"):
                    return self._detach(stop=self.command == "freeze")
            try:
                tid, status = os.waitpid(-1, WALL | (os.WNOHANG if self.held is not None else 0))
            except ChildProcessError:
                break
            if tid == 0:
                continue
            self._stop(tid, status)
        say(ended=self.count)
        return 0

    def _await_command(self) -> None:
        """While held: look for the harness's command without blocking the other threads' stops long."""
        if self.command is None and select.select([sys.stdin], [], [], 0.002)[0]:
            line = sys.stdin.readline()
            self.command = line.strip() if line else "release"  # stdin closed: let it go

    def _stop(self, tid: int, status: int) -> None:
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.tracees.discard(tid)
            self.rewind.pop(tid, None)
            return
        if not os.WIFSTOPPED(status):
            return
        sig, event = os.WSTOPSIG(status), status >> 16
        self.tracees.add(tid)  # a new thread or child reports its first stop
        if sig == signal.SIGTRAP | 0x80:
            if self._syscall(tid):
                return  # held: it stays stopped
            self._resume(tid)
        elif event:  # a fork, clone or exec; a new tracee's first stop, the seize's interrupt, a group stop
            if event == EVENT_EXEC:
                self.started = self.started or self._tgid(tid) == self.root  # the wrapper became the program
            self._resume(tid)
        else:
            self._resume(tid, sig)  # a signal for the program: delivered as it would be

    def _resume(self, tid: int, sig: int = 0) -> None:
        # While held, the other threads run free of syscall stops: a held program's CUDA threads serve the lock.
        try:
            ptrace(PTRACE_CONT if self.held is not None else PTRACE_SYSCALL, tid, 0, sig)
        except OSError:
            pass  # gone meanwhile

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
            regs = Regs()
            ptrace(PTRACE_GETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
            regs.rax, regs.orig_rax, regs.rip = nr, nr, regs.rip - 2  # back onto its `syscall` instruction
            ptrace(PTRACE_SETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
            self.held = tid
            return True
        if self.info.op != SYSCALL_ENTRY or not self.started:
            return False
        nr = int(self.info.nr)
        if nr not in self.calls or (self.hold_tid and tid != self.hold_tid):
            return False
        pid = self._tgid(tid)
        what = self.target(pid, nr, list(self.info.args))
        if what is None:
            return False
        self.count += 1
        where, size, head = what
        boundary = {"n": self.count, "call": NAMES[nr], "target": where, "bytes": size, "head": head}
        if self.count != self.stop_at:
            say(**boundary)
            return False
        regs = Regs()
        ptrace(PTRACE_GETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
        regs.orig_rax = 2**64 - 1  # -1: the kernel skips the call; it runs when the thread goes on
        ptrace(PTRACE_SETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
        self.rewind[tid] = nr
        say(held=self.count, pid=pid, tid=tid, **boundary)
        return False  # on to its exit stop, where it is rewound and held

    @staticmethod
    def _tgid(tid: int) -> int:
        try:
            for line in Path(f"/proc/{tid}/status").read_text().splitlines():
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return tid

    def _detach(self, *, stop: bool) -> int:
        """Detach from every thread: stopped, in a group stop of its whole tree (``stop``), or running on."""
        processes = {self._tgid(t) for t in self.tracees}
        if stop:
            for pid in processes:
                try:
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
        say(frozen=stop, count=self.count)
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
    args = parser.parse_args(argv)
    calls = {CALLS[name][0] for name in args.calls.split(",") if name}
    tracer = Tracer(args.pid, calls, args.dir, args.stop_at, args.count_from, args.hold_tid)
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
    """A recording tracer whose harness went away (stdin closed) ends, and the kernel lets its tracees go."""
    while sys.stdin.read(1):
        pass
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
