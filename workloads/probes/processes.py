"""Probes of a second process and of handles outside CUDA: a CUDA IPC memory handle shared with a child
process, a child forked without exec (on the host, or beside a CUDA parent), anonymous shared memory
between the two, and an NVML handle held across the cut.

The children are the workload's own (its process tree): a checkpoint of the tree takes them too. Each
answers over a pipe, one line per op, and leaves at :meth:`Probe.close`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.probes import Probe, host_step, is_cupy, launch_step
from cutbench.workloads.probes.allocation import device_words
from cutbench.workloads.xp import device_uuid


class _PipeChild:
    """A child process answering one line per request over a pair of pipes."""

    def __init__(self, pid: int, to_child: int, from_child: int, proc: Any = None):
        self.pid, self.proc = pid, proc
        self.w = os.fdopen(to_child, "w", buffering=1)
        self.r = os.fdopen(from_child, "r")

    def ask(self, line: str) -> str:
        """Send ``line``, return the child's answer (RuntimeError when it is gone)."""
        self.w.write(line + "\n")
        answer = self.r.readline()
        if not answer:
            raise RuntimeError(f"probe child {self.pid} closed its pipe (it exited)")
        return answer.strip()

    def close(self, timeout: float = 30.0) -> None:
        """Ask the child to leave and reap it; one that has not left within ``timeout`` is killed."""
        try:
            self.w.write("quit\n")
            self.w.close()
        except OSError:
            pass
        self.r.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


class ForkProbe(Probe):
    """The workload ``probe_fork``: a child forked without exec works on host memory each op and answers its digest;
    with ``share = "anon_shared"`` it writes into anonymous shared memory the parent reads. On CuPy the
    parent also steps device memory: a CUDA process with a forked, CUDA-free child."""

    name = "probe_fork"
    arrays = ("numpy", "cupy")
    features = frozenset({"forked_child", "anon_shared_memory"})
    defaults = {**Probe.defaults, "share": "pipe", "words": 1 << 14}
    choices = {"share": ("pipe", "anon_shared")}
    matrix_rows = (
        MatrixRow("fork_without_exec_cuda_parent", "forked_child",
                  "a CUDA process with a child forked without exec (the child does no CUDA)", {"share": "pipe"}),
        MatrixRow("fork_without_exec_host", "forked_child", "a process with a child forked without exec (NumPy, no GPU)",
                  {"share": "pipe"}, array="numpy"),
        MatrixRow("anon_shared_memory_host", "anon_shared_memory",
                  "anonymous MAP_SHARED memory written by a forked child (NumPy, no GPU)", {"share": "anon_shared"},
                  array="numpy"),
    )

    @classmethod
    def features_for(cls, params: dict[str, Any], array: str) -> frozenset[str]:
        """A forked child, and anonymous shared memory with ``share = "anon_shared"``."""
        return frozenset({"forked_child"} | ({"anon_shared_memory"} if params.get("share") == "anon_shared" else set()))

    def open(self) -> None:
        """Map the shared memory (when asked), fork the child, and step device memory on CuPy."""
        n = self.p["words"]
        self.shared = None
        if self.p["share"] == "anon_shared":
            self._map = mmap.mmap(-1, n * 8, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
            self.shared = np.frombuffer(self._map, dtype=np.uint64)
            self.shared[:] = np.arange(n, dtype=np.uint64) + np.uint64(self.p["seed"])
        self.dev = self.xp.arange(n, dtype=self.xp.uint64) + self.xp.uint64(self.p["seed"]) if is_cupy(self.xp) else None
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no CUDA, no runtime, only host arithmetic and the pipes
            os.close(to_child_w)
            os.close(from_child_r)
            _fork_child(to_child_r, from_child_w, n, self.p["seed"], self.shared)
        os.close(to_child_r)
        os.close(from_child_w)
        self.child = _PipeChild(pid, to_child_w, from_child_r)
        self.answers: list[str] = []

    def launch(self, op: int) -> None:
        """Step the device memory (CuPy), then ask the child for its op."""
        if self.dev is not None:
            launch_step(self.dev, op)
        self.answers.append(self.child.ask(str(op)))

    def buffers(self) -> dict[str, Any]:
        """The device memory and the shared memory, where there are."""
        out = {}
        if self.dev is not None:
            out["dev"] = self.dev
        if self.shared is not None:
            out["shared"] = self.shared
        return out

    def host_state(self) -> dict[str, Any]:
        """What the child answered, op by op."""
        return {"child": tuple(self.answers)}

    def pointers(self) -> dict[str, int]:
        """The device buffer's address (CuPy)."""
        return {"dev": int(self.dev.data.ptr)} if self.dev is not None else {}

    def close(self) -> None:
        """The child leaves."""
        self.child.close()


def _fork_child(r: int, w: int, n: int, seed: int, shared: Any) -> None:
    """The forked child's loop: for each op, step its own words (or the shared ones) and answer a digest."""
    import hashlib

    code = 0
    # Nothing of the parent's but the pipes: its receiver connection, for one, stays the parent's alone.
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) not in (r, w):
            try:
                os.close(int(name))
            except OSError:
                pass
    try:
        own = np.arange(n, dtype=np.uint64) * np.uint64(7) + np.uint64(seed)
        with os.fdopen(r, "r") as rin, os.fdopen(w, "w", buffering=1) as wout:
            for line in rin:
                if line.strip() == "quit":
                    break
                op = int(line)
                target = shared if shared is not None else own
                host_step(target, op)
                wout.write(hashlib.blake2b(target.tobytes(), digest_size=8).hexdigest() + "\n")
    except BaseException:
        code = 1
    os._exit(code)


class IpcProbe(Probe):
    """The workload ``probe_ipc``: the parent shares a device buffer through a CUDA IPC memory handle with a child
    process (a fresh interpreter, CuPy); each op the child steps it through the handle and answers."""

    name = "probe_ipc"
    features = frozenset({"cuda_ipc"})
    defaults = {**Probe.defaults, "words": 1 << 16}
    matrix_rows = (MatrixRow("cuda_ipc_parent_child", "cuda_ipc",
                             "a CUDA IPC memory handle shared parent -> child, both processes in the cut"),)

    def open(self) -> None:
        """The buffer, its IPC handle, the child holding it open."""
        import cupy
        from cupy.cuda import runtime

        n = self.p["words"]
        # An allocation of its own (cudaMalloc), not a slice of CuPy's pool: an IPC handle names a whole
        # allocation, and the child maps it at its start.
        self._ptr = int(runtime.malloc(n * 8))
        self.buf = device_words(self._ptr, n, self)
        self.buf[...] = cupy.arange(n, dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        cupy.cuda.Device().synchronize()
        handle = bytes(runtime.ipcGetMemHandle(self._ptr))
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "cutbench.workloads.probes.ipc_child", handle.hex(), str(n),
                                 str(to_child_r), str(from_child_w)],
                                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.child = _PipeChild(proc.pid, to_child_w, from_child_r, proc)
        ready = self.child.r.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"IPC child did not open the handle: {ready or 'it exited'}")

    def launch(self, op: int) -> None:
        """The child steps the shared buffer (and synchronises) before it answers."""
        answer = self.child.ask(str(op))
        if answer != "ok":
            raise RuntimeError(f"IPC child at op {op}: {answer}")

    def buffers(self) -> dict[str, Any]:
        """The shared buffer as the parent sees it."""
        return {"buf": self.buf}

    def pointers(self) -> dict[str, int]:
        """The buffer's address in the parent."""
        return {"buf": int(self.buf.data.ptr)}

    def close(self) -> None:
        """The child closes the handle and leaves."""
        self.child.close()


class NvmlProbe(Probe):
    """The workload ``probe_nvml``: an NVML handle opened before the cut and asked every op (name, UUID, memory size),
    beside a device buffer stepped every op."""

    name = "probe_nvml"
    features = frozenset({"nvml"})
    defaults = {**Probe.defaults, "words": 4096}
    matrix_rows = (MatrixRow("nvml_handle_across_cut", "nvml", "an NVML device handle held across the cut and used after it"),)

    def open(self) -> None:
        """NVML initialised, the device's handle, a device buffer."""
        import cupy
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid(cupy))  # NVML's order need not be CUDA's
        self.buf = cupy.arange(self.p["words"], dtype=cupy.uint64) + cupy.uint64(self.p["seed"])
        self.answers: list[tuple[str, str, int]] = []

    def launch(self, op: int) -> None:
        """Ask NVML, step the buffer."""
        nv = self.nvml
        name = nv.nvmlDeviceGetName(self.handle)
        uuid = nv.nvmlDeviceGetUUID(self.handle)
        total = int(nv.nvmlDeviceGetMemoryInfo(self.handle).total)
        self.answers.append((str(name), str(uuid), total))
        launch_step(self.buf, op)

    def buffers(self) -> dict[str, Any]:
        """The device buffer."""
        return {"buf": self.buf}

    def host_state(self) -> dict[str, Any]:
        """Every NVML answer, op by op."""
        return {"nvml": tuple(self.answers)}

    def pointers(self) -> dict[str, int]:
        """The buffer's address."""
        return {"buf": int(self.buf.data.ptr)}
