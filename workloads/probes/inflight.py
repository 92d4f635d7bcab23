"""Probes of work in flight at the cut: long kernels on several streams joined by events, a host function
(``cudaLaunchHostFunc``) queued behind a kernel, and a kernel longer than the CUDA lock's timeout.

Each is cut at ``launch``: the op's GPU work is enqueued and still running when the checkpoint begins.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.common import check_range
from cutbench.workloads.probes import Probe, launch_step


class StreamsProbe(Probe):
    """The workload ``probe_streams``: ``streams`` non-blocking streams, each a kernel of ``spin_ms``, each recording an
    event that a join stream waits on before its own kernel: every op leaves four kernels and their events
    in flight."""

    name = "probe_streams"
    features = frozenset({"streams_events"})
    defaults = {**Probe.defaults, "streams": 4, "spin_ms": 200, "words": 4096}
    matrix_rows = (MatrixRow("streams_and_events_in_flight", "streams_events",
                             "four streams with 200 ms kernels and cross-stream events in flight at the cut"),)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """1 to 32 streams, a spin of 0 to 10 s."""
        super().check_params(p)
        check_range("streams", p["streams"], 1, 32)
        check_range("spin_ms", p["spin_ms"], 0, 10_000)
        check_range("words", p["words"], 1, 1 << 24)

    def open(self) -> None:
        """The streams, one word array each and one for the join, the events."""
        import cupy

        k, n = self.p["streams"], self.p["words"]
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(k)]
        self.join = cupy.cuda.Stream(non_blocking=True)
        self.arrays_ = [cupy.arange(n, dtype=cupy.uint64) + cupy.uint64(self.p["seed"] + i) for i in range(k)]
        self.joined = cupy.zeros(n, dtype=cupy.uint64)
        self.events = [cupy.cuda.Event(disable_timing=True) for _ in range(k)]
        cupy.cuda.Device().synchronize()

    def launch(self, op: int) -> None:
        """A spinning kernel per stream, its event, the join stream waiting on all of them, then its kernel."""
        spin = int(self.p["spin_ms"] * 1e6)
        for i, (stream, arr, event) in enumerate(zip(self.streams, self.arrays_, self.events, strict=True)):
            launch_step(arr, op * 64 + i, stream=stream, spin_ns=spin)
            event.record(stream)
            self.join.wait_event(event)
        launch_step(self.joined, op, stream=self.join)
        for arr in self.arrays_:  # the join's kernel reads nothing of theirs; their sum follows it on the join stream
            with self.join:
                self.joined += arr

    def wait(self, op: int) -> None:
        """Every stream done (the join stream waited for the others)."""
        self.join.synchronize()
        for stream in self.streams:
            stream.synchronize()

    def buffers(self) -> dict[str, Any]:
        """Every stream's array and the joined one."""
        return {**{f"s{i}": a for i, a in enumerate(self.arrays_)}, "joined": self.joined}

    def pointers(self) -> dict[str, int]:
        """The arrays' addresses."""
        return {name: int(a.data.ptr) for name, a in self.buffers().items()}


class HostFuncProbe(Probe):
    """The workload ``probe_host_func``: each op queues a kernel of ``spin_ms``, then a host function (run by a driver
    thread) that records the op and a value the kernel wrote, then another kernel; at a cut at ``launch``
    the host function is still queued behind the first kernel."""

    name = "probe_host_func"
    features = frozenset({"host_functions"})
    defaults = {**Probe.defaults, "spin_ms": 150, "words": 1024}
    matrix_rows = (MatrixRow("host_function_in_flight", "host_functions",
                             "a cudaLaunchHostFunc callback queued behind a 150 ms kernel at the cut"),)

    def open(self) -> None:
        """The stream, a word array, a pinned word the host function reads, the callback log."""
        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.arr = cupy.arange(self.p["words"], dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.peek = cupy.cuda.alloc_pinned_memory(8)
        self.peek_view = np.frombuffer(self.peek, dtype=np.uint64, count=1)
        cupy.cuda.Device().synchronize()

    def _callback(self, op: Any) -> None:
        # Runs on a CUDA driver thread: no CUDA calls here (the rule for host functions).
        with self.lock:
            self.calls.append((int(op), int(self.peek_view[0])))

    def launch(self, op: int) -> None:
        """Launch one op: kernel (spin) → copy one word to pinned memory → host function → kernel."""
        launch_step(self.arr, op, stream=self.stream, spin_ns=int(self.p["spin_ms"] * 1e6))
        self.arr[:1].get(stream=self.stream, out=self.peek_view, blocking=False)
        self.stream.launch_host_func(self._callback, op)
        launch_step(self.arr, op + 1000, stream=self.stream)

    def wait(self, op: int) -> None:
        """The stream done (the host function ran)."""
        self.stream.synchronize()

    def buffers(self) -> dict[str, Any]:
        """The word array."""
        return {"arr": self.arr}

    def host_state(self) -> dict[str, Any]:
        """Every host function call so far, in order, with the value it saw."""
        with self.lock:
            return {"calls": tuple(self.calls)}

    def pointers(self) -> dict[str, int]:
        """The array's address."""
        return {"arr": int(self.arr.data.ptr)}


class LockTimeoutProbe(Probe):
    """The workload ``probe_lock_timeout``: at op ``long_op`` one kernel runs ``long_ms`` — longer than the CUDA lock's
    timeout (5 s in the harness) — so a lock taken at that op's ``launch`` must time out; the process has
    to run on (a bounded, refused checkpoint), or the tool must wait it out."""

    name = "probe_lock_timeout"
    features = frozenset({"long_kernel"})
    defaults = {**Probe.defaults, "long_op": 2, "long_ms": 8000, "words": 1024}
    matrix_rows = (MatrixRow("lock_timeout_long_kernel", "long_kernel",
                             "an 8 s kernel in flight at the cut: longer than the lock's 5 s timeout"),)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """The long op is one of the ops; at most a minute long."""
        super().check_params(p)
        check_range("long_op", p["long_op"], 1, p["ops"])
        check_range("long_ms", p["long_ms"], 0, 60_000)

    def open(self) -> None:
        """A word array."""
        import cupy

        self.arr = cupy.arange(self.p["words"], dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        cupy.cuda.Device().synchronize()

    def launch(self, op: int) -> None:
        """One step, spinning ``long_ms`` first at op ``long_op``."""
        launch_step(self.arr, op, spin_ns=int(self.p["long_ms"] * 1e6) if op == self.p["long_op"] else 0)

    def buffers(self) -> dict[str, Any]:
        """The word array."""
        return {"arr": self.arr}

    def pointers(self) -> dict[str, int]:
        """The array's address."""
        return {"arr": int(self.arr.data.ptr)}
