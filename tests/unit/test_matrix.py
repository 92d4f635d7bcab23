"""The support matrix without a GPU: cells judged from stored trial rows, the grid, merging and comparing
matrices, the certificate's use of them, the probes' plan, and recorded references."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from cutbench.errors import InvalidArgument, hung_reason
from cutbench.harness.matrix import checker as cells
from cutbench.harness.matrix import generator as plan
from cutbench.harness.model.certificate import Evidence, Position, certify
from cutbench.harness.model.trial import TrialRecord
from cutbench.harness.checker import oracle
from cutbench.harness.matrix import reports as render
from cutbench.harness.hunt.store import deviation_rows
from cutbench.workloads import api


def trial(**kw: Any) -> dict[str, Any]:
    """A trials.parquet row of a matrix trial: completed, valid, one restore after kill, unless told otherwise."""
    row = {"trial_id": "t0001", "variant": "device_memory_1B", "backend": "cuda+criu", "fault": "kill",
           "status": "completed", "outcome": "valid", "findings": "[]", "error": "", "failed_stage": "",
           "restores": 1, "harness_action": "", "measures": ""}
    row.update(kw)
    return row


def finding(kind: str, op: int | None = 3, detail: str = "x") -> str:
    return json.dumps([{"kind": kind, "op": op, "detail": detail}])


@pytest.mark.parametrize("row, cell, says", [
    (trial(), "identical", ""),
    (trial(fault="none", restores=0), "identical", ""),
    (trial(status="refused", outcome="refused", failed_stage="cuda_lock",
           error="cuCheckpointProcessLock(pid 9) -> CUDA_ERROR_NOT_READY (process left RUNNING)"),
     "refused", "cuda_lock: cuCheckpointProcessLock"),
    # A refusal the harness had to repair is not clean: the user running the tool alone gets a locked process.
    (trial(status="refused", outcome="refused", failed_stage="cuda_checkpoint", error="NOT_SUPPORTED",
           harness_action="unlock pid 9, which the tool left LOCKED (now running)"),
     "failed", "the harness had to unlock pid 9"),
    (trial(status="lost", outcome="invalid", failed_stage="criu_restore", error="criu restore exit 1: Can't fork",
           findings=finding("process_lost")), "failed", "criu_restore: criu restore exit 1"),
    (trial(status="deadlock", outcome="invalid", error="no progress for 60s", findings=finding("deadlock")),
     "hung", "no progress"),
    (trial(status="lost", outcome="invalid", failed_stage="cuda_restore", error=hung_reason("the cuda_restore call", 60),
           findings=finding("process_lost")), "hung", "did not return within 60 s"),
    (trial(outcome="invalid", findings=finding("mixed_epoch", 4, "payload 1a… ≠ reference 2b…")),
     "wrong", "mixed_epoch op 4"),
    (trial(outcome="invalid", findings=finding("pointer_changed", None, "buf: 0x10 → 0x20")), "wrong", "pointer_changed"),
    (trial(status="unknown", outcome="unknown", error="harness: KeyError"), "unknown", "harness: KeyError"),
    # The harness's own failure stays unknown even when its words carry a tool's time-out text.
    (trial(status="unknown", outcome="unknown", error=hung_reason("criu restore", 60)), "unknown", "did not return"),
    # A probe whose situation never arose (its filler too late) is not counted, whatever the tool did.
    (trial(measures=json.dumps({"filler_mib": 0.0, "precondition_met": 0.0})), "not_measured", "precondition did not hold"),
])
def test_a_trial_becomes_the_cell_that_says_what_the_tool_did(row, cell, says):
    got, detail = cells.cell_of(row)
    assert got == cell
    assert says in detail


GRID = {"rows": [{"name": "device_memory_1B", "feature": "device_memory", "description": "1 byte", "probe": "probe_memory",
                  "array": "cupy", "cut": "2/launch", "params": {"size_bytes": 1}, "restore_target": "same",
                  "exclusive_gpu": False},
                 {"name": "managed_memory_prefetch", "feature": "managed_memory", "description": "managed",
                  "probe": "probe_managed", "array": "cupy", "cut": "2/launch", "params": {}, "restore_target": "same",
                  "exclusive_gpu": False}],
        "tools": ["cuda", "cuda+criu"], "faults": ["none", "kill"]}


def meta(driver: str = "580.159.04", run_dir: str = "/r/a") -> dict[str, Any]:
    return {"run_dir": run_dir, "matrix": GRID,
            "environment": {"kernel": "6.18", "criu": {"version": "4.2.1"},
                            "gpu": {"gpus": [{"name": "NVIDIA H200"}], "driver_version": driver, "cuda_driver_version": "13.0"}},
            "skipped_arms": [{"arm": "device_memory_1B cuda/idempotent/kill", "reason": "backend 'cuda' does not support fault 'kill'"},
                             {"arm": "managed_memory_prefetch cuda/idempotent/kill", "reason": "backend 'cuda' does not support fault 'kill'"}]}


def grid_trials() -> pd.DataFrame:
    return pd.DataFrame([
        trial(trial_id="t0001", variant="device_memory_1B", backend="cuda", fault="none", restores=0),
        trial(trial_id="t0002", variant="device_memory_1B", backend="cuda+criu", fault="none", restores=0),
        trial(trial_id="t0003", variant="device_memory_1B", backend="cuda+criu", fault="kill"),
        trial(trial_id="t0004", variant="managed_memory_prefetch", backend="cuda", fault="none", status="refused",
              outcome="refused", failed_stage="cuda_checkpoint", error="CUDA_ERROR_NOT_SUPPORTED"),
        trial(trial_id="t0005", variant="managed_memory_prefetch", backend="cuda+criu", fault="kill", outcome="invalid",
              findings=finding("mixed_epoch")),
    ])


def test_the_matrix_has_every_grid_point_with_the_reason_for_those_not_run():
    table = cells.build(grid_trials(), meta())
    assert len(table) == 2 * 2 * 2
    by = {(r["row"], r["tool"], r["fault"]): r for r in table.to_dict("records")}
    assert by[("device_memory_1B", "cuda+criu", "kill")]["cell"] == "identical"
    assert by[("device_memory_1B", "cuda", "kill")]["cell"] == "not_measured"
    assert "does not support fault 'kill'" in by[("device_memory_1B", "cuda", "kill")]["detail"]
    # Planned but no trial and no recorded reason: still a cell, saying so.
    assert by[("managed_memory_prefetch", "cuda+criu", "none")]["detail"] == "no trial was run"
    assert by[("managed_memory_prefetch", "cuda+criu", "kill")]["cell"] == "wrong"
    assert set(table["driver"]) == {"580.159.04"} and set(table["gpu"]) == {"NVIDIA H200"}
    with pytest.raises(ValueError, match="not a matrix run"):
        cells.build(grid_trials(), {"run_dir": "/r/x"})


def test_the_markdown_counts_and_shouts_the_silently_wrong_cells():
    text = render.markdown(cells.build(grid_trials(), meta()))
    assert "**restored silently wrong: 1**" in text
    assert "**WRONG**" in text and "| `managed_memory_prefetch` | managed_memory |" in text
    assert "cutbench replay /r/a/trials/t0005.json" in text
    assert "## Not measured here" in text
    page = render.html_section(cells.build(grid_trials(), meta()))
    assert 'id="support-matrix-table"' in page and "cell-wrong" in page and "t0005.json" in page


def test_the_hunts_deviations_become_one_row_per_deviation_per_tool_after_the_grid(tmp_path):
    """The reference hunts (results/reference/findings): five deviations of three GPU tools, the same deviation of
    the utility found by two hunts counted once (the shorter sequence), each with its driver, promise and
    reproducer; and docker's three (podman's hunt found none)."""
    from tests.conftest import REPO

    rows = deviation_rows([REPO / "results" / "reference" / "findings"])
    assert sorted((r["tool"], r["steps"]) for r in rows) == [("criu-cuda-plugin", 2), ("cuda", 4), ("cuda", 4),
                                                              ("cuda-checkpoint", 4), ("cuda-checkpoint", 5),
                                                              ("docker", 3), ("docker", 3), ("docker", 3)]
    gpu = [r for r in rows if r["tool"] != "docker"]
    assert {r["driver"] for r in gpu} == {"580.159.04"} and {r["shown"] for r in rows} == {"3 of 3"}
    assert sum("moby/moby#37344" in r["public_report"] or "containerd#10166" in r["public_report"] for r in rows) == 2
    assert all((REPO / "results" / "reference" / "findings" / r["reproducer"]).is_file() for r in rows)
    assert sum("cuda-checkpoint#44" in r["public_report"] for r in rows) == 2
    plugin = next(r for r in rows if r["tool"] == "criu-cuda-plugin")
    assert plugin["observed"] == "answered ok (left it checkpointed)"
    table, deviations = cells.build(grid_trials(), meta()), pd.DataFrame(rows)
    text = render.markdown(table, deviations=deviations)
    assert text.index("## Lifecycle deviations") > text.index("## Not measured here")
    assert "| `cuda` | 580.159.04 | lock(timeout_ms=5000) → checkpoint → restore_filled → restore |" in text
    assert "Collect mappings (pid: 1283) failed with -1 \\| Dumping FAILED." in text  # a cell's own bar, escaped
    page = render.html_section(table, deviations)
    assert page.count("<tr><td><code>cuda") == 4 and 'id="lifecycle-deviations-table"' in page
    assert "## Lifecycle deviations" not in render.markdown(table)
    with pytest.raises(InvalidArgument, match="no hunt.json in it or in its sub-folders"):
        deviation_rows([tmp_path])
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "hunt.json").write_text("{")
    with pytest.raises(InvalidArgument, match=r"h/hunt.json: damaged"):
        deviation_rows([tmp_path])


def test_matrices_of_two_machines_are_not_merged_and_compare_says_what_changed():
    a = cells.build(grid_trials(), meta())
    b_trials = grid_trials()
    b_trials.loc[b_trials["trial_id"] == "t0005", ["outcome", "findings"]] = ["valid", "[]"]
    b = cells.build(b_trials, meta(driver="610.10", run_dir="/r/b"))
    with pytest.raises(ValueError, match=r"different machines \(driver: '580.159.04' in /r/a, '610.10' in /r/b"):
        cells.merge([a, b])
    changed, env = cells.compare(a, b)
    assert changed[["row", "tool", "fault", "cell_a", "cell_b"]].values.tolist() == [
        ["managed_memory_prefetch", "cuda+criu", "kill", "wrong", "identical"]]
    assert env["driver"] == ("580.159.04", "610.10")
    assert "1 cells changed" in render.comparison(changed, env, "A", "B")


def test_merging_runs_of_one_machine_fills_what_an_earlier_run_did_not_measure():
    first = cells.build(grid_trials().iloc[:3], meta())
    second = cells.build(grid_trials().iloc[3:], meta(run_dir="/r/c"))
    merged = cells.merge([first, second])
    assert len(merged) == 8
    by = {(r["row"], r["tool"], r["fault"]): r for r in merged.to_dict("records")}
    assert by[("managed_memory_prefetch", "cuda", "none")]["cell"] == "refused"
    assert by[("device_memory_1B", "cuda+criu", "kill")]["cell"] == "identical"


def test_the_certificate_asks_the_matrix_about_every_declared_feature():
    table = cells.build(grid_trials(), meta())
    support = cells.support_for(table, "cuda+criu", "580.159.04")
    assert support["kill"]["device_memory"][0] == "identical"
    assert support["kill"]["managed_memory"][0] == "wrong"

    def cert(features: tuple[str, ...], by_feature: dict[str, tuple[str, str]]):
        ev = Evidence(checkpoint=0, phases=("admit", "launch"), workload_domains=("cpu", "cuda"), covers=("cpu", "cuda"),
                      receiver_mode="idempotent", positions={"cuda_lock": Position(2, "launch"), "criu_freeze": Position(2, "launch")},
                      features=features, support=by_feature)
        return certify(ev)

    ok = cert(("device_memory",), support["kill"])
    assert ok.eligible and ok.features["device_memory"].startswith("identical (row device_memory_1B")
    bad = cert(("device_memory", "managed_memory"), support["kill"])
    assert not bad.eligible and "feature:managed_memory" in bad.unknown
    assert "feature managed_memory: the support matrix says wrong (row managed_memory_prefetch, cuda+criu · kill" in bad.reason
    unmeasured = cert(("cuda_graphs",), {})
    assert not unmeasured.eligible and "no support matrix was given" in unmeasured.reason
    # A matrix of another driver vouches for nothing on this one.
    elsewhere = cells.support_for(table, "cuda+criu", "610.10")
    assert elsewhere["kill"]["device_memory"] == (
        "not_measured", "the support matrix was measured on driver 580.159.04; this machine runs 610.10")
    assert not cert(("device_memory",), elsewhere["kill"]).eligible
    # A workload that declares no feature is decided as before.
    assert cert((), {}).eligible


def test_the_plan_names_unknown_probes_and_tools_and_puts_exclusive_rows_last():
    with pytest.raises(InvalidArgument, match="--probe 'no_such': no probe or matrix row of that name; known: .*device_memory_1B"):
        plan.select_rows(["no_such"])
    with pytest.raises(InvalidArgument, match="--tool 'gdb': not a registered backend"):
        plan.check_tools(["gdb"])
    with pytest.raises(InvalidArgument, match="--fault 'leave_running'"):
        plan.check_faults(["leave_running"])
    rows = plan.select_rows(["probe_restore_oom", "device_memory_1B", "probe_memory"])
    assert [r[2].name for r in rows][:2] == ["restore_when_gpu_memory_taken", "device_memory_1B"]
    grid = plan.grid(rows, ("criu",), ("kill",))
    assert grid["rows"][-1]["name"] == "restore_when_gpu_memory_taken" and grid["rows"][-1]["exclusive_gpu"]
    scen = plan.scenario(grid, jobs=2)
    assert [v.variant for v in scen.variants] == [r["name"] for r in grid["rows"]]
    one = scen.variants[0]
    assert one.modes == (cells.RECEIVER_MODE,) and one.plan_ops == (2, 2) and one.plan_phases == ("launch",)
    assert "app" not in plan.default_tools() and "restart" not in plan.default_tools()


def test_every_probe_row_is_valid_and_every_feature_is_measured_by_a_row():
    rows = plan.probe_rows()
    names = [r[2].name for r in rows]
    assert len(names) == len(set(names)) >= 30
    for probe, cls, row in rows:
        params = api.resolve_params(cls, row.params)  # the row's parameters are the probe's own, in range
        assert row.array in api.declared_arrays(cls), (row.name, row.array)
        assert row.feature in api.declared_features(cls, params, row.array), (row.name, row.feature)
        assert row.cut_phase in cls.phases and 1 <= row.cut_op < params["ops"]


def recorded(payloads: dict[int, str], final: str = "c3", checksums: dict[int, str] | None = None) -> api.RecordedReference:
    effects = pd.DataFrame({"op_id": list(payloads), "digest": list(payloads.values()), "decision": ["applied"] * len(payloads)})
    report = {"host_op": max(payloads), "checksum": final, "checksums": {str(k): v for k, v in (checksums or {}).items()}}
    return api.RecordedReference.from_run("probe_x", {"ops": 3}, "cupy", effects, report, {"gpu": "NVIDIA H200"})


def test_a_recorded_reference_answers_as_the_uninterrupted_run_did_and_refuses_what_it_is_not():
    ref = recorded({1: "p1", 2: "p2", 3: "p3"}, checksums={1: "c1", 2: "c2"})
    assert [ref.payload(op) for op in (1, 2, 3)] == ["p1", "p2", "p3"]
    assert ref.checksum(3) == "c3" and ref.checksum(1) == "c1"
    with pytest.raises(KeyError, match="holds no effect for op 9"):
        ref.payload(9)
    back = api.RecordedReference.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert back == ref
    assert recorded({1: "p1", 2: "p2", 3: "p3"}).first_difference(recorded({1: "p1", 2: "pX", 3: "p3"})).startswith("op 2: effect payload")
    ref.check("probe_x", {"ops": 3}, "cupy", {"gpu": "NVIDIA H200"})
    with pytest.raises(api.ReferenceMismatch, match="other parameters \\(ops=3, not 4\\)"):
        ref.check("probe_x", {"ops": 4}, "cupy")
    with pytest.raises(api.ReferenceMismatch, match="another machine \\(gpu 'NVIDIA H200', here 'NVIDIA A100'\\)"):
        ref.check("probe_x", {"ops": 3}, "cupy", {"gpu": "NVIDIA A100"})
    with pytest.raises(api.WorkloadError, match="no applied effect for op\\(s\\) \\[2\\]"):
        api.RecordedReference.from_run("probe_x", {}, "cupy", pd.DataFrame({"op_id": [1, 3], "digest": ["a", "b"],
                                                                            "decision": ["applied", "applied"]}),
                                       {"host_op": 3, "checksum": "c"})
    with pytest.raises(api.WorkloadError, match="bad or missing field"):
        api.RecordedReference.from_dict({"workload": "x"})


def test_the_oracle_judges_a_probe_by_its_recording():
    ref = recorded({1: "p1", 2: "p2", 3: "p3"})
    effects = pd.DataFrame({"op_id": [1, 2, 3], "digest": ["p1", "p2", "pZ"], "decision": ["applied"] * 3,
                            "attempt": [0] * 3, "epoch": [0, 0, 1]})
    record = TrialRecord(status="completed", restores=1, cut_outcomes=[{"status": "restored"}],
                         report={"host_op": 3, "checksum": "c3", "pointers_initial": {"b": 16}, "pointers_final": {"b": 16}})
    verdict = oracle.judge(record, effects, ref)
    assert verdict.outcome == "invalid" and [f.kind for f in verdict.findings] == ["mixed_epoch"]
    assert oracle.judge(record, effects.assign(digest=["p1", "p2", "p3"]), ref).outcome == "valid"
    # A trial whose host op the recording does not hold is unknown, never valid.
    short = TrialRecord(status="completed", restores=1, cut_outcomes=[{"status": "restored"}], report={"host_op": 2, "checksum": "c2"})
    assert oracle.judge(short, effects.iloc[:2].assign(digest=["p1", "p2"]), ref).outcome == "unknown"


def test_a_restore_failure_on_a_file_of_the_trial_is_the_harness_s_and_others_stay_the_tool_s(tmp_path):
    from cutbench.errors import HarnessFault
    from cutbench.harness.nemesis.backends.criu import restore_failure

    class Control:
        path = tmp_path / "t0001" / "control"

    ctx = type("Ctx", (), {"control": Control()})()
    rel = str(tmp_path / "t0001" / "report.json.77.tmp").lstrip("/")
    ours = restore_failure("criu_restore", f"criu restore exit 1: 9: Error (criu/files-reg.c:2353): Can't open file {rel} "
                                           "on restore: No such file or directory", ctx)
    assert isinstance(ours, HarnessFault) and f"/{rel}" in ours.reason
    theirs = restore_failure("criu_restore", "criu restore exit 1: Error (criu/sk-inet.c): Can't bind inet socket", ctx)
    assert type(theirs).__name__ == "StageFailed"
    mount = restore_failure("podman_restore", f"podman restore exit 125: mount /{rel.rsplit('/', 1)[0]} failed: "
                                              "invalid argument", ctx)
    assert type(mount).__name__ == "StageFailed"  # a mount of the trial directory is no file the image held
