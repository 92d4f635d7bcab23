"""The CUDA support matrix as a judgement: each trial of a probe through a tool becomes one cell.

Pure: the trials table and ``run.toml`` of matrix runs in, the matrix table out (and the comparison of
two matrices). The grid — probe rows × tools × faults — is the one ``run.toml``'s ``[matrix]`` table
records; a grid point without a trial takes the reason the run recorded for skipping it.

A cell says what **the tool** did, in one of these words (:data:`CELLS`):

======================= =============================================================================
``identical``           continued identically: ran to its end after the restore (or the in-place
                        resume) with every effect, every state digest and every pointer equal to the
                        uninterrupted run's
``refused``             refused cleanly: the tool declined and the process ran on by itself
``failed``              the tool failed (its own words in ``detail``): the application died, was left
                        locked or checkpointed, the image did not restore, the restored process died —
                        or the tool declined but left the process for the harness to bring back
``hung``                a stage or the restored application stopped making progress
``wrong``               restored silently wrong: the tool reported success and the state, an effect or
                        a pointer differs from the uninterrupted run (the worst cell)
``unknown``             the harness could not judge the trial (its own failure; the reason says which)
``not_measured``        not run here: the tool is unavailable, does not do this fault, or the probe needs
                        what this machine lacks (a second GPU), or was not deterministic here
======================= =============================================================================

Where the harness had to act to bring the process back (unlock it, restore its GPU state, kill it),
``harness_action`` says what it did, and a refusal that needed it is not clean: ``failed``.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from cutbench.errors import HUNG_MARK
from cutbench.harness.model.plan import SAME_GPU
from cutbench.harness.model.scenario import Arm

CELLS: tuple[str, ...] = ("identical", "refused", "failed", "hung", "wrong", "unknown", "not_measured")
# How bad a cell is, for "the worst cell of a feature" (a feature measured by several rows).
SEVERITY: dict[str, int] = {"identical": 0, "refused": 1, "not_measured": 2, "unknown": 3, "failed": 4, "hung": 5,
                            "wrong": 6}
# The one receiver mode of matrix trials: a resend after a reconnect is suppressed, so a cell is about device and
# host state, not about the application's effect protocol.
RECEIVER_MODE = "idempotent"
# Findings that are the tool's failure rather than a wrong state.
_FAILURE_KINDS = {"process_lost", "deadlock"}
# Columns of matrix.parquet (and the environment ones from ENVIRONMENT_COLUMNS).
COLUMNS: tuple[str, ...] = ("row", "feature", "description", "probe", "array", "tool", "fault", "cell", "detail",
                            "harness_action", "trial_id", "run_dir", "measures")
ENVIRONMENT_COLUMNS: tuple[str, ...] = ("gpu", "driver", "cuda", "criu", "kernel", "cuda_checkpoint", "cuda_bindings")


def arm_label(tool: str, fault: str, restore_target: str = SAME_GPU) -> str:
    """The arm label of a matrix trial (``Arm.label`` of its one receiver mode), as run.toml's skipped arms name it."""
    return Arm(tool, RECEIVER_MODE, fault, 0.0, 0.0, restore_target=restore_target).label()


def cell_of(trial: dict[str, Any]) -> tuple[str, str]:
    """The cell word and its detail for one row of ``trials.parquet`` (a matrix trial).

    The detail is the tool's own words for a refusal or failure, the findings for a wrong state,
    the reason for an unknown; empty for ``identical``.
    """
    outcome, status = trial.get("outcome"), trial.get("status")
    error = str(trial.get("error") or "")
    action = str(trial.get("harness_action") or "")
    findings = json.loads(trial.get("findings") or "[]")
    kinds = {f["kind"] for f in findings}
    if outcome == "unknown" or status == "unknown":  # the harness's own failure, whatever words it carries
        return "unknown", error or "the harness could not judge the trial"
    measures = json.loads(trial.get("measures") or "{}")
    if measures.get("precondition_met") == 0.0:  # the probe says its situation never arose (a filler too late)
        return "not_measured", f"the probe's precondition did not hold in this trial (measures {measures})"
    if status == "deadlock" or HUNG_MARK in error or "deadlock" in kinds:
        return "hung", error or _describe(findings)
    if status == "lost" or "process_lost" in kinds:
        stage = trial.get("failed_stage") or ""
        return "failed", f"{stage}: {error}".strip(": ") + (f" (harness: {action})" if action else "")
    if outcome == "invalid":
        wrong = [f for f in findings if f["kind"] not in _FAILURE_KINDS]
        return "wrong", _describe(wrong)
    if outcome == "refused":
        stage = trial.get("failed_stage") or ""
        words = f"{stage}: {error}".strip(": ")
        if action:
            return "failed", f"{words} (declined, but the harness had to {action})"
        return "refused", words
    if outcome == "valid":
        if int(trial.get("restores") or 0) >= 1 or trial.get("fault") == "none":
            return "identical", ""
        return "unknown", "valid, yet no restore was carried out"
    return "unknown", error or "the harness could not judge the trial"


def _describe(findings: list[dict[str, Any]], limit: int = 3) -> str:
    parts = [f"{f['kind']}" + (f" op {f['op']}" if f.get("op") is not None else "") + f": {f.get('detail', '')}"
             for f in findings[:limit]]
    more = len(findings) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def environment_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The matrix's environment columns from a run's ``run.toml``: GPU, driver, CUDA, CRIU, kernel, tools."""
    env = meta.get("environment") or {}
    gpu = env.get("gpu") or {}
    names = sorted({g.get("name", "") for g in gpu.get("gpus") or ()} - {""})
    return {
        "gpu": ", ".join(names) or "none",
        "driver": gpu.get("driver_version") or "",
        "cuda": gpu.get("cuda_driver_version") or "",
        "criu": (env.get("criu") or {}).get("version") or "",
        "kernel": env.get("kernel") or "",
        "cuda_checkpoint": (meta.get("matrix") or {}).get("cuda_checkpoint_version") or "",
        "cuda_bindings": (env.get("packages") or {}).get("cuda-bindings") or "",
    }


def build(trials: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The matrix of one matrix run: one row per (probe row, tool, fault) of its grid (:data:`COLUMNS`
    and :data:`ENVIRONMENT_COLUMNS`).

    ``meta`` is the run's ``run.toml`` with its ``[matrix]`` table (rows, tools, faults). Raises
    :class:`ValueError` for a run that is not a matrix run.
    """
    grid = meta.get("matrix")
    if not isinstance(grid, dict) or not grid.get("rows"):
        raise ValueError(f"{meta.get('run_dir', 'run')}: not a matrix run (run.toml has no [matrix] table with rows)")
    skipped = {s.get("arm", ""): s.get("reason", "") for s in meta.get("skipped_arms", [])}
    by_cell: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rec in (trials.to_dict("records") if not trials.empty else []):
        by_cell[(rec.get("variant", ""), rec.get("backend", ""), rec.get("fault", ""))] = rec
    env = environment_of(meta)
    out = []
    for row in grid["rows"]:
        for tool in grid["tools"]:
            for fault in grid["faults"]:
                rec = by_cell.get((row["name"], tool, fault))
                base = {"row": row["name"], "feature": row["feature"], "description": row["description"],
                        "probe": row["probe"], "array": row["array"], "tool": tool, "fault": fault,
                        "run_dir": meta.get("run_dir", ""), **env}
                if rec is None:
                    # An arm of a backend that drives no CUDA has no restore target: look under both labels.
                    labels = dict.fromkeys([arm_label(tool, fault, row.get("restore_target", SAME_GPU)), arm_label(tool, fault)])
                    reason = next((skipped[f"{row['name']} {label}"] for label in labels
                                   if f"{row['name']} {label}" in skipped), "no trial was run")
                    out.append({**base, "cell": "not_measured", "detail": reason, "harness_action": "", "trial_id": "",
                                "measures": ""})
                    continue
                cell, detail = cell_of(rec)
                out.append({**base, "cell": cell, "detail": detail, "harness_action": rec.get("harness_action") or "",
                            "trial_id": rec["trial_id"], "measures": rec.get("measures") or ""})
    return pd.DataFrame(out, columns=[*COLUMNS, *ENVIRONMENT_COLUMNS])


def merge(matrices: list[pd.DataFrame]) -> pd.DataFrame:
    """Several matrices of one machine as one (a later run's cell wins a grid point both measured).

    Raises :class:`ValueError` naming the columns that differ when they come from different machines
    (GPU, driver, CUDA, CRIU, kernel or tool versions): such cells do not belong in one matrix.
    """
    frames = [m for m in matrices if not m.empty]
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, *ENVIRONMENT_COLUMNS])
    first = frames[0]
    for other in frames[1:]:
        differ = [c for c in ENVIRONMENT_COLUMNS if set(first[c]) != set(other[c])]
        if differ:
            detail = "; ".join(f"{c}: {sorted(set(first[c]))[0]!r} in {first['run_dir'].iloc[0]}, "
                               f"{sorted(set(other[c]))[0]!r} in {other['run_dir'].iloc[0]}" for c in differ)
            raise ValueError(f"the runs come from different machines ({detail}): build one matrix per machine and "
                             "compare them with --compare")
    merged = pd.concat(frames, ignore_index=True)
    # A point measured in a later run replaces an earlier "not measured" or an earlier cell.
    merged["_measured"] = merged["cell"] != "not_measured"
    merged = merged.sort_values("_measured", kind="stable").drop_duplicates(["row", "tool", "fault"], keep="last")
    # Rows, tools and faults in the order the runs listed them (their grids' order), not alphabetical.
    order = {c: {v: i for i, v in enumerate(dict.fromkeys(pd.concat([f[c] for f in frames])))} for c in ("row", "tool", "fault")}
    merged = merged.sort_values(["row", "tool", "fault"], key=lambda s: s.map(order[s.name]), kind="stable")
    return merged.drop(columns="_measured").reset_index(drop=True)


def compare(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[str, str]]]:
    """The grid points whose cell changed from matrix ``a`` to ``b`` (columns row, feature, tool, fault,
    cell_a, cell_b, detail_b) and the environment columns that differ (name → (a, b))."""
    keys = ["row", "tool", "fault"]
    joined = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"))
    joined["cell_a"] = joined["cell_a"].fillna("absent")
    joined["cell_b"] = joined["cell_b"].fillna("absent")
    joined["feature"] = joined["feature_a"].fillna(joined["feature_b"])
    changed = joined[joined["cell_a"] != joined["cell_b"]]
    table = changed[["row", "feature", "tool", "fault", "cell_a", "cell_b", "detail_b"]].reset_index(drop=True)
    env = {}
    for c in ENVIRONMENT_COLUMNS:
        va = ", ".join(sorted(set(a[c].astype(str)))) if c in a and len(a) else ""
        vb = ", ".join(sorted(set(b[c].astype(str)))) if c in b and len(b) else ""
        if va != vb:
            env[c] = (va, vb)
    return table, env


def feature_cells(matrix: pd.DataFrame, tool: str, fault: str) -> dict[str, tuple[str, str]]:
    """Per feature, the worst cell of ``tool`` under ``fault`` over the rows that measure it, and that row:
    ``{feature: (cell, row)}``. A feature a row measured as ``not_measured`` counts as such."""
    out: dict[str, tuple[str, str]] = {}
    sub = matrix[(matrix["tool"] == tool) & (matrix["fault"] == fault)] if not matrix.empty else matrix
    for rec in sub.to_dict("records"):
        have = out.get(rec["feature"])
        if have is None or SEVERITY[rec["cell"]] > SEVERITY[have[0]]:
            out[rec["feature"]] = (rec["cell"], rec["row"])
    return out


def support_for(matrix: pd.DataFrame, tool: str, driver: str, criu: str = "") -> dict[str, dict[str, tuple[str, str]]]:
    """What the certificate needs of a measured matrix for one tool on this machine (its ``driver`` and
    ``criu`` versions; "" where it has none): ``{fault: {feature: (cell, where)}}``, the worst cell of the
    feature's rows with the row, tool, fault and driver it was measured on. A matrix of another driver or
    CRIU vouches for nothing here: every feature it holds is ``not_measured``, with both versions named."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    if matrix.empty:
        return out
    drivers = sorted({str(d) for d in matrix["driver"] if str(d)}) if "driver" in matrix else []
    crius = sorted({str(c) for c in matrix["criu"] if str(c)}) if "criu" in matrix else []
    elsewhere = ""
    if driver and drivers and driver not in drivers:
        elsewhere = f"the support matrix was measured on driver {', '.join(drivers)}; this machine runs {driver}"
    elif criu and crius and criu not in crius:
        elsewhere = f"the support matrix was measured with CRIU {', '.join(crius)}; this machine has CRIU {criu}"
    for fault in sorted(set(matrix["fault"])):
        cells = feature_cells(matrix, tool, fault)
        if elsewhere:
            out[fault] = {f: ("not_measured", elsewhere) for f in cells}
            continue
        out[fault] = {f: (cell, f"row {row}, {tool} · {fault}, driver {', '.join(drivers) or '?'}")
                      for f, (cell, row) in cells.items()}
    return out
