"""One trial end to end: spawn the workload, arm its cuts, drive the nemesis,
watch for deadlock, collect the report and the receiver's records, and judge.

``Session`` holds what a run's trials share (the receiver, a work directory,
backend instances, the subreaper); ``TrialRunner`` runs one ``TrialSpec``
to a ``TrialResult`` and never raises for a failing stage or workload.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cutbench.errors import HarnessFault
from cutbench.harness import nemesis as checkpointers
from cutbench.harness.checker import oracle
from cutbench.harness.environment.cpu_account import StageSampler
from cutbench.harness.environment.engines import RUN_LABEL
from cutbench.harness.model.plan import CutPlan, position
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.model.trial import TrialRecord, TrialResult, TrialSpec
from cutbench.harness.nemesis.base import CutContext, remove_tree
from cutbench.harness.nemesis.pipeline import execute_cut
from cutbench.harness.runner.coordinator import TrialCoordinator
from cutbench.procs import Child, become_subreaper, kill_namespace_inits, spawn
from cutbench.workloads import api as workload_api
from cutbench.workloads.control import ControlFile
from cutbench.workloads.runtime import WorkloadConfig, read_marker, write_marker

POLL_S = 0.005


class Session:
    """Run-level resources: the receiver, a work directory, backends, the subreaper.

    Use as a context manager; leaving it stops the receiver and removes the
    work directory, whatever happened inside.

    Several threads may run trials of one session at once (``run.jobs``):
    each thread gets its own receiver client (the client is single-threaded
    by design) and its own backend instances (a backend keeps a cut's state
    on itself). ``pid_namespace``: start each workload tree as the init of a
    PID namespace of its own where the backend declares that it copes
    (``pid_namespace`` on the class; see ``cutbench.procs``).
    """

    workdir_tag = ""  # in the work directory's name, after the run id

    def __init__(self, run_id: str, store: str = "sqlite", workdir: str | Path | None = None, *,
                 pid_namespace: bool = False, listen: str = "127.0.0.1:0", token: str | None = None):
        self.run_id = run_id
        # Where the receiver listens and the secret its clients present: loopback and none, unless trials run
        # on other machines (a Ray cluster), which reach it on a routable address that needs the token.
        self.listen = listen
        self.token = token
        self.store_spec = store
        self.pid_namespace = pid_namespace
        self._workdir_arg = workdir
        self._backends: dict[str, Any] = {}  # instances put here by name serve every thread as they are
        self._local = threading.local()  # this thread's backends and receiver client
        self._clients: list[Any] = []  # every thread's client, closed on exit
        self._clients_lock = threading.Lock()
        self._discards: list[tuple[int, threading.Thread]] = []  # (worker thread, its removal) of image directories
        self._discards_lock = threading.Lock()
        # What _open_receiver returns (a ReceiverHandle here, a stand-in for the driver's in a WorkerSession); None until __enter__.
        self.receiver: Any = None
        # Ground truth recorded on this machine (workloads with ground_truth = "recorded"), by reference_key.
        self.recordings: dict[str, workload_api.RecordedReference] = {}
        # The measured support matrix the certificates ask about declared CUDA features (pipeline.support_matrix),
        # this machine's driver, and per backend what the matrix says ({fault: {feature: (cell, where)}}).
        self.support_matrix: pd.DataFrame | None = None
        self.driver = self.criu_version = ""
        self.supports: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}

    def __enter__(self) -> "Session":
        become_subreaper()
        base = Path(self._workdir_arg) if self._workdir_arg else None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"cutbench-{self.run_id}-{self.workdir_tag}", dir=base))
        try:
            self.receiver = self._open_receiver()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _open_receiver(self) -> Any:
        """Start the run's receiver on its store (``sqlite``: a file in the work directory); return its handle."""
        from cutbench.receivers.process import start_receiver

        self.store_url = f"sqlite:{self.workdir / 'receiver.sqlite'}" if self.store_spec == "sqlite" else self.store_spec
        return start_receiver(self.store_url, self.workdir, listen=self.listen, token=self.token,
                              allow_remote=self.token is not None)

    def __exit__(self, *exc: Any) -> None:
        try:
            self.drain_discards()
        finally:  # a second Ctrl-C during the wait still stops the receiver and removes the work directory
            with self._clients_lock:
                clients, self._clients = self._clients, []
            for client in clients:
                try:
                    client.close()
                except Exception:
                    pass
            if self.receiver is not None:
                self.receiver.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def discard_images(self, path: Path) -> None:
        """Remove a finished cut's image directory in the background; returns at once.

        Freeing a GiB-sized image (tmpfs pages) takes a tenth of a second or
        more (0.3–0.4 s at 16 trials at once on the H200), and nothing of the
        trial waits for it: the next cut has a directory of its own. Before it
        writes one, a worker waits for all but its latest removal
        (:meth:`settle_discards`), so it holds at most two images at once:
        the one it writes and the one being freed. The session waits for every
        removal before it ends (:meth:`drain_discards`): no image directory
        outlives the run.
        """
        worker = threading.Thread(target=remove_tree, args=(path,), name=f"discard {path.name}")
        with self._discards_lock:  # started under the lock: a thread in the list has always started
            try:
                worker.start()
            except RuntimeError:  # no thread to be had: remove it here and now
                remove_tree(path)
                return
            self._discards = [(o, t) for o, t in self._discards if t.is_alive()] + [(threading.get_ident(), worker)]

    def settle_discards(self, keep: int = 1) -> None:
        """Wait until at most ``keep`` of the image directories this thread handed to :meth:`discard_images`
        are still being removed (the latest ones), none with ``keep = 0``."""
        me = threading.get_ident()
        with self._discards_lock:
            mine = [t for o, t in self._discards if o == me and t.is_alive()]
        for worker in mine[:max(0, len(mine) - keep)]:
            worker.join()

    def drain_discards(self) -> None:
        """Wait until every image directory handed to :meth:`discard_images` is gone."""
        with self._discards_lock:
            pending, self._discards = self._discards, []
        for _, worker in pending:
            worker.join()

    def reference(self, cls: type[workload_api.Workload], params: dict[str, Any], array: str = "auto") -> Any:
        """``cls.reference(params)``, built once per parameter set and thread, and kept for the run's trials.

        A reference is ground truth for its parameters alone and caches its
        answers: a sweep's trials (same parameters) ask it again and again, so
        one copy answers them instead of each trial recomputing it. One per
        thread, because a reference may advance a model as it is asked
        (``ReplayReference``) and the protocol does not ask it to be
        thread-safe.

        A workload whose ground truth is recorded (``ground_truth =
        "recorded"``) gets the recording :meth:`record_references` made for
        ``params`` on ``array``; :class:`~cutbench.errors.HarnessFault` when
        there is none (the trial is ``unknown``: nothing to judge it by).
        """
        if workload_api.records_reference(cls):
            key = workload_api.reference_key(cls.name, params, workload_api.resolve_array(cls, array))
            if key not in self.recordings:
                raise HarnessFault("judge", f"no recorded reference {key} for workload {cls.name!r}: the run records "
                                            "one before its trials (Session.record_references)")
            return self.recordings[key]
        if not hasattr(self._local, "references"):
            self._local.references = {}
        references = self._local.references
        ref_key = (f"{cls.__module__}:{cls.__qualname__}", json.dumps(params, sort_keys=True, default=str))
        if ref_key not in references:
            references[ref_key] = cls.reference(params)
        return references[ref_key]

    @property
    def control_client(self) -> Any:
        """This thread's client of the run's receiver (None before the receiver runs)."""
        from cutbench.receivers.client import ReceiverClient

        client = getattr(self._local, "client", None)
        if client is None and self.receiver is not None:
            client = self._local.client = ReceiverClient(self.receiver.address, token=self.token)
            with self._clients_lock:
                self._clients.append(client)
        return client

    def backend(self, name: str) -> Any:
        """This thread's (cached) backend instance for ``name``."""
        if name in self._backends:
            return self._backends[name]
        if not hasattr(self._local, "backends"):
            self._local.backends = {}
        backends = self._local.backends
        if name not in backends:
            backends[name] = checkpointers.get(name)
        return backends[name]

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

    def support(self, backend: str) -> dict[str, dict[str, tuple[str, str]]]:
        """What the support matrix says of ``backend`` here: ``{fault: {feature: (cell, where)}}`` (empty
        without a matrix: every declared feature is then unmeasured)."""
        if backend not in self.supports:
            from cutbench.harness.checker.matrix import support_for

            table = self.support_matrix
            self.supports[backend] = support_for(table, backend, self.driver, self.criu_version) if table is not None else {}
        return self.supports[backend]

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one trial to its verdict; never raises for a failing stage or workload."""
        return TrialRunner(self, spec).run()

    def record_references(self, specs: Iterable[TrialSpec], jobs: int = 1, *, machine: dict[str, Any] | None = None,
                          keep: Callable[[str, workload_api.RecordedReference], None] | None = None) -> dict[str, str]:
        """Record the ground truth of every recorded-reference workload among ``specs``; return ``{key: why not}``.

        For each distinct (workload, parameters, array backend) whose class
        declares ``ground_truth = "recorded"``, two uninterrupted runs (the
        spec without cuts, through the same backend's launch) are made, ``jobs``
        at a time. Where both completed and agree op for op, the recording is
        kept for :meth:`reference` and handed to ``keep(key, recording)`` (the
        run stores it); where a run failed, or the two disagree (the workload
        is not deterministic here), the reason is returned under its key and
        nothing is kept: the caller runs none of its trials, so a workload
        that cannot be judged never turns into findings. ``machine`` (the
        run's :func:`~cutbench.harness.environment.record.fingerprint`) is
        written into each recording.
        """
        todo: dict[str, TrialSpec] = {}
        for spec in specs:
            cls = workload_api.load(spec.workload)
            if workload_api.records_reference(cls):
                key = workload_api.reference_key(cls.name, spec.params, workload_api.resolve_array(cls, spec.array))
                if key not in self.recordings:
                    todo.setdefault(key, spec)
        failures: dict[str, str] = {}
        running: set[int] = set()  # idents of the threads inside a control run (a Ctrl-C is raised in each)
        lock = threading.Lock()

        def record(key: str, spec: TrialSpec) -> None:
            with lock:
                running.add(threading.get_ident())
            try:
                control_runs(key, spec)
            finally:
                with lock:
                    running.discard(threading.get_ident())

        def control_runs(key: str, spec: TrialSpec) -> None:
            cls = workload_api.load(spec.workload)
            array = workload_api.resolve_array(cls, spec.array)
            runs: list[workload_api.RecordedReference] = []
            for n in (1, 2):
                clean = replace(spec, trial_id=f"ref-{key}-{n}", plan={"cuts": []}, variant="")
                # Started as the harness starts any process, whatever the trials' backend (a container engine
                # may not reach the GPU): the recording is of the workload, not of a tool.
                record, effects = TrialRunner(self, clean, plain_launch=True).observe()
                if record.status != "completed" or record.exit_code != 0:
                    tail = f"; workload log: {record.log_tail[-1500:]}" if record.log_tail else ""
                    failures[key] = (f"its uninterrupted run {n} of 2 did not complete ({record.status}, exit "
                                     f"{record.exit_code}): {record.error or 'no error given'}{tail}")
                    return
                try:
                    runs.append(workload_api.RecordedReference.from_run(cls.name, spec.params, array, effects,
                                                                        record.report, machine))
                except workload_api.WorkloadError as exc:
                    failures[key] = f"its uninterrupted run {n} of 2 cannot be a reference: {exc}"
                    return
            differs = runs[0].first_difference(runs[1])
            if differs:
                failures[key] = f"not deterministic on this machine: two uninterrupted runs differ at {differs}"
                return
            runs[0].runs = 2
            self.recordings[key] = runs[0]
            if keep is not None:
                keep(key, runs[0])

        pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1)), thread_name_prefix="cutbench-ref")
        futures = [pool.submit(record, key, spec) for key, spec in todo.items()]
        try:
            for future in futures:
                future.result()
        except BaseException:
            # Ctrl-C (or a harness error): start no more control runs, and interrupt the running ones, which
            # clean up as a trial does; wait for them, so none outlives the session's receiver.
            pool.shutdown(wait=False, cancel_futures=True)
            with lock:
                for ident in running:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
            for future in futures:
                try:
                    future.result()
                except BaseException:
                    pass
            raise
        pool.shutdown()
        return failures


class TrialRunner:
    """One trial's side effects, from spawn to verdict (see :meth:`run`)."""

    def __init__(self, session: Session, spec: TrialSpec, *, plain_launch: bool = False):
        self.s = session
        self.spec = spec
        # Start the workload as the harness starts any process, not through the backend's own launch.
        self.plain_launch = plain_launch
        self.cls = workload_api.load(spec.workload)
        self.phases = tuple(self.cls.phases)
        self.receiver_trial = f"{session.run_id}/{spec.trial_id}"
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
            reference = self.s.reference(self.cls, self.spec.params, self.spec.array)
        except HarnessFault as exc:
            record.status, record.error = "unknown", exc.reason
            reference = None
        verdict = oracle.judge(record, effects, reference)
        return TrialResult(self.spec, record, self.timeline.rows(), effects, verdict)

    def observe(self) -> tuple[TrialRecord, pd.DataFrame]:
        """Spawn, cut, restore and watch; return what was observed (record and the receiver's rows), unjudged.
        Never raises for a failing stage or workload; the trial's directory is gone afterwards."""
        spec = self.spec
        started = time.monotonic()
        self.tdir.mkdir(parents=True)
        control = ControlFile.create(self.tdir / "control")
        backend = self.s.backend(spec.backend)
        domains = sorted(workload_api.declared_domains(self.cls, spec.params))
        self.coordinator = TrialCoordinator(self.s.control_client, self.receiver_trial, spec.receiver_mode,
                                            spec.arm.get("certify", "off"), control, self.phases, tuple(domains),
                                            tuple(sorted(backend.capabilities.covers)),
                                            features=tuple(sorted(workload_api.declared_features(
                                                self.cls, spec.params, workload_api.resolve_array(self.cls, spec.array)))),
                                            support=self.s.support(spec.backend))
        state = _TrialState()
        child: Child | None = None
        companions: list[Child] = []
        try:
            self.s.control_client.open_trial(self.receiver_trial, spec.receiver_mode)
            config = self._write_config()
            companions = self._start_companions(config)
            seq = self._arm(control, spec.cut_plan(), 0)
            # A backend that must own the workload's start (a container engine) launches it itself.
            labels = {RUN_LABEL: self.s.run_id, "cutbench.trial": spec.trial_id}
            launch = spawn if self.plain_launch else _launcher(backend, labels)
            if launch is spawn and self._own_pid_namespace(backend, domains):
                launch, state.facts["pid_namespace"] = functools.partial(spawn, pid_namespace=True), 1
            with self.timeline.stage("spawn"):
                child = self.child = launch([sys.executable, "-m", "cutbench.workloads.launch", str(config)],
                                            cwd=str(self.tdir))
            self._cuts(control, child, backend, seq, state)
            if state.status not in ("unknown", "deadlock") and not state.down:
                self._run_to_end(control, child, state)
            if state.status in ("completed", "refused"):
                self.coordinator.finish()  # a fenced receiver releases what the finished run sent
        except Exception as exc:  # harness-side failure: no verdict possible
            state.status, state.error = "unknown", f"harness: {type(exc).__name__}: {exc}"
        finally:
            if child is not None and child.alive():
                child.kill()
            # A container's own output goes with it: keep its last lines for a trial that needs them.
            output = ""
            try:
                if child is not None and state.status in ("unknown", "deadlock", "lost"):
                    output = child.output_tail()
            finally:
                if child is not None:
                    child.kill_groups()  # also what an interrupted restore left behind
                # (No child: a stop, SIGTERM or Ctrl-C, came while the workload was being launched.)
                if child is not None and child.pid_namespace:
                    # A restored init no handle learnt (a restore that failed half-way) works in this trial's directory.
                    kill_namespace_inits(cwd=self.tdir)
            for companion in [*companions, *self.cut_targets]:
                companion.kill()
            progress_op, progress_phase = self._last_position(control, state)
            fresh_starts = control.get("fresh_starts")
            control.close()
        report = self._read_report()
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
            workload_domains=sorted(set(domains) | set((report or {}).get("domains", ()))),
            covered_domains=sorted(backend.capabilities.covers),
            joined_domains=sorted(state.joined or ()),
            duration_s=time.monotonic() - started,
            facts=state.facts,
            log_tail=(self._log_tail() or output) if state.status in ("unknown", "deadlock", "lost") else "",
            certificates=self.coordinator.certificates,
            cut_evidence=state.evidence,
            fresh_starts=fresh_starts,
        )
        effects, store_error = self._effects()
        if store_error:
            record.status, record.error = "unknown", store_error
        latencies = self.coordinator.release_latencies(effects)
        if latencies:
            record.facts["release_latency_median_s"] = float(np.median(latencies))
            record.facts["release_latency_p99_s"] = float(np.percentile(latencies, 99))
        shutil.rmtree(self.tdir, ignore_errors=True)
        return record, effects

    def _cuts(self, control: ControlFile, child: Child, backend: Any, seq: int | None, state: "_TrialState") -> None:
        """Carry out the plan's cuts in order; stop at the first that hangs, fails or is refused."""
        spec, plan = self.spec, self.spec.cut_plan()
        for i, cut in enumerate(plan.cuts):
            # All but this worker's latest image are gone before it writes another: at most two at once.
            self.s.settle_discards()
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
            )
            arming = _NextCut(self, control, plan, i, seq, cut.fault)
            target = self._cut_target(control, child)
            at_cut = (control.get("progress_op"), control.get("progress_phase"))
            outcome = execute_cut(backend, target, ctx, release=arming.release, before_resume=arming.before_resume,
                                  keep_images=spec.keep_images, discard=self.s.discard_images)
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
                if arming.next_seq is not None:  # the plan stops here: do not leave the next cut armed
                    control.release(arming.next_seq)
                return
            if outcome.status == "resumed":
                arming.ensure_armed()
            seq = arming.next_seq

    def _run_to_end(self, control: ControlFile, child: Child, state: "_TrialState") -> None:
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
    def _came_back(state: "_TrialState") -> bool:
        """Whether a cut of this trial restored the workload or resumed it in place."""
        return any(o.get("status") in ("restored", "resumed") for o in state.outcomes)

    def _last_position(self, control: ControlFile, state: "_TrialState") -> tuple[int, str]:
        """Where the workload stood last (op, phase name), as its control slots say."""
        progress_op, phase_index = control.get("progress_op"), control.get("progress_phase")
        if state.resumed_at is not None and control.get("progress_count") == state.resumed_at[1]:
            progress_op, phase_index = state.resumed_at[0]
        passed = control.get("progress_count") and 0 <= phase_index < len(self.phases)
        return progress_op, self.phases[phase_index] if passed else ""

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
            receiver_token=self.s.token,
            array_backend=self.spec.array,
        )
        # The commit marker exists at its full width before the workload runs, so the
        # workload only ever rewrites it in place (see write_marker).
        write_marker(config.marker_path, 0)
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
        if pid > 0 and child.pid_namespace:  # the workload wrote its namespace's pid (the root is 1)
            if pid != 1:
                # CRIU dumps a PID namespace only with its init ("Can't dump a pid namespace without the process init").
                raise HarnessFault("cut_target", f"the workload named one process of its tree to cut (cut_pid {pid}), "
                                   "but it runs in a PID namespace of its own (a parallel run) and CRIU dumps a namespace "
                                   "only whole: declare the 'peer' domain for such cuts (they then run without one) or "
                                   "use --jobs 1")
            return child
        if pid <= 0 or pid == child.pid:
            return child
        for known in self.cut_targets:
            if known.pid == pid:
                return known
        self.cut_targets.append(Child(pid=pid))
        return self.cut_targets[-1]

    def _own_pid_namespace(self, backend: Any, domains: list[str]) -> bool:
        """Whether this trial's workload tree starts as the init of a PID namespace of its own.

        Where the session asks for it (a parallel run), the backend declares it
        copes (``pid_namespace``: plain ``criu``) and the workload may not name
        a single process of its tree to cut (the ``peer`` domain: CRIU cannot
        dump one process of a namespace without its init).
        """
        if not (self.s.pid_namespace and getattr(backend, "pid_namespace", False) and "peer" not in domains):
            return False
        # No restore, no pid to collide with (an uninterrupted control run); and the CUDA runtime does not start
        # inside such a namespace (cudaErrorOperatingSystem, driver 580): a GPU workload runs in the host's.
        from cutbench.workloads.xp import DEVICE_BACKENDS

        return bool(self.spec.cut_plan().cuts) and workload_api.resolve_array(self.cls, self.spec.array) not in DEVICE_BACKENDS

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

    def _last_words(self, child: Child) -> str:
        """``": <the last line>"`` of what a workload that ended wrote: its log, else its own output (a
        container's: an interpreter that could not import cutbench never reaches its log); "" when neither."""
        text = self._log_tail(3) or child.output_tail()
        return f": {text.splitlines()[-1]}" if text.strip() else ""

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.tdir / "workload.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _effects(self) -> tuple[pd.DataFrame, str]:
        """The receiver's rows for this trial, and why they could not be read ("" when they could)."""
        try:
            return self.s.effects(self.receiver_trial), ""
        except Exception as exc:  # a store we cannot read makes the verdict unknown
            return oracle.empty_effects(), f"cannot read receiver store: {exc}"


def _launcher(backend: Any, labels: dict[str, str]) -> Callable[..., Child]:
    """How the trial starts its workload: :func:`~cutbench.procs.spawn`, or the backend's own ``launch(argv, *,
    cwd, labels)`` (a container engine), given the run's and the trial's ``labels`` for the container (a
    ``launch`` without that parameter gets none)."""
    launch = getattr(backend, "launch", None)
    if launch is None:
        return spawn
    if "labels" in inspect.signature(launch).parameters:
        return functools.partial(launch, labels=labels)
    return launch


@dataclass
class _TrialState:
    """What one trial has established so far (the runner's status vocabulary; see model.trial)."""

    status: str = "completed"
    error: str = ""
    failed_stage: str = ""
    restores: int = 0
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    # (position at the last cut, progress count right after it)
    resumed_at: tuple[tuple[int, int], int] | None = None
    down: bool = False  # the workload is gone on purpose (a declined restore): nothing runs to the end
    evidence: list[dict[str, Any]] = field(default_factory=list)
    joined: set[str] | None = None  # domains the adapters joined at every restored cut (None: no restore yet)


@dataclass
class _NextCut:
    """Arming cut ``index + 1`` around cut ``index``: the pipeline calls ``before_resume`` or ``release``."""

    runner: TrialRunner
    control: ControlFile
    plan: CutPlan
    index: int
    seq: int | None  # this cut's arm sequence (None: nothing parked)
    fault: str
    next_seq: int | None = None

    def ensure_armed(self) -> None:
        """Arm the next cut once."""
        if self.next_seq is None:
            self.next_seq = self.runner._arm(self.control, self.plan, self.index + 1)

    def before_resume(self) -> None:
        """After the fault, before the restored process runs: hold it, a new incarnation, then the next cut."""
        if self.seq is not None:
            # After ``leave_running`` the original was released, so the copy would
            # leave its park as soon as CRIU restores it: on the GPU, a CUDA call
            # before the CUDA restore kills it (benchmarks/repro/). It waits for release().
            self.control.hold(self.seq)
        self.control.set("incarnation", self.control.get("incarnation") + 1)
        self.next_seq = self.runner._arm(self.control, self.plan, self.index + 1)

    def release(self) -> None:
        """Let the parked workload go on."""
        if self.fault == "none":
            # No restore follows: arm the next cut before the parked workload
            # moves on, or it may run past it first.
            self.ensure_armed()
        if self.seq is not None:
            self.control.release(self.seq)
