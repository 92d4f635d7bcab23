"""``scenarios/criteria-cpu.toml`` through real CRIU and the real engines, then ``cutbench criteria`` (marked ``criu``).

A CI-sized part of the scenario (the restores at op 4's ``commit`` under one receiver mode, the native run and one soak
interval, every 100 ops; with ``CUTBENCH_FULL_SUITE=1`` the restores at all three phases and a
checkpoint every 40 ops): every backend of the CPU machine gets every one of the six criteria with a
measured value.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from cutbench.harness.reports.criteria import CRITERIA
from tests.conftest import FULL_SUITE, REPO

pytestmark = pytest.mark.criu


def test_criteria_cpu_fills_every_criterion_for_every_backend(criu, docker_engine, podman_engine, results_root):
    # The soak interval: a checkpoint every 100 ops by default, every 40 with CUTBENCH_FULL_SUITE=1.
    soak = "soak-every-40" if FULL_SUITE else "soak-every-100"
    # Each fault, each backend, still: one phase, one receiver mode (no criterion reads the restores' mode; the
    # soaks set their own) and one trial of each soak arm (a --set wins over a variant's own value).
    phases = [] if FULL_SUITE else ["--set", 'plan.phases=["commit"]', "--set", 'receiver.modes=["idempotent"]',
                                    "--set", "plan.trials=1"]
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "criteria-cpu.toml"),
                           "--out", str(results_root), "--json", "--variant", "restore", "--variant", "soak-native",
                           "--variant", soak, *phases, "--jobs", "3"], capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    run_dir = (results_root / "latest").resolve()
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert (trials["outcome"] != "unknown").all(), trials[trials["outcome"] == "unknown"][["arm", "error"]]
    out = subprocess.run([sys.executable, "-m", "cutbench", "criteria", str(run_dir), "--json"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    table = pd.DataFrame(json.loads(out.stdout)["rows"])
    assert set(table["backend"]) == {"criu", "app", "restart", "docker", "podman"}
    for backend, rows in table.groupby("backend"):
        filled = rows[rows["value"].notna() | (rows["text"] != "")]
        assert set(filled["criterion"]) == set(CRITERIA), (backend, rows[["criterion", "quantity", "method"]])
    get = table.set_index(["backend", "quantity"])
    # The native cold start is the reference the restores are held against.
    for backend in ("criu", "docker", "podman", "app"):
        assert get.loc[(backend, "restore / native cold start"), "value"] > 0
    # Kill restores continue; restart never does.
    assert get.loc[("criu", "output continuity, fault kill"), "value"] == 100.0
    assert get.loc[("restart", "output continuity"), "value"] == 0.0
    assert 'id="criteria"' in (run_dir / "report.html").read_text()
