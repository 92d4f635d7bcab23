"""Slurm for the ``slurm`` backend: which cluster a trial submits to, and a local one of the project's own.

A Slurm client finds its cluster through ``SLURM_CONF`` (else its built-in
``/etc/slurm/slurm.conf``); the backend does the same, so a user's own
cluster is used as any ``sbatch`` uses it. ``cutbench slurm up`` starts a
cluster of one node on this machine for a user who has none (``munged``,
``slurmctld`` and ``slurmd`` from Debian's packages, their state under
:func:`~cutbench.harness.provision.engines.state_root`), and the backend finds
it without configuration while it runs; ``cutbench slurm down`` cancels its
jobs and stops it.

Its configuration is the one a preemption policy needs (``slurm.conf``
below): two partitions on the one node, ``low`` (preemptible, jobs requeued,
a grace time) and ``high``; ``PreemptType=preempt/partition_prio``,
``PreemptMode=REQUEUE``, and ``preempt_send_user_signal`` (as sites set it
for checkpointing job scripts; measured with 22.05.8, a job's
``--signal=B:USR1`` still did not reach its batch script at a preemption:
Slurm signals the job's steps only). Process tracking is
``proctrack/linuxproc`` (the job's processes are its batch script's
descendants: no cgroup is needed, and none may be mounted here).

Its programs are Debian's, installed (``apt-get install``) or carried (``cutbench slurm install``, a bundle under a
prefix: :mod:`cutbench.harness.provision.slurm_bundle`); a bundle wins where there is one, as a bundled CRIU does,
and is put first on the ``PATH`` of the daemons, the clients and the jobs (whose scripts call ``scontrol``, ``srun``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cutbench.errors import Unavailable
from cutbench.harness.provision import slurm_bundle
from cutbench.harness.provision.engines import log_tail, state_root
from cutbench.procs import is_zombie_or_gone

# The two partitions of the project's cluster: jobs in LOW are preempted (requeued) by jobs in HIGH.
LOW, HIGH = "low", "high"
# Seconds between the preemption's signal and the kill (PartitionName=low GraceTime): the job script's time to save.
# Sites give minutes; this cluster is for trials and tests, whose programs save in milliseconds.
GRACE_S = 3
# Seconds between the kill's SIGTERM and its SIGKILL (KillWait).
KILL_WAIT_S = 2
# Its ports: off Slurm's defaults (6817, 6818), so that a system Slurm on this machine is left alone.
PORTS = (16817, 16818)
PACKAGES = "slurmctld slurmd slurm-client munge"
INSTALL_FIX = (f"`apt-get install {PACKAGES}` (Debian's), `make slurm` in a checkout, or `cutbench slurm install` "
               "(Debian's packages into a prefix, for a machine without them)")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
DAEMONS = ("munged", "slurmctld", "slurmd")

SLURM_CONF = """\
# The project's local Slurm (cutbench slurm up): one node, two partitions, preemption by partition priority.
ClusterName=cutbench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
{plugin_dir}ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,preempt_send_user_signal
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
KillWait={kill_wait}
MinJobAge=300
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={low} Nodes={host} Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace} State=UP
PartitionName={high} Nodes={host} PriorityTier=10 PreemptMode=OFF State=UP
"""


@dataclass(frozen=True)
class SlurmPaths:
    """The files of the project's local cluster."""

    root: Path

    @property
    def conf(self) -> Path:
        """Its ``slurm.conf`` (``SLURM_CONF`` for its clients)."""
        return self.root / "slurm.conf"

    @property
    def munge_key(self) -> Path:
        """The key its daemons and clients authenticate with."""
        return self.root / "munge" / "munge.key"

    @property
    def munge_socket(self) -> Path:
        """Where ``munged`` answers."""
        return self.root / "munge" / "munge.socket"

    def pidfile(self, daemon: str) -> Path:
        """Where ``daemon`` writes its pid."""
        return self.root / (f"munge/{daemon}.pid" if daemon == "munged" else f"{daemon}.pid")

    def log(self, daemon: str) -> Path:
        """Return ``daemon``'s own log (read it when the cluster does not come up)."""
        return self.root / f"{daemon}.log"


def slurm_paths() -> SlurmPaths:
    """The paths of the project's local cluster (under :func:`state_root`)."""
    return SlurmPaths(state_root() / "slurm")


def programs_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (default the caller's environment) with a bundled Slurm's wrappers first on ``PATH`` where one is
    installed: the environment Slurm's programs are found in, and that a job inherits."""
    env = dict(os.environ if base is None else base)
    bundle = slurm_bundle.bundled()
    if bundle is not None:
        env["PATH"] = f"{bundle.bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def which(name: str, env: dict[str, str] | None = None) -> str | None:
    """The file Slurm program ``name`` runs from (a bundle's wrapper, else on ``PATH``), or None."""
    return shutil.which(name, path=(env or programs_env()).get("PATH"))


def client_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a Slurm client of the trials runs with: ``base`` (default the caller's; a job submitted with
    it inherits it) with a bundle's wrappers first on ``PATH``, and ``SLURM_CONF`` pointing at the project's
    cluster when none is set and that cluster's configuration exists."""
    env = programs_env(base)
    own = slurm_paths().conf
    if "SLURM_CONF" not in env and own.is_file():
        env["SLURM_CONF"] = str(own)
    return env


def which_cluster() -> str:
    """Which cluster :func:`client_env` reaches, in words: ``SLURM_CONF=…``, the project's, or the client's default."""
    env = client_env()
    if "SLURM_CONF" in os.environ:
        return f"SLURM_CONF={os.environ['SLURM_CONF']}"
    if "SLURM_CONF" in env:
        return f"the project's ({env['SLURM_CONF']})"
    return "the client's default (/etc/slurm/slurm.conf)"


def scontrol(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``scontrol ARGS`` against :func:`client_env`'s cluster; raises :class:`Unavailable` without a client."""
    return run_client("scontrol", *args, timeout=timeout)


def run_client(name: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run Slurm client ``name`` (``sbatch``, ``squeue``…) with ``args`` against :func:`client_env`'s cluster;
    returns what it did (never raises for its exit status). :class:`Unavailable` when it is not installed."""
    env = client_env()
    exe = which(name, env)
    if exe is None:
        raise Unavailable(f"Slurm's {name} is not installed; fix: {INSTALL_FIX}")
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([exe, *args], 124, "", f"{name} did not answer within {timeout:g}s")


def unavailable_reason() -> str | None:
    """Why no Slurm cluster takes jobs from here (with the fix), or None."""
    env = programs_env()
    missing = [c for c in CLIENTS if which(c, env) is None]
    if missing:
        return f"Slurm's clients are not installed ({', '.join(missing)}); fix: {INSTALL_FIX}"
    ping = scontrol("ping", timeout=15)
    if ping.returncode != 0 or "is UP" not in ping.stdout:
        said = (ping.stdout + ping.stderr).strip().splitlines()
        return (f"no slurmctld answers ({which_cluster()}: {said[-1] if said else f'exit {ping.returncode}'}); "
                "fix: `cutbench slurm up` (a local cluster of one node), or SLURM_CONF naming yours")
    return None


def partitions() -> dict[str, str]:
    """The cluster's partitions and their state (``{"low": "up", …}``); {} when it does not answer."""
    out = run_client("sinfo", "-h", "-o", "%R %a", timeout=15)
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        name, _, avail = line.strip().partition(" ")
        if name:
            found[name] = avail
    return found


def status() -> str:
    """One line: which cluster, whether it answers, its partitions."""
    why = unavailable_reason()
    if why:
        return f"slurm: {why}"
    parts = ", ".join(f"{name} ({avail})" for name, avail in partitions().items())
    bundle = slurm_bundle.bundled()
    programs = f"; Slurm {bundle.version} bundled under {bundle.prefix}" if bundle else ""
    return f"slurm: {which_cluster()} answers; partitions {parts or 'none'}{programs}"


def start(timeout_s: float = 60.0) -> bool:
    """Start the project's local cluster unless it answers already; True when this call started it.

    Raises :class:`Unavailable` naming the fix when a daemon is not installed, and with the tail of its log when
    it does not come up (whatever it did start is stopped again)."""
    paths = slurm_paths()
    if paths.conf.is_file() and _answers(paths):
        return False
    env = _daemon_env(paths)
    missing = [name for name in (*DAEMONS, *CLIENTS) if which(name, env) is None]
    if missing:
        raise Unavailable(f"Slurm is not installed ({', '.join(missing)} missing); fix: {INSTALL_FIX}")
    bundle = slurm_bundle.bundled()
    stop()  # what a killed start left (a daemon without its partner, stale pid files)
    for sub in ("state", "spool", "munge"):
        (paths.root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root / "munge", 0o700)  # munged refuses a key in a directory others may write
    if not paths.munge_key.is_file():
        paths.munge_key.write_bytes(secrets.token_bytes(1024))
        os.chmod(paths.munge_key, 0o400)
    paths.conf.write_text(SLURM_CONF.format(
        host=socket.gethostname().split(".")[0], ctld_port=PORTS[0], slurmd_port=PORTS[1], root=paths.root,
        munge_socket=paths.munge_socket, cpus=os.cpu_count() or 1, low=LOW, high=HIGH, grace=GRACE_S,
        kill_wait=KILL_WAIT_S, plugin_dir=f"PluginDir={bundle.plugin_dir}\n" if bundle else ""))
    commands = {
        "munged": ["munged", "--force", f"--socket={paths.munge_socket}", f"--key-file={paths.munge_key}",
                   f"--log-file={paths.log('munged')}", f"--pid-file={paths.pidfile('munged')}",
                   f"--seed-file={paths.root / 'munge' / 'seed'}"],
        "slurmctld": ["slurmctld"],
        "slurmd": ["slurmd", *(["-d", str(bundle.stepd)] if bundle else [])],
    }
    try:
        for daemon, argv in commands.items():
            # Each forks into the background itself once it is up; its exit status says whether it could.
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
            if done.returncode != 0:
                raise Unavailable(f"{daemon} did not start (exit {done.returncode}): "
                                  f"{(done.stderr or done.stdout).strip()[-400:]} | its log {paths.log(daemon)}: "
                                  f"{log_tail(paths.log(daemon))}")
        deadline = time.monotonic() + timeout_s
        while not _answers(paths, idle=True):
            if time.monotonic() > deadline:
                raise Unavailable(f"the local Slurm did not come up within {timeout_s:g}s; slurmctld's log "
                                  f"{paths.log('slurmctld')}: {log_tail(paths.log('slurmctld'))} | slurmd's: "
                                  f"{log_tail(paths.log('slurmd'))}")
            time.sleep(0.3)
    except BaseException:
        stop()
        raise
    return True


def stop(timeout_s: float = 30.0) -> bool:
    """Cancel the project's cluster's jobs and stop its daemons; True when one of them was running."""
    paths = slurm_paths()
    if paths.conf.is_file() and _answers(paths):
        env = _daemon_env(paths)
        subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=env, capture_output=True, timeout=30)
    stopped = [_stop_daemon(paths, daemon, timeout_s) for daemon in reversed(DAEMONS)]
    return any(stopped)


def _stop_daemon(paths: SlurmPaths, daemon: str, timeout_s: float) -> bool:
    """SIGTERM ``daemon`` by its pid file and wait for it (SIGKILL after ``timeout_s``); True when it ran."""
    try:
        pid = int(paths.pidfile(daemon).read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    paths.pidfile(daemon).unlink(missing_ok=True)
    return True


def restart_controller(down_s: float = 0.0, timeout_s: float = 60.0) -> None:
    """Stop the project's ``slurmctld`` and start it again ``down_s`` seconds later, its jobs left running
    (``slurmd`` keeps them; the controller reads its saved state back), as an operator's restart does. Raises
    :class:`Unavailable` when it does not answer again within ``timeout_s``."""
    paths = slurm_paths()
    _stop_daemon(paths, "slurmctld", timeout_s)  # not running: it is only started
    time.sleep(down_s)
    env = _daemon_env(paths)
    subprocess.run(["slurmctld"], env=env, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                   start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not _answers(paths, idle=True):
        if time.monotonic() > deadline:
            raise Unavailable(f"slurmctld did not answer again within {timeout_s:g}s: {log_tail(paths.log('slurmctld'))}")
        time.sleep(0.3)


def _daemon_env(paths: SlurmPaths) -> dict[str, str]:
    """The environment the cluster of ``paths`` runs in, and is asked in: its programs found, its configuration."""
    return {**programs_env(), "SLURM_CONF": str(paths.conf)}


def _answers(paths: SlurmPaths, idle: bool = False) -> bool:
    """Whether the cluster of ``paths`` answers (and, with ``idle``, its node takes jobs)."""
    env = _daemon_env(paths)
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=10)
        if "is UP" not in ping.stdout:
            return False
        if not idle:
            return True
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(state.strip().rstrip("*") in ("idle", "mixed", "allocated") for state in nodes.stdout.splitlines())


def _alive(pid: int) -> bool:
    """Whether daemon ``pid`` still runs (reaped first where this process started it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return not is_zombie_or_gone(pid)
