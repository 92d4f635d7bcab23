"""``torch_training`` on the GPU, on CuPy and on PyTorch: two clean runs agree bit for bit (its recorded ground
truth holds here), and a kill/restore through ``cuda+criu`` of the training process and its loader worker (a
child with no CUDA context) continues the run identically."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli

SCENARIO = """
name = "train-gpu"
[workload]
name = "torch_training"
array = "ARRAY"
params = { ops = 10, loader_workers = 1 }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["cuda+criu"]
faults = ["none", "kill"]
[plan]
source = "exhaustive"
ops = [5, 5]
phases = ["launch", "publish"]
"""


@pytest.mark.parametrize("array", ["cupy", "torch"])
def test_a_restore_through_cuda_criu_continues_training_bit_for_bit(results_root: Path, tmp_path: Path, array: str):
    if array == "torch":
        pytest.importorskip("torch", reason="PyTorch is not installed here")
    scenario = tmp_path / "train.toml"
    scenario.write_text(SCENARIO.replace("ARRAY", array))
    proc = cli("run", str(scenario), "--out", str(results_root), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert len(trials) == 4 and (trials["outcome"] == "valid").all(), trials[["plan", "outcome", "findings", "error"]]
    assert (trials[trials["fault"] == "kill"]["restores"] == 1).all()
    [ref] = list((run_dir / "references").glob(f"torch_training-{array}-*.json"))
    assert json.loads(ref.read_text())["runs"] == 2
