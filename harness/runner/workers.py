"""The worker threads of a parallel run (``run.jobs`` > 1, :class:`~cutbench.harness.runner.executors.ThreadExecutor`).

:class:`Workers` runs a run's specs on ``jobs`` threads of the one session, each taking the next spec in plan
order and handing each result back to the harness thread that writes it; Ctrl-C reaches every worker.
:class:`ExclusiveGate` lets a trial whose workload needs the GPU to itself (``exclusive_gpu``) run alone.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator

from cutbench import interrupts
from cutbench.harness.model.trial import TrialResult, TrialSpec
from cutbench.harness.runner.session import Session
from cutbench.workloads import api as workload_api


def _needs_gpu_alone(spec: TrialSpec) -> bool:
    """Whether ``spec``'s workload declares that it needs the GPUs to itself (``exclusive_gpu``: it fills their memory)."""
    return bool(workload_api.optional(spec.workload_class(), "exclusive_gpu"))


class ExclusiveGate:
    """Trials share the machine, except one that needs it alone: it waits until no trial runs, and none
    starts while it does (a readers-writer lock; waiting exclusive trials go first)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        """Run the ``with`` body as a shared trial, or alone when ``exclusive``; yields nothing."""
        with self._cond:
            if exclusive:
                self._waiting += 1
                try:
                    self._wait(lambda: self._running == 0 and not self._exclusive)
                finally:
                    self._waiting -= 1
                self._exclusive = True
            else:
                self._wait(lambda: not self._exclusive and not self._waiting)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if exclusive:
                    self._exclusive = False
                self._cond.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> None:
        # In short waits: a Ctrl-C reaches a worker thread only when it runs Python code.
        while not ready():
            self._cond.wait(0.2)


class Workers:
    """A pool of ``jobs`` threads running the specs of one session, taking them in plan order.

    Results come back to the thread that calls :meth:`run`. A KeyboardInterrupt
    (Ctrl-C) there is raised in every worker that is inside a trial, where it
    does what it does in a serial run: the trial cleans up its processes and
    image directory and gives no result. :meth:`run` re-raises it once every
    worker has stopped; trials that finished meanwhile are in :attr:`late`.
    """

    def __init__(self, session: Session, specs: list[TrialSpec], jobs: int):
        self.session = session
        self.todo: deque[tuple[int, TrialSpec]] = deque(enumerate(specs))
        self.n = len(specs)
        self.done: queue.Queue[tuple[int, TrialResult | None, BaseException | None]] = queue.Queue()
        self.busy: set[int] = set()  # thread idents of the workers inside a trial
        self.interrupted: set[int] = set()  # workers already sent their KeyboardInterrupt
        self.lock = threading.Lock()  # ``busy`` and a result's hand-over change together
        self.stopping = False
        self.late: dict[int, TrialResult] = {}
        self.gate = ExclusiveGate()
        self.threads = [threading.Thread(target=self._work, name=f"cutbench-trials-{k + 1}", daemon=True)
                        for k in range(jobs)]

    def run(self, on_result: Callable[[int, TrialResult], None]) -> None:
        """Run every spec, calling ``on_result(plan position, result)`` in this thread as each finishes; returns None."""
        for thread in self.threads:
            thread.start()
        try:
            for _ in range(self.n):
                index, result, error = self._next()
                if error is not None:  # the harness's own failure: stop, as a serial run stops at it
                    raise error
                if result is not None:
                    on_result(index, result)
        except BaseException:
            self._interrupt()
            self._join()
            raise
        if self._join():
            raise KeyboardInterrupt  # pressed while the last trials finished

    def _next(self) -> tuple[int, TrialResult | None, BaseException | None]:
        while True:
            try:
                return self.done.get(timeout=0.2)  # wakes up: Ctrl-C is seen here at once
            except queue.Empty:
                if not any(t.is_alive() for t in self.threads) and self.done.empty():
                    raise RuntimeError("every trial worker stopped before the run was done") from None

    def _work(self) -> None:
        me = threading.get_ident()
        try:
            while not self.stopping:
                try:
                    index, spec = self.todo.popleft()
                except IndexError:
                    return
                with self.lock:
                    self.busy.add(me)
                # Checked after joining ``busy``: an interrupt either sees this worker busy or is seen here.
                if self.stopping:
                    return
                item: tuple[int, TrialResult | None, BaseException | None] = (index, None, None)
                # The interrupt reaches the trial only (it cleans up and gives no verdict): a trial that finished
                # is handed over whenever it comes, and it is raised here after the hand-over.
                with interrupts.shielded():
                    try:
                        with interrupts.interruptible(), self.gate.hold(_needs_gpu_alone(spec)):
                            item = (index, self.session.run_trial(spec), None)
                    except KeyboardInterrupt:
                        pass  # interrupted: no verdict, unless it came as the finished trial was handed back
                    except Exception as exc:
                        item = (index, None, exc)
                    # Leaving ``busy`` and handing the result over are one step under the lock that
                    # :meth:`_interrupt` takes.
                    with self.lock:
                        self.busy.discard(me)
                        self.done.put(item)
        except KeyboardInterrupt:
            pass  # the interrupt reached this worker between two trials
        finally:
            with self.lock:
                self.busy.discard(me)

    def _interrupt(self) -> None:
        """Stop taking specs; raise KeyboardInterrupt, once, in every worker inside a trial."""
        self.stopping = True
        with self.lock:
            # A second interrupt in a worker already cleaning up its trial would cut that cleanup short.
            for ident in self.busy - self.interrupted:
                self.interrupted.add(ident)
                interrupts.interrupt(ident)  # held while it cleans up (cutbench.interrupts)

    def _join(self) -> bool:
        """Wait for every worker and keep what finished unread; True when Ctrl-C came meanwhile."""
        pressed = False
        for thread in self.threads:
            while thread.is_alive():
                try:
                    thread.join()
                except KeyboardInterrupt:
                    # Leaving the workers would leave their processes: stop them and keep waiting.
                    pressed = True
                    self._interrupt()
        while not self.done.empty():
            index, result, _ = self.done.get()
            if result is not None:
                self.late[index] = result
        return pressed
