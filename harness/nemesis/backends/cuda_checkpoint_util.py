"""``cuda-checkpoint`` and ``cuda-checkpoint+criu``: the CUDA stages through NVIDIA's ``cuda-checkpoint`` utility.

``cuda-checkpoint --get-state --pid P`` and ``--action lock|checkpoint|
restore|unlock --pid P [--timeout MS]`` stand in for the driver calls; each
invocation is one stage. The utility reports failures as text and an exit
status, so a failure carries its message (and a ``CUDA_ERROR_*`` name when the
text has one). Unavailable when the utility is not on PATH. It cannot remap
GPUs, so ``restore_target = other_gpu`` is refused before anything is locked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from cutbench.errors import hung_reason
from cutbench.harness.nemesis.cpu_account import run_measured
from cutbench.harness.nemesis.backends.cuda import CudaCheckpointer
from cutbench.harness.nemesis.backends.cuda_criu import CudaCriuCheckpointer
from cutbench.harness.nemesis.backends.cuda_driver import RESULTS, STATES, DriverApi, call_error

TOOL = "cuda-checkpoint"
CALL_TIMEOUT_S = 120.0


class UtilityDriver:
    """The :class:`~cutbench.harness.nemesis.backends.cuda_driver.DriverApi` through the ``cuda-checkpoint`` executable."""

    supports_remap = False

    def __init__(self, exe: str | None = None):
        self.exe = exe or shutil.which(TOOL) or TOOL

    def _run(self, call: str, pid: int, *args: str) -> str:
        argv = [self.exe, *args, "--pid", str(pid)]
        try:
            # Its CPU is credited to the trial's stage as role ``tool`` (the driver's work it asks for runs in the
            # workload's CUDA threads).
            p = run_measured(argv, role="tool", timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise call_error(call, pid, -1, "", hung_reason(f"{TOOL} --{call}", CALL_TIMEOUT_S)) from exc
        except OSError as exc:
            raise call_error(call, pid, -1, "", f"{TOOL}: {exc}") from exc
        out = (p.stdout + p.stderr).strip()
        if p.returncode != 0:
            m = re.search(r"CUDA_ERROR_[A-Z_]+", out)
            name = m.group(0) if m else ""
            code = RESULTS.get(name, (-1, ""))[0]
            raise call_error(call, pid, code, name or f"{TOOL} exit {p.returncode}", out.splitlines()[-1] if out else "")
        return out

    def get_state(self, pid: int) -> str:
        """The state word the utility prints."""
        out = self._run("get-state", pid, "--get-state").lower()
        for state in STATES:
            if re.search(rf"\b{state}\b", out):
                return state
        raise call_error("get-state", pid, -1, f"{TOOL} output", out)

    def lock(self, pid: int, timeout_ms: int) -> None:
        """Run the utility with ``--action lock --timeout MS``."""
        self._run("lock", pid, "--action", "lock", "--timeout", str(int(timeout_ms)))

    def checkpoint(self, pid: int) -> None:
        """Run the utility with ``--action checkpoint``."""
        self._run("checkpoint", pid, "--action", "checkpoint")

    def restore(self, pid: int, pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Run the utility with ``--action restore`` (no remap: see ``supports_remap``)."""
        if pairs:
            raise call_error("restore", pid, 801, "CUDA_ERROR_NOT_SUPPORTED", f"{TOOL} cannot remap GPUs")
        self._run("restore", pid, "--action", "restore")

    def unlock(self, pid: int) -> None:
        """Run the utility with ``--action unlock``."""
        self._run("unlock", pid, "--action", "unlock")

    def gpu_uuids(self) -> list[str]:
        """Not needed without remap support."""
        return []


class _ThroughUtility:
    """A CUDA backend whose driver calls go through NVIDIA's utility (one process per call)."""

    _driver: DriverApi | None

    def make_driver(self) -> DriverApi:
        """The utility on PATH."""
        return UtilityDriver()

    def utility_unavailable_reason(self) -> str | None:
        """Why the utility cannot be used (with the fix), or None."""
        if self._driver is None and shutil.which(TOOL) is None:
            return f"the {TOOL} utility is not on PATH: get it from github.com/NVIDIA/cuda-checkpoint and put it on PATH"
        return None


class CudaCheckpointUtilCheckpointer(_ThroughUtility, CudaCheckpointer):
    """The ``cuda-checkpoint`` backend: :class:`CudaCheckpointer`'s in-place stages over :class:`UtilityDriver`."""

    name = "cuda-checkpoint"

    def unavailable_reason(self) -> str | None:
        """Unavailable unless ``cuda-checkpoint`` is on PATH."""
        return self.utility_unavailable_reason()


class CudaCheckpointUtilCriuCheckpointer(_ThroughUtility, CudaCriuCheckpointer):
    """The ``cuda-checkpoint+criu`` backend: NVIDIA's documented recipe, the utility's lock/checkpoint, CRIU's dump,
    CRIU's restore, the utility's restore/unlock — the ``cuda+criu`` stages, split window and faults,
    so the same plans run through the utility and through the driver API."""

    name = "cuda-checkpoint+criu"

    def unavailable_reason(self) -> str | None:
        """Unavailable unless both the utility and CRIU are."""
        return self.utility_unavailable_reason() or self.criu.unavailable_reason()
