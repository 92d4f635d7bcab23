"""One trial end to end: spawn the workload, arm its cuts, drive the nemesis,
watch for deadlock, collect the report and the receiver's records, and judge.

``TrialRunner`` runs one ``TrialSpec`` to a ``TrialResult`` in a run's
:class:`~cutbench.harness.runner.session.Session` and never raises for a
failing stage or workload; its cuts are armed by
:mod:`~cutbench.harness.runner.arming`.
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cutbench.errors import HarnessFault, StageRefused
from cutbench.harness.checker import oracle
from cutbench.harness.nemesis.cpu_account import StageSampler
from cutbench.harness.provision.engines import RUN_LABEL
from cutbench.harness.model.plan import position
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.model.trial import TrialRecord, TrialResult, TrialSpec
from cutbench.harness.nemesis.base import CutContext
from cutbench.harness.nemesis.pipeline import execute_cut
from cutbench.harness.runner.arming import Arming, NextCut, TrialState, launcher
from cutbench.harness.runner.coordinator import TrialCoordinator
from cutbench.harness.runner.process import WorkloadProcess
from cutbench.harness.runner.session import Session
from cutbench.interrupts import interruptible, shielded
from cutbench.procs import Child, kill_namespace_inits, spawn
from cutbench.workloads import api as workload_api
from cutbench.workloads.control import ControlFile
from cutbench.workloads.runtime import read_marker

POLL_S = 0.005
RECEIVER_GONE = "the run's receiver is gone"  # why a trial stopped waiting on its workload (never judged)


class TrialRunner(WorkloadProcess):
    """One trial's side effects, from spawn to verdict (see :meth:`run`).

    It and each subclass (one that runs other workloads, a program's, says which in :meth:`runs`) are
    listed in :data:`~cutbench.harness.runner.session.RUNNERS` (the runner package's ``__init__`` fills it);
    ``Session.runner`` picks one.
    """

    @classmethod
    def runs(cls, workload: type) -> bool:
        """Whether this runner runs trials of ``workload`` (the base runs cutbench's workload classes)."""
        return not workload_api.optional(workload, "program")

    def __init__(self, session: Session, spec: TrialSpec, *, plain_launch: bool = False, attempt: int = 0,
                 workload: "type[workload_api.Workload] | None" = None):
        self.s = session
        self.spec = spec
        # Start the workload as the harness starts any process, not through the backend's own launch.
        self.plain_launch = plain_launch
        self.cls = workload or spec.workload_class()  # the class Session.runner chose this runner by
        self.phases = tuple(self.cls.phases)
        # A trial run again (the receiver died during it) gets a key of its own: the first attempt's rows stay apart.
        self.receiver_trial = f"{session.run_id}/{spec.trial_id}" + (f"#{attempt}" if attempt else "")
        self.tdir = session.workdir / spec.trial_id
        self.timeline = Timeline(spec.trial_id, hwm=self._hwm, cpu=StageSampler(self._cpu_processes))
        self.cut_targets: list[Child] = []  # single processes cut instead of the tree (killed at the end)
        self.child: Child | None = None  # the workload's root, re-pointed at each restored copy

    def _hwm(self) -> int | None:
        return self.s.control_client.high_water_mark()

    def _cpu_processes(self) -> dict[str, list[Any]]:
        """The trial's processes by CPU-accounting role, now: its workload (the root and any process a cut
        targets, as handles that know when they were reaped) and the run's receiver (docs/cpu-accounting.md)."""
        out: dict[str, list[Any]] = {"workload": [c for c in (self.child, *self.cut_targets) if c is not None]}
        try:
            receiver = getattr(self.s.receiver, "pid", None)  # a worker session's receiver is the driver's, elsewhere
        except Exception:  # stopped (Unavailable): nothing to read
            receiver = None
        if isinstance(receiver, int):
            out["receiver"] = [receiver]
        return out

    def run(self) -> TrialResult:
        """Spawn, cut, restore, watch, judge. Always returns a :class:`TrialResult`."""
        record, effects = self.observe()
        try:
            reference = self.s.references.get(self.cls, self.spec.params, self.spec.array)
        except HarnessFault as exc:
            record.status, record.error = "unknown", exc.reason
            reference = None
        verdict = oracle.judge(record, effects, reference)
        return TrialResult(self.spec, record, self.timeline.rows(), effects, verdict)

    def labels(self) -> dict[str, str]:
        """The labels of the trial's container, where an engine starts the workload: its run and trial."""
        return {RUN_LABEL: self.s.run_id, "cutbench.trial": self.spec.trial_id}

    def observe(self) -> tuple[TrialRecord, pd.DataFrame]:
        """Start the trial's process, carry out its cuts and watch it to its end; return what was observed (the
        record and the effects), unjudged. Never raises for a failing stage or workload; the trial's directory is
        gone afterwards.

        This is every trial's skeleton. A runner fills its four hooks: :meth:`_prepare` (before anything can
        be interrupted), :meth:`_drive` (the body: start, cuts, run to the end), :meth:`_tear_down` (its
        processes go, whatever stopped the body) and :meth:`_record` (what was observed). What stops the body
        is classed here, once for every runner.
        """
        started = time.monotonic()
        self.tdir.mkdir(parents=True)
        backend = self.s.threads.backend(self.spec.backend)
        state = TrialState()
        self._prepare(backend)
        # The shield before the try: no instant between the body's end and the cleanup's start takes a Ctrl-C.
        with shielded():
            try:
                with interruptible():
                    self._drive(backend, state)
            except HarnessFault as exc:  # the harness could not carry a step out: no verdict
                state.status, state.error = "unknown", exc.reason
            except StageRefused as exc:  # a tool that starts the process declined to (a batch job left pending)
                state.status, state.error, state.failed_stage = "refused", exc.reason, exc.stage
            except Exception as exc:  # harness-side failure: no verdict possible
                state.status, state.error = "unknown", f"harness: {type(exc).__name__}: {exc}"
            finally:  # whole, whatever stopped the body
                self._tear_down(state)
        record, effects = self._record(backend, state, time.monotonic() - started)
        shutil.rmtree(self.tdir, ignore_errors=True)
        return record, effects

    # -- the skeleton's hooks, for a workload of cutbench's ------------------
    def _prepare(self, backend: Any) -> None:
        """What the trial needs before its body runs: the control file the workload parks on, and the
        coordinator of its certificates and fences."""
        spec = self.spec
        self.control = ControlFile.create(self.tdir / "control")
        self.domains = sorted(workload_api.declared_domains(self.cls, spec.params))
        features = workload_api.declared_features(self.cls, spec.params, workload_api.resolve_array(self.cls, spec.array))
        self.coordinator = TrialCoordinator(self.s.control_client, self.receiver_trial, spec.receiver_mode,
                                            spec.arm.certify, self.control, self.phases, tuple(self.domains),
                                            tuple(sorted(backend.capabilities.covers)), features=tuple(sorted(features)),
                                            support=self.s.support.of(spec.backend))
        self.companions: list[Child] = []

    def _drive(self, backend: Any, state: TrialState) -> None:
        """Spawn the workload (and its companions), carry out the plan's cuts, let it run to its end."""
        spec, control = self.spec, self.control
        self.s.control_client.open_trial(self.receiver_trial, spec.receiver_mode)
        config = self._write_config()
        with shielded():  # each companion's handle kept before an interrupt goes on
            self.companions = self._start_companions(config)
        arming = Arming(control, spec.cut_plan(), self.phases)
        seq = arming.arm(0)
        # A backend that must own the workload's start (a container engine) launches it itself.
        launch = spawn if self.plain_launch else launcher(backend, self.labels())
        if launch is spawn and self._own_pid_namespace(backend, self.domains):
            launch, state.facts["pid_namespace"] = functools.partial(spawn, pid_namespace=True), 1
        with self.timeline.stage("spawn"), shielded():  # no interrupt between the fork and the handle
            child = self.child = launch([sys.executable, "-m", "cutbench.workloads.launch", str(config)],
                                        cwd=str(self.tdir))
        self._cuts(arming, child, backend, seq, state)
        if state.status not in ("unknown", "deadlock") and not state.down:
            self._run_to_end(control, child, state)
        if state.status in ("completed", "refused"):
            self.coordinator.finish()  # a fenced receiver releases what the finished run sent

    def _tear_down(self, state: TrialState) -> None:
        """The trial's processes go (the workload's tree, its companions, what a cut targeted), its last output
        and position kept first."""
        child = self.child
        if child is not None and child.alive():
            child.kill()
        # A container's own output goes with it: keep its last lines for a trial that needs them.
        self.output = ""
        try:
            if child is not None and state.status in ("unknown", "deadlock", "lost"):
                self.output = child.output_tail()
        finally:
            if child is not None:
                child.kill_groups()  # also what an interrupted restore left behind
            # (No child: a stop, SIGTERM or Ctrl-C, came while the workload was being launched.)
            if child is not None and child.pid_namespace:
                # A restored init no handle learnt (a restore that failed half-way) works in this trial's directory.
                kill_namespace_inits(cwd=self.tdir)
        for companion in [*self.companions, *self.cut_targets]:
            companion.kill()
        self.position = self._last_position(self.control, state)
        self.fresh_starts = self.control.get("fresh_starts")
        self.control.close()

    def _record(self, backend: Any, state: TrialState, duration_s: float) -> tuple[TrialRecord, pd.DataFrame]:
        """The trial's record (its report, where it stood, its certificates) and the receiver's rows."""
        spec, child = self.spec, self.child
        report = self._read_report()
        progress_op, progress_phase = self.position
        record = TrialRecord(
            trial_id=spec.trial_id,
            status=state.status,
            error=state.error,
            failed_stage=state.failed_stage,
            exit_code=child.returncode if child else None,
            restores=state.restores,
            cut_outcomes=state.outcomes,
            report=report,
            marker_op=read_marker(self.tdir / "marker"),
            progress_op=progress_op,
            progress_phase=progress_phase,
            # A workload may use more domains on some devices (CuPy: "cuda"); its report says so.
            workload_domains=sorted(set(self.domains) | set((report or {}).get("domains", ()))),
            covered_domains=sorted(backend.capabilities.covers),
            joined_domains=sorted(state.joined or ()),
            duration_s=duration_s,
            facts=state.facts,
            log_tail=(self._log_tail() or self.output) if state.status in ("unknown", "deadlock", "lost") else "",
            certificates=self.coordinator.certificates,
            cut_evidence=state.evidence,
            fresh_starts=self.fresh_starts,
        )
        effects, store_error = self._effects()
        if store_error:
            record.status, record.error = "unknown", store_error
        latencies = self.coordinator.release_latencies(effects)
        if latencies:
            record.facts["release_latency_median_s"] = float(np.median(latencies))
            record.facts["release_latency_p99_s"] = float(np.percentile(latencies, 99))
        return record, effects

    def _cuts(self, arming: "Arming", child: Child, backend: Any, seq: int | None, state: "TrialState") -> None:
        """Carry out the plan's cuts in order (``seq``: the first one's arm sequence); stop at the first that
        hangs, fails or is refused."""
        spec, plan, control = self.spec, arming.plan, arming.control
        for i, cut in enumerate(plan.cuts):
            # All but this worker's latest image are gone before it writes another: at most two at once.
            self.s.images.settle()
            reached = self._reach(control, child, cut, seq, i)
            if reached == "deadlock":
                state.status, state.error = "deadlock", f"no progress for {spec.watchdog_s:g}s before cut {i} at {cut.op}/{cut.phase}"
                return
            if reached:
                state.status, state.error = "unknown", reached
                return
            ctx = CutContext(
                images_dir=Path(spec.images_dir) / f"cutbench-{self.s.run_id}-{spec.trial_id}-c{i}",
                timeline=self.timeline,
                cut_index=i,
                cut=cut,
                stage_timeout_s=spec.stage_timeout_s,
                prepare_timeout_s=spec.prepare_timeout_s,
                control=control,
                certifier=self.coordinator.for_cut(i, cut),
                phases=self.phases,
                criu_options=spec.arm.criu_options,
            )
            following = NextCut(arming, i, seq, cut.fault)
            target = self._cut_target(control, child)
            at_cut = (control.get("progress_op"), control.get("progress_phase"))
            outcome = execute_cut(backend, target, ctx, release=following.release, before_resume=following.before_resume,
                                  keep_images=spec.keep_images, discard=self.s.images.discard)
            # Until the resumed workload passes a point, the slots may show where a
            # crashed (leave_running) process got to; it really stands at the cut.
            state.resumed_at = (at_cut, control.get("progress_count"))
            state.outcomes.append(asdict(outcome))
            for key, value in ctx.facts.items():
                if key == "harness_action" and state.facts.get(key):  # every cut's repairs, not the last one's
                    value = f"{state.facts[key]}; cut {i}: {value}"
                state.facts[key] = state.facts.get(key, 0) + value if isinstance(value, (int, float)) else value
            state.evidence.append(self.coordinator.evidence_of(ctx.certifier))
            if outcome.status == "restored":
                state.restores += 1
                ctx.certifier.restored()
                joined = set(ctx.certifier.evidence.adapters)
                state.joined = joined if state.joined is None else state.joined & joined
            if outcome.stage == "certify_restore":
                # The certificate declined the restore: the crashed workload stays down; a safe refusal.
                state.status, state.error, state.failed_stage, state.down = "refused", outcome.error, outcome.stage, True
                return
            if outcome.status in ("refused", "failed", "error"):
                # refused: the workload goes on to its end; failed: the tool took the
                # application with it (``lost``); error: the harness's own (``unknown``).
                state.status = {"refused": "refused", "failed": "lost", "error": "unknown"}[outcome.status]
                state.error, state.failed_stage = outcome.error, outcome.stage
                state.down = state.down or outcome.status == "failed"
                if following.next_seq is not None:  # the plan stops here: do not leave the next cut armed
                    control.release(following.next_seq)
                return
            if outcome.status == "resumed":
                following.ensure_armed()
            seq = following.next_seq

    def _run_to_end(self, control: ControlFile, child: Child, state: "TrialState") -> None:
        """Let the workload finish after the last cut and fold how it ended into the status."""
        finished = self._finish(control, child)
        if finished == "deadlock":
            stalled = f"no progress for {self.spec.watchdog_s:g}s"
            if state.status == "refused":  # the tool declined, said it let the process go on, and it stopped: its words
                stalled += f" after the {state.failed_stage} refusal ({state.error})"
            state.status, state.error = "deadlock", stalled
        elif (finished.startswith("workload exit") and state.status == "completed" and self._came_back(state)
              and workload_api.records_reference(self.cls)):
            # The tool brought the process back and it died on its own afterwards: the restore's failure, not the
            # harness's, because the uninterrupted control runs of this (recorded-reference) workload ran to their
            # end. A model-reference workload has no such control in the run: its exit stays unknown below.
            last = (self._log_tail(3) or "no log line").splitlines()[-1]
            state.status, state.failed_stage = "lost", "after_restore" if state.restores else "after_resume"
            state.error = f"the {'restored' if state.restores else 'resumed'} workload ended with {finished}: {last}"
        elif finished and state.status == "completed":
            state.status, state.error = "unknown", finished
        elif finished and state.status == "refused" and "exit" in finished:
            # A refusal that killed the workload was not a clean refusal.
            state.status, state.error = "unknown", f"{state.error}; then {finished}"

    @staticmethod
    def _came_back(state: "TrialState") -> bool:
        """Whether a cut of this trial restored the workload or resumed it in place."""
        return any(o.get("status") in ("restored", "resumed") for o in state.outcomes)

    def _last_position(self, control: ControlFile, state: "TrialState") -> tuple[int, str]:
        """Where the workload stood last (op, phase name), as its control slots say."""
        progress_op, phase_index = control.get("progress_op"), control.get("progress_phase")
        if state.resumed_at is not None and control.get("progress_count") == state.resumed_at[1]:
            progress_op, phase_index = state.resumed_at[0]
        passed = control.get("progress_count") and 0 <= phase_index < len(self.phases)
        return progress_op, self.phases[phase_index] if passed else ""

    # -- steps -------------------------------------------------------------
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
                if seq is None and fresh and control.position(len(self.phases)) >= target:
                    time.sleep(cut.async_offset_ms / 1000.0)
                    extra["detail"] = f"async +{cut.async_offset_ms:g}ms after {cut.op}/{cut.phase}"
                    return ""
                rc = child.poll()
                if rc is not None:
                    return f"workload exited ({rc}) before cut {i} at {cut.op}/{cut.phase}{self._last_words(child)}"
                now = time.monotonic()
                if count != last_count:
                    last_count, last_change = count, now
                elif i > 0 and now - last_change > self.spec.watchdog_s:
                    extra["detail"] = "watchdog"
                    return "deadlock"
                if time.monotonic() > deadline:
                    return f"workload did not reach cut {i} at {cut.op}/{cut.phase} within {self.spec.stage_timeout_s:g}s"
                if self._receiver_gone():
                    return RECEIVER_GONE
                time.sleep(POLL_S)

    def _receiver_gone(self) -> bool:
        """Whether the run's receiver died for good: nothing the workload sends can be stored, so waiting on it
        is pointless (the session stops the run once this trial returns)."""
        return self.s.watch is not None and self.s.watch.lost is not None

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
                if self._receiver_gone():
                    child.kill()
                    extra["detail"] = "receiver lost"
                    return RECEIVER_GONE
                time.sleep(POLL_S * 2)

    def _effects(self) -> tuple[pd.DataFrame, str]:
        """The receiver's rows for this trial, and why they could not be read ("" when they could)."""
        try:
            return self.s.effects(self.receiver_trial), ""
        except Exception as exc:  # a store we cannot read makes the verdict unknown
            return oracle.empty_effects(), f"cannot read receiver store: {exc}"

