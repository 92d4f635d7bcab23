"""Split-window cuts against parked cuts in a stored run: which finding classes each produces, with counts.

Reads ``trials.parquet`` of a run directory (e.g. results/reference/gpu-sweep)
and compares, per backend, fault and receiver mode, the ``cuda+criu`` trials
with a split window (the workload released between the CUDA cut and the CPU
cut) against those without (parked until the CPU cut). Prints Markdown.

    python benchmarks/split_vs_parked.py results/reference/gpu-sweep
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from cutbench.api import FINDING_KINDS, OUTCOMES


def compare(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (fault, receiver mode, window): trials, outcomes and finding counts."""
    t = trials[trials["backend"] == "cuda+criu"].copy()
    t["window"] = t["split_window_ms"].map(lambda v: f"split {v:g} ms" if v else "parked")
    rows = []
    for (fault, mode, window), g in t.groupby(["fault", "receiver_mode", "window"]):
        row = {"fault": fault, "receiver_mode": mode, "window": window, "trials": len(g)}
        for outcome in OUTCOMES:
            row[outcome] = int((g["outcome"] == outcome).sum())
        for f in FINDING_KINDS:
            row[f] = int(g[f].sum())
        row["unknown at"] = ", ".join(f"{p}:{s}" for p, s in g[g["outcome"] == "unknown"][["cut_phase", "failed_stage"]]
                                      .itertuples(index=False)) or "-"
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    run = Path(argv[0])
    table = compare(pd.read_parquet(run / "trials.parquet"))
    print(f"# Split window against parked cuts: {run.name}\n")
    print(table.to_markdown(index=False))
    by_window = table.groupby("window")[list(FINDING_KINDS) + ["trials", "unknown"]].sum()
    print("\nTotals by window:\n")
    print(by_window.to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
