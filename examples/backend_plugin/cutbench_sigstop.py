"""``sigstop``: freeze the workload's process group in place and thaw it; nothing is saved.

The smallest complete cutbench backend, and a floor worth measuring: the
cost of stopping the world without checkpointing it. With no image there is
nothing to restore after a crash, so it declares fault ``none`` only, and
cutbench skips its ``kill`` and ``leave_running`` arms with that reason.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cutbench.backend import Capabilities, Child, CutContext, StageFailed


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is in the stopped state (``T`` in /proc/PID/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class SigstopCheckpointer:
    """SIGSTOP on the workload's process group at the cut, SIGCONT to resume."""

    name = "sigstop"
    capabilities = Capabilities(
        faults=frozenset({"none"}),
        stages=("sigstop_freeze", "sigstop_thaw"),
        # The process never leaves memory: everything it holds is still there.
        covers=frozenset({"cpu", "cuda", "ipc", "uvm", "shared_file"}),
    )

    def unavailable_reason(self) -> str | None:
        """Always available on Linux."""
        return None

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Stop the whole process group and wait until its leader reports stopped."""
        with ctx.timeline.stage("sigstop_freeze", ctx.cut_index):
            os.killpg(os.getpgid(target.pid), signal.SIGSTOP)
            deadline = time.monotonic() + ctx.stage_timeout_s
            while not _stopped(target.pid):
                if time.monotonic() > deadline:
                    raise StageFailed("sigstop_freeze", f"pid {target.pid} not stopped within {ctx.stage_timeout_s:g}s")
                time.sleep(0.001)

    def restore(self, ctx: CutContext) -> int:
        """Never called: the capabilities exclude every fault that needs a restore."""
        raise StageFailed("sigstop_restore", "sigstop saves nothing to restore from")

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Continue the process group."""
        with ctx.timeline.stage("sigstop_thaw", ctx.cut_index):
            os.killpg(os.getpgid(target.pid), signal.SIGCONT)

    def cleanup(self, ctx: CutContext) -> None:
        """Nothing was written."""
