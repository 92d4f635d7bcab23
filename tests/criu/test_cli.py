"""The ``cutbench`` command on real runs: sweeps, compare and report through CRIU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutbench.harness.store.rundir import RunDir
from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli, write_run


@pytest.mark.criu
def test_run_json_names_the_report(mixed_run: Path):
    out = json.loads((mixed_run.parent / "cli-stdout.json").read_text())
    assert out["run_dir"] == str(mixed_run) and out["complete"] is True and out["exit_code"] == 1
    assert out["report"] == str(mixed_run / "report.html") and Path(out["report"]).is_file()
    trials = RunDir.open(mixed_run).table("trials")
    assert out["outcomes"] == trials["outcome"].value_counts().to_dict()
    # The figures a CI job wants: the rate with its interval, overall and per arm.
    assert 0 < out["invalid_rate"] <= 1 and 0 <= out["rate_low"] <= out["invalid_rate"] <= out["rate_high"] <= 1
    assert {a["arm"] for a in out["arms"]} == set(trials["arm"]) and all("invalid_rate" in a for a in out["arms"])
    # What each backend declared is kept with the run (the reports read it from there, not from the registry).
    declared = RunDir.open(mixed_run).meta()["backends"]
    assert set(declared) == set(trials["backend"]) and "criu_dump" in declared["criu"]["stages"]


@pytest.mark.criu
def test_sweep_runs_every_variant_in_one_run(criu, mixed_scenario: Path, tmp_path: Path):
    proc = cli("sweep", str(mixed_scenario), "--axis", "workload.params.seed=1,2", "--set", "plan.phases=['publish']",
               "--set", "pipeline.faults=['leave_running']", "--out", str(tmp_path), "--json", "--jobs", "2")
    assert proc.returncode == 1, proc.stderr[-3000:]  # leave_running after publish, at-least-once: duplicates
    run = RunDir.open(json.loads(proc.stdout)["run_dir"])
    trials = run.table("trials")
    assert sorted(trials["variant"]) == ["seed=1", "seed=2"]
    for record in run.trial_records():  # each trial ran (and replays) with its own variant's parameters
        assert f"seed={record['spec']['params']['seed']}" == record["spec"]["variant"]
    assert run.meta()["sweep"]["axes"] == {"workload.params.seed": [1, 2]}
    assert run.meta()["jobs"] == 2  # --jobs: the sweep's trials ran two at a time
    assert "## By variant and arm" in (run.path / "summary.md").read_text()


@pytest.mark.criu
def test_compare_lines_up_plans_and_flags_regressions(mixed_run: Path, tmp_path: Path):
    a = RunDir.open(mixed_run)
    trials = a.table("trials")
    same = write_run(tmp_path, "same", a.meta(), trials)
    proc = cli("compare", str(mixed_run), str(same), "--json", "--fail-on-regression")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["counts"]["matched"] == len(trials) and out["counts"]["same"] == len(trials)

    # B: the same plans, one trial that was valid in A now invalid.
    flipped = trials.copy()
    victim = flipped.index[flipped["outcome"] == "valid"][0]
    flipped.loc[victim, "outcome"] = "invalid"
    worse = write_run(tmp_path, "worse", a.meta(), flipped)
    proc = cli("compare", str(mixed_run), str(worse), "--json", "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["counts"]["regressed"] == 1
    assert out["changed_plans"][0]["plan_json"] == trials.loc[victim, "plan_json"]
    assert out["replay_regressions"] == [f"cutbench replay {worse}/trials/{trials.loc[victim, 'trial_id']}.json"]
    assert cli("compare", str(mixed_run), str(worse)).returncode == 0  # without the flag a comparison is not a verdict

    # Runs that share no plan cannot be compared.
    other = flipped.assign(plan_json=flipped["plan_json"] + " ")
    unrelated = write_run(tmp_path, "unrelated", a.meta(), other)
    proc = cli("compare", str(mixed_run), str(unrelated))
    assert proc.returncode == 254 and "share no plan" in proc.stderr


@pytest.mark.criu
def test_a_terminal_gets_the_summary_rendered_and_a_pipe_gets_plain_markdown(criu, tmp_path: Path):
    """On a terminal (FORCE_COLOR stands in for one) no raw Markdown (`**`, `|:--`) reaches the screen."""
    import os

    args = ("run", str(REPO / "scenarios" / "quick.toml"), "--out", str(tmp_path), "--set", "plan.phases=['publish']",
            "--set", "receiver.modes=['at_least_once']", "--set", "pipeline.faults=['kill']")
    piped = cli(*args)
    assert piped.returncode == 0 and "|:--" in piped.stderr and "**all recoveries valid**" in piped.stderr
    tty = cli(*args, env={**os.environ, "FORCE_COLOR": "1"})
    assert tty.returncode == 0 and "all recoveries valid" in tty.stderr
    assert "|:--" not in tty.stderr and "**" not in tty.stderr
