"""Cause 1: after a ``leave_running`` cut, the CUDA restore of the CRIU-restored copy fails.

The harness saw ``cuCheckpointProcessRestore`` on the restored copy fail with
``CUDA_ERROR_NOT_INITIALIZED`` after a ``leave_running`` cut parked right
after a kernel launch (``launch``), while the same cut with ``kill`` restores.
This drives the same sequence without the harness, varying one thing at a
time, through the driver API and NVIDIA's utility:

    lock → checkpoint → criu dump [--leave-running]
      (leave_running: restore + unlock the original, release it, let it finish or kill it)
    → criu restore (the copy) → restore → unlock → release → the copy finishes?

A case is ``restored`` when the copy's CUDA restore succeeds and it finishes
with the right state, ``lost`` when the checkpoint could not be brought back.

    python benchmarks/repro/leave_running_restore.py [--out DIR] [--witness driver utility] [--repeat N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from witness import Case, Child, main  # noqa: E402

# (name, fault, park phase, what the original does after release, seconds to wait before the CRIU restore)
CASES = (
    ("kill at launch (control)", "kill", "launch", None, 0.0),
    ("leave_running at launch, original finishes", "leave_running", "launch", "finish", 0.0),
    ("leave_running at launch, original killed while running", "leave_running", "launch", "kill", 0.0),
    ("leave_running at launch, original finishes, 3 s settle", "leave_running", "launch", "finish", 3.0),
    ("leave_running at device_done, original finishes", "leave_running", "device_done", "finish", 0.0),
    ("leave_running at device_done, original killed while running", "leave_running", "device_done", "kill", 0.0),
)


def run_case(w, name: str, fault: str, phase: str, fate: str | None, settle: float) -> Case:
    """One sequence; returns the case with every step's result and its verdict."""
    case = Case(name, w.name)
    # "finish": a short run that ends within the crash delay; "kill": a long one still running at the crash.
    ops, host_ms = (4, 0.0) if fate != "kill" else (40, 50.0)
    child = Child(ops, f"2/{phase}", host_ms)
    try:
        if not case.step("parked", child.wait_parked()):
            case.verdict = "harness"  # the child never reached its park: nothing was tested
            return case
        if case.step("lock", w.lock(child.pid)) != "ok" or case.step("checkpoint", w.checkpoint(child.pid)) != "ok":
            case.verdict = "refused"
            return case
        dumped = case.step("criu dump", child.dump(leave_running=fault == "leave_running"))
        if dumped != "ok":
            case.verdict = "lost" if not child.alive() else "refused"
            return case
        if fault == "leave_running":
            child.resume_original(case, w)
            if fate == "kill":
                time.sleep(0.1)
                case.step("original alive at crash", child.alive())
                child.kill()
            status = case.step("original exit", child.reap())
            case.step("original finished correctly", child.correct() if status == 0 else False)
        else:
            case.step("original exit (killed by dump)", child.reap())
        case.verdict = "restored" if child.restore_copy(case, w, settle) else "lost"
        return case
    finally:
        child.close()


if __name__ == "__main__":
    sys.exit(main(__doc__, "leave_running_restore", run_case, CASES))
