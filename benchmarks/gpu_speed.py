"""Speed against bytes: checkpoint, dump, restore and cuda-restore times of ``cuda+criu``.

For each device-state size (MiB of ``counter`` ballast on the GPU) one trial
goes through the whole pipeline with a ``kill`` fault, judged by the oracle
like any other trial (the ballast is verified after the restore). Stage times
come from the trial timeline (monotonic clock; start = call issued, stop =
call returned). Prints a table, writes ``speed.csv``, ``speed.md`` and
``speed.png`` under ``--out``, with the run directories beside them, and says
whether restore time tracks bytes (a least-squares line, R²).

    python benchmarks/gpu_speed.py --out results/gpu-speed [--sizes 256 1024 4096 16384] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

import cutbench.api as cutbench  # noqa: E402

STAGES = ("cuda_lock", "cuda_checkpoint", "criu_dump", "criu_restore", "cuda_restore", "cuda_unlock")
MIB = 1 << 20


def images_dir_for(mib: int) -> str:
    """/dev/shm when it has room for the image (about 1.8x the device bytes plus the process), else disk."""
    need = int(mib * MIB * 2.2) + (2 << 30)
    if shutil.disk_usage("/dev/shm").free > need:
        return "/dev/shm"
    disk = Path(os.environ.get("CUTBENCH_DISK_IMAGES", "/var/tmp/cutbench-images"))
    disk.mkdir(parents=True, exist_ok=True)
    return str(disk)


def scenario_for(mib: int, repeat: int) -> dict:
    return {
        "name": f"speed-{mib}mib",
        "workload": {"name": "counter", "array": "cupy", "params": {"ops": 3, "state_size": 1 << 16, "seed": 1, "ballast_mib": mib}},
        "receiver": {"modes": ["idempotent"]},
        "pipeline": {"backends": ["cuda+criu"], "faults": ["kill"], "images_dir": images_dir_for(mib)},
        "plan": {"source": "random", "trials": repeat, "ops": [2, 2], "phases": ["record"], "seed": mib},
        "run": {"watchdog_s": 60, "trial_timeout_s": 600, "stage_timeout_s": 300},
    }


def fit(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares line y = a + b x; returns (a, b, R²)."""
    n = len(x)
    if n < 2:
        return (y[0] if y else 0.0), 0.0, float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    b = sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((v - my) ** 2 for v in y)
    ss_res = sum((v - a - b * u) ** 2 for u, v in zip(x, y))
    return a, b, (1 - ss_res / ss_tot) if ss_tot else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", nargs="+", type=int, default=[256, 1024, 4096, 16384], help="device MiB per point")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--replot", action="store_true", help="only re-render speed.md/speed.png from speed.csv in --out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        df = pd.read_csv(out / "speed.csv")
        sizes = sorted(df["device_mib"].unique())
        return render(df, out, f"--sizes {' '.join(map(str, sizes))} --repeat {int(df.groupby('device_mib').size().max())}")
    rows, env = [], {}
    for mib in args.sizes:
        data = scenario_for(mib, args.repeat)
        t0 = time.monotonic()
        run = cutbench.run(cutbench.load_scenario(data), out=out / "runs")
        wall = time.monotonic() - t0
        env = run.meta.get("environment", {})
        for _, trial in run.trials.iterrows():
            tl = run.timeline_of(trial["trial_id"])
            row = {"device_mib": mib, "trial_id": trial["trial_id"], "outcome": trial["outcome"],
                   "images_dir": data["pipeline"]["images_dir"],
                   "gpu_bytes": trial.get("gpu_bytes"), "image_bytes": trial.get("image_bytes"), "run_wall_s": wall,
                   "run_dir": run.path.name}
            for stage in STAGES:
                row[f"{stage}_s"] = float(tl[tl["stage"] == stage]["duration_s"].sum())
            rows.append(row)
            print(f"{mib:>6} MiB  {trial['outcome']:<8} " + "  ".join(f"{s}={row[s + '_s']:.3f}s" for s in STAGES), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "speed.csv", index=False)
    (out / "environment.json").write_text(json.dumps(env, indent=2, default=str))  # the last run's, as run.toml has it
    return render(df, out, f"--sizes {' '.join(map(str, args.sizes))} --repeat {args.repeat}")


def render(df: pd.DataFrame, out: Path, options: str) -> int:
    """Write ``speed.md`` and ``speed.png`` for the rows of ``df``; return 0 when every trial was valid."""
    ok = df[df["outcome"] == "valid"]
    lines = ["# cuda+criu speed against device bytes", "",
             f"`python benchmarks/gpu_speed.py --out OUT {options}`", "",
             "Median seconds per stage (monotonic clock, call issued → call returned), one `kill` cut per trial:", ""]
    med = df.groupby("device_mib")[[f"{s}_s" for s in STAGES] + ["image_bytes", "gpu_bytes"]].median()
    med["image_gb"] = med["image_bytes"] / 1e9
    med["gpu_gib"] = med["gpu_bytes"] / (1 << 30)
    show = med[[f"{s}_s" for s in STAGES] + ["gpu_gib", "image_gb"]]
    lines.append(show.to_markdown(floatfmt=".3f"))
    lines += ["", "Linear fit per stage against GPU GiB (seconds = a + b·GiB):", ""]
    fits = []
    x = [b / (1 << 30) for b in ok["gpu_bytes"].fillna(0)]
    for stage in STAGES:
        a, b, r2 = fit(x, list(ok[f"{stage}_s"]))
        fits.append({"stage": stage, "intercept_s": a, "s_per_gib": b, "r2": r2})
    fit_df = pd.DataFrame(fits)
    lines.append(fit_df.to_markdown(index=False, floatfmt=".3f"))
    restore = fit_df.set_index("stage").loc["criu_restore"]
    tracks = restore["r2"] > 0.9 and restore["s_per_gib"] > 0
    lines += ["", f"criu_restore tracks bytes: **{'yes' if tracks else 'no'}** (R² = {restore['r2']:.3f}, "
                  f"{restore['s_per_gib']:.3f} s/GiB); outcomes: {dict((str(k), int(v)) for k, v in df['outcome'].value_counts().items())}"]
    (out / "speed.md").write_text("\n".join(lines) + "\n")
    _plot(med, out / "speed.png")
    print("\n".join(lines))
    return 0 if len(ok) == len(df) else 1


def _plot(med: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = med["gpu_gib"]
    for stage in STAGES:
        ax.plot(x, med[f"{stage}_s"], marker="o", label=stage)
    ax.set_xlabel("device state of the process (GiB, NVML; includes the CUDA context)")
    ax.set_ylabel("seconds")
    ax.set_title("cuda+criu stage time against device bytes")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
