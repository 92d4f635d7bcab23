"""What the CUDA backends find before they cut: whether the driver API is usable here, and which processes to cut.

Owns :func:`bindings_unavailable_reason` (cuda-bindings installed and
loading, the five checkpoint calls present, a driver that initialises and is
new enough), :func:`cutbench.procs.process_tree` (a workload's processes, from ``/proc``),
:func:`find_cuda_processes` (those of a tree the driver knows, with the GPUs
and memory NVML sees them use) and :class:`CudaProcs`, the record of them the
stages carry through a cut.

Discovery only looks: it asks the driver for process states and NVML for
memory, and must not lock, checkpoint, restore or unlock anything, time a
stage or record a cut's facts (the ``cuda_discover`` stage in
:mod:`cutbench.harness.nemesis.backends.cuda` does both). It imports
cuda-python only inside :func:`bindings_unavailable_reason`, so a machine
without the bindings can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cutbench.errors import HarnessFault, StageRefused
from cutbench.harness.environment import gpu_mem, gpu_probe
from cutbench.errors import CudaCallError
from cutbench.harness.nemesis.backends.cuda_driver import DriverApi
from cutbench.procs import process_tree


def bindings_unavailable_reason() -> str | None:
    """Why the driver checkpoint API cannot be used from this process (with the fix), or None when it can."""
    try:
        from cuda.bindings import driver as drv  # type: ignore[import-not-found]
    except ImportError:
        return "cuda-bindings is not installed: pip install -e '.[gpu]' (needs an NVIDIA driver >= 570)"
    except Exception as exc:
        return f"cuda-bindings does not load: {exc}"
    missing = [c for c in gpu_probe.CHECKPOINT_CALLS if not hasattr(drv, c)]  # the calls doctor checks too
    if missing:
        return f"cuda-bindings lacks {', '.join(missing)}: upgrade to cuda-bindings >= 12.8"
    try:
        (err,) = drv.cuInit(0)
        if int(err) != 0:
            return f"cuInit failed with {err.name}: no usable NVIDIA GPU/driver"
        err, version = drv.cuDriverGetVersion()
        if int(version) < 12080:
            return f"driver API version {version} has no process checkpointing: needs a driver >= 570"
    except Exception as exc:  # libcuda.so absent
        return f"no NVIDIA driver: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


@dataclass
class CudaProcs:
    """The CUDA processes of one cut, their GPUs and memory at discovery."""

    pids: list[int]
    gpus: dict[int, list[str]] = field(default_factory=dict)  # pid -> GPU UUIDs it uses
    gpu_bytes: int = 0
    usage: dict[int, dict[str, int]] = field(default_factory=dict)  # pid -> {GPU UUID: bytes}
    # Remap candidates for the restore, decided once before the lock (CudaStages.remap_pairs):
    # asked again after the checkpoint, the freed memory would be counted twice.
    pairs: dict[int, list[list[tuple[str, str]]]] = field(default_factory=dict)


def find_cuda_processes(root: int, driver: DriverApi) -> CudaProcs:
    """The CUDA processes of ``root``'s tree (those ``driver`` knows), with the GPUs and bytes NVML sees them use.

    Raises :class:`~cutbench.errors.HarnessFault` (stage ``cuda_discover``) when one of them is not
    RUNNING before the cut, and :class:`~cutbench.errors.StageRefused` (stage ``cuda_lock``) when none
    is a CUDA process: the workload does not use the GPU, so there is nothing for a CUDA backend to cut.
    """
    tree = process_tree(root)
    pids = []
    for pid in tree:
        try:
            state = driver.get_state(pid)
        except CudaCallError:
            continue  # not a CUDA process
        if state != "running":
            raise HarnessFault("cuda_discover", f"pid {pid} is {state.upper()} before the cut")
        pids.append(pid)
    if not pids:
        raise StageRefused("cuda_lock", f"no CUDA process in the workload's tree {tree}: nothing to checkpoint")
    usage = gpu_mem.process_gpu_memory(pids)
    return CudaProcs(pids, {p: sorted(usage.get(p, {})) for p in pids}, sum(sum(v.values()) for v in usage.values()), usage)


__all__ = ["CudaProcs", "bindings_unavailable_reason", "find_cuda_processes"]
