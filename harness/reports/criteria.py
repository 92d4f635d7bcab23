"""The six criteria for any checkpoint tool, measured: consistency, transparency, coverage, speed, correctness, overhead.

A pure renderer over stored runs (trials and timeline tables, the run's
metadata): :func:`criteria` returns one row per backend and criterion with
its value, unit, interval, how it was measured and the command that made the
data. Nothing is typed in: transparency, the domains and the stages come
from the backends' declared capabilities as each run stored them
(``run.toml``'s ``backends``), everything else from trials.

Clock (every time here): monotonic; a stage starts when its call is issued
and stops when it returns. A **restore** is the sum of a backend's restore
stages for one cut (for ``restart``, the native cold start: starting the
job again and recomputing ops 1..k until it stands at the cut point again,
``restart_spawn`` + ``restart_catch_up``). Throughput is the workload's ops
over its wall time in the trial (spawn issued → exit seen).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cutbench.harness.model.certificate import CERTIFY_OFF
from cutbench.harness.checker.stats import wilson_interval
from cutbench.harness.nemesis import Backends

CRITERIA: tuple[str, ...] = ("consistency", "transparency", "coverage", "speed", "correctness", "overhead")
# ``value`` is the measured number (None where there is no data); ``text`` a value that is not a number
# (transparency, the domains held). ``low``/``high``: the 95% interval where there is one.
COLUMNS: tuple[str, ...] = ("backend", "criterion", "quantity", "value", "text", "unit", "low", "high", "n", "method",
                            "command")
# Findings that mean the restored run's output differs from the uninterrupted run's.
OUTPUT_FINDINGS: tuple[str, ...] = ("duplicate", "missing", "mixed_epoch", "restarted", "process_lost", "deadlock")
# Findings of a restore the tool accepted while the state it brought back was wrong: worse than a restart.
SILENT_FINDINGS: tuple[str, ...] = ("mixed_epoch", "pointer_changed", "unsafe_acceptance")
_RESTORE_STAGE = re.compile(r"(restore|unlock|restart_spawn|restart_catch_up)$")
_NOT_CAPTURE = ("split_window",)  # a deliberate wait of the plan, not the tool's work
_BOOTSTRAP = 2000
# Restore time is fitted against image size only for images up to at least this many GiB (below it the
# process start, not the bytes, is the restore time).
FIT_MIN_GIB = 0.25


@dataclass(frozen=True)
class StoredRun:
    """One run's tables as :func:`criteria` reads them."""

    trials: pd.DataFrame
    timeline: pd.DataFrame
    meta: dict[str, Any]
    # The receiver's effects (steady-state throughput from the first arrival of each op); may be empty.
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)


def declared(runs: list[StoredRun], names: list[str]) -> dict[str, dict[str, Any]]:
    """What each backend in ``names`` declared (``stages``, ``covers``, ``workload_changes``), as the runs stored it
    in ``run.toml``'s ``backends``; one the runs hold no record of (a run stored before that record, or a backend
    none of them ran) is asked of the registry, once."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        out.update({k: v for k, v in (run.meta.get("backends") or {}).items() if k not in out})
    missing = [n for n in names if n not in out]
    if missing:
        out.update(Backends().record(missing))
    return out


def stage_roles(stages: list[str] | tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return ``(checkpoint stages, restore stages)`` of a backend's declared ``stages``.

    A stage named ``…restore``, ``…unlock`` (or the restart's spawn and
    catch-up) brings the workload back; the others take the checkpoint.
    """
    stages = [s for s in stages if s not in _NOT_CAPTURE]
    restore = tuple(s for s in stages if _RESTORE_STAGE.search(s))
    return tuple(s for s in stages if s not in restore), restore


def command_of(meta: dict[str, Any]) -> str:
    """The command that made a run, as its metadata records it."""
    if meta.get("command"):
        return str(meta["command"])
    scenario = meta.get("scenario", {})
    path = scenario.get("source_path") or scenario.get("name", "SCENARIO")
    sweep = meta.get("sweep") or {}
    axes = " ".join(f"--axis {a}" for a in sweep.get("axes", [])) if isinstance(sweep, dict) else ""
    return f"cutbench {'sweep' if sweep else 'run'} {path} {axes}".strip()


def criteria(runs: list[StoredRun]) -> pd.DataFrame:
    """The criteria table for every backend in ``runs`` (columns :data:`COLUMNS`).

    One row per backend and measured quantity; ``criterion`` is one of
    :data:`CRITERIA`. A criterion the runs hold no data for gets a row with
    value ``None`` and the method saying what run would fill it.
    """
    trials = pd.concat([_tagged(i, r) for i, r in enumerate(runs)], ignore_index=True) if runs else pd.DataFrame()
    timeline = pd.concat([r.timeline.assign(_run=i) for i, r in enumerate(runs)], ignore_index=True) if runs else pd.DataFrame()
    effects = pd.concat([r.effects.assign(_run=i) for i, r in enumerate(runs) if not r.effects.empty], ignore_index=True) \
        if any(not r.effects.empty for r in runs) else pd.DataFrame()
    rows: list[dict[str, Any]] = []
    if trials.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    native = trials[trials["n_cuts"] == 0]
    cut = trials[trials["n_cuts"] > 0]
    stage_time = _stage_sums(timeline)
    names = sorted(cut["backend"].unique())
    decl = declared(runs, [*names, "restart"])
    for backend in names:
        mine = cut[cut["backend"] == backend]
        rows += _consistency(backend, mine)
        rows += _transparency(backend, mine, decl[backend])
        rows += _coverage(backend, mine, decl[backend])
        rows += _speed(backend, mine, cut, stage_time, decl)
        rows += _correctness(backend, mine)
        rows += _overhead(backend, mine, native, timeline, effects)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table.astype({"value": float, "low": float, "high": float, "n": "Int64"})


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table for people: one ``value`` column with the interval and unit, the method, no command."""
    def shown(row: pd.Series) -> str:
        if row["text"]:
            return row["text"]
        if pd.isna(row["value"]):
            return "no data"
        fmt = (lambda v: f"{v:.3g}") if row["unit"] in ("s", "ratio", "s/GiB") else (lambda v: f"{v:.1f}" if row["unit"] == "%" else f"{v:g}")
        ci = f" ({fmt(row['low'])}–{fmt(row['high'])})" if pd.notna(row["low"]) and pd.notna(row["high"]) else ""
        unit = {"": "", "ratio": "×", "%": "%"}.get(row["unit"], " " + row["unit"])
        return f"{fmt(row['value'])}{unit}{ci}"
    out = table.assign(value=table.apply(shown, axis=1), n=table["n"].astype("object").where(table["n"].notna(), ""))
    return out[["backend", "criterion", "quantity", "value", "n", "method"]]


def _tagged(index: int, run: StoredRun) -> pd.DataFrame:
    """The run's trials with where they came from: its index, its command, its plan source."""
    t = run.trials.copy()
    if "variant" not in t:
        t["variant"] = ""
    t["_command"] = command_of(run.meta)
    t["_run"] = index
    scenario = run.meta.get("scenario", {})
    # Each variant may have its own plan source (a soak beside restores): the run records them all.
    sources = {v.get("variant"): v.get("plan_source") for v in scenario.get("variants", [])}
    # A native run is only the baseline of a soak with the same workload parameters.
    params = {v.get("variant"): json.dumps(v.get("params", {}), sort_keys=True) for v in scenario.get("variants", [])}
    t["_params"] = [params.get(v) or json.dumps(scenario.get("params", {}), sort_keys=True) for v in t["variant"]]
    base = scenario.get("plan_source", "")
    t["_source"] = [sources.get(v) or base for v in t["variant"]]
    for kind in OUTPUT_FINDINGS + SILENT_FINDINGS:  # runs stored before a finding existed never saw it
        if kind not in t:
            t[kind] = 0
    return t


def _row(backend: str, criterion: str, quantity: str, value: Any, unit: str, method: str, command: str,
         low: Any = None, high: Any = None, n: int | None = None) -> dict[str, Any]:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"backend": backend, "criterion": criterion, "quantity": quantity,
            "value": None if number is None else float(number), "text": "" if value is None or number is not None else str(value),
            "unit": unit, "low": low, "high": high, "n": n, "method": method, "command": command}


def _commands(trials: pd.DataFrame) -> str:
    return "; ".join(dict.fromkeys(trials["_command"])) if len(trials) else ""


def _brought_back(t: pd.DataFrame) -> pd.DataFrame:
    """Trials the tool brought back: restored after a fault, or resumed in place (fault ``none``), and judged."""
    return t[((t["restores"] > 0) | ((t["fault"] == "none") & (t["status"] != "refused"))) & (t["outcome"] != "unknown")]


def _consistency(backend: str, t: pd.DataFrame) -> list[dict[str, Any]]:
    restored = _brought_back(t)
    method = ("trials restored (or resumed in place) whose output equals the uninterrupted run's: the workload ran to "
              "its end, the final state checksum and every effect's payload match the reference, every effect arrived "
              "once, and the run continued (no " + ", ".join(OUTPUT_FINDINGS) + ")")
    if restored.empty:
        return [_row(backend, "consistency", "output continuity", None, "%", method + "; no trial brought back here",
                     _commands(t))]
    differs = (restored[list(OUTPUT_FINDINGS)].sum(axis=1) > 0) | (restored["status"] != "completed")
    same = int((~differs).sum())
    low, high = wilson_interval(same, len(restored))
    rows = [_row(backend, "consistency", "output continuity", 100.0 * same / len(restored), "%", method,
                 _commands(restored), 100 * low, 100 * high, len(restored))]
    for fault, group in restored.groupby("fault"):
        d = (group[list(OUTPUT_FINDINGS)].sum(axis=1) > 0) | (group["status"] != "completed")
        s = int((~d).sum())
        lo, hi = wilson_interval(s, len(group))
        rows.append(_row(backend, "consistency", f"output continuity, fault {fault}", 100.0 * s / len(group), "%",
                         "as above, the trials of this fault", _commands(group), 100 * lo, 100 * hi, len(group)))
    restarted = int((restored["restarted"] > 0).sum())
    rows.append(_row(backend, "consistency", "restores that started anew", restarted, "trials",
                     "restored trials the oracle found `restarted` (from the workload's own count of fresh starts)",
                     _commands(restored), n=len(restored)))
    return rows


def _transparency(backend: str, t: pd.DataFrame, caps: dict[str, Any]) -> list[dict[str, Any]]:
    needs = caps["workload_changes"]
    return [_row(backend, "transparency", "changes to the application", needs or "none", "",
                 "declared by the backend (Capabilities.workload_changes); the workloads it ran here are the same "
                 "code for every backend", _commands(t))]


def _coverage(backend: str, t: pd.DataFrame, caps: dict[str, Any]) -> list[dict[str, Any]]:
    covers = ", ".join(sorted(caps["covers"])) or "none"
    rows = [_row(backend, "coverage", "state domains held", covers, "",
                 "declared by the backend (Capabilities.covers); a workload using another domain is an unsafe acceptance",
                 _commands(t))]
    judged = t[t["outcome"] != "unknown"]
    if judged.empty:
        return rows
    # Supported: the tool checkpointed and brought the workload back valid at least once, and never
    # accepted a restore with a domain it does not hold. Duplicates and losses are correctness's story.
    per = judged.assign(_back=(judged["outcome"] == "valid") & (judged["restores"] + (judged["fault"] == "none") > 0),
                        _gap=judged["unsafe_acceptance"] > 0).groupby("variant")
    supported = [v for v, g in per if g["_back"].any() and not g["_gap"].any()]
    ran = per.ngroups
    rows.append(_row(backend, "coverage", "workloads supported", len(supported), "workloads",
                     f"of {ran} workload variants run: brought back valid in at least one trial and no "
                     f"unsafe_acceptance in any (supported: {', '.join(map(str, supported)) or 'none'})",
                     _commands(judged), n=ran))
    return rows


def _stage_sums(timeline: pd.DataFrame) -> pd.DataFrame:
    """Seconds per (run, trial, cut, stage) of stages that ended ok."""
    if timeline.empty:
        return pd.DataFrame(columns=["_run", "trial_id", "cut_index", "stage", "duration_s"])
    ok = timeline[timeline["result"] == "ok"]
    return ok.groupby(["_run", "trial_id", "cut_index", "stage"], as_index=False)["duration_s"].sum()


def _per_cut(trials: pd.DataFrame, stage_time: pd.DataFrame, stages: tuple[str, ...], *, every: bool = False) -> pd.DataFrame:
    """Per trial: seconds of ``stages`` in its first cut.

    Only trials where each of those stages that ran for these trials at all
    ran (a stage no trial here needed, such as ``prepare`` for a workload
    without an adapter, is not required); ``every``: all of ``stages`` must run.
    """
    if not stages or trials.empty:
        return pd.DataFrame(columns=["_run", "trial_id", "seconds"])
    keys = trials[["_run", "trial_id"]]
    s = stage_time[(stage_time["cut_index"] == 0) & stage_time["stage"].isin(stages)]
    s = s.merge(keys, on=["_run", "trial_id"])
    required = len(stages) if every else s["stage"].nunique()
    counts = s.groupby(["_run", "trial_id"])["stage"].nunique()
    total = s.groupby(["_run", "trial_id"])["duration_s"].sum()
    full = total[counts == required] if required else total.iloc[0:0]
    return full.rename("seconds").reset_index()


def _median_ci(values: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Median and a bootstrap 95% interval."""
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return float(values[0]), float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(values, size=(_BOOTSTRAP, len(values))), axis=1)
    return float(np.median(values)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def _speed(backend: str, mine: pd.DataFrame, every: pd.DataFrame, stage_time: pd.DataFrame,
           decl: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    capture, restore = stage_roles(decl[backend]["stages"])
    rows = []
    ck = _per_cut(mine, stage_time, capture)
    if len(ck):
        med, lo, hi = _median_ci(ck["seconds"].to_numpy())
        rows.append(_row(backend, "speed", "checkpoint", med, "s", f"median over trials of the first cut's {' + '.join(capture)}",
                         _commands(mine), lo, hi, len(ck)))
    # Resumed in place (fault none) counts where the backend's restore stages ran for it (cuda, cuda-checkpoint).
    restored = _brought_back(mine)
    # A cold start is only complete with both of its stages (older runs timed the spawn alone).
    rs = _per_cut(restored, stage_time, restore, every=backend == "restart")
    if not len(rs):
        rows.append(_row(backend, "speed", "restore", None, "s", "no trial whose restore stages ran here", _commands(mine)))
        return rows
    med, lo, hi = _median_ci(rs["seconds"].to_numpy())
    rows.append(_row(backend, "speed", "restore", med, "s", f"median over trials brought back of {' + '.join(restore)}",
                     _commands(restored), lo, hi, len(rs)))
    rows += _restore_vs_bytes(backend, restored, rs)
    # Against a cold start only what came back after a crash: a resume in place never crashed.
    crashed = restored[restored["restores"] > 0]
    rows += _restore_vs_cold_start(backend, crashed, rs.merge(crashed[["_run", "trial_id"]]), every, stage_time,
                                   decl["restart"]["stages"])
    return rows


def _restore_vs_bytes(backend: str, restored: pd.DataFrame, rs: pd.DataFrame) -> list[dict[str, Any]]:
    """Restore seconds against image GiB: a line per workload that ran at 3 or more clearly different sizes."""
    # A trial's image_bytes adds up all its cuts: only single-cut trials pair one image with one restore.
    single = restored[restored["n_cuts"] == 1]
    joined = rs.merge(single[["_run", "trial_id", "image_bytes", "workload"]],
                      on=["_run", "trial_id"]).dropna(subset=["image_bytes"])
    rows = []
    for workload, g in joined.groupby("workload"):
        gib = g["image_bytes"].to_numpy(float) / 2**30
        # Sizes within 5% of the largest are one size (a few kilobytes of difference is no trend), and
        # a line is drawn only across a real range of sizes: at least 4x, up to at least FIT_MIN_GIB.
        sizes = np.unique(np.round(gib / (0.05 * gib.max()))) if gib.max() > 0 else np.array([])
        if len(sizes) < 3 or gib.max() < FIT_MIN_GIB or gib.max() < 4 * gib.min():
            continue
        secs = g["seconds"].to_numpy(float)
        slope, intercept = np.polyfit(gib, secs, 1)
        ss = float(((secs - secs.mean()) ** 2).sum())
        r2 = 1 - float(((secs - (slope * gib + intercept)) ** 2).sum()) / ss if ss else 1.0
        rows.append(_row(backend, "speed", f"restore per GiB of image, {workload}", float(slope), "s/GiB",
                         f"least-squares line over {len(sizes)} image sizes: {intercept:.2f} s + {slope:.2f} s/GiB, "
                         f"R² {r2:.3f}", _commands(restored), n=len(g)))
    return rows


def _restore_vs_cold_start(backend: str, restored: pd.DataFrame, rs: pd.DataFrame, every: pd.DataFrame,
                           stage_time: pd.DataFrame, restart_stages: list[str]) -> list[dict[str, Any]]:
    """Restore against the native cold start (``restart``) of the same workload variant and cut point."""
    if backend == "restart":
        return []
    cold_trials = every[(every["backend"] == "restart") & (every["restores"] > 0)]
    cold = _per_cut(cold_trials, stage_time, stage_roles(restart_stages)[1], every=True)
    if cold.empty:
        return [_row(backend, "speed", "restore / native cold start", None, "ratio",
                     "no `restart` trials in these runs: add backend `restart` to measure the cold start", "")]
    key = ["variant", "workload", "cut_op", "cut_phase"]
    cold = cold.merge(cold_trials[["_run", "trial_id", *key]], on=["_run", "trial_id"])
    mine = rs.merge(restored[["_run", "trial_id", *key]], on=["_run", "trial_id"])
    pairs = mine.groupby(key)["seconds"].median().to_frame("restore").join(
        cold.groupby(key)["seconds"].median().rename("cold"), how="inner")
    if pairs.empty:
        return [_row(backend, "speed", "restore / native cold start", None, "ratio",
                     "the `restart` trials cut other workloads or points than this backend's", "")]
    ratio = pairs["restore"] / pairs["cold"]
    rows = [_row(backend, "speed", "restore / native cold start", float(ratio.median()), "ratio",
                 "median over workload variants and cut points of (median restore) / (median cold start of `restart`: "
                 f"start again + recompute ops 1..k); below 1: restoring beats starting again; over {len(pairs)} "
                 f"pairs the ratio ranged {ratio.min():.3g}–{ratio.max():.3g}", _commands(restored), n=len(pairs))]
    for (variant, workload, op, phase), r in pairs.iterrows():
        rows.append(_row(backend, "speed", f"restore / cold start, {variant or workload} at {int(op)}/{phase}",
                         float(r["restore"] / r["cold"]), "ratio",
                         f"restore {r['restore']:.3f} s against cold start {r['cold']:.3f} s", _commands(restored)))
    return rows


def _correctness(backend: str, t: pd.DataFrame) -> list[dict[str, Any]]:
    judged = t[t["outcome"].isin(["valid", "invalid"])]
    n = len(judged)
    invalid = int((judged["outcome"] == "invalid").sum())
    if not n:
        return [_row(backend, "correctness", "invalid recovery rate", None, "%", "no judged trial", _commands(t))]
    low, high = wilson_interval(invalid, n)
    silent = judged[(judged["status"] == "completed") & (judged[list(SILENT_FINDINGS)].sum(axis=1) > 0)]
    s_low, s_high = wilson_interval(len(silent), n)
    return [
        _row(backend, "correctness", "invalid recovery rate", 100.0 * invalid / n, "%",
             "invalid / (valid + invalid) over every judged trial of these runs (their cut placement is the "
             "scenarios'), Wilson 95% interval", _commands(judged),
             100 * low, 100 * high, n),
        _row(backend, "correctness", "silent corruption rate", 100.0 * len(silent) / n, "%",
             "trials the tool completed while the state it restored was wrong (" + ", ".join(SILENT_FINDINGS) +
             "): worse than a restart, which at least says so", _commands(judged), 100 * s_low, 100 * s_high, n),
    ]


def _pace(timeline: pd.DataFrame, effects: pd.DataFrame) -> pd.DataFrame:
    """Per (run, trial): ``ops`` and ``span_s`` for its steady-state throughput.

    From the receiver: the first arrival of op 1 to the first arrival of the
    last op (start-up and shutdown left out; every checkpoint pause, restore
    and recomputation in between counted). Without effects: the trial's wall
    time, spawn issued → exit seen, over its ops.
    """
    if not effects.empty and {"op_id", "received_at", "trial_id"} <= set(effects.columns):
        first = effects.groupby(["_run", "trial_id", "op_id"])["received_at"].min().reset_index()
        span = first.groupby(["_run", "trial_id"]).agg(lo=("op_id", "min"), hi=("op_id", "max"),
                                                        t0=("received_at", "min"), t1=("received_at", "max"))
        span = span[span["hi"] > span["lo"]]
        return pd.DataFrame({"ops": span["hi"] - span["lo"], "span_s": span["t1"] - span["t0"]}).reset_index()
    span = timeline.groupby(["_run", "trial_id"]).agg(t0=("t_start", "min"), t1=("t_end", "max"))
    return pd.DataFrame({"ops": float("nan"), "span_s": span["t1"] - span["t0"]}).reset_index()


def _overhead(backend: str, mine: pd.DataFrame, native: pd.DataFrame, timeline: pd.DataFrame,
              effects: pd.DataFrame) -> list[dict[str, Any]]:
    periodic = mine[mine["_source"] == "periodic"]
    # The native runs: the same workload with no cut, in the same runs.
    base = native[native["_params"].isin(periodic["_params"].unique()) & native["_run"].isin(periodic["_run"].unique())
                  & native["status"].isin(["completed", "refused"])]
    method = ("steady-state throughput (ops / s from the receiver's first arrival of op 1 to that of the last op: "
              "start-up left out) with a checkpoint every T s against the same workload with no checkpointer in the "
              "same runs; 1 - with/without, bootstrap 95% interval over repeats")
    if periodic.empty or base.empty:
        return [_row(backend, "overhead", "throughput lost", None, "%", method + "; needs plan.source = \"periodic\" "
                     "runs with and without cuts (plan.interval_ops 0): scenarios/criteria-*.toml", _commands(mine))]
    pace = _pace(timeline, effects)
    if pace["ops"].isna().all():
        method = method.replace("from the receiver's first arrival of op 1 to that of the last op: start-up left out",
                                "over the trial's wall time, spawn issued to exit seen: no effects stored")

    def throughput(t: pd.DataFrame) -> pd.DataFrame:
        w = t.merge(pace, on=["_run", "trial_id"])
        ops = w["ops"].fillna(w["host_op"])
        return w.assign(ops_per_s=ops / w["span_s"])

    nat = throughput(base)
    rows = []
    periodic = periodic.assign(certify=periodic["certify"].fillna(CERTIFY_OFF) if "certify" in periodic else CERTIFY_OFF)
    judged = periodic[periodic["outcome"] != "unknown"]
    for (fault, n_cuts, mode, certify, _variant), group in throughput(judged).groupby(
            ["fault", "n_cuts", "receiver_mode", "certify", "variant"]):
        same = nat[nat["_params"].isin(group["_params"]) & nat["_run"].isin(group["_run"])]
        with_, without = group["ops_per_s"].to_numpy(float), same["ops_per_s"].to_numpy(float)
        if not len(with_) or not len(without):
            continue
        rng = np.random.default_rng(0)
        boot = [1 - rng.choice(with_, len(with_)).mean() / rng.choice(without, len(without)).mean() for _ in range(_BOOTSTRAP)]
        interval_s = float(same["span_s"].mean() / max(int(n_cuts), 1))
        # A fenced receiver with certified cuts pays in effect latency too: its own row.
        how = f", {mode} receiver, certify {certify}" if mode == "fenced" or certify != CERTIFY_OFF else ""
        rows.append(_row(backend, "overhead", f"throughput lost, fault {fault}{how}, a cut every {interval_s:.2f} s",
                         100.0 * (1 - with_.mean() / without.mean()), "%",
                         method + f"; {int(n_cuts)} cuts per run, {with_.mean():.1f} against {without.mean():.1f} ops/s",
                         _commands(group), 100 * float(np.percentile(boot, 2.5)), 100 * float(np.percentile(boot, 97.5)),
                         len(group)))
    fenced = periodic[(periodic["receiver_mode"] == "fenced")]
    if "release_latency_median_s" in fenced and fenced["release_latency_median_s"].notna().any():
        lat = fenced["release_latency_median_s"].dropna().to_numpy(float)
        med, lo, hi = _median_ci(lat)
        rows.append(_row(backend, "overhead", "effect release latency, fenced receiver", med, "s",
                         "median over the soak's fenced trials of each trial's median time from an effect's prepare to "
                         "its release by the checkpoint that covers it (output commit's real cost)", _commands(fenced),
                         lo, hi, len(lat)))
    return rows or [_row(backend, "overhead", "throughput lost", None, "%", method + "; no trial with a measured pace",
                         _commands(mine))]
