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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness import checkpointers, environment, oracle, report, scheduler, summary
from harness.checkpointers.base import CutContext
from harness.errors import InvalidArgument, Unavailable
from harness.pipeline import execute_cut
from harness.plan import CutPlan
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
        spec.cut_plan()  # validates
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
            specs.append(
                TrialSpec(
                    trial_id=f"t{i:04d}",
                    index=i,
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
            )
    return specs


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
        facts: dict[str, Any] = {}
        try:
            self.s.control_client.open_trial(self.receiver_trial, spec.receiver_mode)
            config = self._write_config()
            seq = self._arm(control, plan, 0)
            with self.timeline.stage("spawn"):
                child = spawn([sys.executable, "-m", "workloads.launch", str(config)], cwd=str(self.tdir))
            for i, cut in enumerate(plan.cuts):
                reached = self._reach(control, child, cut, seq, i)
                if reached:
                    status, error = "unknown", reached
                    break
                ctx = CutContext(
                    images_dir=Path(spec.images_dir) / f"cutbench-{self.s.run_id}-{spec.trial_id}-c{i}",
                    timeline=self.timeline,
                    cut_index=i,
                    cut=cut,
                    stage_timeout_s=spec.stage_timeout_s,
                )
                next_seq: list[int | None] = [None]

                def before_resume(i: int = i) -> None:
                    control.set("incarnation", control.get("incarnation") + 1)
                    next_seq[0] = self._arm(control, plan, i + 1)

                release = (lambda s=seq: control.release(s)) if seq is not None else (lambda: None)
                outcome = execute_cut(backend, child, ctx, release=release, before_resume=before_resume, keep_images=spec.keep_images)
                outcomes.append(asdict(outcome))
                for key, value in ctx.facts.items():
                    facts[key] = facts.get(key, 0) + value if isinstance(value, (int, float)) else value
                if outcome.status == "restored":
                    restores += 1
                if outcome.status in ("refused", "failed"):
                    status = "refused" if outcome.status == "refused" else "unknown"
                    error, failed_stage = outcome.error, outcome.stage
                    break
                if outcome.status == "resumed":
                    next_seq[0] = self._arm(control, plan, i + 1)
                seq = next_seq[0]
            if status != "unknown":
                finished = self._finish(control, child)
                if finished == "deadlock":
                    status, error = "deadlock", f"no progress for {spec.watchdog_s:g}s at op {control.get('progress_op')}"
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
            progress_op = control.get("progress_op")
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
            "workload_domains": sorted(self.cls.domains),
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

    def _arm(self, control: ControlFile, plan: CutPlan, index: int) -> int | None:
        """Arm cut ``index`` if it is precise; return its sequence (None: async or none left)."""
        if index >= len(plan.cuts) or plan.cuts[index].mode != "precise":
            return None
        cut = plan.cuts[index]
        return control.arm(cut.op, self.phases.index(cut.phase))

    def _reach(self, control: ControlFile, child: Child, cut: Any, seq: int | None, i: int) -> str:
        """Wait until the workload is at the cut (parked, or past the async point + offset).

        Returns "" when reached, else why not (the trial becomes ``unknown``).
        """
        deadline = time.monotonic() + self.spec.stage_timeout_s
        target = cut.op * len(self.phases) + self.phases.index(cut.phase)
        with self.timeline.stage("reach_cut", i) as extra:
            while True:
                if seq is not None and control.get("parked_seq") >= seq:
                    extra["detail"] = f"parked at {cut.op}/{cut.phase}"
                    return ""
                if seq is None:
                    pos = control.get("progress_op") * len(self.phases) + control.get("progress_phase")
                    if pos >= target and control.get("progress_count") > 0:
                        time.sleep(cut.async_offset_ms / 1000.0)
                        extra["detail"] = f"async +{cut.async_offset_ms:g}ms after {cut.op}/{cut.phase}"
                        return ""
                rc = child.poll()
                if rc is not None:
                    return f"workload exited ({rc}) before cut {i} at {cut.op}/{cut.phase}"
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
            return pd.DataFrame(columns=["op_id", "digest", "decision"])


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
    for stage in ("criu_dump", "criu_restore", "cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock"):
        row[f"{stage}_s"] = durations.get(stage)
    return row


def trial_file(result: TrialResult, run_id: str, store: str) -> dict[str, Any]:
    """The content of ``trials/<id>.json``: spec (for replay), record and verdict."""
    return {
        "run_id": run_id,
        "store": store if store == "sqlite" or store.startswith("sqlite:") else "postgresql",
        "spec": result.spec.to_dict(),
        "record": result.record,
        "verdict": {"outcome": result.verdict.outcome, "findings": [f.to_dict() for f in result.verdict.findings]},
    }


def check_backends(scenario: Scenario) -> tuple[list[Arm], list[dict[str, str]]]:
    """Split the scenario's arms into runnable ones and skipped ones (with the reason).

    Raises :class:`Unavailable` when a backend cannot run and the scenario does
    not allow skipping (``pipeline.skip_unavailable``).
    """
    reasons: dict[str, str | None] = {}
    for name in scenario.backends:
        try:
            reasons[name] = checkpointers.get(name).unavailable_reason()
        except Unavailable as exc:
            reasons[name] = str(exc)
    runnable, skipped = [], []
    for arm in scenario.arms():
        reason = reasons[arm.backend]
        if reason is None:
            runnable.append(arm)
        elif scenario.skip_unavailable:
            skipped.append({"arm": arm.label(), "reason": reason})
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
        from harness import search

        return search.run_hypothesis(scenario, results_root, progress=progress, workdir=workdir)
    arms, skipped = check_backends(scenario)
    specs = build_specs(scenario, arms)
    return execute(scenario, specs, results_root, skipped=skipped, progress=progress, workdir=workdir)


def execute(
    scenario: Scenario,
    specs: list[TrialSpec],
    results_root: str | Path,
    *,
    skipped: list[dict[str, str]] | None = None,
    progress: ProgressFn | None = None,
    workdir: str | Path | None = None,
    name: str | None = None,
    extra_meta: dict[str, Any] | None = None,
) -> RunOutcome:
    """Run ``specs`` in one session and write the run directory; return the :class:`RunOutcome`.

    ``extra_meta`` adds top-level keys to ``run.toml`` (a sweep records its axes there).
    """
    run = RunDir.create(results_root, name or scenario.name)
    started = time.time()
    meta = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "status": "running",
        "started": started,
        "cutbench_version": environment.cutbench_version(),
        "scenario": scenario.to_dict(),
        "environment": environment.collect(),
        "skipped_arms": skipped or [],
        "n_trials_planned": len(specs),
        **(extra_meta or {}),
    }
    run.write_meta(meta)
    results: list[TrialResult] = []
    complete = False
    try:
        with Session(run.run_id, scenario.store, workdir=workdir) as session:
            for spec in specs:
                result = session.run_trial(spec)
                results.append(result)
                run.write_trial(spec.trial_id, trial_file(result, run.run_id, scenario.store))
                if progress:
                    progress(result, len(results), len(specs))
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
