"""Re-analysis of stored runs: recompute every verdict from stored data (pure reads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness import oracle
from harness.results import RunDir
from workloads import api as workload_api


@dataclass
class Reanalysis:
    """Stored against recomputed verdicts of one run."""

    run: RunDir
    rows: list[dict[str, Any]]

    @property
    def differences(self) -> list[dict[str, Any]]:
        """Trials whose recomputed outcome or finding counts differ from the stored ones."""
        return [r for r in self.rows if not r["same"]]


def verdict_key(verdict: dict[str, Any]) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A comparable form of a verdict: outcome and sorted counts per finding kind."""
    counts: dict[str, int] = {}
    for f in verdict.get("findings", []):
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    return verdict["outcome"], tuple(sorted(counts.items()))


def reanalyze(run: RunDir) -> Reanalysis:
    """Recompute every trial's verdict with the current oracle from ``trials/*.json`` and ``effects.parquet``."""
    effects = run.table("effects")
    rows = []
    for stored in run.trial_records():
        spec, record = stored["spec"], stored["record"]
        mine = effects[effects["trial_id"] == spec["trial_id"]] if not effects.empty else pd.DataFrame(columns=["op_id", "digest", "decision"])
        cls = workload_api.load(spec["workload"])
        verdict = oracle.judge(record, mine, cls.reference(spec["params"]))
        new = {"outcome": verdict.outcome, "findings": [f.to_dict() for f in verdict.findings]}
        rows.append(
            {
                "trial_id": spec["trial_id"],
                "stored": stored["verdict"]["outcome"],
                "recomputed": verdict.outcome,
                "same": verdict_key(stored["verdict"]) == verdict_key(new),
            }
        )
    return Reanalysis(run, rows)
