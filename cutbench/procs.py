"""Process plumbing for the harness: subreaper, spawning, waiting, killing.

Workloads are spawned in their own session with all standard streams on
/dev/null: CRIU dumps a session leader without ``--shell-job``, and no pipe
or growing file ties the workload to the harness (a restored process would
need it back). The harness is a child subreaper, so a workload that CRIU
restores (``restore -d``, whose parent is the exiting criu) is re-parented to
the harness and can still be waited for.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process a child subreaper; return True on success."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def spawn(argv: list[str], *, cwd: str, env: dict[str, str] | None = None) -> "Child":
    """Start ``argv`` in a new session with stdio on /dev/null; return its :class:`Child`."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    # The Popen object is kept (never polled) until the pid is reaped, so that
    # subprocess's finaliser never reaps it behind our back, whoever holds the
    # Child (a backend's restore hands the pipeline only the pid).
    _UNREAPED[proc.pid] = proc
    return Child(pid=proc.pid)


# Popen objects of spawned processes not yet reaped (see spawn), by pid.
_UNREAPED: dict[int, subprocess.Popen] = {}


def _reaped(pid: int, status: int) -> None:
    """``pid`` was reaped with ``status``: its Popen's finaliser has nothing left to do."""
    popen = _UNREAPED.pop(pid, None)
    if popen is not None:
        popen.returncode = status


@dataclass
class Child:
    """A process the harness must wait for: spawned by it or re-parented to it."""

    pid: int
    returncode: int | None = None
    history: list[int] = field(default_factory=list)  # earlier pids (before restores)

    def poll(self) -> int | None:
        """The exit status if it has exited (reaping it), else None."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Not our child (or already reaped elsewhere): alive iff signalable.
            if _alive(self.pid):
                return None
            self.returncode = -1
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
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

    def kill(self, timeout: float = 5.0) -> int | None:
        """SIGKILL the process and its process group, then reap; return its status."""
        if self.returncode is None:
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
        """
        for pgid in dict.fromkeys([self.pid, *self.history]):
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

    def replaced_by(self, pid: int) -> None:
        """Point this handle at a restored process ``pid``."""
        self.history.append(self.pid)
        self.pid = pid
        self.returncode = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_zombie_or_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError as exc:  # pragma: no cover - racy /proc reads
        return exc.errno == errno.ESRCH
