"""``cutbench matrix`` on the CPU with real CRIU: the host probes through ``criu`` under ``none`` and ``kill``,
the matrix stored, re-read, compared and merged; certificates that ask it about declared features; bad
input refused before anything is written; a workload that is not deterministic reported, never judged."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli

HOST_ROWS = ("host_memory_1B", "fork_without_exec_host", "anon_shared_memory_host")


@pytest.fixture(scope="module")
def cpu_matrix(criu, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A matrix run of the host probe rows through CRIU (6 cells), made once; read it, do not change it."""
    out = tmp_path_factory.mktemp("matrix")
    args = [a for row in HOST_ROWS for a in ("--probe", row)]
    proc = cli("matrix", *args, "--tool", "criu", "--jobs", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["counts"]["identical"] == 6, data["cells"]
    return Path(data["run_dir"])


def test_the_host_probes_continue_identically_through_criu(cpu_matrix: Path):
    table = pd.read_parquet(cpu_matrix / "matrix.parquet")
    assert sorted(table["row"].unique()) == sorted(HOST_ROWS)
    assert set(table["tool"]) == {"criu"} and set(table["fault"]) == {"none", "kill"}
    assert set(table["cell"]) == {"identical"}
    assert set(table["criu"]) == {"4.2.1"}
    # Each probe's ground truth was recorded twice on this machine and stored with the run.
    assert len(list((cpu_matrix / "references").glob("*.json"))) == 3
    assert "| `anon_shared_memory_host` | anon_shared_memory | identical | identical |" in (cpu_matrix / "matrix.md").read_text()
    assert 'id="support-matrix-table"' in (cpu_matrix / "report.html").read_text()
    proc = cli("analyze", str(cpu_matrix))
    assert proc.returncode == 0 and "0 verdicts differ" in proc.stderr, proc.stdout + proc.stderr


def test_a_matrix_cell_replays_and_a_matrix_is_rebuilt_and_compared_from_stored_runs(cpu_matrix: Path, tmp_path: Path):
    table = pd.read_parquet(cpu_matrix / "matrix.parquet")
    trial = table[(table["row"] == "fork_without_exec_host") & (table["fault"] == "kill")]["trial_id"].iloc[0]
    proc = cli("replay", str(cpu_matrix / "trials" / f"{trial}.json"), "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["reproduced"]
    copy = tmp_path / "copy"
    shutil.copytree(cpu_matrix, copy)
    proc = cli("matrix", "--from", str(copy), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["counts"]["identical"] == 6
    proc = cli("matrix", "--compare", str(cpu_matrix), str(copy))
    assert proc.returncode == 0 and "No cell changed." in proc.stdout, proc.stdout + proc.stderr
    # The same matrix from another machine (another kernel) is not merged into this one.
    meta = tomllib.loads((copy / "run.toml").read_text())
    meta["environment"]["kernel"] = "5.15.0-other"
    (copy / "run.toml").write_text(tomli_w.dumps(meta))
    proc = cli("matrix", "--from", str(cpu_matrix), "--from", str(copy))
    assert proc.returncode == 254
    assert "different machines (kernel:" in proc.stderr and "5.15.0-other" in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["--probe", "no_such_probe"], "--probe 'no_such_probe': no probe or matrix row of that name"),
    (["--tool", "gdb"], "--tool 'gdb': not a registered backend"),
    (["--fault", "leave_running"], "'leave_running' is not one of"),
])
def test_bad_matrix_input_is_named_and_nothing_is_written(args: list[str], says: str, tmp_path: Path):
    proc = cli("matrix", *args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 254, proc.stderr
    assert says in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def certified_scenario(path: Path, matrix: Path) -> Path:
    path.write_text(f"""
name = "certified-probes"
[workload]
name = "probe_memory"
array = "numpy"
params = {{ size_bytes = 4096 }}
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu"]
faults = ["kill"]
certify = ["enforce"]
support_matrix = "{matrix}"
[plan]
source = "exhaustive"
ops = [2, 2]
phases = ["launch"]
""")
    return path


def test_certificates_ask_the_measured_matrix_about_the_probe_s_feature(cpu_matrix: Path, tmp_path: Path):
    proc = cli("run", str(certified_scenario(tmp_path / "ok.toml", cpu_matrix)), "--out", str(tmp_path / "a"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    trials = pd.read_parquet(Path(json.loads(proc.stdout)["run_dir"]) / "trials.parquet")
    assert trials["outcome"].tolist() == ["valid"] and trials["cert_eligible"].tolist() == [True]
    # The same probe, with a matrix that says criu failed on host memory: refused before anything is touched.
    doctored = tmp_path / "matrix.parquet"
    table = pd.read_parquet(cpu_matrix / "matrix.parquet")
    table.loc[table["feature"] == "host_memory", "cell"] = "failed"
    table.to_parquet(doctored)
    # Refusing is the answer sought here; without saying so, a run of refusals tested nothing (exit 2).
    proc = cli("run", str(certified_scenario(tmp_path / "bad.toml", doctored)), "--out", str(tmp_path / "b"), "--json",
               "--set", "pipeline.expect_refusals=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    trials = pd.read_parquet(Path(json.loads(proc.stdout)["run_dir"]) / "trials.parquet")
    row = trials.iloc[0]
    assert row["outcome"] == "refused" and row["restores"] == 0
    assert "feature host_memory: the support matrix says failed (row host_memory_1B, criu · kill" in row["cert_reason"]
    # A matrix that is not there is a bad argument: no run directory.
    proc = cli("run", str(certified_scenario(tmp_path / "none.toml", tmp_path / "absent")), "--out", str(tmp_path / "c"))
    assert proc.returncode == 254 and "does not exist" in proc.stderr
    assert not (tmp_path / "c").exists()


def test_a_workload_that_is_not_deterministic_here_is_reported_and_not_judged(criu, tmp_path: Path):
    scenario = tmp_path / "nondet.toml"
    scenario.write_text("""
name = "nondeterministic"
[workload]
name = "tests.fixtures.probes:NondeterministicProbe"
array = "numpy"
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [2, 2]
phases = ["launch"]
""")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = cli("run", str(scenario), "--out", str(tmp_path / "out"), "--json", env=env)
    assert proc.returncode == 254, proc.stderr[-2000:]  # nothing could be judged: nothing ran
    data = json.loads(proc.stdout)
    assert data["outcomes"] == {}
    [skipped] = data["skipped_arms"]
    assert "not deterministic on this machine: two uninterrupted runs differ at op 1: effect payload" in skipped["reason"]
    assert not list((Path(data["run_dir"]) / "trials").glob("*.json"))
