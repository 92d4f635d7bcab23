"""What semantic adapters cost a cut, and how fast a cut they cannot join is called off.

Three measurements, each from real trials (``cutbench.run``, real CRIU; the
timeline's stage rows):

1. **The pause prepare adds.** ``request_service`` with an external queue,
   its adapters on and off, side by side in one run: the ``prepare`` stage's
   seconds per cut (median, p99), and the whole pause (first stage of the cut
   to the end of ``criu_dump``) on and off.
2. **The time to abort.** ``adapter_faults`` with a request log that takes
   ``prepare_delay_ms`` (past the deadline) to answer, and ``ranks`` with one
   rank late on purpose after each collective (``slow_rank_ms``), for each
   deadline in ``--deadlines``: from the start of ``prepare`` to the end of
   ``abort``, against the bound *deadline + 1 s*.
3. ``--gpu``: ``persistent_kernel`` with its adapter (the drain) and
   ``ranks`` on CuPy with the distributed pause, through ``cuda+criu``:
   ``prepare`` per cut (the persistent kernel has no "off" to compare: without
   its adapter every cut is refused at the lock).

    python benchmarks/adapter_pause.py [--trials 20] [--deadlines 0.5 1 2] [--gpu] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tabulate import tabulate  # noqa: E402

import cutbench.api as cutbench  # noqa: E402


def scenario(name: str, workload: str, params: dict[str, Any], *, backend: str = "criu", trials: int = 10,
             variants: list[dict[str, Any]] | None = None, deadline: float = 5.0, array: str = "auto",
             phases: list[str] | None = None) -> dict[str, Any]:
    """A scenario mapping: random kill cuts of op 3 (or ``phases`` of it), one backend."""
    data: dict[str, Any] = {
        "name": name,
        "workload": {"name": workload, "array": array, "params": {"ops": 6, "op_interval_ms": 5.0, **params}},
        "receiver": {"modes": ["at_least_once"]},
        "pipeline": {"backends": [backend], "faults": ["kill"]},
        "plan": {"source": "random", "trials": trials, "ops": [3, 3]},
        "run": {"prepare_timeout_s": deadline},
    }
    if phases:
        data["plan"].update(source="exhaustive", phases=phases)
    if variants:
        data["variants"] = variants
    return data


def timeline_of(data: dict[str, Any], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``data``; return its (trials, timeline) tables."""
    run = cutbench.run(cutbench.load_scenario(data), out=out)
    trials = run.trials
    return trials, run.timeline.merge(trials[["trial_id", "variant", "outcome", "failed_stage"]], on="trial_id")


def figures(seconds: pd.Series) -> dict[str, float]:
    """n, median and p99 of a series of seconds."""
    values = seconds.dropna().to_numpy(dtype=float)
    if not len(values):
        return {"n": 0, "median_s": float("nan"), "p99_s": float("nan")}
    return {"n": int(len(values)), "median_s": float(np.median(values)), "p99_s": float(np.percentile(values, 99))}


# The stages of a cut while the workload is held at it (spawn and reach_cut are the workload's own running).
PAUSE_STAGES = ("prepare", "precheck", "criu_dump")


def pause(timeline: pd.DataFrame, until: str = "criu_dump") -> pd.Series:
    """Per cut: seconds from the start of ``prepare`` (or of the dump, without adapters) to the end of ``until``."""
    cut = timeline[(timeline["cut_index"] == 0) & timeline["stage"].isin(PAUSE_STAGES)]
    first = cut.groupby("trial_id")["t_start"].min()
    end = cut[cut["stage"] == until].groupby("trial_id")["t_end"].max()
    return (end - first).dropna()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="cuts per arm for the pause (default 20)")
    ap.add_argument("--deadlines", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                    help="prepare deadlines (s) to abort against (default 0.5 1 2)")
    ap.add_argument("--abort-phases", nargs="+", default=["record", "publish", "ack"],
                    help="the phases a late adapter or rank is cut at, one trial each (default record publish ack)")
    ap.add_argument("--gpu", action="store_true", help="also persistent_kernel and ranks through cuda+criu (needs a GPU)")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU measurements (implies --gpu)")
    ap.add_argument("--out", type=Path, default=None, help="directory for the runs and adapter_pause.json")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="adapter-pause-"))
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}

    if not args.gpu_only:
        cpu_figures(args, out, result)
    if args.gpu or args.gpu_only:
        gpu_figures(args, out, result)
    (out / "adapter_pause.json").write_text(json.dumps(result, indent=2))
    print(f"\nfigures: {out / 'adapter_pause.json'}")
    return 0


def cpu_figures(args: argparse.Namespace, out: Path, result: dict[str, Any]) -> None:
    """Measurements 1 and 2 (module docstring), into ``result``."""
    # 1. The pause, adapters on and off, in one run.
    base = {"queue": "external", "work_ms": 5.0}
    _, tl = timeline_of(scenario("adapter-pause", "request_service", base, trials=args.trials, variants=[
        {"name": "off"}, {"name": "on", "workload": {"params": {"adapters": True}}}]), out)
    rows = []
    for variant in ("off", "on"):
        mine = tl[tl["variant"] == variant]
        prep = figures(mine[mine["stage"] == "prepare"]["duration_s"])
        dump = figures(mine[mine["stage"] == "criu_dump"]["duration_s"])
        whole = figures(pause(mine))
        result[f"pause_{variant}"] = {"prepare": prep, "criu_dump": dump, "prepare_to_dump_end": whole}
        rows.append([f"request_service, adapters {variant}", prep["n"], prep["median_s"] * 1e3, prep["p99_s"] * 1e3,
                     dump["median_s"] * 1e3, whole["median_s"] * 1e3, whole["p99_s"] * 1e3])
    print("The pause prepare adds (criu, kill; ms; the pause: prepare start, or the dump's without adapters, to dump end)")
    print(tabulate(rows, headers=["arm", "prepares", "prepare median", "prepare p99", "dump median", "pause median",
                                  "pause p99"], floatfmt=".2f"))

    # 2. The time to abort a cut one adapter (or one rank) cannot join in time.
    rows = []
    result["abort"] = []
    late_by = {"late adapter": ("adapter_faults", lambda d: {"prepare_delay_ms": (d + 1.5) * 1000}),
               "slow rank": ("ranks", lambda d: {"ranks": 3, "adapters": True, "slow_rank": 2,
                                                  "slow_rank_ms": (d + 1.5) * 1000})}
    for case, (workload, params) in late_by.items():
        for deadline in args.deadlines:
            data = scenario(f"adapter-abort-{workload}-{deadline:g}", workload, params(deadline),
                            trials=len(args.abort_phases), deadline=deadline, phases=list(args.abort_phases))
            trials, tl = timeline_of(data, out)
            cut = tl[tl["stage"].isin(["prepare", "abort"])]
            took = cut.groupby("trial_id")["t_end"].max() - cut.groupby("trial_id")["t_start"].min()
            refused = int((trials["failed_stage"] == "prepare").sum())
            f = figures(took)
            result["abort"].append({"case": case, "deadline_s": deadline, "refused_at_prepare": refused,
                                    "trials": len(trials), **f, "max_s": float(took.max()), "bound_s": deadline + 1.0})
            rows.append([case, deadline, f"{refused}/{len(trials)}", f["median_s"], float(took.max()), deadline + 1.0,
                         "yes" if float(took.max()) <= deadline + 1.0 else "NO"])
    print("\nTime to abort: prepare start to abort end, one adapter or one rank late past the deadline (s)")
    print(tabulate(rows, headers=["case", "deadline", "refused at prepare", "median", "max", "bound", "within"],
                   floatfmt=".3f"))



def gpu_figures(args: argparse.Namespace, out: Path, result: dict[str, Any]) -> None:
    """Measurement 3 (module docstring), into ``result``."""
    _, tl = timeline_of(scenario("adapter-pause-gpu", "persistent_kernel", {"quiesce_adapter": True},
                                 backend="cuda+criu", trials=args.trials, array="cupy"), out)
    prep = figures(tl[tl["stage"] == "prepare"]["duration_s"])
    lock = figures(tl[tl["stage"] == "cuda_lock"]["duration_s"])
    result["persistent_kernel"] = {"prepare": prep, "cuda_lock": lock,
                                   "valid": int((tl.drop_duplicates("trial_id")["outcome"] == "valid").sum())}
    _, tl = timeline_of(scenario("adapter-pause-gpu-ranks", "ranks", {"ranks": 3, "adapters": True},
                                 backend="cuda+criu", trials=args.trials, array="cupy"), out)
    ranks = figures(tl[tl["stage"] == "prepare"]["duration_s"])
    result["ranks_gpu"] = {"prepare": ranks,
                           "valid": int((tl.drop_duplicates("trial_id")["outcome"] == "valid").sum())}
    print("\nOn the GPU, cuda+criu, kill: persistent_kernel's drain and the ranks' distributed pause (ms)")
    print(tabulate([["persistent_kernel prepare (drain)", prep["n"], prep["median_s"] * 1e3, prep["p99_s"] * 1e3],
                    ["persistent_kernel cuda_lock", lock["n"], lock["median_s"] * 1e3, lock["p99_s"] * 1e3],
                    ["ranks (3, CuPy) prepare (pause)", ranks["n"], ranks["median_s"] * 1e3, ranks["p99_s"] * 1e3]],
                   headers=["stage", "cuts", "median", "p99"], floatfmt=".2f"))


if __name__ == "__main__":
    sys.exit(main())
