"""What happens to a process that keeps making CUDA calls while it is LOCKED, then CHECKPOINTED.

A CuPy child loops ``a += 1`` (a kernel launch) and, in mode ``sync``, a
stream synchronisation after each launch, counting iterations in a shared
file mapping. The harness locks it, checkpoints it, restores and unlocks it,
watching after each step whether the child is alive and whether it makes
progress. This is the fact behind the split window: host code that reaches
a CUDA call inside the window meets a LOCKED (or CHECKPOINTED) process.

    python benchmarks/cuda_call_while_cut.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path


class Refused(Exception):
    """A checkpoint call the driver answered with an error."""


def driver_call(name: str, *args: object) -> None:
    """Call ``cuCheckpointProcess<name>`` through cuda-bindings (NVIDIA's own Python binding of the driver API);
    raise :class:`Refused` with the CUresult's name when it fails."""
    from cuda.bindings import driver as cu

    result = getattr(cu, f"cuCheckpointProcess{name}")(*args)
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise Refused(f"cuCheckpointProcess{name}: {getattr(err, 'name', int(err))}")


def lock_args(timeout_ms: int) -> object:
    """The lock's arguments: give up after ``timeout_ms`` (the process stays RUNNING)."""
    from cuda.bindings import driver as cu

    args = cu.CUcheckpointLockArgs()
    args.timeoutMs = timeout_ms
    return args

CHILD = textwrap.dedent("""
    import mmap, os, struct, sys, cupy as cp
    fd = os.open(sys.argv[1], os.O_RDWR); m = mmap.mmap(fd, 8); os.close(fd)
    a = cp.zeros(1 << 20, dtype=cp.float32)
    i = 0
    while True:
        a += 1
        if sys.argv[2] == "sync" or i % 1000 == 0:
            cp.cuda.get_current_stream().synchronize()
        i += 1
        struct.pack_into("<q", m, 0, i)
""")


def observe(mode: str) -> dict:
    """Lock, checkpoint, restore and unlock a child in ``mode``; return what was seen after each step."""
    path = Path(tempfile.mkdtemp()) / "count"
    path.write_bytes(bytes(8))
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, 8)
    os.close(fd)

    def count() -> int:
        return struct.unpack_from("<q", m, 0)[0]

    from cuda.bindings import driver as cu

    (err,) = cu.cuInit(0)
    if int(err) != 0:
        raise SystemExit(f"cuInit: {err.name}: the driver API cannot be used here")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), mode])
    seen: dict = {"mode": mode}
    try:
        deadline = time.monotonic() + 60
        while count() < 100 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

        def step(name: str, fn) -> bool:
            before = count()
            err = None
            try:
                fn()
            except Refused as exc:
                err = str(exc)
            time.sleep(0.5)
            seen[name] = {"error": err, "alive": child.poll() is None, "exit": child.poll(),
                          "progress": count() - before}
            return err is None and child.poll() is None

        ok = step("lock", lambda: driver_call("Lock", child.pid, lock_args(5000)))
        ok = ok and step("checkpoint", lambda: driver_call("Checkpoint", child.pid, None))
        ok = ok and step("restore", lambda: driver_call("Restore", child.pid, None))
        ok and step("unlock", lambda: driver_call("Unlock", child.pid, None))
    finally:
        child.kill()
        child.wait()
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    results = [observe("sync"), observe("launch")]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cuda_call_while_cut.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
