"""``podman``: the workload in a Podman container, checkpointed with ``podman container checkpoint``.

Each cut takes the migration path: ``podman container checkpoint
--tcp-established --export ARCHIVE`` (``--leave-running`` unless the fault is
``kill``) writes the whole checkpoint into the cut's images directory; the
restore removes the crashed container and brings it back with ``podman
container restore --import ARCHIVE``, as on another host. Podman's own
statistics (``--print-stats``: its total, the runtime's share, CRIU's
freezing and frozen times, its restore time) become facts of the trial beside
the stage times the harness measures.

Podman 4.3 has no ``--tcp-close`` for a restore, which a ``leave_running``
crash needs (the kernel closed the original connection): the container
carries the ``org.criu.config`` annotation naming a CRIU options file in its
trial directory, which runc hands to CRIU and which the backend rewrites
before each stage (see :mod:`~cutbench.harness.nemesis.backends.containers`).
Podman runs with ``--runtime runc`` (crun reports no checkpoint support on
these hosts) and the harness's own resource limits (a container asking for
more than the host allows is refused).
"""

from __future__ import annotations

import json
import resource
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from cutbench.errors import StageFailed, StageRefused, Unavailable
from cutbench.harness.provision import engines
from cutbench.harness.nemesis.backends.containers import (IMAGE, ContainerChild, container_name, container_of,
                                                          container_setup, criu_options, gone_after_restore,
                                                          rootfs_tarball, trial_labels)
from cutbench.harness.nemesis.backends.criu import criu_error_tail, dump_failure, restore_failure
from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.harness.nemesis.probe_kit import release_lock_of
from cutbench.interrupts import shielded
from cutbench.procs import Child

# Podman's statistics (microseconds) kept as facts, in seconds, under these names.
_CHECKPOINT_STATS = {"podman_checkpoint_duration": "podman_checkpoint_total_s",
                     "runtime_checkpoint_duration": "podman_runtime_checkpoint_s",
                     "freezing_time": "podman_criu_freezing_s", "frozen_time": "podman_criu_frozen_s",
                     "memdump_time": "podman_criu_memdump_s", "memwrite_time": "podman_criu_memwrite_s"}
_RESTORE_STATS = {"podman_restore_duration": "podman_restore_total_s",
                  "runtime_restore_duration": "podman_runtime_restore_s", "restore_time": "podman_criu_restore_s"}
NPROC = 4096  # processes a workload's container may have (a multi-rank workload needs a few)
OPTIONS_FILE = "criu-options.conf"  # in the trial directory, named by the container's annotation


class PodmanCheckpointer:
    """The ``podman`` backend (see module docstring)."""

    name = "podman"
    capabilities = Capabilities(stages=("podman_checkpoint", "podman_restore"), covers=frozenset({"cpu", "ipc"}),
                                tools=frozenset({"criu"}))

    def __init__(self) -> None:
        self._cuts: dict[Path, tuple[str, Path, Path]] = {}  # images_dir -> (container, archive, options file)
        self._options: dict[str, Path] = {}  # container -> its CRIU options file
        self._image_ready = False

    def unavailable_reason(self) -> str | None:
        """Why Podman checkpoints cannot run here (with the fix), or None."""
        reason = engines.podman_unavailable_reason()
        if reason:
            return reason
        try:
            engines.criu_path_env()
        except Unavailable as exc:
            return str(exc)
        return None

    def podman(self, *args: str, timeout: float = 60, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        """Run ``podman ARGS`` with the project's CRIU first on PATH; a timeout returns exit -9.

        Podman runs in a process group of its own and ends its call before a Ctrl-C goes on (within ``timeout``):
        killed half-way through a checkpoint, it would leave runc's CRIU holding the network lock."""
        argv = ["podman", *args]
        try:
            with shielded():
                return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=engines.criu_path_env(),
                                      process_group=0)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(argv, -9, exc.stdout or b"", f"timed out after {timeout}s".encode())

    # -- Engine, for the container handle --------------------------------------
    def state(self, container: str) -> tuple[bool, int, int]:
        """Return ``(running, exit_code, pid)`` from ``podman inspect`` (an absent container: stopped, exit -1)."""
        p = self.podman("container", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}} {{.State.Pid}}",
                        container, timeout=30)
        try:
            running, code, pid = p.stdout.decode().split()
            return running == "true", int(code), int(pid)
        except ValueError:
            return False, -1, 0

    def checkpointed(self, container: str) -> bool:
        """Whether ``container`` was stopped by a checkpoint (``podman inspect``'s ``State.Checkpointed``)."""
        p = self.podman("container", "inspect", "--format", "{{.State.Checkpointed}}", container, timeout=30)
        return p.stdout.decode().strip() == "true"

    def kill(self, container: str) -> None:
        """SIGKILL every process of ``container``; no error when it is not running."""
        self.podman("kill", container, timeout=30)
        self.podman("wait", container, timeout=30)

    def logs(self, container: str, lines: int = 20) -> str:
        """The last ``lines`` of what the container's processes wrote to stdout and stderr ("" when none)."""
        p = self.podman("logs", "--tail", str(lines), container, timeout=30)
        return (p.stdout + p.stderr).decode(errors="replace").strip() if p.returncode == 0 else ""

    def remove(self, container: str) -> None:
        """Remove ``container`` for good (the trial's end); no error when absent."""
        self._discard(container)
        self._options.pop(container, None)

    def _discard(self, container: str) -> None:
        """Remove the container but keep what the backend knows of it (a restore brings it back under its name)."""
        self.podman("rm", "--force", "--ignore", container, timeout=60)

    # -- the workload's container ------------------------------------------------
    def launch(self, argv: list[str], *, cwd: str, labels: dict[str, str] | None = None,
               env: dict[str, str] | None = None, image: str = "") -> Child:
        """Run ``podman run --detach`` of ``argv``, as :meth:`DockerCheckpointer.launch
        <cutbench.harness.nemesis.backends.docker.DockerCheckpointer.launch>` starts it, with the container's CRIU
        options file named by its annotation; returns its handle."""
        if not image:
            self._ensure_image()
        image, mounted, environment = container_setup(cwd, image, env)
        name = container_name(cwd)
        options = Path(cwd) / OPTIONS_FILE
        criu_options(options, log=Path(cwd) / "criu.log")
        # Podman's defaults ask for more than some hosts grant (runc: "error setting
        # rlimit ... operation not permitted"): the harness's own open-files limit,
        # and a process limit measured to be granted on such hosts.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limits = ["--ulimit", f"nofile={_limit(soft)}:{_limit(hard)}", "--ulimit", f"nproc={NPROC}:{NPROC}"]
        mounts = [arg for path, mode in mounted.items() for arg in ("-v", f"{path}:{path}:{mode}")]
        try:
            p = self.podman("run", "--detach", "--name", name, "--runtime", "runc", "--network", "host",
                            "--annotation", f"org.criu.config={options}",
                            *[arg for k, v in trial_labels(labels).items() for arg in ("--label", f"{k}={v}")],
                            *[arg for k, v in environment.items() for arg in ("--env", f"{k}={v}")],
                            "--workdir", cwd, *limits, *mounts, image, *argv)
            if p.returncode != 0:
                raise Unavailable(f"podman could not start the workload's container: {_err(p)}")
            self._options[name] = options
            _running, _code, pid = self.state(name)
        except BaseException:
            # Ctrl-C or SIGTERM may land after podman made the container and before the trial holds its handle:
            # nobody else would remove it.
            self.remove(name)
            raise
        return ContainerChild(pid=pid, container=name, engine=self)

    def has_image(self, image: str) -> bool:
        """Whether the engine holds ``image`` (no pull is tried: the trials' machine may have no registry)."""
        return self.podman("image", "exists", image).returncode == 0

    def _ensure_image(self) -> None:
        if self._image_ready or self.has_image(IMAGE):
            self._image_ready = True
            return
        p = self.podman("import", "-", IMAGE, stdin=rootfs_tarball())
        if p.returncode != 0:
            raise Unavailable(f"podman import of the workload image failed: {_err(p)}")
        self._image_ready = True

    # -- stages --------------------------------------------------------------------
    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stage ``podman_checkpoint``: export the container's checkpoint into the cut's images directory."""
        container = container_of(target, "podman_checkpoint")
        ctx.images_dir.mkdir(parents=True, exist_ok=True)
        archive = ctx.images_dir / "checkpoint.tar"
        options = self._options[container]
        self._cuts[ctx.images_dir] = (container, archive, options)
        log = ctx.images_dir / "criu-dump.log"
        criu_options(options, log=log, skip_in_flight=ctx.program is not None, extra=ctx.criu_options)
        args = ["container", "checkpoint", "--tcp-established", "--print-stats", "--compress", "none",
                "--export", str(archive)]
        if ctx.cut.fault != "kill":
            args.append("--leave-running")
        ctx.mark("criu_freeze")
        with ctx.timeline.stage("podman_checkpoint", ctx.cut_index) as extra:
            p = self.podman(*args, container, timeout=ctx.stage_timeout_s)
            if p.returncode != 0:
                reason = f"podman checkpoint exit {p.returncode}: {_err(p)} | CRIU: {criu_error_tail(log)}"
                if target.alive():
                    raise StageRefused("podman_checkpoint", reason)
                if self.checkpointed(container):
                    # Podman reports exit 0 for a container its own checkpoint stopped: not the program's own end.
                    raise StageFailed("podman_checkpoint", reason + " (the checkpoint stopped the container, then failed)")
                raise dump_failure("podman_checkpoint", reason, target)
            extra["bytes"] = archive.stat().st_size if archive.exists() else 0
            ctx.facts["image_bytes"] = extra["bytes"]
        ctx.facts.update(_stats(p.stdout, _CHECKPOINT_STATS))

    def restore(self, ctx: CutContext) -> int:
        """Stage ``podman_restore``: remove the crashed container, import its checkpoint; returns the new pid."""
        container, archive, options = self._cuts[ctx.images_dir]
        log = ctx.images_dir / "criu-restore.log"
        criu_options(options, log=log, restore_after=ctx.cut.fault, skip_in_flight=ctx.program is not None,
                     extra=ctx.criu_options)
        with ctx.timeline.stage("podman_restore", ctx.cut_index):
            self._discard(container)
            p = self.podman("container", "restore", "--import", str(archive), "--print-stats",
                            *(["--tcp-established"] if ctx.cut.fault == "kill" else []), timeout=ctx.stage_timeout_s)
            if p.returncode != 0:
                raise restore_failure("podman_restore", f"podman restore exit {p.returncode}: {_err(p)} | CRIU: {criu_error_tail(log)}", ctx)
            running, code, pid = self.state(container)
            if not running:
                raise gone_after_restore("podman_restore", code, self.logs(container))
        ctx.facts.update(_stats(p.stdout, _RESTORE_STATS))
        return pid

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Nothing to undo: ``--leave-running`` left the container running."""

    def cleanup(self, ctx: CutContext) -> None:
        """Forget the cut and release the network lock of a checkpoint never restored (its archive is in the images
        directory, which the pipeline removes); never raises."""
        cut = self._cuts.pop(ctx.images_dir, None)
        if cut is not None and ctx.cut.fault == "kill" and not ctx.restored:
            _release_lock_of(cut[1])


def _release_lock_of(archive: Path) -> None:
    """:func:`release_lock_of` the checkpoint exported to ``archive`` (its ``inventory.img`` names the lock)."""
    try:
        with tarfile.open(archive) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("inventory.img") and m.isfile()), None)
            source = tar.extractfile(member) if member is not None else None
            if source is not None:
                release_lock_of(source.read())
    except (OSError, tarfile.TarError):
        return


def _stats(stdout: bytes, names: dict[str, str]) -> dict[str, float]:
    """Podman's ``--print-stats`` JSON (microseconds) as facts in seconds, under the names in ``names``."""
    try:
        data = json.loads(stdout.decode() or "{}")
    except ValueError:
        return {}
    flat: dict[str, Any] = {k: v for k, v in data.items() if not isinstance(v, list)}
    for container in data.get("container_statistics", []):
        flat.update({k: v for k, v in container.items() if not isinstance(v, dict)})
        flat.update(container.get("criu_statistics", {}))
    return {fact: flat[key] / 1e6 for key, fact in names.items() if isinstance(flat.get(key), (int, float))}


def _limit(value: int) -> str:
    return "-1" if value == resource.RLIM_INFINITY else str(value)


def _err(p: subprocess.CompletedProcess) -> str:
    text = (p.stderr or b"").decode(errors="replace").strip() if isinstance(p.stderr, bytes) else str(p.stderr)
    return " | ".join(text.splitlines()[-4:])
