"""Cuts per hour at 1 GiB of device state as parallel trials grow, and where the time goes.

For every ``--cuts-per-trial`` value K and every ``--jobs`` value N, one run
(``cutbench.run``, ``run.jobs = N``) of random kill trials of the
``counter`` workload (``--array``, default CuPy, with ``--ballast-mib`` of
ballast, default 1 GiB) under ``--backend`` (default ``cuda+criu``), each
judged by the oracle. The plans come from one seed, so every N runs the same
plans (a larger run's plans begin with a smaller one's). ``--source random``
draws 1 to K cuts per trial (``plan.cuts_per_trial``); ``--source periodic``
places exactly K, a cut at every op 1..K (``plan.interval_ops = 1``).

A trial's wall runs from the moment a worker takes it until its verdict
reaches the run (the first N trials start with the run, receiver start
included; the next starts when a worker frees up, the previous trial's
verdict). Of that wall:

* tool time: the checkpoint tool's stages (``cuda_*`` calls, split window,
  CRIU dump/restore, the fault);
* workload time: the workload's own running (``spawn``, ``reach_cut`` —
  interpreter, CuPy, allocating and filling the ballast — and ``run_to_end``);
* harness overhead = wall − tool time − workload time (receiver bookkeeping,
  NVML discovery, arming, image removal, the oracle, writing); the part in no
  timed stage at all is the pseudo-stage ``(untimed)``.

Per configuration it prints validated cuts/hour (the valid trials' cuts over
the run's wall from its start to the last verdict: report writing, once per
run, is left out), the steady rate (the same from the N-th verdict on: the
start-up of the first N trials side by side left out, which is what a
long sweep approaches), the host's CPU (busy share of every CPU, busy
CPU-seconds per valid cut, and the cuts/hour that would give with every
CPU busy: the host's ceiling for this work), the overhead as a fraction of
wall time, the mean trial
wall, the ``unknown`` trials and why, and the stage that stretches most
against the fewest jobs (the one whose time per trial grows most in seconds:
a 1 ms stage tripling matters less than a dump doubling), with each stage's
mean and its ratio to the fewest jobs. Writes ``cuts_per_hour.csv`` (every
trial), ``cuts_per_hour.json`` (every configuration), ``stages.csv`` (jobs,
cuts_per_trial, stage, mean_s, …) and the run directories under ``--out/runs/``.

Where the CPU goes (``docs/cpu-accounting.md``): every stage row of the
run's timeline carries the CPU-seconds of each process role (workload, CUDA
driver threads, CRIU, other tools, receiver, harness), page faults and bytes
written, read at the stage's start and end. Per configuration it prints
CPU-seconds per cut by stage and by role — over every cut of the finished
trials, with the host's busy CPU-seconds per cut beside them, so the share
the accounting explains shows — and faults and bytes per cut; ``cpu.csv``
holds the per-stage figures. ``--bandwidth FILE`` (the JSON of
``benchmarks/bandwidth_reference.py``) adds the cut's cost against what its
bytes need on this host: per cut, the image bytes (each dump stage's
``bytes``: ``criu_dump``, a container checkpoint, ``app_save``) written to
tmpfs and, where the cut was restored, read back; the device bytes
(``cuda_discover``'s ``bytes``) copied to the host and, where CUDA restored
them, back. The tool stages' CPU-seconds and wall seconds per cut are
divided by the CPU-seconds and seconds those copies take at the reference's
rates (tmpfs write/read, D2H/H2D pageable).

``--trials-per-job T`` sizes each run at T × N trials (each worker runs
about T; ``--min-trials M`` gives the fewest jobs at least M);
``--max-seconds S`` stops a configuration S seconds in, as Ctrl-C does (the
trials in flight give no verdict and their time counts against the run: a
guard, not the way to size it). On a GPU host every trial of a run
shares the one GPU: ``run.trials_per_gpu`` is set to N beside ``run.jobs``, and
N trials of the ballast and a CUDA context must fit in its memory.

    python benchmarks/cuts_per_hour.py --out results/cuts-per-hour --jobs 1 4 8 16 --cuts-per-trial 1 4 --trials-per-job 2 --min-trials 6
    python benchmarks/cuts_per_hour.py --out /tmp/cph --backend criu --array numpy --ballast-mib 0 --jobs 1 2 --cuts-per-trial 1 3 --trials-per-job 2
    python benchmarks/bandwidth_reference.py --out /tmp/bw.json && python benchmarks/cuts_per_hour.py --out /tmp/cph --jobs 1 16 --bandwidth /tmp/bw.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from cutbench.errors import EXIT_BAD_ARGUMENTS, CutbenchError, InvalidArgument  # noqa: E402
from cutbench.api import CPU_COLUMNS, CPU_ROLES, HARNESS_STAGES, load_scenario, open_run, run  # noqa: E402
from cutbench.procs import stat_fields  # noqa: E402

TOOL_PREFIXES = ("cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock", "split_window", "criu_", "fault_",
                 "run_until_crash")
UNTIMED = "(untimed)"
# What one trial holds on the GPU beside its ballast: the CUDA context, CuPy's pool, the counter's state
# (1.51 GiB of process GPU memory at 1 GiB of ballast on the H200, results/reference/cuts-per-hour).
CONTEXT_MIB = 512
SOURCES = ("random", "periodic")
OPS = 4  # the counter's ops (more when a periodic plan needs them)
# Per-cut figures of the stage table beside CPU-seconds: faults and bytes (docs/cpu-accounting.md).
COUNTS = ("minflt", "majflt", "write_bytes", "wchar_bytes")
# Stages whose ``bytes`` is the cut's image, and those that read it back; ``cuda_discover``'s is the device state.
DUMP_STAGES = ("criu_dump", "docker_checkpoint", "podman_checkpoint", "app_save")
RESTORE_STAGES = ("criu_restore", "docker_restore", "podman_restore", "app_restore")
GPU_BYTES_STAGE, GPU_RESTORE_STAGE = "cuda_discover", "cuda_restore"
# What each kind of byte costs, as benchmarks/bandwidth_reference.py names its measurements.
TRANSFERS = {"image_bytes": "tmpfs_write", "restored_bytes": "tmpfs_read", "gpu_bytes": "d2h_pageable",
             "gpu_restored_bytes": "h2d_pageable"}


def classify(stage: str) -> str:
    """``tool``, ``workload`` or ``harness`` for a timeline stage name."""
    if stage.startswith(TOOL_PREFIXES):
        return "tool"
    if stage in HARNESS_STAGES:  # the workload's own running (spawn, to its cut, to its end): not the tool's
        return "workload"
    return "harness"


def scenario_data(*, backend: str, array: str, ballast_mib: int, jobs: int, cuts_per_trial: int, trials: int,
                  source: str = "random", images_dir: str | None = None) -> dict[str, Any]:
    """The scenario (as parsed from TOML) of one configuration: ``trials`` kill trials on ``jobs`` workers.

    ``random``: 1 to ``cuts_per_trial`` cuts per trial, drawn from seed 4 over
    ops 1–4 and every phase; ``periodic``: exactly ``cuts_per_trial`` precise
    cuts, at ops 1, 2, … of the first phase. Every trial shares the host's one
    GPU, so ``run.trials_per_gpu`` is ``jobs`` too. ``images_dir`` is
    ``pipeline.images_dir`` (the scenario's default when None). Raises
    :class:`InvalidArgument` for an unknown source.
    """
    if source not in SOURCES:
        raise InvalidArgument(f"--source {source!r}: expected one of {', '.join(SOURCES)}")
    if source == "random":
        plan: dict[str, Any] = {"source": "random", "trials": trials, "ops": [1, OPS], "phases": "all", "seed": 4,
                                "cuts_per_trial": cuts_per_trial}
    else:
        plan = {"source": "periodic", "trials": trials, "ops": [1, cuts_per_trial], "interval_ops": 1, "phases": "all"}
    return {
        "name": f"cph-{backend.replace('+', '-')}-j{jobs}-k{cuts_per_trial}",
        "workload": {"name": "counter", "array": array,
                     "params": {"ops": max(OPS, cuts_per_trial), "state_size": 1 << 16, "seed": 2,
                                "ballast_mib": ballast_mib}},
        "receiver": {"modes": ["idempotent"]},
        "pipeline": {"backends": [backend], "faults": ["kill"], **({"images_dir": images_dir} if images_dir else {})},
        "plan": plan,
        "run": {"watchdog_s": 30, "trial_timeout_s": 300, "stage_timeout_s": 120, "jobs": jobs,
                "trials_per_gpu": max(jobs, 1)},  # a bad --jobs is named as run.jobs
    }


def gpu_fit_error(jobs: int, ballast_mib: int, memory_mib: int | None) -> str | None:
    """Why ``jobs`` trials of ``ballast_mib`` would oversubscribe a GPU of ``memory_mib``, or None when they fit
    (or its memory is unknown)."""
    need = jobs * (ballast_mib + CONTEXT_MIB)
    if memory_mib is None or need <= memory_mib:
        return None
    return (f"--jobs {jobs} with --ballast-mib {ballast_mib}: {jobs} trials × ({ballast_mib} + ~{CONTEXT_MIB} MiB "
            f"of CUDA context) = {need} MiB, more than the GPU's {memory_mib} MiB; lower --jobs or --ballast-mib")


def trial_walls(finishes: Iterable[tuple[int, str, float]], jobs: int, t_start: float) -> dict[str, tuple[float, float]]:
    """Each finished trial's ``(start, end)`` from ``(plan position, trial_id, verdict time)`` in the order the
    verdicts came.

    The workers take the specs in plan order: the first ``jobs`` positions
    start with the run at ``t_start``, and position p ≥ ``jobs`` starts when
    the (p − jobs + 1)-th verdict frees a worker. With one job this is the gap
    between verdicts. Raises :class:`InvalidArgument` for ``jobs`` < 1.
    """
    if jobs < 1:
        raise InvalidArgument(f"jobs = {jobs}: expected at least 1")
    done = list(finishes)
    ends = sorted(t for _, _, t in done)
    walls = {}
    for position, trial_id, end in done:
        start = t_start if position < jobs else ends[position - jobs]
        walls[trial_id] = (start, end)
    return walls


def breakdown(walls: dict[str, tuple[float, float]], timeline: pd.DataFrame) -> pd.DataFrame:
    """One row per trial of ``walls``: ``wall_s``, ``tool_s``, ``workload_s``, ``harness_stages_s``, ``untimed_s``,
    ``overhead_s`` (wall − tool − workload) and ``overhead_frac``, from the run's timeline (``trial_id``,
    ``stage``, ``duration_s``)."""
    kinds = timeline.assign(kind=timeline["stage"].map(classify)).pivot_table(
        index="trial_id", columns="kind", values="duration_s", aggfunc="sum", fill_value=0.0)
    rows = []
    for trial_id, (start, end) in walls.items():
        by = kinds.loc[trial_id] if trial_id in kinds.index else {}
        tool, workload, harness = (float(by.get(k, 0.0)) for k in ("tool", "workload", "harness"))
        wall = end - start
        rows.append({"trial_id": trial_id, "wall_s": wall, "tool_s": tool, "workload_s": workload,
                     "harness_stages_s": harness, "untimed_s": wall - tool - workload - harness,
                     "overhead_s": wall - tool - workload, "overhead_frac": (wall - tool - workload) / wall})
    return pd.DataFrame(rows, columns=["trial_id", "wall_s", "tool_s", "workload_s", "harness_stages_s", "untimed_s",
                                       "overhead_s", "overhead_frac"])


def stage_means(timeline: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """Per stage of the trials in ``per_trial``: ``mean_s`` (one occurrence: a trial of K cuts has K dumps),
    ``n`` (occurrences) and ``per_trial_s`` (seconds per trial), plus the :data:`UNTIMED` pseudo-stage."""
    tl = timeline[timeline["trial_id"].isin(per_trial["trial_id"])]
    n_trials = max(len(per_trial), 1)
    out = tl.groupby("stage")["duration_s"].agg(mean_s="mean", n="count", total="sum").reset_index()
    out["per_trial_s"] = out.pop("total") / n_trials
    untimed = pd.DataFrame([{"stage": UNTIMED, "mean_s": per_trial["untimed_s"].mean(), "n": len(per_trial),
                             "per_trial_s": per_trial["untimed_s"].mean()}])
    return pd.concat([out, untimed], ignore_index=True) if len(per_trial) else out


def stretch(stages: pd.DataFrame) -> pd.DataFrame:
    """``stages`` (``jobs``, ``cuts_per_trial``, ``stage``, ``mean_s``, ``per_trial_s``) with ``ratio``: each stage's
    mean over its mean at the fewest jobs of the same ``cuts_per_trial`` (NaN where that stage is absent or took
    no time), and ``added_s``: the seconds per trial it gained."""
    base_jobs = stages.groupby("cuts_per_trial")["jobs"].transform("min")
    base = stages[stages["jobs"] == base_jobs][["cuts_per_trial", "stage", "mean_s", "per_trial_s"]]
    base = base.rename(columns={"mean_s": "base_mean_s", "per_trial_s": "base_per_trial_s"})
    out = stages.merge(base, on=["cuts_per_trial", "stage"], how="left")
    out["ratio"] = out["mean_s"] / out["base_mean_s"].where(out["base_mean_s"] > 0)
    out["added_s"] = out["per_trial_s"] - out["base_per_trial_s"]
    return out.drop(columns=["base_mean_s", "base_per_trial_s"])


def top_stretch(stretched: pd.DataFrame, jobs: int, cuts_per_trial: int) -> tuple[str, float] | None:
    """The stage of (``jobs``, ``cuts_per_trial``) in :func:`stretch`'s frame whose time per trial grew most in
    seconds, and its ratio; None at the fewest jobs (nothing to compare with) or when nothing grew."""
    rows = stretched[(stretched["jobs"] == jobs) & (stretched["cuts_per_trial"] == cuts_per_trial)]
    if rows.empty or jobs == stretched[stretched["cuts_per_trial"] == cuts_per_trial]["jobs"].min():
        return None
    grown = rows.dropna(subset=["added_s"])
    grown = grown[grown["added_s"] > 0]
    if grown.empty:
        return None
    top = grown.loc[grown["added_s"].idxmax()]
    return str(top["stage"]), float(top["ratio"])


def unknown_reasons(trials: pd.DataFrame) -> dict[str, int]:
    """How many ``unknown`` trials of ``trials`` (``outcome``, ``error``, ``failed_stage``) gave each reason: the
    failed stage and the first line of the error (a PID collision at restore shows here)."""
    unknown = trials[trials["outcome"] == "unknown"]
    reasons: dict[str, int] = {}
    for row in unknown.itertuples():
        error = str(row.error or "no error recorded").strip().splitlines()[0][:160]
        key = f"{row.failed_stage}: {error}" if isinstance(row.failed_stage, str) and row.failed_stage else error
        reasons[key] = reasons.get(key, 0) + 1
    return dict(sorted(reasons.items(), key=lambda kv: -kv[1]))


def summarize(per_trial: pd.DataFrame, trials: pd.DataFrame, span_s: float) -> dict[str, Any]:
    """One configuration's figures from its per-trial rows (:func:`breakdown`), its trials table (``trial_id``,
    ``outcome``, ``n_cuts``, ``error``, ``failed_stage``) and the run's wall up to its last verdict: validated
    cuts/hour counts the valid trials' cuts, not trials."""
    df = per_trial.merge(trials, on="trial_id")
    valid = df[df["outcome"] == "valid"]
    cuts = int(valid["n_cuts"].sum())
    return {
        "trials": len(df),
        "outcomes": {str(k): int(v) for k, v in df["outcome"].value_counts().items()},
        "valid_cuts": cuts,
        "cuts_per_trial_mean": float(df["n_cuts"].mean()) if len(df) else 0.0,
        "cuts_per_hour": 3600.0 * cuts / span_s if span_s > 0 else 0.0,
        "mean_trial_wall_s": float(df["wall_s"].mean()) if len(df) else float("nan"),
        "tool_s_mean": float(df["tool_s"].mean()) if len(df) else float("nan"),
        "workload_s_mean": float(df["workload_s"].mean()) if len(df) else float("nan"),
        "overhead_s_mean": float(df["overhead_s"].mean()) if len(df) else float("nan"),
        "overhead_fraction": float(df["overhead_s"].sum() / df["wall_s"].sum()) if len(df) else float("nan"),
        "unknown": int((df["outcome"] == "unknown").sum()),
        "unknown_reasons": unknown_reasons(df),
        "span_s": span_s,
    }


def host_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of every CPU of this host since boot, from ``/proc/stat`` (None where it is absent).

    Busy is everything but idle and iowait: user, system, interrupts and
    steal, the workloads', CRIU's, the driver's and the harness's alike.
    """
    fields = _cpu_line()
    if fields is None:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def kernel_cpu() -> dict[str, int]:
    """Jiffies since boot that belong to no user process: ``irq + softirq`` (``/proc/stat``'s cpu line) and each
    family of kernel threads (kthreadd's children, pid 2), named up to its first ``/`` less trailing digits
    (``kworker/u64:3`` and ``kworker/7:1H`` are ``kworker``, ``kcompactd0`` is ``kcompactd``); empty without ``/proc``.

    What the accounting of a cut's processes cannot see: the host's busy time outside them is these and the
    processes that ran beside the benchmark.
    """
    fields = _cpu_line()
    if fields is None or len(fields) < 7:
        return {}
    out = {"irq + softirq": fields[5] + fields[6]}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            comm, rest = stat_fields(f"/proc/{entry.name}/stat")
        except OSError:
            continue  # gone
        if rest[1] != "2":
            continue
        family = "kernel threads: " + comm.split("/")[0].rstrip(".0123456789")
        out[family] = out.get(family, 0) + int(rest[11]) + int(rest[12])
    return out


def _cpu_line() -> list[int] | None:
    """The jiffy counters of ``/proc/stat``'s first line (every CPU), None where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def unaccounted(before: dict[str, int], after: dict[str, int], *, cuts: int, host_busy_s: float | None,
                accounted_s: float | None, least_s: float = 0.01) -> dict[str, float]:
    """Where the host's busy CPU-seconds per cut that no process of a cut was credited with went: each
    :func:`kernel_cpu` family costing at least ``least_s`` per cut (largest first), then ``the rest`` (other
    processes, and exited ones the accounting missed). Empty without both readings or a valid cut."""
    if not before or not after or not cuts or host_busy_s is None or accounted_s is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    spent = {name: (after[name] - before.get(name, 0)) / tick / cuts for name in after}
    out = {name: s for name, s in sorted(spent.items(), key=lambda kv: -kv[1]) if s >= least_s}
    out["the rest"] = host_busy_s - accounted_s - sum(s for s in spent.values() if s > 0)
    return out


def host_load(before: tuple[int, int] | None, after: tuple[int, int] | None, cuts: int) -> dict[str, Any]:
    """The host's CPU between two :func:`host_cpu` readings: ``cpu_busy_fraction`` of all its CPUs, its busy
    seconds ``cpu_busy_s``, the busy ``cpu_s_per_cut`` per valid cut, and ``cpu_bound_cuts_per_hour``, what every CPU kept busy at that cost would
    give (the host's ceiling for this configuration's work); empty when either reading is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return {}
    busy, total = after[0] - before[0], after[1] - before[1]
    cpus = os.cpu_count() or 1
    busy_s = busy / os.sysconf("SC_CLK_TCK")
    out: dict[str, Any] = {"cpus": cpus, "cpu_busy_fraction": busy / total, "cpu_busy_s": busy_s}
    if cuts:
        out["cpu_s_per_cut"] = busy_s / cuts
        out["cpu_bound_cuts_per_hour"] = 3600.0 * cpus / out["cpu_s_per_cut"]
    return out


def steady_rate(finishes: list[tuple[int, str, float]], cuts_of: dict[str, int], jobs: int) -> float | None:
    """Valid cuts per hour between the ``jobs``-th verdict and the last: the run with its start (receiver, the
    first trials' start-up side by side) left out, which is what a long sweep approaches. None for too few
    trials. ``cuts_of``: a valid trial's id → its cuts (absent: not valid)."""
    ordered = sorted(finishes, key=lambda f: f[2])
    if len(ordered) <= jobs:
        return None
    t0, rest = ordered[jobs - 1][2], ordered[jobs:]
    span = rest[-1][2] - t0
    return 3600.0 * sum(cuts_of.get(tid, 0) for _, tid, _ in rest) / span if span > 0 else None


def cpu_by_stage(timeline: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """Per stage of the trials in ``per_trial`` (``trial_id``, ``n_cuts``), per cut of those trials: ``wall_s``,
    every CPU column (``cpu_s``, ``cpu_<role>_s``, …) and the faults and bytes; NaN where the timeline has no
    such column (a run stored before CPU accounting). Events are left out."""
    tl = timeline[timeline["trial_id"].isin(per_trial["trial_id"])]
    if "result" in tl:
        tl = tl[tl["result"] != "event"]
    tl = tl.reindex(columns=["stage", "duration_s", *CPU_COLUMNS])
    numbers = tl.columns.drop("stage")
    tl[numbers] = tl[numbers].apply(pd.to_numeric, errors="coerce")  # a column no stage filled is all None
    cuts = max(int(per_trial["n_cuts"].sum()), 1) if "n_cuts" in per_trial else max(len(per_trial), 1)
    sums = tl.groupby("stage", sort=False).sum(min_count=1).rename(columns={"duration_s": "wall_s"})
    return (sums / cuts).reset_index()


def cpu_by_role(stages: pd.DataFrame) -> dict[str, float]:
    """CPU-seconds per cut of each role (``workload``, ``cuda_threads``, …) and ``total``, summed over the stages of
    :func:`cpu_by_stage`; with the faults and bytes per cut under their own names."""
    out = {role: float(stages[f"cpu_{role}_s"].sum(min_count=1)) for role in CPU_ROLES}
    out["total"] = float(stages["cpu_s"].sum(min_count=1))
    out.update({k: float(stages[k].sum(min_count=1)) for k in COUNTS})
    return out


def cut_bytes(timeline: pd.DataFrame, per_trial: pd.DataFrame) -> dict[str, float]:
    """Bytes per cut of the trials in ``per_trial``, by kind (the keys of :data:`TRANSFERS`).

    ``image_bytes``: the ``bytes`` of every dump stage (:data:`DUMP_STAGES`)
    that ended ok; ``restored_bytes``: those of the cuts whose image a restore
    stage (:data:`RESTORE_STAGES`) read back; ``gpu_bytes``: ``cuda_discover``'s
    (the device state the checkpoint copies to the host); ``gpu_restored_bytes``:
    those of the cuts with a ``cuda_restore`` that ended ok.
    """
    tl = timeline[timeline["trial_id"].isin(per_trial["trial_id"])]
    ok = tl[tl["result"] == "ok"] if "result" in tl else tl
    cuts = max(int(per_trial["n_cuts"].sum()), 1) if "n_cuts" in per_trial else max(len(per_trial), 1)

    def per_cut(stage_names: tuple[str, ...]) -> pd.Series:
        rows = ok[ok["stage"].isin(stage_names)]
        return pd.to_numeric(rows["bytes"], errors="coerce").groupby([rows["trial_id"], rows["cut_index"]]).sum()

    def restored(sizes: pd.Series, stage_names: tuple[str, ...]) -> float:
        back = ok[ok["stage"].isin(stage_names)].set_index(["trial_id", "cut_index"]).index.unique()
        return float(sizes[sizes.index.isin(back)].sum())

    image, gpu = per_cut(DUMP_STAGES), per_cut((GPU_BYTES_STAGE,))
    totals = {"image_bytes": float(image.sum()), "restored_bytes": restored(image, RESTORE_STAGES),
              "gpu_bytes": float(gpu.sum()), "gpu_restored_bytes": restored(gpu, (GPU_RESTORE_STAGE,))}
    return {k: v / cuts for k, v in totals.items()}


def load_bandwidth(path: str | Path) -> dict[str, Any]:
    """The JSON ``benchmarks/bandwidth_reference.py --out`` wrote; :class:`InvalidArgument` naming the file when
    it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"--bandwidth {path}: not a readable bandwidth reference ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise InvalidArgument(f"--bandwidth {path}: not a bandwidth reference (no 'results'; write one with "
                              "benchmarks/bandwidth_reference.py --out FILE)")
    return data


def bytes_need(per_cut: dict[str, float], bandwidth: dict[str, Any]) -> dict[str, Any]:
    """What the bytes of one cut (:func:`cut_bytes`) need at the reference's rates: ``cpu_s`` and ``wall_s`` (NaN
    when bytes of some kind have no measurement to price them: a reference made without a GPU), and ``missing``,
    the measurements that were wanted and absent."""
    results = bandwidth["results"]
    cpu = wall = 0.0
    missing = []
    for kind, name in TRANSFERS.items():
        n = per_cut.get(kind) or 0.0
        if n <= 0:
            continue
        r = results.get(name)
        if not r or not r.get("gb_s"):
            missing.append(name)
            continue
        cpu += n / (1 << 30) * r["cpu_s_per_gib"]
        wall += n / (r["gb_s"] * 1e9)
    nan = float("nan")
    return {"cpu_s": nan if missing else cpu, "wall_s": nan if missing else wall, "missing": missing}


def bandwidth_bound(per_cut: dict[str, float], bandwidth: dict[str, Any]) -> float | None:
    """The cuts per hour this host's aggregate bandwidth allows for the bytes of one cut (:func:`cut_bytes`): an
    hour over the seconds the reference's parallel copies (``bandwidth_reference.py --processes N``) take to move
    them, every copy of every cut sharing the host's memory. None when the reference has no parallel figures for
    some kind of bytes the cut moves."""
    need = bytes_need(per_cut, {"results": (bandwidth.get("parallel") or {}).get("results") or {}})
    return 3600.0 / need["wall_s"] if not need["missing"] and need["wall_s"] > 0 else None


def cost_ratio(stages: pd.DataFrame, per_cut: dict[str, float], bandwidth: dict[str, Any]) -> dict[str, Any]:
    """The cut's cost against what its bytes need: the tool stages' (:func:`classify`) CPU-seconds and wall seconds
    per cut, what the bytes need (:func:`bytes_need`), and their ratios ``cpu_ratio`` and ``wall_ratio``."""
    tool = stages[stages["stage"].map(classify) == "tool"]
    need = bytes_need(per_cut, bandwidth)
    cpu, wall = float(tool["cpu_s"].sum(min_count=1)), float(tool["wall_s"].sum(min_count=1))
    return {"tool_cpu_s": cpu, "tool_wall_s": wall, "need_cpu_s": need["cpu_s"], "need_wall_s": need["wall_s"],
            "cpu_ratio": cpu / need["cpu_s"] if need["cpu_s"] > 0 else float("nan"),
            "wall_ratio": wall / need["wall_s"] if need["wall_s"] > 0 else float("nan"),
            "missing": need["missing"], "bandwidth_bound_cuts_per_hour": bandwidth_bound(per_cut, bandwidth), **per_cut}


def run_config(data: dict[str, Any], out: Path, jobs: int, max_seconds: float | None) -> dict[str, Any]:
    """Run one configuration; return its summary, per-trial frame, stage frame and whether the budget or Ctrl-C
    stopped it."""
    finishes: list[tuple[int, str, float]] = []
    state: dict[str, Any] = {"budget_hit": False, "cpu_end": None, "kernel_end": {}}
    cpu_start, kernel_start = host_cpu(), kernel_cpu()
    t_start = time.monotonic()

    def progress(trial_id: str, outcome: str, done: int, total: int) -> None:
        finishes.append((int(trial_id.lstrip("t")) - 1, trial_id, time.monotonic()))  # t0001 is plan position 0
        state["cpu_end"] = host_cpu()  # at the last verdict: the report's writing is left out, as in the span
        stop = max_seconds is not None and done < total and time.monotonic() - t_start > max_seconds
        if done == total or stop:  # the kernel's threads read once, at the end (a walk of all /proc)
            state["kernel_end"] = kernel_cpu()
        if stop:
            # The runner's Ctrl-C path: workers stop, trials in flight clean up, the finished ones are stored.
            state["budget_hit"] = True
            raise KeyboardInterrupt

    interrupted = False
    try:
        stored = run(load_scenario(data), out=out / "runs", progress=progress)
    except KeyboardInterrupt as exc:  # the budget's stop or a Ctrl-C: the finished trials are stored, partial
        run_dir = getattr(exc, "run_dir", None)
        if run_dir is None:  # before the run had a directory: nothing of it to read
            raise
        stored, interrupted = open_run(run_dir), not state["budget_hit"]
    run_wall = time.monotonic() - t_start
    if not finishes:
        return {"summary": None, "per_trial": pd.DataFrame(), "stages": pd.DataFrame(), "cpu": pd.DataFrame(),
                "run": stored.path, "interrupted": interrupted, "budget_hit": state["budget_hit"]}
    timeline = stored.timeline
    per_trial = breakdown(trial_walls(finishes, jobs, t_start), timeline)
    span = max(t for _, _, t in finishes) - t_start
    summary = summarize(per_trial, stored.trials[["trial_id", "outcome", "n_cuts", "error", "failed_stage"]], span)
    facts = stored.trials[["trial_id", "outcome", "plan", "n_cuts", "gpu_bytes", "image_bytes", "error"]]
    per_trial = per_trial.merge(facts, on="trial_id")
    summary.update(
        planned=int(data["plan"]["trials"]), complete=stored.complete, budget_hit=state["budget_hit"],
        gpu_gib_median=float(per_trial["gpu_bytes"].median() / (1 << 30)) if per_trial["gpu_bytes"].notna().any() else None,
        image_gb_median=float(per_trial["image_bytes"].median() / 1e9) if per_trial["image_bytes"].notna().any() else None,
        run_wall_s=run_wall, run=str(stored.path),
        **host_load(cpu_start, state["cpu_end"], summary["valid_cuts"]))
    valid = stored.trials[stored.trials["outcome"] == "valid"]
    summary["steady_cuts_per_hour"] = steady_rate(finishes, dict(zip(valid["trial_id"], valid["n_cuts"])), jobs)
    cpu = cpu_by_stage(timeline, per_trial)
    cuts = int(per_trial["n_cuts"].sum())
    summary.update(cuts=cuts, cpu_per_cut=cpu_by_role(cpu), bytes_per_cut=cut_bytes(timeline, per_trial),
                   host_busy_s_per_cut=summary["cpu_busy_s"] / cuts if cuts and "cpu_busy_s" in summary else None)
    summary["unaccounted_per_cut"] = unaccounted(kernel_start, state["kernel_end"], cuts=cuts,
                                                 host_busy_s=summary["host_busy_s_per_cut"],
                                                 accounted_s=summary["cpu_per_cut"].get("total"))
    return {"summary": summary, "per_trial": per_trial, "stages": stage_means(timeline, per_trial), "cpu": cpu,
            "run": stored.path, "interrupted": interrupted, "budget_hit": state["budget_hit"]}


def configuration_trials(jobs: int, trials: int, trials_per_job: int | None, min_trials: int = 1) -> int:
    """How many trials a configuration of ``jobs`` workers runs: ``trials_per_job`` × ``jobs`` (each worker about
    that many) when given, else ``trials``; at least ``min_trials`` (the fewest jobs would get too few)."""
    return max(min_trials, trials_per_job * jobs if trials_per_job else trials)


def check_gpu_fit(jobs: list[int], ballast_mib: int, array: str, backend: str) -> None:
    """Raise :class:`InvalidArgument` when the most jobs would oversubscribe this host's first GPU (the one every
    trial of a run uses); nothing to check on a CPU run or a host without a GPU."""
    if array == "numpy" and "cuda" not in backend:
        return
    try:  # the first GPU's memory, as the driver reports it
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return
    first = p.stdout.split()
    if p.returncode == 0 and first and first[0].isdigit():
        error = gpu_fit_error(max(jobs), ballast_mib, int(first[0]))
        if error:
            raise InvalidArgument(error)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: the job counts, cuts per trial and sizes in range (:class:`InvalidArgument`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", nargs="+", type=int, default=[1], help="worker counts, one run each (run.jobs)")
    ap.add_argument("--cuts-per-trial", nargs="+", type=int, default=[1], help="cuts per trial (second axis)")
    ap.add_argument("--source", choices=SOURCES, default="random",
                    help="random: 1 to K cuts per trial from the seed; periodic: exactly K, at ops 1..K")
    ap.add_argument("--trials", type=int, default=12, help="trials per configuration")
    ap.add_argument("--trials-per-job", type=int, default=None, help="instead of --trials: jobs × this many")
    ap.add_argument("--min-trials", type=int, default=1, help="at least this many trials per configuration")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop a configuration this long in (a guard)")
    ap.add_argument("--backend", default="cuda+criu")
    ap.add_argument("--array", default="cupy")
    ap.add_argument("--ballast-mib", type=int, default=1024)
    ap.add_argument("--images-dir", default=None, metavar="DIR",
                    help="pipeline.images_dir: where CRIU writes each cut's image (default the scenario's, /dev/shm)")
    ap.add_argument("--bandwidth", default=None, metavar="FILE",
                    help="a benchmarks/bandwidth_reference.py JSON: print each cut's cost against what its bytes need")
    args = ap.parse_args(argv)
    for name in ("trials", "trials_per_job", "min_trials"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidArgument(f"--{name.replace('_', '-')} {value}: expected at least 1")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise InvalidArgument(f"--max-seconds {args.max_seconds:g}: expected a positive number of seconds")
    if args.ballast_mib < 0:
        raise InvalidArgument(f"--ballast-mib {args.ballast_mib}: expected 0 or more")
    if args.images_dir is not None and not Path(args.images_dir).is_dir():
        raise InvalidArgument(f"--images-dir {args.images_dir}: not a directory (CRIU writes each cut's image there)")
    args.jobs = list(dict.fromkeys(args.jobs))
    args.cuts_per_trial = list(dict.fromkeys(args.cuts_per_trial))
    for jobs in args.jobs:  # each configuration's scenario, checked as a run would check it
        for k in args.cuts_per_trial:
            try:
                load_scenario(scenario_data(backend=args.backend, array=args.array, ballast_mib=args.ballast_mib,
                                            jobs=jobs, cuts_per_trial=k, trials=1, source=args.source,
                                            images_dir=args.images_dir))
            except InvalidArgument as exc:
                raise InvalidArgument(f"--jobs {jobs} --cuts-per-trial {k} --source {args.source}: {exc}") from None
    args.bandwidth_reference = load_bandwidth(args.bandwidth) if args.bandwidth else None
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        check_gpu_fit(args.jobs, args.ballast_mib, args.array, args.backend)
    except CutbenchError as exc:
        print(f"cuts_per_hour: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs, trial_frames, stage_frames, cpu_frames = [], [], [], []
    stopped = False
    for k in args.cuts_per_trial:
        for jobs in args.jobs:
            trials = configuration_trials(jobs, args.trials, args.trials_per_job, args.min_trials)
            data = scenario_data(backend=args.backend, array=args.array, ballast_mib=args.ballast_mib, jobs=jobs,
                                 cuts_per_trial=k, trials=trials, source=args.source, images_dir=args.images_dir)
            print(f"=== jobs {jobs}, cuts per trial {k}: {trials} trials", flush=True)
            res = run_config(data, out, jobs, args.max_seconds)
            if res["summary"] is not None:
                configs.append({"jobs": jobs, "cuts_per_trial": k, **res["summary"]})
                trial_frames.append(res["per_trial"].assign(jobs=jobs, cuts_per_trial=k))
                stage_frames.append(res["stages"].assign(jobs=jobs, cuts_per_trial=k))
                cpu_frames.append(res["cpu"].assign(jobs=jobs, cuts_per_trial=k))
                if args.bandwidth_reference is not None:
                    configs[-1]["bandwidth_ratio"] = cost_ratio(res["cpu"], res["summary"]["bytes_per_cut"],
                                                                args.bandwidth_reference)
            if res["interrupted"]:  # Ctrl-C, not the budget: keep what ran and stop
                stopped = True
                break
        if stopped:
            break
    if not configs:
        print("cuts_per_hour: no trial finished", file=sys.stderr)
        return 1
    stages = stretch(pd.concat(stage_frames, ignore_index=True))
    for c in configs:
        top = top_stretch(stages, c["jobs"], c["cuts_per_trial"])
        c["top_stage"], c["top_stage_ratio"] = top if top else (None, None)
    per_trial = pd.concat(trial_frames, ignore_index=True)
    lead = ["jobs", "cuts_per_trial"]
    per_trial[lead + [c for c in per_trial.columns if c not in lead]].to_csv(out / "cuts_per_hour.csv", index=False)
    stages[lead + ["stage", "mean_s", "n", "per_trial_s", "ratio", "added_s"]].to_csv(out / "stages.csv", index=False)
    cpu = pd.concat(cpu_frames, ignore_index=True)
    cpu[lead + [c for c in cpu.columns if c not in lead]].to_csv(out / "cpu.csv", index=False)
    command = " ".join(["python benchmarks/cuts_per_hour.py", "--out", args.out, "--jobs", *map(str, args.jobs),
                        "--cuts-per-trial", *map(str, args.cuts_per_trial), "--source", args.source,
                        *(["--trials-per-job", str(args.trials_per_job)] if args.trials_per_job
                          else ["--trials", str(args.trials)]),
                        *(["--min-trials", str(args.min_trials)] if args.min_trials > 1 else []),
                        *(["--max-seconds", f"{args.max_seconds:g}"] if args.max_seconds else []),
                        "--backend", args.backend, "--array", args.array, "--ballast-mib", str(args.ballast_mib),
                        *(["--images-dir", args.images_dir] if args.images_dir else []),
                        *(["--bandwidth", args.bandwidth] if args.bandwidth else [])])
    (out / "cuts_per_hour.json").write_text(json.dumps({"configs": configs, "command": command}, indent=2, default=str))
    print_tables(configs, stages)
    print_cpu_tables(configs, cpu, args.bandwidth)
    print(command)
    return 0


def print_tables(configs: list[dict[str, Any]], stages: pd.DataFrame) -> None:
    """The jobs × cuts-per-trial table, each configuration's unknown reasons, and per cuts-per-trial value each
    stage's mean seconds at every job count with its ratio to the fewest jobs."""
    table = pd.DataFrame([{
        "jobs": c["jobs"], "cuts/trial": c["cuts_per_trial"], "trials": c["trials"],
        "cuts/trial mean": c["cuts_per_trial_mean"], "valid cuts": c["valid_cuts"], "cuts/hour": c["cuts_per_hour"],
        "steady cuts/hour": c.get("steady_cuts_per_hour"),
        "host CPU busy %": 100 * c["cpu_busy_fraction"] if "cpu_busy_fraction" in c else None,
        "CPU s/cut": c.get("cpu_s_per_cut"), "CPU-bound cuts/hour": c.get("cpu_bound_cuts_per_hour"),
        "overhead %": 100 * c["overhead_fraction"], "trial wall s": c["mean_trial_wall_s"], "unknown": c["unknown"],
        "top stretching stage": f"{c['top_stage']} ×{c['top_stage_ratio']:.2f}" if c["top_stage"] else "—",
        "stopped": "budget" if c["budget_hit"] else ("" if c["complete"] else "Ctrl-C"),
    } for c in configs])
    print()
    print(table.to_markdown(index=False, floatfmt=".2f"))
    for c in configs:
        for reason, n in c["unknown_reasons"].items():
            print(f"unknown at jobs {c['jobs']}, cuts/trial {c['cuts_per_trial']}: {n} × {reason}")
    for k, group in stages.groupby("cuts_per_trial", sort=False):
        base = group["jobs"].min()
        wide = group.pivot_table(index="stage", columns="jobs", values=["mean_s", "ratio"])
        cols = {}
        for j in sorted(group["jobs"].unique()):
            cols[f"j{j} mean s"] = wide[("mean_s", j)]
            if j != base:
                cols[f"j{j} ×j{base}"] = wide[("ratio", j)]
        print(f"\nstages at {k} cut(s) per trial (mean of one occurrence; ×: ratio to {base} job(s))")
        print(pd.DataFrame(cols).sort_values(f"j{base} mean s", ascending=False).to_markdown(floatfmt=".3f"))


def print_cpu_tables(configs: list[dict[str, Any]], cpu: pd.DataFrame, bandwidth: str | None = None) -> None:
    """Per cuts-per-trial value: CPU-seconds per cut by stage (all roles) beside wall seconds, at every job count;
    by process role, with the host's busy CPU-seconds per cut and the share the accounting explains; faults and
    bytes per cut. With a bandwidth reference (``bandwidth``: its path), each configuration's cost against what
    its bytes need."""
    by_config = {(c["jobs"], c["cuts_per_trial"]): c for c in configs}
    for k, group in cpu.groupby("cuts_per_trial", sort=False):
        jobs = sorted(group["jobs"].unique())
        cols = {}
        for j in jobs:
            mine = group[group["jobs"] == j].set_index("stage")
            cols[f"j{j} CPU s"] = mine["cpu_s"]
            cols[f"j{j} wall s"] = mine["wall_s"]
        table = pd.DataFrame(cols)
        print(f"\nCPU-seconds per cut at {k} cut(s) per trial, by stage (every process the stage involves; wall "
              "seconds beside)")
        print(table.sort_values(f"j{jobs[0]} CPU s", ascending=False).to_markdown(floatfmt=".3f"))
        rows = []
        for name in [*CPU_ROLES, "total"]:
            rows.append({"role": name, **{f"j{j}": by_config[(j, k)]["cpu_per_cut"].get(name) for j in jobs}})
        rows.append({"role": "host busy (every process)", **{f"j{j}": by_config[(j, k)].get("host_busy_s_per_cut")
                                                             for j in jobs}})
        rows.append({"role": "accounted % of host busy", **{f"j{j}": _share(by_config[(j, k)]) for j in jobs}})
        # The busy time no cut's process was credited with: the kernel's own threads and interrupts, the rest.
        outside = list(dict.fromkeys(name for j in jobs for name in by_config[(j, k)].get("unaccounted_per_cut", {})))
        rows += [{"role": f"not accounted: {name}",
                  **{f"j{j}": by_config[(j, k)].get("unaccounted_per_cut", {}).get(name) for j in jobs}}
                 for name in outside]
        print(f"\nCPU-seconds per cut at {k} cut(s) per trial, by process role")
        print(pd.DataFrame(rows).set_index("role").to_markdown(floatfmt=".3f"))
        rows = [{"per cut": name, **{f"j{j}": by_config[(j, k)]["cpu_per_cut"].get(name) for j in jobs}}
                for name in COUNTS]
        rows += [{"per cut": name, **{f"j{j}": by_config[(j, k)]["bytes_per_cut"].get(name) for j in jobs}}
                 for name in TRANSFERS]
        print(f"\npage faults and bytes per cut at {k} cut(s) per trial (write_bytes: reached storage; wchar_bytes: "
              "handed to write(2), tmpfs included; image/gpu bytes: from the stage records)")
        print(pd.DataFrame(rows).set_index("per cut").to_markdown(floatfmt=",.0f"))
    ratios = [(c, c["bandwidth_ratio"]) for c in configs if "bandwidth_ratio" in c]
    if ratios:
        print(f"\nthe cut's cost against what its bytes need ({bandwidth}): tool stages per cut over the reference's "
              "tmpfs write/read and D2H/H2D (pageable) of the same bytes")
        print(pd.DataFrame([{
            "jobs": c["jobs"], "cuts/trial": c["cuts_per_trial"], "image MB/cut": r["image_bytes"] / 1e6,
            "GPU MB/cut": r["gpu_bytes"] / 1e6, "tool CPU s/cut": r["tool_cpu_s"], "bytes' CPU s/cut": r["need_cpu_s"],
            "CPU ×": r["cpu_ratio"], "tool wall s/cut": r["tool_wall_s"], "bytes' wall s/cut": r["need_wall_s"],
            "wall ×": r["wall_ratio"], "bytes-bound cuts/hour": r.get("bandwidth_bound_cuts_per_hour"),
        } for c, r in ratios]).to_markdown(index=False, floatfmt=[".0f", ".0f", *[".3f"] * 8, ".0f"]))
        print("bytes-bound cuts/hour: what the host's aggregate bandwidth (the reference's --processes copies) allows "
              "for these bytes, nothing else running; empty without parallel figures")
        for c, r in ratios:
            if r["missing"]:
                print(f"jobs {c['jobs']}, cuts/trial {c['cuts_per_trial']}: the reference lacks {', '.join(r['missing'])} "
                      "(made without a GPU?): no ratio")


def _share(config: dict[str, Any]) -> float | None:
    """The accounted CPU-seconds per cut as a percentage of the host's busy ones (None where either is missing)."""
    busy, total = config.get("host_busy_s_per_cut"), config["cpu_per_cut"].get("total")
    return 100.0 * total / busy if busy and total == total else None


if __name__ == "__main__":
    sys.exit(main())
