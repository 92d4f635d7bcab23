"""Table layouts: what one row of ``trials.parquet`` and one ``trials/<id>.json`` hold.

Pure: a :class:`~cutbench.harness.model.trial.TrialResult` in, a row or a
JSON-ready dict out (and back, for a resumed run). :class:`~cutbench.harness.store.rundir.RunDir` writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.model.trial import Finding, TrialRecord, TrialResult, TrialSpec, Verdict
from cutbench.workloads.adapters import VERBS as ADAPTER_VERBS


def _landed(evidence: list[dict[str, Any]]) -> str | None:
    """``op/phase`` of the first cut's first capture stage (``None`` when no cut captured anything)."""
    positions = evidence[0].get("positions", {}) if evidence else {}
    return next(iter(positions.values()), None)


def trial_row(result: TrialResult, stages: tuple[str, ...]) -> dict[str, Any]:
    """The flat ``trials.parquet`` row of a trial, with a ``<stage>_s`` column for each of ``stages``
    (:func:`stage_columns`)."""
    spec, rec, verdict = result.spec, result.record, result.verdict
    plan = spec.cut_plan()
    first = plan.cuts[0] if plan.cuts else None
    durations: dict[str, float] = {}
    for row in result.timeline:
        durations[row["stage"]] = durations.get(row["stage"], 0.0) + row["duration_s"]
    row = {
        "trial_id": spec.trial_id,
        "index": spec.index,
        "variant": spec.variant,
        "workload": spec.workload,
        "backend": spec.backend,
        "receiver_mode": spec.receiver_mode,
        "fault": spec.arm.fault,
        "crash_after_ms": spec.arm.crash_after_ms,
        "split_window_ms": spec.arm.split_window_ms,
        "rank_skew_ms": spec.arm.rank_skew_ms,
        "restore_target": spec.arm.restore_target,
        "arm": spec.arm.label(),
        "plan": plan.describe(),
        "plan_json": plan.to_json(),
        "n_cuts": len(plan.cuts),
        "cut_op": first.op if first else None,
        "cut_phase": first.phase if first else None,
        "cut_mode": first.mode if first else None,
        # Where the first cut really took the workload's state (an async trigger can fire late).
        "cut_landed": _landed(rec.cut_evidence),
        "status": rec.status,
        "outcome": verdict.outcome,
        "n_findings": len(verdict.findings),
        "findings": json.dumps([f.to_dict() for f in verdict.findings]),
        "error": rec.error,
        # The workload's own last words (the end of its log or traceback) where the trial needs them.
        "last_words": last_words(rec.log_tail),
        "failed_stage": rec.failed_stage,
        "restores": rec.restores,
        "host_op": (rec.report or {}).get("host_op"),
        "n_effects": int(len(result.effects)),
        "duration_s": rec.duration_s,
        "image_bytes": rec.facts.get("image_bytes"),
        # Work lost to the failure: the ops a requeued job computed again up to the cut (``restart``; fewer
        # where it continued from its own checkpoint), absent for a tool that restores an image.
        "recomputed_ops": rec.facts.get("recomputed_ops"),
        "gpu_bytes": rec.facts.get("gpu_bytes"),
        "certify": spec.arm.certify,
        # A program's cut at its system calls: the boundary by name ("after write(stdout) `done 17`, before …").
        "boundary": rec.facts.get("boundary", ""),
        # Where the call it was held before is not the uninterrupted runs' k-th (their calls differ there).
        "boundary_landed": rec.facts.get("boundary_landed", ""),
        # How the tracer counted its calls ("counters", the kernel's, or "stops" at every call) and how many times
        # one of its threads stopped for it ("" and None for a program not traced).
        "trace_mode": rec.facts.get("trace_mode", ""),
        "trace_stops": rec.facts.get("trace_stops"),
        # CRIU's own options the arm passed (pipeline.criu_options), space-separated; "" for none.
        "criu_options": " ".join(spec.arm.criu_options),
        # The certificate's claim about the restores of this trial: eligible only if every decided one was.
        "cert_eligible": _cert_eligible(rec.certificates),
        "cert_reason": "; ".join(c["reason"] for c in rec.certificates if c.get("reason")),
        "release_latency_median_s": rec.facts.get("release_latency_median_s"),
        "release_latency_p99_s": rec.facts.get("release_latency_p99_s"),
        # What the harness had to do to bring the process back after a tool's stage (unlock, restore, kill).
        "harness_action": rec.facts.get("harness_action", ""),
        # Figures a workload reports beside its state (a probe's bandwidth, sizes), as JSON.
        "measures": json.dumps((rec.report or {}).get("measures") or {}, sort_keys=True) if (rec.report or {}).get("measures") else "",
        # The cold start of the process that wrote the report, seconds since its exec by step (JSON; see
        # workloads/runtime.py ``mark_startup``): a restart's or an app restore's own start, a CRIU restore's original.
        "startup": json.dumps((rec.report or {}).get("startup") or {}, sort_keys=True) if (rec.report or {}).get("startup") else "",
    }
    for kind, n in verdict.counts().items():
        row[kind] = n
    for stage in stages:
        row[f"{stage}_s"] = durations.get(stage)
    return row


LAST_WORDS = 4  # lines of a workload's log kept in the trials table


def last_words(log_tail: str | None) -> str:
    """The last few non-empty lines of a workload's log tail, each without the log's stamp (time, pid, epoch)."""
    lines = [line for line in (log_tail or "").splitlines() if line.strip()]
    return "\n".join(_unstamped(line) for line in lines[-LAST_WORDS:])


def _unstamped(line: str) -> str:
    parts = line.split(" ", 3)
    if len(parts) == 4 and parts[1].startswith("pid=") and parts[2].startswith("epoch="):
        return parts[3]
    return line


def _cert_eligible(certificates: list[dict[str, Any]]) -> bool | None:
    decided = [c for c in certificates if c.get("restore_decided")]
    return all(c.get("eligible") for c in decided) if decided else None


def certificate_rows(result: TrialResult) -> list[dict[str, Any]]:
    """The ``certificates.parquet`` rows of a trial: one per certificate, nested fields as JSON."""
    rows = []
    for c in result.record.certificates:
        rows.append({
            "trial_id": result.spec.trial_id,
            "arm": result.spec.arm.label(),
            "checkpoint": c["checkpoint"],
            "certify": c.get("certify"),
            "application_epoch": c["application_epoch"],
            "domains": json.dumps(c["domains"], sort_keys=True),
            "external_effect_fence": c["external_effect_fence"],
            "in_flight": json.dumps(c["in_flight"], sort_keys=True),
            "coverage": ",".join(c["coverage"]),
            "unknown": ",".join(c["unknown"]),
            "eligible": bool(c["eligible"]),
            "reason": c["reason"],
            "restore_decided": bool(c.get("restore_decided")),
            "restored": bool(c.get("restored")),
            "outcome": result.verdict.outcome,
        })
    return rows


def stage_columns(backends: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The stages with a ``<stage>_s`` column in a run's ``trials.parquet``: the semantic adapters' (``prepare``,
    ``commit``, ``abort``, ``restored``, ``classify``), then every stage of the backends as the run records them
    (``run.toml``'s ``backends``: name → ``{"stages": [...]}``), in that order, each once."""
    out: dict[str, None] = dict.fromkeys(ADAPTER_VERBS)
    for record in backends.values():
        out.update(dict.fromkeys(record.get("stages") or ()))
    return tuple(out)


# The columns of trial_row that end in ``_s`` but time no stage: what stored_stage_columns leaves out.
NOT_STAGES = ("duration_s", "release_latency_median_s", "release_latency_p99_s")


def stored_stage_columns(trials: pd.DataFrame) -> list[str]:
    """The ``<stage>_s`` columns a stored trials table holds (its run's stages), in its order."""
    return [c for c in trials.columns if c.endswith("_s") and c not in NOT_STAGES]


def trial_file(result: TrialResult, run_id: str, store: str) -> dict[str, Any]:
    """The content of ``trials/<id>.json``: spec (for replay), record and verdict, and the trial's timeline
    rows and receiver rows (what ``cutbench run --resume`` keeps of a trial the harness did not live to
    tabulate: :func:`result_from_file`)."""
    return {
        "run_id": run_id,
        "store": store if store == "sqlite" or store.startswith("sqlite:") else "postgresql",
        "spec": result.spec.to_dict(),
        "record": result.record.to_dict(),
        "verdict": result.verdict.to_dict(),
        "timeline": result.timeline,
        # Columns and rows through pandas' JSON writer (NaN becomes null, numpy scalars plain numbers, floats
        # to the last digit): a trial's receiver rows, compact.
        "effects": (json.loads(result.effects.to_json(orient="split", index=False, double_precision=15))
                    if not result.effects.empty else {"columns": list(result.effects.columns), "data": []}),
    }


def result_from_file(data: dict[str, Any]) -> TrialResult:
    """The :class:`TrialResult` a ``trials/<id>.json`` of :func:`trial_file` holds; :class:`InvalidArgument`
    when the file predates the timeline and effects it needs (a run made before ``--resume`` existed)."""
    missing = [k for k in ("spec", "record", "verdict", "timeline", "effects") if k not in data]
    if missing:
        raise InvalidArgument(f"trial file lacks {', '.join(missing)} (made by a cutbench before `run --resume`)")
    v = data["verdict"]
    verdict = Verdict(v["outcome"], tuple(Finding(f["kind"], f.get("op"), f["detail"]) for f in v.get("findings", ())),
                      v.get("reason", ""))
    fx = data["effects"]
    if not isinstance(fx, dict) or not isinstance(fx.get("data"), list):
        raise InvalidArgument("trial file's effects: expected {'columns': [...], 'data': [[...], ...]}")
    effects = pd.DataFrame(fx["data"], columns=fx.get("columns") or None)
    return TrialResult(TrialSpec.from_dict(data["spec"]), TrialRecord.from_dict(data["record"]), list(data["timeline"]),
                       effects, verdict)
