"""``cuda+criu``: the composed pipeline, the only one with a split window.

    cuda_lock → cuda_checkpoint → split_window Δ → criu_dump
            → fault → criu_restore → cuda_restore (remap?) → cuda_unlock

(the pipeline adds the semantic adapters' ``prepare`` before and ``commit`` or ``restored`` after).

``cuda_lock``/``cuda_checkpoint`` cut the GPU side (every CUDA process of the
workload's tree; see :mod:`cutbench.harness.nemesis.backends.cuda`). The split window
releases the workload's park *before* the CPU cut, so host threads run — and
may publish — between the CUDA cut and the CRIU dump; CUDA calls made in that
gap block on the lock. CRIU dump and restore are
:class:`~cutbench.harness.nemesis.backends.criu.CriuCheckpointer`'s.

With ``leave_running`` the dumped process keeps running, but its GPU state is
CHECKPOINTED: it is restored and unlocked in place right after the dump
(stages ``cuda_restore_original``/``cuda_unlock_original``) so it can run on
until the crash. With ``none`` the same happens under the plain stage names
(suspend/resume). Either way before the pipeline releases the workload: a
process that makes a CUDA call while CHECKPOINTED was seen to die.
"""

from __future__ import annotations

import signal
import time

from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.nemesis.backends.cuda import CUDA_STAGES, CudaCheckpointer
from cutbench.harness.nemesis.backends.cuda_driver import DriverApi
from cutbench.errors import HarnessFault, RemapRefused, StageFailed, StageRefused
from cutbench.procs import Child, process_tree

GHOST_LIMIT = "512M"

class CudaCriuCheckpointer(CudaCheckpointer):
    """The ``cuda+criu`` backend (see module docstring)."""

    name = "cuda+criu"
    capabilities = Capabilities(
        faults=frozenset({"kill", "leave_running", "none"}),
        split_window=True,
        drives_cuda=True,
        stages=CUDA_STAGES + ("split_window", "criu_dump", "criu_restore"),
        covers=frozenset({"cpu", "ipc", "cuda"}),
        tools=frozenset({"criu"}),
    )

    def __init__(self, driver: DriverApi | None = None, criu: CriuCheckpointer | None = None):
        super().__init__(driver)
        self.criu = criu or CriuCheckpointer()
        # NCCL keeps unlinked buffers in /dev/shm (34 MB seen); CRIU's default
        # limit for such "ghost" files is 1 MiB.
        self.criu.dump_args = ("--ghost-limit", GHOST_LIMIT)

    def unavailable_reason(self) -> str | None:
        """Why either half cannot run here (with the fix), or None."""
        return super().unavailable_reason() or self.criu.unavailable_reason()

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """CUDA cut, split window, CRIU dump; with ``leave_running`` the original is resumed on the GPU."""
        procs = self.cuda_cut(target, ctx)
        window = ctx.cut.split_window_ms / 1000.0
        if window > 0:
            if ctx.release is not None:
                ctx.release()  # host code runs into the gap between the CUDA and the CPU cut
            with ctx.timeline.stage("split_window", ctx.cut_index) as extra:
                time.sleep(window)
                extra["detail"] = f"{ctx.cut.split_window_ms:g}ms"
        leave_running = ctx.cut.fault != "kill"
        try:
            self.criu.dump(target, ctx, leave_running=leave_running)
        except StageRefused as exc:
            # CRIU declined and resumed the tree: put the GPU side back too.
            states = self.stages.bring_back()
            if not all(s == "running" for s in states):
                raise StageFailed(exc.stage, f"{exc.reason}; CUDA states after: {states}") from exc
            raise
        if ctx.thaw is not None and ctx.cut.fault != "kill":
            ctx.thaw(target.pid)  # a program held at a system call: its CUDA threads run again, the call stays held
        if ctx.cut.fault == "none":
            self.resume_cuda(target.pid, ctx)  # suspend/resume: back on the GPU before it is released
        elif ctx.cut.fault == "leave_running":
            self.stages.resume(procs.pids, ctx, suffix="_original")

    def cleanup(self, ctx: CutContext) -> None:
        """The CUDA side's (no process left LOCKED or CHECKPOINTED), then CRIU's (its network lock); never raises."""
        super().cleanup(ctx)
        self.criu.cleanup(ctx)

    def restore(self, ctx: CutContext) -> int:
        """Run ``criu_restore``, then ``cuda_restore`` (remapped when asked) and ``cuda_unlock``; returns the root pid.

        A restored tree whose GPU state cannot be brought back is killed (and
        reaped) before :class:`StageFailed` is raised: nothing stays behind.
        """
        pid = self.criu.restore(ctx)
        try:
            if ctx.thaw is not None:
                ctx.thaw(pid)  # restored stopped at its held call: its CUDA threads run again for the CUDA restore
            procs = self.stages.procs
            if procs is None:
                raise HarnessFault("cuda_restore", "no record of the checkpointed CUDA processes")
            tree = process_tree(pid)
            if [p for p in procs.pids if p in tree] != procs.pids:
                raise StageFailed("cuda_restore", f"restored tree {tree} lacks CUDA pids {procs.pids}")
            self.restore_cuda(procs.pids, ctx, procs.pairs, resumed_pid=pid)
        except RemapRefused:
            raise  # the restored tree runs on its own GPU: the pipeline keeps it
        except BaseException:
            _kill_tree(pid)
            self.stages.actions.append(f"kill the restored tree of pid {pid}, whose GPU state did not come back")
            raise
        return pid


def _kill_tree(root: int) -> None:
    """SIGKILL a restored tree (children first) and reap what is ours."""
    import os

    for pid in reversed(process_tree(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    Child(pid=root).wait(5.0)
