"""Cut plans as data: validation at the boundary, JSON round trip, order against a workload's phases."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cutbench.errors import InvalidArgument
from cutbench.harness.model.plan import CUT_MODES, FAULTS, Cut, CutPlan, position
from cutbench.workloads.control import PHASES

cuts = st.builds(
    Cut,
    op=st.integers(1, 50),
    phase=st.sampled_from(PHASES),
    mode=st.sampled_from(CUT_MODES),
    async_offset_ms=st.floats(0, 1e4, allow_nan=False),
    split_window_ms=st.floats(0, 1e4, allow_nan=False),
    fault=st.sampled_from(FAULTS),
    crash_after_ms=st.floats(0, 1e4, allow_nan=False),
)


@given(st.lists(cuts, max_size=4).map(tuple).map(CutPlan))
def test_json_round_trip_is_exact(plan):
    assert CutPlan.from_json(plan.to_json()) == plan
    assert CutPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"op": 0, "phase": "admit"}, "cut.op"),
        ({"op": True, "phase": "admit"}, "cut.op"),
        ({"op": 1, "phase": ""}, "cut.phase"),
        ({"op": 1, "phase": "admit", "mode": "sometimes"}, "cut.mode"),
        ({"op": 1, "phase": "admit", "fault": "reboot"}, "cut.fault"),
        ({"op": 1, "phase": "admit", "crash_after_ms": -1}, "cut.crash_after_ms"),
        ({"op": 1, "phase": "admit", "split_window_ms": "10"}, "cut.split_window_ms"),
        ({"op": 1, "phase": "admit", "when": 3}, "unknown field"),
        ({"phase": "admit"}, "plan.cuts[0]"),
    ],
)
def test_a_bad_cut_names_its_field(raw, field):
    with pytest.raises(InvalidArgument, match=field.replace("[", r"\[")):
        CutPlan.from_dict({"cuts": [raw]})


@pytest.mark.parametrize("bad", ["[]", '{"cuts": 3}', "not json", '{"cuts": [1]}'])
def test_a_plan_that_is_not_a_plan_is_refused(bad):
    with pytest.raises(InvalidArgument, match="plan"):
        CutPlan.from_json(bad)


def test_validate_for_checks_phases_ops_and_order():
    phases = ("admit", "send", "recv", "commit")
    ok = CutPlan((Cut(1, "send"), Cut(1, "commit"), Cut(3, "admit")))
    assert ok.validate_for(phases, ops=3) is ok
    with pytest.raises(InvalidArgument, match=r"plan.cuts\[0\].*'publish'.*allowed admit, send, recv, commit"):
        CutPlan((Cut(1, "publish"),)).validate_for(phases)
    with pytest.raises(InvalidArgument, match=r"cuts\[1\].*exceeds.*ops = 3"):
        CutPlan((Cut(1, "send"), Cut(4, "send"))).validate_for(phases, ops=3)
    with pytest.raises(InvalidArgument, match=r"cuts\[1\] at 1/admit is not after the previous cut"):
        CutPlan((Cut(1, "send"), Cut(1, "admit"))).validate_for(phases)
    with pytest.raises(InvalidArgument, match="not after"):
        CutPlan((Cut(2, "send"), Cut(2, "send"))).validate_for(phases)


def test_workload_specific_phases_are_names_not_the_standard_list():
    """A workload may add phases (``send``/``recv``); the cut itself only checks it is a name."""
    assert Cut(1, "send").phase == "send"
    assert position(Cut(2, "recv"), ("admit", "send", "recv")) == 2 * 3 + 2


def test_describe_reads_like_the_plan():
    plan = CutPlan((Cut(3, "publish", fault="leave_running", crash_after_ms=150),
                    Cut(4, "admit", mode="async", async_offset_ms=2.5)))
    assert plan.describe() == "3/publish leave_running+150ms; 4/admit kill async+2.5ms"
    assert CutPlan().describe() == "(no cut)"
