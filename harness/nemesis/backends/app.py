"""``app``: application-level checkpoints, the baseline every transparent tool is compared with.

The workload saves and loads its own state, at op boundaries only
(``save_state(path)`` / ``load_state(path) -> op``; see
:meth:`cutbench.workloads.runtime.Runtime.boundary`). A cut asks for a save (control
slots ``save_seq``/``save_hold``, the path in the control text area),
releases the park, and waits for the workload to finish its op and save:
wherever the cut was placed inside an op, the checkpoint is the boundary after
it. With ``kill`` the workload waits at that boundary until it is killed;
with ``leave_running`` and ``none`` it goes on. Restore starts a fresh
process of the same command with ``--resume STATE``: new buffers, new device
pointers, by design (pointer identity is judged within the new process).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cutbench.harness.nemesis.base import Capabilities, CutContext, dir_bytes
from cutbench.errors import HarnessFault, StageFailed, StageRefused
from cutbench.procs import Child, spawn

POLL_S = 0.001
STATE_FILE = "app_state"


class AppCheckpointer:
    """The ``app`` backend (see module docstring)."""

    name = "app"
    # What the workload's own save covers is the workload's business; the
    # receiver stays outside any checkpoint.
    capabilities = Capabilities(
        faults=frozenset({"kill", "leave_running", "none"}),
        stages=("app_save", "app_restore"),
        # Its save at an op boundary holds no device work mid-flight (device_work) either.
        covers=frozenset({"cpu", "cuda", "ipc", "peer", "uvm", "disk", "device_work"}),
        workload_changes="save_state/load_state hooks in the workload (docs/workload-api.md)",
        semantic_adapters=False,  # the application's own checkpoint is the cut
    )

    def __init__(self) -> None:
        self._command: tuple[list[str], str] | None = None

    def unavailable_reason(self) -> str | None:
        """Always available: it needs nothing but the workload."""
        return None

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stage ``app_save``: request a save at the next op boundary and wait for it (a program that knows nothing
        of cutbench saves on its own schedule: nothing to request)."""
        if ctx.program is not None:
            if not ctx.program.resume_args:
                raise StageRefused("app_save", "the program declares no restart of its own (workload.params.resume, "
                                               "e.g. [\"-cpi\", \"md.cpt\"])")
            with ctx.timeline.stage("app_save", ctx.cut_index) as extra:
                extra["detail"] = "the program's own checkpoint, on its own schedule"
            ctx.facts["image_bytes"] = 0
            return
        control = ctx.control
        if control is None:
            raise HarnessFault("app_save", "no control channel to the workload")
        if ctx.cut.remaps:
            raise StageRefused("app_save", "the app backend restores on the same device only")
        self._command = command_of(target.pid, "app_save")
        ctx.images_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.images_dir / STATE_FILE
        control.set_text(str(path))
        control.set("save_hold", 1 if ctx.cut.fault == "kill" else 0)
        seq = control.get("save_seq") + 1
        control.set("save_seq", seq)
        if ctx.release is not None:
            ctx.release()  # the save happens when the current op is complete
        deadline = time.monotonic() + ctx.stage_timeout_s
        with ctx.timeline.stage("app_save", ctx.cut_index) as extra:
            while True:
                saved = control.get("saved_seq")
                if saved == seq:
                    break
                if saved == -seq:
                    raise StageRefused("app_save", "the workload does not implement save_state")
                if not target.alive():
                    raise StageFailed("app_save", f"workload exited ({target.returncode}) before saving")
                if time.monotonic() > deadline:
                    raise StageFailed("app_save", f"no save within {ctx.stage_timeout_s:g}s")
                time.sleep(POLL_S)
            extra["bytes"] = dir_bytes(ctx.images_dir)
            extra["detail"] = f"saved after op {control.get('saved_op')}"
        ctx.facts["image_bytes"] = extra["bytes"]
        ctx.mark("app_save", op=control.get("saved_op"), phase="")  # the state after that op, complete

    def restore(self, ctx: CutContext) -> int:
        """Stage ``app_restore``: start the workload again with ``--resume``; returns once it loaded the state (a
        program: started again with its own restart flag)."""
        if ctx.program is not None:
            with ctx.timeline.stage("app_restore", ctx.cut_index) as extra:
                child = ctx.program.start(ctx.program.resume_args)
                extra["pid"] = child.pid
            return child.pid
        control = ctx.control
        if self._command is None or control is None:
            raise HarnessFault("app_restore", "no saved command line to restart")
        argv, cwd = self._command
        return start_until(ctx, "app_restore", [*argv, "--resume", str(ctx.images_dir / STATE_FILE)], cwd, "load_count",
                           "loading").pid

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Nothing to undo: the workload saved and went on."""

    def cleanup(self, ctx: CutContext) -> None:
        """Never leave a workload held at a boundary."""
        if ctx.control is not None:
            ctx.control.set("save_hold", 0)


def start_until(ctx: CutContext, stage: str, argv: list[str], cwd: str, slot: str | tuple[str, ...], doing: str) -> Child:
    """Stage ``stage``: start ``argv`` and wait until the workload bumps control slot ``slot`` (or one of the
    slots ``slot`` names); returns the child.

    A child that exits first, or does not get there within the stage timeout
    (it is killed), fails the stage: the application is not back.
    """
    control = ctx.control
    slots = (slot,) if isinstance(slot, str) else slot

    def count() -> int:
        return sum(control.get(s) for s in slots)

    before = count()
    deadline = time.monotonic() + ctx.stage_timeout_s
    with ctx.timeline.stage(stage, ctx.cut_index) as extra:
        child = spawn(argv, cwd=cwd)
        extra["pid"] = child.pid  # the new workload process: its start-up is this stage's workload CPU
        while count() <= before:
            if not child.alive():
                raise StageFailed(stage, f"the started workload exited ({child.returncode}) before {doing}")
            if time.monotonic() > deadline:
                child.kill()
                raise StageFailed(stage, f"the started workload was not {doing} within {ctx.stage_timeout_s:g}s")
            time.sleep(POLL_S)
    return child


def command_of(pid: int, stage: str) -> tuple[list[str], str]:
    """The command line (without an earlier ``--resume``) and working directory of ``pid``, read in ``stage``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError as exc:
        raise HarnessFault(stage, f"cannot read the workload's command line: {exc}") from exc
    if "--resume" in argv:
        argv = argv[: argv.index("--resume")]
    return argv, cwd
