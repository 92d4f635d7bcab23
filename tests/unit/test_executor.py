"""``run.executor`` / ``--executor`` / ``--ray-address``: validated at the boundary; the Ray executor's
resources, GPU visibility and worker checks (no CRIU, no Ray cluster)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.model.scenario import EXECUTORS, LIMITS, check_executor, load_scenario, parse_scenario
from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.runner.ray_executor import RayCluster
from cutbench.harness.runner.ray_tasks import decode, gpu_ids, trial_visible_devices
from cutbench.harness.runner.trial_worker import check_host, needs_root
from tests.conftest import REPO

QUICK = REPO / "scenarios" / "quick.toml"


def test_executor_defaults_to_threads_and_ray_defaults_jobs_to_auto():
    """Under Ray or Slurm, trials run as its resources allow unless run.jobs caps them; threads keep run.jobs = 1."""
    assert EXECUTORS == ("threads", "ray", "slurm")
    assert load_scenario(QUICK, ["run.executor=slurm"]).jobs == "auto"
    scenario = load_scenario(QUICK)
    assert (scenario.executor, scenario.ray_address, scenario.jobs) == ("threads", "", 1)
    ray = load_scenario(QUICK, ["run.executor=ray"])
    assert (ray.executor, ray.ray_address, ray.jobs) == ("ray", "", "auto")
    assert load_scenario(QUICK, ["run.executor=ray", "run.jobs=3"]).jobs == 3
    assert load_scenario(QUICK, ["run.executor=ray", "run.ray_address='10.0.0.5:6379'"]).ray_address == "10.0.0.5:6379"
    assert load_scenario(QUICK, ["run.executor=ray", "run.ray_address=auto"]).ray_address == "auto"


@pytest.mark.parametrize("overrides, match", [
    (["run.executor=dask"], r"^run\.executor = 'dask': allowed threads, ray, slurm$"),
    (["run.executor=3"], r"^run\.executor"),
    (["run.ray_address='h:1'"], r"^run\.ray_address = 'h:1' \(--ray-address\): only read with run\.executor = \"ray\" \(--executor ray\)"),
    (["run.executor=ray", "run.ray_address=''"], r"expected a Ray cluster's address, HOST:PORT or auto"),
    (["run.executor=ray", "run.ray_address='a b:1'"], r"expected a Ray cluster's address"),
    (["run.executor=ray", "run.ray_address='ray://head:10001'"], r"Ray Client address .* run cutbench on a node of the cluster"),
    (["run.executor=ray", "run.ray_address=6379"], r"^run\.ray_address"),
])
def test_a_bad_executor_or_address_names_the_field_and_the_fix(overrides, match):
    with pytest.raises(InvalidArgument, match=match):
        load_scenario(QUICK, overrides)


def test_check_executor_alone():
    assert check_executor("threads") == ("threads", "")
    assert check_executor("ray", "auto") == ("ray", "auto")
    with pytest.raises(InvalidArgument, match="only read with run.executor"):
        check_executor("threads", "auto")


def test_a_variant_may_not_set_its_own_executor():
    """One run, one executor: ``run.executor`` and ``run.ray_address`` are top-level; variants inherit them."""
    base = {"name": "v", "workload": {"name": "counter", "array": "numpy"}, "run": {"executor": "ray"},
            "variants": [{"name": "a"}, {"name": "b", "plan": {"ops": [2, 2]}}]}
    parsed = parse_scenario(base)
    assert [(v.executor, v.jobs) for v in parsed.variants] == [("ray", "auto"), ("ray", "auto")]
    for key, value, option in (("executor", "threads", "--executor"), ("ray_address", "auto", "--ray-address")):
        bad = {**base, "variants": [{"name": "a", "run": {key: value}}]}
        with pytest.raises(InvalidArgument, match=rf"variants\[0\]\.run\.{key}: .*set run\.{key} at the top level \(or pass {option}\)"):
            parse_scenario(bad)


def test_gpu_ids_follow_the_driver_visibility():
    assert gpu_ids(None, 3) == ["0", "1", "2"]
    assert gpu_ids("2,3", 2) == ["2", "3"]
    assert gpu_ids("GPU-aa, GPU-bb", 2) == ["GPU-aa", "GPU-bb"]
    assert gpu_ids("", 0) == []


def test_a_gpu_trial_sees_every_gpu_its_own_first():
    """Ray hides the other GPUs from a GPU task; the trial's process must see them all (the CUDA restore's
    pair list names every visible GPU), the assigned one first so that the workload runs on it."""
    assert trial_visible_devices(["0", "1", "2", "3"], ["2"], None) == "2,0,1,3"
    assert trial_visible_devices(["0", "1"], ["0"], None) == "0,1"
    assert trial_visible_devices(["4", "6"], ["6"], "4,6") == "6,4"
    # A CPU task gets the driver's own value back (None: unset).
    assert trial_visible_devices([], [], None) is None
    assert trial_visible_devices(["0", "1"], [], "1") == "1"


def _cluster(cpus: float, gpus: float) -> RayCluster:
    return RayCluster(ray=None, started=False, address="", node_id="n", cpus=cpus, gpus=gpus, nodes=1,
                      visible_devices=None, startup_s=0.0)


def test_task_resources_one_cpu_or_a_share_of_a_gpu():
    """One CPU per trial; on a GPU host also 1/trials_per_gpu of a GPU, so Ray packs no more than that on one GPU."""
    assert _cluster(2, 0).task_resources(4) == {"num_cpus": 1}
    assert _cluster(2, 0).capacity(4) == 2
    assert _cluster(16, 1).task_resources(1) == {"num_cpus": 1, "num_gpus": 1.0}
    assert _cluster(16, 2).task_resources(4) == {"num_cpus": 1, "num_gpus": 0.25}
    assert _cluster(16, 2).capacity(4) == 8
    for per_gpu in range(1, LIMITS["run.trials_per_gpu"] + 1):
        # Ray counts in 1/10000 units: exactly trials_per_gpu shares fit on a GPU, one more never does.
        units = round(_cluster(16, 1).task_resources(per_gpu)["num_gpus"] * 10_000)
        assert per_gpu * units <= 10_000 < (per_gpu + 1) * units, per_gpu


def test_a_worker_error_comes_back_as_its_type():
    with pytest.raises(Unavailable, match="needs root"):
        decode(pickle.dumps({"error": ("Unavailable", "needs root")}), "t0001")
    with pytest.raises(RuntimeError, match="t0002: the trial's process failed: OSError: boom"):
        decode(pickle.dumps({"error": ("OSError", "boom")}), "t0002")
    assert decode(pickle.dumps({"interrupted": True}), "t0003") is None


def _spec(backend: str) -> TrialSpec:
    return TrialSpec(trial_id="t0001", index=1, workload="counter", array="numpy", params={"ops": 4}, backend=backend,
                     receiver_mode="at_least_once", arm={"fault": "kill", "crash_after_ms": 0.0, "split_window_ms": 0.0},
                     plan={"cuts": [{"op": 1, "phase": "admit"}]})


def test_a_worker_without_root_refuses_criu_and_cuda_backends():
    """CRIU and the CUDA checkpoint calls need root on the worker: a clear refusal, not a failed trial."""
    assert needs_root("criu") and needs_root("cuda") and needs_root("cuda+criu")
    assert not needs_root("app") and not needs_root("restart")
    with pytest.raises(Unavailable, match=r"runs as uid 1000, and backend 'criu' needs root .*ray start"):
        check_host(_spec("criu"), pid_namespace=False, euid=1000)
    check_host(_spec("app"), pid_namespace=False, euid=1000)  # the app backend needs nothing of root


def test_one_node_keeps_the_receiver_on_loopback_and_a_cluster_gives_it_the_node_address_and_a_secret():
    one = _cluster(4, 0)
    assert not one.spread and one.receiver_exposure() == ("127.0.0.1:0", None)
    two = RayCluster(ray=None, started=False, address="ray://head:10001", node_id="n" * 56, cpus=8, gpus=0, nodes=2,
                     visible_devices=None, startup_s=0.0, node_ip="10.1.2.3")
    listen, token = two.receiver_exposure()
    assert two.spread and listen == "10.1.2.3:0" and len(token) == 32
    assert two.receiver_exposure()[1] != token  # a fresh secret per run
    assert two.describe(1)["spread"] is True


def test_a_worker_request_names_its_keys(tmp_path: Path):
    import json

    from cutbench.harness.runner.trial_worker import REQUEST_KEYS, read_request

    request = {k: None for k in REQUEST_KEYS}
    path = tmp_path / "request.json"
    for extra in ({}, {"check_only": True}, {"attempt": 1}):
        path.write_text(json.dumps({**request, **extra}))
        assert read_request(path) == {**request, **extra}
    path.write_text(json.dumps({**request, "surprise": 1}))
    with pytest.raises(InvalidArgument, match="expected the keys .* \\(and optionally attempt, check_only, references, support\\)"):
        read_request(path)
    assert decode(pickle.dumps({"checked": True}), "(node check)") is None


def test_stopping_at_the_first_invalid_trial_is_one_serial_run_its_gate_and_summary_say_so(tmp_path: Path):
    """``run.stop_at_first_invalid`` is the whole run's (no variant sets it); it runs the plans one at a time in
    this process, whatever ``run.jobs`` or the executor; the gate will not hold a rate above 0 to a run it cut
    short, and the summary says why fewer trials ran than were planned."""
    import pandas as pd

    from cutbench.harness.integrations import gate
    from cutbench.harness.reports import summary
    from cutbench.harness.runner.executors import SerialExecutor, choose_executor
    from cutbench.harness.runner.run import RunOutcome
    from cutbench.harness.store.rundir import RunDir
    from tests.fixtures.run_fixtures import write_run

    base = {"name": "v", "workload": {"name": "counter", "array": "numpy"}, "variants": [{"name": "a"}]}
    with pytest.raises(InvalidArgument, match=r"variants\[0\]\.run\.stop_at_first_invalid: a run stops once.*"
                                              r"--set run\.stop_at_first_invalid=true"):
        parse_scenario({**base, "variants": [{"name": "a", "run": {"stop_at_first_invalid": True}}]})
    scenario = load_scenario(QUICK, ["run.stop_at_first_invalid=true", "run.jobs=4", "run.executor=ray"])
    executor = choose_executor(scenario, [], {})
    assert isinstance(executor, SerialExecutor) and executor.stop_at_first_invalid
    trials = pd.DataFrame({"trial_id": ["t0001", "t0002"], "outcome": ["valid", "invalid"], "arm": "criu/idempotent/kill",
                           "plan": "2/publish kill", "findings": "[]", "error": ""})
    meta = {"status": "complete", "scenario": {"name": "s"}, "n_trials_planned": 9, "first_invalid": 2}
    outcome = RunOutcome(RunDir.open(write_run(tmp_path, "s", meta, trials)), trials, True)
    assert "stopped at its first invalid trial (2; run.stop_at_first_invalid)" in gate.evaluate(outcome, 0.5, "s").message()
    assert "stopped at its first invalid trial" not in gate.evaluate(outcome, 0.0, "s").message()
    assert "stopped at its first invalid trial, number 2 in plan order" in summary.render(meta, trials)
