"""The applications' own checkpoints under a requeue, through real CRIU on NumPy: ``md_simulation`` (GROMACS's
``-cpi`` in miniature) and ``torch_training`` (a training script's resume, new loader workers included).

What each makes of the other tools is in ``test_md_simulation``, ``test_torch_training`` and
``test_inference_worker``; the same applications through ``cuda+criu`` on a GPU in ``tests/gpu/test_applications.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu

REQUEUE = """
name = "APP-requeue"
[workload]
name = "APP"
array = "numpy"
params = { PARAMS, continue_from_cpt = CONTINUE }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["restart"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [5, 5]
phases = ["commit"]
"""

# Each application's parameters (it saves every cpt_every_ops steps) and the steps a requeue at step 5 recomputes
# from its last save: md_simulation saved after step 4, torch_training after step 3.
APPLICATIONS = {
    "md_simulation": ("ops = 8, particles = 216, cpt_every_ops = 2", 1),
    "torch_training": ("ops = 8, loader_workers = 1, cpt_every_ops = 3", 2),
}


@pytest.mark.parametrize("restart_path", [True, False])
@pytest.mark.parametrize("app", list(APPLICATIONS))
def test_a_requeue_recomputes_only_the_steps_since_the_application_s_own_last_checkpoint(criu, tmp_path: Path,
                                                                                        app: str, restart_path: bool):
    """With its restart path (GROMACS's -cpi, a script's resume) the requeued job continues after its last save and
    recomputes the steps since; without it, steps 1..5, and the oracle says it started again."""
    params, since_save = APPLICATIONS[app]
    scenario = tmp_path / "requeue.toml"
    scenario.write_text(REQUEUE.replace("APP", app).replace("PARAMS", params)
                        .replace("CONTINUE", str(restart_path).lower()))
    out = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", timeout=600)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    [trial] = pd.read_parquet((tmp_path / "r" / "latest").resolve() / "trials.parquet").itertuples()
    kinds = {f["kind"] for f in json.loads(trial.findings)}
    assert trial.recomputed_ops == (since_save if restart_path else 5), trial
    assert ("restarted" in kinds) is not restart_path, kinds
    # Its effects after the cut are the uninterrupted run's (no mixed_epoch, nothing missing): the checkpoint on disk
    # is what the restart path reads, so the only other finding is the coverage rule's (state no image holds).
    assert kinds <= {"restarted", "unsafe_acceptance"}, trial.findings
