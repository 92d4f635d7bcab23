"""How long the human-facing artefacts take to draw as a run grows.

Takes a stored run (default ``results/latest``), repeats its trials,
timeline and effects ``k`` times under new trial IDs (the data stays real,
only more of it), and times ``summary.render``, ``plots.render_all`` and
``report.render_html`` for each size. Prints one line per size.

    .venv/bin/python benchmarks/report_speed.py [RUN_DIR] [--sizes 1,10,100]
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from cutbench.harness.reports import plots
from cutbench.harness.reports import html as report
from cutbench.harness.reports import summary
from cutbench.harness.store.rundir import RunDir


def scaled(frame: pd.DataFrame, k: int, n_trials: int) -> pd.DataFrame:
    """``frame`` repeated ``k`` times, trial IDs renumbered per copy."""
    if frame.empty or "trial_id" not in frame:
        return frame
    copies = []
    for i in range(k):
        c = frame.copy()
        c["trial_id"] = [f"t{int(t[1:]) + i * n_trials:06d}" for t in c["trial_id"]]
        copies.append(c)
    return pd.concat(copies, ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="results/latest")
    ap.add_argument("--sizes", default="1,10,100")
    args = ap.parse_args()
    run = RunDir.open(args.run)
    meta = {**run.meta(), "run_dir": str(run.path)}
    trials, timeline, effects = run.table("trials"), run.table("timeline"), run.table("effects")
    n = len(trials)
    print(f"run {run.run_id}: {n} trials, {len(timeline)} stage rows, {len(effects)} deliveries")
    for k in (int(s) for s in args.sizes.split(",")):
        t, tl, fx = scaled(trials, k, n), scaled(timeline, k, n), scaled(effects, k, n)
        t0 = time.perf_counter()
        summary.render(meta, t)
        t1 = time.perf_counter()
        pngs = plots.render_all(t, tl)
        t2 = time.perf_counter()
        html = report.render_html(meta, t, tl, fx, pngs)
        t3 = time.perf_counter()
        print(f"{len(t):>7} trials: summary {t1 - t0:6.2f} s, plots {t2 - t1:6.2f} s, report.html {t3 - t2:6.2f} s "
              f"({len(html) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
