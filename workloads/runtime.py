"""The small runtime every workload imports.

It owns the things a workload must not get wrong for a checkpoint to be
judged fairly: cut points (``rt.point(op, phase)``), the epoch, the receiver
client, the durable commit marker, the log and the final report. The harness
decides where to park; the workload only announces where it is.

Files are never held open across a cut point: CRIU checks the size of every
open regular file on restore, and a log that grew after a ``leave_running``
dump would make the restore fail for a reason that has nothing to do with
the tool under test.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from cutbench.workloads.adapters import AdapterDesk
from cutbench.workloads.control import PHASES, ControlFile
from cutbench.files import atomic_write, read_number, write_number
from cutbench.receivers.client import ReceiverClient

# A parked workload gives up after this long without a release: a harness that
# died must not leave a spinning process behind forever.
PARK_TIMEOUT_S = 600.0


@dataclass
class WorkloadConfig:
    """Everything a workload process is started with (written as JSON by the harness)."""

    workload: str
    trial: str
    params: dict[str, Any]
    control_path: str
    report_path: str
    marker_path: str
    log_path: str
    receiver: str | None = None  # receiver address, e.g. "127.0.0.1:4321"
    receiver_token: str | None = None  # the secret a receiver on a routable address asks for (else None)
    array_backend: str = "auto"
    workload_path: list[str] = field(default_factory=list)  # where the workload's module is (TrialSpec.workload_path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "WorkloadConfig":
        """Read a config written by :meth:`dump`."""
        return cls(**json.loads(Path(path).read_text()))

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write this config as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.__dict__, indent=2, sort_keys=True))


@dataclass
class Runtime:
    """What a running workload sees: control channel, array namespace, receiver, files.

    ``xp`` is what ``cutbench.workloads.xp.get_xp`` returns for the trial's
    array backend: the ``numpy`` or ``cupy`` module, or ``array_api_compat.torch``
    (CUDA tensors) for ``"torch"``.
    """

    config: WorkloadConfig
    control: ControlFile
    xp: ModuleType
    phases: tuple[str, ...] = PHASES
    receiver: Any = None
    # Which arm sequence this process is parked on; process memory, so it is
    # part of the image and a restored process resumes its own park.
    _parked_seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    # The cold start of this process (:meth:`mark_startup`): step name -> seconds since exec.
    startup: dict[str, float] = field(default_factory=dict)
    # The command line that starts this workload afresh (:meth:`start_again_in_place`); set by the launcher.
    argv: tuple[str, ...] = ()
    # Semantic adapters (:meth:`register_adapter`); None until one is registered.
    desk: AdapterDesk | None = None

    def start_again_in_place(self, reason: str) -> NoReturn:
        """End this program image and start the workload again, afresh, in the same process (``exec``).

        What a job script does when the program stopped itself at its wall-time limit (GROMACS's ``-maxh``)
        and is run again with its checkpoint (``-cpi``): the new image begins like any fresh start, so the
        workload's ``continue_from_own_checkpoint`` finds what it saved and goes on after it. The pid stays,
        so the harness and its cuts keep following the same process; the control file, the commit marker and
        the receiver (reconnected) carry over, process memory and the CUDA context do not. Never returns."""
        if not self.argv:
            raise RuntimeError("start_again_in_place: the launcher did not give the runtime its command line")
        self.log(f"{reason}; starting again in place")
        if self.receiver is not None:
            self.receiver.close()
        os.execv(self.argv[0], list(self.argv))

    def mark_startup(self, step: str) -> None:
        """Note that start-up step ``step`` is done, at :func:`since_exec` seconds (the report's ``startup``).

        The launcher marks ``imports``, ``array_library``, ``setup``, ``load_state`` and ``first_op``;
        a workload may mark steps inside its ``setup`` (``cuda_init``, ``model_build``)."""
        self.startup[step] = round(since_exec(), 6)

    @property
    def epoch(self) -> int:
        """The incarnation of this process: 0 at start, bumped by the harness at each restore."""
        return self.control.get("incarnation")

    @property
    def trial(self) -> str:
        """The trial ID the harness gave this run."""
        return self.config.trial

    @property
    def workdir(self) -> Path:
        """The trial's directory, for files the workload keeps outside its process image
        (an external input cursor, a file-backed shared table); the harness removes it."""
        return Path(self.config.report_path).parent

    def set_cut_target(self, pid: int) -> None:
        """Ask the harness to checkpoint only process ``pid`` (one of this workload's
        children) instead of the whole process tree: an uncoordinated cut. 0 restores
        the default."""
        self.control.set("cut_pid", int(pid))

    def point(self, op: int, phase: str) -> None:
        """Announce that ``phase`` of ``op`` is complete; park here if the harness armed it."""
        idx = self.phases.index(phase)
        c = self.control
        c.set("progress_op", op)
        c.set("progress_phase", idx)
        c.set("progress_count", c.get("progress_count") + 1)
        seq = c.get("arm_seq")
        if seq > c.get("release_seq") and c.get("arm_op") == op and c.get("arm_phase") == idx:
            self._park(seq)
        self.service()
        if c.get("stop"):
            raise SystemExit(3)

    def _park(self, seq: int) -> None:
        self._parked_seq = seq
        self.control.set("parked_seq", seq)
        deadline = time.monotonic() + PARK_TIMEOUT_S
        while self.control.get("release_seq") < seq:
            self.service()  # a parked workload still answers its adapters' requests
            if time.monotonic() > deadline:
                self.log(f"park at seq {seq} never released; exiting")
                raise SystemExit(4)
            time.sleep(0.0005)

    # -- semantic adapters ----------------------------------------------------
    def register_adapter(self, adapter: Any) -> None:
        """Register a semantic adapter (:mod:`cutbench.workloads.adapters`) for one domain the workload
        declares: the harness's coordinator then prepares, commits, aborts it with every cut, and asks it
        to classify the effects in flight after a restore. ValueError for a second adapter of a domain; an
        adapter for an undeclared domain stops the workload at start-up."""
        if self.desk is None:
            self.desk = AdapterDesk(self.control)
        self.desk.register(adapter)

    def service(self) -> None:
        """Answer a pending adapter request (called at every cut point and while parked)."""
        if self.desk is not None:
            self.desk.answer()

    # -- application-level checkpoints (the `app` backend) --------------------
    def boundary(self, op: int, workload: Any) -> None:
        """Op ``op`` is complete: save the workload's state here if the harness asked.

        The save path is in the control text area. A workload without
        ``save_state`` answers with ``saved_seq = -seq`` (the harness refuses the
        cut). With ``save_hold`` set the workload then waits here, so a ``kill``
        fault finds it exactly at the boundary it saved.
        """
        c = self.control
        seq = c.get("save_seq")
        if seq <= abs(c.get("saved_seq")):
            return
        save = getattr(workload, "save_state", None)
        if save is None:
            c.set("saved_seq", -seq)
            return
        save(c.get_text())
        c.set("saved_op", op)
        c.set("saved_seq", seq)
        deadline = time.monotonic() + PARK_TIMEOUT_S
        while c.get("save_hold"):
            if time.monotonic() > deadline:
                self.log("save hold never released; exiting")
                raise SystemExit(4)
            time.sleep(0.0005)

    def log(self, message: str) -> None:
        """Append one line to the workload log (opened and closed per line, see module doc)."""
        write_log(self.config.log_path, self.epoch, message)

    def commit_marker(self, op: int) -> None:
        """Durably record that ``op`` is committed (see :func:`write_marker`)."""
        write_marker(self.config.marker_path, op)

    def write_report(self, report: dict[str, Any]) -> None:
        """Write the final report as JSON (atomic rename) and mark the run done."""
        body = dict(report)
        body.setdefault("startup", self.startup)
        body.setdefault("pid", os.getpid())
        body.setdefault("epoch", self.epoch)
        atomic_write(self.config.report_path, json.dumps(body, sort_keys=True))
        self.control.set("done", 1)


def since_exec() -> float:
    """Seconds since this process was exec'd: the boot-time clock now less the kernel's start time of the
    process (``/proc/self/stat`` field 22, in clock ticks: 10 ms resolution). This is the clock of a cold
    start, process creation included, which no timer started inside the interpreter can see."""
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22; fields[0] is field 3
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def write_log(path: str | os.PathLike[str], epoch: int, message: str) -> None:
    """Append one line, stamped with the time, this pid and ``epoch``, to the log at ``path`` (opened and closed here)."""
    with open(path, "a") as fh:
        fh.write(f"{time.time():.6f} pid={os.getpid()} epoch={epoch} {message}\n")


def write_marker(path: str | os.PathLike[str], op: int) -> None:
    """Durably record op number ``op`` in commit marker file ``path`` (rewritten in place: see
    :func:`cutbench.files.write_number`; the harness creates it before the workload starts)."""
    write_number(path, op, durable=True)


def read_marker(path: str | os.PathLike[str]) -> int:
    """The op number in a commit marker file, or 0 when there is none."""
    return read_number(path)


def format_exception() -> str:
    """The current exception's traceback as text (for the workload log)."""
    return traceback.format_exc()


class TrackedReceiver(ReceiverClient):
    """The workload's receiver client, noting in the control file the highest effect id it sent and had acknowledged.

    ``send_effect`` stores the effect id in the ``sent_effect`` slot once the
    frame is written, and ``wait_ack`` stores it in ``acked_effect`` once
    acknowledged (``publish`` and ``prepare`` go through both). At a cut the
    harness reads them: what the checkpointed process had already sent (the
    fence of that cut) and what it would send again after reconnecting.
    """

    def __init__(self, address: str, control: ControlFile, **options: Any):
        # Each frame says which incarnation sent it: the harness bumps the control file's epoch before a restored
        # process runs, so a restored process resending an op it owed says so (the op keeps its own epoch).
        super().__init__(address, sender=lambda: control.get("incarnation"), **options)
        self._control = control

    def send_effect(self, trial: str, op_id: int, epoch: int, digest: str, **kw: Any) -> None:
        """The client's ``send_effect``, then note ``op_id`` as sent."""
        super().send_effect(trial, op_id, epoch, digest, **kw)
        if op_id > self._control.get("sent_effect"):
            self._control.set("sent_effect", op_id)

    def wait_ack(self, op_id: int, timeout: float | None = None, *, trial: str | None = None) -> dict[str, Any]:
        """The client's ``wait_ack``, then note ``op_id`` as acknowledged."""
        reply = super().wait_ack(op_id, timeout, trial=trial)
        if op_id > self._control.get("acked_effect"):
            self._control.set("acked_effect", op_id)
        return reply
