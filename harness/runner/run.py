"""A whole run: a scenario becomes trial specs, one session runs them, the store keeps them.

``run_scenario`` is the front door (it picks the plan source); ``execute``
runs a list of specs, or an adaptive :data:`Driver`, in one
:class:`~cutbench.harness.runner.trial.Session` and writes the run directory
through :class:`~cutbench.harness.store.rundir.RunDir`, the only writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness import nemesis as checkpointers
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
from cutbench.harness.store.rundir import RunDir
from cutbench.harness.store.tables import certificate_rows, trial_file, trial_row
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
        if faults[arm.backend] is not None and arm.fault not in faults[arm.backend]:
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
) -> RunOutcome:
    """Run ``specs`` in one session and write the run directory; return the :class:`RunOutcome`.

    ``extra_meta`` adds top-level keys to ``run.toml`` (a sweep records its axes there).
    ``specs`` is a list, or a :data:`Driver` that decides trial by trial (the
    adaptive ``hypothesis`` source): it is called as ``driver(run_one, run)``
    and may return more top-level keys for ``run.toml``; ``planned`` is then
    the number of trials the progress display expects.
    """
    run = RunDir.create(results_root, name or scenario.name)
    started = time.time()
    if isinstance(specs, list):
        planned = len(specs)
        arms_planned = list(dict.fromkeys(Arm(**s.arm).label() for s in specs))
    else:
        arms_planned = list((extra_meta or {}).get("arms_planned", []))
    meta = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "status": "running",
        "started": started,
        "cutbench_version": environment.cutbench_version(),
        "scenario": scenario.to_dict(),
        "environment": environment.collect(),
        "skipped_arms": skipped or [],
        "n_trials_planned": planned,
        "arms_planned": arms_planned,
        **(extra_meta or {}),
    }
    run.write_meta(meta)
    results: list[TrialResult] = []
    complete = False
    total = planned or 0
    try:
        with Session(run.run_id, scenario.store, workdir=workdir) as session:

            def run_one(spec: TrialSpec) -> TrialResult:
                result = session.run_trial(spec)
                results.append(result)
                run.write_trial(spec.trial_id, trial_file(result, run.run_id, scenario.store))
                if progress:
                    progress(result, len(results), max(total, len(results)))
                return result

            if isinstance(specs, list):
                for spec in specs:
                    run_one(spec)
            else:
                meta.update(specs(run_one, run) or {})
        complete = True
    except KeyboardInterrupt:
        complete = False
    finally:
        frame = store_run(run, results, meta, complete=complete, started=started, mark_latest=mark_latest)
    return RunOutcome(run, frame, complete, skipped or [])


def store_run(run: RunDir, results: list[TrialResult], meta: dict[str, Any], *, complete: bool, started: float,
              mark_latest: bool = True) -> pd.DataFrame:
    """Write the tables, the summary and the final ``run.toml``; return the trials frame."""
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
