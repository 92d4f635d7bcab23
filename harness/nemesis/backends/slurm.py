"""``slurm``: a program run as a Slurm batch job, its cut a real preemption by the scheduler.

What is judged is the site's integration, not an image format: the job
script (``workload.params.slurm.script``) starts the program, and what it does
when Slurm preempts the job (save on the signal, dump with CRIU, nothing) and
when the requeued job starts again (resume, restore, start over) is the
pattern under test. The examples under ``examples/slurm/`` are the patterns
HPC sites use, and deliberately broken ones (docs/slurm.md).

The program is submitted with ``sbatch`` to the scenario's partition
(``low``), its command the script's arguments; its stdout and stderr are the
job's output files in the trial's directory, which the observer reads as the
program's streams (the cluster's node must share that directory: the
project's own cluster, ``cutbench slurm up``, runs on this machine). The
uninterrupted control runs are jobs too, so a script that never starts the
program fails them, before any trial.

The cut is Slurm's own: a job in the higher partition (``preemptor``)
that needs the whole node, or ``scontrol requeue``. Slurm signals the job
(stage ``slurm_preempt`` ends then), waits its grace time (``slurm_grace``),
kills it and requeues it (``slurm_kill`` ends when the job has left the
node). ``slurm_node_free`` ends when the
preemptor runs (the time a scheduler preempts for), ``slurm_requeue`` when the
requeued job runs again. One thing is the harness's: Slurm holds a requeued
job for two minutes before it may start (its ``BeginTime``); the backend
releases it at once with ``scontrol update StartTime=now``, as an operator
may. A job that is not requeued (no ``--requeue``) ends there: the trial is
``lost``, the program's later effects missing; one whose program ran to its end
before Slurm took the node back is ``refused`` (nothing was taken from it); one
whose program still runs in its directory once Slurm has ended it is ``lost``,
naming the process (the node Slurm gave away was never free).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutbench import procs
from cutbench.errors import HarnessFault, InvalidArgument, StageFailed, StageRefused
from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.harness.provision import slurm as cluster
from cutbench.procs import Child
from cutbench.workloads import program as program_api

# Job states in which the job holds the node, and those in which it is over for good (squeue's long names).
RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING"})
OVER = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                  "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"})
POLL_S = 0.2
# The job's output files in the program's directory: the observer reads them as the program's stdout and stderr.
OUTPUT = {"stdout": "slurm-job.out", "stderr": "slurm-job.err"}
JOB_PREFIX = "cutbench-"
# Where a job script finds the restore decision when the run certifies (pipeline.certify): "restore" or "restart".
DECISION = "cutbench-decision"


@dataclass(frozen=True)
class JobState:
    """One look at a job: its state, why it waits, its node, its exit code ("2:0"), when Slurm began preempting it
    (``PreemptTime``, "None" before) and when it is to end (``EndTime``: moved to the grace time's end once the
    grace time is over)."""

    state: str
    reason: str = ""
    node: str = ""
    exit_code: str = ""
    preempt_time: str = "None"
    end_time: str = ""

    @property
    def over(self) -> bool:
        """Whether the job is over for good (not pending, not running, not requeued)."""
        return self.state in OVER or self.state == "GONE"

    def returncode(self) -> int:
        """Its exit status as a process's (``ExitCode=2:0`` → 2, killed by signal 9 → -9; -1 when unknown)."""
        code, _, sig = self.exit_code.partition(":")
        try:
            return -int(sig) if sig and int(sig) else int(code)
        except ValueError:
            return -1


def job_state(job: str) -> JobState:
    """The job's state as ``scontrol show job`` says it (``GONE`` when the controller no longer knows it)."""
    out = cluster.scontrol("show", "job", "--oneliner", job, timeout=15)
    if out.returncode != 0:
        return JobState("GONE", (out.stderr or out.stdout).strip())
    fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
    return JobState(fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""), fields.get("NodeList", ""),
                    fields.get("ExitCode", ""), fields.get("PreemptTime", "None"), fields.get("EndTime", ""))


def wait_for(job: str, until: Callable[[JobState], bool], timeout_s: float) -> tuple[bool, JobState]:
    """Ask for ``job``'s state every :data:`POLL_S` until ``until(state)`` or ``timeout_s`` passed; return whether
    it came, and the last state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = job_state(job)
        if until(state):
            return True, state
        if time.monotonic() > deadline:
            return False, state
        time.sleep(POLL_S)


def cancel(job: str, timeout_s: float = 60.0) -> JobState:
    """Cancel ``job`` (nothing when it is over) and wait until it is over; return its last state."""
    state = job_state(job)
    deadline = time.monotonic() + timeout_s
    while not state.over and time.monotonic() < deadline:
        cluster.run_client("scancel", "--full", job, timeout=15)
        time.sleep(POLL_S)
        state = job_state(job)
    return state


@dataclass(eq=False)
class SlurmChild(Child):
    """The program's batch job, as the harness waits for and kills a process.

    ``pid`` is 0: nothing of the job is signalled by pid, it is cancelled through Slurm (its processes may run on
    another node). The job stays one across its requeues; during a preemption the backend sets ``preempting`` and
    the pipeline's fault stage then finds the job gone from the node without cancelling it."""

    job: str = ""
    directory: Path = field(default_factory=Path)
    preempting: bool = False
    settings: dict[str, Any] = field(default_factory=dict)  # workload.params.slurm, complete
    ended_how: str = ""  # how the job ended, where its exit status does not say it (see poll)
    files: dict[str, str] = field(default_factory=lambda: dict(OUTPUT))
    _looked: float = 0.0
    _last: JobState | None = None

    def look(self, fresh: bool = False) -> JobState:
        """The job's state, asked of Slurm at most every :data:`POLL_S` unless ``fresh``."""
        now = time.monotonic()
        if fresh or self._last is None or now - self._looked >= POLL_S:
            self._last, self._looked = job_state(self.job), now
        return self._last

    def poll(self) -> int | None:
        """The job's exit status once it is over, else None (pending or requeued jobs are not over). A job over
        while its program still works in its directory (restored outside the job: ``criu restore -d``) ends with
        -1, and :attr:`ended_how` says so."""
        if self.returncode is not None:
            return self.returncode
        state = self.look()
        if not state.over:
            return None
        strays = _strays(self.directory)
        if strays:
            self.ended_how = (f"job {self.job} ended {state.state} (exit {state.exit_code}) while its program ran on "
                              f"outside it ({strays[0]}): Slurm counted the node free with the program still on it")
            self.returncode = -1
            return self.returncode
        self.returncode = state.returncode()
        return self.returncode

    def track(self) -> None:
        """Nothing to remember: Slurm knows the job's processes, and cancelling the job ends them all."""

    def kill(self, timeout: float = 60.0) -> int | None:
        """Cancel the job (a preemption under way: the job has left the node, and is left to Slurm); its status."""
        if self.preempting:
            self.preempting = False
            return self.look(fresh=True).returncode()
        if self.returncode is None:
            state = cancel(self.job, timeout)
            self.returncode = state.returncode() if state.over else None
        return self.returncode

    def kill_groups(self, timeout: float = 60.0) -> None:
        """Cancel the job for good, and kill what of it outlived it in its directory: nothing of the trial stays
        queued or running."""
        cancel(self.job, timeout)
        procs.kill_processes_in(self.directory, started_by_harness=False)  # a job's processes carry no mark of ours

    def output_tail(self) -> str:
        """The last lines of the job's stderr file, or of its stdout where stderr is empty."""
        for name in ("stderr", "stdout"):
            try:
                text = (self.directory / self.files[name]).read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return "\n".join(text.splitlines()[-20:])
        return ""


@dataclass
class _Cut:
    """What one cut's stages share: the program's job, when its preemption began, the preemptor's job ("" for
    ``scontrol requeue``), and what still worked in the job's directory once the job had left the node."""

    job: SlurmChild
    preempted_at: float
    preemptor: str = ""
    strays: list[str] = field(default_factory=list)


class SlurmCheckpointer:
    """The ``slurm`` backend (see module docstring)."""

    name = "slurm"
    capabilities = Capabilities(
        faults=frozenset({"kill"}),  # a preemption ends the job's run on the node; what comes back is the script's
        stages=("slurm_preempt", "slurm_grace", "slurm_kill", "slurm_node_free", "slurm_requeue"),
        # What survives is the job script's business (a save, a CRIU image, nothing): the program's own files.
        covers=frozenset({"cpu", "disk"}),
        workload_changes="a job script that starts the program (workload.params.slurm.script; docs/slurm.md)",
        semantic_adapters=False,  # nothing of cutbench runs inside the job
    )
    output_files = True  # the program's stdout and stderr are the job's output files (SlurmChild.files)
    # The requeued job's script reads the certificate's decision here ($CUTBENCH_DECISION): restore, or restart.
    decision_file = DECISION

    def __init__(self) -> None:
        self._cuts: dict[Path, _Cut] = {}  # by the cut's images_dir

    def unavailable_reason(self) -> str | None:
        """Why no Slurm cluster takes jobs from here (with the fix), or None."""
        return cluster.unavailable_reason()

    def check_program(self, params: dict[str, Any]) -> None:
        """Refuse, before any trial, settings the cluster cannot run: a partition it does not have. Raises
        :class:`InvalidArgument` naming the parameter and the partitions there are."""
        settings = program_api.Program.slurm_settings(params)
        there = cluster.partitions()
        for key in ("partition", "preemptor"):
            if settings[key] not in there:
                raise InvalidArgument(f"workload.params.slurm.{key} = {settings[key]!r}: the cluster "
                                      f"({cluster.which_cluster()}) has partitions {', '.join(there) or 'none'}")

    # -- the program's job ------------------------------------------------------
    def launch(self, argv: list[str], *, cwd: str, labels: dict[str, str] | None = None,
               env: dict[str, str] | None = None, image: str = "", params: dict[str, Any] | None = None) -> Child:
        """Submit the program (``argv``, in ``cwd``) as a batch job through the scenario's job script and wait until
        it runs; returns its handle. The script gets the program's command as its arguments and, in its
        environment, ``RESUME_ARGS`` (the program's own restart flag, shell-quoted) and ``CRIU`` (the project's
        CRIU) and ``CUTBENCH_DECISION`` (the file of the restore decision, written when the run certifies).
        Raises :class:`StageRefused` when the job is not running within ``pending_s``."""
        settings = program_api.Program.slurm_settings(params or {})
        label = (labels or {}).get("cutbench.trial") or Path(cwd).name
        environment = {**cluster.client_env({**os.environ, **(env or {})}),
                       "RESUME_ARGS": shlex.join((params or {}).get("resume") or []), "CRIU": _criu(),
                       "CUTBENCH_DECISION": str(Path(cwd) / DECISION)}
        submit = subprocess.run(
            ["sbatch", "--parsable", f"--partition={settings['partition']}", f"--job-name={JOB_PREFIX}{label}",
             f"--chdir={cwd}", f"--output={Path(cwd) / OUTPUT['stdout']}", f"--error={Path(cwd) / OUTPUT['stderr']}",
             settings["script"], *argv],
            capture_output=True, text=True, timeout=60, env=environment)
        job = submit.stdout.strip().split(";")[0]
        if submit.returncode != 0 or not job.isdigit():
            raise StageRefused("slurm_submit", f"sbatch refused the job (exit {submit.returncode}): "
                                               f"{(submit.stderr or submit.stdout).strip()}")
        try:
            started, state = wait_for(job, lambda s: s.state in RUNNING or s.over, settings["pending_s"])
            if not started:
                raise StageRefused("slurm_submit", f"job {job} was still {state.state} ({state.reason}) after "
                                                   f"{settings['pending_s']:g}s (workload.params.slurm.pending_s)")
        except BaseException:
            cancel(job)
            raise
        return SlurmChild(pid=0, job=job, directory=Path(cwd), settings=settings)

    # -- stages -------------------------------------------------------------------
    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Preempt the job as the scenario says, and wait until it has left the node, in Slurm's steps: stage
        ``slurm_preempt`` (until Slurm signals the job's steps: the grace time begins), ``slurm_grace`` (until the
        grace time is over, or the job ended before it) and ``slurm_kill`` (until the job has left the node)."""
        if not isinstance(target, SlurmChild):
            raise HarnessFault("slurm_preempt", "the program was not started as a batch job")
        settings = target.settings
        ctx.facts["image_bytes"] = 0
        with ctx.timeline.stage("slurm_preempt", ctx.cut_index) as extra:
            node = target.look(fresh=True).node
            cut = self._cuts[ctx.images_dir] = _Cut(target, time.monotonic())
            if settings["preempt"] == "requeue":
                # Slurm's requeue signals and kills the job at once: no grace time.
                done = cluster.scontrol("requeue", target.job)
                if done.returncode != 0:
                    raise StageRefused("slurm_preempt", f"scontrol requeue {target.job}: {done.stderr.strip()}")
                state = target.look(fresh=True)
            else:
                cut.preemptor = self._submit_preemptor(target, node)
                state = self._wait_job(target.job, lambda s: s.preempt_time != "None" or s.state != "RUNNING", ctx,
                                       "slurm_preempt", "Slurm did not preempt the job")
            extra["detail"] = (f"job {target.job} signalled at {state.preempt_time}" if state.preempt_time != "None"
                               else f"job {target.job} {state.state} ({settings['preempt']})")
        with ctx.timeline.stage("slurm_grace", ctx.cut_index) as extra:
            # The grace time is over when Slurm moves the job's end time to it, or the job stops running before.
            signalled_end = state.end_time
            state = self._wait_job(target.job, lambda s: s.state != "RUNNING" or s.end_time != signalled_end, ctx,
                                   "slurm_grace", "the job's grace time did not end")
            extra["detail"] = (f"job {target.job} {state.state}" if state.state != "RUNNING"
                               else f"grace time over at {state.end_time}")
        with ctx.timeline.stage("slurm_kill", ctx.cut_index) as extra:
            state = self._wait_job(target.job, lambda s: s.state not in RUNNING, ctx, "slurm_kill",
                                   "the job did not leave the node")
            target.preempting = True
            # What still works in the job's directory once Slurm has taken the job off the node outlived it.
            cut.strays = _strays(target.directory)
            extra["detail"] = f"job {target.job} {state.state} ({state.reason or settings['preempt']})"

    @staticmethod
    def _submit_preemptor(target: SlurmChild, node: str) -> str:
        """Submit the job that preempts ``target``: ``hold_s`` seconds in the ``preemptor`` partition, the whole
        node; return its id. Raises :class:`StageRefused` when ``sbatch`` refuses it."""
        settings = target.settings
        preemptor = subprocess.run(
            ["sbatch", "--parsable", f"--partition={settings['preemptor']}", "--exclusive",
             *([f"--nodelist={node}"] if node else []), f"--job-name={JOB_PREFIX}preemptor-{target.job}",
             "--output=/dev/null", f"--wrap=sleep {settings['hold_s']:g}"],
            capture_output=True, text=True, timeout=60, env=cluster.client_env())
        if preemptor.returncode != 0:
            raise StageRefused("slurm_preempt", f"sbatch of the preemptor (partition {settings['preemptor']}): "
                                                f"{(preemptor.stderr or preemptor.stdout).strip()}")
        return preemptor.stdout.strip().split(";")[0]

    def restore(self, ctx: CutContext) -> int:
        """Stages ``slurm_node_free`` (the preemptor runs) and ``slurm_requeue`` (the requeued job runs again);
        returns the job's handle's pid. Raises :class:`StageFailed` when the job was not requeued."""
        cut = self._cuts[ctx.images_dir]
        target = cut.job
        if cut.preemptor:
            with ctx.timeline.stage("slurm_node_free", ctx.cut_index) as extra:
                self._wait_job(cut.preemptor, lambda s: s.state in RUNNING or s.over, ctx, "slurm_node_free",
                               "the preemptor never ran")
                # What a scheduler preempts for: the node given to the preemptor, counted from the preemption.
                ctx.facts["node_free_s"] = time.monotonic() - cut.preempted_at
                extra["detail"] = f"preemptor {cut.preemptor} ran {ctx.facts['node_free_s']:.2f}s after the preemption"
        with ctx.timeline.stage("slurm_requeue", ctx.cut_index) as extra:
            released = False
            deadline = time.monotonic() + ctx.stage_timeout_s
            while True:
                state = target.look(fresh=True)
                if state.over:
                    self._over(target, state, cut.strays)
                if state.state in RUNNING:
                    break
                if state.reason == "BeginTime" and not released:
                    # Slurm holds a requeued job two minutes; started at once, as an operator may.
                    released = cluster.scontrol("update", f"JobId={target.job}", "StartTime=now").returncode == 0
                if time.monotonic() > deadline:
                    raise StageFailed("slurm_requeue", f"job {target.job} still {state.state} ({state.reason}) "
                                                       f"after {ctx.stage_timeout_s:g}s")
                time.sleep(POLL_S)
            extra["detail"] = f"job {target.job} running again"
        return target.pid

    @staticmethod
    def _over(target: SlurmChild, state: JobState, strays: list[str]) -> None:
        """The job is over instead of requeued: raise what that was. Its program still running in its directory
        when the job had left the node (``strays``, or now) outlived the job (:class:`StageFailed`: the node Slurm
        gave away was never free); a job whose script ended with 0 ran to its end before Slurm took the node back
        (:class:`StageRefused`: nothing was taken from it; Slurm says TIMEOUT when that was after the grace time);
        any other end is a job not requeued (:class:`StageFailed`)."""
        ended = f"job {target.job} ended {state.state} ({state.reason}, exit {state.exit_code})"
        strays = strays or _strays(target.directory)
        if strays:
            raise StageFailed("slurm_requeue", f"{ended} while its program ran on outside it ({strays[0]}):"
                                               " the node given to the preemptor was never free, and the job was not"
                                               " requeued")
        if state.returncode() == 0:
            refused = StageRefused("slurm_requeue", f"{ended}: its program ran to its end before Slurm took the "
                                                    "node back, the preemption took nothing from it")
            refused.resumed_pid = target.pid  # type: ignore[attr-defined]  # as RemapRefused's: it went on
            raise refused
        raise StageFailed("slurm_requeue", f"{ended} and was not requeued")

    def cleanup(self, ctx: CutContext) -> None:
        """The preemptor goes (it holds the node for ``hold_s`` only; a failed cut may leave it queued)."""
        cut = self._cuts.pop(ctx.images_dir, None)
        if cut is not None and cut.preemptor:
            cancel(cut.preemptor)

    @staticmethod
    def _wait_job(job: str, until: Callable[[JobState], bool], ctx: CutContext, stage: str, why: str) -> JobState:
        """:func:`wait_for` ``job`` within the stage's time limit; :class:`StageFailed` (``why``) after it."""
        came, state = wait_for(job, until, ctx.stage_timeout_s)
        if not came:
            raise StageFailed(stage, f"{why} within {ctx.stage_timeout_s:g}s: job {job} {state.state} ({state.reason})")
        return state

def _strays(directory: Path) -> list[str]:
    """The processes that work in the job's ``directory``, in words (:func:`cutbench.procs.holder`)."""
    return [words for pid in procs.processes_in(directory, started_by_harness=False) if (words := procs.holder(pid))]


def _criu() -> str:
    """The project's CRIU as one command for a job script's ``$CRIU``, or "criu" from PATH when none is installed."""
    try:
        from cutbench.harness.provision.criu import locate

        return locate.require_criu().executable
    except Exception:
        return "criu"
