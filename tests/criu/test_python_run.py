"""``cutbench.run``: a scenario run from Python gives the stored run that ``open_run`` gives."""

from __future__ import annotations

from pathlib import Path

import pytest

import cutbench
from cutbench.errors import InvalidArgument
from tests.fixtures.run_fixtures import FAILING_SCENARIO


@pytest.mark.criu
def test_a_scenario_run_from_python_is_the_run_open_run_reads(criu, tmp_path: Path):
    scenario = tmp_path / "failing.toml"
    scenario.write_text(FAILING_SCENARIO)
    run = cutbench.run(scenario, out=tmp_path / "results", overrides=["plan.phases=['publish']"])
    assert isinstance(run, cutbench.Run) and run.complete and len(run) == 1
    assert run.verdict.label == "invalid" and set(run.findings["kind"]) == {"duplicate"}
    assert cutbench.open_run(run.path).counts == run.counts
    with pytest.raises(InvalidArgument, match="receiver.modes"):
        cutbench.run(scenario, out=tmp_path / "results", overrides=["receiver.modes=['sometimes']"])
