"""CPU accounting of a trial's processes, per stage: who burnt how many CPU-seconds, faults and bytes.

Read at a stage's start and end only (a few ``/proc`` reads and one
``getrusage``), never by a polling thread; :class:`StageSampler` is what the
trial's :class:`~cutbench.harness.model.timeline.Timeline` calls, and the
stage row's ``cpu_*`` columns are the difference of its two samples. The
roles (``docs/cpu-accounting.md``):

``workload``
    the trial's workload processes (the root the harness started, the
    process a cut targets, the restored copy) and their descendants, from
    ``/proc/<pid>/stat``: utime + stime (fields 14, 15) plus the times of
    children they reaped (cutime + cstime, 16, 17); minflt + cminflt and
    majflt + cmajflt (10–13); ``/proc/<pid>/io`` ``write_bytes`` and
    ``wchar``. A workload the harness reaps (its exit, the fault's kill)
    ends with the exact figures ``wait4`` gave (:attr:`cutbench.procs.Child.rusage`).
``cuda_threads``
    of that, the threads whose name starts with ``cuda`` (the CUDA driver's
    ``cuda-EvtHandlr``, ``cuda00001400006``, …), from
    ``/proc/<pid>/task/<tid>/stat``; ``workload`` is the rest.
``criu`` / ``tool``
    checkpoint tools the harness runs as its children (:func:`run_measured`:
    CRIU; the ``cuda-checkpoint`` utility): the ``wait4`` usage of each when
    it is reaped, which includes its own reaped children (CRIU's helpers),
    and ``/proc/<pid>/io`` read while it is a zombie.
``receiver``
    the run's receiver process, one per run: at ``jobs`` > 1 each of its
    CPU-seconds goes to the first stage of any trial to end after it was
    spent, so the stages of trials run side by side add up.
``harness``
    the thread that runs the trial (``getrusage(RUSAGE_THREAD)``), plus the
    helper threads it starts for driver calls (:func:`helper_thread`).

A process that is gone at a sample contributes what was last read of it
(nothing since), never an error. Figures from ``/proc/<pid>/stat`` are in
clock ticks (10 ms): one stage's value is within a tick per process, and
the sum over a trial's consecutive stages telescopes to the exact total.
"""

from __future__ import annotations

import math
import os
import resource
import select
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from cutbench.harness.model.timeline import CPU_ROLES as ROLES
from cutbench.interrupts import interruptible, shielded
from cutbench.procs import stat_fields

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
CUDA_THREAD_PREFIX = "cuda"  # the CUDA driver names its threads cuda-EvtHandlr, cuda00001400006, ...
MAX_TREE = 256  # processes followed below one root (a workload that forks without end is not followed further)


@dataclass
class Usage:
    """Additive usage of one or more processes: CPU seconds (user, system), page faults, bytes written."""

    user_s: float = 0.0
    sys_s: float = 0.0
    minflt: int = 0
    majflt: int = 0
    write_bytes: int = 0  # bytes sent to the storage layer (/proc/<pid>/io write_bytes; tmpfs never counts)
    wchar: int = 0  # bytes handed to write(2) and its kin, tmpfs and sockets included

    @property
    def cpu_s(self) -> float:
        """User plus system seconds."""
        return self.user_s + self.sys_s

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: "Usage") -> "Usage":
        return Usage(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def maximum(self, other: "Usage") -> "Usage":
        """Field by field, the larger of this usage and ``other``."""
        return Usage(*(max(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))

    def floor(self) -> "Usage":
        """This usage with negative parts (two roundings apart) set to zero."""
        return Usage(*(max(getattr(self, f.name), 0) for f in fields(self)))

    @classmethod
    def of_rusage(cls, ru: Any, *, wchar: int = 0, write_bytes: int | None = None, ticks: bool = False) -> "Usage":
        """The usage a ``struct rusage`` holds (``ru_oublock`` is write_bytes / 512 where ``write_bytes`` is unknown).

        ``ticks``: CPU times cut down to whole clock ticks, as ``/proc/<pid>/stat`` gives them, so that the
        end of a process read there before is not a fraction of a tick that was never spent.
        """
        user, system = ru.ru_utime, ru.ru_stime
        if ticks:
            user, system = (math.floor(t / TICK_S + 1e-6) * TICK_S for t in (user, system))
        return cls(user, system, ru.ru_minflt, ru.ru_majflt, ru.ru_oublock * 512 if write_bytes is None else write_bytes,
                   wchar)


# -- what the harness's own children and helper threads used, credited to the thread they worked for --------

_LEDGER: dict[int, dict[str, Usage]] = {}
_LEDGER_LOCK = threading.Lock()
_OWNER = threading.local()


def _owner() -> int:
    return getattr(_OWNER, "ident", None) or threading.get_ident()


def credit(role: str, usage: Usage) -> None:
    """Add ``usage`` under ``role`` to the ledger of the thread this one works for (itself, or the owner
    :func:`helper_thread` named)."""
    owner = _owner()
    with _LEDGER_LOCK:
        book = _LEDGER.setdefault(owner, {})
        book[role] = book.get(role, Usage()) + usage


def credited(owner: int | None = None) -> dict[str, Usage]:
    """What has been credited to thread ``owner`` (default: this one) so far, by role; a copy."""
    with _LEDGER_LOCK:
        return dict(_LEDGER.get(threading.get_ident() if owner is None else owner, {}))


def thread_usage() -> Usage:
    """This thread's own usage so far (``getrusage(RUSAGE_THREAD)``: its ``wchar`` is not read)."""
    return Usage.of_rusage(resource.getrusage(resource.RUSAGE_THREAD))


@contextmanager
def helper_thread(owner: int) -> Iterator[None]:
    """Run the block on this (helper) thread on behalf of thread ``owner``: the children it runs through
    :func:`run_measured` are credited to ``owner``, and so is this thread's own CPU meanwhile (role ``harness``)."""
    previous = getattr(_OWNER, "ident", None)
    _OWNER.ident = owner
    before = thread_usage()
    try:
        yield
    finally:
        try:
            credit("harness", (thread_usage() - before).floor())
        finally:
            _OWNER.ident = previous


def run_measured(argv: list[str], *, role: str, timeout: float, text: bool = True, input: bytes | str | None = None,
                 stdin: Any = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``subprocess.run(argv, capture_output=True, timeout=timeout)``, and the child's usage credited under ``role``.

    ``input`` is fed to its stdin; otherwise ``stdin`` is passed on (None: this process's, as ``subprocess.run``
    does). ``pass_fds`` stay open in the child (a restore's inherited pipes).

    The child is waited for through a pidfd (no reaping until it is read):
    once it has exited its ``/proc/<pid>/io`` is read as a zombie, then
    ``wait4`` reaps it and gives its CPU seconds and faults, which include
    those of the children it reaped itself. Output goes through temporary
    files, so a chatty child cannot block on a full pipe. On a timeout the
    child is killed, reaped and credited, and :class:`subprocess.TimeoutExpired`
    is raised with what it wrote, as ``subprocess.run`` does. Where no pidfd
    can be had (a kernel before 5.3) the child runs unmeasured. The child runs
    in a process group of its own, and a Ctrl-C of the harness lets it end
    its step before the interrupt goes on (:func:`_finish`).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as feed:
        if input is not None:
            feed.write(input.encode() if isinstance(input, str) else input)
            feed.seek(0)
        timed_out = False
        # No Ctrl-C between the fork and ``proc`` (the child would run on, unknown), nor before it is reaped.
        with shielded():
            # A group of its own: a terminal's Ctrl-C, sent to the harness's group, reaches the harness only.
            proc = subprocess.Popen(argv, stdin=feed if input is not None else stdin, stdout=out, stderr=err,
                                    env=dict(env) if env is not None else None, cwd=cwd, pass_fds=pass_fds,
                                    process_group=0)
            try:
                with interruptible():
                    timed_out = _wait_measured(proc, timeout, role)
            finally:
                if proc.returncode is None:  # interrupted (Ctrl-C) before the child was reaped
                    _finish(proc, min(timeout, INTERRUPTED_STEP_S))

        def read(fh: Any) -> Any:
            fh.seek(0)
            data = fh.read()
            return data.decode(errors="replace") if text else data

        stdout, stderr = read(out), read(err)
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


# How long an interrupted harness waits for a tool's step (at most its own time limit): a CPU dump takes well under
# a second here; a CI runner's cancel sends SIGKILL seconds after its SIGTERM (GitHub's: 10 s).
INTERRUPTED_STEP_S = 8.0


def _finish(proc: subprocess.Popen, timeout: float) -> None:
    """Let an interrupted tool end its step, for ``timeout`` seconds at most, then kill it; returns once it is reaped.

    A tool killed half-way leaves on the host what it holds until its step ends: CRIU's network lock (an nftables
    table no later command names), a tree it stopped, a process the CUDA utility left locked."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_measured(proc: subprocess.Popen, timeout: float, role: str) -> bool:
    """Wait for ``proc`` (killing it after ``timeout`` seconds), reap it and credit its usage; True when it timed out."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return True
        return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(max(0, int(timeout * 1000)))
        if timed_out:
            # Not reaped yet: the pid is still this child's, whatever else runs meanwhile.
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            poller.poll()
        io = _io(f"/proc/{proc.pid}/io")  # a zombie's counters, its reaped children's included
        # Reaped and known as one step: the Popen object must know, or a wait on it after an interrupt (or its
        # finaliser) would wait for a pid that may be another process's by then.
        with shielded():
            try:
                _, status, ru = os.wait4(proc.pid, 0)
            except ChildProcessError:  # SIGCHLD ignored: nothing to reap, nothing measured (as subprocess takes it)
                proc.returncode = 0
                return timed_out
            proc.returncode = os.waitstatus_to_exitcode(status)
        credit(role, Usage.of_rusage(ru, wchar=io.get("wchar", 0), write_bytes=io.get("write_bytes")))
        return timed_out
    finally:
        os.close(pidfd)


# -- reading processes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcSample:
    """One read of one process (:meth:`ProcessReader.read`).

    ``usage``: the process with the children it reaped (``/proc/<pid>/stat``
    fields 10–17, ``/proc/<pid>/io``); ``cuda``: CPU seconds of each live
    thread whose name starts with ``cuda``, by thread id; ``gone``: the
    process had vanished and this is the last read of it.
    """

    pid: int
    start: int  # start time in clock ticks since boot (field 22): with the pid, one process
    usage: Usage
    cuda: Mapping[int, float] = field(default_factory=dict)
    gone: bool = False

    @property
    def key(self) -> tuple[int, int]:
        """Return ``(pid, start)``: a process, even where its pid is reused (a restore into the same pid)."""
        return self.pid, self.start


def _io(path: str) -> dict[str, int]:
    """The counters of a ``/proc/.../io`` file ({} where it cannot be read)."""
    try:
        with open(path) as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh if ":" in line)}
    except (OSError, ValueError):
        return {}


class ProcessReader:
    """Reads processes from ``/proc``, remembering the last read of each pid and the names of its threads."""

    def __init__(self) -> None:
        self._last: dict[int, ProcSample] = {}
        self._names: dict[tuple[int, int], str] = {}  # (pid, tid) -> thread name, read once per thread
        self._below: dict[int, list[int]] = {}  # root pid -> its descendants at its last full read (tree)

    def last(self, pid: int) -> ProcSample | None:
        """The last successful read of ``pid`` (None: never read)."""
        return self._last.get(pid)

    def read(self, pid: int, *, threads: bool = True, tight: bool = False) -> ProcSample | None:
        """Return ``pid`` now; the last read of it (``gone``) when it has vanished, None when it was never read. Never raises.

        ``threads``: also read its CUDA driver threads (:attr:`ProcSample.cuda`).
        ``tight``: a process read before is read as cheaply as can be (its
        stat and its known CUDA threads' stat; its I/O counters are the last
        read's), for stages that must follow each other closely.
        """
        try:
            sample = self._read(pid, threads, tight)
        except (OSError, ValueError, IndexError):
            last = self._last.get(pid)
            return replace(last, gone=True) if last is not None else None
        self._last[pid] = sample
        return sample

    def _read(self, pid: int, threads: bool, tight: bool) -> ProcSample:
        _, f = stat_fields(f"/proc/{pid}/stat")
        # Fields n are f[n - 3]: minflt 10, cminflt 11, majflt 12, cmajflt 13, utime 14, stime 15, cutime 16,
        # cstime 17, num_threads 20, starttime 22.
        start = int(f[19])
        last = self._last.get(pid) if tight else None
        known = last is not None and last.start == start
        if last is not None and known:
            written, chars = last.usage.write_bytes, last.usage.wchar
        else:
            io = _io(f"/proc/{pid}/io")
            written, chars = io.get("write_bytes", 0), io.get("wchar", 0)
        usage = Usage((int(f[11]) + int(f[13])) * TICK_S, (int(f[12]) + int(f[14])) * TICK_S,
                      int(f[7]) + int(f[8]), int(f[9]) + int(f[10]), written, chars)
        # A single-threaded process has no driver thread: its task list is not read.
        if not threads or int(f[17]) <= 1:
            cuda: dict[int, float] = {}
        elif last is not None and known:
            cuda = self._thread_times(pid, last.cuda)
        else:
            cuda = self._cuda_threads(pid)
        return ProcSample(pid, start, usage, cuda)

    def _cuda_threads(self, pid: int) -> dict[int, float]:
        """CPU seconds of each live thread of ``pid`` named ``cuda…``; only those threads' stat files are read."""
        try:
            tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return {}
        cuda = []
        for tid in tids:
            comm = self._names.get((pid, tid))
            if comm is None:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                        comm = self._names[(pid, tid)] = fh.read().strip()
                except OSError:
                    continue  # the thread ended between the listing and the read
            if comm.startswith(CUDA_THREAD_PREFIX):
                cuda.append(tid)
        return self._thread_times(pid, cuda)

    @staticmethod
    def _thread_times(pid: int, tids: Iterable[int]) -> dict[int, float]:
        """CPU seconds (utime + stime) of each of ``pid``'s threads ``tids`` that still runs."""
        out = {}
        for tid in tids:
            try:
                f = stat_fields(f"/proc/{pid}/task/{tid}/stat")[1]
                out[tid] = (int(f[11]) + int(f[12])) * TICK_S
            except (OSError, ValueError, IndexError):
                continue
        return out

    @staticmethod
    def children(pid: int) -> list[int]:
        """The live children ``pid``'s main thread started (``/proc/<pid>/task/<pid>/children``: a process's
        children are listed under the thread that forked them, and a workload starts its processes from its main
        thread); [] where the kernel offers no such file."""
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                return [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            return []

    def tree(self, pid: int, *, tight: bool = False) -> list[ProcSample]:
        """Return ``pid`` and its live descendants, one read each (a vanished root: its last read, without descendants).

        ``tight``: the descendants are those of the last full read of the tree (no ``children`` files are read),
        each read ``tight`` (:meth:`read`).
        """
        root = self.read(pid, tight=tight)
        if root is None:
            return []
        if root.gone:
            return [root]
        if tight and pid in self._below:
            return [root, *(s for s in (self.read(c, tight=True) for c in self._below[pid]) if s is not None and not s.gone)]
        out, todo, seen = [root], self.children(pid), {pid}
        while todo and len(out) < MAX_TREE:
            child = todo.pop()
            if child in seen:
                continue
            seen.add(child)
            sample = self.read(child)
            if sample is not None and not sample.gone:
                out.append(sample)
                todo += self.children(child)
        self._below[pid] = [s.pid for s in out[1:]]
        return out

    def thread_groups(self, pid: int) -> dict[str, float]:
        """CPU seconds of ``pid``'s live threads by group: ``cuda_threads`` (names starting with ``cuda``) and
        ``workload`` (every other thread); {} when it cannot be read."""
        groups: dict[str, float] = {}
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return groups
        for name in tids:
            try:
                comm, f = stat_fields(f"/proc/{pid}/task/{name}/stat")
            except (OSError, ValueError, IndexError):
                continue
            group = "cuda_threads" if comm.startswith(CUDA_THREAD_PREFIX) else "workload"
            groups[group] = groups.get(group, 0.0) + (int(f[11]) + int(f[12])) * TICK_S
        return groups


# -- one stage's figures -------------------------------------------------------------------------------------

# The receiver serves every trial of a run at once: each of its CPU-seconds goes to one stage only, the first of
# any trial to end after it was spent, so that the stages of trials run side by side add up (jobs > 1).
SHARED_ROLES = frozenset({"receiver"})
_CLAIMED: dict[tuple[int, int], Usage] = {}
_CLAIMED_LOCK = threading.Lock()


def _claim(key: tuple[int, int], start: Usage | None, now: Usage) -> Usage:
    """What of a shared process's usage between ``start`` (None: not read then) and ``now`` no stage claimed yet."""
    with _CLAIMED_LOCK:
        claimed = _CLAIMED.get(key)
        _CLAIMED[key] = now if claimed is None else claimed.maximum(now)
    base = claimed if start is None else (start if claimed is None else start.maximum(claimed))
    return now if base is None else (now - base).floor()


@dataclass
class Snapshot:
    """What :meth:`StageSampler.sample` read: processes by role (by :attr:`ProcSample.key`), the sampling
    thread's own usage and its ledger."""

    procs: dict[str, dict[tuple[int, int], ProcSample]]
    thread: Usage
    ledger: dict[str, Usage]


class StageSampler:
    """The CPU sampler of one trial's timeline (:class:`cutbench.harness.model.timeline.CpuSampler`).

    ``processes()`` gives the trial's current processes by role
    (``workload``, ``receiver``): pids, or :class:`cutbench.procs.Child`
    handles, whose ``returncode`` says the harness reaped them (their pid may
    be another process's by now: only the last read and ``rusage`` count) and
    whose ``rusage`` holds what ``wait4`` gave. Every workload process is
    followed to its descendants. Samples are taken in the stage's thread.
    """

    def __init__(self, processes: Callable[[], Mapping[str, Iterable[Any]]]):
        self._processes = processes
        self.reader = ProcessReader()

    def sample(self, extra_pids: Iterable[int] = (), *, tight: bool = False) -> Snapshot:
        """Read every process of the trial now (``extra_pids``: more workload processes, a restore's new one).

        ``tight``: for stages that must follow each other closely (one driver
        call per rank of a coordinated cut, ``Timeline.stage(marks=False)``):
        only the workload's CPU times and faults are read again, from the
        processes and CUDA threads its last full sample found; its bytes and
        the receiver's figures stay as they were (they count at the next full
        sample).
        """
        procs: dict[str, dict[tuple[int, int], ProcSample]] = {}
        roles = dict(self._processes())
        roles["workload"] = [*roles.get("workload", ()), *extra_pids]
        for role, members in roles.items():
            got: dict[tuple[int, int], ProcSample] = {}
            for member in members:
                for sample in self._member(member, role, tight):
                    got.setdefault(sample.key, sample)
            procs[role] = got
        # The thread's own figures last, so that reading /proc above is not counted as the stage's harness CPU.
        return Snapshot(procs, thread_usage(), credited())

    def _member(self, member: Any, role: str, tight: bool) -> list[ProcSample]:
        if isinstance(member, int) or getattr(member, "returncode", None) is None:
            pid = member if isinstance(member, int) else member.pid
            if role == "workload":  # followed to its descendants, its driver threads apart
                return self.reader.tree(pid, tight=tight)
            last = self.reader.last(pid)
            sample = last if tight and last is not None else self.reader.read(pid, threads=False)
            return [sample] if sample is not None else []
        pid = member.pid
        # Reaped: its last read, with the exact totals wait4 gave where the harness reaped it itself.
        last, ru = self.reader.last(pid), getattr(member, "rusage", None)
        if ru is None:
            return [replace(last, gone=True)] if last is not None else []
        base = last if last is not None else ProcSample(pid, -1, Usage())
        final = Usage.of_rusage(ru, wchar=base.usage.wchar, ticks=last is not None)
        return [replace(base, usage=final, gone=True)]

    def columns(self, before: Snapshot, after: Snapshot) -> dict[str, float | int]:
        """The stage's figures between two samples (:data:`~cutbench.harness.model.timeline.CPU_COLUMNS`):
        ``cpu_s`` (all roles), ``cpu_user_s``, ``cpu_sys_s``, one ``cpu_<role>_s`` per role, and ``minflt``,
        ``majflt``, ``write_bytes`` and ``wchar_bytes`` of every role together."""
        by_role: dict[str, Usage] = {}
        cuda = 0.0
        for role, now in after.procs.items():
            then = before.procs.get(role, {})
            total = Usage()
            for key, sample in now.items():
                old = then.get(key)
                if role in SHARED_ROLES:
                    total += _claim(key, old.usage if old is not None else None, sample.usage)
                    continue
                total += (sample.usage - old.usage).floor() if old is not None else sample.usage
                if role == "workload":
                    was = old.cuda if old is not None else {}
                    cuda += sum(max(t - was.get(tid, 0.0), 0.0) for tid, t in sample.cuda.items())
            by_role[role] = total
        harness = (after.thread - before.thread).floor()
        for role in set(after.ledger) | set(before.ledger):
            spent = (after.ledger.get(role, Usage()) - before.ledger.get(role, Usage())).floor()
            if role == "harness":
                harness += spent
            else:
                by_role[role] = by_role.get(role, Usage()) + spent
        by_role["harness"] = harness
        everything = sum(by_role.values(), Usage())
        workload = by_role.get("workload", Usage()).cpu_s
        cuda = min(cuda, workload)  # the threads' ticks and the process's are rounded apart
        cpu = {"workload": workload - cuda, "cuda_threads": cuda}
        cpu.update({r: by_role.get(r, Usage()).cpu_s for r in ROLES if r not in cpu})
        return {"cpu_s": everything.cpu_s, "cpu_user_s": everything.user_s, "cpu_sys_s": everything.sys_s,
                **{f"cpu_{r}_s": cpu[r] for r in ROLES},
                "minflt": everything.minflt, "majflt": everything.majflt, "write_bytes": everything.write_bytes,
                "wchar_bytes": everything.wchar}
