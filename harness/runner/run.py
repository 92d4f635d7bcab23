"""A whole run: a scenario becomes trial specs, one session runs them, the store keeps them.

``run_scenario`` is the front door (it picks the plan source); ``execute``
runs a list of specs, or an adaptive :data:`Driver`, in one
:class:`~cutbench.harness.runner.trial.Session` and writes the run directory
through :class:`~cutbench.harness.store.rundir.RunDir`, the only writer.
What runs the trials (this thread, worker threads of the session, Ray tasks,
or a driver deciding trial by trial) is an
:class:`~cutbench.harness.runner.executors.Executor`, chosen once per run;
what ``run.toml`` says of the run is a :class:`~cutbench.harness.runner.runmeta.RunMeta`, rendered in one
place. What a run refuses before it starts is :mod:`~cutbench.harness.runner.checks`'s; continuing a partial
run, :mod:`~cutbench.harness.runner.resume`'s.

With ``run.jobs`` > 1 the plans are built before any runs and a parallel run
stores what a serial run of the same plans stores (see
:mod:`cutbench.harness.runner.executors`). The adaptive ``hypothesis`` source
decides each trial from the one before: it runs one trial at a time.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import (EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_UNKNOWN_ONLY, EXIT_VALID,
                             InvalidArgument, ReceiverLost, Unavailable)
from cutbench import interrupts, storage
from cutbench.harness.environment import leftovers
from cutbench.harness.environment import record as environment
from cutbench.harness.generator.scheduler import build_specs
from cutbench.harness.generator.search import search_arms
from cutbench.harness.generator.sweep import Axis, expand
from cutbench.harness.model.scenario import PROFILES, Scenario
from cutbench.harness.model.plan import CutPlan
from cutbench.harness.model.trial import TrialSpec, spec_for
from cutbench.harness.nemesis import Backends
from cutbench.harness.nemesis.probe_kit import release_network_lock
from cutbench.harness.reports import html as report
from cutbench.harness.reports import summary
from cutbench.harness.reports.summary import render_search
from cutbench.harness.runner.adaptive import Driver, hypothesis_driver
from cutbench.harness.runner.executors import ProgressFn, TrialLog, choose_executor
from cutbench.harness.runner.shared import ReceiverWatch
from cutbench.harness.runner.checks import (check_backends, check_importable, check_programs, check_storage,
                                           check_tracing)
from cutbench.harness.runner.runmeta import Resumed, RunMeta
from cutbench.harness.runner.session import Session
from cutbench.harness.store.rundir import RunDir, read_matrix, store_run
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
        """Return the verdict's exit code: 0 all valid (or refused), 1 invalid found, 2 unknown only, or every
        trial refused where the scenario does not expect it (``pipeline.expect_refusals``)."""
        if self.trials.empty:
            return EXIT_UNKNOWN_ONLY
        outcomes = set(self.trials["outcome"])
        if "invalid" in outcomes:
            return EXIT_INVALID
        if "unknown" in outcomes:
            return EXIT_UNKNOWN_ONLY
        if outcomes == {"refused"} and not summary.refusals_expected(self.run.meta()):
            return EXIT_UNKNOWN_ONLY  # nothing was tested: never a clean result unless the scenario asks for refusals
        return EXIT_VALID

    def command_exit_code(self, interrupted: int = EXIT_INTERRUPTED) -> int:
        """Return the exit code of the command that made this run: ``interrupted`` (the signal's code) for a
        partial run, which is never a verdict even if what finished was all valid; 254 for a complete run in
        which nothing could run here (every arm skipped: an unusable environment, not "unknown only"); else
        :meth:`exit_code`."""
        if not self.complete:
            return interrupted
        if self.trials.empty and self.skipped_arms:
            return EXIT_BAD_ARGUMENTS
        return self.exit_code()

    def outcome_counts(self) -> dict[str, int]:
        """Return how many trials ended in each outcome (``{"valid": 21, "invalid": 7}``; empty: no trial)."""
        return self.trials["outcome"].value_counts().to_dict() if not self.trials.empty else {}


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
    backends = Backends()  # resolved once for the run: its checks, its session's instances, its record
    specs, skipped = variant_specs([(v.variant, v) for v in scenario.variants] or [("", scenario)], backends)
    return execute(scenario, specs, results_root,
                   RunOptions(skipped=skipped, progress=progress, workdir=workdir, backends=backends))


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
    backends = Backends()
    arms, skipped = check_backends(scenario, backends)
    sarms = search_arms(scenario, arms)
    outcome = execute(scenario, hypothesis_driver(scenario, sarms), results_root,
                      RunOptions(skipped=skipped, progress=progress, workdir=workdir, planned=len(sarms) * scenario.trials,
                                 extra_meta={"arms_planned": [s.arm.label() for s in sarms]}, backends=backends))
    search = outcome.run.meta().get("search")
    if search:
        summary = outcome.run.path / "summary.md"
        text = summary.read_text() if summary.exists() else ""
        outcome.run.write_text("summary.md", text.rstrip("\n") + "\n\n" + render_search(search, outcome.run.path) + "\n")
    return outcome


def variant_specs(points: list[tuple[str, Scenario]],
                  backends: Backends | None = None) -> tuple[list[TrialSpec], list[dict[str, str]]]:
    """The trial specs of several resolved scenarios run as one run, each labelled
    with its variant name, and the arms skipped here (labelled likewise); ``backends``: the run's."""
    specs: list[TrialSpec] = []
    skipped: list[dict[str, str]] = []
    backends = backends or Backends()
    for variant, scenario in points:
        arms, skipped_here = check_backends(scenario, backends)
        skipped += [{**s, "arm": f"{variant} {s['arm']}".strip()} for s in skipped_here]
        specs += [replace(s, variant=variant) for s in build_specs(scenario, arms, start_index=len(specs))]
    return specs, skipped


@dataclass(frozen=True)
class RunOptions:
    """How a run is carried out and stored, beside what it runs (its scenario and trials); every field optional.

    ``skipped``: arms left out before the run, with why (``run.toml`` lists them). ``progress``: called in the
    run's thread as each trial finishes. ``workdir``: where trials work (default: a temporary folder).
    ``name``: the run directory's name (default: the scenario's). ``extra_meta``: more top-level keys for
    ``run.toml`` (a sweep records its axes there). ``planned``: how many trials a :data:`Driver` is expected to
    run (the progress display's total). ``mark_latest``: whether ``results/latest`` then points at the run.
    ``resume``: continue this stored run instead of making a new one (its finished trials are kept, the specs
    are the ones still to run, and the tables are written over all of them: see :func:`resume_run`).
    ``backends``: the run's, as its checks resolved them (a fresh set when none). ``references``: ground truth
    recorded earlier on this machine (a gate's earlier arm), by reference key: the trials are judged by it and
    the run stores it, instead of recording it again.
    """

    skipped: list[dict[str, str]] = field(default_factory=list)
    progress: ProgressFn | None = None
    workdir: str | Path | None = None
    name: str | None = None
    extra_meta: Mapping[str, Any] = field(default_factory=dict)
    planned: int | None = None
    mark_latest: bool = True
    resume: "Resumed | None" = None
    backends: Backends | None = None
    references: Mapping[str, workload_api.RecordedReference] | None = None


@interrupts.from_code()
def execute(scenario: Scenario, specs: "list[TrialSpec] | Driver", results_root: str | Path,
            options: RunOptions = RunOptions()) -> RunOutcome:
    """Run ``specs`` in one session and write the run directory; return the :class:`RunOutcome`.

    ``specs`` is a list, or a :data:`Driver` that decides trial by trial (the
    adaptive ``hypothesis`` source): it is called as ``driver(run_one, run)``
    and may return more top-level keys for ``run.toml``. What runs them is
    chosen once (:func:`~cutbench.harness.runner.executors.choose_executor`).
    ``options`` says how (:class:`RunOptions`). Bad input raises before any run directory exists.
    """
    o = options
    backends = o.backends or Backends()
    _refuse_before_the_run(scenario, specs, results_root if o.resume is None else o.resume.run.path, o.workdir)
    env = environment.collect()
    # Read before any run directory exists: a support matrix that is not there is a bad argument, nothing half-written.
    support_matrix = read_matrix(scenario.support_matrix) if scenario.support_matrix else None
    # What runs whose harness was killed left behind (containers, image directories, receivers) goes first.
    swept = leftovers.sweep(release_network_lock)
    executor = choose_executor(scenario, specs, env, workdir=o.workdir, backends=backends)
    try:
        run = RunDir.create(results_root, o.name or scenario.name) if o.resume is None else o.resume.run
    except BaseException:
        executor.close()
        raise
    meta = RunMeta.start(run, scenario, env, executor, skipped=list(o.skipped), planned=o.planned, swept=swept,
                         extra=dict(o.extra_meta), resume=o.resume,
                         # Every backend the trials use (a sweep's or a variant's too); a driver's are the scenario's.
                         backends=backends.record(sorted({s.backend for s in specs}) if isinstance(specs, list)
                                                  else scenario.backends))
    run.write_meta(meta.render())
    log = TrialLog(run, scenario.store, list(o.resume.done) if o.resume is not None else [], o.progress,
                   meta.n_trials_planned or 0)
    complete = False
    refused_input = False  # a program its control runs showed to be bad input: nothing of the run is kept
    full: OSError | None = None
    lost: ReceiverLost | None = None
    watch: ReceiverWatch | None = None  # the session's, read after it closed: what run.toml says of the receiver
    try:
        listen, token = executor.receiver_exposure()
        images_dirs = {s.images_dir for s in executor.specs} if executor.specs is not None else {scenario.images_dir}
        with Session(run.run_id, scenario.store, workdir=o.workdir, pid_namespace=executor.pid_namespaces,
                     listen=listen, token=token, backends=backends) as session, \
                leftovers.claim(run.run_id, images_dirs=images_dirs, workdir=session.workdir,
                                receiver_pid=session.receiver.pid if session.receiver is not None else None):
            watch = session.watch
            meta.executor = executor.describe(session)  # now with where the trials reach the receiver
            session.support.configure(support_matrix, env)
            if _ground_truth(session, executor, scenario, run, meta, log, o):
                meta.extra.update(executor.run(session, log))
        complete = True
    except KeyboardInterrupt:
        complete = False
    except InvalidArgument:
        refused_input = not log.results and o.resume is None
        raise
    except OSError as exc:
        if not storage.is_full_error(exc):
            raise
        full = exc  # a trial's file did not fit: what is stored so far is still written below, if it can be
    except ReceiverLost as exc:
        lost = exc  # the run stops; what finished is stored below, partial, for --resume
    finally:
        executor.close()
        if watch is not None and watch.events:  # said in run.toml: when it died, its last words, the trials run again
            meta.extra["receiver_restarts"] = watch.events
        if refused_input:
            shutil.rmtree(run.path, ignore_errors=True)
        else:
            frame, full = _store(run, meta, log, complete, o.mark_latest, full)
    if full is not None:
        raise Unavailable(results_full(run, full))
    if lost is not None:
        raise ReceiverLost(f"{lost}; the run stopped: its {len(log.results)} finished trials are stored in {run.path}, "
                           f"and `cutbench run --resume {run.path}` runs the rest")
    return RunOutcome(run, frame, complete, meta.skipped_arms)


def _store(run: RunDir, meta: RunMeta, log: TrialLog, complete: bool, mark_latest: bool,
           full: OSError | None) -> tuple[pd.DataFrame, OSError | None]:
    """Write the run's tables, ``run.toml`` and report; return the trials table and the error of a results
    directory that filled up (``full``, or this write's), if any (the trials table is then empty)."""
    try:
        meta.finish(complete=complete, n_trials=len(log.results))
        return store_run(run, log.results, meta.render(), report=report.write_run_report, mark_latest=mark_latest), full
    except OSError as exc:
        if not storage.is_full_error(exc):
            raise
        return pd.DataFrame(), full or exc


def _refuse_before_the_run(scenario: Scenario, specs: "list[TrialSpec] | Driver", results: str | Path,
                           workdir: str | Path | None) -> None:
    """Raise what makes the run impossible before anything of it exists: a workload that cannot be imported, a
    program that cannot start or be traced, storage nearly full (:mod:`~cutbench.harness.runner.checks`)."""
    if isinstance(specs, list):
        roots = [(s.workload, tuple(s.workload_path)) for s in specs]
        programs = [(s.workload_class(), s.params) for s in specs]
        images = {s.images_dir for s in specs}
    else:  # a driver's trials are all the scenario's workload
        roots = [(scenario.workload, workload_api.import_roots(scenario.workload_class()))]
        programs, images = [(scenario.workload_class(), scenario.params)], {scenario.images_dir}
    check_importable(roots)
    check_programs(programs)
    check_tracing(programs)
    check_storage(images, results, workdir)


def _ground_truth(session: Session, executor: Any, scenario: Scenario, run: RunDir, meta: RunMeta, log: TrialLog,
                  options: RunOptions) -> bool:
    """Give the session the ground truth its trials are judged by (a resumed run's own, a gate's earlier arm's,
    or recorded now by uninterrupted runs), saying in ``run.toml`` what cannot be judged; return whether any
    trial is left to run."""
    if options.resume is not None:  # judged by the references the run recorded, as its first trials were
        session.references.recordings.update(
            {k: workload_api.RecordedReference.from_dict(d) for k, d in run.references().items()})
    known = options.references or {}
    for key in reference_keys(executor.specs or []) & known.keys():  # stored as the run's own, not recorded
        session.references.recordings[key] = known[key]
        run.write_reference(key, known[key].to_dict())
    searchable = True
    if executor.specs is not None:
        executor.specs, unjudgeable = record_references(session, executor.specs, executor.jobs, run, meta.environment)
        if unjudgeable:  # said up front, in run.toml: these trials are not run
            meta.skipped_arms = [*meta.skipped_arms, *unjudgeable]
            meta.n_trials_planned = log.total = len(executor.specs) + len(log.results)
            run.write_meta(meta.render())
    elif options.resume is None:
        # A driver decides its trials as it goes; they all share the scenario's workload, parameters and
        # array, so one uncut spec records the ground truth the search's trials are judged by.
        arms = scenario.arms()
        _, unjudgeable = record_references(session, [spec_for(scenario, arms[0], CutPlan(), 0)] if arms else [],
                                           1, run, meta.environment)
        if unjudgeable:  # nothing it would try can be judged: said in run.toml, and no trial runs
            meta.skipped_arms = [*meta.skipped_arms, *unjudgeable]
            meta.n_trials_planned = log.total = 0
            run.write_meta(meta.render())
            searchable = False
    differ = {key: rec.boundaries_differ for key, rec in session.references.recordings.items()
              if rec.boundaries_differ}
    if differ:  # said in run.toml and the summary: a syscall cut there lands where its own run's call is
        meta.extra["boundaries_differ"] = differ
        run.write_meta(meta.render())
    return searchable


def results_full(run: RunDir, exc: OSError) -> str:
    """One line for a run whose results directory filled up: the directory, what of the run it holds, and the
    command that finishes the run once there is space."""
    free, total = storage.free_bytes(run.path)
    trials = len(list((run.path / "trials").glob("t*.json"))) if (run.path / "trials").is_dir() else 0
    tables = [n for n in ("trials", "timeline", "effects", "certificates") if (run.path / f"{n}.parquet").exists()]
    stored = f"{trials} trial files" + (f" and the tables ({', '.join(tables)})" if tables else ", no table")
    finish = f"cutbench report {run.path}" if "trials" in tables and run.meta().get("status") != "running" \
        else f"cutbench run --resume {run.path}"
    return (f"the results directory {run.path} is full ({storage.mib(free)} free of {storage.mib(total)}; "
            f"{exc.strerror or exc}): it holds {stored}; free space, then `{finish}` finishes the run")


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

    session.references.artefacts_root = run.path / "references"  # a program's compared artefacts, kept beside

    failures = session.record_references(specs, jobs, machine=environment.fingerprint(env), keep=store)
    check_program_references(specs, session, failures)
    if not failures:
        return specs, []
    keep: list[TrialSpec] = []
    skipped: dict[str, dict[str, str]] = {}
    for spec in specs:
        key = spec.reference_key()
        if key in failures:
            label = f"{spec.variant} {spec.arm.label()}".strip()
            skipped.setdefault(label, {"arm": label, "reason": f"workload {spec.workload_class().name!r} cannot be "
                                                                 f"judged here: {failures[key]}"})
        else:
            keep.append(spec)
    return keep, list(skipped.values())


def reference_keys(specs: list[TrialSpec]) -> set[str]:
    """The reference keys (:func:`~cutbench.workloads.api.reference_key`) of the recorded-reference workloads among
    ``specs``."""
    return {spec.reference_key() for spec in specs if workload_api.records_reference(spec.workload_class())}


def check_program_references(specs: list[TrialSpec], session: Session, failures: dict[str, str]) -> None:
    """Raise :class:`InvalidArgument`, before any trial, for a program whose uninterrupted runs show it cannot be
    judged as its scenario says: it failed or showed no effect (bad input: the command, its files, the effects
    rule), or it shows fewer effects than ``workload.params.ops`` (the cuts would wait for effects that never
    come). A program that does not reproduce itself stays in ``failures``: its arms are skipped, with the first
    differing effect, as any recorded workload's."""
    for spec in specs:
        cls = spec.workload_class()
        if not workload_api.optional(cls, "program"):
            continue
        key = spec.reference_key()
        why = failures.get(key)
        if why is not None and "not deterministic" not in why:
            raise InvalidArgument(f"program {spec.params['command']!r}: {why}")
        recorded = session.references.recordings.get(key)
        if recorded is not None and len(recorded.payloads) < spec.params["ops"]:
            raise InvalidArgument(f"workload.params.ops = {spec.params['ops']}: the program shows "
                                  f"{len(recorded.payloads)} effects uninterrupted; set ops (and plan.ops) at most that")
        beyond = [c.op for c in spec.cut_plan().cuts if c.phase == "syscall" and recorded is not None
                  and c.op > len(recorded.boundaries)]
        if beyond:
            assert recorded is not None
            raise InvalidArgument(f"plan.ops: a cut at counted system call {max(beyond)}, but the program makes "
                                  f"{len(recorded.boundaries)} calls of plan.syscalls uninterrupted (on its stdout or "
                                  f"stderr, a socket, files in its directory); set plan.ops within [1, "
                                  f"{len(recorded.boundaries)}]" if recorded.boundaries else
                                  "plan.phases has \"syscall\", but the program makes no call of plan.syscalls on its "
                                  "stdout or stderr, a socket or a file in its directory: it has no boundary to cut at")


def run_sweep(path: str | Path, axes: list[Axis], results_root: str | Path, *, overrides: list[str] | None = None,
              progress: Any = None, workdir: str | Path | None = None) -> Any:
    """Run every point of the sweep in one session and one run directory; return the runner's ``RunOutcome``.

    A scenario with ``[[variants]]`` contributes each of its variants at every
    point (labelled ``variant,axis=value``).
    """
    points = expand(path, axes, overrides)
    labelled = [(",".join(x for x in (sub.variant, p.variant) if x), sub) for p in points for sub in (p.scenario.variants or (p.scenario,))]
    backends = Backends()
    specs, skipped = variant_specs(labelled, backends)
    base = points[0].scenario
    meta = {"sweep": {"axes": {a.key: list(a.values) for a in axes},
                      "variants": [{"variant": p.variant, "overrides": list(p.overrides)} for p in points]}}
    return execute(base, specs, results_root, RunOptions(skipped=skipped, progress=progress, workdir=workdir,
                                                         name=f"sweep-{base.name}", extra_meta=meta, backends=backends))
