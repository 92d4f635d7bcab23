"""A whole run: a scenario becomes trial specs, one session runs them, the store keeps them.

``run_scenario`` is the front door (it picks the plan source); ``execute``
runs a list of specs, or an adaptive :data:`Driver`, in one
:class:`~cutbench.harness.runner.trial.Session` and writes the run directory
through :class:`~cutbench.harness.store.rundir.RunDir`, the only writer.

With ``run.jobs`` > 1 a list of specs runs on that many worker threads of the
one session (one receiver serves them all); the plans are built before any
runs, a worker takes the next spec in plan order, and this thread alone
writes each trial's file as the trial finishes (files are named, and read,
in plan order) and the tables in plan order, so a parallel run stores what a
serial run of the same plans stores. Each
workload tree runs in a PID namespace of its own where the backend copes
(``criu``; see ``cutbench.procs``). The adaptive ``hypothesis`` source
decides each trial from the one before: it runs one trial at a time.

With ``run.executor = "ray"`` a list of specs runs as Ray tasks instead
(:mod:`cutbench.harness.runner.ray_executor`), each trial in a fresh process
of its own; this process keeps the receiver and still writes everything.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness import nemesis as checkpointers
from cutbench.harness.environment import leftovers
from cutbench.harness.environment import record as environment
from cutbench.harness.generator.scheduler import build_specs
from cutbench.harness.generator.search import search_arms
from cutbench.harness.generator.sweep import Axis, expand
from cutbench.harness.model.scenario import PROFILES, Arm, Scenario
from cutbench.harness.model.trial import TrialResult, TrialSpec
from cutbench.harness.reports import html as report
from cutbench.harness.reports import summary
from cutbench.harness.reports.summary import render_search
from cutbench.harness.runner.adaptive import Driver, hypothesis_driver
from cutbench.harness.runner.trial import Session
from cutbench.harness.store.rundir import RunDir, as_stored, read_matrix
from cutbench.harness.store.tables import certificate_rows, result_from_file, trial_file, trial_row
from cutbench.procs import kill_namespace_inits, pid_namespace_error
from cutbench.workloads import api as workload_api


# -- a whole run -------------------------------------------------------------


@dataclass
class RunOutcome:
    """What a run produced: its directory, its trials table, and whether it completed."""

    run: RunDir
    trials: pd.DataFrame
    complete: bool
    skipped_arms: list[dict[str, str]] = field(default_factory=list)

    def exit_code(self) -> int:
        """DESIGN.md's exit codes: 0 all valid (or refused), 1 invalid found, 2 unknown only."""
        from cutbench.errors import EXIT_INVALID, EXIT_UNKNOWN_ONLY, EXIT_VALID

        if self.trials.empty:
            return EXIT_UNKNOWN_ONLY
        outcomes = set(self.trials["outcome"])
        if "invalid" in outcomes:
            return EXIT_INVALID
        if "unknown" in outcomes:
            return EXIT_UNKNOWN_ONLY
        return EXIT_VALID


def check_backends(scenario: Scenario) -> tuple[list[Arm], list[dict[str, str]]]:
    """Split the scenario's arms into runnable ones and skipped ones (with the reason).

    Raises :class:`Unavailable` when a backend cannot run and the scenario does
    not allow skipping (``pipeline.skip_unavailable``).
    """
    reasons: dict[str, str | None] = {}
    faults: dict[str, frozenset[str] | None] = {}
    for name in scenario.backends:
        try:
            backend = checkpointers.get(name)
            reasons[name] = backend.unavailable_reason()
            faults[name] = backend.capabilities.faults
        except Unavailable as exc:
            reasons[name] = str(exc)
            faults[name] = None
    # A workload that needs what this machine lacks (a GPU) skips every arm.
    workload_reason = workload_api.unavailable_reason(workload_api.load(scenario.workload), scenario.array)
    runnable, skipped = [], []
    for arm in scenario.arms():
        reason = workload_reason or reasons[arm.backend]
        offered = faults[arm.backend]
        if offered is not None and arm.fault not in offered:
            # Not a failure: e.g. the in-place `cuda` backend has no CPU image to restore after a kill.
            skipped.append({"arm": arm.label(), "reason": f"backend {arm.backend!r} does not support fault {arm.fault!r}"})
            continue
        if reason is None:
            runnable.append(arm)
        elif scenario.skip_unavailable:
            skipped.append({"arm": arm.label(), "reason": reason})
        elif workload_reason:
            raise Unavailable(f"workload {scenario.workload!r} cannot run here: {reason}")
        else:
            raise Unavailable(f"backend {arm.backend!r} cannot run here: {reason}")
    return runnable, skipped


ProgressFn = Callable[[TrialResult, int, int], None]


def run_scenario(
    scenario: Scenario,
    results_root: str | Path = "results",
    *,
    progress: ProgressFn | None = None,
    workdir: str | Path | None = None,
) -> RunOutcome:
    """Run every trial of ``scenario`` and store the results; return the :class:`RunOutcome`.

    Ctrl-C (KeyboardInterrupt) stops after cleaning up the trial in flight;
    what finished is stored and the run is marked ``partial``.
    """
    if scenario.plan_source == "hypothesis":
        return run_hypothesis(scenario, results_root, progress=progress, workdir=workdir)
    specs, skipped = variant_specs([(v.variant, v) for v in scenario.variants] or [("", scenario)])
    return execute(scenario, specs, results_root, skipped=skipped, progress=progress, workdir=workdir)


def run_hypothesis(
    scenario: Scenario,
    results_root: str | Path,
    *,
    progress: ProgressFn | None = None,
    workdir: str | Path | None = None,
) -> RunOutcome:
    """Run the ``hypothesis`` plan source over the scenario's arms; return the :class:`RunOutcome`.

    Writes ``search.json`` (per arm: trials, first failure, minimal failing
    plan, reproduced or flaky) and appends a search section to ``summary.md``.
    """
    if scenario.profile not in PROFILES:
        raise InvalidArgument(f"plan.profile = {scenario.profile!r}: allowed {', '.join(PROFILES)}")
    if workload_api.records_reference(workload_api.load(scenario.workload)):
        raise InvalidArgument(f"plan.source = 'hypothesis' with workload {scenario.workload!r}: its ground truth is "
                              "recorded before the trials, which the adaptive search does not do yet; use plan.source = "
                              "'exhaustive' or 'random'")
    arms, skipped = check_backends(scenario)
    sarms = search_arms(scenario, arms)
    outcome = execute(scenario, hypothesis_driver(scenario, sarms), results_root, skipped=skipped,
                      progress=progress, workdir=workdir, planned=len(sarms) * scenario.trials,
                      extra_meta={"arms_planned": [s.arm.label() for s in sarms]})
    search = outcome.run.meta().get("search")
    if search:
        summary = outcome.run.path / "summary.md"
        text = summary.read_text() if summary.exists() else ""
        outcome.run.write_text("summary.md", text.rstrip("\n") + "\n\n" + render_search(search, outcome.run.path) + "\n")
    return outcome


def variant_specs(points: list[tuple[str, Scenario]]) -> tuple[list[TrialSpec], list[dict[str, str]]]:
    """The trial specs of several resolved scenarios run as one run, each labelled
    with its variant name, and the arms skipped here (labelled likewise)."""
    specs: list[TrialSpec] = []
    skipped: list[dict[str, str]] = []
    for variant, scenario in points:
        arms, skipped_here = check_backends(scenario)
        skipped += [{**s, "arm": f"{variant} {s['arm']}".strip()} for s in skipped_here]
        specs += [replace(s, variant=variant) for s in build_specs(scenario, arms, start_index=len(specs))]
    return specs, skipped


def execute(
    scenario: Scenario,
    specs: "list[TrialSpec] | Driver",
    results_root: str | Path,
    *,
    skipped: list[dict[str, str]] | None = None,
    progress: ProgressFn | None = None,
    workdir: str | Path | None = None,
    name: str | None = None,
    extra_meta: dict[str, Any] | None = None,
    planned: int | None = None,
    mark_latest: bool = True,
    resume: "Resumed | None" = None,
) -> RunOutcome:
    """Run ``specs`` in one session and write the run directory; return the :class:`RunOutcome`.

    ``resume`` continues a stored run instead of making a new one: its
    finished trials are kept, ``specs`` are the ones still to run, and the
    tables are written over all of them (see :func:`resume_run`).

    ``extra_meta`` adds top-level keys to ``run.toml`` (a sweep records its axes there).
    ``specs`` is a list, or a :data:`Driver` that decides trial by trial (the
    adaptive ``hypothesis`` source): it is called as ``driver(run_one, run)``
    and may return more top-level keys for ``run.toml``; ``planned`` is then
    the number of trials the progress display expects. A list runs on
    ``scenario.jobs`` workers (see the module docstring); ``progress`` is
    called in this thread as each trial finishes.
    """
    env = environment.collect()
    # Read before any run directory exists: a support matrix that is not there is a bad argument, nothing half-written.
    support_matrix = read_matrix(scenario.support_matrix) if scenario.support_matrix else None
    # What runs whose harness was killed left behind (containers, image directories, receivers) goes first.
    swept = leftovers.sweep()
    cluster = None
    if isinstance(specs, list) and scenario.executor == "ray":
        from cutbench.harness.runner.ray_executor import RayCluster

        cluster = RayCluster.connect(scenario.ray_address)  # before the run directory: no run without Ray
        cap = cluster.capacity(scenario.trials_per_gpu) if scenario.jobs == "auto" else int(scenario.jobs)
        jobs = max(1, min(cap, len(specs)))
    else:
        jobs = max(1, min(resolve_jobs(scenario, env), len(specs))) if isinstance(specs, list) else 1
    if jobs > 1 and cluster is None and isinstance(specs, list):  # jobs > 1: a list (a driver runs one at a time)
        check_pid_namespaces(specs)
    try:
        run = RunDir.create(results_root, name or scenario.name) if resume is None else resume.run
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    started = time.time() if resume is None else float(resume.meta["started"])
    every = ([*(r.spec for r in resume.done), *specs] if resume is not None else specs) if isinstance(specs, list) else []
    if isinstance(specs, list):
        planned = len(every)
        arms_planned = list(dict.fromkeys(Arm(**s.arm).label() for s in sorted(every, key=lambda s: s.index)))
    else:
        arms_planned = list((extra_meta or {}).get("arms_planned", []))
    meta = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "status": "running",
        "started": started,
        "cutbench_version": environment.cutbench_version(),
        "code_digest": environment.code_digest(),
        "scenario": scenario.to_dict(),
        "environment": env,
        "skipped_arms": skipped or [],
        "n_trials_planned": planned,
        "arms_planned": arms_planned,
        "jobs": jobs,
        **({"swept": swept} if swept else {}),
        **({"executor": "ray", "ray": cluster.describe(scenario.trials_per_gpu)} if cluster is not None else {}),
        **(extra_meta or {}),
    }
    if resume is not None:  # the run's own record stays; what this harness adds is said under `resumes`
        meta = {**resume.meta, **{k: meta[k] for k in ("status", "skipped_arms", "n_trials_planned", "arms_planned", "jobs")},
                "run_dir": str(run.path),
                # specs is a list here: resume_run hands one (an adaptive search cannot resume).
                "resumes": [*resume.meta.get("resumes", []), {"at": time.time(), "kept": len(resume.done),
                                                               "to_run": len(specs),  # type: ignore[arg-type]
                                                               **({"swept": swept} if swept else {})}]}
        for stale in ("n_trials", "finished", "duration_s", "report_error"):  # the end this run has not reached again
            meta.pop(stale, None)
    run.write_meta(meta)
    results: list[TrialResult] = list(resume.done) if resume is not None else []
    complete = False
    total = planned or 0
    try:
        # Under Ray this process runs no trial: its session is the receiver and the work directory.
        listen, token = cluster.receiver_exposure() if cluster is not None else ("127.0.0.1:0", None)
        images_dirs = {s.images_dir for s in specs} if isinstance(specs, list) else {scenario.images_dir}
        with Session(run.run_id, scenario.store, workdir=workdir, pid_namespace=jobs > 1 and cluster is None,
                     listen=listen, token=token) as session, \
                leftovers.claim(run.run_id, images_dirs=images_dirs, workdir=session.workdir,
                                receiver_pid=session.receiver.pid if session.receiver is not None else None):
            if cluster is not None:  # where the trials reached the receiver (run.toml's ray table)
                meta["ray"].update(receiver=session.receiver.address, receiver_token=token is not None)
            session.support_matrix = support_matrix
            session.driver = str((env.get("gpu") or {}).get("driver_version") or "")
            session.criu_version = str((env.get("criu") or {}).get("version") or "")
            if resume is not None:  # judged by the references the run recorded, as its first trials were
                session.recordings.update({k: workload_api.RecordedReference.from_dict(d) for k, d in run.references().items()})
            if isinstance(specs, list):
                specs, unjudgeable = record_references(session, specs, jobs, run, env)
                if unjudgeable:  # said up front, in run.toml: these trials are not run
                    meta["skipped_arms"] = skipped = [*(skipped or []), *unjudgeable]
                    meta["n_trials_planned"] = planned = total = len(specs) + len(results)
                    run.write_meta(meta)

            def run_one(spec: TrialSpec) -> TrialResult:
                result = session.run_trial(spec)
                try:
                    run.write_trial(spec.trial_id, trial_file(result, run.run_id, scenario.store))
                finally:  # even on a Ctrl-C here: the tables count a trial exactly when its file is there
                    if run.trial_path(spec.trial_id).exists():
                        results.append(result)
                if progress:
                    progress(result, len(results), max(total, len(results)))
                return result

            if cluster is not None and isinstance(specs, list):
                pool = cluster.trials(specs, jobs, run_id=run.run_id, receiver=session.receiver.address,
                                      store=scenario.store, workdir=workdir, trials_per_gpu=scenario.trials_per_gpu,
                                      token=token, recordings=session.recordings,
                                      supports={b: session.support(b) for b in {s.backend for s in specs}})
                _run_parallel(session, specs, jobs, run, scenario.store, results, progress, pool=pool)
            elif jobs > 1 and isinstance(specs, list):
                _run_parallel(session, specs, jobs, run, scenario.store, results, progress)
            elif isinstance(specs, list):
                for spec in specs:
                    run_one(spec)
            else:
                meta.update(specs(run_one, run) or {})
        complete = True
    except KeyboardInterrupt:
        complete = False
    finally:
        if cluster is not None:
            cluster.close()  # a Ray this run started stops here: its processes do not outlive the trials
        frame = store_run(run, results, meta, complete=complete, started=started, mark_latest=mark_latest)
    return RunOutcome(run, frame, complete, skipped or [])


@dataclass
class Resumed:
    """A stored run being continued: its directory, its ``run.toml`` and the trials it finished."""

    run: RunDir
    meta: dict[str, Any]
    done: list[TrialResult]


# Scenario fields that do not change what a trial is: a resumed run may differ in them.
NOT_TRIAL_FIELDS = frozenset({"source_path", "jobs", "executor", "ray_address"})


def resume_refusal(meta: dict[str, Any], *, code_digest: str, fingerprint: dict[str, Any],
                   scenario: Scenario | None = None) -> str | None:
    """Why the run whose ``run.toml`` is ``meta`` cannot be continued here, or None when it can.

    Pure: the caller gives this machine's :func:`~cutbench.harness.environment.record.code_digest`
    and :func:`~cutbench.harness.environment.record.fingerprint`, and the scenario the user named
    (None: the run's own). A trial made by other code, on another machine or from another scenario
    would not be the trial an uninterrupted run makes, so the resumed run could not equal one.
    """
    status = meta.get("status")
    if status == "complete":
        return "the run is complete: nothing to resume"
    if meta.get("sweep"):
        return "it is a sweep (`cutbench sweep`); resuming a sweep is not supported: run the sweep again"
    stored = meta.get("scenario") or {}
    if stored.get("plan_source") == "hypothesis":
        return ("its plan source is hypothesis, whose next trial depends on the verdicts of the ones before: "
                "run it again")
    if not meta.get("code_digest"):
        return "run.toml has no code_digest (the run was made before `--resume` existed), so its code is unknown"
    if meta["code_digest"] != code_digest:
        return (f"the code differs: the run was made by cutbench sources with digest {meta['code_digest'][:12]}…, "
                f"this one has {code_digest[:12]}… (a changed harness or workload may change trials)")
    then = environment.fingerprint(meta.get("environment") or {})
    if then != fingerprint:
        changed = sorted(k for k in set(then) | set(fingerprint) if then.get(k) != fingerprint.get(k))
        return "the machine differs: " + ", ".join(f"{k} was {then.get(k)!r}, is {fingerprint.get(k)!r}" for k in changed)
    if stored.get("store", "sqlite") != "sqlite":
        return (f"its receiver store ({stored.get('store')!r}) outlives the run and still holds the killed attempt's "
                "deliveries, which the trials run again would be judged with: resume needs receiver.store = 'sqlite'")
    if meta.get("matrix"):
        return "it is a support-matrix run (`cutbench matrix`): run the matrix again"
    if scenario is not None:
        now, then = _trial_fields(as_stored(scenario.to_dict())), _trial_fields(stored)
        for key in sorted(set(now) | set(then)):
            if now.get(key) != then.get(key):
                return f"the scenario differs from the run's: {key} was {then.get(key)!r}, is {now.get(key)!r}"
    return None


def _trial_fields(scenario: dict[str, Any]) -> dict[str, Any]:
    """A stored scenario without the fields that change no trial, in its variants too."""
    out = {k: v for k, v in scenario.items() if k not in NOT_TRIAL_FIELDS}
    if out.get("variants"):
        out["variants"] = [_trial_fields(v) for v in out["variants"]]
    return out


def resume_run(path: str | Path, *, scenario: Scenario | None = None, progress: ProgressFn | None = None,
               workdir: str | Path | None = None, jobs: int | str | None = None) -> RunOutcome:
    """Continue the partial or interrupted run at ``path`` with its own scenario, plan and seeds; return the
    :class:`RunOutcome` of the whole run.

    Every trial whose file is in ``trials/`` is kept (a file is written whole or not at all); the rest
    run in this session, into the same directory, and the tables are written over all of them in plan
    order, as an uninterrupted run writes them. :class:`InvalidArgument` (nothing run, nothing written)
    says why a run cannot be continued: see :func:`resume_refusal`; also a harness still running it.
    """
    run = RunDir.open(path)
    meta = run.meta()
    live = leftovers.live_harness(str(meta.get("run_id", run.run_id)))
    if live:
        raise InvalidArgument(f"{run.path}: cannot resume: harness {live} is still running this run")
    why = resume_refusal(meta, code_digest=environment.code_digest(), fingerprint=environment.fingerprint(environment.collect()),
                         scenario=scenario)
    if why:
        raise InvalidArgument(f"{run.path}: cannot resume: {why}")
    stored = Scenario.from_dict(meta["scenario"])
    if scenario is not None:  # how the trials run is the user's to choose now; what they are is the run's
        stored = replace(stored, **{k: getattr(scenario, k) for k in ("jobs", "executor", "ray_address")})
    if jobs is not None:  # how many at once does not change a trial (a parallel run stores what a serial one does)
        stored = replace(stored, jobs=jobs)
    run.references()  # a damaged recorded reference is named now, before anything runs or is rewritten
    specs, skipped = variant_specs([(v.variant, v) for v in stored.variants] or [("", stored)])
    judged_here = {s["arm"] for s in meta.get("skipped_arms", []) if "cannot be judged here" not in s.get("reason", "")}
    if {s["arm"] for s in skipped} != judged_here:
        raise InvalidArgument(f"{run.path}: cannot resume: the arms this machine skips now "
                              f"({', '.join(sorted(s['arm'] for s in skipped)) or 'none'}) are not those the run skipped "
                              f"({', '.join(sorted(judged_here)) or 'none'}): a backend or array became (un)available")
    planned = {s.trial_id: s for s in specs}
    done: list[TrialResult] = []
    for data in run.trial_records():
        tid = data["spec"]["trial_id"]
        try:
            result = result_from_file(data)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{run.trial_path(tid)}: cannot resume: {exc}") from None
        if tid not in planned or as_stored(planned[tid].to_dict()) != as_stored(data["spec"]):
            raise InvalidArgument(f"{run.trial_path(tid)}: cannot resume: the scenario does not plan this trial "
                                  "now (its spec differs from the stored one)")
        done.append(result)
    kept = {r.spec.trial_id for r in done}
    todo = [s for s in specs if s.trial_id not in kept]
    return execute(stored, todo, run.path.parent, skipped=skipped, progress=progress, workdir=workdir,
                   resume=Resumed(run, meta, done))


def record_references(session: Session, specs: list[TrialSpec], jobs: int, run: RunDir,
                      env: dict[str, Any]) -> tuple[list[TrialSpec], list[dict[str, str]]]:
    """Record the ground truth of the recorded-reference workloads among ``specs`` (two uninterrupted runs
    each, stored as ``references/<key>.json``); return the specs that can be judged and the arms that
    cannot (label and reason: a control run failed, or the workload is not deterministic here).

    The reason is said before any trial runs and the trials are not run: a
    workload that cannot be judged here must not turn into findings.
    """
    def store(key: str, rec: workload_api.RecordedReference) -> None:
        run.write_reference(key, rec.to_dict())

    failures = session.record_references(specs, jobs, machine=environment.fingerprint(env), keep=store)
    if not failures:
        return specs, []
    keep: list[TrialSpec] = []
    skipped: dict[str, dict[str, str]] = {}
    for spec in specs:
        cls = workload_api.load(spec.workload)
        key = workload_api.reference_key(cls.name, spec.params, workload_api.resolve_array(cls, spec.array))
        if key in failures:
            label = f"{spec.variant} {Arm(**spec.arm).label()}".strip()
            skipped.setdefault(label, {"arm": label, "reason": f"workload {cls.name!r} cannot be judged here: "
                                                                 f"{failures[key]}"})
        else:
            keep.append(spec)
    return keep, list(skipped.values())


# -- parallel trials ---------------------------------------------------------


def resolve_jobs(scenario: Scenario, env: dict[str, Any] | None = None) -> int:
    """How many trials ``scenario`` runs at once here: ``run.jobs``, or for "auto"
    the GPUs × ``run.trials_per_gpu`` on a GPU host and the CPUs this process
    may use elsewhere. ``env`` is the run's environment record (its GPU list)."""
    if scenario.jobs != "auto":
        return int(scenario.jobs)
    gpu = (env if env is not None else environment.collect()).get("gpu") or {}
    gpus = len(gpu.get("gpus") or ()) or int((gpu.get("cupy") or {}).get("device_count") or 0)
    if gpus:
        return gpus * scenario.trials_per_gpu
    return len(os.sched_getaffinity(0)) or 1


def check_pid_namespaces(specs: Iterable[TrialSpec]) -> None:
    """Raise :class:`Unavailable` when a parallel run needs PID namespaces (an arm's
    backend declares ``pid_namespace``) and this process cannot make one."""
    names = sorted({s.backend for s in specs})
    if not any(getattr(checkpointers.CHECKPOINTERS.load(n), "pid_namespace", False) for n in names):
        return
    error = pid_namespace_error()
    if error:
        raise Unavailable(f"run.jobs > 1: each trial's workload needs a PID namespace of its own (CRIU restores the pids "
                          f"a tree had, and another trial's process may hold one by then), and none can be made here "
                          f"({error}): run as root, as CRIU needs, or with --jobs 1")


def _run_parallel(session: Session, specs: list[TrialSpec], jobs: int, run: RunDir, store: str,
                  results: list[TrialResult], progress: ProgressFn | None, *, pool: Any = None) -> None:
    """Run ``specs`` on ``jobs`` workers of ``session``; write each trial's file as it finishes and append the
    results to ``results`` in plan order.

    A finished trial is on disk at once, whatever happens to the run next
    (its file's name gives its place: readers take them in plan order); when
    the run stops early, every trial that finished is kept (an interrupted
    trial, as in a serial run, has no result). ``pool`` runs the trials
    instead of worker threads (Ray tasks): anything with ``run(on_result)``
    and ``late``, as :class:`_Workers` has.
    """
    finished: dict[int, TrialResult] = {}

    def keep(index: int, result: TrialResult) -> None:
        try:
            run.write_trial(result.spec.trial_id, trial_file(result, run.run_id, store))
        finally:  # even on a Ctrl-C here: the tables count a trial exactly when its file is there
            if run.trial_path(result.spec.trial_id).exists():
                finished[index] = result

    def on_result(index: int, result: TrialResult) -> None:
        keep(index, result)
        if progress:  # as trials finish: the whole run's count, whichever worker ran it
            progress(result, len(finished), len(specs))

    workers = pool if pool is not None else _Workers(session, specs, jobs)
    try:
        workers.run(on_result)
    finally:
        try:
            # No trial runs now: a tree that an interrupted restore left has no handle; remove it.
            kill_namespace_inits()
            for index, result in workers.late.items():
                keep(index, result)
        finally:  # whatever stopped the above: the tables hold every trial whose file is written
            results.extend(finished[i] for i in sorted(finished))


def _needs_gpu_alone(spec: TrialSpec) -> bool:
    """Whether ``spec``'s workload declares that it needs the GPUs to itself (``exclusive_gpu``: it fills their memory)."""
    return bool(getattr(workload_api.load(spec.workload), "exclusive_gpu", False))


class _ExclusiveGate:
    """Trials share the machine, except one that needs it alone: it waits until no trial runs, and none
    starts while it does (a readers-writer lock; waiting exclusive trials go first)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        """Run the ``with`` body as a shared trial, or alone when ``exclusive``."""
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


class _Workers:
    """``jobs`` threads running the specs of one session, taking them in plan order.

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
        self.gate = _ExclusiveGate()
        self.threads = [threading.Thread(target=self._work, name=f"cutbench-trials-{k + 1}", daemon=True)
                        for k in range(jobs)]

    def run(self, on_result: Callable[[int, TrialResult], None]) -> None:
        """Run every spec, calling ``on_result(plan position, result)`` in this thread as each finishes."""
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
                item: tuple[int, TrialResult | None, BaseException | None]
                try:
                    with self.gate.hold(_needs_gpu_alone(spec)):
                        item = (index, self.session.run_trial(spec), None)
                except KeyboardInterrupt:
                    item = (index, None, None)  # interrupted: cleaned up, no verdict
                except Exception as exc:
                    item = (index, None, exc)
                # Leaving ``busy`` and handing the result over are one step under the lock that
                # :meth:`_interrupt` takes: an interrupt cannot land inside the hand-over.
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
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))

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


def store_run(run: RunDir, results: list[TrialResult], meta: dict[str, Any], *, complete: bool, started: float,
              mark_latest: bool = True) -> pd.DataFrame:
    """Write the tables (in plan order), the summary and the final ``run.toml``; return the trials frame."""
    results = sorted(results, key=lambda r: r.spec.index)  # a resumed run's kept trials and new ones, interleaved
    trials = pd.DataFrame([trial_row(r) for r in results])
    timeline = pd.DataFrame([row for r in results for row in r.timeline])
    effects_frames = [r.effects.assign(trial_id=r.spec.trial_id) for r in results if not r.effects.empty]
    effects = pd.concat(effects_frames, ignore_index=True) if effects_frames else pd.DataFrame()
    run.write_table("trials", trials)
    run.write_table("timeline", timeline)
    run.write_table("effects", effects)
    run.write_table("certificates", [row for r in results for row in certificate_rows(r)])
    meta = dict(meta)
    meta.update(status="complete" if complete else "partial", finished=time.time(), duration_s=time.time() - started, n_trials=len(results))
    run.write_meta(meta)
    try:
        report.write_all(run, meta, trials, timeline, effects)  # summary.md, plots/*.png, report.html
    except Exception as exc:  # the tables are stored: `cutbench report RUN` can retry; never lose a run to a plot
        run.write_text("summary.md", summary.render(meta, trials))
        run.update_meta(report_error=f"{type(exc).__name__}: {exc}")
    if mark_latest:  # a replay is a side run: results/latest keeps pointing at the run being read
        run.mark_latest()
    return trials


def run_sweep(path: str | Path, axes: list[Axis], results_root: str | Path, *, overrides: list[str] | None = None,
              progress: Any = None, workdir: str | Path | None = None) -> Any:
    """Run every point of the sweep in one session and one run directory; return the runner's ``RunOutcome``.

    A scenario with ``[[variants]]`` contributes each of its variants at every
    point (labelled ``variant,axis=value``).
    """
    points = expand(path, axes, overrides)
    labelled = [(",".join(x for x in (sub.variant, p.variant) if x), sub) for p in points for sub in (p.scenario.variants or (p.scenario,))]
    specs, skipped = variant_specs(labelled)
    base = points[0].scenario
    meta = {"sweep": {"axes": {a.key: list(a.values) for a in axes},
                      "variants": [{"variant": p.variant, "overrides": list(p.overrides)} for p in points]}}
    return execute(base, specs, results_root, skipped=skipped, progress=progress, workdir=workdir,
                   name=f"sweep-{base.name}", extra_meta=meta)
