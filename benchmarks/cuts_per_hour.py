"""Cuts per hour on one GPU at 1 GiB of device state, and the harness's overhead.

Runs ``--trials`` random single-cut ``cuda+criu`` trials (kill fault) of the
CuPy ``counter`` with 1 GiB of ballast, each judged by the oracle. For every
trial, from the moment the runner starts it until its verdict and files are
written (the gap between progress callbacks):

* tool time: the checkpoint tool's stages (``cuda_*`` calls, split window,
  CRIU dump/restore, the fault);
* workload time: the workload's own running (``spawn`` — interpreter, CuPy,
  allocating and filling 1 GiB — ``reach_cut`` and ``run_to_end``);
* harness overhead = trial wall − tool time − workload time (receiver
  bookkeeping, NVML discovery, arming, image removal, the oracle, writing).

Prints cuts/hour and the overhead as a fraction of wall time (target ≤ 10%).

    python benchmarks/cuts_per_hour.py --out results/cuts-per-hour [--trials 12] [--ballast-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from cutbench.harness.runner.run import run_scenario  # noqa: E402
from cutbench.harness.model.scenario import parse_scenario  # noqa: E402

TOOL_PREFIXES = ("cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock", "split_window", "criu_", "fault_",
                 "run_until_crash")
WORKLOAD_STAGES = ("spawn", "reach_cut", "run_to_end")


def classify(stage: str) -> str:
    """``tool``, ``workload`` or ``harness`` for a timeline stage name."""
    if stage.startswith(TOOL_PREFIXES):
        return "tool"
    if stage in WORKLOAD_STAGES:
        return "workload"
    return "harness"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--ballast-mib", type=int, default=1024)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "name": "cuts-per-hour",
        "workload": {"name": "counter", "array": "cupy",
                     "params": {"ops": 4, "state_size": 1 << 16, "seed": 2, "ballast_mib": args.ballast_mib}},
        "receiver": {"modes": ["idempotent"]},
        "pipeline": {"backends": ["cuda+criu"], "faults": ["kill"]},
        "plan": {"source": "random", "trials": args.trials, "ops": [1, 4], "phases": "all", "seed": 4},
        "run": {"watchdog_s": 30, "trial_timeout_s": 300, "stage_timeout_s": 120},
    }
    marks: list[tuple[str, float]] = []
    t_start = time.monotonic()
    outcome = run_scenario(parse_scenario(data), out / "runs",
                           progress=lambda r, done, total: marks.append((r.spec.trial_id, time.monotonic())))
    run_wall = time.monotonic() - t_start
    timeline = pd.read_parquet(outcome.run.path / "timeline.parquet")
    timeline["kind"] = timeline["stage"].map(classify)
    rows = []
    prev = None
    for trial_id, t in marks:
        tl = timeline[timeline["trial_id"] == trial_id]
        by = tl.groupby("kind")["duration_s"].sum()
        wall = t - prev if prev is not None else float(tl["t_end"].max())
        prev = t
        rows.append({"trial_id": trial_id, "wall_s": wall, "tool_s": by.get("tool", 0.0), "workload_s": by.get("workload", 0.0),
                     "harness_stages_s": by.get("harness", 0.0)})
    df = pd.DataFrame(rows).merge(outcome.trials[["trial_id", "outcome", "plan", "gpu_bytes", "image_bytes"]], on="trial_id")
    # The first trial's wall has no earlier mark: it starts at the run (receiver start included).
    df.loc[df.index[0], "wall_s"] = marks[0][1] - t_start
    df["overhead_s"] = df["wall_s"] - df["tool_s"] - df["workload_s"]
    df["overhead_frac"] = df["overhead_s"] / df["wall_s"]
    df.to_csv(out / "cuts_per_hour.csv", index=False)
    mean_wall = df["wall_s"].mean()
    summary = {
        "trials": len(df),
        "outcomes": {k: int(v) for k, v in df["outcome"].value_counts().items()},
        "gpu_gib_median": float(df["gpu_bytes"].median() / (1 << 30)),
        "image_gb_median": float(df["image_bytes"].median() / 1e9),
        "mean_trial_wall_s": mean_wall,
        "cuts_per_hour": 3600.0 / mean_wall,
        "tool_s_mean": df["tool_s"].mean(),
        "workload_s_mean": df["workload_s"].mean(),
        "overhead_s_mean": df["overhead_s"].mean(),
        "overhead_fraction": df["overhead_s"].sum() / df["wall_s"].sum(),
        "run_wall_s": run_wall,
        "command": f"python benchmarks/cuts_per_hour.py --out {args.out} --trials {args.trials} --ballast-mib {args.ballast_mib}",
    }
    (out / "cuts_per_hour.json").write_text(json.dumps(summary, indent=2))
    print(df[["trial_id", "outcome", "wall_s", "tool_s", "workload_s", "overhead_s", "overhead_frac"]].to_string(index=False,
                                                                                                              float_format="%.3f"))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
