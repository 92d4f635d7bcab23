"""What the container backends (``docker``, ``podman``) share: the root
filesystem image, the mounts, the container handle, the CRIU options file.

The workload runs inside a container made from a tiny image (``docker
import`` / ``podman import`` of a tarball: no registry is needed) that holds
only the merged-/usr symlinks and empty mount points; the host's ``/usr``
(Python and its libraries), the Python environment and the project are
bind-mounted read-only at their own paths and the trial's directory
read-write, so the workload's command line and its configuration's paths mean
the same inside and out. The container shares the host's network, so the
workload reaches the receiver on the host's loopback exactly as it does
outside a container.

Both engines checkpoint through runc, which runs CRIU for them. The receiver
connection is an established TCP socket, which CRIU dumps only with
``tcp-established`` (and, after a ``leave_running`` crash, restores only with
``tcp-close``: see :mod:`~cutbench.harness.nemesis.backends.criu`). Neither
engine's checkpoint call carries those options, so they go into a CRIU
options file, which runc hands to CRIU on every checkpoint and restore and
whose settings win over runc's own: :func:`criu_options` writes it.
"""

from __future__ import annotations

import io
import re
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cutbench
from cutbench.errors import StageFailed, StageRefused, Unavailable
from cutbench.harness.provision.engines import HARNESS_LABEL, TRIAL_LABEL
from cutbench.harness.nemesis.backends.criu import NETWORK_LOCK
from cutbench.procs import Child, identity, is_zombie_or_gone, package_env

# The image every container backend runs the workload in (built on first use).
IMAGE = "cutbench-rootfs:1"
# The merged-/usr layout: with these as symlinks only /usr is bind-mounted. A
# bind mount of the host's /lib itself (a symlink on such hosts) makes every
# restore fail (CRIU: "mnt-v2: Failed to move_mount from /lib").
_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_DIRS = ("usr", "tmp", "proc", "dev", "sys", "etc", "run", "var")


def rootfs_tarball() -> bytes:
    """The image's root filesystem as an uncompressed tar: mount points and the merged-/usr symlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in _DIRS:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name, target in _LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def container_of(target: Child, stage: str) -> str:
    """The container ``target`` is; a refusal of ``stage`` when it is one process inside a container.

    A multi-process workload may name one of its processes for the cut (an
    uncoordinated cut of one rank); an engine checkpoints whole containers
    only, so it declines such a cut and the workload runs on.
    """
    container = getattr(target, "container", "")
    if not container:
        raise StageRefused(stage, f"the cut names one process of the workload (pid {target.pid} in the container's "
                                  "namespace); the engine checkpoints whole containers only")
    return container


def trial_labels(labels: dict[str, str] | None = None) -> dict[str, str]:
    """The labels of a trial container: ``cutbench=trial``, the harness's ``labels`` (its run and trial) and
    ``cutbench.harness``, the identity of the process that made it (pid and start time), by which
    :func:`cutbench.harness.environment.leftovers.sweep` knows a container a killed harness left."""
    return {TRIAL_LABEL: "trial", **(labels or {}), HARNESS_LABEL: identity()}


def container_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial container: the project importable (``PYTHONPATH``), no bytecode written into
    the read-only mounts, then ``extra`` (a program's own ``env``)."""
    return {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": package_env()["PYTHONPATH"], **(extra or {})}


def container_setup(cwd: str, image: str = "", env: dict[str, str] | None = None, *,
                    forbidden: tuple[Path, ...] = ()) -> tuple[str, dict[str, str], dict[str, str]]:
    """What a trial container is made of: ``(image, mounts, environment)``.

    By default cutbench's own image with the host's directories mounted (:func:`host_mounts`) and the
    project importable (:func:`container_env`). With ``image`` (a program's own, ``workload.params.image``)
    that image as it is: only the trial's directory ``cwd`` is mounted, read-write at its own path, and the
    environment is ``env`` over the image's own.
    """
    if image:
        return image, {str(Path(cwd).resolve()): "rw"}, dict(env or {})
    return IMAGE, host_mounts(Path(cwd), forbidden=forbidden), container_env(env)


def gone_after_restore(stage: str, code: int, said: str) -> StageFailed:
    """The failure of a restore after which the container is not running: its exit status and its last line
    (``said``: what its engine kept of its output), the words a restored process that died would have left."""
    last = f": {said.strip().splitlines()[-1]}" if said.strip() else ""
    return StageFailed(stage, f"the container is not running after the restore (exit {code}){last}")


def container_name(cwd: str) -> str:
    """A unique, valid container name from the trial directory (``…/cutbench-RUN-xxxx/TRIAL``)."""
    path = Path(cwd)
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"{path.parent.name}-{path.name}")[:120]


def host_mounts(workdir: Path, *, forbidden: tuple[Path, ...] = ()) -> dict[str, str]:
    """Host paths to bind-mount at the same path, each mapped to ``"ro"`` or ``"rw"``.

    ``/usr`` (the interpreter and its libraries) and ``/etc/alternatives``
    (where some of /usr's links point), the Python environment, the
    project's source tree and every other directory on ``sys.path`` are
    read-only; ``workdir`` (the trial's directory: control file, report,
    marker, log) is read-write. A path inside another is dropped. ``forbidden``
    names the engine's own state directories: a mount that holds one of them
    makes CRIU's dump fail ("unreachable sharing"), so such a mount raises.
    """
    wanted = [Path("/usr"), Path(sys.prefix), Path(sys.base_prefix)]
    # Debian's alternatives: some of /usr's commands and libraries are links through /etc/alternatives (GROMACS's
    # gmx finds its BLAS there), which the image's empty /etc would leave dangling.
    wanted += [Path("/etc/alternatives")]
    repo = cutbench.source_checkout()
    if repo is not None:
        wanted.append(repo)
    wanted += [Path(p) for p in sys.path if p]
    ro: list[Path] = []
    for path in wanted:
        path = path.resolve()
        if not path.is_dir() or path == Path("/"):
            continue
        ro.append(path)
    mounts = {str(p): "ro" for p in _outermost(ro)}
    mounts[str(workdir.resolve())] = "rw"
    for mount in mounts:
        for state in forbidden:
            if _inside(Path(state).resolve(), [Path(mount)]):
                raise Unavailable(f"the container would mount {mount}, which holds the engine's state directory {state}; "
                                  "fix: keep the engine's data root outside the project and the trial directory")
    return mounts


def _inside(path: Path, parents: list[Path]) -> bool:
    """True when ``path`` is one of ``parents`` or lies below one."""
    return any(path == p or p in path.parents for p in parents)


def _outermost(paths: list[Path]) -> list[Path]:
    """``paths`` without duplicates and without those inside another."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not _inside(path, kept):
            kept.append(path)
    return kept


def criu_options(path: Path, *, log: Path, restore_after: str | None = None, skip_in_flight: bool = False,
                 extra: tuple[str, ...] = ()) -> None:
    """Write the CRIU options file at ``path`` for the next checkpoint (``restore_after=None``) or restore.

    CRIU writes its log to ``log`` (the engine's own copy is deleted with a
    failed checkpoint's work directory, and its error message only says
    "criu failed: type NOTIFY").

    A restore after a ``kill`` brings the receiver connection back
    established; after a ``leave_running`` crash the kernel closed the
    original, so the restored socket is closed and the workload's client
    reconnects (its real recovery path).

    ``skip_in_flight`` (a program's checkpoint, as the ``criu`` backend
    dumps one): a client connection still waiting in a listening socket's
    queue is left out of the image, where CRIU would otherwise refuse the
    whole dump of a server that is accepting ("In-flight connection").

    ``extra``: the scenario's CRIU options (``pipeline.criu_options``, ``--name`` or ``--name=value``), written as
    the file spells them (``name value``).
    """
    tcp = "tcp-close" if restore_after == "leave_running" else "tcp-established"
    path.parent.mkdir(parents=True, exist_ok=True)
    skip = "skip-in-flight\n" if skip_in_flight else ""
    own = "".join(option.removeprefix("--").replace("=", " ", 1) + "\n" for option in extra)
    path.write_text(f"# {OPTIONS_HEADER}\n{tcp}\n{skip}network-lock {NETWORK_LOCK}\nlog-file {log}\n{own}")


OPTIONS_HEADER = "CRIU options for a container checkpoint, written by cutbench for each stage"


class Engine(Protocol):
    """What a container handle asks of its engine."""

    def state(self, container: str) -> tuple[bool, int, int]:
        """Return ``(running, exit_code, pid)`` of ``container`` as the engine reports it."""
        ...

    def kill(self, container: str) -> None:
        """Stop ``container`` at once (SIGKILL); a stopped or absent container is no error."""
        ...

    def remove(self, container: str) -> None:
        """Remove ``container`` and what it holds; an absent container is no error."""
        ...


@dataclass
class ContainerChild(Child):
    """The workload's container, as the harness waits for and kills a process.

    ``pid`` is the container's first process on the host; it is not the
    harness's child (the engine's shim reaps it), so its end is seen on the
    host and its exit status asked of the engine. Killing it kills the
    container; :meth:`kill_groups` (the end of a trial) also removes it.
    """

    container: str = ""
    engine: Any = field(default=None, repr=False)

    def poll(self) -> int | None:
        """The container's exit status once it has stopped, else None."""
        if self.returncode is not None:
            return self.returncode
        if not is_zombie_or_gone(self.pid):
            return None
        running, code, _pid = self.engine.state(self.container)
        if running:
            return None  # the engine has not noticed yet, or a restore is under way
        self.returncode = code
        return code

    def track(self) -> None:
        """Nothing to remember: the container holds the whole tree, and killing it kills every process in it."""

    def kill(self, timeout: float = 5.0) -> int | None:
        """Stop the container (SIGKILL to every process in it); return its exit status."""
        if self.returncode is None:
            self.engine.kill(self.container)
        return self.wait(timeout)

    def output_tail(self) -> str:
        """What the container's processes wrote to stdout and stderr, last lines (the engine keeps it: a
        workload that dies before it can write its log, an import that fails, says why here)."""
        logs = getattr(self.engine, "logs", None)
        return logs(self.container) if callable(logs) else ""

    def kill_groups(self, timeout: float = 2.0) -> None:
        """Stop and remove the container: nothing of the trial stays behind."""
        self.engine.kill(self.container)
        self.engine.remove(self.container)
