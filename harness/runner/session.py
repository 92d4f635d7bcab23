"""A run's session: its receiver, its work directory, the subreaper, and one of each piece its trials share.

:class:`Session` is what every trial of a run is run in (serially, by worker threads, or one per process
under Ray); :meth:`Session.run_trial` hands each trial to its runner, the first of :data:`RUNNERS` that
runs its workload.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from cutbench.harness.model.trial import TrialRecord, TrialResult, TrialSpec
from cutbench.harness.nemesis import Backends
from cutbench.harness.runner.shared import (RECEIVER_RERUNS, ImageDiscards, ReceiverWatch, References,
                                            SupportLookup, ThreadResources)
from cutbench.procs import become_subreaper
from cutbench.workloads import api as workload_api


class Runner(Protocol):
    """One trial's runner, as a session uses it (:class:`~cutbench.harness.runner.trial.TrialRunner`)."""

    def run(self) -> TrialResult:
        """The trial run to its verdict."""

    def observe(self) -> tuple[TrialRecord, pd.DataFrame]:
        """The trial's record and effects, not judged (a control run's)."""


# The kinds of trial runner, filled by the runner package's __init__ (runner.program's for programs, runner.trial's
# for cutbench's workload classes: they import this module): Session.runner picks the first that runs a workload.
RUNNERS: list[Any] = []


class Session:
    """Run-level resources: the receiver and a work directory, the subreaper, and what the trials share.

    Use as a context manager; leaving it waits for the image removals, stops
    the receiver and removes the work directory, whatever happened inside.
    What the trials share is one piece per concern
    (:mod:`cutbench.harness.runner.shared`): :attr:`images` (background
    removal of cut images), :attr:`threads` (each trial thread's receiver
    client and backends), :attr:`references` (ground truth) and
    :attr:`support` (the support matrix). Several threads may run trials of
    one session at once (``run.jobs``). ``pid_namespace``: start each
    workload tree as the init of a PID namespace of its own where the backend
    declares that it copes (``pid_namespace`` on the class; see
    ``cutbench.procs``).
    """

    workdir_tag = ""  # in the work directory's name, after the run id

    def __init__(self, run_id: str, store: str = "sqlite", workdir: str | Path | None = None, *,
                 pid_namespace: bool = False, listen: str = "127.0.0.1:0", token: str | None = None,
                 backends: Backends | None = None):
        self.run_id = run_id
        # Where the receiver listens and the secret its clients present: loopback and none, unless trials run
        # on other machines (a Ray cluster), which reach it on a routable address that needs the token.
        self.listen = listen
        self.token = token
        self.store_spec = store
        self.pid_namespace = pid_namespace
        self._workdir_arg = workdir
        # What _open_receiver returns (a ReceiverHandle here, a stand-in for the driver's in a WorkerSession); None until __enter__.
        self.receiver: Any = None
        self.watch: ReceiverWatch | None = None
        self.images = ImageDiscards()
        self.backends = backends or Backends()  # the run's backends, resolved once (a fresh set when none is handed)
        self.threads = ThreadResources(self.backends)
        self.references = References()
        self.support = SupportLookup()

    def __enter__(self) -> "Session":
        become_subreaper()
        base = Path(self._workdir_arg) if self._workdir_arg else None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"cutbench-{self.run_id}-{self.workdir_tag}", dir=base))
        try:
            self.receiver = self._open_receiver()
            self.watch = self._watch_receiver()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _watch_receiver(self) -> ReceiverWatch | None:
        """Watch the receiver this session started (a worker session's is the driver's, watched there)."""
        return ReceiverWatch(self.receiver, on_lost=self.threads.give_up)

    def _open_receiver(self) -> Any:
        """Start the run's receiver on its store (``sqlite``: a file in the work directory); return its handle."""
        from cutbench.receivers.process import start_receiver

        self.store_url = f"sqlite:{self.workdir / 'receiver.sqlite'}" if self.store_spec == "sqlite" else self.store_spec
        return start_receiver(self.store_url, self.workdir, listen=self.listen, token=self.token,
                              allow_remote=self.token is not None)

    def __exit__(self, *exc: Any) -> None:
        try:
            self.images.drain()
        finally:  # a second Ctrl-C during the wait still stops the receiver and removes the work directory
            self.threads.close()
            if self.watch is not None:
                self.watch.close()
            if self.receiver is not None:
                self.receiver.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def control_client(self) -> Any:
        """This thread's client of the run's receiver (None before the receiver runs)."""
        if self.receiver is None:
            return None
        return self.threads.client(self.receiver.address, self.token)

    def effects(self, receiver_trial: str) -> pd.DataFrame:
        """The receiver's stored rows for one trial, read from the store (not the server's memory)."""
        from cutbench.receivers.stores import open_store

        store = open_store(self.store_url)
        try:
            return store.export(trial=receiver_trial)
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()

    def run_trial(self, spec: TrialSpec, attempt: int = 0) -> TrialResult:
        """Run one trial to its verdict and return its :class:`TrialResult`; never raises for a failing stage or
        workload. A trial during which the run's receiver died is run again, under a fresh receiver key, up to
        :data:`~cutbench.harness.runner.shared.RECEIVER_RERUNS` times (:class:`ReceiverWatch`); raises its
        ``ReceiverLost`` when the receiver cannot come back. ``attempt`` numbers a rerun the driver of a Ray run
        asked for (its receiver key is that attempt's)."""
        if self.watch is None:
            return self.runner(spec, attempt=attempt).run()
        for again in range(RECEIVER_RERUNS + 1):
            before = self.watch.check()
            result = self.runner(spec, attempt=again).run()
            if self.watch.check() == before:
                return result
            self.watch.rerun(spec.trial_id)
        return self.watch.spoiled(result)

    def runner(self, spec: TrialSpec, **kwargs: Any) -> Runner:
        """The runner of one trial of ``spec``: the first of :data:`RUNNERS` that runs its workload (cutbench's
        workload classes: :class:`~cutbench.harness.runner.trial.TrialRunner`; a program that knows nothing of
        cutbench: :class:`~cutbench.harness.runner.program.ProgramRunner`)."""
        cls = spec.workload_class()
        kind = next(r for r in RUNNERS if r.runs(cls))
        return kind(self, spec, workload=cls, **kwargs)

    def record_references(self, specs: Iterable[TrialSpec], jobs: int = 1, *, machine: dict[str, Any] | None = None,
                          keep: Callable[[str, workload_api.RecordedReference], None] | None = None) -> dict[str, str]:
        """Record the ground truth of the recorded-reference workloads among ``specs``; return ``{key: why not}``.

        See :meth:`~cutbench.harness.runner.shared.References.record`. Each
        control run is started as the harness starts any process, whatever
        the trials' backend (a container engine may not reach the GPU): the
        recording is of the workload, not of a tool.
        """
        def observe(clean: TrialSpec) -> tuple[TrialRecord, pd.DataFrame]:
            return self.runner(clean, plain_launch=True).observe()

        return self.references.record(specs, jobs, observe, machine=machine, keep=keep)
