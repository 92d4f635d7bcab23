"""``cutbench analyze`` recomputes every stored verdict; ``cutbench replay`` reruns a stored trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutbench.harness.store.analysis import verdict_class, verdict_key
from tests.fixtures.run_fixtures import cli

SCENARIO = """
name = "replayable"
[workload]
name = "outbox_mark_before_send"
array = "numpy"
params = { ops = 4, state_size = 512, seed = 5, op_interval_ms = 10.0 }
[receiver]
modes = ["at_least_once"]
[pipeline]
backends = ["criu"]
faults = ["kill", "leave_running"]
crash_after_ms = [100]
[plan]
source = "exhaustive"
ops = [2, 2]
phases = ["outbox", "publish"]
[run]
watchdog_s = 5
"""


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory, criu) -> Path:
    """One real run of four trials: valid and invalid ones, three finding kinds possible."""
    root = tmp_path_factory.mktemp("replay")
    scen = root / "replayable.toml"
    scen.write_text(SCENARIO)
    proc = cli("run", str(scen), "--out", str(root / "results"), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    return Path(json.loads(proc.stdout)["run_dir"])


def test_replay_of_something_that_is_not_a_trial_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "t0001.json"
    bad.write_text('{"hello": 1}')
    proc = cli("replay", str(bad), "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 254 and "not a cutbench trial file" in proc.stderr and "Traceback" not in proc.stderr
    bad.write_text(json.dumps({"spec": {"trial_id": "t1"}}))
    proc = cli("replay", str(bad), "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 254 and "trial spec" in proc.stderr and "Traceback" not in proc.stderr


def test_verdict_comparisons():
    a = {"outcome": "invalid", "findings": [{"kind": "duplicate", "op": 3}, {"kind": "duplicate", "op": 4}]}
    b = {"outcome": "invalid", "findings": [{"kind": "duplicate", "op": 3}]}
    assert verdict_class(a) == verdict_class(b) and verdict_key(a) != verdict_key(b)
    c = {"outcome": "invalid", "findings": [{"kind": "missing", "op": 3}]}
    assert verdict_class(a) != verdict_class(c)
