"""A container engine's lifecycle driven by hand, with no cutbench in it: ``docker`` and ``podman`` for the hunt.

The probe of :mod:`~cutbench.harness.nemesis.probe_kit` runs in a container (the host's ``/usr`` mounted
read-only for its interpreter, its command directory read-write at its own path, no network), and the actions
are the engines' own commands: a checkpoint (``docker checkpoint create``, ``podman container checkpoint
--export``), with ``--leave-running`` or not; a restore of the checkpointed container (``docker start
--checkpoint``; Podman: the stopped container removed and the export imported again); and a restore under a
new name (``docker create`` then ``docker start --checkpoint-dir`` of the first container's checkpoints;
``podman container restore --import --name``). A reproducer of an engine's deviation is this file's text
appended to the lifecycle kit's (the ``# kit-import`` lines dropped), so it too imports nothing of cutbench.

The engines are asked through their command lines: ``docker`` with ``DOCKER_HOST`` (the hunt sets it to the
project's dockerd), ``podman`` with runc (the runtime the engine checkpoints with here), on ``HUNT_ENGINE_PATH``
where set (the ``PATH`` with the CRIU to use first: runc runs ``criu`` from it). ``HUNT_ENGINE_TMP``,
where set, is the docker engine's temporary directory: containerd's unpacked checkpoint copies left there by
the session's restores are what it leaves behind.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import tarfile
import time
import uuid
from typing import Any

from cutbench.harness.nemesis.lifecycle_kit import SESSIONS, Session  # kit-import
from cutbench.harness.nemesis.probe_kit import BOUND_S, PROBE, Hang, alive  # kit-import

ROOTFS_IMAGE = "cutbench-hunt-rootfs:1"  # empty mount points and merged-/usr links: the host's /usr is mounted
PYTHON = "/usr/bin/python3"
LABEL = "cutbench.hunt"  # every container a session makes carries its session's id under this label
NPROC = 4096  # Podman's default process limit is more than some hosts grant (runc: "error setting rlimit")


def rootfs_tar() -> bytes:
    """The probe's image as a tar: mount points, and ``bin``, ``lib``… as links into the mounted ``/usr``. (The
    container backends' image, ``containers.rootfs_tarball``, is the same idea written again here on purpose: a
    reproducer is this file's text and imports nothing of cutbench.)"""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("usr", "tmp", "proc", "dev", "sys", "etc", "run", "var"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


IMAGES_READY: set[tuple[str, str]] = set()  # (engine, DOCKER_HOST) that hold the probe's image


class EngineSession(Session):
    """One probe in a container of ``tool`` (``docker`` or ``podman``); :meth:`do` and :meth:`close` as
    :class:`Session`'s. The probe's host pid changes with each restore; its container is ``self.container``."""

    def __init__(self, tool: str, bound_s: float = BOUND_S, criu: list[str] | None = None,
                 libdir: str | None = None, env: dict[str, str] | None = None, probe: str = "buffers") -> None:
        self.engine = tool
        self.session_id = uuid.uuid4().hex[:12]
        self.containers: list[str] = []  # every container this session made, for close()
        self.container = ""  # the probe's container now
        self.checkpoint: dict[str, str] | None = None  # the last checkpoint: container, id, name or archive
        self.count = 0
        self.inventories: set[bytes] = set()  # each docker checkpoint's inventory.img: its unpacked copies' mark
        self.root = ""  # the docker engine's data root (asked once)
        super().__init__(tool, bound_s, criu, libdir, env, probe)  # self.env: DOCKER_HOST, HUNT_ENGINE_* for the engine's CLI
        self.engine_tmp = self.env.get("HUNT_ENGINE_TMP", "") if tool == "docker" else ""

    # -- the engine's command line ---------------------------------------------------
    def _run(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        # runc runs `criu` from PATH: HUNT_ENGINE_PATH puts the CRIU to use first (podman's runc is started here).
        env = {**self.env, "PATH": self.env.get("HUNT_ENGINE_PATH") or self.env.get("PATH", "")}
        try:
            return subprocess.run([self.engine, *args], input=stdin, capture_output=True, timeout=self.bound_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise Hang(f"{self.engine} {args[0]} past {self.bound_s:.0f} s") from exc

    def _words(self, p: subprocess.CompletedProcess[bytes]) -> str:
        text = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
        return text[-1] if text else f"exit {p.returncode}"

    def _inspect(self, container: str) -> dict[str, Any]:
        p = self._run("inspect", "--format", "{{json .State}}|{{.Id}}", container)
        if p.returncode != 0:
            return {}
        state, _, cid = p.stdout.decode().strip().rpartition("|")
        return {**json.loads(state), "Id": cid}

    def _remove(self, name: str) -> subprocess.CompletedProcess[bytes]:
        """``rm --force`` of container ``name`` (Podman's with no grace period: the probe, its container's init,
        ignores SIGTERM, so a stop would wait out its 10 s before the SIGKILL)."""
        return self._run("rm", "--force", *(["--time", "0"] if self.engine == "podman" else []), name)

    def _running(self) -> bool:
        return bool(self.container) and bool(self._inspect(self.container).get("Running"))

    def _unpacked(self) -> list[str]:
        """containerd's unpacked copies of this session's checkpoints in the docker engine's temporary directory
        (none for podman). A copy is known by its ``inventory.img``, whose bytes are its checkpoint's own: another
        user's restores on the same engine are never counted."""
        if not self.engine_tmp or not os.path.isdir(self.engine_tmp):
            return []
        found = []
        for name in os.listdir(self.engine_tmp):
            if not name.startswith("ctrd-checkpoint"):
                continue
            try:
                with open(os.path.join(self.engine_tmp, name, "inventory.img"), "rb") as f:
                    if f.read() in self.inventories:
                        found.append(name)
            except OSError:
                continue
        return found

    def _checkpoints_dir(self, container_id: str) -> str:
        """Where the docker engine keeps a container's checkpoints."""
        if not self.root:
            self.root = self._run("info", "--format", "{{.DockerRootDir}}").stdout.decode().strip()
        return os.path.join(self.root, "containers", container_id, "checkpoints")

    def _ensure_image(self) -> None:
        """The probe's image in the engine: asked once per process and engine (each probe's start would ask)."""
        key = (self.engine, self.env.get("DOCKER_HOST", ""))
        if key in IMAGES_READY:
            return
        if self._run("image", "inspect", ROOTFS_IMAGE).returncode != 0:
            p = self._run("import", "-", ROOTFS_IMAGE, stdin=rootfs_tar())
            if p.returncode != 0:
                raise RuntimeError(f"{self.engine} import of the probe's image failed: {self._words(p)}")
        IMAGES_READY.add(key)

    def _create_args(self, name: str) -> list[str]:
        """The arguments after ``run``/``create``: the probe's container, named ``name``."""
        args = ["--name", name, "--label", f"{LABEL}={self.session_id}", "--network", "none",
                "-v", "/usr:/usr:ro", "-v", f"{self.dir}:{self.dir}"]
        if self.engine == "podman":
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            args += ["--runtime", "runc", "--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={NPROC}:{NPROC}"]
        return [*args, ROOTFS_IMAGE, PYTHON, "-c", PROBE, str(self.dir), self.kind, self.probe]

    def _adopt(self, name: str) -> int:
        """The probe in container ``name`` is now the session's: its host pid (0 when it is not running)."""
        self.container = name
        pid = int(self._inspect(name).get("Pid") or 0)
        if pid:
            self.pids.add(pid)
        return pid

    # -- the probe -------------------------------------------------------------------
    def _start(self) -> int:
        self._ensure_image()
        name = f"cutbench-hunt-{self.session_id}-{len(self.containers)}"
        self.containers.append(name)
        self.container = name
        p = self._run("run", "--detach", *self._create_args(name))
        deadline = time.monotonic() + self.bound_s
        while p.returncode == 0 and not (self.dir / "ready").exists():
            if not self._running() or time.monotonic() > deadline:
                p = self._run("logs", name)
                p.returncode = p.returncode or 1
            time.sleep(0.01)
        if p.returncode != 0:
            why = self._words(p)
            self._remove(name)  # the session is not made: nobody else would remove it
            raise RuntimeError(f"the probe's container did not start: {why}")
        return self._adopt(name)

    def log_tail(self, n: int = 5) -> str:
        """The probe's last lines of output, as its engine kept them."""
        p = self._run("logs", self.container) if self.container else None
        lines = (p.stdout + p.stderr).decode(errors="replace").strip().splitlines() if p is not None else []
        return " | ".join(lines[-n:])

    def state(self) -> str:
        """Return ``running`` while the probe's container runs and its probe lives, else ``gone``."""
        return "running" if alive(self.pid) and self._running() else "gone"

    # -- the actions -------------------------------------------------------------------
    def _kill(self) -> str:
        if not self._running():
            return "gone"
        p = self._run("kill", self.container)
        if p.returncode != 0:  # refused: the container runs on, nothing to wait for
            return "refused: " + self._words(p)
        self._wait_stopped()
        return "ok"

    def _engine_checkpoint(self, leave_running: bool = False) -> str:
        if not self._running():
            return "gone"
        self.count += 1
        leave = ["--leave-running"] if leave_running else []
        if self.engine == "docker":
            name = f"c{self.count}"
            p = self._run("checkpoint", "create", *leave, self.container, name)
            cp = {"container": self.container, "id": self._inspect(self.container).get("Id", ""), "name": name}
        else:
            self.images.mkdir(exist_ok=True)
            archive = str(self.images / f"c{self.count}.tar")
            p = self._run("container", "checkpoint", *leave, "--compress", "none", "--export", archive, self.container)
            cp = {"container": self.container, "archive": archive}
        if p.returncode != 0:
            return f"refused: {self.engine} checkpoint: {self._words(p)}"
        if self.engine == "docker":
            try:
                with open(os.path.join(self._checkpoints_dir(cp["id"]), cp["name"], "inventory.img"), "rb") as f:
                    self.inventories.add(f.read())
            except OSError:
                pass  # an engine on another host: its unpacked copies are not counted here
        self.checkpoint = cp
        self._take_image()
        if not leave_running:
            self._wait_stopped()
        return "ok"

    def _wait_stopped(self) -> None:
        """Until the probe's container has stopped (at most the bound)."""
        deadline = time.monotonic() + self.bound_s
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _restored(self, name: str) -> str:
        """After a restore the engine answered ok: the copy in ``name`` is the probe, as the image left it."""
        assert self.image is not None
        self.pid = self._adopt(name)
        self._back_to_image()
        return "ok" if self.pid else f"refused: {self.engine} reported the restore, but {name} is not running"

    def _engine_restore(self) -> str:
        """Restore the checkpointed container from its checkpoint (Podman: remove it, import the export again)."""
        if self.checkpoint is None or self.image is None:
            return "harness: no checkpoint to restore"
        name = self.checkpoint["container"]
        before = self._inspect(name)
        running = bool(before.get("Running"))
        if not running:
            self._forget_after_image()
        if self.engine == "docker":
            p = self._run("start", "--checkpoint", self.checkpoint["name"], name)
        else:
            if not running:
                self._remove(name)
            p = self._run("container", "restore", "--import", self.checkpoint["archive"])
        if p.returncode != 0:
            return f"refused: {self.engine} restore: {self._words(p)}"
        after = self._inspect(name)
        if running and after.get("Running") and after.get("Pid") == before.get("Pid"):
            # The engine said yes, and the container it was to restore into runs on as it was.
            return (f"ok: {self.engine} answered 0 but restored nothing: the running container went on "
                    f"(pid {after.get('Pid')} before and after)")
        return self._restored(name)

    def _engine_restore_new(self) -> str:
        """Restore the checkpoint into a new container under a new name (the first one stays, stopped)."""
        if self.checkpoint is None or self.image is None:
            return "harness: no checkpoint to restore"
        self._forget_after_image()
        name = f"cutbench-hunt-{self.session_id}-{len(self.containers)}"
        self.containers.append(name)
        if self.engine == "docker":
            made = self._run("create", *self._create_args(name))
            if made.returncode != 0:
                return f"harness: docker create: {self._words(made)}"
            where = self._checkpoints_dir(self.checkpoint["id"])
            p = self._run("start", "--checkpoint", self.checkpoint["name"], "--checkpoint-dir", where, name)
        else:
            p = self._run("container", "restore", "--import", self.checkpoint["archive"], "--name", name)
        if p.returncode != 0:
            return f"refused: {self.engine} restore into a new container: {self._words(p)}"
        answer = self._restored(name)
        self.checkpoint = self.image = None  # a migration: the checkpoint stays with the first container
        return answer

    # -- what is left ------------------------------------------------------------------
    def close(self) -> list[str]:
        """Remove every container of the session (and so its checkpoints), then what :meth:`Session.close`
        removes; returns what was left behind: containers, and containerd's unpacked checkpoint copies."""
        for name in self.containers:
            # A container still stopping (a kill in flight) can outlast one rm --force: asked again while it is there.
            for _ in range(3):
                if self._remove(name).returncode == 0 and not self._inspect(name):
                    break
                time.sleep(0.5)
        left = super().close()
        p = self._run("ps", "--all", "--quiet", "--filter", f"label={LABEL}={self.session_id}")
        still = p.stdout.decode().split()
        if still:
            left.append(f"{len(still)} container(s) of the session still there after {self.engine} rm --force")
        unpacked = self._unpacked()
        if unpacked:
            left.append(f"{len(unpacked)} unpacked checkpoint copies (ctrd-checkpoint*) left in {self.engine_tmp} "
                        "after the session's containers were removed")
        for name in unpacked:  # said, then removed: they are this session's, and would fill the engine's disk
            shutil.rmtree(os.path.join(self.engine_tmp, name), ignore_errors=True)
        return left


SESSIONS.update(docker=EngineSession, podman=EngineSession)
