"""Re-analysis of stored runs and replay of stored trials.

``reanalyze`` recomputes every verdict of a run from what the run stored
(``trials/<id>.json`` records and ``effects.parquet``) with the current
oracle: pure reads, so the same data must give the same verdict. ``replay``
reruns one stored trial exactly (same spec, same plan) as a new run and says
whether its verdict reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import oracle
from harness.results import RunDir, read_trial_file
from workloads import api as workload_api


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


def reanalyze(run: RunDir) -> Reanalysis:
    """Recompute every trial's verdict with the current oracle; return stored and recomputed side by side."""
    effects = run.table("effects")
    rows = []
    for stored in run.trial_records():
        spec, record = stored["spec"], stored["record"]
        try:
            reference = workload_api.load(spec["workload"]).reference(spec["params"])
        except workload_api.WorkloadError as exc:
            rows.append({"trial_id": spec["trial_id"], "stored": stored["verdict"]["outcome"],
                         "recomputed": f"error: {exc}", "same": False})
            continue
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


@dataclass
class Replay:
    """A stored trial rerun: both verdicts and whether the rerun reproduced the stored one."""

    trial_id: str
    stored: dict[str, Any]
    replayed: dict[str, Any] | None
    run: RunDir
    exit_code: int

    @property
    def reproduced(self) -> bool:
        """Same outcome and same finding kinds (see :func:`verdict_class`)."""
        return self.replayed is not None and verdict_class(self.replayed) == verdict_class(self.stored)

    @property
    def exact(self) -> bool:
        """Same outcome and the same findings, op for op (see :func:`verdict_key`)."""
        return self.replayed is not None and verdict_key(self.replayed) == verdict_key(self.stored)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what ``cutbench replay --json`` prints)."""
        return {"trial": self.trial_id, "stored": self.stored["outcome"],
                "replayed": self.replayed["outcome"] if self.replayed else None,
                "stored_findings": sorted(f["kind"] for f in self.stored.get("findings", [])),
                "replayed_findings": sorted(f["kind"] for f in (self.replayed or {}).get("findings", [])),
                "reproduced": self.reproduced, "exact": self.exact, "run_dir": str(self.run.path)}


def replay(trial_file: str | Path, results_root: str | Path, *, workdir: str | Path | None = None) -> Replay:
    """Rerun the trial stored in ``trial_file`` as a new run under ``results_root``; return the :class:`Replay`.

    Raises :class:`~harness.errors.InvalidArgument` when the file is not a
    stored trial or its spec no longer validates.
    """
    from harness.runner import TrialSpec, execute
    from harness.scenario import Scenario

    stored = read_trial_file(trial_file)
    spec = TrialSpec.from_dict(stored["spec"])
    scen = Scenario(name=f"replay-{spec.trial_id}", workload=spec.workload, array=spec.array, params=spec.params,
                    store="sqlite", backends=(spec.backend,), modes=(spec.receiver_mode,), source_path=str(trial_file))
    outcome = execute(scen, [spec], results_root, workdir=workdir, name=f"replay-{spec.trial_id}")
    new = outcome.run.trial_records()
    return Replay(spec.trial_id, stored["verdict"], new[0]["verdict"] if new else None, outcome.run, outcome.exit_code())
