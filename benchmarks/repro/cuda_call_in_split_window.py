"""Cause 2: a CUDA call made inside the split window, then ``criu dump``.

In the harness's split window the workload is released right after the CUDA
checkpoint, so host code runs before CRIU freezes it. Parked right after a
kernel launch, the host's next statement is a stream synchronisation: a CUDA
call on a LOCKED, CHECKPOINTED process, which blocks. This reproduces the
harness's order without it — lock → checkpoint → release → 25 ms → criu dump —
and, as controls, the same with the process left parked (no call pending) and
released where only host code follows (the next CUDA call is 500 ms away).

A case is ``dumped`` when CRIU dumps and the process is restored and finishes
correctly, ``lost`` when the dump or the restore destroyed it, ``refused`` when
a stage declined and the process went on.

    python benchmarks/repro/cuda_call_in_split_window.py [--out DIR] [--witness driver utility] [--repeat N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from witness import Case, Child, main  # noqa: E402

WINDOW_S = 0.025
# (name, park phase, released into the window?, host-only work after device_done (ms), fault)
CASES = (
    ("parked at launch, kill (control)", "launch", False, 0.0, "kill"),
    ("released at launch: next call blocks, kill", "launch", True, 0.0, "kill"),
    ("released at launch: next call blocks, none", "launch", True, 0.0, "none"),
    ("released at device_done: host code only, kill", "device_done", True, 500.0, "kill"),
    ("released at launch: next call blocks, no dump (control)", "launch", True, 0.0, "no_dump"),
)


def run_case(w, name: str, phase: str, release: bool, host_ms: float, fault: str) -> Case:
    """One sequence; returns the case with every step's result and its verdict."""
    case = Case(name, w.name)
    child = Child(4, f"2/{phase}", host_ms)
    try:
        if not case.step("parked", child.wait_parked()):
            case.verdict = "harness"
            return case
        if case.step("lock", w.lock(child.pid)) != "ok" or case.step("checkpoint", w.checkpoint(child.pid)) != "ok":
            case.verdict = "refused"
            return case
        if release:
            child.go()
            time.sleep(WINDOW_S)
        if fault == "no_dump":  # is it the blocked call, or the dump, that kills the process?
            time.sleep(2.0)
            case.step("alive 2 s into the blocked call", child.alive())
            child.resume_original(case, w)
            status = case.step("exit status", child.reap())
            case.step("child log", child.log_tail())
            ok = case.step("finished correctly", status == 0 and child.correct())
            case.verdict = "survived" if ok else "lost"
            return case
        dumped = case.step("criu dump", child.dump(leave_running=fault != "kill"))
        alive = case.step("alive after dump", child.alive())
        if dumped != "ok":
            case.step("child log", child.log_tail())
            if alive:  # CRIU resumed it: bring its GPU side back and see it finish
                child.resume_original(case, w)
                case.verdict = "refused" if child.reap() == 0 and child.correct() else "lost"
            else:
                child.reap()
                case.verdict = "lost"
            return case
        if fault == "none":
            child.resume_original(case, w)
            ok = case.step("finished correctly", child.reap() == 0 and child.correct())
            case.verdict = "dumped" if ok else "lost"
            return case
        child.reap()
        case.verdict = "dumped" if child.restore_copy(case, w) else "lost"
        return case
    finally:
        child.close()


if __name__ == "__main__":
    sys.exit(main(__doc__, "cuda_call_in_split_window", run_case, CASES))
