"""Probes of the error paths: a restore onto a GPU whose memory another process took meanwhile.

``probe_restore_oom`` holds ``hold_mib`` of device memory. Its companion, the *filler*
(``python -m cutbench.workloads.probes.errors CONFIG``, started by the harness outside the
checkpointed tree and stopped at the trial's end), watches the probe's process in NVML: once the
process holds no GPU memory while it lives — it was checkpointed — the filler takes nearly all free
GPU memory and keeps it, so the restore finds too little. What the tool then does is the cell: a
clean failure that leaves the application restorable later, or a process stuck for good (NVIDIA's
cuda-checkpoint issue #44). The probe needs the GPU to itself (``exclusive_gpu``): the matrix runs it
alone. A trial where the restore came before the filler had the memory says so in its measures.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cutbench.procs import is_zombie_or_gone
from cutbench.workloads.api import MatrixRow
from cutbench.workloads.probes import Probe, launch_step
from cutbench.workloads.xp import device_uuid, release_cached_memory

MIB = 1 << 20
# What the filler leaves free: too little for any restore of a CUDA context, enough not to starve the driver.
LEAVE_FREE_MIB = 64
FILLER_FILE = "filler.json"


class RestoreOomProbe(Probe):
    """The workload ``probe_restore_oom``: see the module docstring."""

    name = "probe_restore_oom"
    features = frozenset({"restore_out_of_memory"})
    exclusive_gpu = True
    companions = ("cutbench.workloads.probes.errors",)
    defaults = {**Probe.defaults, "hold_mib": 1024}
    matrix_rows = (MatrixRow("restore_when_gpu_memory_taken", "restore_out_of_memory",
                             "another process takes the GPU's memory while the process is checkpointed"),)

    def open(self) -> None:
        """The held device memory (the set-up's temporaries given back: the probe holds what it says)."""
        import cupy

        self.buf = cupy.zeros(self.p["hold_mib"] * MIB // 8, dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        release_cached_memory(cupy)

    def launch(self, op: int) -> None:
        """One step of the held memory."""
        launch_step(self.buf, op)

    def buffers(self) -> dict[str, Any]:
        """The held memory."""
        return {"buf": self.buf}

    def pointers(self) -> dict[str, int]:
        """Its address."""
        return {"buf": int(self.buf.data.ptr)}

    def measures(self) -> dict[str, float]:
        """What the filler did: MiB it took; ``precondition_met`` 0 when it had taken none by this report (after
        the restore): the restore then never met a full GPU, and the matrix does not count the trial."""
        try:
            done = json.loads((self.rt.workdir / FILLER_FILE).read_text())
        except (OSError, ValueError):
            return {"filler_mib": 0.0, "precondition_met": 0.0}
        return {"filler_mib": float(done.get("mib", 0)), "precondition_met": 1.0}


def _gpu_bytes(nvml: Any, handle: Any, pid: int) -> int | None:
    """Bytes ``pid`` holds on the GPU per NVML (None when it holds nothing there)."""
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == pid:
            return int(proc.usedGpuMemory or 0)
    return None


def fill(config_path: str, poll_s: float = 0.005) -> int:
    """The filler (see the module docstring); returns when it is killed, or 0 once the probe has gone."""
    import cupy
    import pynvml

    from cutbench.files import atomic_write
    from cutbench.workloads.control import ControlFile
    from cutbench.workloads.runtime import WorkloadConfig

    config = WorkloadConfig.load(config_path)
    workdir = Path(config.report_path).parent
    cupy.cuda.runtime.free(0)  # this process's CUDA context now, not when the memory is wanted
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid(cupy))  # NVML's order need not be CUDA's
    control = ControlFile(config.control_path)
    seen_on_gpu = False
    while True:
        if control.get("done"):
            return 0  # the probe reported: it is on its way out, its memory going with it
        pid = control.get("pid")
        if pid > 0:
            held = _gpu_bytes(pynvml, handle, pid)
            if held:
                seen_on_gpu = True
            elif seen_on_gpu and not is_zombie_or_gone(pid) and not control.get("done"):
                break  # on the GPU before, running and holding nothing now: checkpointed
        time.sleep(poll_s)
    taken: list[tuple[int, int]] = []  # (pointer, bytes)
    chunk: int | None = None
    started = time.monotonic()
    while True:
        free, _ = cupy.cuda.runtime.memGetInfo()
        want = free - LEAVE_FREE_MIB * MIB
        if want < 16 * MIB:
            break
        chunk = want if chunk is None else min(chunk, want)
        try:
            taken.append((cupy.cuda.runtime.malloc(chunk), chunk))
        except cupy.cuda.runtime.CUDARuntimeError:
            chunk //= 2
            if chunk < 16 * MIB:
                break
    free, _ = cupy.cuda.runtime.memGetInfo()
    atomic_write(workdir / FILLER_FILE, json.dumps({"chunks": len(taken), "mib": sum(n for _, n in taken) // MIB,
                                                    "seconds": round(time.monotonic() - started, 3),
                                                    "free_mib_left": free // MIB}))
    while True:  # hold it until the trial's end kills this process
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(fill(sys.argv[1]))
