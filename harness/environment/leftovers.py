"""What a run leaves on the machine while it runs, and the sweep for what a killed harness left behind.

A run that ends, by success, failure, Ctrl-C or SIGTERM, removes its own trial containers, image
directories, work directory and receiver. A harness killed outright (SIGKILL, a reboot, an OOM kill)
cannot. So each run first writes a *claim* (``$CUTBENCH_RUNS_DIR``, default ``/var/tmp/cutbench/runs``):
its run id, the identity of its harness process (pid and start time, :func:`cutbench.procs.identity`),
its receiver's, and where its images and work directory live; the claim is removed when the run ends.
:func:`sweep`, which every run calls before it starts, removes what claims of dead harnesses name,
and any trial container whose ``cutbench.harness`` label names a harness that is gone: nothing of a
live run is touched. It returns a line per thing it removed, which the run records and says.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from cutbench.files import atomic_write
from cutbench.harness.provision import engines
from cutbench.procs import identity, identity_alive, processes_in

RUNS_ENV = "CUTBENCH_RUNS_DIR"


def runs_dir() -> Path:
    """Where the claims of running runs are: ``$CUTBENCH_RUNS_DIR`` or ``/var/tmp/cutbench/runs``."""
    return Path(os.environ.get(RUNS_ENV, "/var/tmp/cutbench/runs"))


@contextlib.contextmanager
def claim(run_id: str, *, images_dirs: set[str] | list[str], workdir: Path, receiver_pid: int | None) -> Iterator[Path]:
    """Record, for the ``with`` block, that this process runs ``run_id`` with these images and work directory.

    Yields the claim's path; the claim is removed when the block ends, however it ends. A claim that
    cannot be written (a read-only /var/tmp) is skipped: the run goes on, only a SIGKILL's leftovers
    would then stay for someone to remove.
    """
    path = runs_dir() / f"{run_id}.json"
    body = {"run_id": run_id, "harness": identity(), "images_dirs": sorted(set(images_dirs)), "workdir": str(workdir),
            "receiver": _identity_or_empty(receiver_pid)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(body, indent=1, sort_keys=True))
    except OSError:
        path = Path()
    try:
        yield path
    finally:
        if path != Path():
            path.unlink(missing_ok=True)


def live_harness(run_id: str) -> str | None:
    """The identity (``pid:start``) of the live harness that claims run ``run_id``, or None when none does."""
    try:
        harness = str(json.loads((runs_dir() / f"{run_id}.json").read_text())["harness"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return harness if identity_alive(harness) else None


def _identity_or_empty(pid: int | None) -> str:
    try:
        return identity(pid) if pid else ""
    except ProcessLookupError:
        return ""


def sweep(release_lock: Callable[[Path], str | None] | None = None) -> list[str]:
    """Remove what runs whose harness is gone left behind; return one line per thing removed (none: ``[]``).

    For each claim of a dead harness: its trial containers (by run label), its image directories
    (``<images_dir>/cutbench-<run id>-*``), the processes working in its work directory (its workloads),
    that directory, and its receiver (when that very process still runs). Then every trial container whose harness label names a process that is gone, and every
    stopped container made before containers carried one. Never raises: what cannot be removed is said.

    ``release_lock(images)`` removes the network lock a dump in ``images`` left (CRIU's, for an image never
    restored: the nemesis's to know); it is asked of every dump in the image directories removed.
    """
    try:
        return _sweep(release_lock)
    except Exception as exc:  # a sweep never stops a run: what it could not do stays for the next one
        return [f"the sweep stopped early ({type(exc).__name__}: {exc}); the next run tries again"]


def _sweep(release_lock: Callable[[Path], str | None] | None) -> list[str]:
    removed: list[str] = []
    containers = engines.trial_containers()
    dead_runs: set[str] = set()
    for path in sorted(runs_dir().glob("*.json")) if runs_dir().is_dir() else []:
        try:
            data = json.loads(path.read_text())
            run_id, harness = str(data["run_id"]), str(data["harness"])
        except (OSError, ValueError, KeyError, TypeError):
            removed.append(_remove_file(path, "an unreadable run claim"))
            continue
        if identity_alive(harness):
            continue
        dead_runs.add(run_id)
        for images in data.get("images_dirs", []):
            for leftover in sorted(Path(images).glob(f"cutbench-{run_id}-*")):
                if release_lock is not None:
                    tables = (release_lock(inventory.parent) for inventory in sorted(leftover.rglob("inventory.img")))
                    removed += [f"CRIU network lock {table} of run {run_id}" for table in tables if table]
                removed.append(_remove_tree(leftover, f"image directory of run {run_id}"))
        workdir = Path(str(data.get("workdir") or ""))
        if workdir.name.startswith(f"cutbench-{run_id}") and workdir.is_dir():
            # Its workloads first (parked at a cut, or running on): each works in its trial's directory.
            for pid in processes_in(workdir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError) as exc:
                    removed.append(f"workload process {pid} of run {run_id} could not be killed ({exc.strerror})")
                    continue
                removed.append(f"workload process {pid} of run {run_id}")
            removed.append(_remove_tree(workdir, f"work directory of run {run_id}"))
        receiver = str(data.get("receiver") or "")
        if receiver and identity_alive(receiver):
            pid = int(receiver.split(":")[0])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            removed.append(f"receiver of run {run_id} (pid {pid})")
        removed.append(_remove_file(path, f"claim of run {run_id} (harness {harness} is gone)"))
    for c in containers:
        orphan = c.run in dead_runs or (c.harness and not identity_alive(c.harness)) or (not c.harness and not c.running)
        if orphan:
            engines.remove_container(c)
            removed.append(f"{c.engine} container {c.name} of run {c.run or '(unlabelled)'}")
    return removed


def _remove_tree(path: Path, what: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return f"{what}: {path}" + (" (could not be removed)" if path.exists() else "")


def _remove_file(path: Path, what: str) -> str:
    with contextlib.suppress(OSError):
        path.unlink()
    return f"{what}: {path}"


def status_lines() -> list[str]:
    """One line per trial container either engine still holds, with its run and whether its harness lives."""
    out = []
    for c in engines.trial_containers():
        owner = ("harness running" if identity_alive(c.harness) else "harness gone") if c.harness else "unlabelled"
        out.append(f"{c.engine} container {c.name}: run {c.run or '?'}, {owner}, {'running' if c.running else 'stopped'}")
    return out
