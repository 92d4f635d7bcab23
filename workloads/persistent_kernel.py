"""``persistent_kernel``: a kernel that never ends, polling a mapped host queue.

One long-running CUDA block spins on a queue in pinned, mapped host memory
(``q[0]`` submitted op, ``q[1]`` completed op, ``q[2]`` stop). For each
submitted op it advances a device-side state vector with exactly the
``counter`` arithmetic (so ``counter``'s reference is the ground truth) and a
device-side sequence number, then publishes completion to the host. The host
side is ``counter``'s op lifecycle: the ``launch`` phase submits to the queue
instead of enqueueing kernels, ``device_done`` waits for the completion word.

A kernel that never returns makes ``cuCheckpointProcessLock`` time out
(``CUDA_ERROR_NOT_READY``): without its adapter every CUDA cut is refused
and the workload runs on. Its execution state is the domain ``device_work``,
which no checkpoint holds mid-flight. With ``quiesce_adapter = true`` the
workload registers :class:`KernelDrain`, the semantic adapter of that domain
(:mod:`cutbench.workloads.adapters`): at ``prepare`` it sets ``q[2]``, the
kernel finishes every submitted op and exits at that epoch boundary
(``quiescent(op N)``), and the host relaunches it the next time it submits,
once the cut is committed, aborted or restored.

GPU only (CuPy); the report adds ``domain_ops`` (host and device sequence),
so a device that drifted from the host shows up as ``mixed_epoch``.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from cutbench.workloads.adapters import Ready
from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import Counter
from cutbench.workloads.xp import is_device

KERNEL = r"""
extern "C" __global__ void persistent_counter(volatile long long* q, unsigned long long* state,
        unsigned long long* devseq, long long n, unsigned long long seed) {
    __shared__ long long next;
    long long done = (long long)devseq[0];
    while (true) {
        if (threadIdx.x == 0) {
            long long op = -1;
            while (true) {
                long long sub = q[0];
                if (sub > done) { op = done + 1; break; }
                if (q[2] != 0) break;
                __nanosleep(2000);
            }
            next = op;
        }
        __syncthreads();
        long long op = next;
        __syncthreads();
        if (op < 0) return;
        unsigned long long base = seed * 0x9E3779B97F4A7C15ULL + (unsigned long long)op * 0xBF58476D1CE4E5B9ULL;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned long long x = (unsigned long long)i + base;
            x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
            x ^= x >> 27; x *= 0x94D049BB133111EBULL;
            x ^= x >> 31;
            state[i] = state[i] * 6364136223846793005ULL + x;
        }
        __threadfence();
        __syncthreads();
        done = op;
        if (threadIdx.x == 0) {
            devseq[0] = (unsigned long long)op;
            __threadfence_system();
            q[1] = op;
            __threadfence_system();
        }
    }
}
"""

# How long the host waits for the kernel to complete one op.
OP_TIMEOUT_S = 60.0


class KernelDrain:
    """The semantic adapter of the persistent kernel's execution (domain ``device_work``): ``prepare`` drains
    it at an epoch boundary; the host may relaunch it only after ``commit``, ``abort`` or ``restored``."""

    domain = "device_work"
    effects = False  # the kernel's completions are the host's effects, published by the op lifecycle
    holds = True  # drained, it is not relaunched before commit, abort or restored, whatever the host does

    def __init__(self, workload: "PersistentKernel"):
        self.workload = workload
        self.held = False

    def prepare(self, epoch: int, deadline: float) -> Ready:
        """Let the kernel finish every submitted op and exit; wait for it."""
        self.held = True
        self.workload.drain()
        return Ready(f"quiescent(op {int(self.workload.q[1])})")

    def commit(self, epoch: int) -> None:
        """The kernel may run again."""
        self.held = False

    abort = restored = commit


class PersistentKernel(Counter):
    """The ``persistent_kernel`` workload (see module docstring)."""

    name: ClassVar[str] = "persistent_kernel"
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "receiver", "device_work"})
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("cupy",)
    defaults: ClassVar[dict[str, Any]] = {
        **Counter.defaults,
        "state_size": 65536,
        "threads": 256,
        "quiesce_adapter": False,
    }

    def setup(self) -> None:
        """Allocate the state, the device sequence and the mapped queue; warm every kernel up."""
        xp = self.xp
        if not is_device(xp):
            raise RuntimeError("persistent_kernel needs a GPU: set workload.array = \"cupy\"")
        import numpy as np

        super().setup()
        self.devseq = xp.zeros(1, dtype=xp.uint64)
        # Pinned host memory is mapped into the device's address space (UVA):
        # the kernel reads and writes it through the same pointer.
        self._qmem = xp.cuda.alloc_pinned_memory(4 * 8)
        self.q = np.frombuffer(self._qmem, dtype=np.int64, count=4)
        self.q[:] = 0
        self.kernel = xp.RawKernel(KERNEL, "persistent_counter")
        # Its own non-blocking stream: the legacy default stream, where the
        # digest reductions run, does not wait for it.
        self.kstream = xp.cuda.Stream(non_blocking=True)
        self.running = False
        # Compile everything before the kernel spins: the reductions of the digest
        # and the kernel itself.
        self.state_digest()
        getattr(self.kernel, "compile", lambda: None)()
        self.adapter: KernelDrain | None = None
        if self.p["quiesce_adapter"]:
            self.adapter = KernelDrain(self)
            self.rt.register_adapter(self.adapter)

    def _ensure_kernel(self) -> None:
        if self.running:
            return
        deadline = time.monotonic() + OP_TIMEOUT_S
        while self.adapter is not None and self.adapter.held:  # drained for a cut: relaunch once it is over
            self.rt.service()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the drained kernel was not let run again within {OP_TIMEOUT_S:g}s")
            time.sleep(0.0005)
        import numpy as np

        self.q[2] = 0
        args = (np.uint64(self._qmem.ptr), self.state, self.devseq, np.int64(self.state.size), np.uint64(self.p["seed"]))
        with self.kstream:
            self.kernel((1,), (int(self.p["threads"]),), args)
        self.running = True

    def drain(self) -> None:
        """Let the kernel finish every submitted op, exit, and wait for it (the adapter's prepare, and the end)."""
        if not self.running:
            return
        self.q[2] = 1
        self.kstream.synchronize()
        self.running = False

    def launch_op(self, op: int) -> None:
        """Submit op ``op`` to the running kernel (relaunching it after a drain)."""
        self._ensure_kernel()
        self.q[0] = op

    def wait_op(self, op: int) -> None:
        """Spin on the completion word until the kernel has done op ``op``."""
        deadline = time.monotonic() + OP_TIMEOUT_S
        while self.q[1] < op:
            self.rt.service()
            if time.monotonic() > deadline:
                raise RuntimeError(f"persistent kernel did not complete op {op} within {OP_TIMEOUT_S:g}s (q={list(self.q)})")
            time.sleep(0)

    def finish(self) -> None:
        """Stop the kernel before the final report."""
        self.drain()

    def report(self) -> dict[str, Any]:
        """Return ``counter``'s report plus the host and device sequence numbers."""
        out = super().report()
        out["domain_ops"] = {"host": int(self.host_op), "device": int(self.devseq.get()[0])}
        out["quiesce_adapter"] = bool(self.p["quiesce_adapter"])
        return out

    # save_state is counter's: at an op boundary the kernel is idle.

    def load_state(self, path: str) -> int:
        """Load the state and set the device sequence and queue to the saved op (the kernel starts later)."""
        op = super().load_state(path)
        self.devseq[0] = op
        self.q[0] = self.q[1] = op
        return op
