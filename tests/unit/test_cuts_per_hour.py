"""The pure parts of ``benchmarks/cuts_per_hour.py``: its scenarios, trial walls under N workers, the time
breakdown, stage stretch and the figures of one configuration (no CRIU)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pandas as pd
import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.generator.scheduler import plans
from cutbench.harness.model.scenario import parse_scenario
from cutbench.harness.runner.executors import resolve_jobs
from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("cuts_per_hour", REPO / "benchmarks" / "cuts_per_hour.py")
cph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cph)

CPU = {"backend": "criu", "array": "numpy", "ballast_mib": 0}


def scenario(**kw):
    return parse_scenario(cph.scenario_data(**{**CPU, "jobs": 1, "cuts_per_trial": 1, "trials": 4, **kw}))


def test_every_job_count_runs_the_same_plans_and_a_bigger_run_begins_with_a_smaller_ones():
    small, big = scenario(jobs=1, trials=4, cuts_per_trial=4), scenario(jobs=8, trials=16, cuts_per_trial=4)
    arm = small.arms()[0]
    assert plans(big, big.arms()[0])[:4] == plans(small, arm)
    assert plans(scenario(jobs=4, trials=4, cuts_per_trial=4), arm) == plans(small, arm)
    assert {len(p.cuts) for p in plans(big, arm)} <= {1, 2, 3, 4}


def test_periodic_places_exactly_k_cuts_per_trial_on_enough_ops():
    sc = scenario(source="periodic", cuts_per_trial=6, trials=3)
    assert [[c.op for c in p.cuts] for p in plans(sc, sc.arms()[0])] == [[1, 2, 3, 4, 5, 6]] * 3
    assert sc.params["ops"] == 6
    with pytest.raises(InvalidArgument, match="--source 'hourly'"):
        cph.scenario_data(**CPU, jobs=1, cuts_per_trial=1, trials=1, source="hourly")


@pytest.mark.parametrize("jobs", [1, 4, 16])
def test_jobs_and_trials_per_gpu_agree_on_a_one_gpu_host(jobs):
    sc = scenario(jobs=jobs)
    one_gpu = {"gpu": {"gpus": [{"index": 0, "memory_mib": 143771}]}}
    assert (sc.jobs, sc.trials_per_gpu) == (jobs, jobs)
    assert resolve_jobs(replace(sc, jobs="auto"), one_gpu) == resolve_jobs(sc, one_gpu) == jobs


def test_gpu_fit_refuses_fractional_oversubscription_with_the_fix():
    assert cph.gpu_fit_error(16, 1024, 143771) is None  # 16 × 1.5 GiB on an H200
    assert cph.gpu_fit_error(64, 4096, None) is None  # memory unknown: nothing to say
    message = cph.gpu_fit_error(40, 4096, 143771)
    assert message.startswith("--jobs 40 with --ballast-mib 4096: ") and "lower --jobs or --ballast-mib" in message


def test_trial_walls_start_when_a_worker_frees_up():
    # Two workers: positions 0 and 1 start with the run; 2 takes the first freed worker, 3 the second.
    finishes = [(1, "t0002", 13.0), (0, "t0001", 14.0), (2, "t0003", 16.0), (3, "t0004", 17.0)]
    assert cph.trial_walls(finishes, 2, 10.0) == {"t0002": (10.0, 13.0), "t0001": (10.0, 14.0),
                                                  "t0003": (13.0, 16.0), "t0004": (14.0, 17.0)}
    # One worker: the gaps between verdicts, the first from the run's start.
    serial = [(0, "a", 2.0), (1, "b", 5.0), (2, "c", 9.0)]
    assert cph.trial_walls(serial, 1, 0.0) == {"a": (0.0, 2.0), "b": (2.0, 5.0), "c": (5.0, 9.0)}
    with pytest.raises(InvalidArgument, match="^jobs = 0"):
        cph.trial_walls(serial, 0, 0.0)


def timeline(rows):
    return pd.DataFrame(rows, columns=["trial_id", "stage", "duration_s"])


TIMELINE = timeline([
    ("a", "spawn", 0.5), ("a", "reach_cut", 1.0), ("a", "criu_dump", 2.0), ("a", "cuda_discover", 0.5),
    ("b", "spawn", 0.5), ("b", "reach_cut", 1.0), ("b", "criu_dump", 2.0), ("b", "criu_dump", 4.0),
])


def test_breakdown_splits_wall_into_tool_workload_and_overhead():
    rows = cph.breakdown({"a": (0.0, 5.0), "b": (5.0, 13.0)}, TIMELINE).set_index("trial_id")
    assert rows.loc["a", ["tool_s", "workload_s", "harness_stages_s", "untimed_s", "overhead_s"]].tolist() == \
        [2.0, 1.5, 0.5, 1.0, 1.5]
    assert rows.loc["a", "overhead_frac"] == pytest.approx(0.3)
    assert rows.loc["b", ["wall_s", "tool_s", "overhead_s"]].tolist() == [8.0, 6.0, 0.5]


def test_stage_means_are_per_occurrence_and_per_trial_with_the_untimed_rest():
    per_trial = cph.breakdown({"a": (0.0, 5.0), "b": (5.0, 13.0)}, TIMELINE)
    means = cph.stage_means(TIMELINE, per_trial).set_index("stage")
    assert means.loc["criu_dump", ["mean_s", "n", "per_trial_s"]].tolist() == [pytest.approx(8 / 3), 3, 4.0]
    assert means.loc[cph.UNTIMED, "mean_s"] == pytest.approx((1.0 + 0.5) / 2)
    # A trial interrupted by the budget has no wall: its stages are left out.
    assert cph.stage_means(TIMELINE, per_trial[per_trial["trial_id"] == "a"]).set_index("stage").loc["criu_dump", "n"] == 1


def test_the_top_stretching_stage_is_the_one_that_gained_most_seconds_not_the_biggest_ratio():
    stages = pd.DataFrame([
        (1, 1, "spawn", 0.001, 0.001), (1, 1, "criu_dump", 1.0, 1.0), (1, 1, "reach_cut", 2.0, 2.0),
        (4, 1, "spawn", 0.040, 0.040), (4, 1, "criu_dump", 2.5, 2.5), (4, 1, "reach_cut", 2.2, 2.2),
        (4, 1, "cuda_discover", 0.3, 0.3),  # absent at one job: no ratio
        (1, 4, "criu_dump", 1.0, 4.0), (4, 4, "criu_dump", 0.9, 3.6),
    ], columns=["jobs", "cuts_per_trial", "stage", "mean_s", "per_trial_s"])
    out = cph.stretch(stages).set_index(["jobs", "cuts_per_trial", "stage"])
    assert out.loc[(4, 1, "spawn"), "ratio"] == pytest.approx(40.0)
    assert out.loc[(4, 1, "criu_dump"), ["ratio", "added_s"]].tolist() == [pytest.approx(2.5), pytest.approx(1.5)]
    assert pd.isna(out.loc[(4, 1, "cuda_discover"), "ratio"])
    top = cph.stretch(stages)
    assert cph.top_stretch(top, 4, 1) == ("criu_dump", pytest.approx(2.5))
    assert cph.top_stretch(top, 1, 1) is None  # the baseline
    assert cph.top_stretch(top, 4, 4) is None  # nothing grew


def trials_table():
    return pd.DataFrame({
        "trial_id": ["a", "b", "c", "d"],
        "outcome": ["valid", "valid", "unknown", "unknown"],
        "n_cuts": [3, 1, 2, 2],
        "error": [None, None, "criu restore: pid 4242 is busy\nmore", "criu restore: pid 4242 is busy"],
        "failed_stage": [None, None, "criu_restore", "criu_restore"],
    })


def test_unknown_reasons_count_the_failed_stage_and_the_first_line():
    assert cph.unknown_reasons(trials_table()) == {"criu_restore: criu restore: pid 4242 is busy": 2}


def test_cuts_per_hour_counts_the_valid_trials_cuts_over_the_span():
    per_trial = pd.DataFrame({"trial_id": list("abcd"), "wall_s": [10.0] * 4, "tool_s": [6.0] * 4,
                              "workload_s": [3.0] * 4, "overhead_s": [1.0] * 4})
    s = cph.summarize(per_trial, trials_table(), span_s=36.0)
    assert (s["valid_cuts"], s["cuts_per_hour"], s["unknown"]) == (4, pytest.approx(400.0), 2)
    assert (s["cuts_per_trial_mean"], s["overhead_fraction"], s["mean_trial_wall_s"]) == (2.0, 0.1, 10.0)
    assert s["outcomes"] == {"valid": 2, "unknown": 2}


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], r"^--jobs 0 --cuts-per-trial 1 --source random: run\.jobs = 0: "),
    (["--cuts-per-trial", "9"], r"^--jobs 1 --cuts-per-trial 9 --source random: plan\.cuts_per_trial = 9: must be <= 8"),
    (["--trials-per-job", "0"], r"^--trials-per-job 0: expected at least 1"),
    (["--max-seconds", "0"], r"^--max-seconds 0: "),
    (["--ballast-mib", "-1"], r"^--ballast-mib -1: "),
    (["--images-dir", "/nonexistent/images"], r"^--images-dir /nonexistent/images: not a directory"),
])
def test_bad_arguments_name_the_option(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        cph.parse_args(["--out", "x", *argv])
    assert cph.parse_args(["--out", "x", "--source", "periodic", "--cuts-per-trial", "12"]).cuts_per_trial == [12]


def test_trials_scale_with_jobs_but_the_fewest_jobs_still_get_the_minimum():
    assert [cph.configuration_trials(j, 12, 2, 6) for j in (1, 4, 8, 16)] == [6, 8, 16, 32]
    assert [cph.configuration_trials(j, 12, None) for j in (1, 16)] == [12, 12]


def test_the_steady_rate_leaves_out_the_first_batch_of_verdicts():
    # 2 workers: verdicts at 10, 11 (the first batch, start-up included), then 20, 21, 30 s.
    finishes = [(0, "a", 10.0), (1, "b", 11.0), (2, "c", 20.0), (3, "d", 21.0), (4, "e", 30.0)]
    cuts = {"a": 1, "b": 1, "c": 2, "d": 1, "e": 3}  # every trial valid
    assert cph.steady_rate(finishes, cuts, jobs=2) == pytest.approx(3600.0 * 6 / 19.0)
    assert cph.steady_rate(finishes, {"c": 2}, jobs=2) == pytest.approx(3600.0 * 2 / 19.0)  # d, e not valid
    assert cph.steady_rate(finishes[:2], cuts, jobs=2) is None  # nothing after the first batch


def test_host_load_is_the_busy_share_and_the_cpu_seconds_per_cut(monkeypatch):
    monkeypatch.setattr(cph.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(cph.os, "sysconf", lambda name: 100)
    load = cph.host_load((1000, 10_000), (1000 + 300, 10_000 + 400), cuts=6)  # 3 busy CPU-s of 4 in 1 s
    assert load["cpu_busy_fraction"] == pytest.approx(0.75)
    assert load["cpu_s_per_cut"] == pytest.approx(0.5)
    assert load["cpu_bound_cuts_per_hour"] == pytest.approx(3600.0 * 4 / 0.5)
    assert cph.host_load(None, (1, 2), cuts=1) == {}
    assert "cpu_s_per_cut" not in cph.host_load((0, 0), (1, 2), cuts=0)


def test_host_cpu_is_every_jiffy_but_idle_and_iowait_of_the_cpu_line(monkeypatch, tmp_path):
    """``/proc/stat``'s first line: busy is user, nice, system, irq, softirq and steal; total adds idle and iowait;
    guest time is inside user already (not counted twice). A kernel with four fields and no file at all read too."""
    import builtins

    stat = tmp_path / "stat"
    monkeypatch.setattr(cph, "open", lambda path, *a, **kw: builtins.open(stat if path == "/proc/stat" else path, *a, **kw),
                        raising=False)
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 50 1000 20 3 7 9 11 2\ncpu0 50 2 25 500 10 1 3 4 5 1\n")
    assert cph.host_cpu() == (100 + 5 + 50 + 3 + 7 + 9, 100 + 5 + 50 + 1000 + 20 + 3 + 7 + 9)
    stat.write_text("cpu  1 2 3 4\n")
    assert cph.host_cpu() == (6, 10)
    stat.write_text("cpu  one two\n")
    assert cph.host_cpu() is None
    stat.unlink()
    assert cph.host_cpu() is None


def test_host_cpu_reads_this_hosts_counters_which_only_grow():
    busy, total = cph.host_cpu()
    later = cph.host_cpu()
    assert later[0] >= busy and later[1] >= total  # counters since boot


def cpu_timeline():
    """Two trials of one cut each (the second's restore failed) with the stage rows' CPU columns."""
    cols = ["trial_id", "cut_index", "stage", "result", "duration_s", "bytes", "cpu_s", "cpu_workload_s",
            "cpu_criu_s", "minflt"]
    rows = [
        ("a", 0, "reach_cut", "ok", 1.0, None, 0.8, 0.8, 0.0, 100),
        ("a", 0, "cuda_discover", "ok", 0.1, 1 << 30, 0.05, 0.0, 0.0, 0),
        ("a", 0, "criu_dump", "ok", 2.0, 2e9, 1.5, 0.5, 1.0, 4000),
        ("a", 0, "criu_restore", "ok", 1.0, None, 1.0, 0.5, 0.5, 3000),
        ("a", 0, "cuda_restore", "ok", 0.5, None, 0.4, 0.4, 0.0, 10),
        ("a", 0, "note", "event", 0.0, None, None, None, None, None),
        ("b", 0, "reach_cut", "ok", 1.0, None, 0.8, 0.8, 0.0, 100),
        ("b", 0, "cuda_discover", "ok", 0.1, 1 << 30, 0.05, 0.0, 0.0, 0),
        ("b", 0, "criu_dump", "ok", 2.0, 2e9, 1.5, 0.5, 1.0, 4000),
        ("b", 0, "criu_restore", "failed", 1.0, None, 0.2, 0.0, 0.2, 10),
    ]
    return pd.DataFrame(rows, columns=cols)


PER_TRIAL = pd.DataFrame({"trial_id": ["a", "b"], "n_cuts": [1, 1]})


def test_cpu_per_cut_is_summed_by_stage_and_by_role_and_absent_columns_are_nan():
    stages = cph.cpu_by_stage(cpu_timeline(), PER_TRIAL).set_index("stage")
    assert stages.loc["criu_dump", ["wall_s", "cpu_s", "cpu_criu_s", "minflt"]].tolist() == [2.0, 1.5, 1.0, 4000]
    assert stages.loc["criu_restore", "cpu_s"] == pytest.approx(0.6)
    assert "note" not in stages.index  # events are no stage
    assert stages["cpu_cuda_threads_s"].isna().all()  # not in this table: NaN, not 0
    roles = cph.cpu_by_role(stages.reset_index())
    assert roles["total"] == pytest.approx((1.6 + 0.1 + 3.0 + 1.2 + 0.4) / 2)
    assert (roles["criu"], roles["workload"]) == (pytest.approx(1.35), pytest.approx(1.75))
    assert roles["minflt"] == pytest.approx(5610)
    assert pd.isna(roles["cuda_threads"]) and pd.isna(roles["write_bytes"])


def test_a_cuts_bytes_are_its_image_and_device_state_read_back_only_where_restored():
    per_cut = cph.cut_bytes(cpu_timeline(), PER_TRIAL)
    assert per_cut == {"image_bytes": 2e9, "restored_bytes": 1e9, "gpu_bytes": float(1 << 30),
                       "gpu_restored_bytes": float(1 << 29)}


BANDWIDTH = {"results": {
    "tmpfs_write": {"gb_s": 2.0, "cpu_s_per_gib": 0.5}, "tmpfs_read": {"gb_s": 4.0, "cpu_s_per_gib": 0.25},
    "d2h_pageable": {"gb_s": 10.0, "cpu_s_per_gib": 0.1}, "h2d_pageable": {"gb_s": 10.0, "cpu_s_per_gib": 0.1},
}}


def test_the_cost_of_a_cut_is_a_ratio_to_what_its_bytes_need_at_the_reference_rates():
    per_cut = {"image_bytes": 2e9, "restored_bytes": 1e9, "gpu_bytes": float(1 << 30), "gpu_restored_bytes": 0.0}
    need = cph.bytes_need(per_cut, BANDWIDTH)
    gib = 1 << 30
    assert need["cpu_s"] == pytest.approx(2e9 / gib * 0.5 + 1e9 / gib * 0.25 + 0.1)
    assert need["wall_s"] == pytest.approx(1.0 + 0.25 + gib / 10e9) and need["missing"] == []
    stages = cph.cpu_by_stage(cpu_timeline(), PER_TRIAL)
    ratio = cph.cost_ratio(stages, per_cut, BANDWIDTH)
    tool = stages[stages["stage"].isin(["criu_dump", "criu_restore", "cuda_restore"])]
    assert ratio["tool_cpu_s"] == pytest.approx(tool["cpu_s"].sum())
    assert ratio["cpu_ratio"] == pytest.approx(ratio["tool_cpu_s"] / need["cpu_s"])
    assert ratio["wall_ratio"] == pytest.approx(tool["wall_s"].sum() / need["wall_s"])
    # A reference made on a host without a GPU cannot price device bytes: no ratio, and it says which is missing.
    cpu_only = {"results": {k: v for k, v in BANDWIDTH["results"].items() if k.startswith("tmpfs")}}
    priced = cph.bytes_need(per_cut, cpu_only)
    assert pd.isna(priced["cpu_s"]) and priced["missing"] == ["d2h_pageable"]
    assert pd.isna(cph.cost_ratio(stages, per_cut, cpu_only)["cpu_ratio"])


def test_the_bytes_bound_rate_prices_a_cut_at_the_parallel_rates_and_needs_every_kind():
    per_cut = {"image_bytes": 2e9, "restored_bytes": 1e9, "gpu_bytes": 1e9, "gpu_restored_bytes": 0.0}
    parallel = {"tmpfs_write": {"gb_s": 20.0, "cpu_s_per_gib": 0.7}, "tmpfs_read": {"gb_s": 40.0, "cpu_s_per_gib": 1.5},
                "d2h_pageable": {"gb_s": 50.0, "cpu_s_per_gib": 0.6}}
    seconds = 2e9 / 20e9 + 1e9 / 40e9 + 1e9 / 50e9
    assert cph.bandwidth_bound(per_cut, {**BANDWIDTH, "parallel": {"processes": 16, "results": parallel}}) == pytest.approx(3600 / seconds)
    # A reference without parallel figures, or lacking one the cut needs, gives no bound rather than a wrong one.
    assert cph.bandwidth_bound(per_cut, BANDWIDTH) is None
    del parallel["d2h_pageable"]
    assert cph.bandwidth_bound(per_cut, {**BANDWIDTH, "parallel": {"results": parallel}}) is None


def test_the_images_directory_reaches_the_pipeline_and_defaults_to_the_scenarios(tmp_path):
    assert scenario(images_dir=str(tmp_path)).images_dir == str(tmp_path)
    assert scenario().images_dir == "/dev/shm"
    assert cph.parse_args(["--out", "x", "--images-dir", str(tmp_path)]).images_dir == str(tmp_path)


def test_a_bandwidth_file_that_is_not_one_is_named(tmp_path):
    bad = tmp_path / "bw.json"
    bad.write_text('{"size_bytes": 1}')
    with pytest.raises(InvalidArgument, match="no 'results'"):
        cph.parse_args(["--out", "x", "--bandwidth", str(bad)])
    with pytest.raises(InvalidArgument, match="not a readable bandwidth reference"):
        cph.parse_args(["--out", "x", "--bandwidth", str(tmp_path / "absent.json")])
    bad.write_text(json.dumps(BANDWIDTH))
    assert cph.parse_args(["--out", "x", "--bandwidth", str(bad)]).bandwidth_reference == BANDWIDTH


def test_the_cpu_tables_print_per_stage_role_and_count_and_the_ratio(capsys):
    stages = cph.cpu_by_stage(cpu_timeline(), PER_TRIAL)
    per_cut = cph.cut_bytes(cpu_timeline(), PER_TRIAL)
    configs = [{"jobs": j, "cuts_per_trial": 1, "cpu_per_cut": cph.cpu_by_role(stages), "bytes_per_cut": per_cut,
                "host_busy_s_per_cut": 8.0, "bandwidth_ratio": cph.cost_ratio(stages, per_cut, BANDWIDTH)}
               for j in (1, 16)]
    cpu = pd.concat([stages.assign(jobs=j, cuts_per_trial=1) for j in (1, 16)], ignore_index=True)
    cph.print_cpu_tables(configs, cpu, "bw.json")
    out = capsys.readouterr().out
    assert "by stage" in out and "| criu_dump " in out and "j16 CPU s" in out
    assert "| criu " in out and "| accounted % of host busy " in out and "39.375" in out  # 3.15 of 8 CPU-s
    assert "| minflt " in out and "| image_bytes " in out and "2,000,000,000" in out
    assert "CPU ×" in out and "bw.json" in out


def test_unaccounted_splits_the_busy_time_no_cut_process_had_into_kernel_families_and_the_rest(monkeypatch):
    monkeypatch.setattr(cph.os, "sysconf", lambda name: 100)
    before = {"irq + softirq": 1000, "kernel threads: kworker": 500, "kernel threads: khugepaged": 10}
    after = {"irq + softirq": 1000 + 80, "kernel threads: kworker": 500 + 240, "kernel threads: khugepaged": 10 + 1,
             "kernel threads: kcompactd": 40}  # a family first seen at the end counts from 0
    out = cph.unaccounted(before, after, cuts=4, host_busy_s=5.0, accounted_s=4.0)
    # Largest first; khugepaged's 0.0025 s per cut is below the 0.01 shown.
    assert list(out) == ["kernel threads: kworker", "irq + softirq", "kernel threads: kcompactd", "the rest"]
    assert out["kernel threads: kworker"] == pytest.approx(0.6) and out["irq + softirq"] == pytest.approx(0.2)
    assert out["the rest"] == pytest.approx(5.0 - 4.0 - (0.6 + 0.2 + 0.0025 + 0.1))
    assert cph.unaccounted({}, after, cuts=4, host_busy_s=5.0, accounted_s=4.0) == {}
    assert cph.unaccounted(before, after, cuts=0, host_busy_s=5.0, accounted_s=4.0) == {}


def test_kernel_cpu_reads_this_hosts_interrupts_and_kernel_thread_families():
    out = cph.kernel_cpu()
    assert "irq + softirq" in out and all(v >= 0 for v in out.values())
    assert all(name == "irq + softirq" or (name.startswith("kernel threads: ") and "/" not in name) for name in out)
