"""How long ``cutbench report`` takes as a run grows.

Takes a stored run (default ``results/latest``) and writes copies of it
whose trials, timeline and effects tables hold its rows ``k`` times under new
trial IDs (the data stays real, only more of it). On each copy it times
``cutbench report`` twice, each a fresh process: with ``CUTBENCH_PLOTS=0``
(``summary.md`` and ``report.html`` with its SVG timelines) and with the PNG
plots too; the difference is the plots' time. The smallest size shows the
fixed cost (the interpreter's start, the imports). Prints one line per size.

    .venv/bin/python benchmarks/report_speed.py [RUN_DIR] [--sizes 1,10,100] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

TABLES = ("trials", "timeline", "effects")


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


def copy_of(run: Path, tables: dict[str, pd.DataFrame], k: int, root: Path) -> Path:
    """A run directory under ``root`` with ``run``'s ``run.toml`` and its tables ``k`` times over."""
    out = root / f"x{k}"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "run.toml", out / "run.toml")
    n = len(tables["trials"])
    for name, frame in tables.items():
        scaled(frame, k, n).to_parquet(out / f"{name}.parquet", index=False)
    return out


def report_seconds(run: Path, plots: bool) -> float:
    """Wall seconds of ``cutbench report RUN`` in a fresh process (with or without the PNG plots)."""
    env = {**os.environ, "CUTBENCH_PLOTS": "1" if plots else "0"}
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "cutbench", "report", str(run)], env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"cutbench report {run} failed (exit {p.returncode}): {p.stderr.strip()[-600:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="results/latest")
    ap.add_argument("--sizes", default="1,10,100")
    ap.add_argument("--out", type=Path, default=None, help="where the copies go (default: a temporary directory)")
    args = ap.parse_args()
    run = Path(args.run).resolve()
    tables = {name: pd.read_parquet(run / f"{name}.parquet") for name in TABLES}
    with tempfile.TemporaryDirectory(prefix="cutbench-report-speed-") as scratch:
        measure(run, tables, args.sizes, args.out or Path(scratch))


def measure(run: Path, tables: dict[str, pd.DataFrame], sizes: str, root: Path) -> None:
    """Time ``cutbench report`` on a copy of ``run`` at each of ``sizes`` (comma-separated), copies under ``root``;
    print one line per size."""
    print(f"run {run.name}: {len(tables['trials'])} trials, {len(tables['timeline'])} stage rows, "
          f"{len(tables['effects'])} deliveries; copies under {root}")
    for k in (int(s) for s in sizes.split(",")):
        copy = copy_of(run, tables, k, root)
        text_only = report_seconds(copy, plots=False)
        everything = report_seconds(copy, plots=True)
        html = (copy / "report.html").stat().st_size
        print(f"{len(tables['trials']) * k:>7} trials: summary and report.html {text_only:6.2f} s, with the plots "
              f"{everything:6.2f} s (plots {everything - text_only:+6.2f} s; report.html {html / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
