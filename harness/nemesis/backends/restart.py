"""``restart``: what a scheduler's requeue does — kill the job and start it again from the beginning.

The floor every checkpoint tool is compared with: no image at all. The cut
takes nothing but the workload's command line; after the fault the workload is
started again, fresh, from op 1, and recomputes everything, unless the program
has its own restart path (``continue_from_own_checkpoint``: a simulation's
checkpoint file, a training script's resume), which continues after the op its
own last checkpoint holds. The ops recomputed (up to the cut) are the trial's
``recomputed_ops``. It keeps no
in-process state from the crashed run, so nothing in the process is stale
(it declares ``cpu``, ``cuda`` and ``ipc`` covered); what the crashed run left
outside it — effects at the receiver, files — it meets again. The oracle
reports every trial that began at op 1 again ``restarted`` (from the workload's own
count of fresh starts, not from this backend's word): that is what a restart is.
"""

from __future__ import annotations

import time

from cutbench.errors import HarnessFault, StageFailed, StageRefused
from cutbench.harness.nemesis.backends.app import POLL_S, command_of, start_until
from cutbench.harness.model.plan import position
from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.procs import Child


class RestartCheckpointer:
    """The ``restart`` backend (see module docstring)."""

    name = "restart"
    capabilities = Capabilities(
        faults=frozenset({"kill", "leave_running"}),
        stages=("restart_record", "restart_spawn", "restart_catch_up"),
        covers=frozenset({"cpu", "cuda", "ipc"}),
        semantic_adapters=False,  # a fresh start: no image for an adapter to join
    )

    def __init__(self) -> None:
        self._command: tuple[list[str], str] | None = None

    def unavailable_reason(self) -> str | None:
        """Always available: it needs nothing but the workload."""
        return None

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stage ``restart_record``: note the command line to start again (there is no image)."""
        if ctx.cut.remaps:
            raise StageRefused("restart_record", "the restart backend starts the job on the same device only")
        with ctx.timeline.stage("restart_record", ctx.cut_index):
            self._command = command_of(target.pid, "restart_record")
        ctx.facts["image_bytes"] = 0

    def restore(self, ctx: CutContext) -> int:
        """Stage ``restart_spawn``: start the workload again from op 1; returns once it is up (a program: once
        it has shown as many effects again as it had at the cut)."""
        if ctx.program is not None:
            return self._restart_program(ctx)
        control = ctx.control
        if self._command is None or control is None:
            raise HarnessFault("restart_spawn", "no command line recorded to start again")
        argv, cwd = self._command
        # Started afresh, the job either begins at op 1 or, where the program has a restart path, continues
        # from its own checkpoint on disk: either is "running".
        resumes = control.get("own_resumes")
        child = start_until(ctx, "restart_spawn", argv, cwd, ("fresh_starts", "own_resumes"), "running")
        after = control.get("own_resumed_op") if control.get("own_resumes") > resumes else 0
        ctx.facts["recomputed_ops"] = int(ctx.facts.get("recomputed_ops", 0)) + max(0, ctx.cut.op - after)
        try:
            self._catch_up(child, ctx)
        except BaseException:
            child.kill()  # no handle of the trial knows this pid yet: nothing else would stop it
            raise
        return child.pid

    def _restart_program(self, ctx: CutContext) -> int:
        """Start the program again from the beginning and wait (``restart_catch_up``) until it has shown the
        effects seen at the cut again (``at_cut``); returns its pid. Exiting non-zero, or not getting there in
        time, fails the stage; exiting 0 first ends the wait (it ran to its end, its last lines still on their
        way to the observer), and the trial's handle collects that exit."""
        program = ctx.program
        assert program is not None
        with ctx.timeline.stage("restart_spawn", ctx.cut_index) as extra:
            child = program.start()
            extra["pid"] = child.pid
        deadline = time.monotonic() + ctx.stage_timeout_s
        with ctx.timeline.stage("restart_catch_up", ctx.cut_index) as extra:
            extra["pid"] = child.pid
            while program.catches_up and program.shown() < program.at_cut:
                code = child.peek()  # not collected: the trial's handle, pointed at this pid, does that
                if code == 0:
                    extra["detail"] = "the started program ran to its end"
                    break
                if code is not None:
                    child.alive()  # collect it
                    raise StageFailed("restart_catch_up", f"the started program exited ({code}) after "
                                                          f"{program.shown()} of {program.at_cut} effects")
                if time.monotonic() > deadline:
                    child.kill()
                    raise StageFailed("restart_catch_up", f"the started program did not show {program.at_cut} "
                                                          f"effects within {ctx.stage_timeout_s:g}s")
                time.sleep(POLL_S)
        return child.pid

    def _catch_up(self, child: Child, ctx: CutContext) -> None:
        """Stage ``restart_catch_up``: wait until the new process stands at the cut point again.

        It recomputes ops 1..k and parks there (the cut is still armed and held)
        or, for an asynchronous cut, passes it. A process that exits or does
        not get there within the stage timeout fails the stage.
        """
        control, phases = ctx.control, ctx.phases
        target = position(ctx.cut, phases) if phases else None
        deadline = time.monotonic() + ctx.stage_timeout_s
        # The slots still hold where the crashed process got to: only progress since is the new one's.
        stale = control.get("progress_count")
        with ctx.timeline.stage("restart_catch_up", ctx.cut_index) as extra:
            extra["pid"] = child.pid  # not yet the trial's workload: its recomputation is this stage's CPU
            while target is not None:
                moved = control.get("progress_count") != stale
                if moved and control.position(len(phases)) >= target:
                    return
                if not child.alive():
                    raise StageFailed("restart_catch_up", f"the started workload exited ({child.returncode}) before op {ctx.cut.op}")
                if time.monotonic() > deadline:
                    raise StageFailed("restart_catch_up", f"the started workload was not back at {ctx.cut.op}/{ctx.cut.phase} "
                                                          f"within {ctx.stage_timeout_s:g}s")
                time.sleep(POLL_S)

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Never called: fault ``none`` is not offered (a restart without a crash is no restart)."""

    def cleanup(self, ctx: CutContext) -> None:
        """Nothing: no image is written."""

