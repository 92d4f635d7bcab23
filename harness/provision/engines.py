"""Container engines for the ``docker`` and ``podman`` backends: where they are, starting and stopping Docker's.

``cutbench engine start docker`` starts a ``dockerd`` of the project's own:
experimental features on (checkpoints need them), no iptables and no bridge
(these hosts may have neither; the workload uses the host's network), its own
data root, run directory and socket, and the project's CRIU first on its
``PATH`` (runc runs ``criu`` from there). ``cutbench engine stop docker``
stops it. The backends find that engine without configuration; set
``CUTBENCH_DOCKER_HOST`` (or ``DOCKER_HOST``) for another. Podman has no
daemon: the backend runs ``podman`` with the same ``PATH``.

The engine's state lives outside the project and the trial directories on
purpose: a container that bind-mounts a folder holding the engine's data root
cannot be dumped (CRIU: "unreachable sharing").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cutbench.errors import InvalidArgument, Unavailable

ENGINES = ("docker", "podman")


def state_root() -> Path:
    """Where the project's engines keep their state: ``$CUTBENCH_ENGINE_ROOT`` or ``/var/lib/cutbench``."""
    return Path(os.environ.get("CUTBENCH_ENGINE_ROOT", "/var/lib/cutbench"))


@dataclass(frozen=True)
class DockerPaths:
    """The files and directories of the project's ``dockerd``."""

    root: Path

    @property
    def data_root(self) -> Path:
        """Images, containers and their checkpoints."""
        return self.root / "data"

    @property
    def exec_root(self) -> Path:
        """The engine's run directory (containerd's sockets, runc's state)."""
        return self.root / "exec"

    @property
    def tmp(self) -> Path:
        """The engine's ``TMPDIR``: containerd unpacks each checkpoint it restores into a ``ctrd-checkpoint*``
        directory there and never removes it (containerd/containerd#10166), so the ``docker`` backend does."""
        return self.root / "tmp"

    @property
    def socket(self) -> Path:
        """The API socket."""
        return self.root / "docker.sock"

    @property
    def config(self) -> Path:
        """The ``daemon.json`` it is started with."""
        return self.root / "daemon.json"

    @property
    def pidfile(self) -> Path:
        """The daemon's pid."""
        return self.root / "docker.pid"

    @property
    def log(self) -> Path:
        """The daemon's own log (read it when a start or a checkpoint fails)."""
        return self.root / "dockerd.log"


def docker_paths() -> DockerPaths:
    """The paths of the project's ``dockerd`` (under :func:`state_root`)."""
    return DockerPaths(state_root() / "docker")


def docker_host() -> str:
    """The Docker API address the ``docker`` backend uses.

    ``$CUTBENCH_DOCKER_HOST``; else the project's engine when its socket
    exists; else ``$DOCKER_HOST``; else the system's default socket.
    """
    explicit = os.environ.get("CUTBENCH_DOCKER_HOST")
    if explicit:
        return explicit
    own = docker_paths().socket
    if own.exists():
        return f"unix://{own}"
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def docker_client(base_url: str | None = None, timeout: float = 60):
    """A docker SDK client for :func:`docker_host` (or ``base_url``); Unavailable without the SDK."""
    try:
        import docker
    except ImportError as exc:
        raise Unavailable("the docker backend needs the docker SDK: pip install 'cutbench[containers]'") from exc
    return docker.DockerClient(base_url=base_url or docker_host(), timeout=timeout)


def start_docker(timeout_s: float = 60.0) -> bool:
    """Start the project's ``dockerd`` unless it already answers; True when this call started it.

    Raises :class:`Unavailable` naming the fix when ``dockerd`` is not
    installed, and with the tail of its log when it does not come up.
    """
    paths = docker_paths()
    if _docker_answers(paths):
        return False
    exe = shutil.which("dockerd")
    if exe is None:
        raise Unavailable("dockerd is not installed; fix: `apt-get install docker.io` (Debian's Docker engine), "
                          "or `make containers` in a checkout")
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(json.dumps({
        "experimental": True,
        "iptables": False,
        "ip-forward": False,
        "ip-masq": False,
        "bridge": "none",
        "data-root": str(paths.data_root),
        "exec-root": str(paths.exec_root),
        "pidfile": str(paths.pidfile),
        "hosts": [f"unix://{paths.socket}"],
    }, indent=2))
    env = criu_path_env()
    # dockerd starts its containerd before it sets a TMPDIR of its own, so containerd takes this one (not /tmp).
    paths.tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(paths.tmp)
    env.pop("XDG_RUNTIME_DIR", None)  # containerd prefers it to TMPDIR for the unpacked checkpoints
    with open(paths.log, "ab") as log:
        proc = subprocess.Popen([exe, "--config-file", str(paths.config)], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout_s
    while not _docker_answers(paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise Unavailable(f"dockerd did not come up (exit {proc.returncode}); its log {paths.log} ends: "
                              f"{log_tail(paths.log)}")
        time.sleep(0.2)
    return True


def stop_docker(timeout_s: float = 60.0) -> bool:
    """Stop the project's ``dockerd`` (its containers first); True when one was running."""
    paths = docker_paths()
    try:
        pid = int(paths.pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    if _docker_answers(paths):
        try:
            client = docker_client(f"unix://{paths.socket}")
            for container in client.containers.list(all=True, filters={"label": "cutbench"}):
                container.remove(force=True)
        except Exception:  # best effort: the daemon stops its containers itself too
            pass
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        _reap(pid)
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    paths.socket.unlink(missing_ok=True)
    return True


def criu_path_env() -> dict[str, str]:
    """The environment for an engine or its runtime: the project's CRIU first on ``PATH``.

    runc runs ``criu`` from ``PATH``; a bundled CRIU (``cutbench criu
    install``) has a wrapper in ``PREFIX/bin``. Raises
    :class:`~cutbench.errors.Unavailable` (with the fix) without a CRIU >= 4.2.
    """
    from cutbench.harness.provision.criu import locate

    bindir = str(Path(locate.require_criu().executable).parent)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([bindir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]])
    return env


def podman_unavailable_reason() -> str | None:
    """Why the ``podman`` backend cannot run here (with the fix), or None."""
    if shutil.which("podman") is None:
        return "podman is not installed; fix: `apt-get install podman` (Debian's), or `make containers` in a checkout"
    if shutil.which("runc") is None:
        return "podman checkpoints through runc, which is not installed; fix: `apt-get install runc`"
    return None


def engine_status(name: str) -> str:
    """One line on engine ``name``: where it is and whether it answers."""
    if name not in ENGINES:
        raise InvalidArgument(f"unknown engine {name!r}; allowed: {', '.join(ENGINES)}")
    if name == "podman":
        return podman_unavailable_reason() or f"podman: {shutil.which('podman')} (no daemon; runs on demand)"
    host = docker_host()
    try:
        info = docker_client(host, timeout=5).info()
    except Unavailable as exc:
        return str(exc)
    except Exception as exc:
        return f"docker: no engine answers at {host} ({type(exc).__name__}); fix: `cutbench engine start docker`"
    experimental = "experimental on" if info.get("ExperimentalBuild") else "experimental OFF (checkpoints need it)"
    return f"docker: {info.get('ServerVersion')} at {host}, {experimental}"


def _docker_answers(paths: DockerPaths) -> bool:
    if not paths.socket.exists():
        return False
    try:
        return bool(docker_client(f"unix://{paths.socket}", timeout=5).ping())
    except Exception:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def log_tail(path: Path, lines: int = 8) -> str:
    """The last ``lines`` of a daemon's log ``path`` on one line (" | " between them), or "(no log)"."""
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- the trial containers either engine holds -------------------------------------

# Every trial container carries TRIAL_LABEL; RUN_LABEL names its run, HARNESS_LABEL the harness process
# that made it (cutbench.procs.identity: pid and start time), so what a killed harness left is known.
TRIAL_LABEL = "cutbench"
RUN_LABEL = "cutbench.run"
HARNESS_LABEL = "cutbench.harness"


@dataclass(frozen=True)
class TrialContainer:
    """A trial container as an engine lists it."""

    engine: str
    name: str
    run: str  # its run id ("" on a container made before runs were labelled)
    harness: str  # the identity of the harness that made it ("" likewise)
    running: bool


def trial_containers() -> list[TrialContainer]:
    """Every container labelled ``cutbench`` in the project's Docker engine (when one answers) and in Podman
    (when installed); never starts an engine, never raises."""
    found: list[TrialContainer] = []
    try:
        client = docker_client(timeout=5)
        client.ping()
        for c in client.containers.list(all=True, filters={"label": TRIAL_LABEL}):
            labels = c.labels or {}
            found.append(TrialContainer("docker", c.name, labels.get(RUN_LABEL, ""), labels.get(HARNESS_LABEL, ""),
                                        c.status == "running"))
    except Exception:
        pass  # no Docker engine answers (or no SDK): nothing of it to list
    if shutil.which("podman"):
        try:
            p = subprocess.run(["podman", "ps", "--all", "--filter", f"label={TRIAL_LABEL}", "--format", "json"],
                               capture_output=True, text=True, timeout=60)
            for c in json.loads(p.stdout or "[]"):
                labels = c.get("Labels") or {}
                names = c.get("Names") or [""]
                found.append(TrialContainer("podman", names[0], labels.get(RUN_LABEL, ""), labels.get(HARNESS_LABEL, ""),
                                            str(c.get("State", "")).lower() == "running"))
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return found


def remove_container(container: TrialContainer) -> None:
    """Stop and remove ``container`` for good; an absent one is no error, and nothing raises."""
    if container.engine == "docker":
        try:
            docker_client(timeout=30).api.remove_container(container.name, force=True)
        except Exception:
            pass
    else:
        try:
            subprocess.run(["podman", "rm", "--force", "--ignore", container.name], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass  # the sweep says what is left: the next one tries again
