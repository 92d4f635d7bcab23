"""A program's system calls, from the harness's side: start it waiting, trace it, hold it at a boundary.

:class:`Tracer` runs :mod:`cutbench.harness.observer.tracer` (a process of its own) on a program that
:func:`waiting_command` started waiting, and reads what it says: every counted call (the boundaries, which the
uninterrupted runs record), and, for a cut of phase ``syscall``, that it holds the program just before its k-th
counted call. The runner then hands the program over to the tool (:meth:`Tracer.freeze`: the whole tree in a
group stop, the tracer gone) and lets it go on as the fault says (:meth:`Tracer.release`). Nothing of the
tracer stays in the program: it only ever ptrace-attached and opened the kernel's counters on it, and it closes
those and detaches.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cutbench.errors import HarnessFault
from cutbench.harness.model.boundaries import Boundary
from cutbench.procs import Child, package_env, process_tree, spawn

# The program's command behind this: it waits on a fifo (its first argument) before it becomes the program, so
# that the tracer seizes it before its first call. Its pid is the program's (``exec``). A fifo, not a SIGSTOP of
# its own: in a container the wrapper is the init of a PID namespace, which cannot stop itself.
WRAPPER = ("sh", "-c", 'read _ < "$0"; exec "$@"')
START_FIFO = ".cutbench-start"  # in the program's directory (in its container too)
# How long a started program may take to wait for its start, and the tracer to seize it or to let it go.
START_S = 10.0


def waiting_command(command: Sequence[str], directory: str | Path) -> list[str]:
    """Return ``command`` behind :data:`WRAPPER`, waiting on a fifo made in ``directory`` until :meth:`Tracer.start`."""
    fifo = Path(directory) / START_FIFO
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    return [*WRAPPER, str(fifo), *command]


def unavailable_reason() -> str | None:
    """Why this machine cannot trace a program's system calls (with the fix), or None: tried on a throwaway one."""
    if platform.machine() != "x86_64":
        return (f"tracing a program's system calls needs an x86-64 machine (this one is {platform.machine()}): the "
                "tracer rewinds a thread onto its `syscall` instruction; use plan.phases without \"syscall\"")
    scratch = tempfile.mkdtemp(prefix="cutbench-trace-")
    probe = spawn(waiting_command(["sh", "-c", "echo traced > out"], scratch), cwd=scratch)
    tracer = None
    try:
        tracer = Tracer(probe, calls=("write",), directory=scratch, stop_at=0)
        tracer.start()
        probe.wait(START_S)
        if not tracer.wait_ended(START_S):
            return "the tracer did not finish tracing `sh -c 'echo traced > out'` within 10 s"
        if tracer.error:
            return (f"{tracer.error} (ptrace needs root or CAP_SYS_PTRACE, and kernel.yama.ptrace_scope < 3; "
                    "PTRACE_GET_SYSCALL_INFO needs Linux >= 5.3)")
        if not tracer.boundaries:
            return "the tracer counted no call of `sh -c 'echo traced > out'` (its write to a file of its directory)"
        return None
    except HarnessFault as exc:
        return exc.reason
    finally:
        if tracer is not None:
            tracer.close()
        probe.kill()
        shutil.rmtree(scratch, ignore_errors=True)


class Tracer:
    """The tracer process on one start of a program (see the module docstring).

    ``calls``: the names that count (``plan.syscalls``); ``directory``: the program's, whose files count;
    ``stop_at``: hold it before that counted call (0: only record); ``count_from``: calls counted before.
    """

    def __init__(self, child: Child, *, calls: Sequence[str], directory: str | Path, stop_at: int = 0,
                 count_from: int = 0, attached: bool = False, hold_tid: int = 0, stops: bool = False):
        self.child = child
        self.calls, self.directory, self.stop_at, self.count_from = tuple(calls), str(directory), stop_at, count_from
        self.attached = attached  # the program itself, stopped at its held call (a restored copy): see rehold
        self.hold_tid = hold_tid  # with attached: the thread whose call is held (the others' pass)
        self.only_stops = stops  # count at a stop of every call, without the kernel's counters
        self.held_tid = 0  # the thread held at the boundary
        self.boundaries: list[Boundary] = []
        self.held: Boundary | None = None
        self.error = ""
        self.frozen = False
        self.released = False
        # How it counts: "counters" (the kernel's, stopping a thread only after a call whose name counts, until
        # near the held call) or "stops" (a stop at every call); and how many stops the program made.
        self.mode = ""
        self.stops = 0
        self._seized = threading.Event()
        self._held = threading.Event()
        self._done = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self.pid = child.pid

    def start(self) -> None:
        """Start the tracer on the waiting program, and once it has seized it, let it become the program; raise
        :class:`HarnessFault` when the tracer cannot (the program gone, ptrace refused)."""
        argv = [sys.executable, "-m", "cutbench.harness.observer.tracer", "--pid", str(self.pid),
                "--calls", ",".join(self.calls), "--dir", self.directory, "--stop-at", str(self.stop_at),
                "--count-from", str(self.count_from), *(["--attached"] if self.attached else []),
                *(["--hold-tid", str(self.hold_tid)] if self.hold_tid else []),
                *(["--stops"] if self.only_stops else []),
                # CUTBENCH_TRACER_LOG (a directory): each tracer appends every stop it sees to a file there.
                *(["--log", str(Path(log) / f"tracer-{self.pid}{'-again' if self.attached else ''}.log")]
                  if (log := os.environ.get("CUTBENCH_TRACER_LOG")) else [])]
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=package_env(), start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"cutbench-tracer-{self.pid}", daemon=True)
        self._reader.start()
        if not self._seized.wait(START_S) or self.error or self._done.is_set():
            self.close()
            raise HarnessFault("trace", f"the tracer could not seize the program (pid {self.pid}): "
                                        f"{self.error or self._stderr()}")
        if self.attached:
            return
        fifo = Path(self.directory) / START_FIFO
        deadline = time.monotonic() + START_S
        while True:
            try:
                descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # once the wrapper has it open to read
                break
            except OSError as exc:
                if self._done.is_set() or time.monotonic() > deadline:
                    self.close()
                    raise HarnessFault("trace", f"the program (pid {self.pid}) does not wait on {fifo}: {exc}") from None
                time.sleep(0.001)
        try:
            os.write(descriptor, b"\n")
        finally:
            os.close(descriptor)
            fifo.unlink(missing_ok=True)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if "error" in said:
                self.error = str(said["error"])
            elif "seized" in said:
                self._seized.set()
            elif "held" in said:
                self.held = Boundary.from_dict(said)
                self.held_tid = int(said.get("tid") or 0)
                self._held.set()
            elif "mode" in said:
                self.mode = str(said["mode"])
            elif "frozen" in said:
                self.frozen = bool(said["frozen"])
                self.stops = int(said.get("stops") or 0)
            elif "ended" in said:
                self.stops = int(said.get("stops") or 0)
            elif "n" in said:
                self.boundaries.append(Boundary.from_dict(said))
        self._done.set()
        self._held.set()  # whoever waits for the hold learns it will not come
        self._seized.set()

    def wait_held(self, timeout: float) -> bool:
        """Whether the program is held at the boundary (within ``timeout`` s); False when it is not (yet): the
        tracer ended (the program made fewer calls), or the time ran out."""
        self._held.wait(timeout)
        return self.held is not None

    def wait_ended(self, timeout: float) -> bool:
        """Whether the tracer ended within ``timeout`` s (it reads no more)."""
        return self._done.wait(timeout)

    def _command(self, word: str) -> None:
        """Send the held tracer ``word`` and wait for it to detach; raise :class:`HarnessFault` when it does not."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(word + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        if not self.wait_ended(START_S):
            raise HarnessFault("trace", f"the tracer did not {word} the program (pid {self.pid}) within {START_S:g} s")

    def freeze(self) -> None:
        """Hand the held program over to a tool: its whole tree stopped (a group stop), the tracer detached and
        gone. Once; later calls do nothing."""
        if self.held is None or self.frozen or self.released:
            return
        self._command("freeze")
        if not self.frozen:
            raise HarnessFault("trace", f"the tracer ended without stopping the program (pid {self.pid}): "
                                        f"{self.error or self._stderr()}")

    def rehold(self, pid: int) -> "Tracer":
        """Continue the frozen program ``pid`` (a restored copy, or the original a tool let run on), its threads
        running again, and hold its held thread at its call once more; return the tracer that holds it now.

        A GPU tool's CUDA restore is served by the program's CUDA threads, which a group stop stops (the CUDA
        lock likewise): between its CRIU half and its CUDA half the program is let go but for the thread held
        at the boundary, which re-enters its call first and is held there. Raises :class:`HarnessFault` when it
        cannot be held again."""
        if not self.frozen or self.held is None:
            raise HarnessFault("trace", f"pid {pid} is not a program frozen at a system call")
        # The same thread (CRIU restores its tid): the program's other threads ran on while it was held, and their
        # calls come after the boundary.
        again = Tracer(Child(pid=pid), calls=self.calls, directory=self.directory, stop_at=self.held.n,
                       count_from=self.held.n - 1, attached=True, hold_tid=self.held_tid)
        again.start()
        for member in process_tree(pid):
            try:
                os.kill(member, signal.SIGCONT)
            except OSError:
                pass
        if not again.wait_held(START_S):
            ended = again.wait_ended(0)
            again.close()
            why = again.error or ("its threads were gone before it" if ended else
                                  f"its thread {self.held_tid} made no counted call within {START_S:g} s")
            raise HarnessFault("trace", f"the program (pid {pid}) was not held at its call again: {why}")
        return again

    def release(self, target: Child) -> None:
        """Let the program go on: continue ``target``'s tree (the original, or a restored copy, which a tool
        restored stopped) when frozen, else detach the tracer from it (the held call runs now). Never raises."""
        if self.frozen:
            for pid in process_tree(target.pid):
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
            return
        if self.held is not None and not self.released:
            self.released = True
            try:
                self._command("release")
            except HarnessFault:
                pass

    def _stderr(self) -> str:
        if self._proc is None or self._proc.stderr is None or self._proc.poll() is None:
            return "no word from it"
        return (self._proc.stderr.read() or "no word from it").strip()[-500:]

    def close(self) -> None:
        """End the tracer, which lets what it still traces run on, and wait for it."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()  # it disables its counters and detaches: none of their signals reaches the program
            try:
                self._proc.wait(START_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self._reader is not None:
            self._reader.join(2.0)
