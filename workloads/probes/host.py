"""Probes of host memory the GPU reaches: ``cudaHostAlloc`` mapped, and ``cudaHostRegister`` (mapped) on
``malloc``'d and on ``mmap``'d memory, read and written by a zero-copy kernel; host-to-device bandwidth
is measured when the probe opens and again at its end (after any restore), so a restore that leaves the
memory pageable shows as a drop."""

from __future__ import annotations

import ctypes
import mmap
import time
from typing import Any

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.probes import BLOCK, Probe

HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped
HOST_REGISTER_MAPPED = 2  # cudaHostRegisterMapped
MEMCPY_H2D = 1  # cudaMemcpyHostToDevice
KINDS = ("host_alloc", "register_malloc", "register_mmap")

ZERO_COPY_SOURCE = r"""
extern "C" __global__ void zero_copy(unsigned long long* host, unsigned long long* dev, unsigned long long n,
                                     unsigned long long v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned long long x = dev[i] * 6364136223846793005ULL + host[i] + v;
        dev[i] = x;
        host[i] = x ^ (v * 0x9E3779B97F4A7C15ULL);
    }
}
"""


def _device_pointer(host_ptr: int) -> int:
    """The device address of mapped host memory (``cuMemHostGetDevicePointer``)."""
    from cuda.bindings import driver

    err, dptr = driver.cuMemHostGetDevicePointer(host_ptr, 0)
    if int(err) != 0:
        raise RuntimeError(f"cuMemHostGetDevicePointer: {err}")
    return int(dptr)


class PinnedProbe(Probe):
    """The workload ``probe_pinned``: mapped host memory of one ``kind`` (see the module docstring)."""

    name = "probe_pinned"
    features = frozenset({"pinned_host_memory"})
    defaults = {**Probe.defaults, "kind": "host_alloc", "size_mib": 64, "kernel_words": 1 << 20}
    choices = {"kind": KINDS}
    matrix_rows = (
        MatrixRow("pinned_host_alloc_mapped", "pinned_host_memory", "cudaHostAlloc(mapped), zero-copy kernel, H2D bandwidth",
                  {"kind": "host_alloc"}),
        MatrixRow("host_register_malloc", "pinned_host_memory", "cudaHostRegister(mapped) on malloc'd memory, zero-copy kernel",
                  {"kind": "register_malloc"}),
        MatrixRow("host_register_mmap", "pinned_host_memory", "cudaHostRegister(mapped) on mmap'd memory, zero-copy kernel",
                  {"kind": "register_mmap"}),
    )

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """The kernel's words fit in the buffer (``kind`` is checked through ``choices``)."""
        super().check_params(p)
        if not 1 <= p["kernel_words"] * 8 <= p["size_mib"] << 20:
            raise ValueError(f"parameter kernel_words = {p['kernel_words']}: must be 1..size_mib MiB / 8")

    def open(self) -> None:
        """Allocate or register the host memory, map it, fill it; measure H2D bandwidth once."""
        import cupy
        from cupy.cuda import runtime

        size = self.p["size_mib"] << 20
        kind = self.p["kind"]
        self._keep: Any = None
        if kind == "host_alloc":
            self.host_ptr = int(runtime.hostAlloc(size, HOST_ALLOC_MAPPED))
        elif kind == "register_malloc":
            libc = ctypes.CDLL(None)
            libc.malloc.restype = ctypes.c_void_p
            self.host_ptr = int(libc.malloc(size))
            runtime.hostRegister(self.host_ptr, size, HOST_REGISTER_MAPPED)
        else:
            self._keep = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.host_ptr = ctypes.addressof(ctypes.c_char.from_buffer(self._keep))
            runtime.hostRegister(self.host_ptr, size, HOST_REGISTER_MAPPED)
        self.host = np.ctypeslib.as_array((ctypes.c_uint64 * (size // 8)).from_address(self.host_ptr))
        self.host[:] = np.arange(size // 8, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(self.p["seed"])
        self.dev_ptr = _device_pointer(self.host_ptr)
        n = self.p["kernel_words"]
        self.dev = cupy.zeros(n, dtype=cupy.uint64)
        self.staging = cupy.empty(size, dtype=cupy.uint8)
        self.kernel = cupy.RawKernel(ZERO_COPY_SOURCE, "zero_copy")
        self.h2d_open = self._h2d_gbps()

    def _h2d_gbps(self) -> float:
        """Host-to-device bandwidth from this memory, GB/s (best of 3 copies of the whole buffer)."""
        from cupy.cuda import runtime

        size = self.p["size_mib"] << 20
        best = float("inf")
        for _ in range(3):
            runtime.deviceSynchronize()
            t0 = time.perf_counter()
            runtime.memcpy(int(self.staging.data.ptr), self.host_ptr, size, MEMCPY_H2D)
            runtime.deviceSynchronize()
            best = min(best, time.perf_counter() - t0)
        return size / best / 1e9

    def launch(self, op: int) -> None:
        """The zero-copy kernel: reads and writes the host memory through its device address."""
        n = self.p["kernel_words"]
        self.kernel(((n + BLOCK - 1) // BLOCK,), (BLOCK,), (np.uint64(self.dev_ptr), self.dev, np.uint64(n), np.uint64(op)))

    def buffers(self) -> dict[str, Any]:
        """The host memory (as the CPU reads it) and the device buffer."""
        return {"host": self.host, "dev": self.dev}

    def pointers(self) -> dict[str, int]:
        """The host address, its device address and the device buffer."""
        return {"host": self.host_ptr, "host_on_device": self.dev_ptr, "dev": int(self.dev.data.ptr)}

    def measures(self) -> dict[str, float]:
        """H2D GB/s when opened and now (at the end, after any restore)."""
        return {"h2d_gbps_open": round(self.h2d_open, 2), "h2d_gbps_end": round(self._h2d_gbps(), 2)}
