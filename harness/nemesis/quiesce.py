"""Quiesce adapters, harness side: ask a workload to drain its device work before a CUDA lock.

A workload that keeps device work running indefinitely (a persistent kernel)
makes ``cuCheckpointProcessLock`` time out. If it registered a drain handler
(``Runtime.set_quiesce_handler``, which sets ``quiesce_capable`` in the
control file), :func:`drain` asks it to stop at an epoch boundary and waits
for the acknowledgement; :func:`undrain` lets it restart once the cut is over.
Workloads without a handler are left alone.
"""

from __future__ import annotations

import time

from cutbench.harness.nemesis.base import CutContext
from cutbench.errors import StageRefused

POLL_S = 0.0005


def drain(ctx: CutContext) -> bool:
    """Stage ``quiesce``: drain the workload if it can be drained; return whether it was.

    Raises :class:`StageRefused` when the workload does not acknowledge within
    the stage timeout (it keeps running: nothing was locked yet).
    """
    control = ctx.control
    if control is None or not control.get("quiesce_capable"):
        return False
    seq = control.get("quiesce_seq") + 1
    control.set("quiesce_seq", seq)
    deadline = time.monotonic() + ctx.stage_timeout_s
    with ctx.timeline.stage("quiesce", ctx.cut_index) as extra:
        while control.get("quiesced_seq") < seq:
            if time.monotonic() > deadline:
                undrain(ctx)
                raise StageRefused("quiesce", f"workload did not drain within {ctx.stage_timeout_s:g}s")
            time.sleep(POLL_S)
        extra["detail"] = f"drained (seq {seq})"
    return True


def undrain(ctx: CutContext) -> None:
    """Let a drained workload restart its device work (idempotent)."""
    control = ctx.control
    if control is not None and control.get("quiesce_capable"):
        control.set("unquiesce_seq", control.get("quiesce_seq"))
