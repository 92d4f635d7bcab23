"""Trials to the first invalid recovery: hypothesis vs random vs exhaustive on the same budget.

For each case (a workload with a recovery bug, an arm, a cut space) every
plan source gets the same budget of trials over the same space — cut
positions ``plan.ops`` × all the workload's phases, one or two cuts per
trial, precise cuts — and stops at its first ``invalid`` trial
(``run.stop_at_first_invalid``; the exhaustive plans are not cut to the
budget: a failure found past it counts as ``>B``). ``random``
and ``hypothesis`` (``ci`` profile: seeded, derandomized, no shrinking) run
once per seed; ``exhaustive`` is deterministic and runs once. Every trial is a
real CRIU dump and restore (CPU workloads on NumPy).

Prints one table: per case and source, trials to the first failure (median
and range over seeds; ``>B`` when not found within the budget B) and the
wall time spent.

    python benchmarks/trials_to_failure.py [--budget 30] [--seeds 3] [--case counter_crash0 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

from cutbench.api import load_scenario, run  # noqa: E402

SOURCES = ("hypothesis", "random", "exhaustive")


@dataclass(frozen=True)
class Case:
    name: str
    workload: str
    receiver: str
    fault: str
    crash_after_ms: float = 100.0
    ops: int = 5
    what: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CASES = (
    Case("counter_lr150", "counter", "at_least_once", "leave_running", 150.0,
         what="counter, at_least_once, leave_running +150 ms: nearly every cut duplicates"),
    Case("counter_lr0", "counter", "at_least_once", "leave_running", 0.0,
         what="counter, at_least_once, leave_running +0 ms: only an effect in flight at the cut duplicates"),
    Case("outbox_mark_before_send", "outbox_mark_before_send", "idempotent", "kill",
         what="mark before send, kill: 1 phase of 8 loses the op"),
    Case("resend_stale_digest", "resend_stale_digest", "at_least_once", "kill",
         what="stale digest after restore, kill: 4 phases of 7"),
    Case("echo_peer_noseq", "echo_peer_noseq", "idempotent", "leave_running", 100.0,
         what="peer without sequence numbers, leave_running: 1 phase of 9 deadlocks"),
)


def scenario(case: Case, source: str, budget: int, seed: int):
    """The scenario of ``case`` under ``source``: the same space and budget for every source."""
    return load_scenario({
        "name": f"ttf-{case.name}-{source}-{seed}",
        "workload": {"name": case.workload, "array": "numpy",
                     "params": {"ops": case.ops, "state_size": 512, "seed": 1, "op_interval_ms": 10.0, **case.extra}},
        "receiver": {"modes": [case.receiver]},
        "pipeline": {"backends": ["criu"], "faults": [case.fault], "crash_after_ms": [case.crash_after_ms]},
        "plan": {"source": source, "ops": [1, case.ops], "phases": "all", "cuts_per_trial": 2, "trials": budget,
                 "seed": seed, "profile": "ci"},
        # A list of plans stops at its first invalid trial; the search stops each arm at its own.
        "run": {"watchdog_s": 3, "stage_timeout_s": 20, "stop_at_first_invalid": source != "hypothesis"},
    })


def trials_to_failure(case: Case, source: str, budget: int, seed: int, root: Path) -> int | None:
    """Run ``source`` on ``case`` until its first invalid trial; return that trial's number (None: not within budget)."""
    stored = run(scenario(case, source, budget, seed), out=root)
    if source == "hypothesis":
        arms = (stored.meta.get("search") or {}).get("arms", [])
        first = arms[0].get("first_failure") if arms else None
    else:
        first = stored.meta.get("first_invalid")
    return first if first is not None and first <= budget else None


def fmt(values: list[int | None], budget: int) -> str:
    found = [v for v in values if v is not None]
    if not found:
        return f">{budget}"
    missed = len(values) - len(found)
    if len(values) == 1:
        return str(found[0])
    med = statistics.median([v if v is not None else budget + 1 for v in values])
    span = f"{min(found)}–{max(found)}" + (f", {missed} >{budget}" if missed else "")
    return f"{med:g} ({span})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=30, help="trials each source may spend per case")
    ap.add_argument("--seeds", type=int, default=3, help="seeds for random and hypothesis")
    ap.add_argument("--case", action="append", choices=[c.name for c in CASES], help="run only these cases")
    ap.add_argument("--out", type=Path, default=None, help="results root (default: a temporary directory)")
    args = ap.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="cutbench-ttf-"))
    rows = []
    for case in CASES:
        if args.case and case.name not in args.case:
            continue
        row = {"case": case.name}
        for source in SOURCES:
            seeds = [0] if source == "exhaustive" else list(range(args.seeds))
            started = time.monotonic()
            values = [trials_to_failure(case, source, args.budget, s, root) for s in seeds]
            row[source] = fmt(values, args.budget)
            row[f"{source} s"] = f"{time.monotonic() - started:.0f}"
            print(f"{case.name:26} {source:10} {values}", file=sys.stderr, flush=True)
        rows.append(row)
    print(f"\nTrials to the first invalid recovery (budget {args.budget} per source and seed; "
          f"random/hypothesis: median (range) over {args.seeds} seeds)\n")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print()
    for case in CASES:
        if not args.case or case.name in args.case:
            print(f"- {case.name}: {case.what}")
    print(f"\nruns under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
