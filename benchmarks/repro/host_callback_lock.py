"""Cause 3: a lock while a stream host callback runs waits for the callback.

The ``stream_callbacks`` workload enqueues host functions on its stream; a cut
parked inside one is refused: the lock waits for in-flight work, and the
callback is in-flight work that waits for the harness. This shows it without
the harness: a callback that waits for a file, a lock with a 2 s timeout
(refused, the process still RUNNING), then the callback released, the process
finishing correctly, and a lock after it succeeding.

    python benchmarks/repro/host_callback_lock.py [--out DIR] [--witness driver utility] [--repeat N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from witness import Case, Child, main  # noqa: E402


def run_case(w) -> Case:
    """Lock inside the callback, then after it; returns the case and its verdict."""
    case = Case("lock while a host callback waits", w.name)
    # Op 2 enqueues the callback; the child parks at 2/launch with the callback pending on the stream.
    child = Child(4, "2/launch", 0.0, callback=True)
    try:
        if not case.step("parked", child.wait_parked()):
            case.verdict = "harness"
            return case
        started = time.monotonic()
        locked = case.step("lock (2 s timeout) inside the callback", w.lock(child.pid, 2000))
        case.step("lock took s", round(time.monotonic() - started, 3))
        case.step("state after", w.state(child.pid))
        if locked == "ok":  # not expected: undo and record
            w.unlock(child.pid)
        (child.dir / "cb_go").touch()
        time.sleep(0.2)
        second = case.step("lock after the callback returned", w.lock(child.pid, 2000))
        if second == "ok":
            case.step("unlock", w.unlock(child.pid))
        child.go()
        ok = case.step("finished correctly", child.reap() == 0 and child.correct())
        case.verdict = "refused" if locked != "ok" and ok else ("locked" if ok else "lost")
        return case
    finally:
        child.close()


if __name__ == "__main__":
    sys.exit(main(__doc__, "host_callback_lock", run_case))
