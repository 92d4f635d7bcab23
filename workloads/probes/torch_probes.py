"""Probes of PyTorch's own CUDA machinery: the caching allocator (blocks freed into its cache and handed
out again after the cut), a ``torch.compile``'d (Inductor/Triton) kernel compiled before the cut and run
after it, and a ``torch.cuda.CUDAGraph`` captured before the cut and replayed after it.

Integer tensors (int64) throughout: the same ops give the same bits on every run.
"""

from __future__ import annotations

from typing import Any

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import check_range
from cutbench.workloads.probes import Probe

MULT = 6364136223846793005  # the LCG multiplier (< 2**63: an int64 as it is)


def _step(x: Any, v: Any) -> Any:
    """One deterministic step of an int64 tensor (``v`` a 0-d tensor, so a compiled step never re-specialises)."""
    return (x * MULT + v) ^ (x >> 7)


class _TorchProbe(Probe):
    arrays = ("torch",)

    def wait(self, op: int) -> None:
        """Every stream of the device done."""
        import torch

        torch.cuda.synchronize()


class TorchAllocatorProbe(_TorchProbe):
    """The workload ``probe_torch_allocator``: ``tensors`` int64 tensors of varied sizes through PyTorch's caching
    allocator; each op frees one into the cache and allocates another (served from the cache), and steps
    them all. The anchor tensor lives from the first op to the last."""

    name = "probe_torch_allocator"
    features = frozenset({"torch_caching_allocator"})
    defaults = {**Probe.defaults, "tensors": 8, "words": 1 << 15}
    matrix_rows = (MatrixRow("torch_caching_allocator", "torch_caching_allocator",
                             "PyTorch's caching allocator: cached blocks reused after the cut", array="torch"),)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """2..64 tensors."""
        super().check_params(p)
        check_range("tensors", p["tensors"], 2, 64)

    def open(self) -> None:
        """The anchor and the other tensors."""
        import torch

        self.live = [self._tensor(k + 1, self.p["seed"] + k) for k in range(self.p["tensors"])]
        self.v = torch.zeros((), dtype=torch.int64, device="cuda")

    def _tensor(self, scale: int, fill: int) -> Any:
        import torch

        return torch.arange(self.p["words"] * scale, dtype=torch.int64, device="cuda") + fill

    def launch(self, op: int) -> None:
        """Free one tensor (never the anchor) into the cache, allocate another, step them all."""
        del self.live[1 + op % (len(self.live) - 1)]
        self.live.append(self._tensor(1 + (op * 5) % self.p["tensors"], op))
        self.v.fill_(op)
        for t in self.live:
            t.copy_(_step(t, self.v))

    def buffers(self) -> dict[str, Any]:
        """Every live tensor, in allocation order."""
        return {f"t{i:02d}": t for i, t in enumerate(self.live)}

    def pointers(self) -> dict[str, int]:
        """The anchor's address."""
        return {"anchor": int(self.live[0].data_ptr())}

    def measures(self) -> dict[str, float]:
        """The allocator's reserved and allocated MiB now."""
        import torch

        return {"reserved_mib": torch.cuda.memory_reserved() / (1 << 20),
                "allocated_mib": torch.cuda.memory_allocated() / (1 << 20)}


class TorchCompileProbe(_TorchProbe):
    """The workload ``probe_torch_compile``: a step ``torch.compile``'d (Inductor, Triton kernels) and run once before the
    cut; every op runs the compiled kernel."""

    name = "probe_torch_compile"
    features = frozenset({"torch_compile"})
    defaults = {**Probe.defaults, "words": 1 << 16}
    matrix_rows = (MatrixRow("torch_compile_triton_kernel", "torch_compile",
                             "a torch.compile'd (Triton) kernel compiled before the cut, run after it", array="torch"),)

    def open(self) -> None:
        """Compile the step and warm it up (the compile happens here, before any cut)."""
        import torch

        self.x = torch.arange(self.p["words"], dtype=torch.int64, device="cuda") + self.p["seed"]
        self.v = torch.zeros((), dtype=torch.int64, device="cuda")
        self.step = torch.compile(_step, dynamic=False)
        self.x.copy_(self.step(self.x, self.v))

    def launch(self, op: int) -> None:
        """The compiled kernel on the state."""
        self.v.fill_(op)
        self.x.copy_(self.step(self.x, self.v))

    def buffers(self) -> dict[str, Any]:
        """The state."""
        return {"x": self.x}

    def pointers(self) -> dict[str, int]:
        """The state's address."""
        return {"x": int(self.x.data_ptr())}


class TorchGraphProbe(_TorchProbe):
    """The workload ``probe_torch_cuda_graph``: a ``torch.cuda.CUDAGraph`` of three steps over static tensors, captured
    before the cut; every op sets its input and replays it."""

    name = "probe_torch_cuda_graph"
    features = frozenset({"torch_cuda_graphs"})
    defaults = {**Probe.defaults, "words": 1 << 16}
    matrix_rows = (MatrixRow("torch_cuda_graph_replay", "torch_cuda_graphs",
                             "a torch.cuda.CUDAGraph captured before the cut, replayed after it", array="torch"),)

    def open(self) -> None:
        """Static tensors, a warm-up on a side stream, the capture."""
        import torch

        self.x = torch.arange(self.p["words"], dtype=torch.int64, device="cuda") + self.p["seed"]
        self.v = torch.zeros((), dtype=torch.int64, device="cuda")
        self.out = torch.empty_like(self.x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.out.copy_(_step(_step(_step(self.x, self.v), self.v), self.v))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out.copy_(_step(_step(_step(self.x, self.v), self.v), self.v))
        torch.cuda.synchronize()

    def launch(self, op: int) -> None:
        """Set the input, replay, carry the output into the state."""
        self.v.fill_(op)
        self.graph.replay()
        self.x.copy_(self.out)

    def buffers(self) -> dict[str, Any]:
        """The static tensors."""
        return {"x": self.x, "out": self.out}

    def pointers(self) -> dict[str, int]:
        """The static tensors' addresses (baked into the graph)."""
        return {"x": int(self.x.data_ptr()), "out": int(self.out.data_ptr()), "v": int(self.v.data_ptr())}
