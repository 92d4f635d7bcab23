"""Probes of CUDA graphs: a graph captured and instantiated before the cut and replayed after it; an
executable graph updated in place (``cuGraphExecUpdate``) every op; a graph with a memory-allocation
node (``cudaMallocAsync`` captured into it) replayed every op."""

from __future__ import annotations

from typing import Any

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.probes import BLOCK, Probe, launch_step, step_kernel

MODES = ("replay", "update", "mem_alloc_node")
MEMCPY_D2D = 3  # cudaMemcpyDeviceToDevice

GRAPH_SOURCE = r"""
extern "C" __global__ void step_from(unsigned long long* a, unsigned long long n, const unsigned long long* v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 6364136223846793005ULL + (*v ^ (i * 0x9E3779B97F4A7C15ULL));
}
extern "C" __global__ void copy_step(unsigned long long* out, const unsigned long long* a, unsigned long long n,
                                     const unsigned long long* v) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (a[i] ^ (a[i] >> 29)) * 0xBF58476D1CE4E5B9ULL + *v;
}
"""


class GraphProbe(Probe):
    """The workload ``probe_graph``: a CUDA graph in one of three ``mode`` s (see the module docstring), on a stream of its own."""

    name = "probe_graph"
    features = frozenset({"cuda_graphs"})
    defaults = {**Probe.defaults, "mode": "replay", "words": 1 << 16}
    choices = {"mode": MODES}
    matrix_rows = (
        MatrixRow("graph_replay_after_cut", "cuda_graphs", "a graph captured and instantiated before the cut, replayed after it",
                  {"mode": "replay"}),
        MatrixRow("graph_exec_update_after_cut", "cuda_graphs", "an executable graph updated (cuGraphExecUpdate) and launched every op",
                  {"mode": "update"}),
        MatrixRow("graph_mem_alloc_node", "cuda_graphs", "a graph with a memory-allocation node (captured cudaMallocAsync), replayed every op",
                  {"mode": "mem_alloc_node"}),
    )

    def open(self) -> None:
        """The stream, the state, the op's input word on the device, and the graph of the mode."""
        import cupy
        from cupy.cuda import runtime

        n = self.p["words"]
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.a = cupy.arange(n, dtype=cupy.uint64) * cupy.uint64(3) + cupy.uint64(self.p["seed"])
        self.v = cupy.zeros(1, dtype=cupy.uint64)
        module = cupy.RawModule(code=GRAPH_SOURCE)
        self.step_from = module.get_function("step_from")
        self.copy_step = module.get_function("copy_step")
        step_kernel()  # compiled and loaded before any capture: a module load is no stream operation
        cupy.cuda.Device().synchronize()
        grid = ((n + BLOCK - 1) // BLOCK,)
        mode = self.p["mode"]
        self.stream.begin_capture()
        if mode == "replay":
            self.step_from(grid, (BLOCK,), (self.a, np.uint64(n), self.v), stream=self.stream)
        elif mode == "update":
            launch_step(self.a, 0, stream=self.stream)
        else:
            nbytes = n * 8
            scratch = runtime.mallocAsync(nbytes, self.stream.ptr)
            self.copy_step(grid, (BLOCK,), (np.uint64(scratch), self.a, np.uint64(n), self.v), stream=self.stream)
            runtime.memcpyAsync(int(self.a.data.ptr), scratch, nbytes, MEMCPY_D2D, self.stream.ptr)
            runtime.freeAsync(scratch, self.stream.ptr)
        self.graph = self.stream.end_capture()
        self.graph.upload(self.stream)
        self.stream.synchronize()

    def launch(self, op: int) -> None:
        """Set the op's input (replay, mem_alloc_node) or update the executable graph (update), then launch it."""
        if self.p["mode"] == "update":
            self._update(op)
        else:
            with self.stream:  # on the graph's stream: ordered before the launch
                self.v.fill(op)
        self.graph.launch(self.stream)

    def _update(self, op: int) -> None:
        """Capture the same topology with the op's parameter and update the executable graph to it."""
        from cuda.bindings import driver

        self.stream.begin_capture()
        launch_step(self.a, op, stream=self.stream)
        fresh = self.stream.end_capture()
        err, info = driver.cuGraphExecUpdate(driver.CUgraphExec(int(self.graph.graphExec)), driver.CUgraph(int(fresh.graph)))
        if int(err) != 0:
            raise RuntimeError(f"cuGraphExecUpdate at op {op}: {err} ({getattr(info, 'result', info)})")

    def wait(self, op: int) -> None:
        """The graph's stream done."""
        self.stream.synchronize()

    def buffers(self) -> dict[str, Any]:
        """The state and the input word."""
        return {"a": self.a, "v": self.v}

    def pointers(self) -> dict[str, int]:
        """The state's and the input word's addresses (baked into the graph's kernels)."""
        return {"a": int(self.a.data.ptr), "v": int(self.v.data.ptr)}
