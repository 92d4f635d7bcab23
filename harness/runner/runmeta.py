"""What ``run.toml`` says of a run (:class:`RunMeta`), and a stored run being continued (:class:`Resumed`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cutbench.harness.environment import record as environment
from cutbench.harness.model.scenario import Scenario
from cutbench.harness.model.trial import TrialResult
from cutbench.harness.runner.executors import Executor
from cutbench.harness.store.rundir import RunDir


# Keys of a resumed run's record that describe an end it has not reached again.
STALE_ON_RESUME = ("n_trials", "finished", "duration_s", "report_error")


@dataclass
class RunMeta:
    """What ``run.toml`` says of a run: built in one place (:meth:`start`), rendered in one (:meth:`render`).

    The runner sets its fields as the run goes (the executor's keys once the
    receiver runs, arms that cannot be judged, a driver's keys, the end) and
    writes :meth:`render` through the run directory.
    """

    run_id: str
    run_dir: str
    started: float
    cutbench_version: str
    code_digest: str
    scenario: dict[str, Any]
    environment: dict[str, Any]
    skipped_arms: list[dict[str, str]]
    n_trials_planned: int | None
    arms_planned: list[str]
    jobs: int
    swept: list[str] = field(default_factory=list)  # what the sweep removed of killed runs before this one
    executor: dict[str, Any] = field(default_factory=dict)  # what ran the trials (Ray: ``executor``, ``ray``)
    extra: dict[str, Any] = field(default_factory=dict)  # the caller's keys (a sweep's axes) and a driver's
    # What each backend of the run declared (Backends.record): the store and the reports read it from here.
    backends: dict[str, Any] = field(default_factory=dict)
    status: str = "running"
    finished: float | None = None
    duration_s: float | None = None
    n_trials: int | None = None
    # A resumed run: its stored record, which stays, and what this harness adds to its ``resumes``.
    resumed: dict[str, Any] | None = None
    resumes_entry: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, run: RunDir, scenario: Scenario, env: dict[str, Any], executor: Executor, *,
              skipped: list[dict[str, str]], planned: int | None, swept: list[str], extra: dict[str, Any],
              resume: "Resumed | None", backends: dict[str, Any] | None = None) -> "RunMeta":
        """Return the record of a run about to start (or to resume), status ``running``."""
        if executor.specs is not None:  # the whole plan: a resumed run's kept trials and those still to run
            every = [*(r.spec for r in resume.done), *executor.specs] if resume is not None else executor.specs
            planned = len(every)
            arms_planned = list(dict.fromkeys(s.arm.label() for s in sorted(every, key=lambda s: s.index)))
        else:
            arms_planned = list(extra.get("arms_planned", []))
        meta = cls(run_id=run.run_id, run_dir=str(run.path), started=time.time(),
                   cutbench_version=environment.cutbench_version(), code_digest=environment.code_digest(),
                   scenario=scenario.to_dict(), environment=env, skipped_arms=skipped, n_trials_planned=planned,
                   arms_planned=arms_planned, jobs=executor.jobs, swept=swept, executor=executor.describe(),
                   extra=dict(extra), backends=dict(backends or {}))
        if resume is not None:
            meta.started = float(resume.meta["started"])
            meta.resumed = resume.meta
            # executor.specs is a list here: resume_run hands one (an adaptive search cannot resume).
            meta.resumes_entry = {"at": time.time(), "kept": len(resume.done), "to_run": len(executor.specs or []),
                                  **({"swept": swept} if swept else {})}
        return meta

    def finish(self, *, complete: bool, n_trials: int) -> None:
        """Mark the run ended (``complete`` or ``partial``) with ``n_trials`` stored; returns None."""
        self.status = "complete" if complete else "partial"
        self.finished = time.time()
        self.duration_s = time.time() - self.started
        self.n_trials = n_trials

    def render(self) -> dict[str, Any]:
        """Return the ``run.toml`` document.

        A resumed run keeps its own record; this harness updates what it
        planned and adds an entry to ``resumes`` (with what its sweep removed).
        """
        if self.resumed is None:
            out = {"run_id": self.run_id, "run_dir": self.run_dir, "status": self.status, "started": self.started,
                   "cutbench_version": self.cutbench_version, "code_digest": self.code_digest,
                   "scenario": self.scenario, "environment": self.environment, "skipped_arms": self.skipped_arms,
                   "n_trials_planned": self.n_trials_planned, "arms_planned": self.arms_planned, "jobs": self.jobs,
                   **({"swept": self.swept} if self.swept else {}), **({"backends": self.backends} if self.backends
                                                                        else {}), **self.executor, **self.extra}
        else:
            out = {k: v for k, v in self.resumed.items() if k not in STALE_ON_RESUME}
            out.update(status=self.status, skipped_arms=self.skipped_arms, n_trials_planned=self.n_trials_planned,
                       arms_planned=self.arms_planned, jobs=self.jobs, run_dir=self.run_dir,
                       resumes=[*self.resumed.get("resumes", []), self.resumes_entry])
            out.update(self.extra)  # what this session adds (its executor's keys: first_invalid; receiver restarts)
            receiver = {k: v for k, v in (self.executor.get("ray") or {}).items() if k in ("receiver", "receiver_token")}
            if receiver:  # where this session's trials reached its receiver, in the run's own ray table
                out["ray"] = {**(out.get("ray") or {}), **receiver}
        if self.finished is not None:
            out.update(finished=self.finished, duration_s=self.duration_s, n_trials=self.n_trials)
        return out


@dataclass
class Resumed:
    """A stored run being continued: its directory, its ``run.toml`` and the trials it finished."""

    run: RunDir
    meta: dict[str, Any]
    done: list[TrialResult]
