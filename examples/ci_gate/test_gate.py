"""The service's checkpoint/restore gate, as its CI runs it.

One test per arm of every scenario under scenarios/ (the marker takes paths
or globs relative to this file), and one targeted trial that pins down a
known-dangerous cut: a crash right after the effect was published.
"""

import pytest


@pytest.mark.cutbench(scenario="scenarios/*.toml", max_invalid_rate=0.0)
def test_restore_is_coherent(cutbench_run):
    # Fails with every failing trial, its findings and its `cutbench replay` command.
    cutbench_run.check()


# The workload, its parameters and the arm come from the marker's scenario; the call narrows it to one arm.
@pytest.mark.cutbench(scenario="scenarios/gate.toml")
def test_crash_after_publish_is_not_applied_twice(cutbench_trial):
    result = cutbench_trial("2/publish", fault="leave_running")
    assert result.valid, f"{result.findings}\nreplay: {result.replay_command}"
