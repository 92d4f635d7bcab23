"""The kit's first half, with no cutbench in it: the probe's text and the hands that act on it.

A hunt's reproducer is this file's text, then :mod:`~cutbench.harness.nemesis.lifecycle_kit`'s (its
``# kit-import`` lines dropped), then an engine's kit where the tool is an engine: see
``hunt.reproducer``. Only the standard library is imported here; the GPU probe imports CuPy and the driver
agent ``cuda-bindings``, each in its own process.

Here: the probe (:data:`PROBE`, its variants :data:`PROBES`), the filler that takes a GPU's free memory, the
tools' hands (:class:`Utility` for NVIDIA's ``cuda-checkpoint``, :class:`Driver` for the driver's checkpoint
API in an agent process, :func:`criu_argv`), the release of CRIU's network lock, and the process helpers a
session collects its probes with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROBE = r'''
import json, os, sys, threading, time
d, kind = sys.argv[1], sys.argv[2]
variant = sys.argv[3] if len(sys.argv) > 3 else "buffers"
gpu = kind == "gpu"
SPIN_NS = 500_000_000                 # a step left at its launch: GPU work (or a CPU thread) busy this long
if gpu:
    import cupy as cp
    # One thread spinning on the GPU's global timer: work still in flight when the next step comes.
    spin = cp.RawKernel(
        'extern "C" __global__ void spin(unsigned long long ns) { unsigned long long t0, t;'
        ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
        ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }', "spin")
    spin.compile()
N0 = 1 << 24 if gpu else 1 << 14      # 64 MiB of float32 on the GPU
N1 = 1 << 22 if gpu else 1 << 12      # what `alloc` adds: 16 MiB
def new(n, v):
    return cp.full(n, v, dtype=cp.float32) if gpu else [float(v)] * n
bufs = [new(N0, 1.0)]
# The probe's variants: "buffers" (the default stream), "streams" (two non-blocking streams, the second waiting on
# the first through an event), "pinned" (buffer 0 mirrored into page-locked host memory by an async copy).
streams, mirror = [], None
if gpu:
    streams = ([cp.cuda.Stream(non_blocking=True) for _ in range(2)] if variant == "streams"
               else [cp.cuda.get_current_stream()])
    if variant == "pinned":
        import numpy as np
        mirror = np.frombuffer(cp.cuda.alloc_pinned_memory(N0 * 4), np.float32, N0)
        mirror[:] = 1.0
    cp.cuda.runtime.deviceSynchronize()
threads = {}
worker = [None]  # the CPU probe's step left at its launch: a thread still at work
def settle():
    if gpu:
        cp.cuda.runtime.deviceSynchronize()
    elif worker[0] is not None:
        worker[0].join()
        worker[0] = None
def span(b):
    return (float(b.min()), float(b.max())) if gpu else (min(b), max(b))
def ptr(b):
    return int(b.data.ptr) if gpu else id(b)
def thread_call(n):
    # A CUDA call from a second thread: blocks while the process is LOCKED (documented), returns after unlock.
    t0 = time.time()
    x = cp.ones(1024, dtype=cp.float32); x += 1; v = float(x.sum())
    threads[n] = {"value": v, "waited_s": round(time.time() - t0, 3)}
def gpu_step(k, launch):
    # The op's GPU work: a spin first when it is left at its launch, every buffer's add behind it.
    if launch:
        spin((1,), (1,), (cp.uint64(SPIN_NS),), stream=streams[0])
    if len(streams) > 1:
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(streams[0])
        streams[1].wait_event(ev)
    for i, b in enumerate(bufs):
        with streams[i % len(streams)]:
            b += k
    if mirror is not None:
        cp.cuda.runtime.memcpyAsync(mirror.ctypes.data, bufs[0].data.ptr, mirror.nbytes, 2, streams[0].ptr)
    if not launch:
        cp.cuda.runtime.deviceSynchronize()
def cpu_step(k, launch):
    def work():
        if launch:
            time.sleep(SPIN_NS / 1e9)
        for i, b in enumerate(bufs):
            bufs[i][:] = [x + k for x in b]
    if launch:
        worker[0] = threading.Thread(target=work, daemon=True)
        worker[0].start()
    else:
        work()
def handle(c):
    op = c["op"]
    if op == "digest":
        settle()
        out = {"spans": [span(b) for b in bufs], "ptrs": [ptr(b) for b in bufs], "threads": threads, "pid": os.getpid()}
        if mirror is not None:
            out["mirror"] = (float(mirror.min()), float(mirror.max()))
        return out
    if op == "step":
        if not gpu:
            settle()  # a CPU step waits for the one still at work; the GPU's are ordered by their streams
        (gpu_step if gpu else cpu_step)(c["k"], c.get("phase") == "launch")
        return {}
    if op == "alloc":
        settle()
        bufs.append(new(N1, c["value"]))
        settle()
        return {}
    if op == "free":
        settle()
        if len(bufs) > 1:
            bufs.pop()
            if gpu:
                cp.get_default_memory_pool().free_all_blocks()
        return {}
    if op == "thread":
        threading.Thread(target=thread_call, args=(c["n"],), daemon=True).start()
        return {}
    if op == "fork":
        pid = os.fork()
        if pid == 0:
            if c.get("exec"):
                os.execv("/bin/true", ["/bin/true"])
            os._exit(0)
        return {"status": os.waitpid(pid, 0)[1]}
    return {"error": "unknown op " + op}
open(os.path.join(d, "ready"), "w").write(str(os.getpid()))
seq = 1
while True:
    p = os.path.join(d, "cmd.%d" % seq)
    if not os.path.exists(p):
        time.sleep(0.002)
        continue
    try:
        c = json.load(open(p))
        out = handle(c)
    except Exception as e:
        out = {"error": repr(e)}
    tmp = os.path.join(d, "ack.%d.tmp" % seq)
    json.dump(out, open(tmp, "w"))
    os.rename(tmp, os.path.join(d, "ack.%d" % seq))
    seq += 1
'''

# The probe's variants, per kind (its own text says what each holds).
PROBES = {"gpu": ("buffers", "streams", "pinned"), "cpu": ("buffers",)}

# A second process that takes the GPU's free memory but FILL_LEFT_MIB (less than the probe needs back).
FILLER = r'''
import sys, time, cupy as cp
left = int(sys.argv[1]) << 20
free, _ = cp.cuda.runtime.memGetInfo()
held = cp.cuda.runtime.malloc(max(free - left, 0))
print("filled", free - left, flush=True)
time.sleep(3600)
'''
FILL_LEFT_MIB = 32

# The driver's checkpoint API in a process of its own, so that a call that never returns is bounded.
AGENT = r'''
import json, sys
from cuda.bindings import driver as drv
(err,) = drv.cuInit(0)
for line in sys.stdin:
    c = json.loads(line)
    pid, op = c["pid"], c["op"]
    if op == "state":
        r = drv.cuCheckpointProcessGetState(pid)
        out = r[1].name.removeprefix("CU_PROCESS_STATE_").lower() if int(r[0]) == 0 else r[0].name
    else:
        if op == "lock":
            args = drv.CUcheckpointLockArgs(); args.timeoutMs = c["timeout_ms"]
            r = drv.cuCheckpointProcessLock(pid, args)
        elif op == "checkpoint":
            r = drv.cuCheckpointProcessCheckpoint(pid, None)
        elif op == "restore":
            r = drv.cuCheckpointProcessRestore(pid, None)
        elif op == "restore_other":
            # Onto device 1 (the probe ran on device 0): the driver's GPU UUID pair, old to new.
            uuids = [drv.cuDeviceGetUuid(drv.cuDeviceGet(i)[1])[1] for i in range(drv.cuDeviceGetCount()[1])]
            pair = drv.CUcheckpointGpuPair(); pair.oldUuid = uuids[0]; pair.newUuid = uuids[1]
            args = drv.CUcheckpointRestoreArgs(); args.gpuPairs = [pair]; args.gpuPairsCount = 1
            r = drv.cuCheckpointProcessRestore(pid, args)
        else:
            r = drv.cuCheckpointProcessUnlock(pid, None)
        e = r[0] if isinstance(r, tuple) else r
        out = "ok" if int(e) == 0 else e.name
    print(json.dumps(out), flush=True)
'''

BOUND_S = 60.0  # no single step may take longer: past it the step is a hang


class Hang(Exception):
    """A call that did not return within its bound."""


class Utility:
    """NVIDIA's ``cuda-checkpoint``, one invocation per call."""

    name = "cuda-checkpoint"

    def __init__(self, bound_s: float = BOUND_S) -> None:
        exe = shutil.which("cuda-checkpoint")
        if exe is None:
            raise RuntimeError("cuda-checkpoint is not on PATH")
        self.exe: str = exe
        self.bound_s = bound_s

    def call(self, pid: int, op: str, timeout_ms: int = 0) -> str:
        """Return "ok", or the utility's own words when it refuses; raises Hang past the bound."""
        args = ["--get-state"] if op == "state" else ["--action", op]
        if op == "lock" and timeout_ms:
            args += ["--timeout", str(timeout_ms)]
        try:
            p = subprocess.run([self.exe, *args, "--pid", str(pid)], capture_output=True, text=True,
                               timeout=self.bound_s)
        except subprocess.TimeoutExpired as exc:
            raise Hang(f"cuda-checkpoint {' '.join(args)} past {self.bound_s:.0f} s") from exc
        out = " ".join((p.stdout + p.stderr).split())
        if op == "state":
            return out.lower() if p.returncode == 0 else out
        return "ok" if p.returncode == 0 else (out or f"exit {p.returncode}")

    def close(self) -> None:
        pass


class Driver:
    """The CUDA driver's checkpoint API (``cuCheckpointProcess*``) through cuda-bindings, in an agent process."""

    name = "cuda"

    def __init__(self, bound_s: float = BOUND_S) -> None:
        self.bound_s = bound_s
        self.proc: subprocess.Popen[str] | None = None

    def _agent(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", AGENT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, start_new_session=True)
        return self.proc

    def call(self, pid: int, op: str, timeout_ms: int = 0) -> str:
        """Return "ok", or the CUresult's name when the driver refuses; raises Hang past the bound."""
        import selectors

        agent = self._agent()
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write(json.dumps({"pid": pid, "op": op, "timeout_ms": timeout_ms}) + "\n")
        agent.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(agent.stdout, selectors.EVENT_READ)
        ready = sel.select(self.bound_s)
        sel.close()
        line = agent.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise Hang(f"cuCheckpointProcess {op} past {self.bound_s:.0f} s")
        return str(json.loads(line))

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def criu_argv() -> list[str]:
    """CRIU's command prefix: ``$HUNT_CRIU`` (a JSON list) or ``criu`` on PATH."""
    return json.loads(os.environ["HUNT_CRIU"]) if os.environ.get("HUNT_CRIU") else ["criu"]


def release_network_lock(images: Path | str) -> str | None:
    """Delete the nftables table that CRIU's network lock left for the dump in ``images``; returns its name, or
    None when there was none (a ``--leave-running`` dump unlocks itself, a restore unlocks its image's) or no
    ``nft`` to delete it with.

    A dump that stops its tree (no ``--leave-running``) locks the network with a table ``inet CRIU-<run id>``
    (the dump's run id, in its ``inventory.img``, cut to 21 characters) and leaves it for the restore to remove.
    An image never restored leaves the table for good: a filter chain on the host's input and output hooks
    that every packet passes, and that every later dump's lock reads (0.07 s a dump with none, 0.66 s with 226).
    """
    try:
        inventory = (Path(images) / "inventory.img").read_bytes()
    except OSError:
        return None
    return release_lock_of(inventory)


def release_lock_of(inventory: bytes) -> str | None:
    """Run :func:`release_network_lock` of the dump whose ``inventory.img`` holds ``inventory``."""
    found = re.search(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", inventory)
    nft = shutil.which("nft")
    if found is None or nft is None:
        return None
    table = "CRIU-" + found.group().decode()[:21]
    try:
        # A group of its own: a Ctrl-C of the caller's group does not cut the deletion short.
        gone = subprocess.run([nft, "delete", "table", "inet", table], capture_output=True, timeout=30,
                              process_group=0).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return table if gone else None


def become_subreaper() -> None:
    """Adopt orphaned descendants (``PR_SET_CHILD_SUBREAPER``), so restored probes can be collected."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie or a missing process does not)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def reap(pid: int, timeout: float = 10.0) -> None:
    """Collect ``pid`` when it is ours (or was re-parented to us); wait until it is gone either way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:
            if not alive(pid):
                return
        time.sleep(0.01)
