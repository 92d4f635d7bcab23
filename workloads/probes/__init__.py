"""Probe workloads: one CUDA feature each, for the measured support matrix (``cutbench matrix``).

A probe is an ordinary workload (the public workload API) that exercises
exactly one feature in every op: device memory of a size, a texture, pinned
host memory, work in flight, a CUDA graph, a stream-ordered pool, VMM
aliasing, managed memory, a second process, a PyTorch facility, an error
path. Each op passes the seven standard phases; at ``record`` the probe
takes a **state digest of every buffer it owns** (not only its output: an
output-only check misses a one-ulp change in saved state), and that digest
is the op's effect. The report adds every pointer the probe holds (device
addresses, mapped host addresses, VMM reservations), so a restore that
moved one is ``pointer_changed``.

The probes by subject: ``memory`` (plain buffers, ``__device__`` and
``__constant__``), ``host`` (host memory the GPU reaches), ``allocation``
(pools, VMM), ``inflight`` (work in flight at the cut), ``graphs``,
``modules`` (code and libraries), ``processes`` (a second process, handles
outside CUDA; ``ipc_child`` is the child of ``probe_ipc``), ``errors``
(error paths), ``multi_gpu`` (two GPUs) and ``torch_probes`` (PyTorch's
own CUDA machinery).

Ground truth is *recorded* (``ground_truth = "recorded"``): CUDA libraries
are not bit-replayable on NumPy, so the reference is an uninterrupted run of
the same probe on the same machine, recorded twice and kept only when both
agree (:class:`cutbench.workloads.api.RecordedReference`). A probe that is
not deterministic here is reported as such, never judged.

Each probe class declares the matrix rows it measures (``matrix_rows``:
:class:`~cutbench.workloads.api.MatrixRow`), the CUDA features it uses
(``features``), whether it needs the GPU to itself (``exclusive_gpu``) and
how many GPUs (``min_gpus``). Nothing else keeps a list of them: the matrix
generator reads the registered workloads.

:class:`Probe` is the frame; a probe implements :meth:`Probe.open` (allocate),
:meth:`Probe.launch` (enqueue op ``op``'s work), optionally :meth:`Probe.wait`,
:meth:`Probe.buffers` (everything to digest), :meth:`Probe.pointers` and
:meth:`Probe.measures` (figures for the matrix cell, e.g. bandwidth).
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from cutbench.errors import WorkloadError
from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import RecordedWorkload, check_range
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import backend_name, synchronize

# Buffers up to this size are digested byte for byte on the host; larger ones by two
# wrapping 64-bit sums on the device (common.sums: any single changed word changes them).
HOST_DIGEST_BYTES = 16 << 20

MULT = 6364136223846793005
GOLDEN = 0x9E3779B97F4A7C15

# CUDA C used by several probes: one deterministic step of a word array, and the same after
# spinning ``ns`` nanoseconds on the GPU's global timer (work that is still in flight at a cut).
STEP_SOURCE = r"""
extern "C" __global__ void step(unsigned long long* a, unsigned long long n, unsigned long long v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 6364136223846793005ULL + (v ^ (i * 0x9E3779B97F4A7C15ULL));
}
extern "C" __global__ void spin_step(unsigned long long* a, unsigned long long n, unsigned long long v,
                                     unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 6364136223846793005ULL + (v ^ (i * 0x9E3779B97F4A7C15ULL));
}
"""
BLOCK = 256


def host_step(a: Any, v: int) -> None:
    """What the ``step`` kernel does, on a NumPy uint64 array in place."""
    import numpy as np

    i = np.arange(a.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        a *= np.uint64(MULT)
        a += np.uint64(v % (1 << 64)) ^ (i * np.uint64(GOLDEN))


_MODULES: dict[str, Any] = {}


def step_kernel(name: str = "step") -> Any:
    """The CuPy kernel ``name`` (``step`` or ``spin_step``) of :data:`STEP_SOURCE`, compiled once per process."""
    import cupy

    if "step" not in _MODULES:
        _MODULES["step"] = cupy.RawModule(code=STEP_SOURCE)
    return _MODULES["step"].get_function(name)


def launch_step(a: Any, v: int, *, stream: Any = None, spin_ns: int = 0) -> None:
    """Enqueue one ``step`` (after spinning ``spin_ns`` on the GPU when > 0) of CuPy word array ``a``."""
    import numpy as np

    n = int(a.size)
    grid = ((n + BLOCK - 1) // BLOCK,)
    args: tuple[Any, ...] = (a, np.uint64(n), np.uint64(v % (1 << 64)))
    if spin_ns:
        kernel, args = step_kernel("spin_step"), args + (np.uint64(spin_ns),)
    else:
        kernel = step_kernel("step")
    kernel(grid, (BLOCK,), args, stream=stream)


def buffer_digest(arr: Any) -> str:
    """A digest of ``arr``'s bytes (NumPy, CuPy or torch; any dtype and shape)."""
    name = backend_name_of(arr)
    if name == "numpy":
        import numpy as np

        return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()
    if name == "torch":
        import torch

        flat = arr.detach().contiguous().reshape(-1).view(torch.uint8)
        return hashlib.blake2b(flat.cpu().numpy().tobytes(), digest_size=16).hexdigest()
    import cupy

    if arr.nbytes <= HOST_DIGEST_BYTES:
        return hashlib.blake2b(cupy.ascontiguousarray(arr).get().tobytes(), digest_size=16).hexdigest()
    from cutbench.workloads.common import sums

    flat = cupy.ascontiguousarray(arr).reshape(-1)
    words = flat.view(cupy.uint64) if flat.nbytes % 8 == 0 else flat.view(cupy.uint8).astype(cupy.uint64)
    s1, s2 = (int(v) for v in sums(cupy, words).get())
    return hashlib.blake2b(f"{arr.nbytes}:{s1}:{s2}".encode(), digest_size=16).hexdigest()


def backend_name_of(arr: Any) -> str:
    """Return "numpy", "cupy" or "torch" for an array of that library."""
    import array_api_compat as compat

    if compat.is_numpy_array(arr):
        return "numpy"
    if compat.is_cupy_array(arr):
        return "cupy"
    if compat.is_torch_array(arr):
        return "torch"
    raise WorkloadError(f"probe buffer of type {type(arr).__name__} is no NumPy, CuPy or torch array")


class Probe(RecordedWorkload):
    """The frame of every probe (see the module docstring)."""

    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("cupy",)
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "receiver"})
    features: ClassVar[frozenset[str]] = frozenset()
    matrix_rows: ClassVar[tuple[MatrixRow, ...]] = ()
    # Rows a machine of one GPU cannot measure say so instead of running.
    min_gpus: ClassVar[int] = 1
    exclusive_gpu: ClassVar[bool] = False
    defaults: ClassVar[dict[str, Any]] = {**RecordedWorkload.COMMON_DEFAULTS, "ops": 4}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Probes need at least one op after a cut at op 2: ``ops`` from 3."""
        check_range("ops", p["ops"], 3, 10_000)

    # -- what a probe implements -------------------------------------------------
    def open(self) -> None:
        """Allocate the feature's state (called once, before op 1)."""

    def launch(self, op: int) -> None:
        """Enqueue op ``op``'s work of the feature (returns before it is done where the feature allows)."""

    def wait(self, op: int) -> None:
        """Wait until op ``op``'s work is complete (default: the current stream of the array library)."""
        synchronize(self.xp)

    def buffers(self) -> dict[str, Any]:
        """Every buffer the probe owns, by name (NumPy, CuPy or torch arrays): all of them are digested."""
        return {}

    def host_state(self) -> dict[str, Any]:
        """Host values that belong to the state (counters, strings a library returned); digested too."""
        return {}

    def pointers(self) -> dict[str, int]:
        """Every address the probe holds, by name (it must be the same after a restore)."""
        return {}

    def measures(self) -> dict[str, float]:
        """Figures the matrix shows beside the cell (bandwidth, sizes); not part of the state."""
        return {}

    def close(self) -> None:
        """Release what :meth:`open` made that the process's exit would not (child processes)."""

    # -- the frame ---------------------------------------------------------------
    def setup(self) -> None:
        """Open the feature, then record the pointers held before any cut."""
        self.checksums: dict[int, str] = {}
        self.open()
        self.wait(0)
        self.pointers_initial = self.pointers()

    def run_op(self, op: int) -> None:
        """Run one op: admit → launch (the feature's work enqueued) → device_done → record (the digest) → publish/ack/commit."""
        rt = self.rt
        rt.point(op, "admit")
        self.launch(op)
        rt.point(op, "launch")
        self.wait(op)
        rt.point(op, "device_done")
        digest = self.state_digest()
        self.checksums[op] = digest
        rt.point(op, "record")
        self.deliver(op, op, digest)

    def state_digest(self) -> str:
        """The digest of every buffer and host value of the state."""
        h = hashlib.blake2b(digest_size=16)
        for name, arr in sorted(self.buffers().items()):
            h.update(f"{name}={buffer_digest(arr)};".encode())
        for name, value in sorted(self.host_state().items()):
            h.update(f"{name}:{value!r};".encode())
        return h.hexdigest()

    def finish(self) -> None:
        """Release child processes and the like before the report."""
        self.close()

    def report(self) -> dict[str, Any]:
        """The common report keys, every op's digest (``checksums``), the pointers and the probe's measures."""
        out = self.report_frame(self.state_digest())
        out.update(checksums=self.checksums, pointers_initial=self.pointers_initial, pointers_final=self.pointers(),
                   measures=self.measures())
        return out


def is_cupy(xp: Any) -> bool:
    """Whether ``xp`` is CuPy."""
    return backend_name(xp) == "cupy"
