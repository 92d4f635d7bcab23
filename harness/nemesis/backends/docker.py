"""``docker``: the workload in a Docker container, checkpointed and restored by the engine.

Through the docker SDK's low-level API client: the SDK has no checkpoint
call, so the backend posts to the engine's own endpoints —
``POST /containers/{id}/checkpoints`` (``Exit`` true for a ``kill`` fault,
false to leave it running) and ``POST /containers/{id}/start?checkpoint=NAME``
for the restore. The engine keeps the checkpoint in its data root (Docker
20.10 refuses a custom checkpoint directory on start); its size is read
there and the checkpoint is deleted through the API after the cut, with the
copy containerd unpacked for the restore (which it never removes). A restore
the engine refuses only because containerd still holds the checkpoint's own
tarball (moby/moby#42900, a matter of its garbage collector's timing) is asked
again once, and the cut's ``harness_action`` says so.

Docker passes no CRIU options of its own, so the options the receiver
connection needs (see :mod:`~cutbench.harness.nemesis.backends.containers`)
go into runc's CRIU options file, ``/etc/criu/runc.conf``, rewritten before
each stage and removed after it. The backend refuses to run when that
file exists and was not written by it (it would overwrite someone's
settings), and one Docker engine call runs at a time on a host for the same
reason: the lock is held for each call only, so a trial's cut waits at most for
another trial's call in flight, never for that trial's whole cut (its crash and
restore) while its own workload runs on past the cut.

The engine is found at :func:`cutbench.harness.provision.engines.docker_host`;
``cutbench engine start docker`` starts the project's own. A restore that the
engine reports while the workload in fact started anew is caught by the
oracle (``restarted``), not taken on the engine's word.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cutbench.errors import StageRefused, Unavailable
from cutbench.harness.provision import engines
from cutbench.harness.nemesis.backends.containers import (IMAGE, OPTIONS_HEADER, ContainerChild, container_name,
                                                          container_of, container_setup, criu_options,
                                                          gone_after_restore, rootfs_tarball, trial_labels)
from cutbench.harness.nemesis.backends.criu import criu_error_tail, dump_failure, restore_failure
from cutbench.harness.nemesis.base import Capabilities, CutContext, dir_bytes, remove_tree
from cutbench.harness.nemesis.probe_kit import release_network_lock
from cutbench.procs import Child

RUNC_OPTIONS = Path("/etc/criu/runc.conf")


class DockerCheckpointer:
    """The ``docker`` backend (see module docstring)."""

    name = "docker"
    capabilities = Capabilities(stages=("docker_checkpoint", "docker_restore"), covers=frozenset({"cpu", "ipc"}),
                                tools=frozenset({"criu"}))

    def __init__(self) -> None:
        self._client: Any = None
        self._root: Path | None = None
        self._cuts: dict[Path, tuple[str, str]] = {}  # images_dir -> (container id, checkpoint name)

    # -- engine ---------------------------------------------------------------
    @property
    def api(self) -> Any:
        """The SDK's low-level client for the engine (connected on first use)."""
        if self._client is None:
            self._client = engines.docker_client()
        return self._client.api

    def unavailable_reason(self) -> str | None:
        """Why Docker checkpoints cannot run here (with the fix), or None."""
        host = engines.docker_host()
        try:
            info = self.api.info()
        except Unavailable as exc:
            return str(exc)
        except Exception as exc:
            return f"no Docker engine answers at {host} ({type(exc).__name__}: {exc}); fix: `cutbench engine start docker`"
        if not info.get("ExperimentalBuild"):
            return (f"the Docker engine at {host} has experimental features off, which checkpoints need; "
                    "fix: `\"experimental\": true` in its daemon.json, or `cutbench engine start docker`")
        if _foreign(RUNC_OPTIONS):
            return (f"{RUNC_OPTIONS} exists and was not written by cutbench; the docker backend writes runc's CRIU "
                    "options there for each stage. Fix: move that file away while the docker backend runs")
        return None

    def state(self, container: str) -> tuple[bool, int, int]:
        """Return ``(running, exit_code, pid)`` from the engine (a removed container: stopped, exit -1)."""
        try:
            st = self.api.inspect_container(container)["State"]
        except Exception:
            return False, -1, 0
        return bool(st.get("Running") or st.get("Restarting")), int(st.get("ExitCode", -1)), int(st.get("Pid") or 0)

    def kill(self, container: str) -> None:
        """SIGKILL every process of ``container``; no error when it is not running."""
        try:
            self.api.kill(container)
        except Exception:
            pass
        try:
            self.api.wait(container, timeout=10)
        except Exception:
            pass

    def logs(self, container: str, lines: int = 20) -> str:
        """The last ``lines`` of what the container's processes wrote to stdout and stderr ("" when none)."""
        try:
            return self.api.logs(container, tail=lines).decode(errors="replace").strip()
        except Exception:
            return ""

    def remove(self, container: str) -> None:
        """Remove ``container`` (and its checkpoints); no error when absent."""
        try:
            self.api.remove_container(container, force=True)
        except Exception:
            pass

    # -- the workload's container --------------------------------------------
    def launch(self, argv: list[str], *, cwd: str, labels: dict[str, str] | None = None,
               env: dict[str, str] | None = None, image: str = "") -> Child:
        """Start ``argv`` in a new container (working directory ``cwd``, tagged with ``labels`` and the harness's
        identity: see :func:`~cutbench.harness.nemesis.backends.containers.trial_labels`; ``env`` added to its
        environment; ``image``: a program's own, else cutbench's: see
        :func:`~cutbench.harness.nemesis.backends.containers.container_setup`); returns its handle."""
        if not image:  # cutbench's own image, with the host's directories but the engine's own mounted
            self._ensure_image()
        forbidden = () if image else (self.data_root(), engines.docker_paths().root)
        image, mounts, environment = container_setup(cwd, image, env, forbidden=forbidden)
        host_config = self.api.create_host_config(
            network_mode="host", binds={path: {"bind": path, "mode": mode} for path, mode in mounts.items()})
        name = container_name(cwd)
        try:
            created = self.api.create_container(
                image, command=argv, working_dir=cwd, host_config=host_config, name=name,
                environment=environment, labels=trial_labels(labels))
            cid = created["Id"]
            try:
                self.api.start(cid)
            except Exception as exc:
                raise Unavailable(f"docker could not start the workload's container: {exc}") from exc
            _running, _code, pid = self.state(cid)
        except BaseException:
            # A failed start, or Ctrl-C / SIGTERM before the trial holds the handle: nobody else would remove it.
            self.remove(name)
            raise
        return ContainerChild(pid=pid, container=cid, engine=self)

    def has_image(self, image: str) -> bool:
        """Whether the engine holds ``image`` (no pull is tried: the trials' machine may have no registry)."""
        try:
            self.api.inspect_image(image)
            return True
        except Exception:
            return False

    def data_root(self) -> Path:
        """The engine's data root (asked once: its checkpoints live there)."""
        if self._root is None:
            self._root = Path(self.api.info().get("DockerRootDir", "/var/lib/docker"))
        return self._root

    def _ensure_image(self) -> None:
        if not self.has_image(IMAGE):
            repository, tag = IMAGE.split(":")
            self.api.import_image_from_data(rootfs_tarball(), repository=repository, tag=tag)

    # -- stages ----------------------------------------------------------------
    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stage ``docker_checkpoint``: the engine's checkpoint of the container (it stops only for ``kill``)."""
        cid = container_of(target, "docker_checkpoint")
        name = f"c{ctx.cut_index}"
        ctx.images_dir.mkdir(parents=True, exist_ok=True)
        log = ctx.images_dir / "criu-dump.log"
        self._cuts[ctx.images_dir] = (cid, name)
        with _runc_options(log=log, skip_in_flight=ctx.program is not None, extra=ctx.criu_options):
            ctx.mark("criu_freeze")
            with ctx.timeline.stage("docker_checkpoint", ctx.cut_index) as extra:
                reply = self._post(ctx, "docker_checkpoint", "/containers/{0}/checkpoints", cid,
                                   json={"CheckpointID": name, "Exit": ctx.cut.fault == "kill"})
                if reply is None or reply.status_code >= 300:
                    reason = f"docker checkpoint: {_message(reply)} | CRIU: {criu_error_tail(log)}"
                    if target.alive():
                        raise StageRefused("docker_checkpoint", reason)
                    raise dump_failure("docker_checkpoint", reason, target)
                image = self._checkpoint_dir(cid, name)
                extra["bytes"] = dir_bytes(image) if image.is_dir() else 0
                ctx.facts["image_bytes"] = extra["bytes"]

    def restore(self, ctx: CutContext) -> int:
        """Stage ``docker_restore``: start the stopped container from its checkpoint; returns the new pid."""
        cid, name = self._cuts[ctx.images_dir]
        log = ctx.images_dir / "criu-restore.log"
        with (_runc_options(log=log, restore_after=ctx.cut.fault, skip_in_flight=ctx.program is not None,
                            extra=ctx.criu_options),
              ctx.timeline.stage("docker_restore", ctx.cut_index) as extra):
            reply = self._post(ctx, "docker_restore", "/containers/{0}/start", cid, params={"checkpoint": name})
            if _stale_upload(reply) and (action := self._retouch(cid, name, _message(reply))):
                ctx.facts["harness_action"] = action
                reply = self._post(ctx, "docker_restore", "/containers/{0}/start", cid, params={"checkpoint": name})
            if reply is None or reply.status_code >= 300:
                raise restore_failure("docker_restore", f"docker start --checkpoint: {_message(reply)} | CRIU: {criu_error_tail(log)}", ctx)
            running, code, pid = self.state(cid)
            if not running:
                raise gone_after_restore("docker_restore", code, self.logs(cid))
            extra["detail"] = f"pid {pid}"  # the host pid the engine restored (its own log names it so)
        return pid

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Nothing to undo: the checkpoint left the container running."""

    def cleanup(self, ctx: CutContext) -> None:
        """Delete the cut's checkpoint from the engine (and the network lock of one never restored); never raises."""
        cut = self._cuts.pop(ctx.images_dir, None)
        if cut is None:
            return  # the checkpoint never began
        cid, name = cut
        unpacked: list[Path] = []
        try:  # the engine's data root is asked of the engine, which may have hung
            checkpoint = self._checkpoint_dir(cid, name)
            if ctx.cut.fault == "kill" and not ctx.restored:
                release_network_lock(checkpoint)  # a checkpoint never restored keeps its lock
            unpacked = _unpacked_copies(checkpoint)
            self.api.delete(self.api._url("/containers/{0}/checkpoints/{1}", cid, name), timeout=ctx.stage_timeout_s)
        except Exception:
            pass
        for path in unpacked:
            remove_tree(path)

    def _post(self, ctx: CutContext, stage: str, path: str, cid: str, **kwargs: Any) -> Any:
        """POST to the engine within the stage's timeout; None when the engine did not answer (the reason kept)."""
        try:
            return self.api.post(self.api._url(path, cid), timeout=ctx.stage_timeout_s, **kwargs)
        except Exception:  # a hung or gone engine (requests' timeout or connection error): the stage says so
            return None

    def _checkpoint_dir(self, cid: str, name: str) -> Path:
        return self.data_root() / "containers" / cid / "checkpoints" / name

    def _retouch(self, cid: str, name: str, refusal: str) -> str | None:
        """Move one image file's mtime a second on, so that the engine's tarball of the checkpoint is new; returns
        what was done, for the cut's ``harness_action`` (None when the file is not there: the refusal stands).

        Docker extracts a checkpoint from containerd's content store, and its restore tars that directory back
        into the store and refuses when the blob is still there (moby/moby#42900): until containerd's garbage
        collector has run, a restore right after the checkpoint fails whatever the workload. The retry measures
        the restore, not the collector's timing; only the file's time changes, never its bytes.
        """
        inventory = self._checkpoint_dir(cid, name) / "inventory.img"
        try:
            st = inventory.stat()
            os.utime(inventory, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        except OSError:
            return None
        return (f"docker_restore: the engine refused ({refusal}: its content store still held the checkpoint's own "
                "tarball, moby/moby#42900); inventory.img's mtime moved 1 s on and the restore asked again")


@contextlib.contextmanager
def _runc_options(*, log: Path, restore_after: str | None = None, skip_in_flight: bool = False,
                  extra: tuple[str, ...] = ()) -> Iterator[None]:
    """runc's CRIU options file written for one engine call (see :func:`criu_options`) and removed after it, under
    the host-wide lock: the file is one per host, and the engine reads it during the call."""
    lock = _lock_options()
    try:
        criu_options(RUNC_OPTIONS, log=log, restore_after=restore_after, skip_in_flight=skip_in_flight, extra=extra)
        yield
    finally:
        if not _foreign(RUNC_OPTIONS):
            RUNC_OPTIONS.unlink(missing_ok=True)
        lock.close()  # closing the file releases its lock


def _lock_options() -> Any:
    """An exclusive lock on runc's CRIU options file for this process (a file beside it; close it to release)."""
    RUNC_OPTIONS.parent.mkdir(parents=True, exist_ok=True)
    fh = open(RUNC_OPTIONS.parent / ".runc.conf.cutbench-lock", "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def _unpacked_copies(checkpoint: Path) -> list[Path]:
    """The ``ctrd-checkpoint*`` directories into which containerd unpacked ``checkpoint`` for a restore.

    containerd never removes them (containerd/containerd#10166): about 19 MB a restore, in the engine's
    ``TMPDIR`` (the project's engine: :attr:`~cutbench.harness.provision.engines.DockerPaths.tmp`; another
    engine: usually ``/tmp``). A copy is known by its ``inventory.img``, whose bytes (the dump's uptime among
    them) are the checkpoint's own, so no other restore's directory is ever taken.
    """
    try:
        inventory = (checkpoint / "inventory.img").read_bytes()
    except OSError:
        return []  # no restore was unpacked from it, or the engine is not on this host
    found = []
    for path in unpacked_checkpoints():
        try:
            if (path / "inventory.img").read_bytes() == inventory:
                found.append(path)
        except OSError:
            continue
    return found


def unpacked_checkpoints() -> set[Path]:
    """Every ``ctrd-checkpoint*`` directory now in the engine's ``TMPDIR`` (the project's engine's, or ``/tmp``)."""
    return {path for parent in (engines.docker_paths().tmp, Path(tempfile.gettempdir()))
            for path in parent.glob("ctrd-checkpoint*")}


def _stale_upload(reply: Any) -> bool:
    """True when ``reply`` is Docker refusing a restore because containerd still holds the checkpoint's tarball."""
    if reply is None or reply.status_code < 300:
        return False
    words = _message(reply)
    return "failed to upload checkpoint to containerd" in words and "already exists" in words


def _message(reply: Any) -> str:
    if reply is None:
        return "the engine did not answer (no reply within the stage timeout, or the connection failed)"
    try:
        return f"{reply.status_code} {reply.json().get('message', reply.text)}"
    except ValueError:
        return f"{reply.status_code} {reply.text[:300]}"


def _foreign(path: Path) -> bool:
    """True when ``path`` exists and cutbench did not write it."""
    try:
        return OPTIONS_HEADER not in path.read_text().splitlines()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True
