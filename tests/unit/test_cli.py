"""The ``cutbench`` command line: exit codes, ``--json``, sweep, compare (runs are ``criu``: must run in CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.store.rundir import RunDir
from cutbench.harness.model.scenario import load_scenario
from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli, mixed_run, mixed_scenario  # noqa: F401

QUICK = str(REPO / "scenarios" / "quick.toml")


@pytest.mark.parametrize("args, says", [
    (["run", "no-such-scenario.toml"], "does not exist"),
    (["run", QUICK, "--set", "plan.source=sometimes"], "plan.source = 'sometimes': allowed exhaustive, random, hypothesis"),
    (["sweep", QUICK, "--axis", "name=other", "--dry-run"], "--axis name: cannot be swept"),
    (["sweep", QUICK, "--axis", "state_size", "--dry-run"], "expected FIELD=V1,V2"),
    (["sweep", QUICK, "--axis", "workload.params.bogus=1,2", "--dry-run"], "has no parameter 'bogus'"),
    (["sweep", QUICK, "--axis", "pipeline.faults=kill,kill", "--dry-run"], "values repeat"),
    (["sweep", QUICK, "--axis", "pipeline.faults=kill,explode", "--dry-run"], "pipeline.faults contains 'explode'"),
    (["compare", ".", "."], "not a cutbench run directory"),
    (["list", "things"], "'things' is not one of"),
    (["frobnicate"], "No such command"),
])
def test_bad_arguments_exit_254_with_a_clear_message(args: list[str], says: str):
    proc = cli(*args)
    assert proc.returncode == 254, (proc.returncode, proc.stderr[-2000:])
    assert says in proc.stderr
    assert "Traceback" not in proc.stderr


def test_list_json():
    workloads = json.loads(cli("list", "workloads", "--json").stdout)
    assert "counter" in {w["name"] for w in workloads}
    backends = {b["name"]: b for b in json.loads(cli("list", "backends", "--json").stdout)}
    assert set(backends) >= {"criu", "cuda", "cuda+criu", "app"}
    assert all(b["available"] == (b["reason"] is None) for b in backends.values())


def test_sweep_dry_run_counts_the_cartesian_product():
    proc = cli("sweep", QUICK, "--axis", "workload.params.state_size=1024,2048,4096", "--axis", "receiver.modes=idempotent",
               "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [p["variant"] for p in out["points"]] == ["state_size=1024", "state_size=2048", "state_size=4096"]
    scen = load_scenario(QUICK, ["receiver.modes=['idempotent']"])
    per_point = len(scen.arms()) * (scen.plan_ops[1] - scen.plan_ops[0] + 1) * len(scen.plan_phases)
    assert all(p["trials"] == per_point for p in out["points"]) and out["trials"] == 3 * per_point


@pytest.mark.criu
def test_run_json_names_the_report(mixed_run: Path):
    out = json.loads((mixed_run.parent / "cli-stdout.json").read_text())
    assert out["run_dir"] == str(mixed_run) and out["complete"] is True and out["exit_code"] == 1
    assert out["report"] == str(mixed_run / "report.html") and Path(out["report"]).is_file()
    trials = RunDir.open(mixed_run).table("trials")
    assert out["outcomes"] == trials["outcome"].value_counts().to_dict()


@pytest.mark.criu
def test_sweep_runs_every_variant_in_one_run(criu, mixed_scenario: Path, tmp_path: Path):
    proc = cli("sweep", str(mixed_scenario), "--axis", "workload.params.seed=1,2", "--set", "plan.phases=['publish']",
               "--set", "pipeline.faults=['leave_running']", "--out", str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]  # leave_running after publish, at-least-once: duplicates
    run = RunDir.open(json.loads(proc.stdout)["run_dir"])
    trials = run.table("trials")
    assert sorted(trials["variant"]) == ["seed=1", "seed=2"]
    for record in run.trial_records():  # each trial ran (and replays) with its own variant's parameters
        assert f"seed={record['spec']['params']['seed']}" == record["spec"]["variant"]
    assert run.meta()["sweep"]["axes"] == {"workload.params.seed": [1, 2]}
    assert "## By variant and arm" in (run.path / "summary.md").read_text()


def _write_run(root: Path, name: str, meta: dict, trials: pd.DataFrame) -> Path:
    run = RunDir.create(root, name)
    run.write_meta({**meta, "run_id": run.run_id, "run_dir": str(run.path)})
    run.write_table("trials", trials)
    return run.path


@pytest.mark.criu
def test_compare_lines_up_plans_and_flags_regressions(mixed_run: Path, tmp_path: Path):
    a = RunDir.open(mixed_run)
    trials = a.table("trials")
    same = _write_run(tmp_path, "same", a.meta(), trials)
    proc = cli("compare", str(mixed_run), str(same), "--json", "--fail-on-regression")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["counts"]["matched"] == len(trials) and out["counts"]["same"] == len(trials)

    # B: the same plans, one trial that was valid in A now invalid.
    flipped = trials.copy()
    victim = flipped.index[flipped["outcome"] == "valid"][0]
    flipped.loc[victim, "outcome"] = "invalid"
    worse = _write_run(tmp_path, "worse", a.meta(), flipped)
    proc = cli("compare", str(mixed_run), str(worse), "--json", "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["counts"]["regressed"] == 1
    assert out["changed_plans"][0]["plan_json"] == trials.loc[victim, "plan_json"]
    assert out["replay_regressions"] == [f"cutbench replay {worse}/trials/{trials.loc[victim, 'trial_id']}.json"]
    assert cli("compare", str(mixed_run), str(worse)).returncode == 0  # without the flag a comparison is not a verdict

    # Runs that share no plan cannot be compared.
    other = flipped.assign(plan_json=flipped["plan_json"] + " ")
    unrelated = _write_run(tmp_path, "unrelated", a.meta(), other)
    proc = cli("compare", str(mixed_run), str(unrelated))
    assert proc.returncode == 254 and "share no plan" in proc.stderr
