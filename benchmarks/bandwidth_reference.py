"""The host's own numbers for a cut's bytes: memcpy, tmpfs and disk write and read, D2H and H2D.

A cut moves bytes: CRIU writes the image (to tmpfs: ``pipeline.images_dir``
is ``/dev/shm`` by default) and a restore reads it back; the CUDA checkpoint
copies device memory to the host and the restore copies it back. This
measures what the same number of bytes costs on this machine without any
checkpoint tool, so a cut's cost can be read as a multiple of what its bytes
need (``benchmarks/cuts_per_hour.py --bandwidth FILE``):

* ``memcpy``: ``numpy.copyto`` between two buffers whose pages are already
  there; ``memcpy_fresh``: into a newly allocated buffer, whose pages the
  copy faults in (as a restore's fresh mappings are);
* ``tmpfs_write`` / ``tmpfs_read``: a file in ``--tmpfs`` (default
  ``/dev/shm``), written in 64 MiB ``write`` calls and read back with
  ``readinto``, no fsync (tmpfs has nothing to sync);
* ``disk_write`` / ``disk_read``: the same in ``--disk-dir`` (default
  ``results/``, where runs are written), the write timed up to its
  ``fsync``, and the file's cached pages dropped (``posix_fadvise
  DONTNEED``) before the read, so it comes from the device;
* where CuPy and a GPU are present, ``d2h_pageable`` / ``h2d_pageable``
  (device to and from an ordinary NumPy buffer) and ``d2h_pinned`` /
  ``h2d_pinned`` (page-locked host memory), each synchronised.

``--processes N`` (N > 1) adds the same copies made by N processes at once,
each on buffers and a file of its own (``memcpy_fresh``, ``tmpfs_write``,
``tmpfs_read`` and, with a GPU, ``d2h_pageable`` and ``h2d_pageable``, a
CUDA context each): the host's aggregate bandwidth, which N trials side by
side share. Their GB/s is every process's bytes over the span from the
first start to the last end; ``cuts_per_hour.py --bandwidth`` turns it into
the cuts per hour those bytes allow on this host (``bytes-bound``).

Each measurement runs ``--repeat`` times (default 3); the medians of wall
seconds and of CPU-seconds (user + system of this process, ``getrusage``
around each run: a copy's page faults and the driver's staging included)
are reported, with GB/s (10^9 bytes per second) and CPU-seconds per GiB.
Prints a table; ``--out FILE`` writes it as JSON (``results`` by name, and
the host, sizes and directories it was measured on).

    python benchmarks/bandwidth_reference.py --size 1GiB --out results/bandwidth.json
    python benchmarks/bandwidth_reference.py --size 256MiB --repeat 5 --skip disk
    python benchmarks/bandwidth_reference.py --size 1GiB --processes 16 --skip disk --out bandwidth.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cutbench.errors import EXIT_BAD_ARGUMENTS, CutbenchError, InvalidArgument  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
CHUNK = 64 << 20  # bytes per write/read call (Linux moves at most 2 GiB - 4 KiB in one)
UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
         "g": 10**9, "gb": 10**9, "gib": 1 << 30}
GROUPS = ("memcpy", "tmpfs", "disk", "gpu")
WHAT = {
    "memcpy": "numpy copy, destination pages present",
    "memcpy_fresh": "numpy copy into a new buffer (its pages faulted in)",
    "tmpfs_write": "write(2) to a tmpfs file, no fsync",
    "tmpfs_read": "read(2) of that file",
    "disk_write": "write(2) to a disk file, then fsync",
    "disk_read": "read(2) of that file, its cached pages dropped first",
    "d2h_pageable": "device to pageable host memory",
    "h2d_pageable": "pageable host memory to device",
    "d2h_pinned": "device to pinned host memory",
    "h2d_pinned": "pinned host memory to device",
}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional unit (``B``, ``k``/``kB``, ``KiB``, ``M``/``MB``, ``MiB``,
    ``G``/``GB``, ``GiB``; k, M, G are decimal); :class:`InvalidArgument` for anything else or less than 1 MiB."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise InvalidArgument(f"--size {text!r}: expected bytes with an optional unit, e.g. 1GiB, 256MiB, 1e9 as 1GB")
    n = int(float(m.group(1)) * UNITS[m.group(2).lower()])
    if n < 1 << 20:
        raise InvalidArgument(f"--size {text!r}: expected at least 1 MiB (smaller copies time the calls, not the bytes)")
    return n


def fs_type(path: str | Path) -> str:
    """The file system type of the mount holding ``path`` (``tmpfs``, ``ext4``, …; "" when it cannot be told), as
    util-linux's ``findmnt`` names it (the last line: the mount on top, where several are stacked)."""
    try:
        out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else ""


def measure(fn: Callable[[], Any], repeat: int, *, before: Callable[[], Any] | None = None,
            after: Callable[[], Any] | None = None) -> dict[str, float]:
    """Run ``fn`` ``repeat`` times (``before`` and ``after`` around each, untimed); the medians of its ``wall_s``,
    ``user_s``, ``sys_s`` and ``cpu_s`` (this process's, every thread's: the driver's included)."""
    walls, users, systems = [], [], []
    for _ in range(repeat):
        if before is not None:
            before()
        # getrusage rather than os.times: the same user and system seconds, to the microsecond instead of the
        # clock tick (10 ms is a third of a 256 MiB memcpy).
        t0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        fn()
        w1, t1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if after is not None:
            after()
        walls.append(w1 - w0)
        users.append(t1.ru_utime - t0.ru_utime)
        systems.append(t1.ru_stime - t0.ru_stime)
    user, system = statistics.median(users), statistics.median(systems)
    return {"wall_s": statistics.median(walls), "user_s": user, "sys_s": system, "cpu_s": user + system}


def rates(size: int, timing: dict[str, float]) -> dict[str, float]:
    """``timing`` (:func:`measure`) with ``bytes``, ``gb_s`` (10^9 bytes per second) and ``cpu_s_per_gib``."""
    wall = timing["wall_s"]
    return {"bytes": size, **timing, "gb_s": size / wall / 1e9 if wall > 0 else float("nan"),
            "cpu_s_per_gib": timing["cpu_s"] * GIB / size}


def _write_file(path: Path, data: np.ndarray, *, sync: bool) -> None:
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for off in range(0, len(view), CHUNK):
            chunk = view[off:off + CHUNK]
            while chunk:
                chunk = chunk[os.write(fd, chunk):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read_file(path: Path, into: np.ndarray) -> None:
    view = memoryview(into).cast("B")
    with open(path, "rb", buffering=0) as fh:
        off = 0
        while off < len(view):
            got = fh.readinto(view[off:off + CHUNK])
            if not got:
                raise OSError(f"{path}: ended after {off} of {len(view)} bytes")
            off += got


def _drop_cached(path: Path) -> None:
    """Drop ``path``'s clean cached pages, so the next read comes from the device (no effect on other files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def host_measurements(size: int, repeat: int, groups: set[str], tmpfs: Path, disk: Path) -> dict[str, dict[str, float]]:
    """The memcpy, tmpfs and disk measurements of ``groups`` at ``size`` bytes (:func:`rates` each)."""
    out: dict[str, dict[str, float]] = {}
    src = np.empty(size, np.uint8)
    src.fill(0xA5)  # every page present and not the zero page
    dst = np.empty(size, np.uint8)
    dst.fill(0)
    if "memcpy" in groups:
        out["memcpy"] = rates(size, measure(lambda: np.copyto(dst, src), repeat))
        box: dict[str, np.ndarray] = {}
        out["memcpy_fresh"] = rates(size, measure(lambda: box.__setitem__("a", src.copy()), repeat,
                                                  after=lambda: box.clear()))
    for group, where, sync in (("tmpfs", tmpfs, False), ("disk", disk, True)):
        if group not in groups:
            continue
        path = Path(where) / f"cutbench-bandwidth-{os.getpid()}.tmp"
        try:
            out[f"{group}_write"] = rates(size, measure(lambda: _write_file(path, src, sync=sync), repeat,
                                                        after=lambda: path.unlink(missing_ok=True)))
            _write_file(path, src, sync=sync)
            out[f"{group}_read"] = rates(size, measure(lambda: _read_file(path, dst), repeat,
                                                       before=(lambda: _drop_cached(path)) if sync else None))
        finally:
            path.unlink(missing_ok=True)
    return out


def gpu_measurements(size: int, repeat: int) -> tuple[dict[str, dict[str, float]], str]:
    """D2H and H2D of ``size`` bytes, pageable and pinned, through CuPy; ({}, why not) without CuPy or a GPU."""
    try:
        import cupy as cp  # type: ignore[import-not-found]

        if cp.cuda.runtime.getDeviceCount() < 1:
            return {}, "no CUDA device"
    except Exception as exc:  # no CuPy, no driver: a CPU host
        return {}, f"no GPU measurement: {type(exc).__name__}: {exc}"
    device = cp.empty(size, cp.uint8)
    device.fill(0xA5)
    pageable = np.empty(size, np.uint8)
    pageable.fill(0)
    pinned_mem = cp.cuda.alloc_pinned_memory(size)
    pinned = np.frombuffer(pinned_mem, np.uint8, size)
    pinned.fill(0)
    sync = cp.cuda.Device().synchronize
    sync()
    out = {}
    for kind, host in (("pageable", pageable), ("pinned", pinned)):
        out[f"d2h_{kind}"] = rates(size, measure(lambda h=host: (device.get(out=h), sync()), repeat))
        out[f"h2d_{kind}"] = rates(size, measure(lambda h=host: (device.set(h), sync()), repeat))
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return out, name.decode() if isinstance(name, bytes) else str(name)


def _copy_worker(kind: str, size: int, repeat: int, tmpfs: str, index: int, barrier: Any, queue: Any) -> None:
    """One of :func:`parallel_measurements`' processes: ``repeat`` times, wait at ``barrier`` for the others, do the
    copy ``kind`` once on buffers (and a file) of its own, and put ``(repeat index, start, end, CPU-seconds)`` on
    ``queue``; ``("error", text)`` when it cannot (no CuPy or device for a GPU copy, a full tmpfs)."""
    try:
        box: dict[str, Any] = {}
        src = np.full(size, 0xA5, np.uint8)
        dst = np.empty(size, np.uint8)
        dst.fill(0)  # its pages present, as in host_measurements: only memcpy_fresh copies into new pages
        path = Path(tmpfs) / f"cutbench-bandwidth-{os.getpid()}-{index}.tmp"
        if kind.startswith(("d2h", "h2d")):
            import cupy as cp  # type: ignore[import-not-found]

            device = cp.full(size, 0xA5, cp.uint8)
            stream = cp.cuda.Stream(non_blocking=True)
            cp.cuda.Device().synchronize()
        ops: dict[str, Callable[[], Any]] = {
            "memcpy_fresh": lambda: box.__setitem__("a", src.copy()),
            "tmpfs_write": lambda: _write_file(path, src, sync=False),
            "tmpfs_read": lambda: _read_file(path, dst),
            "d2h_pageable": lambda: (device.get(out=dst, stream=stream), stream.synchronize()),
            "h2d_pageable": lambda: (device.set(src, stream=stream), stream.synchronize()),
        }
        if kind == "tmpfs_read":
            _write_file(path, src, sync=False)
        try:
            for r in range(repeat):
                barrier.wait(timeout=600)
                t0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                ops[kind]()
                w1, t1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                queue.put((r, w0, w1, t1.ru_utime - t0.ru_utime + t1.ru_stime - t0.ru_stime))
                box.clear()
                if kind == "tmpfs_write":
                    path.unlink(missing_ok=True)
        finally:
            path.unlink(missing_ok=True)
    except BaseException as exc:  # the parent reports it; a worker that dies silently would stall the others
        barrier.abort()
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def parallel_measurements(size: int, processes: int, repeat: int, groups: set[str], tmpfs: Path) -> dict[str, dict[str, float]]:
    """The copies a cut's bytes go through, run by ``processes`` processes at once with ``size`` bytes each (trials
    side by side are processes: threads of one would share its page tables' lock and its one CUDA context): the
    host's aggregate rates, :func:`rates` of every process's bytes over the span from the first start to the last
    end (medians over ``repeat``), with ``processes`` added. Copies whose group is not in ``groups`` are left out,
    and so are the GPU ones where a process cannot make them (no CuPy, no device). Forked before this process
    touches CUDA (:func:`main` calls it before :func:`gpu_measurements`), so each child makes its own context."""
    import multiprocessing

    kinds = [k for k, group in (("memcpy_fresh", "memcpy"), ("tmpfs_write", "tmpfs"), ("tmpfs_read", "tmpfs"),
                                ("d2h_pageable", "gpu"), ("h2d_pageable", "gpu")) if group in groups]
    ctx = multiprocessing.get_context("fork")
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        barrier, queue = ctx.Barrier(processes), ctx.Queue()
        workers = [ctx.Process(target=_copy_worker, args=(kind, size, repeat, str(tmpfs), i, barrier, queue))
                   for i in range(processes)]
        for w in workers:
            w.start()
        got, error = [], None
        while len(got) < processes * repeat and error is None:
            item = queue.get(timeout=900)
            if item[0] == "error":
                error = item[1]
            else:
                got.append(item)
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.kill()
        if error is not None:
            # The process that failed aborts the barrier, so the others fail too: name the first cause, not theirs.
            errors = [error]
            while not queue.empty():
                item = queue.get()
                if item[0] == "error":
                    errors.append(item[1])
            error = next((e for e in errors if not e.startswith("BrokenBarrierError")), error)
            if kind.startswith(("d2h", "h2d")):
                continue  # a CPU host: no GPU figures, as gpu_measurements gives none
            raise OSError(f"{kind} with {processes} processes: {error}")
        walls, cpus = [], []
        for r in range(repeat):
            mine = [g for g in got if g[0] == r]
            walls.append(max(g[2] for g in mine) - min(g[1] for g in mine))
            cpus.append(sum(g[3] for g in mine))
        timing = {"wall_s": statistics.median(walls), "user_s": float("nan"), "sys_s": float("nan"),
                  "cpu_s": statistics.median(cpus)}
        out[kind] = {**rates(size * processes, timing), "processes": processes}
    return out


def render(results: dict[str, dict[str, float]], size: int) -> str:
    """The results as a Markdown table: measurement, what it is, GB/s, wall s, CPU s, CPU s per GiB, user and system."""
    import pandas as pd

    rows = [{"measurement": name, "what": WHAT.get(name, ""), "GB/s": r["gb_s"], "wall s": r["wall_s"],
             "CPU s": r["cpu_s"], "CPU s/GiB": r["cpu_s_per_gib"], "user s": r["user_s"], "sys s": r["sys_s"]}
            for name, r in results.items()]
    head = f"{size:,} bytes ({size / GIB:.3g} GiB) each, medians of the repeats"
    return head + "\n\n" + pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (:class:`InvalidArgument` for a bad size, repeat count, group or directory)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="bytes per measurement (default 1GiB; 256MiB, 2GB, ...)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; medians are reported")
    ap.add_argument("--tmpfs", default="/dev/shm", help="the tmpfs directory (default /dev/shm, the images' default)")
    ap.add_argument("--disk-dir", default=str(REPO / "results"), help="a directory on the disk runs are written to")
    ap.add_argument("--skip", nargs="*", default=[], choices=GROUPS, help="measurement groups to leave out")
    ap.add_argument("--processes", type=int, default=1,
                    help="also measure the copies made by this many processes at once, --size bytes each (default 1: not)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    args.size_bytes = parse_size(args.size)
    if args.repeat < 1:
        raise InvalidArgument(f"--repeat {args.repeat}: expected at least 1")
    if not 1 <= args.processes <= 256:
        raise InvalidArgument(f"--processes {args.processes}: expected 1 to 256")
    for name in ("tmpfs", "disk_dir"):
        if not Path(getattr(args, name)).is_dir() and name.split("_")[0] not in args.skip:
            raise InvalidArgument(f"--{name.replace('_', '-')} {getattr(args, name)}: not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except CutbenchError as exc:
        print(f"bandwidth_reference: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    groups = set(GROUPS) - set(args.skip)
    size = args.size_bytes
    results = host_measurements(size, args.repeat, groups, Path(args.tmpfs), Path(args.disk_dir))
    # Before this process touches CUDA: the processes are forked, and each makes a context of its own.
    parallel = parallel_measurements(size, args.processes, args.repeat, groups - {"disk"}, Path(args.tmpfs)) \
        if args.processes > 1 else {}
    gpu_note = "skipped"
    if "gpu" in groups:
        gpu, gpu_note = gpu_measurements(size, args.repeat)
        results.update(gpu)
    data = {
        "size_bytes": size, "repeat": args.repeat, "host": platform.node(), "kernel": platform.release(),
        "cpus": os.cpu_count(), "gpu": gpu_note,
        "dirs": {"tmpfs": args.tmpfs, "tmpfs_fs": fs_type(args.tmpfs), "disk": args.disk_dir,
                 "disk_fs": fs_type(args.disk_dir)},
        "results": results,
        "parallel": {"processes": args.processes, "results": parallel},
        "command": " ".join(["python benchmarks/bandwidth_reference.py", "--size", args.size, "--repeat",
                             str(args.repeat), *(["--processes", str(args.processes)] if args.processes > 1 else []),
                             *(["--skip", *args.skip] if args.skip else [])]),
    }
    print(render(results, size))
    if parallel:
        print(f"\n{args.processes} processes at once, {size:,} bytes each (GB/s: all their bytes over the span from the "
              "first start to the last end; CPU s: all of theirs)\n")
        print(render(parallel, size * args.processes))
    print(f"\ntmpfs: {args.tmpfs} ({data['dirs']['tmpfs_fs'] or '?'}), disk: {args.disk_dir} "
          f"({data['dirs']['disk_fs'] or '?'}), GPU: {gpu_note}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
