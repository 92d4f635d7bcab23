"""Continuing a partial or interrupted run (``cutbench run --resume``): whether it can be, and the rest of it run.

:func:`resume_refusal` says, purely, why a stored run cannot be continued here (other code, another machine,
another scenario, a plan source whose next trial depends on the last); :func:`resume_run` keeps every trial
the run finished and runs the rest into the same directory, so that the resumed run stores what an
uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.harness.environment import leftovers
from cutbench.harness.environment import record as environment
from cutbench.harness.model.scenario import Scenario
from cutbench.harness.model.trial import TrialResult
from cutbench.harness.nemesis import Backends
from cutbench.harness.runner.executors import ProgressFn
from cutbench.harness.runner.run import RunOptions, RunOutcome, execute, variant_specs
from cutbench.harness.runner.runmeta import Resumed
from cutbench.harness.store.rundir import RunDir, as_stored
from cutbench.harness.store.tables import result_from_file
from cutbench.workloads import api as workload_api


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
    records = run.trial_records()
    for data in records:  # where the run found its workloads: the scenario loads them from there now too
        workload_api.add_import_path(data["spec"].get("workload_path") or [])
    stored = Scenario.from_dict(meta["scenario"])
    if scenario is not None:  # how the trials run is the user's to choose now; what they are is the run's
        stored = replace(stored, **{k: getattr(scenario, k) for k in ("jobs", "executor", "ray_address")})
    if jobs is not None:  # how many at once does not change a trial (a parallel run stores what a serial one does)
        stored = replace(stored, jobs=jobs)
    run.references()  # a damaged recorded reference is named now, before anything runs or is rewritten
    backends = Backends()
    specs, skipped = variant_specs([(v.variant, v) for v in stored.variants] or [("", stored)], backends)
    judged_here = {s["arm"] for s in meta.get("skipped_arms", []) if "cannot be judged here" not in s.get("reason", "")}
    if {s["arm"] for s in skipped} != judged_here:
        raise InvalidArgument(f"{run.path}: cannot resume: the arms this machine skips now "
                              f"({', '.join(sorted(s['arm'] for s in skipped)) or 'none'}) are not those the run skipped "
                              f"({', '.join(sorted(judged_here)) or 'none'}): a backend or array became (un)available")
    planned = {s.trial_id: s for s in specs}
    done: list[TrialResult] = []
    for data in records:
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
    return execute(stored, todo, run.path.parent, RunOptions(skipped=skipped, progress=progress, workdir=workdir,
                                                             resume=Resumed(run, meta, done), backends=backends))
