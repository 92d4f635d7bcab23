"""``inference_worker`` through real CRIU on NumPy: a system-level restore brings back the sessions in flight; the
engine's own checkpoint of its weights does not, and a requeue starts every session again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu

SCENARIO = """
name = "serving"
[workload]
name = "inference_worker"
array = "numpy"
params = { ops = 16, sessions = 3, prompt_tokens = 4, max_new_tokens = 8, context = 16 }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu", "app", "restart"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [9, 9]
phases = ["publish"]
[[variants]]
name = "weights"
[[variants]]
name = "sessions"
[variants.workload]
params = { ops = 16, sessions = 3, prompt_tokens = 4, max_new_tokens = 8, context = 16, app_checkpoint = "sessions" }
"""


def test_only_a_system_level_restore_or_a_whole_engine_save_continues_the_sessions_in_flight(criu, tmp_path: Path):
    scenario = tmp_path / "serving.toml"
    scenario.write_text(SCENARIO)
    out = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", timeout=900)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    run_dir = Path(json.loads(out.stdout)["run_dir"])
    trials = pd.read_parquet(run_dir / "trials.parquet")
    refs = [json.loads(p.read_text()) for p in (run_dir / "references").glob("inference_worker-numpy-*.json")]
    assert len(refs) == 2 and all(r["runs"] == 2 and len(r["payloads"]) == 16 for r in refs)
    show = trials[["variant", "backend", "outcome", "findings", "error"]]
    outcome = {(t.variant, t.backend): t.outcome for t in trials.itertuples()}
    assert outcome[("weights", "criu")] == outcome[("sessions", "criu")] == "valid", show
    assert outcome[("sessions", "app")] == "valid", show
    # From its weights alone the engine comes back with no session in flight: what it serves next is not
    # the uninterrupted run's.
    assert outcome[("weights", "app")] == "invalid", show
    restart = trials[trials["backend"] == "restart"]
    assert (restart["outcome"] == "invalid").all() and (restart["restarted"] > 0).all(), show
    # Every process's cold start is on one clock, its steps in order; an app restore's includes loading its state.
    for t in trials.itertuples():
        clock = json.loads(t.startup)
        steps = ["imports", "array_library", "cuda_init", "model_build", "setup"]
        steps += ["load_state"] * (t.backend == "app") + ["first_op"]
        assert [clock[s] for s in steps] == sorted(clock[s] for s in steps) and clock["imports"] > 0, (t.backend, clock)
