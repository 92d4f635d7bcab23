"""Helpers for the CUDA pipeline tests: run trials in-process, and a CPU stand-in for the driver.

:class:`SimDriver` is the driver's documented process state machine
(RUNNING → LOCKED → CHECKPOINTED → LOCKED → RUNNING) kept in a dict. It lets
the CPU tests check the *harness's* ordering and recovery around real CRIU
dumps and restores of a real (NumPy) workload. It is never used for anything
claimed as GPU coverage: the ``gpu``-marked tests drive the real driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.checkpointers.cuda import RESULTS, CudaCallError
from harness.runner import Session, TrialResult, build_specs
from harness.scenario import parse_scenario


class SimDriver:
    """The checkpoint calls' state machine on CPU processes (see module docstring)."""

    supports_remap = True

    def __init__(self, *, refuse_lock: bool = False, fail: str | None = None):
        self.states: dict[int, str] = {}
        self.born: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []
        self.refuse_lock = refuse_lock
        self.fail = fail  # name of a call that fails once with CUDA_ERROR_UNKNOWN

    def _err(self, call: str, pid: int, name: str) -> CudaCallError:
        return CudaCallError(call, pid, RESULTS[name][0], name)

    def _is_cuda(self, pid: int) -> bool:
        try:
            return b"workloads.launch" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def get_state(self, pid: int) -> str:
        if not self._is_cuda(pid):
            raise self._err("get_state", pid, "CUDA_ERROR_NOT_FOUND")
        born = _start_time(pid)
        if self.born.setdefault(pid, born) != born:
            # A new process under the same pid is a CRIU restore: its driver
            # state is the image's, and images are taken while CHECKPOINTED.
            self.born[pid] = born
            self.states[pid] = "checkpointed"
        return self.states.setdefault(pid, "running")

    def _step(self, call: str, pid: int, want: str, new: str) -> None:
        self.calls.append((call, pid))
        if self.fail == call:
            self.fail = None
            raise self._err(call, pid, "CUDA_ERROR_UNKNOWN")
        if self.get_state(pid) != want:
            raise self._err(call, pid, "CUDA_ERROR_ILLEGAL_STATE")
        self.states[pid] = new

    def lock(self, pid: int, timeout_ms: int) -> None:
        if self.refuse_lock:
            self.calls.append(("lock", pid))
            raise self._err("lock", pid, "CUDA_ERROR_NOT_READY")
        self._step("lock", pid, "running", "locked")

    def checkpoint(self, pid: int) -> None:
        self._step("checkpoint", pid, "locked", "checkpointed")

    def restore(self, pid: int, pairs: Any = ()) -> None:
        self._step("restore", pid, "checkpointed", "locked")

    def unlock(self, pid: int) -> None:
        self._step("unlock", pid, "locked", "running")

    def gpu_uuids(self) -> list[str]:
        return []


def _start_time(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def run_trials(data: dict[str, Any], workdir: Path, *, backends: dict[str, Any] | None = None) -> list[TrialResult]:
    """Run every trial of a scenario mapping in one session; ``backends`` replaces backend instances by name."""
    scenario = parse_scenario(data)
    specs = build_specs(scenario, scenario.arms())
    results = []
    with Session("t" + Path(workdir).name[-6:], scenario.store, workdir=workdir) as session:
        for name, backend in (backends or {}).items():
            session._backends[name] = backend
        for spec in specs:
            results.append(session.run_trial(spec))
    return results


def stages(result: TrialResult, cut_index: int = 0) -> list[str]:
    """The stage names of one cut, in order (events and harness stages included)."""
    return [row["stage"] for row in result.timeline if row["cut_index"] == cut_index]
