"""Static plan sources executed through real CRIU: async cuts, several cuts per trial, mixed modes."""

from __future__ import annotations


import pytest

from cutbench.harness.model.plan import Cut, CutPlan
from tests.fixtures.plan_runs import run_plan


@pytest.mark.criu
def test_two_cuts_in_one_trial_are_two_real_restores(criu, results_root):
    plan = CutPlan((Cut(2, "publish", fault="kill"), Cut(4, "record", fault="leave_running", crash_after_ms=60)))
    row, stored, timeline = run_plan(results_root, plan)
    assert (row["status"], row["outcome"], row["restores"], row["n_cuts"]) == ("completed", "valid", 2, 2), stored["record"]["error"]
    dumps = timeline[(timeline["stage"] == "criu_dump") & (timeline["result"] == "ok")]
    assert sorted(dumps["cut_index"]) == [0, 1]
    assert stored["record"]["report"]["epoch"] == 2


@pytest.mark.criu
def test_a_cut_right_after_a_suspend_resume_is_still_reached(criu, results_root):
    """Fault `none` resumes in place: the next cut, one phase later, is armed before the workload moves on."""
    plan = CutPlan((Cut(2, "ack", fault="none"), Cut(2, "commit", fault="kill")))
    row, stored, _ = run_plan(results_root, plan)
    assert (row["status"], row["restores"]) == ("completed", 1), stored["record"]["error"]
    assert [o["status"] for o in stored["record"]["cut_outcomes"]] == ["resumed", "restored"]


@pytest.mark.criu
def test_an_async_cut_lands_wherever_the_workload_is(criu, results_root):
    plan = CutPlan((Cut(2, "admit", mode="async", async_offset_ms=7, fault="kill"),))
    row, stored, timeline = run_plan(results_root, plan)
    assert (row["status"], row["outcome"], row["restores"]) == ("completed", "valid", 1), stored["record"]["error"]
    reach = timeline[timeline["stage"] == "reach_cut"].iloc[0]
    assert reach["detail"] == "async +7ms after 2/admit"
    # Where the dump really took it: recorded, at or after the trigger point, never the plan's word.
    op, phase = row["cut_landed"].split("/")
    assert int(op) >= 2 and phase and row["cut_landed"] == stored["record"]["cut_evidence"][0]["positions"]["criu_freeze"]


@pytest.mark.criu
def test_a_precise_cut_lands_where_it_was_planned(criu, results_root):
    row, _, _ = run_plan(results_root, CutPlan((Cut(3, "publish", fault="kill"),)))
    assert row["cut_landed"] == "3/publish"
