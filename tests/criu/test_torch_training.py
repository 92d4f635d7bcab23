"""``torch_training`` through real CRIU on NumPy, with a loader worker in the dumped tree: its recorded ground
truth, and what each tool makes of it, with and without the training script's own checkpoint on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu

SCENARIO = """
name = "train"
[workload]
name = "torch_training"
array = "numpy"
params = { PARAMS }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu", "app", "restart"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [3, 3]
phases = ["launch", "commit"]
[[variants]]
name = "plain"
[[variants]]
name = "cpt"
[variants.workload]
params = { PARAMS, cpt_every_ops = 2 }
""".replace("PARAMS", "ops = 6, loader_workers = 1, d_model = 16, heads = 2, seq_len = 16, corpus_sequences = 32")


def test_a_system_level_restore_and_its_own_save_continue_training_bit_for_bit(criu, tmp_path: Path):
    scenario = tmp_path / "train.toml"
    scenario.write_text(SCENARIO)
    out = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", timeout=900)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    run_dir = Path(json.loads(out.stdout)["run_dir"])
    trials = pd.read_parquet(run_dir / "trials.parquet")
    refs = [json.loads(p.read_text()) for p in (run_dir / "references").glob("torch_training-numpy-*.json")]
    assert len(refs) == 2 and all(r["runs"] == 2 and len(r["payloads"]) == 6 for r in refs)  # clean runs agreed
    show = trials[["variant", "backend", "plan", "outcome", "findings", "error"]]
    by = trials.groupby(["variant", "backend"])["outcome"].apply(set).to_dict()
    # The image holds the worker and what was in flight in its pipes; the app's save holds the loader's cursor.
    assert by[("plain", "criu")] == {"valid"} and by[("plain", "app")] == {"valid"}, show
    assert by[("cpt", "app")] == {"valid"}, show
    assert (trials[trials["backend"] != "restart"]["restores"] == 1).all(), show
    # Its own checkpoint file is state no process image holds: a restore that accepts it anyway is unsafe.
    cpt_criu = trials[(trials["variant"] == "cpt") & (trials["backend"] == "criu")]
    assert (cpt_criu["unsafe_acceptance"] > 0).all(), show
    restart = trials[trials["backend"] == "restart"]
    assert (restart["outcome"] == "invalid").all() and (restart["restarted"] > 0).all(), show
