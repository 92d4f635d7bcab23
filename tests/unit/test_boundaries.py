"""A program's system-call boundaries (``harness/model/boundaries.py``): their names and two recordings compared."""

from __future__ import annotations

import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.model.boundaries import Boundary, first_difference, name
from cutbench.harness.model.scenario import parse_scenario

CALLS = [Boundary(1, "write", "stdout", 71, "done 1 e8c7824aad0d5211eebcf75368d5a920264b92a3d"),
         Boundary(2, "write", "stdout", 1, "\n"),
         Boundary(3, "pwrite64", "file:jobs.db-wal", 24, "\x00\x00\x00\x02\x00"),
         Boundary(4, "fdatasync", "file:jobs.db-wal"),
         Boundary(5, "exit_group", "process")]


def test_a_boundary_is_named_after_the_calls_on_both_sides():
    assert name(CALLS, 1) == "before write(stdout) `done 1 e8c7824aad0d5211eebcf7536…`, the first counted call"
    assert name(CALLS, 3) == "after write(stdout) `\\n`, before pwrite64(file:jobs.db-wal) 24 bytes"
    assert name(CALLS, 5) == "after fdatasync(file:jobs.db-wal), before exit_group"
    assert name(CALLS, 6) == name(CALLS, 0) == ""


def test_two_recordings_differ_where_a_call_or_its_target_does_and_not_where_only_the_bytes_do():
    assert first_difference(CALLS, [Boundary(1, "write", "stdout", 70, "done 1 other"), *CALLS[1:]]) == ""
    moved = [*CALLS[:2], Boundary(3, "fdatasync", "file:jobs.db-wal"), *CALLS[3:]]
    assert first_difference(CALLS, moved).startswith("boundary 3: pwrite64(file:jobs.db-wal) 24 bytes in one run, "
                                                     "fdatasync(file:jobs.db-wal) in the other")
    assert first_difference(CALLS, CALLS[:4]) == "boundary 5: one run made 5 counted calls, the other 4"


PROGRAM = {"workload": {"name": "program", "params": {"command": ["python3", "w.py"], "effects": "^done (?P<index>\\d+)",
                                                       "ops": 3}},
           "plan": {"cut_mode": "async", "phases": ["syscall"], "ops": [10, 40]}}


def test_a_syscall_cut_traces_the_program_with_the_calls_that_count():
    scenario = parse_scenario(PROGRAM)
    # plan.ops numbers its counted calls (checked against its recording), not its 3 effects.
    assert scenario.plan_ops == (10, 40) and "fsync" in scenario.params["syscalls"]
    narrow = parse_scenario({**PROGRAM, "plan": {**PROGRAM["plan"], "syscalls": ["write", "fsync"]}})
    assert narrow.params["syscalls"] == ["write", "fsync"]
    # "all" asks for no tracing: a program's system-call cuts are asked for by name.
    everything = parse_scenario({**PROGRAM, "plan": {"cut_mode": "async", "phases": "all", "ops": [1, 3]}})
    assert "syscall" not in everything.plan_phases and everything.params["syscalls"] == []


@pytest.mark.parametrize("plan, says", [
    ({"syscalls": ["write", "splice"]}, "plan.syscalls contains 'splice': allowed write, pwrite64"),
    ({"cuts_per_trial": 2}, "plan.cuts_per_trial = 2: a program is cut at its system calls once a trial"),
    ({"source": "periodic"}, "plan.source = \"periodic\": a program is cut at its system calls once a trial"),
])
def test_a_bad_syscall_plan_names_the_field_and_the_fix(plan, says):
    with pytest.raises(InvalidArgument, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_scenario({**PROGRAM, "plan": {**PROGRAM["plan"], **plan}})


def test_syscall_cuts_are_a_program_s():
    with pytest.raises(InvalidArgument, match="plan.phases contains 'syscall': allowed admit"):
        parse_scenario({"workload": {"name": "counter"}, "plan": {"phases": ["syscall"]}})
