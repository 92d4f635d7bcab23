"""Probes of plain memory: a buffer of a size (device or host), ``__device__`` and ``__constant__``
globals of a module, and a texture and a surface object over CUDA arrays."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import check_range
from cutbench.workloads.probes import BLOCK, Probe
from cutbench.workloads.xp import pointer, release_cached_memory

GIB = 1 << 30
MIB = 1 << 20


class MemoryProbe(Probe):
    """The workload ``probe_memory``: one buffer of ``size_bytes``, every byte changed by every op.

    On CuPy it is device memory (``cudaMalloc`` through CuPy's pool), on NumPy
    host memory: the same probe measures a CPU tool on the host and a GPU tool
    on the device, from 1 byte to several GiB.
    """

    name = "probe_memory"
    arrays: ClassVar[tuple[str, ...]] = ("numpy", "cupy")
    features = frozenset({"device_memory", "host_memory"})
    defaults = {**Probe.defaults, "size_bytes": MIB}
    matrix_rows: ClassVar[tuple[MatrixRow, ...]] = (
        MatrixRow("device_memory_1B", "device_memory", "1 byte of device memory", {"size_bytes": 1}),
        MatrixRow("device_memory_1MiB", "device_memory", "1 MiB of device memory", {"size_bytes": MIB}),
        MatrixRow("device_memory_1GiB", "device_memory", "1 GiB of device memory", {"size_bytes": GIB}),
        MatrixRow("host_memory_1B", "host_memory", "1 byte of host memory (NumPy, no GPU)", {"size_bytes": 1},
                  array="numpy"),
        MatrixRow("host_memory_64MiB", "host_memory", "64 MiB of host memory (NumPy, no GPU)", {"size_bytes": 64 * MIB},
                  array="numpy"),
    )

    @classmethod
    def features_for(cls, params: dict[str, Any], array: str) -> frozenset[str]:
        """Device memory on a GPU array backend, host memory on NumPy."""
        return frozenset({"host_memory" if array == "numpy" else "device_memory"})

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Return ``size_bytes`` from 1 byte to 64 GiB."""
        super().check_params(p)
        check_range("size_bytes", p["size_bytes"], 1, 64 * GIB)

    def open(self) -> None:
        """The buffer, filled with a pattern of the seed."""
        xp = self.xp
        n = self.p["size_bytes"]
        pattern = ((np.arange(min(n, 1 << 16), dtype=np.uint64) * np.uint64(2654435761) + np.uint64(self.p["seed"]))
                   & np.uint64(0xFF)).astype(np.uint8)
        reps = -(-n // pattern.shape[0])
        self.buf = xp.ascontiguousarray(xp.tile(xp.asarray(pattern), reps)[:n])

    def launch(self, op: int) -> None:
        """Compute ``buf = buf * 31 + op`` on every byte (a device kernel on CuPy)."""
        self.buf *= self.xp.uint8(31)
        self.buf += self.xp.uint8(op & 0xFF)

    def buffers(self) -> dict[str, Any]:
        """The buffer."""
        return {"buf": self.buf}

    def state_digest(self) -> str:
        """The digest, then the digest's temporaries given back: the checkpoint moves the buffer, not them."""
        digest = super().state_digest()
        release_cached_memory(self.xp)
        return digest

    def pointers(self) -> dict[str, int]:
        """The buffer's address."""
        return {"buf": pointer(self.buf)}


GLOBALS_SOURCE = r"""
extern "C" {
__device__ unsigned long long g_state[1024];
__constant__ unsigned long long c_table[64];
__global__ void step_globals(unsigned long long v) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 1024) g_state[i] = g_state[i] * 6364136223846793005ULL + c_table[i & 63] + v;
}
}
"""


class GlobalsProbe(Probe):
    """The workload ``probe_globals``: a module's ``__device__`` array and ``__constant__`` table, read and written by its kernel."""

    name = "probe_globals"
    features = frozenset({"module_globals"})
    matrix_rows = (MatrixRow("device_and_constant_globals", "module_globals",
                             "__device__ and __constant__ globals of a module compiled at run time"),)

    def open(self) -> None:
        """Compile the module, fill the constant table and the device array through their symbols."""
        import cupy

        self.module = cupy.RawModule(code=GLOBALS_SOURCE)
        self.kernel = self.module.get_function("step_globals")
        g, c = self.module.get_global("g_state"), self.module.get_global("c_table")
        self.g = cupy.ndarray((1024,), dtype=cupy.uint64, memptr=g)
        self.c = cupy.ndarray((64,), dtype=cupy.uint64, memptr=c)
        seed = self.p["seed"]
        self.g.set((np.arange(1024, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(seed))
        self.c.set(np.arange(64, dtype=np.uint64) * np.uint64(1000003) + np.uint64(seed))

    def launch(self, op: int) -> None:
        """The kernel over the globals."""
        self.kernel((4,), (BLOCK,), (np.uint64(op),))

    def buffers(self) -> dict[str, Any]:
        """Both globals."""
        return {"g_state": self.g, "c_table": self.c}

    def pointers(self) -> dict[str, int]:
        """The symbols' device addresses."""
        return {"g_state": int(self.g.data.ptr), "c_table": int(self.c.data.ptr)}


TEXTURE_SOURCE = r"""
extern "C" __global__ void tex_step(cudaTextureObject_t tex, cudaSurfaceObject_t surf, int w, int h, unsigned int v) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) {
        unsigned int t = tex2D<unsigned int>(tex, x, y);
        surf2Dwrite(t * 2654435761u + v + (unsigned int)(x * 31 + y), surf, x * 4, y);
    }
}
"""


class TextureProbe(Probe):
    """The workload ``probe_texture``: two CUDA arrays, a texture object and a surface object over each; each op reads
    one through its texture and writes the other through its surface (ping-pong)."""

    name = "probe_texture"
    features = frozenset({"texture_surface"})
    defaults = {**Probe.defaults, "width": 256, "height": 128}
    matrix_rows = (MatrixRow("texture_and_surface_objects", "texture_surface",
                             "texture and surface objects over CUDA arrays, created before the cut"),)

    def open(self) -> None:
        """The arrays (filled from the host), their texture and surface objects, the kernel."""
        import cupy
        from cupy.cuda import runtime, texture

        w, h = self.p["width"], self.p["height"]
        desc = texture.ChannelFormatDescriptor(32, 0, 0, 0, runtime.cudaChannelFormatKindUnsigned)
        self.arrays_ = [texture.CUDAarray(desc, w, h, 0, runtime.cudaArraySurfaceLoadStore) for _ in range(2)]
        init = ((np.arange(w * h, dtype=np.uint32) * np.uint32(2246822519)) ^ np.uint32(self.p["seed"])).reshape(h, w)
        for arr in self.arrays_:
            arr.copy_from(init)
        self.textures, self.surfaces = [], []
        for arr in self.arrays_:
            res = texture.ResourceDescriptor(runtime.cudaResourceTypeArray, cuArr=arr)
            tex = texture.TextureDescriptor((runtime.cudaAddressModeClamp, runtime.cudaAddressModeClamp),
                                            runtime.cudaFilterModePoint, runtime.cudaReadModeElementType)
            self.textures.append(texture.TextureObject(res, tex))
            self.surfaces.append(texture.SurfaceObject(res))
        self.kernel = cupy.RawKernel(TEXTURE_SOURCE, "tex_step")

    def launch(self, op: int) -> None:
        """Read array ``op % 2`` through its texture, write the other through its surface."""
        w, h = self.p["width"], self.p["height"]
        src, dst = op % 2, 1 - op % 2
        self.kernel(((w + 15) // 16, (h + 15) // 16), (16, 16),
                    (self.textures[src], self.surfaces[dst], np.int32(w), np.int32(h), np.uint32(op)))

    def buffers(self) -> dict[str, Any]:
        """Both arrays' contents, copied to the host."""
        out = {}
        for i, arr in enumerate(self.arrays_):
            host = np.empty((self.p["height"], self.p["width"]), dtype=np.uint32)
            arr.copy_to(host)
            out[f"array{i}"] = host
        return out
