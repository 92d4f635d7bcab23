"""Probes of how device memory is allocated: stream-ordered allocation from a pool with a release
threshold (``cudaMallocAsync``, partial frees, allocations after the cut), virtual memory management
(one physical allocation mapped at two addresses, exportable or not) and managed memory
(``cudaMallocManaged`` touched by the host and by kernels, with prefetches)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import check_range
from cutbench.workloads.probes import Probe, launch_step

MIB = 1 << 20


def device_words(ptr: int, words: int, owner: Any) -> Any:
    """A CuPy uint64 array over ``words`` words of device memory at ``ptr`` that CuPy does not own."""
    import cupy

    mem = cupy.cuda.UnownedMemory(int(ptr), words * 8, owner)
    return cupy.ndarray((words,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _check(call: str, result: Any) -> Any:
    """The value of a cuda-bindings call, or RuntimeError naming the call and its error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{call}: {err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class MallocAsyncProbe(Probe):
    """The workload ``probe_malloc_async``: ``blocks`` blocks from the device's default memory pool (release threshold
    ``threshold_mib``) on a stream; each op frees one (a partial free), allocates a new one of another size,
    and steps every live block. The anchor block lives from the first op to the last."""

    name = "probe_malloc_async"
    features = frozenset({"stream_ordered_pools"})
    defaults = {**Probe.defaults, "blocks": 6, "threshold_mib": 64, "block_words": 1 << 16}
    matrix_rows = (MatrixRow("malloc_async_pool", "stream_ordered_pools",
                             "cudaMallocAsync pool with a release threshold, partial frees, allocations after the cut"),)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """2..64 blocks."""
        super().check_params(p)
        check_range("blocks", p["blocks"], 2, 64)
        check_range("block_words", p["block_words"], 1, 1 << 26)

    def open(self) -> None:
        """Set the pool's threshold; allocate the anchor and the other blocks in stream order."""
        import cupy
        from cupy.cuda import runtime

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = runtime.deviceGetDefaultMemPool(cupy.cuda.Device().id)
        runtime.memPoolSetAttribute(self.pool, runtime.cudaMemPoolAttrReleaseThreshold, self.p["threshold_mib"] * MIB)
        self.live: list[tuple[int, int]] = []  # (pointer, words), the anchor first
        for k in range(self.p["blocks"]):
            self._allocate(k + 1, self.p["seed"] + k)

    def _allocate(self, scale: int, fill: int) -> None:
        from cupy.cuda import runtime

        words = self.p["block_words"] * scale
        ptr = int(runtime.mallocAsync(words * 8, self.stream.ptr))
        runtime.memsetAsync(ptr, fill & 0xFF, words * 8, self.stream.ptr)
        self.live.append((ptr, words))

    def launch(self, op: int) -> None:
        """Free a block (never the anchor), allocate another, step them all."""
        from cupy.cuda import runtime

        victim = 1 + op % (len(self.live) - 1)
        ptr, _ = self.live.pop(victim)
        runtime.freeAsync(ptr, self.stream.ptr)
        self._allocate(1 + (op * 7) % self.p["blocks"], op)
        for i, (ptr, words) in enumerate(self.live):
            launch_step(device_words(ptr, words, self), op * 100 + i, stream=self.stream)

    def wait(self, op: int) -> None:
        """The stream done."""
        self.stream.synchronize()

    def buffers(self) -> dict[str, Any]:
        """Every live block, in allocation order."""
        return {f"block{i:02d}": device_words(ptr, words, self) for i, (ptr, words) in enumerate(self.live)}

    def pointers(self) -> dict[str, int]:
        """The anchor's address (the other blocks come and go)."""
        return {"anchor": self.live[0][0]}

    def measures(self) -> dict[str, float]:
        """The pool's reserved and used bytes now."""
        from cupy.cuda import runtime

        return {"pool_reserved_mib": runtime.memPoolGetAttribute(self.pool, runtime.cudaMemPoolAttrReservedMemCurrent) / MIB,
                "pool_used_mib": runtime.memPoolGetAttribute(self.pool, runtime.cudaMemPoolAttrUsedMemCurrent) / MIB}


class VmmAliasProbe(Probe):
    """The workload ``probe_vmm_alias``: one physical allocation (``cuMemCreate``, POSIX-fd exportable or not) mapped at
    two virtual addresses; each op writes through the first and reads through the second, so the alias must
    survive a restore (a copy at each address would no longer show the other's writes)."""

    name = "probe_vmm_alias"
    features = frozenset({"virtual_memory_management"})
    defaults = {**Probe.defaults, "exportable": False, "size_mib": 2}
    matrix_rows = (
        MatrixRow("vmm_alias_two_mappings", "virtual_memory_management",
                  "cuMemCreate mapped at two addresses (aliasing must survive)", {"exportable": False}),
        MatrixRow("vmm_alias_exportable", "virtual_memory_management",
                  "the same with a POSIX-fd exportable allocation", {"exportable": True}),
    )

    def open(self) -> None:
        """Create the allocation, reserve two address ranges, map it at both, allow read/write."""
        import cupy
        from cuda.bindings import driver

        cupy.zeros(1)  # CuPy's context current on this thread, for the driver calls below
        dev = cupy.cuda.Device().id
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev
        prop.requestedHandleTypes = (driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                     if self.p["exportable"] else driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
        gran = int(_check("cuMemGetAllocationGranularity", driver.cuMemGetAllocationGranularity(
            prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        self.size = -(-(self.p["size_mib"] * MIB) // gran) * gran
        self.handle = _check("cuMemCreate", driver.cuMemCreate(self.size, prop, 0))
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = dev
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.addresses = []
        for _ in range(2):
            va = _check("cuMemAddressReserve", driver.cuMemAddressReserve(self.size, 0, 0, 0))
            _check("cuMemMap", driver.cuMemMap(va, self.size, 0, self.handle, 0))
            _check("cuMemSetAccess", driver.cuMemSetAccess(va, self.size, [access], 1))
            self.addresses.append(int(va))
        words = self.size // 8
        self.first, self.second = (device_words(a, words, self) for a in self.addresses)
        self.first[...] = cupy.arange(words, dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        self.seen = cupy.zeros(words, dtype=cupy.uint64)

    def launch(self, op: int) -> None:
        """Step through the first mapping, then fold what the second mapping shows into ``seen``."""
        launch_step(self.first, op)
        self.seen ^= self.second

    def buffers(self) -> dict[str, Any]:
        """The allocation through each mapping, and what was read through the second."""
        return {"first": self.first, "second": self.second, "seen": self.seen}

    def host_state(self) -> dict[str, Any]:
        """Whether the two mappings still show the same memory."""
        import cupy

        return {"aliased": bool(cupy.all(self.first == self.second))}

    def pointers(self) -> dict[str, int]:
        """Both virtual addresses."""
        return {"first": self.addresses[0], "second": self.addresses[1]}


class ManagedProbe(Probe):
    """The workload ``probe_managed``: ``size_mib`` of managed memory (``cudaMallocManaged``); each op the host writes one
    word per page, the memory is prefetched to the GPU, a kernel steps it, and it is prefetched back. Kept
    small: asking for more managed memory than the GPU holds can hang the GPU."""

    name = "probe_managed"
    features = frozenset({"managed_memory"})
    defaults = {**Probe.defaults, "size_mib": 16, "prefetch": True}
    matrix_rows = (MatrixRow("managed_memory_prefetch", "managed_memory",
                             "cudaMallocManaged, host and kernel access, prefetched both ways"),)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """At most 1 GiB of managed memory."""
        super().check_params(p)
        check_range("size_mib", p["size_mib"], 1, 1024)

    def open(self) -> None:
        """Allocate, fill from the host."""
        import cupy

        self.size = self.p["size_mib"] * MIB
        self.mem = cupy.cuda.malloc_managed(self.size)
        self.ptr = int(self.mem.ptr)
        self.dev = cupy.ndarray((self.size // 8,), dtype=cupy.uint64, memptr=self.mem)
        self.host = np.ctypeslib.as_array((ctypes.c_uint64 * (self.size // 8)).from_address(self.ptr))
        self.host[:] = np.arange(self.size // 8, dtype=np.uint64) + np.uint64(self.p["seed"])
        self.prefetch_error = ""

    def _prefetch(self, device: int) -> None:
        from cupy.cuda import runtime

        if not self.p["prefetch"] or self.prefetch_error:
            return
        try:
            runtime.memPrefetchAsync(self.ptr, self.size, device, 0)
        except Exception as exc:  # the call changed in CUDA 13: say so in the measures, go on without it
            self.prefetch_error = f"{type(exc).__name__}: {exc}"

    def launch(self, op: int) -> None:
        """Host writes, prefetch to the GPU, kernel, prefetch to the host."""
        import cupy
        from cupy.cuda import runtime

        cupy.cuda.Device().synchronize()
        self.host[:: 4096 // 8] += np.uint64(op)
        self._prefetch(cupy.cuda.Device().id)
        launch_step(self.dev, op)
        self._prefetch(runtime.cudaCpuDeviceId)

    def buffers(self) -> dict[str, Any]:
        """The managed memory (read on the host after the kernel)."""
        return {"managed": self.host}

    def pointers(self) -> dict[str, int]:
        """The managed address."""
        return {"managed": self.ptr}

    def measures(self) -> dict[str, float]:
        """Whether prefetching worked (1) or was skipped after an error (0)."""
        return {"prefetched": 0.0 if self.prefetch_error else 1.0}
