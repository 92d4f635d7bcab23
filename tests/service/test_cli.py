"""The ``cutbench`` command line: exit codes, ``--json``, sweep, compare (runs are ``criu``: must run in CI)."""

from __future__ import annotations

import json

import pytest

from cutbench.harness.store.rundir import RunDir
from cutbench.harness.model.scenario import load_scenario
from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli

QUICK = str(REPO / "scenarios" / "quick.toml")


@pytest.mark.parametrize("args, says", [
    (["run", "no-such-scenario.toml"], "does not exist"),
    (["run", QUICK, "--set", "plan.source=sometimes"], "plan.source = 'sometimes': allowed exhaustive, random, hypothesis"),
    # Square brackets in values and messages are text, never terminal markup.
    (["run", QUICK, "--set", "plan.source=[/x]"], "plan.source = '[/x]': allowed"),
    (["run", QUICK, "--set", "plan.bogus=1"], "allowed in [plan]: source"),
    # Numbers without bounds would exhaust memory or time before the first trial.
    (["run", QUICK, "--set", "plan.ops=[1,1000000000000]"], "<= 1,000,000"),
    (["run", QUICK, "--set", "workload.params.ops=1000000000000"], "parameter ops = 1000000000000: must be in 1..1000000"),
    (["run", QUICK, "--set", "run.watchdog_s=1e12"], "run.watchdog_s = 1000000000000.0: must be <= 86400"),
    (["run", QUICK, "--set", "plan.cuts_per_trial=8", "--set", "plan.ops=[1,8]", "--set", "workload.params.ops=8"],
     "would enumerate 1,689,096,333 plans per arm"),
    (["sweep", QUICK, "--axis", "name=other", "--dry-run"], "--axis name: cannot be swept"),
    (["sweep", QUICK, "--axis", "state_size", "--dry-run"], "expected FIELD=V1,V2"),
    (["sweep", QUICK, "--axis", "workload.params.bogus=1,2", "--dry-run"], "has no parameter 'bogus'"),
    (["sweep", QUICK, "--axis", "pipeline.faults=kill,kill", "--dry-run"], "values repeat"),
    (["sweep", QUICK, "--axis", "pipeline.faults=kill,explode", "--dry-run"], "pipeline.faults contains 'explode'"),
    (["sweep", QUICK, "--axis", "workload.params.seed=1,2", "--jobs", "0", "--dry-run"], "--jobs = 0: expected a whole"),
    (["sweep", QUICK, "--axis", "workload.params.seed=1,2", "--ray-address", "x", "--dry-run"], "run.ray_address"),
    (["compare", ".", "."], "not a cutbench run directory"),
    (["run"], "give a SCENARIO to run, or --resume RUN_DIR"),
    (["run", "--resume", "."], "not a cutbench run directory"),
    (["run", "--resume", ".", "--variant", "x"], "--variant with --resume"),
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


def test_a_run_whose_every_arm_is_skipped_says_why_and_exits_254(tmp_path, monkeypatch):
    """Nothing could run here (the CRIU CUDA plugin is not configured): not "unknown only" but an unusable environment."""
    import subprocess
    import sys

    monkeypatch.delenv("CUTBENCH_CRIU_PLUGIN_DIR", raising=False)
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"), "--out", str(tmp_path),
                           "--set", 'pipeline.backends=["criu-cuda-plugin"]', "--set", "pipeline.skip_unavailable=true"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 254, proc.stdout[-2000:] + proc.stderr[-2000:]
    said = proc.stdout + proc.stderr
    assert "Nothing was tested" in said and "CUTBENCH_CRIU_PLUGIN_DIR" in said


def test_list_workloads_describes_each_and_receiver_serve_help_lists_its_options():
    workloads = json.loads(cli("list", "workloads", "--json").stdout)
    assert all(w["description"] and "see module docstring" not in w["description"] for w in workloads)
    assert not any("``" in w["description"] for w in workloads)  # plain text, not reST
    by_name = {w["name"]: w for w in workloads}
    assert by_name["counter"]["needs_gpu"] is False and by_name["nccl_ranks"]["needs_gpu"] is True
    text = cli("list", "workloads").stdout
    assert "counter\tCPU or GPU (numpy, cupy, torch)\tcounter: the smallest workload" in text
    proc = cli("receiver", "serve", "--help")
    assert proc.returncode == 0 and "--store" in proc.stdout and "--listen" in proc.stdout


def test_list_scenarios_from_elsewhere_finds_the_checkouts_scenarios(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cutbench", "list", "scenarios"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "quick.toml" in proc.stdout


def test_trial_files_are_read_in_plan_order_past_ten_thousand_trials(tmp_path):
    run = RunDir.create(tmp_path, "many")
    ids = ["t9999", "t10000", "t0002", "t10001"]
    run.write_meta({"run_id": run.run_id, "n_trials": len(ids)})
    for trial_id in ids:
        run.write_trial(trial_id, {"run_id": run.run_id, "spec": {"trial_id": trial_id}})
    assert [r["spec"]["trial_id"] for r in run.trial_records()] == ["t0002", "t9999", "t10000", "t10001"]


def test_a_workload_its_process_cannot_import_is_refused_before_any_trial(tmp_path):
    # The harness imports the module; a workload process (another environment: the marker variable every process
    # the harness starts carries) lacks what it imports. One clear refusal, not a run of unknown trials.
    (tmp_path / "mywl").mkdir()
    (tmp_path / "mywl" / "needy.py").write_text(
        "import os\nif os.environ.get('CUTBENCH_HARNESS_CHILD'):\n    import a_library_only_the_harness_has\n"
        "from cutbench.workloads.counter import Counter\n\n\nclass Needy(Counter):\n    name = 'needy'\n")
    scenario = tmp_path / "needy.toml"
    scenario.write_text('name = "needy"\n[workload]\nname = "needy:Needy"\narray = "numpy"\n')
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path / "mywl")}
    done = cli("run", str(scenario), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 254, done.stderr[-3000:]
    assert "a workload process cannot import it" in done.stderr
    assert "No module named 'a_library_only_the_harness_has'" in done.stderr
    assert "cutbench.workloads.launch --check needy:Needy" in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
