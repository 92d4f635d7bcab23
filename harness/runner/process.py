"""The workload's process as a trial sees it: the files it is started with (its configuration, the commit
marker), its companions, the process a cut targets, and what it leaves (its report, its log's last words).

:class:`WorkloadProcess` is the part of :class:`~cutbench.harness.runner.trial.TrialRunner` that knows the
workload process's files and processes; the runner holds the trial's flow (spawn, cuts, the wait, the verdict).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cutbench.errors import HarnessFault
from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.nemesis.base import optional
from cutbench.harness.runner.session import Session
from cutbench.procs import Child, spawn
from cutbench.workloads import api as workload_api
from cutbench.workloads.control import ControlFile
from cutbench.workloads.runtime import WorkloadConfig, write_marker


class WorkloadProcess:
    """The workload process's files and processes, for a trial runner (which sets these attributes)."""

    s: Session
    spec: TrialSpec
    cls: "type[workload_api.Workload]"
    tdir: Path
    receiver_trial: str
    cut_targets: list[Child]

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
            workload_path=list(self.spec.workload_path),
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
                for module in workload_api.optional(self.cls, "companions")]

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
        if not (self.s.pid_namespace and optional(backend, "pid_namespace") and "peer" not in domains):
            return False
        # No restore, no pid to collide with (an uninterrupted control run); and the CUDA runtime does not start
        # inside such a namespace (cudaErrorOperatingSystem, driver 580): a GPU workload runs in the host's.
        from cutbench.workloads.xp import DEVICE_BACKENDS

        return bool(self.spec.cut_plan().cuts) and workload_api.resolve_array(self.cls, self.spec.array) not in DEVICE_BACKENDS

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
