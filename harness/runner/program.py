"""A trial of a program that knows nothing of cutbench (the ``program`` workload: docs/programs.md).

What the outside world sees of the program is the observer's
(:class:`~cutbench.harness.observer.streams.Observer`: the program's pipes, the file it appends to, the
socket it connects to, a server's responses to cutbench's clients). :class:`ProgramRunner` places the cut
after the k-th effect, at a time or at a size of the stream (plus the plan's async offset), drives the same
pipeline as any trial, and hands the backends the hooks a program needs (:class:`ProgramHooks`): a CRIU
restore continues the program's output into fresh pipes (``--inherit-fd``); ``restart`` starts it again
from the beginning; ``app`` starts it with its own restart flag. The effects become the trial's effects
table, numbered by the reference's order, and the oracle judges them as any workload's.
"""
from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import HarnessFault, WorkloadError
from cutbench.harness.model import boundaries
from cutbench.harness.model.boundaries import Boundary
from cutbench.harness.model.certificate import CERTIFY_OFF
from cutbench.harness.model.trial import TrialRecord
from cutbench.interrupts import shielded
from cutbench.harness.nemesis.base import CutContext, optional
from cutbench.harness.nemesis.pipeline import execute_cut
from cutbench.harness.observer.streams import Observer, free_port
from cutbench.harness.observer.syscalls import Tracer, waiting_command
from cutbench.harness.runner.arming import TrialState, launcher
from cutbench.harness.runner.program_certifier import ProgramCertifier
from cutbench.harness.runner.trial import POLL_S, RECEIVER_GONE, TrialRunner
from cutbench.procs import Child, kill_processes_in, spawn
from cutbench.workloads import api as workload_api
from cutbench.workloads import program as program_api

# How often the program's tree is read while it runs (a few /proc reads; the harness polls every POLL_S).
TRACK_S = 0.5
# A cut's place and a program's progress in words, by the cut's phase (the units of ProgramRunner._measure).
PLACES = {"effect": "effect {:.0f}", "time": "{:g} ms", "size": "{:.0f} bytes", "syscall": "boundary {:.0f}"}
PROGRESS = {"effect": "{:.0f} effect(s)", "time": "{:.0f} ms since its start", "size": "{:.0f} bytes of {stream}",
            "syscall": "{:.0f} counted system call(s)"}


class ProgramHooks:
    """What a backend may ask of a program trial (``CutContext.program``): start it again, its progress, and
    its pipes for a restore. See :class:`cutbench.harness.nemesis.base.ProgramControl`."""

    def __init__(self, runner: "ProgramRunner"):
        self.runner = runner
        self.resume_args: tuple[str, ...] = tuple(runner.spec.params["resume"])
        # A server started again redoes nothing by itself (its clients ask again, or not): nothing to catch up.
        self.catches_up = runner.observer.http is None
        self.at_cut = runner.observer.distinct()  # made as the cut begins: where a requeue must get back to

    def start(self, extra_args: Sequence[str] = ()) -> Child:
        """Start the program again in its directory (its command, then ``extra_args``: its own restart flag) as a
        new incarnation; without ``extra_args`` it starts from the beginning (a fresh start). Returns its handle."""
        return self.runner.launch(list(extra_args))

    def shown(self) -> int:
        """Effects the running incarnation has shown so far."""
        obs = self.runner.observer
        with obs.lock:
            return obs.shown.get(obs.incarnation, 0)

    def inherited_fds(self) -> list[tuple[str, int]]:
        """Fresh pipes in place of the ones the dumped program wrote to: ``[("pipe:[INODE]", write end)]``."""
        return self.runner.observer.inherited_fds()

    def restored(self) -> None:
        """The restore returned (or failed): this side's ends of the fresh pipes are closed."""
        self.runner.observer.restored()


class ProgramRunner(TrialRunner):
    """One trial of a ``program`` workload (see the module docstring)."""

    @classmethod
    def runs(cls, workload: type) -> bool:
        """Programs (``program = True`` on the workload class)."""
        return bool(workload_api.optional(workload, "program"))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.observer = Observer(self.spec.params, self.tdir, wait_s=self.spec.stage_timeout_s)
        if self.observer.http is not None:
            self.observer.port = self.spec.params["port"] or free_port()
        self.fresh_starts = 0
        self.started_at: float | None = None  # monotonic time of the first start (cuts of phase "time" count from it)
        self.tracked_at = 0.0  # monotonic time of the last look at the program's tree (_track)
        self.served = False  # a server whose clients all finished (it is then stopped: a server never exits)
        # A container engine's launch where the backend starts the program in a container (docker, podman);
        # None: the observer starts it here, its pipes read (the control runs are, but for a program in its own image).
        self.engine_launch: Callable[..., Child] | None = None
        # Its system calls' tracer (workload.params.syscalls: a cut of phase "syscall", or the control runs that
        # record the boundaries), on its first start only; None when it is not traced.
        self.tracer: Tracer | None = None
        self.certificates: list[dict[str, Any]] = []  # the cuts' certificates, when the arm certifies
        self.reference: workload_api.RecordedReference | None = None  # the uninterrupted runs' (a trial's, not theirs)

    def _hwm(self) -> int | None:
        return len(self.observer.seen)

    def launch(self, extra_args: list[str]) -> Child:
        """Start the program (its command and ``extra_args``) as the next incarnation; its first start traced
        where its system calls count (:meth:`_traced`)."""
        command = [*program_api.Program.command_for(self.spec.params, self.observer.port), *extra_args]
        calls = self.spec.params.get("syscalls") or []
        traced = bool(calls) and self.started_at is None
        child = self.observer.start(waiting_command(command, self.tdir) if traced else command, self.engine_launch)
        if traced:
            try:
                self._traced(child, calls)
            except BaseException:  # no handle of it reaches the trial: it goes here, with its tracer
                if self.tracer is not None:
                    self.tracer.close()
                child.kill()
                raise
        if self.started_at is None:
            self.started_at = time.monotonic()
        if not extra_args:
            self.fresh_starts += 1
        return child

    def _traced(self, child: Child, calls: Sequence[str]) -> None:
        """Trace the started (stopped) program: recording every counted call (an uninterrupted run), or to hold
        it before the counted call of the plan's first ``syscall`` cut."""
        cuts = [c for c in self.spec.cut_plan().cuts if c.phase == "syscall"]
        self.tracer = Tracer(child, calls=calls, directory=self.tdir, stop_at=cuts[0].op if cuts else 0)
        with self.timeline.stage("trace"):
            self.tracer.start()

    # -- the trial skeleton's hooks (TrialRunner.observe), for a program ----------
    def _prepare(self, backend: Any) -> None:
        """Who starts the program: the observer here, or the backend (a container engine, a batch job)."""
        params = self.spec.params
        self.order: dict[str, int] | None = None  # each effect's op, by the reference's order
        # A program in its own image runs there for its uninterrupted runs too (its command is the image's).
        # So does a program run as a batch job (slurm): its job script is part of what runs.
        if ((not self.plain_launch or params["image"] or optional(backend, "output_files"))
                and (launch := launcher(backend, self.labels(), params)) is not spawn):
            self.engine_launch = launch

    def _drive(self, backend: Any, state: TrialState) -> None:
        """Start the program (its files copied in, its server's load begun), carry out the plan's cuts, let it
        run to its end."""
        spec, params = self.spec, self.spec.params
        if not self.plain_launch:
            reference = self.reference = self.s.references.get(self.cls, spec.params, spec.array)
            self.order = {key: op for op, key in reference.keys.items()}
        for name in params["files"]:
            source = Path(name)
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, self.tdir / source.name)
        if self.observer.stream == program_api.SOCKET:
            self.observer.listen(params["port"])
        with self.timeline.stage("spawn"), shielded():  # no interrupt between the fork and the handle
            child = self.child = self.launch([])
        if self.observer.http is not None:
            with self.timeline.stage("listen"):
                why = self.observer.listening(child)
            if why:
                raise HarnessFault("listen", why)
            self.observer.start_load()
        for i, cut in enumerate(spec.cut_plan().cuts):
            reached = self._reach_cut(child, cut, i)
            if reached:
                state.status, state.error = ("deadlock", reached) if reached.startswith("no effect") else ("unknown", reached)
                break
            if not self._cut(backend, child, i, cut, state):
                break  # a refused cut's program goes on to its end below
        if state.status not in ("unknown", "deadlock") and not state.down:
            self._program_to_end(child, state)

    def _tear_down(self, state: TrialState) -> None:
        """The program's processes go: its tree, what it left in its directory, what a cut targeted."""
        if self.tracer is not None:
            self.tracer.close()  # what it still held goes on (and is killed below)
        child = self.child
        if child is not None and child.alive():
            child.kill()
        if child is not None:
            self.observer.last_words()  # a container's are asked of its engine: kept before it is removed
            child.kill_groups()
        kill_processes_in(self.tdir)  # a helper that left the tree (daemonised) before it was seen in it
        for target in self.cut_targets:
            target.kill()
        self.observer.close()

    def _record(self, backend: Any, state: TrialState, duration_s: float) -> tuple[TrialRecord, pd.DataFrame]:
        """What the outside world saw: the record (with the final artefacts' digest when the program ran to its
        end) and the effects, numbered by the reference's order."""
        spec, child, order = self.spec, self.child, self.order
        completed = self._completed(state)
        checksum: str = ""
        compared: dict[str, str] = {}
        if completed:
            try:
                checksum, compared = self._artefacts()
            except (HarnessFault, WorkloadError, OSError) as exc:  # the scenario's comparison, the harness's copies
                state.status, completed = "unknown", False
                state.error = exc.reason if isinstance(exc, HarnessFault) else f"the final artefacts: {exc}"
        distinct = self.observer.distinct()
        host_op = len(order) if (order and completed) else distinct
        report = {"host_op": host_op, "checksum": checksum, "effects_seen": len(self.observer.seen),
                  "effect_lines": self.observer.lines, "incarnations": self.observer.incarnation + 1,
                  **({"artefacts": compared} if compared else {}),
                  # An uninterrupted run's counted calls: the boundaries a syscall cut's op numbers.
                  **({"boundaries": [b.to_dict() for b in self.tracer.boundaries]}
                     if self.tracer is not None and self.plain_launch else {})} if completed else None
        effects = self.observer.frame(self.receiver_trial, order, spec.receiver_mode)
        again = int((effects["attempt"] > 1).sum()) if len(effects) else 0
        if again:
            state.facts["recomputed_ops"] = again  # effects the outside world saw once more
        if state.status == "refused" and not completed and child is not None and child.returncode not in (0, None):
            # A refusal after which the program did not run to its end was not a clean refusal.
            state.status, state.error = "unknown", f"{state.error}; then the program ended with exit {child.returncode}"
        words = self.observer.last_words()
        if self.tracer is not None:  # how its calls were counted, and what that cost it in stops
            state.facts["trace_mode"], state.facts["trace_stops"] = self.tracer.mode, self.tracer.stops
        record = TrialRecord(
            trial_id=spec.trial_id, status=state.status, error=state.error, failed_stage=state.failed_stage,
            # A server the harness stopped once its clients were done ended as it should: exit 0.
            exit_code=0 if self.served else child.returncode if child else None, restores=state.restores, cut_outcomes=state.outcomes,
            report=report, marker_op=host_op if completed else 0, progress_op=distinct, progress_phase="effect" if distinct else "",
            workload_domains=list(self._domains()),
            covered_domains=sorted(backend.capabilities.covers), duration_s=duration_s,
            facts=state.facts, log_tail=words if state.status != "completed" or not completed else "",
            fresh_starts=self.fresh_starts, certificates=self.certificates, cut_evidence=state.evidence,
        )
        if state.status == "completed" and not completed:
            record.status, record.error = "unknown", f"the program ended with exit {record.exit_code}{self.observer.last_line()}"
            record.log_tail = words
        return record, effects

    def _completed(self, state: TrialState) -> bool:
        """Whether the program ran to its end (a refused cut lets it go on: its effects and artefacts are judged
        too), and for an uninterrupted run, whether it can be the reference (its rules matched, no stream broke);
        ``state`` says why not where the harness cannot judge."""
        child = self.child
        if self.observer.rule_error:
            state.status, state.error = "unknown", self.observer.rule_error
        completed = state.status in ("completed", "refused") and child is not None and (child.returncode == 0 or self.served)
        if completed and self.plain_launch and (silent := self.observer.silent()):
            state.status, state.error, completed = "unknown", self.observer.nothing_matched(silent[0]), False
        if completed and self.plain_launch and self.observer.broken:
            state.status, completed = "unknown", False
            state.error = (f"a stream broke during an uninterrupted run ({self.observer.broken[0]['request']}: "
                           f"{self.observer.broken[0]['why']}): the server cannot be the reference")
        return completed

    def _artefacts(self) -> tuple[str, dict[str, str]]:
        """The digest of the program's final artefacts, and for each compared by a callable and found apart, how
        far it is from the reference's copy ("0.003 > tolerance 1e-06"). The first uninterrupted run's copies are the
        reference's: they are kept (under the run's ``references/``) for the runs after it. Raises
        :class:`HarnessFault` when the copies are gone, :class:`WorkloadError` when a comparison fails."""
        params = self.spec.params
        artefacts = program_api.Program.artefacts(params)
        compared = [a for a in artefacts if a.compare]
        if not compared:
            return program_api.artefacts_digest(self.tdir, artefacts), {}
        refs = self.s.references
        key = workload_api.reference_key(self.cls.name, params, workload_api.resolve_array(self.cls, self.spec.array))
        recording = refs.recordings.get(key)
        kept = Path(recording.artefacts_dir) if recording is not None and recording.artefacts_dir else refs.artefact_dirs.get(key)
        if kept is None:  # the first uninterrupted run: its artefacts are the reference's
            if not self.plain_launch:
                raise HarnessFault("judge", f"no reference copies of {', '.join(a.path for a in compared)}")
            kept = ((refs.artefacts_root or self.s.workdir / "references") / f"{key}.artefacts").resolve()
            shutil.rmtree(kept, ignore_errors=True)  # an interrupted recording's copies are not this one's
            for a in compared:
                if (self.tdir / a.path).is_file():
                    (kept / a.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.tdir / a.path, kept / a.path)
            kept.mkdir(parents=True, exist_ok=True)
            refs.artefact_dirs[key] = kept
            return program_api.artefacts_digest(self.tdir, artefacts, {a.path: True for a in compared}), {}
        if not kept.is_dir():
            raise HarnessFault("judge", f"the reference's copies of the artefacts are gone ({kept})")
        within: dict[str, bool] = {}
        apart: dict[str, str] = {}
        for a in compared:
            ref, got = kept / a.path, self.tdir / a.path
            if not ref.is_file() or not got.is_file():
                within[a.path] = ref.is_file() == got.is_file()  # both absent: as the reference left it
                if ref.is_file():
                    apart[a.path] = "absent"
                continue
            try:
                difference = float(a.load(params["parser_path"])(ref, got))
            except WorkloadError:
                raise
            except Exception as exc:
                raise WorkloadError(f"workload.params.artefacts: {a.path}: compare = {a.compare!r} raised "
                                    f"{type(exc).__name__}: {exc}") from None
            if math.isnan(difference):
                raise WorkloadError(f"workload.params.artefacts: {a.path}: compare = {a.compare!r} returned NaN "
                                    "(a distance: a number, or infinity for files that cannot be compared)")
            within[a.path] = difference <= a.tolerance
            if not within[a.path]:
                apart[a.path] = f"{difference:g} > tolerance {a.tolerance:g}"
        return program_api.artefacts_digest(self.tdir, artefacts, within), apart

    def _cut(self, backend: Any, child: Child, i: int, cut: Any, state: TrialState) -> bool:
        """Carry out cut ``i`` on the running program; return whether the trial goes on after it."""
        self.s.images.settle()
        ctx = CutContext(images_dir=Path(self.spec.images_dir) / f"cutbench-{self.s.run_id}-{self.spec.trial_id}-c{i}",
                         timeline=self.timeline, cut_index=i, cut=cut, stage_timeout_s=self.spec.stage_timeout_s,
                         prepare_timeout_s=self.spec.prepare_timeout_s, phases=self.phases,
                         criu_options=self.spec.arm.criu_options, program=ProgramHooks(self),
                         certifier=self._certifier(backend, i, cut))
        held = self.tracer if self.tracer is not None and self.tracer.held is not None and cut.phase == "syscall" else None
        if held is not None:
            ctx.freeze = held.freeze  # the tool gets the tree stopped, the tracer gone (before CRIU seizes it)
            ctx.thaw = self._thaw

        def release() -> None:  # the program goes on from its call: the original, or the restored copy
            if self.tracer is not None:
                self.tracer.release(child)

        outcome = execute_cut(backend, child, ctx, release=release if held else lambda: None,
                              before_resume=self.observer.restoring, keep_images=self.spec.keep_images,
                              discard=self.s.images.discard)
        state.outcomes.append(asdict(outcome))
        if ctx.certifier is not None:
            state.evidence.append(ctx.certifier.evidence_of())
        if held is not None and held.held is not None:
            state.facts.update(self._boundary_facts(cut.op, held.held))
        for key, value in ctx.facts.items():
            state.facts[key] = state.facts.get(key, 0) + value if isinstance(value, (int, float)) else value
        if outcome.status == "restored":
            state.restores += 1
            if ctx.certifier is not None:
                ctx.certifier.restored()
            return True
        if outcome.stage == "certify_restore":
            # The certificate declined the restore: the program stays down; a safe refusal.
            state.status, state.error, state.failed_stage, state.down = "refused", outcome.error, outcome.stage, True
            return False
        if outcome.status in ("refused", "failed", "error"):
            state.status = {"refused": "refused", "failed": "lost", "error": "unknown"}[outcome.status]
            state.error, state.failed_stage = outcome.error, outcome.stage
            state.down = outcome.status == "failed"
            return False
        return True

    def _domains(self) -> tuple[str, ...]:
        """Return the state domains the program keeps, sorted: a plain process's and those its scenario declares."""
        return tuple(sorted(program_api.Program.domains | program_api.Program.domains_for(self.spec.params)))

    def _certifier(self, backend: Any, i: int, cut: Any) -> ProgramCertifier | None:
        """The cut's certifier when the arm certifies (pipeline.certify), else None."""
        if self.spec.arm.certify == CERTIFY_OFF:
            return None
        params, order = self.spec.params, self.order or {}
        seen = self.observer.seen

        def effects() -> list[tuple[float, int]]:
            return [(s.t, order[s.key]) for s in list(seen) if s.key in order]

        return ProgramCertifier(
            index=i, cut=cut, receiver_mode=self.spec.receiver_mode, certify_mode=self.spec.arm.certify,
            phases=self.phases, domains=self._domains(),
            covers=tuple(sorted(backend.capabilities.covers)), seen=effects, directory=self.tdir,
            checkpoint_file=params.get("checkpoint_file") or "",
            ignore=frozenset(getattr(self.child, "files", {}).values()), decision_file=optional(backend, "decision_file"),
            certificates=self.certificates)

    def _thaw(self, pid: int) -> None:
        """A GPU tool's CRIU half is done: the frozen program ``pid`` runs again but for its held call
        (:meth:`Tracer.rehold`), and the tracer that holds it now is the one a release lets go."""
        assert self.tracer is not None
        self.tracer = self.tracer.rehold(pid)

    def _boundary_facts(self, k: int, landed: Boundary) -> dict[str, str]:
        """A syscall cut's facts: the boundary by name (``boundary``, from the uninterrupted runs' calls), and where
        the call the program was held before is not the recording's k-th (``boundary_landed``)."""
        recorded = [Boundary.from_dict(b) for b in (self.reference.boundaries if self.reference is not None else [])]
        facts = {"boundary": boundaries.name(recorded, k) or f"before {landed.words()}"}
        if recorded and k <= len(recorded) and not recorded[k - 1].same_call(landed):
            facts["boundary_landed"] = (f"held before {landed.words()}, where the uninterrupted runs' call {k} was "
                                        f"{recorded[k - 1].words()}")
        return facts

    def _track(self, child: Child) -> None:
        """Remember the program's tree (:meth:`Child.track`) every :data:`TRACK_S`: its helpers, in a session of their
        own or not, go with it at the end, even those whose parent ended before them."""
        now = time.monotonic()
        if now - self.tracked_at >= TRACK_S:
            self.tracked_at = now
            child.track()

    def _measure(self, phase: str) -> float:
        """How far the program is, in ``phase``'s unit: effects seen, ms since it first started, bytes of its
        effect stream read, counted system calls made (the one it is held before included)."""
        if phase == "syscall":
            tracer = self.tracer
            return 0.0 if tracer is None else float(len(tracer.boundaries) + (tracer.held is not None))
        if phase == "time":
            assert self.started_at is not None
            return (time.monotonic() - self.started_at) * 1000.0
        with self.observer.lock:
            return self.observer.bytes if phase == "size" else len(self.observer.keys)

    def _progress(self, phase: str, value: float) -> str:
        """``value`` of :meth:`_measure` in words: "12 effect(s)", "840 ms since its start", "192 bytes of stdout"."""
        return PROGRESS[phase].format(value, stream=self.observer.stream)

    def _goal(self, cut: Any) -> float:
        """Where ``cut`` lands, in its phase's unit (:meth:`_measure`): op k of "time" at k x ``cut_time_ms``,
        of "size" at k x ``cut_bytes``, of "effect" at k."""
        unit = {"time": "cut_time_ms", "size": "cut_bytes"}.get(cut.phase)
        return float(cut.op * self.spec.params[unit]) if unit else float(cut.op)

    def _reach_cut(self, child: Child, cut: Any, i: int) -> str:
        """Wait until the program reached ``cut``'s place (:meth:`_goal`), then the plan's async offset; ""
        when reached, else why not (``no effect …``: the watchdog, after an earlier cut)."""
        deadline = time.monotonic() + self.spec.stage_timeout_s
        goal = self._goal(cut)
        place = PLACES[cut.phase].format(goal)

        def moved() -> tuple[float, float]:  # for the watchdog: new effects, or the stream growing (time, size)
            return self._measure("effect"), self._measure("size") if cut.phase != "effect" else 0.0

        last, last_change = moved(), time.monotonic()
        with self.timeline.stage("reach_cut", i) as extra:
            while True:
                self._track(child)
                now_at = self._measure(cut.phase)
                if cut.phase == "syscall" and self.tracer is not None and self.tracer.held is not None:
                    extra["detail"] = f"held before counted call {cut.op}: {self.tracer.held.words()}"
                    return ""  # held there: no offset, the cut is exact
                if cut.phase == "syscall" and (self.tracer is None or self.tracer.error or self.tracer.wait_ended(0)):
                    return (f"the program was not held before counted call {cut.op}: "
                            f"{self.tracer.error if self.tracer and self.tracer.error else f'it made {now_at:.0f}'}"
                            f"{self.observer.last_line()}")
                if cut.phase != "syscall" and now_at >= goal:
                    time.sleep(cut.async_offset_ms / 1000.0)
                    extra["detail"] = f"async +{cut.async_offset_ms:g}ms after {place}"
                    return ""
                if self.observer.rule_error:
                    return self.observer.rule_error
                rc = child.poll()
                if rc is not None:
                    return (f"the program exited ({rc}) after {self._progress(cut.phase, now_at)}, before cut {i} at "
                            f"{place}{self.observer.last_line()}")
                t, now = time.monotonic(), moved()
                if now != last:
                    last, last_change = now, t
                elif i > 0 and t - last_change > self.spec.watchdog_s:
                    return f"no effect for {self.spec.watchdog_s:g}s before cut {i}"
                if t > deadline:
                    return (f"the program did not reach {place} within {self.spec.stage_timeout_s:g}s (it showed "
                            f"{self._progress(cut.phase, now_at)})")
                time.sleep(POLL_S)

    def _program_to_end(self, child: Child, state: TrialState) -> None:
        """Wait for the program (the restored or started-again one) to exit; fold how it ended into the status."""
        spec = self.spec
        deadline = time.monotonic() + spec.trial_timeout_s
        last, last_change = len(self.observer.seen), time.monotonic()
        rc: int | None = None
        with self.timeline.stage("run_to_end") as extra:
            while True:
                self._track(child)
                rc = child.poll()
                if rc is not None:
                    extra["detail"] = f"exit {rc}"
                    break
                if self.observer.load_done.is_set():  # a server's clients are done: it is stopped, it never exits
                    child.kill()
                    self.served, rc = True, 0
                    extra["detail"] = f"served {len(self.observer.seen)} effects"
                    break
                now, t = len(self.observer.seen), time.monotonic()
                if now != last:
                    last, last_change = now, t
                elif t - last_change > spec.watchdog_s:
                    child.kill()
                    extra["detail"] = "watchdog"
                    state.status, state.error = "deadlock", f"no effect for {spec.watchdog_s:g}s (the program showed {now})"
                    return
                if t > deadline:
                    child.kill()
                    state.status, state.error = "unknown", f"trial timeout {spec.trial_timeout_s:g}s"
                    return
                if self._receiver_gone():
                    child.kill()
                    state.status, state.error = "unknown", RECEIVER_GONE
                    return
                time.sleep(POLL_S * 2)
        if rc != 0 and state.status == "completed" and state.restores:
            # The tool brought the program back and it died on its own afterwards: the restore's failure (its
            # uninterrupted control runs ran to their end), in the program's own last words.
            state.status, state.failed_stage = "lost", "after_restore"
            # A handle may know better how it ended (a batch job over while its program ran on outside it).
            state.error = (getattr(child, "ended_how", "")
                           or f"the restored program ended with exit {rc}{self.observer.last_line()}")
