"""The runner: turns a scenario into trials and runs each one end to end.

Side effects live here and in the pipeline: start the receiver, spawn the
workload, arm cut points, drive the nemesis, watch for deadlock, collect the
report and the receiver's records, and hand them to the (pure) oracle. Every
result file is written through :mod:`harness.results`.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from harness import checkpointers, environment, oracle, report, scheduler, summary
from harness.checkpointers.base import CutContext
from harness.errors import InvalidArgument, Unavailable
from harness.pipeline import execute_cut
from harness.plan import CutPlan, position
from harness.procs import Child, become_subreaper, spawn
from harness.results import RunDir
from harness.scenario import Arm, Scenario
from harness.timeline import Timeline
from workloads import api as workload_api
from workloads.control import ControlFile
from workloads.runtime import WorkloadConfig, read_marker

POLL_S = 0.005


@dataclass
class TrialSpec:
    """Everything needed to run one trial again, exactly (stored in ``trials/<id>.json``)."""

    trial_id: str
    index: int
    workload: str
    array: str
    params: dict[str, Any]
    backend: str
    receiver_mode: str
    arm: dict[str, Any]
    plan: dict[str, Any]
    watchdog_s: float = 20.0
    trial_timeout_s: float = 120.0
    stage_timeout_s: float = 60.0
    images_dir: str = "/dev/shm"
    keep_images: bool = False
    variant: str = ""  # the sweep point (``state_size=4096``) when a sweep runs several in one run

    def cut_plan(self) -> CutPlan:
        """The plan as a :class:`CutPlan`."""
        return CutPlan.from_dict(self.plan)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialSpec":
        """Inverse of :meth:`to_dict`; raise InvalidArgument on unknown or missing fields."""
        try:
            spec = cls(**data)
        except TypeError as exc:
            raise InvalidArgument(f"trial spec: {exc}") from None
        try:
            cls_ = workload_api.load(spec.workload)
        except workload_api.WorkloadError as exc:
            raise InvalidArgument(f"trial spec: workload: {exc}") from None
        spec.cut_plan().validate_for(tuple(cls_.phases), spec.params.get("ops"))
        return spec


@dataclass
class TrialResult:
    """A finished trial: its record (one row of ``trials.parquet``), timeline and effects."""

    spec: TrialSpec
    record: dict[str, Any]
    timeline: list[dict[str, Any]]
    effects: pd.DataFrame
    verdict: oracle.Verdict


def build_specs(scenario: Scenario, arms: list[Arm], *, start_index: int = 0) -> list[TrialSpec]:
    """One :class:`TrialSpec` per (arm, plan) of the scenario's static plan source."""
    specs = []
    i = start_index
    for arm in arms:
        for plan in scheduler.plans(scenario, arm):
            i += 1
            specs.append(spec_for(scenario, arm, plan, i))
    return specs


def spec_for(scenario: Scenario, arm: Arm, plan: CutPlan, index: int) -> TrialSpec:
    """The :class:`TrialSpec` of trial number ``index``: ``plan`` under ``arm`` of ``scenario``."""
    return TrialSpec(
        trial_id=f"t{index:04d}",
        index=index,
        workload=scenario.workload,
        array=scenario.array,
        params=dict(scenario.params),
        backend=arm.backend,
        receiver_mode=arm.receiver_mode,
        arm=asdict(arm),
        plan=plan.to_dict(),
        watchdog_s=scenario.watchdog_s,
        trial_timeout_s=scenario.trial_timeout_s,
        stage_timeout_s=scenario.stage_timeout_s,
        images_dir=scenario.images_dir,
        keep_images=scenario.keep_images,
    )


class Session:
    """Run-level resources: the receiver, a work directory, backends, the subreaper.

    Use as a context manager; leaving it stops the receiver and removes the
    work directory, whatever happened inside.
    """

    def __init__(self, run_id: str, store: str = "sqlite", workdir: str | Path | None = None):
        self.run_id = run_id
        self.store_spec = store
        self._workdir_arg = workdir
        self._backends: dict[str, Any] = {}
        self.receiver = None
        self.control_client = None

    def __enter__(self) -> "Session":
        from receivers.client import ReceiverClient
        from receivers.process import start_receiver

        become_subreaper()
        base = Path(self._workdir_arg) if self._workdir_arg else None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"cutbench-{self.run_id}-", dir=base))
        self.store_url = f"sqlite:{self.workdir / 'receiver.sqlite'}" if self.store_spec == "sqlite" else self.store_spec
        try:
            self.receiver = start_receiver(self.store_url, self.workdir)
            self.control_client = ReceiverClient(self.receiver.address)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.control_client is not None:
            try:
                self.control_client.close()
            except Exception:
                pass
        if self.receiver is not None:
            self.receiver.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def backend(self, name: str) -> Any:
        """The (cached) backend instance for ``name``."""
        if name not in self._backends:
            self._backends[name] = checkpointers.get(name)
        return self._backends[name]

    def effects(self, receiver_trial: str) -> pd.DataFrame:
        """The receiver's stored rows for one trial, read from the store (not the server's memory)."""
        from receivers.stores import open_store

        store = open_store(self.store_url)
        try:
            return store.export(trial=receiver_trial)
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one trial to its verdict; never raises for a failing stage or workload."""
        return TrialRunner(self, spec).run()


class TrialRunner:
    """One trial's side effects, from spawn to verdict (see :meth:`run`)."""

    def __init__(self, session: Session, spec: TrialSpec):
        self.s = session
        self.spec = spec
        self.cls = workload_api.load(spec.workload)
        self.phases = tuple(self.cls.phases)
        self.receiver_trial = f"{session.run_id}/{spec.trial_id}"
        self.tdir = session.workdir / spec.trial_id
        self.timeline = Timeline(spec.trial_id, hwm=self._hwm)
        self.record: dict[str, Any] = {}
        self.cut_targets: list[Child] = []  # single processes cut instead of the tree (killed at the end)

    def _hwm(self) -> int | None:
        return self.s.control_client.high_water_mark()

    def run(self) -> TrialResult:
        """Spawn, cut, restore, watch, judge. Always returns a :class:`TrialResult`."""
        spec = self.spec
        started = time.monotonic()
        self.tdir.mkdir(parents=True)
        control = ControlFile.create(self.tdir / "control")
        backend = self.s.backend(spec.backend)
        plan = spec.cut_plan()
        status, error, failed_stage = "completed", "", ""
        restores, outcomes = 0, []
        child: Child | None = None
        companions: list[Child] = []
        resumed_at: tuple[tuple[int, int], int] | None = None  # (position at the last cut, progress count after it)
        facts: dict[str, Any] = {}
        try:
            self.s.control_client.open_trial(self.receiver_trial, spec.receiver_mode)
            config = self._write_config()
            companions = self._start_companions(config)
            seq = self._arm(control, plan, 0)
            with self.timeline.stage("spawn"):
                child = spawn([sys.executable, "-m", "workloads.launch", str(config)], cwd=str(self.tdir))
            for i, cut in enumerate(plan.cuts):
                reached = self._reach(control, child, cut, seq, i)
                if reached == "deadlock":
                    status, error = "deadlock", f"no progress for {spec.watchdog_s:g}s before cut {i} at {cut.op}/{cut.phase}"
                    break
                if reached:
                    status, error = "unknown", reached
                    break
                ctx = CutContext(
                    images_dir=Path(spec.images_dir) / f"cutbench-{self.s.run_id}-{spec.trial_id}-c{i}",
                    timeline=self.timeline,
                    cut_index=i,
                    cut=cut,
                    stage_timeout_s=spec.stage_timeout_s,
                    control=control,
                )
                next_seq: list[int | None] = [None]

                def before_resume(i: int = i) -> None:
                    control.set("incarnation", control.get("incarnation") + 1)
                    next_seq[0] = self._arm(control, plan, i + 1)

                def release(i: int = i, s: int | None = seq, fault: str = cut.fault) -> None:
                    if fault == "none" and next_seq[0] is None:
                        # No restore follows: arm the next cut before the parked
                        # workload moves on, or it may run past it first.
                        next_seq[0] = self._arm(control, plan, i + 1)
                    if s is not None:
                        control.release(s)

                target = self._cut_target(control, child)
                at_cut = (control.get("progress_op"), control.get("progress_phase"))
                outcome = execute_cut(backend, target, ctx, release=release, before_resume=before_resume, keep_images=spec.keep_images)
                # Until the resumed workload passes a point, the slots may show where a
                # crashed (leave_running) process got to; it really stands at the cut.
                resumed_at = (at_cut, control.get("progress_count"))
                outcomes.append(asdict(outcome))
                for key, value in ctx.facts.items():
                    facts[key] = facts.get(key, 0) + value if isinstance(value, (int, float)) else value
                if outcome.status == "restored":
                    restores += 1
                if outcome.status in ("refused", "failed"):
                    status = "refused" if outcome.status == "refused" else "unknown"
                    error, failed_stage = outcome.error, outcome.stage
                    if next_seq[0] is not None:  # the plan stops here: do not leave the next cut armed
                        control.release(next_seq[0])
                    break
                if outcome.status == "resumed" and next_seq[0] is None:
                    next_seq[0] = self._arm(control, plan, i + 1)
                seq = next_seq[0]
            if status not in ("unknown", "deadlock"):
                finished = self._finish(control, child)
                if finished == "deadlock":
                    status, error = "deadlock", f"no progress for {spec.watchdog_s:g}s"
                elif finished and status == "completed":
                    status, error = "unknown", finished
                elif finished and status == "refused" and "exit" in finished:
                    # A refusal that killed the workload was not a clean refusal.
                    status, error = "unknown", f"{error}; then {finished}"
        except Exception as exc:  # harness-side failure: no verdict possible
            status, error = "unknown", f"harness: {type(exc).__name__}: {exc}"
        finally:
            if child is not None and child.alive():
                child.kill()
            if child is not None:
                child.kill_groups()  # also what an interrupted restore left behind
            for companion in [*companions, *self.cut_targets]:
                companion.kill()
            progress_op, phase_index = control.get("progress_op"), control.get("progress_phase")
            if resumed_at is not None and control.get("progress_count") == resumed_at[1]:
                progress_op, phase_index = resumed_at[0]
            progress_phase = self.phases[phase_index] if control.get("progress_count") and 0 <= phase_index < len(self.phases) else ""
            control.close()
        report = self._read_report()
        self.record = {
            "trial_id": spec.trial_id,
            "status": status,
            "error": error,
            "failed_stage": failed_stage,
            "exit_code": child.returncode if child else None,
            "restores": restores,
            "cut_outcomes": outcomes,
            "report": report,
            "marker_op": read_marker(self.tdir / "marker"),
            "progress_op": progress_op,
            "progress_phase": progress_phase,
            # A workload may use more domains on some devices (CuPy: "cuda"); its report says so.
            "workload_domains": sorted(workload_api.declared_domains(self.cls, spec.params) | set((report or {}).get("domains", ()))),
            "covered_domains": sorted(backend.covers),
            "duration_s": time.monotonic() - started,
            "facts": facts,
            "log_tail": self._log_tail() if status in ("unknown", "deadlock") else "",
        }
        effects = self._effects()
        verdict = oracle.judge(self.record, effects, self.cls.reference(spec.params))
        shutil.rmtree(self.tdir, ignore_errors=True)
        return TrialResult(spec, self.record, self.timeline.rows(), effects, verdict)

    # -- steps -------------------------------------------------------------
    def _write_config(self) -> Path:
        config = WorkloadConfig(
            workload=self.spec.workload,
            trial=self.receiver_trial,
            params=self.spec.params,
            control_path=str(self.tdir / "control"),
            report_path=str(self.tdir / "report.json"),
            marker_path=str(self.tdir / "marker"),
            log_path=str(self.tdir / "workload.log"),
            receiver=self.s.receiver.address,
            array_backend=self.spec.array,
        )
        path = self.tdir / "config.json"
        config.dump(path)
        return path

    def _start_companions(self, config: Path) -> list[Child]:
        """Start the workload's companions (``cls.companions``: modules run as
        ``python -m MODULE CONFIG``), e.g. a peer it talks to. They run outside
        the checkpointed process tree, in their own sessions, so neither a cut
        nor a fault touches them; the trial kills them at its end."""
        return [spawn([sys.executable, "-m", module, str(config)], cwd=str(self.tdir))
                for module in getattr(self.cls, "companions", ())]

    def _cut_target(self, control: ControlFile, child: Child) -> Child:
        """The process a cut checkpoints: the workload's root, whose whole tree the
        backend dumps (a coordinated cut), or the one child the workload named in
        the ``cut_pid`` slot (an uncoordinated cut of a single rank). A restored
        single process is re-parented to us, so it is killed at the end of the trial."""
        pid = control.get("cut_pid")
        if pid <= 0 or pid == child.pid:
            return child
        for known in self.cut_targets:
            if known.pid == pid:
                return known
        self.cut_targets.append(Child(pid=pid))
        return self.cut_targets[-1]

    def _arm(self, control: ControlFile, plan: CutPlan, index: int) -> int | None:
        """Arm cut ``index`` if it is precise; return its sequence (None: async or none left)."""
        if index >= len(plan.cuts) or plan.cuts[index].mode != "precise":
            return None
        cut = plan.cuts[index]
        return control.arm(cut.op, self.phases.index(cut.phase))

    def _reach(self, control: ControlFile, child: Child, cut: Any, seq: int | None, i: int) -> str:
        """Wait until the workload is at the cut (parked, or past the async point + offset).

        Returns "" when reached, "deadlock" when a workload restored or resumed
        by an earlier cut makes no progress within the watchdog, else why not
        (the trial becomes ``unknown``).
        """
        deadline = time.monotonic() + self.spec.stage_timeout_s
        target = position(cut, self.phases)
        # After a leave_running crash the progress slots still hold where the
        # crashed process got to; only a count that moved since now is news.
        baseline = last_count = control.get("progress_count")
        last_change = time.monotonic()
        with self.timeline.stage("reach_cut", i) as extra:
            while True:
                if seq is not None and control.get("parked_seq") >= seq:
                    extra["detail"] = f"parked at {cut.op}/{cut.phase}"
                    return ""
                count = control.get("progress_count")
                fresh = count != baseline or (i == 0 and count > 0)
                pos = control.get("progress_op") * len(self.phases) + control.get("progress_phase")
                if seq is None and fresh and pos >= target:
                    time.sleep(cut.async_offset_ms / 1000.0)
                    extra["detail"] = f"async +{cut.async_offset_ms:g}ms after {cut.op}/{cut.phase}"
                    return ""
                if seq is not None and fresh and pos > target:
                    return f"workload passed cut {i} at {cut.op}/{cut.phase} before it could park there (after an async cut)"
                rc = child.poll()
                if rc is not None:
                    return f"workload exited ({rc}) before cut {i} at {cut.op}/{cut.phase}"
                now = time.monotonic()
                if count != last_count:
                    last_count, last_change = count, now
                elif i > 0 and now - last_change > self.spec.watchdog_s:
                    extra["detail"] = "watchdog"
                    return "deadlock"
                if time.monotonic() > deadline:
                    return f"workload did not reach cut {i} at {cut.op}/{cut.phase} within {self.spec.stage_timeout_s:g}s"
                time.sleep(POLL_S)

    def _finish(self, control: ControlFile, child: Child) -> str:
        """Wait for the workload to exit. Returns "" on a clean exit, "deadlock", or why it failed."""
        spec = self.spec
        deadline = time.monotonic() + spec.trial_timeout_s
        last_count, last_change = control.get("progress_count"), time.monotonic()
        with self.timeline.stage("run_to_end") as extra:
            while True:
                rc = child.poll()
                if rc is not None:
                    extra["detail"] = f"exit {rc}"
                    return "" if rc == 0 and control.get("done") else f"workload exit {rc}"
                count = control.get("progress_count")
                now = time.monotonic()
                if count != last_count:
                    last_count, last_change = count, now
                elif now - last_change > spec.watchdog_s:
                    child.kill()
                    extra["detail"] = "watchdog"
                    return "deadlock"
                if now > deadline:
                    child.kill()
                    return f"trial timeout {spec.trial_timeout_s:g}s"
                time.sleep(POLL_S * 2)

    def _read_report(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.tdir / "report.json").read_text())
        except (OSError, ValueError):
            return None

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.tdir / "workload.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _effects(self) -> pd.DataFrame:
        try:
            return self.s.effects(self.receiver_trial)
        except Exception as exc:  # a store we cannot read makes the verdict unknown
            self.record["status"] = "unknown"
            self.record["error"] = f"cannot read receiver store: {exc}"
            return oracle.empty_effects()


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
        from harness.errors import EXIT_INVALID, EXIT_UNKNOWN_ONLY, EXIT_VALID

        if self.trials.empty:
            return EXIT_UNKNOWN_ONLY
        outcomes = set(self.trials["outcome"])
        if "invalid" in outcomes:
            return EXIT_INVALID
        if "unknown" in outcomes:
            return EXIT_UNKNOWN_ONLY
        return EXIT_VALID


def trial_row(result: TrialResult) -> dict[str, Any]:
    """The flat ``trials.parquet`` row of a trial."""
    spec, rec, verdict = result.spec, result.record, result.verdict
    plan = spec.cut_plan()
    first = plan.cuts[0] if plan.cuts else None
    durations: dict[str, float] = {}
    for row in result.timeline:
        durations[row["stage"]] = durations.get(row["stage"], 0.0) + row["duration_s"]
    row = {
        "trial_id": spec.trial_id,
        "index": spec.index,
        "variant": spec.variant,
        "workload": spec.workload,
        "backend": spec.backend,
        "receiver_mode": spec.receiver_mode,
        "fault": spec.arm.get("fault"),
        "crash_after_ms": spec.arm.get("crash_after_ms"),
        "split_window_ms": spec.arm.get("split_window_ms"),
        "rank_skew_ms": spec.arm.get("rank_skew_ms", 0.0),
        "restore_target": spec.arm.get("restore_target", "same"),
        "arm": Arm(**spec.arm).label(),
        "plan": plan.describe(),
        "plan_json": plan.to_json(),
        "n_cuts": len(plan.cuts),
        "cut_op": first.op if first else None,
        "cut_phase": first.phase if first else None,
        "cut_mode": first.mode if first else None,
        "status": rec["status"],
        "outcome": verdict.outcome,
        "n_findings": len(verdict.findings),
        "findings": json.dumps([f.to_dict() for f in verdict.findings]),
        "error": rec["error"],
        "failed_stage": rec["failed_stage"],
        "restores": rec["restores"],
        "host_op": (rec["report"] or {}).get("host_op"),
        "n_effects": int(len(result.effects)),
        "duration_s": rec["duration_s"],
        "image_bytes": rec["facts"].get("image_bytes"),
        "gpu_bytes": rec["facts"].get("gpu_bytes"),
    }
    for kind, n in verdict.counts().items():
        row[kind] = n
    for stage in ("criu_dump", "criu_restore", "cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock",
                  "quiesce", "split_window", "app_save", "app_restore"):
        row[f"{stage}_s"] = durations.get(stage)
    return row


def trial_file(result: TrialResult, run_id: str, store: str) -> dict[str, Any]:
    """The content of ``trials/<id>.json``: spec (for replay), record and verdict."""
    return {
        "run_id": run_id,
        "store": store if store == "sqlite" or store.startswith("sqlite:") else "postgresql",
        "spec": result.spec.to_dict(),
        "record": result.record,
        "verdict": result.verdict.to_dict(),
    }


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
            faults[name] = getattr(backend, "faults", None)
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
# An adaptive source's loop: gets ``run_one(spec) -> TrialResult`` (runs and
# stores one trial) and the run directory; returns extra ``run.toml`` keys.
Driver = Callable[[Callable[[TrialSpec], TrialResult], RunDir], "dict[str, Any] | None"]


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
        from harness import search

        return search.run_hypothesis(scenario, results_root, progress=progress, workdir=workdir)
    specs, skipped = variant_specs([(v.variant, v) for v in scenario.variants] or [("", scenario)])
    return execute(scenario, specs, results_root, skipped=skipped, progress=progress, workdir=workdir)


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
        frame = store_run(run, results, meta, complete=complete, started=started)
    return RunOutcome(run, frame, complete, skipped or [])


def store_run(run: RunDir, results: list[TrialResult], meta: dict[str, Any], *, complete: bool, started: float) -> pd.DataFrame:
    """Write the tables, the summary and the final ``run.toml``; return the trials frame."""
    trials = pd.DataFrame([trial_row(r) for r in results])
    timeline = pd.DataFrame([row for r in results for row in r.timeline])
    effects_frames = [r.effects.assign(trial_id=r.spec.trial_id) for r in results if not r.effects.empty]
    effects = pd.concat(effects_frames, ignore_index=True) if effects_frames else pd.DataFrame()
    run.write_table("trials", trials)
    run.write_table("timeline", timeline)
    run.write_table("effects", effects)
    meta = dict(meta)
    meta.update(status="complete" if complete else "partial", finished=time.time(), duration_s=time.time() - started, n_trials=len(results))
    run.write_meta(meta)
    try:
        report.write_all(run, meta, trials, timeline, effects)  # summary.md, plots/*.png, report.html
    except Exception as exc:  # the tables are stored: `cutbench report RUN` can retry; never lose a run to a plot
        run.write_text("summary.md", summary.render(meta, trials))
        run.update_meta(report_error=f"{type(exc).__name__}: {exc}")
    run.mark_latest()
    return trials
