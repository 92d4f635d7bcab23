"""Wall time of one scenario run serially and on several workers (``run.jobs``), side by side.

Runs SCENARIO (default ``scenarios/quick.toml``) once with ``jobs = 1`` and
once for every ``--jobs`` value (default 2), one after another in this
process, each into its own run directory under ``--out``; with
``--executor ray`` once more as Ray tasks (a local Ray the run starts and
stops, ``run.jobs = "auto"``: one trial per CPU). Prints, per run, the
trials, the wall time of the run (planning, receiver and report included;
for Ray also its start-up and shut-down), Ray's start-up alone, trials per
minute, the speed-up over the serial run and whether every plan got the
serial run's verdict (outcome and finding kinds), then the figures as JSON.
The speed-up is bounded by the CPUs (a trial's CRIU dump and restore are
CPU work) and by the longest trial.

    python benchmarks/parallel_speed.py [SCENARIO] [--jobs 2 4] [--executor ray] [--out results/parallel-speed] [--set SECTION.KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

import cutbench.api as cutbench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default="scenarios/quick.toml")
    ap.add_argument("--jobs", nargs="+", type=int, default=[2], help="worker counts to run beside the serial run")
    ap.add_argument("--executor", choices=["ray"], default=None, help="also run the scenario as Ray tasks")
    ap.add_argument("--out", default="results/parallel-speed")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args()
    runs = [("threads", j) for j in [1] + [j for j in args.jobs if j != 1]]
    if args.executor:
        runs.append((args.executor, "auto"))
    # Every point first: --jobs is checked as run.jobs is (a bad count: InvalidArgument naming it, before anything runs).
    points = [(executor, jobs, cutbench.load_scenario(args.scenario, [*args.overrides, f"run.jobs={json.dumps(jobs)}",
                                                                      f"run.executor={json.dumps(executor)}"]))
              for executor, jobs in runs]
    scenario = points[0][2]
    rows: list[dict[str, Any]] = []
    serial: dict[str, Any] | None = None
    for executor, jobs, point in points:
        t0 = time.monotonic()
        try:
            run = cutbench.run(point, out=Path(args.out) / (f"jobs-{jobs}" if executor == "threads" else executor))
        except KeyboardInterrupt as exc:
            print(f"{executor} jobs {jobs}: {exc}", file=sys.stderr)
            return 1
        wall = time.monotonic() - t0
        meta, verdicts = run.meta, run.verdicts()
        serial = serial or {"wall": wall, "verdicts": verdicts}
        rows.append({"executor": executor, "jobs": meta["jobs"], "trials": len(run), "wall_s": wall,
                     "startup_s": (meta.get("ray") or {}).get("startup_s", 0.0),
                     "trials_per_min": 60.0 * len(run) / wall, "speedup": serial["wall"] / wall,
                     "same_verdicts": verdicts == serial["verdicts"],
                     "unknown": run.counts["unknown"], "run": run.path.name})
    table = pd.DataFrame(rows)
    print(f"# Parallel trials: {scenario.name}, {len(os.sched_getaffinity(0))} CPUs\n")
    print(table.to_markdown(index=False, floatfmt=".2f"))
    command = " ".join(["python benchmarks/parallel_speed.py", args.scenario, "--jobs", *map(str, args.jobs),
                        *(["--executor", args.executor] if args.executor else []),
                        "--out", args.out, *[f"--set {o}" for o in args.overrides]])
    print(json.dumps({"scenario": scenario.name, "cpus": len(os.sched_getaffinity(0)), "runs": rows, "command": command},
                     indent=2, default=str))
    return 0 if table["same_verdicts"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
