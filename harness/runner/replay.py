"""Replay: rerun a stored trial from its spec (a trial file, or a packed run's member), as a new run, and compare verdicts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cutbench.harness.model.scenario import Scenario
from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.runner.run import RunOptions, execute
from cutbench.harness.store.analysis import verdict_class, verdict_key
from cutbench.harness.store.rundir import RunDir, read_trial_file


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

    ``<run>/trials/<id>.json`` of a packed run (``cutbench pack``) is read from
    ``<run>/trials.tar.xz``: the command a summary or report printed still works.
    Raises :class:`~cutbench.errors.InvalidArgument` when the file is not a
    stored trial or its spec no longer validates.
    """
    stored = read_trial_file(trial_file)
    spec = TrialSpec.from_dict(stored["spec"])
    # A parameter the workload gained since the trial was stored runs at its default, as a missing run field does.
    spec = replace(spec, params={**spec.workload_class().defaults, **spec.params})
    scen = Scenario(name=f"replay-{spec.trial_id}", workload=spec.workload, array=spec.array, params=spec.params,
                    store="sqlite", backends=(spec.backend,), modes=(spec.receiver_mode,), source_path=str(trial_file))
    outcome = execute(scen, [spec], results_root,
                      RunOptions(workdir=workdir, name=f"replay-{spec.trial_id}", mark_latest=False))
    new = outcome.run.trial_records()
    return Replay(spec.trial_id, stored["verdict"], new[0]["verdict"] if new else None, outcome.run, outcome.exit_code())
