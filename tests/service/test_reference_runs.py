"""The committed reference runs (``results/reference``) re-judged: every stored verdict is what the oracle and the
per-op finders say today. It reads the checkout's runs, packed ones included, so it is not in the unit tier."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from cutbench.harness.checker import oracle
from cutbench.harness.checker.oracle import judge
from cutbench.harness.store import analysis
from cutbench.harness.store.rundir import RunDir
from cutbench.workloads import api as workload_api
from tests.conftest import REPO
from tests.fixtures import per_op

REFERENCE_RUNS = sorted(p.parent for p in (REPO / "results" / "reference").rglob("effects.parquet"))


@functools.lru_cache(maxsize=None)
def workload_reference(workload: str, params: str) -> Any:
    """One reference per workload and parameters: replaying a large counter takes a second."""
    return workload_api.load(workload).reference(json.loads(params))


@pytest.mark.parametrize("path", REFERENCE_RUNS, ids=lambda p: str(p.relative_to(REPO / "results" / "reference")))
def test_every_committed_reference_run_is_judged_as_it_was_stored(path):
    """Every trial: the verdict stored in its record and in trials.parquet (outcome, findings with detail, counts),
    from the oracle and from the per-op finders alike."""
    run = RunDir.open(path)
    table, stored = run.table("effects"), run.table("trials").set_index("trial_id")
    kinds = [k for k in oracle.FINDING_KINDS if k in stored.columns]
    # A recorded-reference workload (a probe) is judged by what the run recorded on its machine.
    recordings = [workload_api.RecordedReference.from_dict(d) for d in run.references().values()]
    for trial in run.trial_records():
        spec = trial["spec"]
        if workload_api.records_reference(workload_api.load(spec["workload"])):
            ref = analysis.stored_reference(spec, recordings)
        else:
            ref = workload_reference(spec["workload"], json.dumps(spec["params"], sort_keys=True))
        e = analysis.trial_effects(table, spec["trial_id"])
        v = judge(trial["record"], e, ref)
        assert v == judge(trial["record"], e, ref, finders=per_op.FINDERS), spec["trial_id"]
        assert v.to_dict() == trial["verdict"], spec["trial_id"]
        row = stored.loc[spec["trial_id"]]
        assert (row["outcome"], json.loads(row["findings"])) == (v.outcome, [f.to_dict() for f in v.findings]), spec["trial_id"]
        assert {k: int(row[k]) for k in kinds} == {k: v.counts()[k] for k in kinds}, spec["trial_id"]


def test_the_reference_runs_are_found():
    assert len(REFERENCE_RUNS) >= 10 and all((p / "trials.parquet").is_file() for p in REFERENCE_RUNS)
