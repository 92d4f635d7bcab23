"""GPU memory per process: NVML (nvidia-ml-py) when it loads, else ``nvidia-smi``; empty elsewhere.

Used to record how many device bytes a cut had to move (``gpu_bytes``), which
GPUs a process uses (for a GPU remap on restore) and whether a process still
holds device memory (after a checkpoint it must hold none).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from typing import Any

MIB = 1 << 20


def process_gpu_memory(pids: Iterable[int]) -> dict[int, dict[str, int]]:
    """Return ``{pid: {gpu_uuid: bytes}}`` for the given pids that hold device memory now."""
    wanted = set(pids)
    rows = _nvml_rows()
    if rows is None:
        rows = _smi_rows()
    out: dict[int, dict[str, int]] = {}
    for pid, uuid, used in rows or []:
        if pid in wanted:
            out.setdefault(pid, {})
            out[pid][uuid] = out[pid].get(uuid, 0) + used
    return out


def _nvml_rows() -> list[tuple[int, str, int]] | None:
    """(pid, GPU UUID, bytes) of every compute process, or None when NVML is unusable."""
    per_gpu = _per_nvml_device(lambda nvml, handle, uuid: [
        (int(proc.pid), uuid, int(proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else 0))
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle)])
    return None if per_gpu is None else [row for rows in per_gpu for row in rows]


def _per_nvml_device(read: Callable[[Any, Any, str], Any]) -> list[Any] | None:
    """``read(pynvml, handle, uuid)`` of every GPU in one NVML session, or None when NVML is unusable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            out.append(read(pynvml, handle, uuid.decode() if isinstance(uuid, bytes) else uuid))
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _smi_rows() -> list[tuple[int, str, int]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    rows = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            used = int(parts[2]) * MIB if parts[2].isdigit() else 0
            rows.append((int(parts[0]), parts[1], used))
    return rows


def free_bytes() -> dict[str, int]:
    """Return ``{gpu_uuid: free bytes}`` from NVML; empty when NVML is unusable."""
    per_gpu = _per_nvml_device(lambda nvml, handle, uuid: (uuid, int(nvml.nvmlDeviceGetMemoryInfo(handle).free)))
    return dict(per_gpu or [])
