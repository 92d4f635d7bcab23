"""Process plumbing for the harness: subreaper, spawning, waiting, killing.

Workloads are spawned in their own session with all standard streams on
/dev/null: CRIU dumps a session leader without ``--shell-job``, and no pipe
or growing file ties the workload to the harness (a restored process would
need it back). The harness is a child subreaper, so a workload that CRIU
restores (``restore -d``, whose parent is the exiting criu) is re-parented to
the harness and can still be waited for.

A parallel run (``run.jobs`` > 1) starts each workload tree in a PID
namespace of its own (``spawn(..., pid_namespace=True)``): CRIU restores a
tree with the pids it had, and in the host's namespace another trial's new
process may hold one of them by then ("Can't fork … File exists"). The
workload is then the init of its namespace: CRIU dumps that namespace with
it and restores it as a new one, so the restored tree keeps its
namespace-local pids and gets new host pids. Inside, ``os.getpid()`` is the
namespace-local pid (the root is 1); ``Child.pid`` is always a host pid, and
``Child.host_pid`` maps a pid a workload wrote (``cut_pid``) to it. /proc
stays the host's (no mount namespace: CRIU would have to dump one too).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36

# Run as ``python -I -S -c _PID_NAMESPACE_INIT ARGV...`` (a fresh, single-threaded
# process: unshare and fork are safe there, unlike in the threaded harness):
# unshare the PID namespace, fork its init, give the init its own session
# (CRIU refuses a namespace whose init's session leader is outside it) and stdio
# on /dev/null, exec ARGV in it, print the init's host pid and exit. The init is
# then re-parented to the harness, the child subreaper.
_PID_NAMESPACE_INIT = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x20000000) != 0:  # CLONE_NEWPID
    sys.stdout.write("unshare(CLONE_NEWPID): " + os.strerror(ctypes.get_errno()))
    sys.exit(1)
pid = os.fork()
if pid == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
sys.stdout.write(str(pid))
"""


def become_subreaper() -> bool:
    """Make this process a child subreaper; return True on success."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def package_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``env`` (default: this process's environment) with this very cutbench on ``PYTHONPATH``.

    A process the harness starts (``python -m cutbench…``: a workload, a companion, the receiver) must run
    the code the harness runs, whatever its working directory: from a trial directory, an interpreter would
    otherwise find cutbench through the environment's own install, which may be another tree (a copied
    checkout whose virtual environment's editable install still points at the original). Any ``PYTHONPATH``
    entry is searched before an editable install's finder, so the folder that holds this cutbench is
    appended *last*: in a checkout it also holds the folders ``workloads`` and ``harness``, and a user's
    own packages of those names (earlier on ``PYTHONPATH``) must keep winning.
    """
    import cutbench

    out = dict(os.environ if env is None else env)
    root = str(cutbench.IMPORT_ROOT)
    out["PYTHONPATH"] = os.pathsep.join([*[p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != root], root])
    out[CHILD_MARK] = "1"  # what the leftovers sweep asks of a process before it kills it
    return out


# Set in the environment of every process the harness starts (package_env): a user's shell or pager that
# happens to work in a run's directory is not the harness's, and the sweep leaves it alone.
CHILD_MARK = "CUTBENCH_HARNESS_CHILD"


def spawn(argv: list[str], *, cwd: str, env: dict[str, str] | None = None, pid_namespace: bool = False,
          stdout: int | None = None, stderr: int | None = None) -> "Child":
    """Start ``argv`` in a new session with stdio on /dev/null; return its :class:`Child`.

    ``stdout``/``stderr``: a file descriptor to give it instead (the write end of a pipe the harness reads:
    a program judged from its output).

    The environment is ``env`` (default this process's) with this cutbench on ``PYTHONPATH``
    (:func:`package_env`). ``pid_namespace``: as the init of a new PID namespace (see the module
    docstring); the handle's ``pid`` is its host pid. Raises ``OSError`` when
    no namespace can be made here (it needs CAP_SYS_ADMIN, as CRIU does).
    """
    env = package_env(env)
    if pid_namespace:
        return _spawn_namespace_init(argv, cwd=cwd, env=env)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if stdout is None else stdout,
        stderr=subprocess.DEVNULL if stderr is None else stderr,
        start_new_session=True,
        close_fds=True,
    )
    # The Popen object is kept (never polled) until the pid is reaped, so that
    # subprocess's finaliser never reaps it behind our back, whoever holds the
    # Child (a backend's restore hands the pipeline only the pid).
    with _UNREAPED_LOCK:
        _UNREAPED[proc.pid] = proc
    return Child(pid=proc.pid)


def pid_namespace_error() -> str | None:
    """Why this process cannot start a workload in a PID namespace of its own (``spawn(pid_namespace=True)``),
    found by starting a throwaway one; None when it can."""
    try:
        spawn([sys.executable, "-c", ""], cwd="/", pid_namespace=True).wait(10)
    except OSError as exc:
        return str(exc)
    return None


def _spawn_namespace_init(argv: list[str], *, cwd: str, env: dict[str, str] | None) -> "Child":
    """``argv`` as the init of a new PID namespace (through ``_PID_NAMESPACE_INIT``); its :class:`Child`."""
    # The init outlives its launcher and is re-parented: only a subreaper gets it back to wait for.
    become_subreaper()
    launcher = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _PID_NAMESPACE_INIT, *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    out, _ = launcher.communicate()
    text = out.decode(errors="replace").strip()
    if launcher.returncode != 0 or not text.isdigit():
        raise OSError(f"cannot start {argv[0]} in a PID namespace of its own: {text or f'exit {launcher.returncode}'}")
    return Child(pid=int(text), pid_namespace=True)


# Popen objects of spawned processes not yet reaped (see spawn), by pid. Worker
# threads of a parallel run spawn and reap concurrently: the lock keeps it whole.
_UNREAPED: dict[int, subprocess.Popen] = {}
_UNREAPED_LOCK = threading.Lock()


def _reaped(pid: int, status: int) -> None:
    """``pid`` was reaped with ``status``: its Popen's finaliser has nothing left to do."""
    with _UNREAPED_LOCK:
        popen = _UNREAPED.pop(pid, None)
    if popen is not None:
        popen.returncode = status


@dataclass
class Child:
    """A process the harness must wait for: spawned by it or re-parented to it."""

    pid: int
    returncode: int | None = None
    history: list[int] = field(default_factory=list)  # earlier pids (before restores)
    # The process is the init of a PID namespace of its own (spawn(pid_namespace=True), or its restored copy).
    pid_namespace: bool = False
    # What ``wait4`` said of the process when this handle reaped it (CPU times and faults, its own reaped
    # children's included): its last figures, which /proc no longer has. None until then.
    rusage: Any = field(default=None, repr=False, compare=False)
    # Every process seen in its tree (:meth:`track`), by identity: a child that left its process group (a
    # session of its own, as a daemonised helper's) is killed and reaped with it all the same.
    members: set[str] = field(default_factory=set, repr=False, compare=False)

    def track(self) -> None:
        """Remember the processes of this handle's tree as they are now (:func:`tree`), whatever their session
        or group, so that :meth:`kill` takes them too: a tool about to image the tree calls it first, since the
        tree's links are gone once the tool has killed it."""
        self.members.update(tree(self.pid))

    def output_tail(self) -> str:
        """What the process wrote to stdout and stderr, where something kept it ("": a spawned process's stdio
        is /dev/null; a container's engine keeps its output)."""
        return ""

    def poll(self) -> int | None:
        """The exit status if it has exited (reaping it), else None."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Not our child (or already reaped elsewhere): alive iff signalable.
            if _alive(self.pid):
                return None
            self.returncode = -1
            return self.returncode
        if pid == 0:
            return None
        self.returncode, self.rusage = os.waitstatus_to_exitcode(status), usage
        _reaped(self.pid, self.returncode)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds; return the exit status or None."""
        deadline = time.monotonic() + timeout
        while True:
            rc = self.poll()
            if rc is not None or time.monotonic() >= deadline:
                return rc
            time.sleep(0.005)

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.poll() is None

    def peek(self) -> int | None:
        """The exit status once it has exited, without collecting it (a handle pointed at this pid later, as a
        restore's is, still gets it from :meth:`poll`); None while it runs."""
        if self.returncode is not None:
            return self.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None if _alive(self.pid) else -1
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def kill(self, timeout: float = 5.0) -> int | None:
        """SIGKILL the process, its process group and every process of its tree (:meth:`track`), then reap;
        return its status."""
        if self.returncode is None:
            self.track()
            for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
                try:
                    target()
                except (ProcessLookupError, PermissionError):
                    pass
        rc = self.wait(timeout)
        # A multi-process workload's children outlive it by a moment and are
        # then re-parented to us (the subreaper): reap them now, or their
        # zombies keep the pids a restore of the tree needs ("File exists").
        self.kill_groups()
        return rc

    def kill_groups(self, timeout: float = 2.0) -> None:
        """SIGKILL every process group this handle's pids have led, then reap those that are ours.

        A restore interrupted half-way (Ctrl-C while ``criu restore`` runs) can
        leave a restored process the handle does not know about: CRIU gives it
        the dumped pid, session and group back, so its group is one of ours
        even though this handle already reaped that pid once.

        The init of a PID namespace takes its namespace with it when it dies,
        and a restored copy has a new host pid: only the current group is
        killed (an earlier init's host pid may belong to another trial by
        now); :func:`kill_namespace_inits` removes a copy an interrupted
        restore left behind.
        """
        for pgid in ([self.pid] if self.pid_namespace else dict.fromkeys([self.pid, *self.history])):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    pid, status = os.waitpid(-pgid, os.WNOHANG)
                except ChildProcessError:
                    break  # nothing of that group is (any longer) our child
                if pid == 0:
                    time.sleep(0.005)
                else:
                    _reaped(pid, os.waitstatus_to_exitcode(status))
        # The tree's members in groups of their own (a child that called setsid): CRIU restores every pid it
        # dumped, so each must be gone, zombies reaped, before a restore, whatever its session.
        self.members = set(kill_and_reap(self.members, timeout))

    def replaced_by(self, pid: int) -> None:
        """Point this handle at a restored process ``pid``."""
        self.history.append(self.pid)
        self.pid = pid
        self.returncode = self.rusage = None


def process_tree(root: int) -> list[int]:
    """Return ``root`` and its descendants, parents before children, whatever their session or process group (from
    ``/proc/PID/task/TID/children``, as CRIU finds the tree it dumps); ``[root]`` when it is gone."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        try:
            tasks = sorted(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue  # gone: its children, if any, are re-parented and read elsewhere
        for task in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except (OSError, ValueError):
                continue  # gone while it was read
    return out


def tree(pid: int) -> set[str]:
    """The identities (:func:`identity`) of ``pid`` and of every descendant it has now (:func:`process_tree`), those
    that are still there."""
    found = set()
    for member in process_tree(pid):
        try:
            found.add(identity(member))
        except ProcessLookupError:
            continue
    return found


def kill_and_reap(members: set[str] | list[str], timeout: float = 2.0) -> list[str]:
    """SIGKILL each process :func:`identity` names in ``members`` that still runs, reap those that are (or
    become, as their parents die: this process is the subreaper) this process's children, and wait until
    none of them holds its pid any longer; return those that still did at the deadline."""
    left = list(members)
    for ident in left:
        if identity_alive(ident):
            try:
                os.kill(int(ident.split(":", 1)[0]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + timeout
    while left:
        for ident in left:
            pid = int(ident.split(":", 1)[0])
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got == pid:
                    _reaped(pid, os.waitstatus_to_exitcode(status))
            except ChildProcessError:
                pass  # not (yet) ours: its parent reaps it, or it is re-parented to us when that parent dies
        left = [ident for ident in left if holds_pid(ident)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return left


def holds_pid(ident: str) -> bool:
    """Whether the process :func:`identity` named still holds its pid: running, or a zombie not yet reaped."""
    try:
        return identity(int(ident.split(":", 1)[0])) == ident
    except (ProcessLookupError, ValueError):
        return False


def holder(pid: int) -> str:
    """The process that holds ``pid`` now, in words ("pid 5312 (python3 helper.py), a zombie, parent 5269"), or
    "" when none does."""
    try:
        name, fields = stat_fields(f"/proc/{pid}/stat")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    command = " ".join(a.decode(errors="replace") for a in argv if a) or name
    state = {"Z": ", a zombie", "T": ", stopped", "t": ", stopped by a tracer"}.get(fields[0], "")
    return f"pid {pid} ({command}){state}, parent {fields[1]}, session {fields[3]}"


def kill_namespace_inits(timeout: float = 2.0, *, cwd: str | Path | None = None) -> list[int]:
    """SIGKILL and reap every child of this process that lives in another PID namespace; return their pids.

    Those are workload trees' inits (``spawn(pid_namespace=True)`` and CRIU's
    restores of them). A restore interrupted or failed half-way can leave one
    whose host pid no handle knows. With ``cwd`` only those working in that
    directory (one trial's: safe while other trials run); without it every
    one (call it when no trial is running, as at the end of a parallel run).
    The receiver and CRIU itself live in this process's namespace and are
    never touched.
    """
    own = os.readlink("/proc/self/ns/pid")
    me = str(os.getpid())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] != me:
                continue
            if os.readlink(proc / "ns" / "pid") == own:
                continue
            if cwd is not None and os.readlink(proc / "cwd") != str(Path(cwd).resolve()):
                continue
        except (OSError, IndexError):
            continue
        found.append(int(proc.name))
    for pid in found:
        Child(pid=pid, pid_namespace=True).kill(timeout)
    return found


def processes_in(directory: str | Path, *, started_by_harness: bool = True) -> list[int]:
    """The pids of every process but this one whose working directory is ``directory`` or below it, and
    (``started_by_harness``) whose environment carries :data:`CHILD_MARK`.

    A trial's workload works in its trial directory, a restored one too (CRIU
    gives the working directory and the environment back), inside a PID
    namespace alike: what a harness killed outright left running is found by
    where it works and by the mark :func:`package_env` gave it.
    """
    root = str(Path(directory).resolve())
    mark = f"{CHILD_MARK}=1".encode()
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            where = os.readlink(proc / "cwd")
            if not (where == root or where.startswith(root + "/")):
                continue
            if started_by_harness and mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found.append(int(proc.name))
    return found


def kill_processes_in(directory: str | Path, timeout: float = 2.0, *, started_by_harness: bool = True) -> list[int]:
    """SIGKILL and reap every process that still works in ``directory`` (:func:`processes_in`; with
    ``started_by_harness``, only those the harness started): what of a trial escaped its tree (a helper that
    daemonised itself, a program that outlived its batch job); return their pids."""
    found = []
    for pid in processes_in(directory, started_by_harness=started_by_harness):
        try:
            found.append(identity(pid))
        except ProcessLookupError:
            continue
    kill_and_reap(found, timeout)
    return [int(ident.split(":", 1)[0]) for ident in found]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stat_fields(path: str | Path) -> tuple[str, list[str]]:
    """The name (field 2) and the fields after it (from 3 on) of a ``/proc/…/stat`` file; raises OSError when it
    cannot be read (the process is gone)."""
    head, _, rest = Path(path).read_text().rpartition(")")
    return head.partition("(")[2], rest.split()


def is_zombie_or_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie)."""
    try:
        return stat_fields(f"/proc/{pid}/stat")[1][0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError as exc:  # pragma: no cover - racy /proc reads
        return exc.errno == errno.ESRCH


def identity(pid: int | None = None) -> str:
    """Return ``"PID:STARTTIME"`` of a process (this one by default): its pid and its start time in clock ticks
    since boot (``/proc/PID/stat`` field 22), which together name one process for the machine's uptime
    (a pid alone may be reused). Raises :class:`ProcessLookupError` for a process that is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        start = stat_fields(f"/proc/{pid}/stat")[1][19]
    except (FileNotFoundError, IndexError):  # gone, or gone between the open and the read (an empty file)
        raise ProcessLookupError(pid) from None
    return f"{pid}:{start}"


def identity_alive(ident: str) -> bool:
    """Whether the process :func:`identity` named is still running (same pid, same start time, no zombie)."""
    try:
        pid = int(ident.split(":", 1)[0])
        return identity(pid) == ident and not is_zombie_or_gone(pid)
    except (ProcessLookupError, ValueError):
        return False
