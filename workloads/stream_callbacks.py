"""``stream_callbacks``: effects published from host callbacks queued on a stream.

Op *i* queues on one stream: the counter update (``state = state * MULT +
mix(seed, i)``, the same state machine as ``counter``), two reductions of the
new state, an asynchronous copy of them into pinned host memory, and a host
callback. The callback — not the main thread — turns the copied sums into the
effect's digest, publishes it and waits for the ack. The main thread only
waits for the stream, records the result and commits.

Those callbacks are the work a CUDA checkpoint lock waits for: a lock taken
while a callback is still waiting (on the receiver, or parked at a cut point)
cannot complete until the callback returns. The cut points ``publish`` and
``ack`` are announced from inside the callback, so a precise cut can park the
stream's callback thread while the main thread waits in ``synchronize``.

Two implementations of one stream interface:

- CuPy: a ``cupy.cuda.Stream`` with ``launch_host_func`` (``cudaLaunchHostFunc``;
  the callback runs on a CUDA driver thread and makes no CUDA calls);
- NumPy (the CPU analogue, so the workload runs in CI): one worker thread
  executes the queued work and callbacks in order, like a stream.

The reference is ``counter``'s: the same state machine and the same digest.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.common import BaseWorkload, check_range, load_state_into, save_state_file, sums
from cutbench.workloads.counter import CounterReference, apply_op, digest, initial_state
from cutbench.workloads.xp import is_device, pointer, synchronize

PHASES: tuple[str, ...] = ("admit", "launch", "publish", "ack", "device_done", "record", "commit")


class HostStream:
    """A CPU stand-in for a CUDA stream: one worker thread runs what is queued, in order."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="host-stream", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, args = item
            try:
                fn(*args)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def launch(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)`` (device work, on this CPU analogue)."""
        self._queue.put((fn, args))

    def launch_host_func(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Queue the host callback ``fn(arg)``."""
        self._queue.put((fn, (arg,)))

    def synchronize(self) -> None:
        """Wait until everything queued so far has run."""
        self._queue.join()

    def close(self) -> None:
        """Stop the worker thread after the queued work."""
        self._queue.put(None)
        self._thread.join(timeout=10)


class DeviceStream:
    """A CuPy stream: device work is enqueued under it; host callbacks via ``cudaLaunchHostFunc``."""

    def __init__(self, xp: ModuleType):
        self.stream = xp.cuda.Stream(non_blocking=True)

    def launch(self, fn: Callable[..., None], *args: Any) -> None:
        """Enqueue the device work ``fn(*args)`` issues, on this stream."""
        with self.stream:
            fn(*args)

    def launch_host_func(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Enqueue the host callback ``fn(arg)``."""
        self.stream.launch_host_func(fn, arg)

    def synchronize(self) -> None:
        """Wait for the stream (CuPy releases the GIL, so callbacks can run meanwhile)."""
        self.stream.synchronize()

    def close(self) -> None:
        """Nothing to stop: the driver owns the callback thread."""


def sums_digest(n: int, s1: int, s2: int) -> str:
    """Return ``counter``'s digest of a state of ``n`` elements, from its two sums (computed on the host)."""
    return hashlib.blake2b(f"{n}:{s1}:{s2}".encode(), digest_size=16).hexdigest()


class StreamCallbacks(BaseWorkload):
    """The ``stream_callbacks`` workload (see module docstring)."""

    name: ClassVar[str] = "stream_callbacks"
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {**BaseWorkload.COMMON_DEFAULTS, "state_size": 4096}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """State size."""
        check_range("state_size", p["state_size"], 1, 1 << 28)

    def setup(self) -> None:
        """Allocate the state, the pinned landing buffer for the sums, and the stream."""
        xp = self.xp
        self.acked = 0  # last op whose callback saw the ack (callback thread)
        self._error: BaseException | None = None
        self.state = initial_state(xp, self.p["state_size"], self.p["seed"])
        if is_device(xp):
            import cupyx  # type: ignore[import-not-found]
            import numpy as np

            self.landing = cupyx.zeros_pinned((2,), dtype=np.uint64)
            self.stream: HostStream | DeviceStream = DeviceStream(xp)
        else:
            self.landing = xp.zeros(2, dtype=xp.uint64)
            self.stream = HostStream()
        synchronize(xp)
        self.pointers_initial = {"state": pointer(self.state)}

    def _compute(self, op: int) -> None:
        """Device work of op ``op``: update, reduce, copy the two sums to the pinned landing buffer."""
        xp = self.xp
        apply_op(xp, self.state, self.p["seed"], op)
        self.simulate_work()  # on the stream: the callback of this op waits for it
        self._sums = sums(xp, self.state)  # kept alive until the copy has run
        if is_device(xp):
            stream = xp.cuda.get_current_stream()
            xp.cuda.runtime.memcpyAsync(self.landing.ctypes.data, self._sums.data.ptr, 16,
                                        xp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        else:
            self.landing[...] = self._sums

    def _callback(self, op: int) -> None:
        """Host callback of op ``op``: publish the digest of the landed sums and wait for the ack."""
        rt = self.rt
        try:
            effect = sums_digest(self.p["state_size"], int(self.landing[0]), int(self.landing[1]))
            rt.receiver.send_effect(rt.trial, op, rt.epoch, effect)
            rt.point(op, "publish")
            rt.receiver.wait_ack(op)
            self.acked = op
            rt.point(op, "ack")
        except BaseException as exc:  # a callback must not raise into the driver: hand it to the main thread
            self._error = exc

    def run_op(self, op: int) -> None:
        """Queue the work and the callback, wait for the stream, record, commit."""
        rt = self.rt
        rt.point(op, "admit")
        self.stream.launch(self._compute, op)
        self.stream.launch_host_func(self._callback, op)
        rt.point(op, "launch")
        self.stream.synchronize()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        rt.point(op, "device_done")
        self.recorded = sums_digest(self.p["state_size"], int(self.landing[0]), int(self.landing[1]))
        rt.point(op, "record")
        self.commit(op, op)

    def finish(self) -> None:
        """Stop the stream's worker thread (NumPy)."""
        self.stream.close()

    def report(self) -> dict[str, Any]:
        """Committed op, state digest, callbacks acknowledged against ops committed."""
        return {
            **self.report_frame(digest(self.xp, self.state), {"callbacks": self.acked, "host": self.committed},
                                "every committed op's callback saw its ack"),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"state": pointer(self.state)},
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at an op boundary (the stream is idle there)."""
        save_state_file(path, {"committed": self.committed, "acked": self.acked}, {"state": self.state})

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file; return the op to resume after."""
        header = load_state_into(path, self.xp, {"state": self.state})
        self.committed, self.acked = header["committed"], header["acked"]
        return self.committed

    @classmethod
    def reference(cls, params: dict[str, Any]) -> CounterReference:
        """Return ``counter``'s reference: same state machine, same digest."""
        return CounterReference(params["seed"], params["state_size"])
