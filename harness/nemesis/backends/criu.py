"""``criu``: CRIU alone, for CPU workloads (on a GPU workload it should refuse).

Dump options: ``--tcp-established`` because the workload holds a TCP
connection to the receiver, ``--network-lock nftables`` because these hosts
may have no iptables binary (CRIU's nftables lock is built in). After a
``kill`` fault the connection is restored established (CRIU killed the task
while the network was locked, so the peer never saw it go). After a
``leave_running`` crash the original connection was closed by the kernel and
its 4-tuple sits in TIME_WAIT, so ``--tcp-established`` restore fails with
"Can't connect inet socket back"; the restore uses ``--tcp-close`` instead and
the workload's client sees a dead socket, reconnects and resends — which is
exactly the application's real recovery path.

In a parallel run the workload's root is the init of a PID namespace of its
own (``cutbench.procs``): CRIU dumps that namespace with the tree and restores
it as a new one (namespace-local pids kept, new host pids), and ``--pidfile``
names the restored init's host pid. Nothing here depends on the host pids
staying the same, which is why this backend declares ``pid_namespace``; a
subclass (a CRIU plugin that may track host pids) declares it itself.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cutbench.harness.nemesis.base import Capabilities, CutContext, dir_bytes
from cutbench.harness.nemesis.probe_kit import release_network_lock
from cutbench.errors import HUNG_MARK, HarnessFault, StageFailed, StageRefused, Unavailable, hung_reason
from cutbench import procs
from cutbench.procs import Child

NETWORK_LOCK = "nftables"


def _criu_argv() -> tuple[str, ...]:
    from cutbench.harness.provision.criu import locate

    return locate.require_criu().argv


def criu_error_tail(log: Path, limit: int = 6) -> str:
    """The last error lines of a CRIU log (for a stage's error field)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"no log at {log}"
    errors = [ln.strip() for ln in lines if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return " | ".join((errors or lines)[-limit:])


def run_criu(args: list[str], *, timeout: float, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run CRIU with ``args`` (``pass_fds`` open in it: ``--inherit-fd``'s); a timeout becomes a CompletedProcess
    with returncode -9.

    CRIU's CPU-seconds, faults and bytes written (its helpers' included) are
    credited to the calling trial's stage as role ``criu`` (``cpu_account.run_measured``).
    """
    from cutbench.harness.nemesis.cpu_account import run_measured

    argv = list(_criu_argv()) + args
    try:
        return run_measured(argv, role="criu", timeout=timeout, pass_fds=pass_fds)
    except subprocess.TimeoutExpired as exc:
        # run_measured (text mode) raises with its output decoded; TimeoutExpired itself allows bytes.
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return subprocess.CompletedProcess(argv, -9, out, hung_reason(f"criu {args[0] if args else ''}".strip(), timeout))


class CriuCheckpointer:
    """CRIU dump/restore of the workload's process tree."""

    name = "criu"
    capabilities = Capabilities(stages=("criu_dump", "criu_restore"), covers=frozenset({"cpu", "ipc"}),
                                tools=frozenset({"criu"}))
    # Extra CRIU options for dump and restore (a subclass adds a plugin directory).
    extra_args: tuple[str, ...] = ()
    # Extra options for dump only (e.g. ``--ghost-limit``).
    dump_args: tuple[str, ...] = ()
    # The workload may run as the init of its own PID namespace (a parallel run; see the module docstring).
    pid_namespace: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Not inherited: a subclass adds what it drives (a plugin), and only it knows whether that copes
        # with host pids that change across a restore.
        super().__init_subclass__(**kwargs)
        cls.pid_namespace = cls.__dict__.get("pid_namespace", False)

    def unavailable_reason(self) -> str | None:
        """Why CRIU cannot be used here (with the fix), or None."""
        try:
            _criu_argv()
        except Unavailable as exc:
            return str(exc)
        return None

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stage ``criu_dump``: dump the target's tree (``--leave-running`` unless the fault is ``kill``)."""
        self.dump(target, ctx, leave_running=ctx.cut.fault != "kill")

    def dump(self, target: Child, ctx: CutContext, *, leave_running: bool) -> None:
        """Run ``criu dump`` of ``target`` into ``ctx.images_dir``; refuses cleanly if the target survives a failure."""
        images = ctx.images_dir
        images.mkdir(parents=True, exist_ok=True)
        # --skip-in-flight: a connection still waiting in a listening socket's queue (a client of a server that
        # is being cut) is left out, and its client sees it reset; without it CRIU refuses the whole dump
        # ("In-flight connection (l)"), whatever the program.
        args = ["dump", "-t", str(target.pid), "-D", str(images), "-o", "dump.log", "-v2",
                "--tcp-established", "--skip-in-flight", "--network-lock", NETWORK_LOCK]
        if leave_running:
            args.append("--leave-running")
        if _inherits_session(target.pid):
            # One process of a tree (a single rank): its session leader is not
            # in the image, so CRIU must treat it as a shell job on both sides.
            args.append("--shell-job")
            ctx.facts["shell_job"] = 1
        args += self.extra_args
        args += self.dump_args
        args += ctx.criu_options  # the scenario's, last: an option it repeats (--ghost-limit) is its value
        if ctx.freeze is not None:
            ctx.freeze()  # a program held at a system call: stopped whole, the tracer gone, before CRIU seizes it
        ctx.mark("criu_freeze")  # the CPU image is taken at this position
        with ctx.timeline.stage("criu_dump", ctx.cut_index) as extra:
            proc = run_criu(args, timeout=ctx.stage_timeout_s)
            if proc.returncode != 0:
                reason = f"criu dump exit {proc.returncode}: {_words(proc, images / 'dump.log')}"
                # CRIU resumes the tree when a dump fails; if it is running, the
                # tool declined and the workload went on: a safe refusal.
                if target.alive():
                    raise StageRefused("criu_dump", reason)
                raise dump_failure("criu_dump", reason, target)
            extra["bytes"] = dir_bytes(images)
            ctx.facts["image_bytes"] = extra["bytes"]

    def restore(self, ctx: CutContext) -> int:
        """Stage ``criu_restore``: restore detached; returns the restored root pid."""
        images = ctx.images_dir
        pidfile = images / "restored.pid"
        pidfile.unlink(missing_ok=True)
        tcp = "--tcp-established" if ctx.cut.fault == "kill" else "--tcp-close"
        args = ["restore", "-D", str(images), "-d", "--pidfile", str(pidfile), "-o", "restore.log", "-v2",
                tcp, "--network-lock", NETWORK_LOCK, *self.extra_args, *ctx.criu_options]
        if ctx.facts.get("shell_job"):
            args.append("--shell-job")
        # A program's output pipes, whose reader (the harness) is outside the tree: the restored program writes on
        # into fresh ones; without them it would find no reader (docs/criu.md, "A program's stdout").
        inherited = ctx.program.inherited_fds() if ctx.program is not None else []
        for key, fd in inherited:
            args += ["--inherit-fd", f"fd[{fd}]:{key}"]
        with ctx.timeline.stage("criu_restore", ctx.cut_index) as extra:
            try:
                proc = run_criu(args, timeout=ctx.stage_timeout_s, pass_fds=tuple(fd for _key, fd in inherited))
            finally:
                if ctx.program is not None:
                    ctx.program.restored()
            if proc.returncode != 0:
                raise restore_failure("criu_restore", f"criu restore exit {proc.returncode}: "
                                                      f"{_words(proc, images / 'restore.log')}", ctx)
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError) as exc:
                raise StageFailed("criu_restore", f"no pid file after restore: {exc}") from exc
            # The restored tree is a new process (a new host pid in a PID namespace of its own): what it spent
            # being restored (CRIU's restorer runs in it) counts in this stage, as the workload's.
            extra["pid"] = pid
            return pid

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Nothing to undo: ``dump --leave-running`` already resumed the tree."""

    def cleanup(self, ctx: CutContext) -> None:
        """The network lock of a dump that stopped its tree and was never restored (a restore removes its own);
        the images directory is the pipeline's to remove. Never raises."""
        if ctx.cut.fault == "kill" and not ctx.restored:
            release_network_lock(ctx.images_dir)


def dump_failure(stage: str, reason: str, target: Child) -> StageFailed:
    """The outcome of a dump (a checkpoint) that failed for ``reason`` and left ``target`` gone: the tool's failure
    (:class:`StageFailed`: the workload did not survive it), unless the workload had exited 0 on its own — an
    asynchronous cut that landed as the program finished, gone before the tool got to it, which is no claim about
    the tool (:class:`HarnessFault`: the trial is unknown)."""
    if target.returncode == 0:
        return HarnessFault(stage, f"the workload ended on its own (exit 0) while it was being dumped: the cut came "
                                   f"after its end, no claim about the tool; {reason}")
    return StageFailed(stage, reason + " (the workload did not survive)")


def restore_failure(stage: str, reason: str, ctx: CutContext) -> StageFailed:
    """The outcome of a restore that failed for ``reason``: the tool's failure (:class:`StageFailed`), unless
    the words name a file of the trial's own directory (:func:`trial_file_in`): then the image held such a
    file open — the runtime's report being written, a log line, a workload that broke the rule — and it
    changed after the dump, which is no claim about the tool (:class:`HarnessFault`: the trial is unknown);
    or unless CRIU found a pid of the image taken (:func:`taken_pid`): it restores every process with the pid
    it had, and which processes run beside the restore is the harness's and the machine's doing."""
    taken = taken_pid(reason)
    if taken is not None:
        holder = procs.holder(taken) or "a process gone by the time the harness looked"
        return HarnessFault(stage, f"pid {taken}, which the image's tree had, was taken at the restore, by {holder}: "
                                   f"CRIU restores each process with its own pid, so no claim about the tool; {reason}")
    artefact = trial_file_in(reason, ctx)
    if artefact:
        return HarnessFault(stage, f"the image holds {artefact}, a file of the trial directory that changed after the "
                                   f"dump (the workload runtime's or the workload's own, open at the cut), so it "
                                   f"cannot be restored: {reason}")
    return StageFailed(stage, reason)


# CRIU's words when a pid of the image is held by another process at the restore (criu/cr-restore.c).
TAKEN_PID = re.compile(r"Can't fork for (\d+): File exists")


def taken_pid(reason: str) -> int | None:
    """The pid a failed restore's words say was taken ("Can't fork for 5312: File exists"), or None."""
    found = TAKEN_PID.search(reason)
    return int(found.group(1)) if found else None


def trial_file_in(reason: str, ctx: CutContext) -> str:
    """The path of a file in the trial's directory that a failed restore's words name, or "" when none does.

    The trial's directory holds the control file, the report, the marker, the log and what the workload
    keeps outside its image; CRIU restores a file a process held open only as it was, so one of them
    changed after a dump (a report renamed into place, a log line appended) fails the restore for a
    reason that is the harness's or the workload's, never the tool's.
    """
    control = getattr(ctx.control, "path", None)
    if control is None:
        return ""
    tdir = str(Path(control).parent).strip("/")
    # Only CRIU's words about a regular file it restores ("Can't open file …", "File … has bad size"): a
    # failure that merely mentions the trial directory (a container's bind mount of it) is still the tool's.
    for part in reason.split("|"):
        if "file" not in part.lower():
            continue
        for word in part.replace("'", " ").replace('"', " ").split():
            # CRIU names paths relative to the root ("tmp/cutbench-…/t0001/held.txt").
            if word.lstrip("/").startswith(tdir + "/"):
                return "/" + word.lstrip("/").rstrip(":,;)")
    return ""


def _words(proc: subprocess.CompletedProcess[str], log: Path) -> str:
    """What a failed CRIU said: that it hung (past its time limit), else the error lines of its log."""
    if proc.returncode == -9 and HUNG_MARK in (proc.stderr or ""):
        return f"{proc.stderr}; {criu_error_tail(log)}"
    return criu_error_tail(log)


def _inherits_session(pid: int) -> bool:
    """True when ``pid`` is not the leader of its own session (it belongs to its parent's)."""
    try:
        return os.getsid(pid) != pid
    except OSError:
        return False
