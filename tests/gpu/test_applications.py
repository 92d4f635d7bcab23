"""The three applications on the GPU, on CuPy and on PyTorch: two clean runs agree bit for bit (each one's recorded
ground truth holds here), and a kill/restore through ``cuda+criu`` continues it identically.

- ``md_simulation``: the trajectory;
- ``inference_worker``: every session in flight;
- ``torch_training``: the training process and its loader worker (a child with no CUDA context).

What the other tools (``criu``, ``app``, ``restart``) and each application's own checkpoint make of them is
checked on NumPy, through real CRIU, in ``tests/criu`` (``test_md_simulation``, ``test_inference_worker``,
``test_torch_training``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli

SCENARIO = """
name = "APP-gpu"
[workload]
name = "APP"
array = "ARRAY"
params = PARAMS
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["cuda+criu"]
faults = ["none", "kill"]
[plan]
source = "exhaustive"
ops = [OP, OP]
phases = ["launch", "publish"]
"""

# Each application's parameters (small enough for a test) and the op its cuts fall at.
APPLICATIONS = {
    "md_simulation": ("{ ops = 10, particles = 1024 }", 5),
    "inference_worker": ("{ ops = 16, sessions = 4, layers = 2, width = 128, heads = 4, vocab = 512, context = 24, "
                         "prompt_tokens = 4, max_new_tokens = 10 }", 9),
    "torch_training": ("{ ops = 10, loader_workers = 1 }", 5),
}


@pytest.mark.parametrize("array", ["cupy", "torch"])
@pytest.mark.parametrize("app", list(APPLICATIONS))
def test_a_restore_through_cuda_criu_continues_the_application_bit_for_bit(results_root: Path, tmp_path: Path,
                                                                          app: str, array: str):
    if array == "torch":
        pytest.importorskip("torch", reason="PyTorch is not installed here")
    params, op = APPLICATIONS[app]
    scenario = tmp_path / f"{app}.toml"
    scenario.write_text(SCENARIO.replace("APP", app).replace("ARRAY", array).replace("PARAMS", params)
                        .replace("OP", str(op)))
    proc = cli("run", str(scenario), "--out", str(results_root), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert len(trials) == 4 and (trials["outcome"] == "valid").all(), trials[["plan", "outcome", "findings", "error"]]
    assert (trials[trials["fault"] == "kill"]["restores"] == 1).all()
    [ref] = list((run_dir / "references").glob(f"{app}-{array}-*.json"))
    assert json.loads(ref.read_text())["runs"] == 2
