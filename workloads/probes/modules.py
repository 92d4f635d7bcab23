"""Probes of code and libraries: module loading (lazy and eager) with a kernel first launched after the
cut, kernels compiled at run time (NVRTC) after the cut, cuRAND generators (Philox, MTGP32) and a cuBLAS
handle, each created before the cut and used after it."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import check_range
from cutbench.workloads.probes import BLOCK, Probe

MODULE_SOURCE = r"""
extern "C" __global__ void every_op(unsigned long long* a, unsigned long long n, unsigned long long v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 6364136223846793005ULL + v;
}
extern "C" __global__ void after_cut(unsigned long long* a, unsigned long long n, unsigned long long v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] ^= (a[i] >> 17) + v * 0x9E3779B97F4A7C15ULL;
}
extern "C" __global__ void never_launched(unsigned long long* a) { a[0] = 0; }
"""


class _ModuleLoading(Probe):
    """A module of three kernels: one launched every op, one first launched at op ``late_op`` (after a cut at
    op 2), one never; the loading mode is the class's ``environment``."""

    features = frozenset({"module_loading"})
    defaults = {**Probe.defaults, "late_op": 3, "words": 4096}

    def open(self) -> None:
        """Compile and load the module; take only the first kernel's function now."""
        import cupy

        self.module = cupy.RawModule(code=MODULE_SOURCE)
        self.every = self.module.get_function("every_op")
        self.late: Any = None
        self.arr = cupy.arange(self.p["words"], dtype=cupy.uint64) + cupy.uint64(self.p["seed"])

    def launch(self, op: int) -> None:
        """The first kernel; from ``late_op`` on also the second (its first launch then)."""
        n = self.p["words"]
        grid = ((n + BLOCK - 1) // BLOCK,)
        self.every(grid, (BLOCK,), (self.arr, np.uint64(n), np.uint64(op)))
        if op >= self.p["late_op"]:
            if self.late is None:
                self.late = self.module.get_function("after_cut")
            self.late(grid, (BLOCK,), (self.arr, np.uint64(n), np.uint64(op)))

    def buffers(self) -> dict[str, Any]:
        """The word array."""
        return {"arr": self.arr}

    def pointers(self) -> dict[str, int]:
        """The array's address."""
        return {"arr": int(self.arr.data.ptr)}


class LazyLoadingProbe(_ModuleLoading):
    """The workload ``probe_lazy_loading``: the module under ``CUDA_MODULE_LOADING=LAZY`` (functions load at first use)."""

    name = "probe_lazy_loading"
    environment: ClassVar[dict[str, str]] = {"CUDA_MODULE_LOADING": "LAZY"}
    matrix_rows = (MatrixRow("lazy_loading_first_launch_after_cut", "module_loading",
                             "CUDA_MODULE_LOADING=LAZY, a kernel launched for the first time after the restore"),)


class EagerLoadingProbe(_ModuleLoading):
    """The workload ``probe_eager_loading``: the module under ``CUDA_MODULE_LOADING=EAGER``."""

    name = "probe_eager_loading"
    environment: ClassVar[dict[str, str]] = {"CUDA_MODULE_LOADING": "EAGER"}
    matrix_rows = (MatrixRow("eager_loading_first_launch_after_cut", "module_loading",
                             "CUDA_MODULE_LOADING=EAGER, a kernel launched for the first time after the restore"),)


class NvrtcProbe(Probe):
    """The workload ``probe_nvrtc``: from op ``compile_from`` on, every op compiles a new kernel with NVRTC (the op's
    constant in its source) and launches it: compilation and module loading after the cut. CuPy's kernel
    cache stays in memory, so each source really goes through NVRTC in this process."""

    name = "probe_nvrtc"
    features = frozenset({"nvrtc"})
    environment: ClassVar[dict[str, str]] = {"CUPY_CACHE_IN_MEMORY": "1"}
    defaults = {**Probe.defaults, "compile_from": 3, "words": 4096}
    matrix_rows = (MatrixRow("nvrtc_compile_after_cut", "nvrtc", "a kernel compiled by NVRTC and launched after the restore"),)

    def open(self) -> None:
        """The word array."""
        import cupy

        self.arr = cupy.arange(self.p["words"], dtype=cupy.uint64) + cupy.uint64(self.p["seed"])

    def launch(self, op: int) -> None:
        """Before ``compile_from``: an elementwise step; from it on, a kernel compiled now for this op."""
        import cupy

        if op < self.p["compile_from"]:
            self.arr *= cupy.uint64(6364136223846793005)
            self.arr += cupy.uint64(op)
            return
        source = (f'extern "C" __global__ void op_{op}(unsigned long long* a, unsigned long long n) {{\n'
                  f"    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                  f"    if (i < n) a[i] = a[i] * {1000003 + 2 * op}ULL + {op}ULL;\n}}\n")
        kernel = cupy.RawKernel(source, f"op_{op}")
        n = self.p["words"]
        kernel(((n + BLOCK - 1) // BLOCK,), (BLOCK,), (self.arr, np.uint64(n)))

    def buffers(self) -> dict[str, Any]:
        """The word array."""
        return {"arr": self.arr}

    def pointers(self) -> dict[str, int]:
        """The array's address."""
        return {"arr": int(self.arr.data.ptr)}


CURAND_METHODS = ("philox", "mtgp32", "xorwow")


class CurandProbe(Probe):
    """The workload ``probe_curand``: a cuRAND generator (``method``) created before the cut; every op draws ``n``
    uniform floats and adds them to an accumulator. A restored generator must continue its sequence."""

    name = "probe_curand"
    features = frozenset({"curand"})
    defaults = {**Probe.defaults, "method": "philox", "n": 1 << 16}
    choices = {"method": CURAND_METHODS}
    matrix_rows = (
        MatrixRow("curand_philox_state", "curand", "a cuRAND Philox4x32-10 generator continued after the restore",
                  {"method": "philox"}),
        MatrixRow("curand_mtgp32_state", "curand", "a cuRAND MTGP32 generator (state on the device) continued after the restore",
                  {"method": "mtgp32"}),
    )

    def open(self) -> None:
        """The generator (seeded) and the accumulator."""
        import cupy
        from cupy.cuda import curand

        method = {"philox": curand.CURAND_RNG_PSEUDO_PHILOX4_32_10, "mtgp32": curand.CURAND_RNG_PSEUDO_MTGP32,
                  "xorwow": curand.CURAND_RNG_PSEUDO_XORWOW}[self.p["method"]]
        self.rng = cupy.random.RandomState(seed=self.p["seed"] + 1, method=method)
        self.acc = cupy.zeros(self.p["n"], dtype=cupy.float32)

    def launch(self, op: int) -> None:
        """Draw and accumulate."""
        self.acc += self.rng.random_sample(self.p["n"], dtype=self.acc.dtype)

    def buffers(self) -> dict[str, Any]:
        """The accumulator."""
        return {"acc": self.acc}

    def pointers(self) -> dict[str, int]:
        """The accumulator's address."""
        return {"acc": int(self.acc.data.ptr)}


class CublasProbe(Probe):
    """The workload ``probe_cublas``: a cuBLAS handle made before the cut; every op multiplies two ``size``² float32
    matrices of small integers (exact in float32) and folds the product back into the first."""

    name = "probe_cublas"
    features = frozenset({"cublas"})
    defaults = {**Probe.defaults, "size": 256}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Matrices of 1..4096 rows."""
        super().check_params(p)
        check_range("size", p["size"], 1, 4096)

    matrix_rows = (MatrixRow("cublas_handle_gemm", "cublas", "a cuBLAS handle made before the cut, SGEMM after it"),)

    def open(self) -> None:
        """Two matrices of small integers; one product to create the handle and its workspace."""
        import cupy

        n = self.p["size"]
        rs = np.random.default_rng(self.p["seed"])
        self.a = cupy.asarray(rs.integers(0, 7, (n, n)).astype(np.float32))
        self.b = cupy.asarray(rs.integers(0, 7, (n, n)).astype(np.float32))
        self.a = cupy.fmod(self.a @ self.b, 17)
        self.handle = int(cupy.cuda.device.get_cublas_handle())

    def launch(self, op: int) -> None:
        """Compute ``a = (a @ b + op) mod 17`` (cuBLAS SGEMM)."""
        import cupy

        self.a = cupy.fmod(self.a @ self.b + float(op), 17)

    def buffers(self) -> dict[str, Any]:
        """Both matrices."""
        return {"a": self.a, "b": self.b}

    def host_state(self) -> dict[str, Any]:
        """The handle the library gave (it must be the one in use after the restore)."""
        import cupy

        return {"same_handle": int(cupy.cuda.device.get_cublas_handle()) == self.handle}

    def pointers(self) -> dict[str, int]:
        """The constant matrix's address."""
        return {"b": int(self.b.data.ptr)}

