"""The complete example of docs/workload-api.md runs as written: the code block
is saved as ``tally.py`` and registered by import path, exactly as a user would."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from cutbench.harness.runner.session import Session
from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.model.scenario import Arm, load_scenario
from cutbench.workloads import api


def test_the_example_runs_and_matches_its_reference(tally_dir: Path):
    cls = api.load("tally:Tally")
    with pytest.raises(api.WorkloadError, match="accounts"):
        api.resolve_params(cls, {"accounts": 1})
    scen = load_scenario(tally_dir / "tally.toml")
    assert scen.workload == "tally:Tally" and "criu/idempotent/none" in [a.label() for a in scen.arms()]
    spec = TrialSpec(trial_id="t0001", index=1, workload="tally:Tally", array="numpy", params=scen.params,
                     backend="criu", receiver_mode="idempotent", arm=asdict(Arm("criu", "idempotent", "none", 0.0, 0.0)),
                     plan={"cuts": []}, watchdog_s=10, trial_timeout_s=60)
    with Session("tally", workdir=tally_dir) as session:
        result = session.run_trial(spec)
    assert result.record.status == "completed", result.record.log_tail
    assert result.verdict.outcome == "valid" and len(result.effects) == scen.params["ops"]
    ref = cls.reference(scen.params)
    assert result.record.report["checksum"] == ref.checksum(8) != ref.checksum(7)
