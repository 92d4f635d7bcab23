"""Run the receiver as a separate OS process, as the harness does once per run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.procs import package_env

from .protocol import TOKEN_ENV
from .server import check_exposure


class ReceiverHandle:
    """A running receiver process: its address, pid and lifecycle controls.

    ``stop`` terminates cleanly (SIGTERM, then SIGKILL), ``kill`` is SIGKILL
    (the kill test's fault), ``restart`` starts a new process on the same store
    and the same address. Both always reap the process. Use as a context
    manager to stop it on exit.
    """

    def __init__(self, store_url: str, workdir: Path, listen: str, token: str | None, timeout: float,
                 allow_remote: bool = False):
        self.store_url = store_url
        self.workdir = workdir
        self.token = token
        self.timeout = timeout
        self.allow_remote = allow_remote
        self.log_path = workdir / "receiver.log"
        self.ready_path = workdir / "receiver.ready"
        self.address = ""
        self.starts = 0
        self._proc: subprocess.Popen | None = None
        self._start(listen)

    @property
    def pid(self) -> int:
        """The current server process id (changes on restart)."""
        if self._proc is None:
            raise Unavailable("receiver process is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the server process exists and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def _start(self, listen: str) -> None:
        self.ready_path.unlink(missing_ok=True)
        env = package_env()  # the child must import this very package, whatever the caller's cwd is
        env.pop(TOKEN_ENV, None)
        if self.token:
            env[TOKEN_ENV] = self.token  # not on the command line, where ps would show it
        cmd = [sys.executable, "-m", "cutbench.receivers", "serve", "--store", self.store_url, "--listen", listen,
               "--ready-file", str(self.ready_path), "--exit-with", str(os.getpid())]
        if self.allow_remote:
            cmd.append("--allow-remote")
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True, close_fds=True)
        self.starts += 1
        deadline = time.monotonic() + self.timeout
        while True:
            if self.ready_path.exists():
                self.address = self.ready_path.read_text().strip()
                if self.address:
                    return
            rc = self._proc.poll()
            if rc is not None:
                self._proc = None
                raise Unavailable(f"receiver exited with status {rc} before listening; log {self.log_path}:\n"
                                  + self.log_tail())
            if time.monotonic() > deadline:
                self.kill()
                raise Unavailable(f"receiver did not listen within {self.timeout}s; log {self.log_path}:\n"
                                  + self.log_tail())
            time.sleep(0.005)

    def exited(self) -> int | None:
        """The server's exit status if it has died (it is reaped here), else None (running, or stopped by us)."""
        if self._proc is None:
            return None
        return self._proc.poll()

    def revive(self) -> int | None:
        """Start a new server on the same store and address after this one died; return the dead one's exit
        status. Raises ``Unavailable`` (with its log) when the new one does not listen."""
        rc = self.stop()
        self._start(self.address)
        return rc

    def log_tail(self, n: int = 2000) -> str:
        """The last ``n`` bytes of the server's log."""
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the server leads its own session and group
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 5) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; reap. Returns the exit status (None if not running)."""
        if self._proc is None:
            return None
        proc = self._proc
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        rc = proc.wait()
        self._proc = None
        return rc

    def kill(self) -> None:
        """SIGKILL the server (no clean shutdown) and reap it."""
        if self._proc is None:
            return
        self._signal(signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Stop the server if it runs, then start it again on the same store and address."""
        self.stop()
        self._start(self.address)

    def __enter__(self) -> "ReceiverHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid}" if self._proc else "stopped"
        return f"ReceiverHandle({self.store_url!r}, address={self.address!r}, {state})"


def start_receiver(store_url: str, workdir: Path, listen: str = "127.0.0.1:0", token: str | None = None,
                   timeout: float = 10, *, allow_remote: bool = False) -> ReceiverHandle:
    """Start ``python -m cutbench.receivers serve`` as its own process and wait until it listens.

    Returns a ``ReceiverHandle`` whose ``address`` is the actual listen address
    (``127.0.0.1:PORT`` or ``unix:PATH``). The log goes to
    ``workdir/receiver.log``. Raises ``Unavailable`` if the server exits or does
    not listen within ``timeout`` seconds, ``InvalidArgument`` for bad arguments.
    """
    workdir = Path(workdir)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
    check_exposure(listen, token, allow_remote)  # fail here, not in a child's log
    workdir.mkdir(parents=True, exist_ok=True)
    return ReceiverHandle(store_url, workdir, listen, token, float(timeout), allow_remote)
