"""Re-analysis of stored runs and replay of stored trials.

``reanalyze`` recomputes every verdict of a run from what the run stored
(``trials/<id>.json`` records, loose or packed in ``trials.tar.xz``, and ``effects.parquet``) with the current
oracle: pure reads, so the same data must give the same verdict. ``replay``
reruns one stored trial exactly (same spec, same plan) as a new run and says
whether its verdict reproduced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.checker import oracle
from cutbench.harness.store.rundir import RunDir
from cutbench.workloads import api as workload_api


def verdict_key(verdict: dict[str, Any]) -> tuple[str, tuple[tuple[str, int | None], ...]]:
    """The exact comparable form of a stored verdict: outcome and the sorted ``(kind, op)`` of every finding."""
    return verdict["outcome"], tuple(sorted(((f["kind"], f.get("op")) for f in verdict.get("findings", [])),
                                            key=lambda k: (k[0], -1 if k[1] is None else k[1])))


def verdict_class(verdict: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The outcome and the set of finding kinds: what a replay must reproduce.

    A rerun cannot promise the same counts where timing decides them (how
    many ops a ``leave_running`` process got through before the crash), but
    the same plan must give the same outcome and the same kinds of finding.
    """
    return verdict["outcome"], tuple(sorted({f["kind"] for f in verdict.get("findings", [])}))


def verdicts_by_plan(trials: pd.DataFrame) -> dict[tuple[str, str, str], tuple[str, tuple[str, ...]]]:
    """Per (variant, arm, plan) of a trials table: its :func:`verdict_class`. Two runs of the same plans, by any
    executor, must give equal ones."""
    return {(r.variant, r.arm, r.plan): verdict_class({"outcome": r.outcome, "findings": json.loads(r.findings)})
            for r in trials.itertuples()}


@dataclass
class Reanalysis:
    """Stored against recomputed verdicts of one run."""

    run: RunDir
    rows: list[dict[str, Any]]

    @property
    def differences(self) -> list[dict[str, Any]]:
        """Trials whose recomputed verdict (outcome, finding kinds and ops) differs from the stored one."""
        return [r for r in self.rows if not r["same"]]


def trial_effects(effects: pd.DataFrame, trial_id: str) -> pd.DataFrame:
    """The stored receiver rows of one trial (an empty frame with the oracle's columns when none)."""
    if effects.empty or "trial_id" not in effects:
        return oracle.empty_effects()
    return effects[effects["trial_id"] == trial_id]


def stored_reference(spec: dict[str, Any], recordings: list[workload_api.RecordedReference]) -> Any:
    """The reference that judges stored trial ``spec``: its workload's model, or for a recorded-reference
    workload the recording the run stored for its parameters (and array backend). Raises
    :class:`~cutbench.workloads.api.WorkloadError` naming what is missing."""
    cls = workload_api.load(spec["workload"], spec.get("workload_path", ()))
    if not workload_api.records_reference(cls):
        return cls.reference(spec["params"])
    # The array the run resolved "auto" to is in the recording: this machine may resolve it otherwise.
    for rec in recordings:
        if rec.workload == cls.name and rec.params == spec["params"] and spec.get("array", "auto") in ("auto", rec.array):
            return rec
    raise workload_api.WorkloadError(f"the run stored no recorded reference for workload {cls.name!r} with these "
                                     "parameters (references/ lacks it)")


def check_run(run: RunDir) -> list[dict[str, Any]]:
    """Check a run directory as every reader of it needs; returns its trial records (in trial order).

    Each table's footer is read (a damaged or column-less one is named), and
    the trials table and ``trials/`` must describe the same trials:
    :class:`InvalidArgument` names what disagrees, so a damaged run is
    reported, never read as fewer trials or re-analysed as "0 verdicts differ".
    """
    for name in ("trials", "timeline", "effects", "certificates"):
        run.check_table(name)
    records = run.trial_records()
    if records and not (run.path / "trials.parquet").exists() and run.meta().get("status") == "running":
        raise InvalidArgument(f"{run.path}: the run never finished (status 'running', no tables: its harness was "
                              f"killed?); its {len(records)} finished trials are kept: `cutbench run --resume "
                              f"{run.path}` runs the rest and writes the tables")
    table = run.table("trials")
    listed = set(table["trial_id"]) if not table.empty else set()
    recorded = {r["spec"]["trial_id"] for r in records}
    if listed != recorded:
        held = "trials/ and trials.tar.xz hold" if run.archive_path.exists() else "trials/ holds"
        raise InvalidArgument(f"{run.path}: trials.parquet lists {len(listed)} trials and {held} {len(recorded)} "
                              f"records; they differ in {', '.join(sorted(listed ^ recorded)[:5])}")
    return records


def reanalyze(run: RunDir) -> Reanalysis:
    """Recompute every trial's verdict with the current oracle; return stored and recomputed side by side.

    The run directory is checked first (:func:`check_run`). Raises :class:`InvalidArgument` when a verdict
    cannot be recomputed here at all (its workload cannot be imported, its recorded reference is missing).
    """
    records = check_run(run)
    effects = run.table("effects")
    rows = []
    recordings = [workload_api.RecordedReference.from_dict(data) for data in run.references().values()]
    for stored in records:
        spec, record = stored["spec"], stored["record"]
        try:
            reference = stored_reference(spec, recordings)
        except workload_api.WorkloadError as exc:
            # Nothing was recomputed, so nothing differs: the run cannot be re-judged here, and that is the answer.
            raise InvalidArgument(f"{run.path}: cannot re-judge trial {spec['trial_id']} here: {exc}") from None
        new = oracle.judge(record, trial_effects(effects, spec["trial_id"]), reference).to_dict()
        rows.append(
            {
                "trial_id": spec["trial_id"],
                "stored": stored["verdict"]["outcome"],
                "recomputed": new["outcome"],
                "stored_findings": [f["kind"] for f in stored["verdict"].get("findings", [])],
                "recomputed_findings": [f["kind"] for f in new["findings"]],
                "same": verdict_key(stored["verdict"]) == verdict_key(new),
            }
        )
    return Reanalysis(run, rows)
