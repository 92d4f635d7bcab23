"""``cutbench.open_run``: a stored run as DataFrames and values, read from a committed reference run.

The reference run (``results/reference/containers/quick``: 84 trials of
``quick.toml`` through criu, docker and podman) is read, never written; the
damaged-directory cases are in ``tests/criu/test_damaged_run.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import cutbench
from cutbench.errors import InvalidArgument
from cutbench.harness.store import archive
from tests.conftest import REPO

REFERENCE = REPO / "results" / "reference" / "containers" / "quick"


@pytest.fixture(scope="module")
def run() -> cutbench.api.Run:
    return cutbench.open_run(REFERENCE)


def test_the_run_s_tables_and_headline(run):
    assert run.run_id == json.loads(archive.read(REFERENCE / archive.ARCHIVE)["trials/t0001.json"])["run_id"]
    assert run.complete and run.scenario["name"] == "quick"
    assert len(run.trials) == 84 == len(run.trial_ids)
    assert set(run.trials["backend"]) == {"criu", "docker", "podman"}
    counts = run.trials["outcome"].value_counts().to_dict()
    assert run.counts == {k: counts.get(k, 0) for k in ("valid", "invalid", "refused", "unknown")}
    assert run.verdict.label == "invalid" and run.counts["invalid"] > 0
    assert {"stage", "t_start", "t_end"} <= set(run.timeline.columns) and {"op_id", "decision"} <= set(run.effects.columns)
    assert run.matrix.empty and "invalid" in repr(run)


def test_the_run_is_a_collection_of_its_trials_with_a_table_of_findings(run):
    assert len(run) == 84 and list(run) == run.trial_ids and "t0001" in run and "t9999" not in run
    assert run["t0001"] == run.trial("t0001")
    with pytest.raises(InvalidArgument, match="no trial 't9999'"):
        run["t9999"]
    assert all(isinstance(f, list) for f in run.trials["findings"])
    for column in ("startup", "measures"):  # absent from a run stored before them
        assert column not in run.trials or all(isinstance(v, dict) for v in run.trials[column])
    found = run.findings
    assert len(found) == int(run.trials["n_findings"].sum()) > 0
    assert list(found.columns[-3:]) == ["kind", "op", "detail"] and set(found["trial_id"]) <= set(run)
    first = run.trials[run.trials["n_findings"] > 0].iloc[0]
    assert found[found["trial_id"] == first["trial_id"]]["kind"].tolist() == [f["kind"] for f in first["findings"]]


def test_rates_per_arm_carry_wilson_bounds(run):
    rates = run.rates()
    assert list(rates["arm"]) == sorted(run.trials["arm"].unique())
    assert rates["trials"].sum() == 84
    assert ((rates["rate_low"] <= rates["invalid_rate"]) & (rates["invalid_rate"] <= rates["rate_high"])).all()
    by_fault = run.rates(["backend", "fault"])
    assert len(by_fault) == 3 * run.trials["fault"].nunique()


def test_one_trial_its_effects_and_its_timeline(run):
    bad = run.failing()
    assert (bad["outcome"] == "invalid").all() and len(bad) == run.counts["invalid"]
    tid = bad["trial_id"].iloc[0]
    stored = run.trial(tid)
    assert stored["spec"]["trial_id"] == tid and stored["verdict"]["outcome"] == "invalid"
    fx = run.effects_of(tid)
    assert len(fx) and (fx["trial_id"] == tid).all() and fx["arrival_seq"].is_monotonic_increasing
    duplicated = {f["op"] for f in stored["verdict"]["findings"] if f["kind"] == "duplicate"}
    assert duplicated and duplicated <= set(fx[fx["decision"] == "applied"].groupby("op_id").filter(lambda g: len(g) > 1)["op_id"])
    tl = run.timeline_of(tid)
    assert (tl["trial_id"] == tid).all() and tl["t_start"].is_monotonic_increasing


def test_a_trial_explained_in_plain_words(run):
    tid = run.failing()["trial_id"].iloc[0]
    words = run.explain(tid)
    assert "checkpoint was taken at op" in words and "twice or more" in words and "at_least_once" in words
    valid = run.trials.loc[run.trials["outcome"] == "valid", "trial_id"].iloc[0]
    assert run.explain(valid) == ""


def test_an_unknown_trial_is_an_error_naming_what_the_run_has(run):
    with pytest.raises(InvalidArgument, match=r"no trial 't9999'; it has 84 \(t0001"):
        run.trial("t9999")
    with pytest.raises(InvalidArgument, match="no trial"):
        run.effects_of("t9999")


def test_a_run_compared_with_itself_changes_no_plan(run):
    cmp = run.compare(REFERENCE)
    assert cmp.counts()["matched"] == 84 and cmp.counts()["same"] == 84 and cmp.regressions.empty


def test_verdicts_per_plan_name_each_plan_once_with_its_outcome_and_finding_kinds(run):
    verdicts = run.verdicts()
    assert len(verdicts) == len(run) and set(verdicts) == {(t.variant, t.arm, t.plan) for t in run.trials.itertuples()}
    invalid = [v for v in verdicts.values() if v[0] == "invalid"]
    assert len(invalid) == run.counts["invalid"] and all(kinds for _outcome, kinds in invalid)


def test_a_scenario_built_in_code_is_checked_as_its_file_would_be():
    import tomllib

    from cutbench.api import load_scenario

    path = REPO / "scenarios" / "quick.toml"
    data = tomllib.loads(path.read_text())
    assert load_scenario(data, ["plan.trials=2"]).to_dict() == load_scenario(path, ["plan.trials=2"]).to_dict() | {
        "source_path": ""}
    data["plan"]["cut_mode"] = "sideways"
    with pytest.raises(InvalidArgument, match="plan.cut_mode"):
        load_scenario(data)
    with pytest.raises(InvalidArgument, match="include: a scenario given as a mapping cannot include"):
        load_scenario({"include": "quick.toml", "name": "x"})


def test_reanalysis_gives_the_stored_verdicts(run):
    result = run.reanalyze()
    assert len(result.rows) == 84 and result.differences == []


def test_not_a_run_directory_is_named(tmp_path):
    with pytest.raises(InvalidArgument, match="not a cutbench run directory"):
        cutbench.open_run(tmp_path)


def test_a_trial_file_missing_from_a_copy_is_named(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(REFERENCE, copy)
    members = archive.read(copy / archive.ARCHIVE)  # the reference run is packed (cutbench pack)
    del members["trials/t0005.json"]
    archive.write(copy / archive.ARCHIVE, members)
    with pytest.raises(InvalidArgument, match="holds 83 trial files, run.toml counts 84"):
        cutbench.open_run(copy)


def test_importing_cutbench_loads_none_of_the_rooms():
    """``cutbench.open_run`` is reached through the package's lazy door: ``import cutbench`` stays light."""
    code = ("import sys, cutbench; assert 'pandas' not in sys.modules and 'cutbench.api' not in sys.modules; "
            "f = cutbench.open_run; import cutbench.api as a; assert f is a.open_run and cutbench.Run is a.Run")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_first_ten_minutes_example_reads_the_reference_run():
    out = subprocess.run([sys.executable, str(REPO / "examples" / "analysis" / "first_ten_minutes.py"), str(REFERENCE)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "84 trials, complete" in out.stdout and "duplicate op 3: applied 2 times" in out.stdout
    assert "median seconds per stage" in out.stdout


def test_the_oracle_and_the_observer_work_without_a_run(tmp_path):
    """``cutbench.api.judge`` judges effects recorded anywhere against a reference; ``cutbench.api.Observer`` sees
    a program's effects as a run's trial would, from its scenario's own parameters."""
    import pandas as pd

    from cutbench.api import Observer, judge, load_scenario

    class Reference:  # what a workload's reference gives: the payload and checksum after each op
        def payload(self, op: int) -> str:
            return f"p{op}"

        def checksum(self, op: int) -> str:
            return f"c{op}"

    effects = pd.DataFrame({"op_id": [1, 2, 3, 2], "digest": ["p1", "p2", "p3", "p2"], "epoch": [0, 0, 0, 1],
                            "attempt": [1, 1, 1, 2], "decision": ["applied"] * 4})
    record = {"status": "completed", "error": "", "report": {"host_op": 3, "checksum": "c3"}, "marker_op": 3,
              "restores": 1, "cut_outcomes": [{"status": "restored", "stage": "", "error": ""}], "progress_op": 3,
              "workload_domains": ["cpu", "receiver"], "covered_domains": ["cpu"]}
    verdict = judge(record, effects, Reference())
    assert verdict.outcome == "invalid" and [f.kind for f in verdict.findings] == ["duplicate"]
    assert judge(record, effects.iloc[:3], Reference()).outcome == "valid"

    params = load_scenario(REPO / "examples" / "programs" / "ticker" / "ticker.toml").params
    for f in params["files"]:
        shutil.copy2(f, tmp_path)
    observer = Observer(params, tmp_path)
    child = observer.start(["python3", "ticker.py", "--steps", "5", "--interval-ms", "0", "--save-every", "5"])
    assert child.wait(60) == 0
    observer.close()
    assert [s.key for s in observer.seen] == [f"stdout#{i}" for i in range(1, 6)]
