"""Trials as a Slurm job array: ``run.executor = "slurm"``, ``cutbench run --executor slurm``.

As with Ray (:mod:`~cutbench.harness.runner.ray_executor`), the driver (the ``cutbench run`` process) builds
the plans, runs the run's one receiver and alone writes the run directory; each trial runs in a process of its
own, ``python -m cutbench.harness.runner.trial_worker REQUEST RESULT``, here as one task of a job array
(``sbatch --array=0-N%JOBS``, job name ``cutbench-trials-<run id>``, the cluster's default partition). The
requests and results are files in the run's work directory; the driver takes each result as it appears and
the runner writes it, so the run directory is the same as a serial run's.

- A task that left the queue without a result (its node failed, it was cancelled, it was killed for its time
  limit) is submitted again, up to :data:`LOST_RERUNS` times; a trial during which the run's receiver died runs
  again, as under Ray.
- ``slurmctld`` may restart meanwhile: the tasks run on (``slurmd`` keeps them), the results are files, and the
  driver waits up to :data:`CONTROLLER_WAIT_S` for the controller to answer again.
- Ctrl-C or SIGTERM cancels the array: each running task's trial gets SIGTERM and cleans up as a serial trial
  does; what finished meanwhile is kept.

The tasks reach the receiver on this machine's loopback, so the cluster's nodes must be this machine (the
project's one-node cluster, ``cutbench slurm up``); the ``slurm`` backend itself is refused under this executor
(its preemptor would take the node its own trial's task holds).
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutbench.errors import Unavailable
from cutbench.harness.provision import slurm as cluster
from cutbench.harness.runner.ray_tasks import CANCEL_GRACE_S, WORKER_MODULE, decode
from cutbench.procs import package_env

if TYPE_CHECKING:
    from cutbench.harness.model.trial import TrialResult, TrialSpec
    from cutbench.harness.runner.shared import ReceiverWatch

POLL_S = 0.5
LOST_RERUNS = 2  # a task lost this many times more stops the run
CONTROLLER_WAIT_S = 300.0  # how long the driver waits for a slurmctld that stopped answering
JOB_PREFIX = "cutbench-trials-"
LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def local_nodes() -> dict[str, int]:
    """The cluster's nodes (name → CPUs) when every one of them is this machine; raises :class:`Unavailable`
    when no cluster answers, or one of its nodes is another machine."""
    why = cluster.unavailable_reason()
    if why:
        raise Unavailable(f"run.executor = \"slurm\": {why}")
    here = {socket.gethostname(), socket.gethostname().split(".")[0], *LOCAL_ADDRESSES}
    shown = cluster.scontrol("show", "node", "--oneliner")
    nodes: dict[str, int] = {}
    for line in shown.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if not fields.get("NodeName"):
            continue
        if fields.get("NodeAddr") not in here and fields.get("NodeHostName") not in here:
            raise Unavailable(f"run.executor = \"slurm\": node {fields['NodeName']} of the cluster "
                              f"({cluster.which_cluster()}) is another machine ({fields.get('NodeAddr')}); the trials "
                              "reach the run's receiver on this machine's loopback, so every node must be this machine "
                              "(or use --executor ray)")
        nodes[fields["NodeName"]] = int(fields.get("CPUTot") or 1)
    if not nodes:
        raise Unavailable(f"run.executor = \"slurm\": the cluster ({cluster.which_cluster()}) has no node")
    return nodes


@dataclass
class SlurmTrials:
    """The run's trials as one job array, at most ``window`` tasks at once; :meth:`run` calls ``on_result(plan
    position, result)`` as each result file appears (the pool protocol of
    :meth:`~cutbench.harness.runner.executors.TrialLog.run_pool`)."""

    requests: list[dict[str, Any]]
    specs: "list[TrialSpec]"
    window: int
    directory: Path
    run_id: str
    late: "dict[int, TrialResult]" = field(default_factory=dict)
    watch: "ReceiverWatch | None" = None
    jobs: list[str] = field(default_factory=list)  # every job id submitted (the array, then each rerun)
    reruns: int = 0  # tasks submitted again (lost, or run while the receiver died)

    def run(self, on_result: "Callable[[int, TrialResult], None]") -> None:
        """Submit the array and collect every result; raise what a trial's process could not get past, a task lost
        more than :data:`LOST_RERUNS` times, or a controller silent for :data:`CONTROLLER_WAIT_S`."""
        from cutbench.harness.runner.shared import RECEIVER_RERUNS

        self.directory.mkdir(parents=True, exist_ok=True)
        for index in range(len(self.requests)):
            self._write(index, 0)
        todo = set(range(len(self.requests)))
        attempts = dict.fromkeys(todo, 0)
        deaths = dict.fromkeys(todo, self._deaths())
        lost = dict.fromkeys(todo, 0)
        try:
            self._submit(f"0-{len(self.requests) - 1}%{self.window}")
            silent_since: float | None = None
            while todo:
                time.sleep(POLL_S)
                for index in sorted(todo):
                    payload = self._take(index)
                    if payload is None:
                        continue
                    result = decode(payload, self.specs[index].trial_id)
                    if result is None:  # interrupted, and not by this driver: its task was cancelled (scancel)
                        self._lost(index, lost, attempts, deaths, "was cancelled")
                        continue
                    if self.watch is not None and self._deaths() != deaths[index]:
                        if attempts[index] < RECEIVER_RERUNS:  # the receiver died while it ran: run it again
                            self.watch.rerun(self.specs[index].trial_id)
                            self._again(index, attempts, deaths)
                            continue
                        result = self.watch.spoiled(result)
                    todo.discard(index)
                    on_result(index, result)
                queued = self._queued()
                if queued is None:  # the controller does not answer: the tasks run on; wait for it
                    silent_since = silent_since or time.monotonic()
                    if time.monotonic() - silent_since > CONTROLLER_WAIT_S:
                        raise Unavailable(f"run.executor = \"slurm\": slurmctld did not answer for "
                                          f"{CONTROLLER_WAIT_S:g}s ({cluster.which_cluster()})")
                    continue
                silent_since = None
                for index in sorted(todo - queued):
                    if self._result_path(index).exists():
                        continue  # written between the look at the files and the look at the queue
                    self._lost(index, lost, attempts, deaths, "left the queue without a result")
                self._deaths()  # a receiver gone for good stops the run here
        except BaseException:
            self._cancel(todo)
            raise

    # -- the files and the queue -------------------------------------------------
    def _request_path(self, index: int) -> Path:
        return self.directory / f"req-{index}.json"

    def _result_path(self, index: int) -> Path:
        return self.directory / f"res-{index}.pickle"

    def _write(self, index: int, attempt: int) -> None:
        self._request_path(index).write_text(json.dumps({**self.requests[index], "attempt": attempt}))

    def _take(self, index: int) -> bytes | None:
        """The result file of ``index`` once its task wrote it (by rename: whole), removed; None before."""
        path = self._result_path(index)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        path.unlink()
        return data

    def _lost(self, index: int, lost: dict[int, int], attempts: dict[int, int], deaths: dict[int, int],
              how: str) -> None:
        """Task ``index`` ended without a verdict (``how``): submit it again, or raise once it was lost more than
        :data:`LOST_RERUNS` times."""
        lost[index] += 1
        if lost[index] > LOST_RERUNS:
            raise RuntimeError(f"trial {self.specs[index].trial_id}: its Slurm task {how}, {lost[index]} times; its "
                               f"log: {self._log_tail(index)}")
        self._again(index, attempts, deaths)

    def _again(self, index: int, attempts: dict[int, int], deaths: dict[int, int]) -> None:
        self.reruns += 1
        attempts[index] += 1
        deaths[index] = self._deaths()
        self._write(index, attempts[index])
        self._submit(str(index))

    def _submit(self, array: str) -> None:
        """Submit the tasks ``array`` (``0-9%2``, ``4``) of the run's job; :class:`Unavailable` when refused."""
        worker = shlex.join([sys.executable, "-m", WORKER_MODULE])
        wrap = (f"exec {worker} {shlex.quote(str(self.directory))}/req-$SLURM_ARRAY_TASK_ID.json "
                f"{shlex.quote(str(self.directory))}/res-$SLURM_ARRAY_TASK_ID.pickle")
        done = subprocess.run(
            ["sbatch", "--parsable", f"--array={array}", f"--job-name={JOB_PREFIX}{self.run_id}",
             f"--chdir={self.directory}", f"--output={self.directory}/task-%a.log", "--no-requeue",
             f"--wrap={wrap}"],
            capture_output=True, text=True, timeout=60, env=cluster.client_env(package_env()))
        if done.returncode != 0:
            raise Unavailable(f"run.executor = \"slurm\": sbatch refused the trials' job array: "
                              f"{(done.stderr or done.stdout).strip()}")
        self.jobs.append(done.stdout.strip().split(";")[0])

    def _queued(self) -> set[int] | None:
        """The plan positions whose tasks are pending or running; None when the controller does not answer."""
        out = cluster.run_client("squeue", "-h", "-r", "--name", f"{JOB_PREFIX}{self.run_id}", "-o", "%K",
                                 timeout=15)
        if out.returncode != 0:
            return None
        return {int(word) for word in out.stdout.split() if word.isdigit()}

    def _log_tail(self, index: int) -> str:
        try:
            return " | ".join((self.directory / f"task-{index}.log").read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(none)"

    def _deaths(self) -> int:
        return self.watch.check() if self.watch is not None else 0

    def _cancel(self, todo: set[int]) -> None:
        """Cancel every task still queued or running (their trials get SIGTERM and clean up), wait until they are
        gone (at most :data:`CANCEL_GRACE_S`), and keep the results that came meanwhile."""
        for job in self.jobs:
            cluster.run_client("scancel", job, timeout=30)
        deadline = time.monotonic() + CANCEL_GRACE_S
        while time.monotonic() < deadline:
            queued = self._queued()
            if queued is not None and not queued:
                break
            time.sleep(POLL_S)
        for index in sorted(todo):
            payload = self._take(index)
            if payload is None:
                continue
            try:
                result = decode(payload, self.specs[index].trial_id)
            except Exception:
                continue
            if result is not None:
                self.late[index] = result
