"""How a run's trials are run: one :class:`Executor` per way, chosen once per run by :func:`choose_executor`.

- :class:`SerialExecutor`: the planned trials one after another, in this thread (to the first ``invalid`` one
  under ``run.stop_at_first_invalid``).
- :class:`ThreadExecutor`: ``run.jobs`` > 1 worker threads of the one session (one receiver serves them
  all); a worker takes the next spec in plan order.
- :class:`RayExecutor`: ``run.executor = "ray"``, each trial a Ray task in a fresh process of its own
  (:mod:`cutbench.harness.runner.ray_executor`); this process keeps the receiver.
- :class:`DriverExecutor`: an adaptive :data:`~cutbench.harness.runner.adaptive.Driver` (the
  ``hypothesis`` source) that decides each trial from the one before, one at a time.

Whatever runs the trials, this thread alone writes each trial's file as the trial finishes
(:class:`TrialLog`; files are named, and read, in plan order), so a parallel run stores what a serial run
of the same plans stores. An executor writes nothing else: ``run.py`` owns the run directory and
``run.toml``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.nemesis import Backends
from cutbench.harness.nemesis.base import optional
from cutbench.harness.environment import record as environment
from cutbench.harness.model.scenario import Scenario
from cutbench.harness.model.trial import TrialResult, TrialSpec
from cutbench.harness.runner.adaptive import Driver
from cutbench.harness.runner.session import Session
from cutbench.harness.runner.workers import Workers
from cutbench.harness.store.rundir import RunDir
from cutbench.harness.store.tables import trial_file
from cutbench.procs import kill_namespace_inits, pid_namespace_error

if TYPE_CHECKING:
    from cutbench.harness.runner.ray_executor import RayCluster

ProgressFn = Callable[[TrialResult, int, int], None]
LOOPBACK = "127.0.0.1:0"


# -- where finished trials go -------------------------------------------------


@dataclass
class TrialLog:
    """The run's finished trials: each one's file, written as it finishes, and the list the tables are made of.

    A trial counts exactly when its file is written, even when a Ctrl-C lands
    just after the write: a resumed run keeps the trials whose file is there,
    so the tables must say the same.
    """

    run: RunDir
    store: str  # the scenario's receiver store, recorded in each trial's file
    results: list[TrialResult]  # a resumed run's kept trials first, then this session's
    progress: ProgressFn | None = None
    total: int = 0  # the trials the progress display expects in all

    def write(self, result: TrialResult, count: Callable[[TrialResult], None]) -> None:
        """Write ``result``'s trial file and call ``count(result)`` once the file is there; returns None."""
        try:
            self.run.write_trial(result.spec.trial_id, trial_file(result, self.run.run_id, self.store))
        finally:  # even on a Ctrl-C here: the tables count a trial exactly when its file is there
            if self.run.trial_path(result.spec.trial_id).exists():
                count(result)

    def run_one(self, session: Session, spec: TrialSpec) -> TrialResult:
        """Run ``spec`` in ``session`` in this thread, keep it, report progress; return its :class:`TrialResult`."""
        result = session.run_trial(spec)
        self.write(result, self.results.append)
        if self.progress:
            self.progress(result, len(self.results), max(self.total, len(self.results)))
        return result

    def run_pool(self, pool: Any, n: int) -> None:
        """Run a pool's ``n`` trials (anything with ``run(on_result)`` and ``late``); returns None.

        ``on_result(plan position, result)`` comes in this thread as each trial
        finishes; the results join :attr:`results` in plan order. A finished
        trial is on disk at once, whatever happens to the run next; when the
        run stops early, every trial that finished is kept (an interrupted
        trial, as in a serial run, has no result).
        """
        finished: dict[int, TrialResult] = {}

        def keep(index: int, result: TrialResult) -> None:
            self.write(result, lambda r: finished.__setitem__(index, r))

        def on_result(index: int, result: TrialResult) -> None:
            keep(index, result)
            if self.progress:  # as trials finish: the whole run's count, whichever worker ran it
                self.progress(result, len(finished), n)

        try:
            pool.run(on_result)
        finally:
            try:
                # No trial runs now: a tree that an interrupted restore left has no handle; remove it.
                kill_namespace_inits()
                for index, result in pool.late.items():
                    keep(index, result)
            finally:  # whatever stopped the above: the tables hold every trial whose file is written
                self.results.extend(finished[i] for i in sorted(finished))


# -- the protocol -------------------------------------------------------------


class Executor(Protocol):
    """One way of running a run's trials. :func:`choose_executor` picks it before the run directory exists."""

    jobs: int  # trials at once: run.toml's ``jobs``, and how many control runs record references at once
    # The planned trials, in plan order (the recorded-reference step may drop some); None: a driver decides.
    specs: list[TrialSpec] | None
    # Whether the session's workload trees each start in a PID namespace of their own (trials side by side here).
    pid_namespaces: bool

    def receiver_exposure(self) -> tuple[str, str | None]:
        """Return where the run's receiver listens and the secret its clients present (None: no secret)."""
        ...

    def describe(self, session: Session | None = None) -> dict[str, Any]:
        """Return the top-level ``run.toml`` keys that say what ran the trials (empty for this process's own)."""
        ...

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Run the trials in ``session``, keeping each in ``log``; return more top-level ``run.toml`` keys."""
        ...

    def close(self) -> None:
        """Release what the executor holds (a Ray it started); returns None. Called once, however the run ends."""
        ...


class _Local:
    """What the executors that run trials in this process share: a loopback receiver, nothing to close."""

    jobs = 1
    pid_namespaces = False

    def receiver_exposure(self) -> tuple[str, str | None]:
        """Return the loopback address and no secret: every client is on this machine."""
        return LOOPBACK, None

    def describe(self, session: Session | None = None) -> dict[str, Any]:
        """Return no keys: ``run.toml``'s ``jobs`` says all there is."""
        return {}

    def close(self) -> None:
        """Nothing to release; returns None."""


class SerialExecutor(_Local):
    """The planned trials one after another in this thread (``run.jobs`` = 1, one trial, or
    ``run.stop_at_first_invalid``)."""

    def __init__(self, specs: list[TrialSpec], stop_at_first_invalid: bool = False):
        self.specs: list[TrialSpec] | None = specs
        self.stop_at_first_invalid = stop_at_first_invalid

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Run every spec in plan order, or up to the first ``invalid`` one (``run.stop_at_first_invalid``); return
        ``{"first_invalid": its 1-based number}`` for ``run.toml`` when it stopped there, else no keys (the number
        counts a resumed run's kept trials, which a serial run ran first)."""
        for spec in self.specs or ():
            if log.run_one(session, spec).verdict.outcome == "invalid" and self.stop_at_first_invalid:
                return {"first_invalid": len(log.results)}
        return {}


class ThreadExecutor(_Local):
    """An executor of ``jobs`` worker threads of the one session, taking the specs in plan order (see :class:`~cutbench.harness.runner.workers.Workers`).

    Each workload tree runs in a PID namespace of its own where the backend
    copes (``criu``; see ``cutbench.procs``): CRIU restores the pids a tree
    had, and another trial's process may hold one by then.
    """

    pid_namespaces = True

    def __init__(self, specs: list[TrialSpec], jobs: int):
        self.specs: list[TrialSpec] | None = specs
        self.jobs = jobs

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Run every spec on the worker threads; return no ``run.toml`` keys."""
        specs = self.specs or []
        log.run_pool(Workers(session, specs, self.jobs), len(specs))
        return {}


class DriverExecutor(_Local):
    """An adaptive driver, called as ``driver(run_one, run)``: it decides each trial from the one before."""

    specs: list[TrialSpec] | None = None

    def __init__(self, driver: Driver):
        self.driver = driver

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Let the driver run its trials one at a time; return the ``run.toml`` keys it returns."""
        return self.driver(lambda spec: log.run_one(session, spec), log.run) or {}


class RayExecutor:
    """Each trial a Ray task in a fresh process of its own; this process runs no trial, only the receiver.

    The cluster is connected before the run directory exists (no run without
    Ray) and closed when the run ends: a Ray this run started stops, so its
    processes do not outlive the trials.
    """

    pid_namespaces = False  # this process's session runs no workload; each trial's process asks for its own

    def __init__(self, cluster: "RayCluster", specs: list[TrialSpec], jobs: int, scenario: Scenario,
                 workdir: str | Path | None):
        self.cluster = cluster
        self.specs: list[TrialSpec] | None = specs
        self.jobs = jobs
        self.trials_per_gpu = scenario.trials_per_gpu
        self.store = scenario.store
        self.workdir = workdir
        self.listen, self.token = cluster.receiver_exposure()

    @classmethod
    def connect(cls, scenario: Scenario, specs: list[TrialSpec], workdir: str | Path | None) -> "RayExecutor":
        """Connect to (or start) the scenario's Ray; return the executor. :class:`Unavailable` without Ray."""
        from cutbench.harness.runner.ray_executor import RayCluster

        cluster = RayCluster.connect(scenario.ray_address)
        cap = cluster.capacity(scenario.trials_per_gpu) if scenario.jobs == "auto" else int(scenario.jobs)
        return cls(cluster, specs, max(1, min(cap, len(specs))), scenario, workdir)

    def receiver_exposure(self) -> tuple[str, str | None]:
        """Return the receiver's address and secret: loopback and none on one node, routable with one on several."""
        return self.listen, self.token

    def describe(self, session: Session | None = None) -> dict[str, Any]:
        """Return ``executor = "ray"`` and the ``ray`` table; with ``session``, where the trials reached its receiver."""
        table = self.cluster.describe(self.trials_per_gpu)
        if session is not None:
            table.update(receiver=session.receiver.address, receiver_token=self.token is not None)
        return {"executor": "ray", "ray": table}

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Run every spec as a Ray task, at most ``jobs`` at once; return no more ``run.toml`` keys."""
        specs = self.specs or []
        pool = self.cluster.trials(specs, self.jobs, run_id=session.run_id, receiver=session.receiver.address,
                                   store=self.store, workdir=self.workdir, trials_per_gpu=self.trials_per_gpu,
                                   token=self.token, recordings=session.references.recordings,
                                   supports={b: session.support.of(b) for b in {s.backend for s in specs}})
        pool.watch = session.watch  # the receiver is this driver's: a trial it died during runs again
        log.run_pool(pool, len(specs))
        return {}

    def close(self) -> None:
        """Shut down a Ray this run started (or only disconnect); returns None."""
        self.cluster.close()


class SlurmExecutor:
    """Each trial a task of one Slurm job array, in a fresh process of its own (see
    :mod:`~cutbench.harness.runner.slurm_executor`); this process runs no trial, only the receiver."""

    pid_namespaces = False  # this process's session runs no workload; each trial's process asks for its own

    def __init__(self, specs: list[TrialSpec], jobs: int, scenario: Scenario, workdir: str | Path | None,
                 nodes: dict[str, int]):
        self.specs: list[TrialSpec] | None = specs
        self.jobs = jobs
        self.store = scenario.store
        self.workdir = workdir
        self.nodes = nodes

    @classmethod
    def connect(cls, scenario: Scenario, specs: list[TrialSpec], workdir: str | Path | None,
                backends: Backends) -> "SlurmExecutor":
        """Check the cluster and the specs; return the executor. :class:`Unavailable` without a cluster whose
        nodes are this machine; :class:`InvalidArgument` for the ``slurm`` backend, whose preemptor would take
        the node its own trial's task holds."""
        from cutbench.harness.runner.slurm_executor import local_nodes

        for name in sorted({s.backend for s in specs}):
            if optional(backends.new(name), "output_files"):
                raise InvalidArgument(f"run.executor = \"slurm\" with backend {name!r}: its preemption needs the "
                                      "node its own trial's task holds; run its trials with --executor threads")
        nodes = local_nodes()
        cap = sum(nodes.values()) if scenario.jobs == "auto" else int(scenario.jobs)
        if cap > 1:
            check_pid_namespaces(specs, backends)
        return cls(specs, max(1, min(cap, len(specs))), scenario, workdir, nodes)

    def receiver_exposure(self) -> tuple[str, str | None]:
        """Return the receiver's address and secret: this machine's loopback (the nodes are this machine), none."""
        return LOOPBACK, None

    def describe(self, session: Session | None = None) -> dict[str, Any]:
        """Return ``executor = "slurm"`` and the ``slurm`` table (its cluster, nodes, tasks at once)."""
        from cutbench.harness.provision import slurm as cluster

        return {"executor": "slurm", "slurm": {"cluster": cluster.which_cluster(), "nodes": self.nodes,
                                               "jobs": self.jobs}}

    def run(self, session: Session, log: TrialLog) -> dict[str, Any]:
        """Run every spec as a task of one job array, at most ``jobs`` at once; return ``slurm_reruns`` for
        ``run.toml`` (the tasks submitted again: lost, or run while the receiver died)."""
        from cutbench.harness.runner.slurm_executor import SlurmTrials
        from cutbench.harness.runner.trial_worker import requests_for

        specs = self.specs or []
        base = {"run_id": session.run_id, "receiver": session.receiver.address, "token": None, "store": self.store,
                "workdir": str(self.workdir) if self.workdir else None, "pid_namespace": self.jobs > 1, "node": None}
        requests = requests_for(specs, base, session.references.recordings,
                                {b: session.support.of(b) for b in {s.backend for s in specs}})
        pool = SlurmTrials(requests, specs, self.jobs, Path(session.workdir) / "slurm-array", session.run_id)
        pool.watch = session.watch  # the receiver is this driver's: a trial it died during runs again
        log.run_pool(pool, len(specs))
        return {"slurm_reruns": pool.reruns}

    def close(self) -> None:
        """Nothing to close: the array's tasks are over (or cancelled) when :meth:`run` returns."""


def choose_executor(scenario: Scenario, work: "list[TrialSpec] | Driver", env: dict[str, Any], *,
                    workdir: str | Path | None = None, backends: Backends | None = None) -> Executor:
    """Return the executor for ``work`` (the planned specs, or a driver) under ``scenario``'s ``run`` table.

    ``env`` is the run's environment record (its GPUs, for ``run.jobs =
    "auto"``). Raises :class:`Unavailable` before anything is written when
    the chosen way cannot run here: no Ray, or trials side by side that need
    PID namespaces this process cannot make.
    """
    if not isinstance(work, list):  # a driver decides trial by trial: one at a time, in this process
        return DriverExecutor(work)
    if scenario.stop_at_first_invalid:  # each trial decides whether the next runs: one at a time, in this process
        return SerialExecutor(work, stop_at_first_invalid=True)
    if scenario.executor == "ray":
        return RayExecutor.connect(scenario, work, workdir)
    if scenario.executor == "slurm":
        return SlurmExecutor.connect(scenario, work, workdir, backends or Backends())
    jobs = max(1, min(resolve_jobs(scenario, env), len(work)))
    if jobs == 1:
        return SerialExecutor(work)
    check_pid_namespaces(work, backends or Backends())
    return ThreadExecutor(work, jobs)


def resolve_jobs(scenario: Scenario, env: dict[str, Any] | None = None) -> int:
    """Return how many trials ``scenario`` runs at once here: ``run.jobs``, or for "auto"
    the GPUs × ``run.trials_per_gpu`` on a GPU host and the CPUs this process
    may use elsewhere. ``env`` is the run's environment record (its GPU list)."""
    if scenario.jobs != "auto":
        return int(scenario.jobs)
    gpus = environment.gpu_count(env if env is not None else environment.collect())
    if gpus:
        return gpus * scenario.trials_per_gpu
    return len(os.sched_getaffinity(0)) or 1


def check_pid_namespaces(specs: Iterable[TrialSpec], backends: Backends) -> None:
    """Return None, or raise :class:`Unavailable` when a parallel run needs PID namespaces (an arm's
    backend declares ``pid_namespace``) and this process cannot make one."""
    names = sorted({s.backend for s in specs})
    if not any(backends.declares(n, "pid_namespace") for n in names):
        return
    error = pid_namespace_error()
    if error:
        raise Unavailable(f"run.jobs > 1: each trial's workload needs a PID namespace of its own (CRIU restores the pids "
                          f"a tree had, and another trial's process may hold one by then), and none can be made here "
                          f"({error}): run as root, as CRIU needs, or with --jobs 1")
