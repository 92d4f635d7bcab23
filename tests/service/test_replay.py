"""``cutbench replay`` of a file that is not a trial: a usage error, through the command in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.run_fixtures import cli


def test_replay_of_something_that_is_not_a_trial_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "t0001.json"
    bad.write_text('{"hello": 1}')
    proc = cli("replay", str(bad), "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 254 and "not a cutbench trial file" in proc.stderr and "Traceback" not in proc.stderr
    bad.write_text(json.dumps({"spec": {"trial_id": "t1"}}))
    proc = cli("replay", str(bad), "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 254 and "trial spec" in proc.stderr and "Traceback" not in proc.stderr


