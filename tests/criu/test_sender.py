"""Who sent a delivery: a restored process resending an op it was waiting on is the sender of that copy, though the
op keeps the epoch it was made in (a real CRIU leave_running trial under an at_least_once receiver)."""

from __future__ import annotations

from pathlib import Path

import pytest

import cutbench
from cutbench.harness.integrations import gate
from cutbench.harness.reports import plots
from cutbench.harness.reports.explain import sender_of


@pytest.mark.criu
def test_a_resend_by_the_restored_process_is_credited_to_it(criu, tmp_path: Path):
    # Cut after op 2 is sent, before its ack: the original gets the ack and runs on, then crashes; the restored
    # copy still owes op 2 and sends it again on a new connection, as attempt 2 of an epoch-0 op.
    scen = gate.trial_scenario(None, workload="counter", array="numpy", params={"ops": 4, "op_interval_ms": 20.0},
                               receiver_mode="at_least_once", fault="leave_running", crash_after_ms=100)
    result = gate.run_trial(tmp_path, scen, "2/publish")
    run = cutbench.open_run(result.run_dir)
    fx = run.effects_of(result.trial_id)
    op2 = fx[fx["op_id"] == 2]
    assert op2[["attempt", "epoch", "sender"]].values.tolist() == [[1, 0, 0], [2, 0, 1]]
    assert op2["connection_id"].nunique() == 2
    detail = next(f["detail"] for f in result.findings if f["kind"] == "duplicate" and f["op"] == 2)
    assert detail == "applied 2 times (epochs [0]; sent by incarnations [0, 1])"
    assert [sender_of(r) for r in op2.itertuples()] == [0, 1] and plots.lanes(fx) == [0, 1]
    assert "from the original (incarnation 0) and the restored process (incarnation 1)" in run.explain(result.trial_id)
