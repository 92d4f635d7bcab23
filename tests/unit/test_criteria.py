"""The six-criteria table, computed from committed reference runs (pure: no GPU, no CRIU)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.reports import criteria as crit
from cutbench.harness.store.rundir import RunDir
from tests.conftest import REPO

TOOLS = REPO / "results" / "reference" / "tools"


def stored(*paths: Path) -> list[crit.StoredRun]:
    runs = [RunDir.open(p) for p in paths]
    return [crit.StoredRun(r.table("trials"), r.table("timeline"), r.meta()) for r in runs]


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return crit.criteria(stored(TOOLS / "cuda+criu", TOOLS / "in-place-and-baselines", TOOLS / "criu-cuda-plugin"))


def test_every_backend_gets_a_row_for_each_of_the_six_criteria(table):
    for backend, rows in table.groupby("backend"):
        assert set(rows["criterion"]) == set(crit.CRITERIA), backend
    assert list(table.columns) == list(crit.COLUMNS)


def test_transparency_and_domains_come_from_the_backends_declarations(table):
    get = table.set_index(["backend", "quantity"])
    assert "save_state" in get.loc[("app", "changes to the application"), "text"]
    assert get.loc[("cuda+criu", "changes to the application"), "text"] == "none"
    assert get.loc[("cuda+criu", "state domains held"), "text"] == "cpu, cuda, ipc"


def test_consistency_separates_continuing_restores_from_restarts(table):
    get = table.set_index(["backend", "quantity"])
    # A kill restore of the counter continues and gives the uninterrupted run's output.
    assert get.loc[("cuda+criu", "output continuity, fault kill"), "value"] == 100.0
    # The restart baseline never continues: every restored trial started anew.
    assert get.loc[("restart", "output continuity"), "value"] == 0.0
    assert get.loc[("restart", "restores that started anew"), "value"] == get.loc[("restart", "restores that started anew"), "n"]


def test_speed_and_correctness_have_intervals_around_the_value(table):
    numeric = table[table["value"].notna() & table["low"].notna()]
    assert len(numeric) >= 10
    assert ((numeric["low"] <= numeric["value"] + 1e-9) & (numeric["value"] <= numeric["high"] + 1e-9)).all()
    speed = table[(table["criterion"] == "speed") & (table["backend"] == "cuda+criu")].set_index("quantity")
    assert 0.1 < speed.loc["restore", "value"] < 5 and 0.1 < speed.loc["checkpoint", "value"] < 5


def test_restore_against_cold_start_needs_a_complete_cold_start(table):
    # These runs predate the restart's catch-up stage: no ratio is made up from the spawn alone.
    row = table[(table["backend"] == "cuda+criu") & (table["quantity"] == "restore / native cold start")]
    assert row["value"].isna().all() and "cold start" in row["method"].iloc[0]


def test_restore_time_per_gib_from_runs_at_several_sizes():
    runs = sorted((REPO / "results" / "reference" / "gpu-speed" / "runs").iterdir())
    table = crit.criteria(stored(*runs))
    row = table[table["quantity"].str.startswith("restore per GiB")]
    assert len(row) == 1 and 0.3 < row["value"].iloc[0] < 2.0, row
    assert "R²" in row["method"].iloc[0]


def test_overhead_compares_periodic_cuts_with_the_native_run():
    trials = pd.DataFrame({
        "trial_id": ["t1", "t2", "t3", "t4"], "backend": ["criu"] * 4, "workload": ["counter"] * 4,
        "variant": ["native", "native", "every-10", "every-10"], "n_cuts": [0, 0, 4, 4], "host_op": [40] * 4,
        "fault": ["none"] * 4, "restores": [0] * 4, "outcome": ["valid"] * 4, "status": ["completed"] * 4,
        "receiver_mode": ["idempotent"] * 4, "arm": ["criu/idempotent/none"] * 4, "cut_op": [None, None, 1, 1],
        "cut_phase": [None, None, "commit", "commit"], "image_bytes": [None, None, 1e6, 1e6],
        **{k: [0] * 4 for k in crit.OUTPUT_FINDINGS + crit.SILENT_FINDINGS}})
    timeline = pd.DataFrame({"trial_id": ["t1", "t2", "t3", "t4"], "cut_index": [0] * 4, "stage": ["run_to_end"] * 4,
                             "t_start": [0.0] * 4, "t_end": [1.0, 1.0, 2.0, 2.0], "duration_s": [1.0, 1.0, 2.0, 2.0],
                             "result": ["ok"] * 4})
    meta = {"scenario": {"plan_source": "exhaustive", "variants": [
        {"variant": "native", "plan_source": "periodic"}, {"variant": "every-10", "plan_source": "periodic"}]}}
    table = crit.criteria([crit.StoredRun(trials, timeline, meta)])
    row = table[table["criterion"] == "overhead"]
    assert len(row) == 1 and row["value"].iloc[0] == pytest.approx(50.0), row  # 20 ops/s against 40 ops/s
    assert "a cut every 0.25 s" in row["quantity"].iloc[0]


def test_overhead_is_steady_state_from_the_receiver_when_effects_are_stored():
    """Start-up is left out: op 1's first arrival to the last op's, whatever the trial's wall time."""
    ids = ["n1", "n2", "p1", "p2"]
    trials = pd.DataFrame({
        "trial_id": ids, "backend": ["criu"] * 4, "workload": ["counter"] * 4,
        "variant": ["native", "native", "soak", "soak"], "n_cuts": [0, 0, 4, 4], "host_op": [41] * 4,
        "fault": ["kill"] * 4, "restores": [0, 0, 4, 4], "outcome": ["valid"] * 4, "status": ["completed"] * 4,
        "receiver_mode": ["idempotent"] * 4, "arm": ["criu/idempotent/kill"] * 4, "cut_op": [None, None, 10, 10],
        "cut_phase": [None, None, "commit", "commit"], "image_bytes": [None, None, 1e6, 1e6],
        **{k: [0] * 4 for k in crit.OUTPUT_FINDINGS + crit.SILENT_FINDINGS}})
    # Every trial spends 5 s starting; the native runs do 40 ops in 1 s, the soak in 4 s (a restored op 10 sent twice).
    timeline = pd.DataFrame({"trial_id": ids, "cut_index": [0] * 4, "stage": ["run_to_end"] * 4, "t_start": [0.0] * 4,
                             "t_end": [6.0, 6.0, 9.0, 9.0], "duration_s": [6.0, 6.0, 9.0, 9.0], "result": ["ok"] * 4})
    rows = [{"trial_id": t, "op_id": op, "received_at": 100 + 5 + (op - 1) * (0.025 if t.startswith("n") else 0.1)}
            for t in ids for op in range(1, 42)]
    rows.append({"trial_id": "p1", "op_id": 10, "received_at": 200.0})  # a later re-send is not op 10's first arrival
    effects = pd.DataFrame(rows)
    params = {"ops": 41}
    meta = {"scenario": {"plan_source": "exhaustive", "variants": [
        {"variant": "native", "plan_source": "periodic", "params": params},
        {"variant": "soak", "plan_source": "periodic", "params": params}]}}
    table = crit.criteria([crit.StoredRun(trials, timeline, meta, effects)])
    row = table[table["criterion"] == "overhead"]
    assert len(row) == 1 and row["value"].iloc[0] == pytest.approx(75.0), row  # 10 ops/s against 40 ops/s
    assert "first arrival" in row["method"].iloc[0]
    # A native run of other parameters is no baseline.
    other = {"scenario": {**meta["scenario"], "variants": [{**meta["scenario"]["variants"][0], "params": {"ops": 9}},
                                                            meta["scenario"]["variants"][1]]}}
    row = crit.criteria([crit.StoredRun(trials, timeline, other, effects)])
    assert row[row["criterion"] == "overhead"]["value"].isna().all()


def test_the_declarations_are_read_from_what_the_run_stored_before_the_registry():
    """A run's ``run.toml`` keeps what each of its backends declared; the criteria read that, and ask the
    registry only for a backend no run recorded (runs stored before the record)."""
    [run] = stored(TOOLS / "cuda+criu")
    mine = {"stages": ["criu_dump", "criu_restore"], "covers": ["cpu"], "workload_changes": "a flag",
            "drives_cuda": False}
    recorded = crit.StoredRun(run.trials, run.timeline, {**run.meta, "backends": {"cuda+criu": mine}})
    decl = crit.declared([recorded], ["cuda+criu", "restart"])
    assert decl["cuda+criu"] == mine
    assert "restart_spawn" in decl["restart"]["stages"]  # no run recorded it: the registry's declaration
    get = crit.criteria([recorded]).set_index(["backend", "quantity"])
    assert get.loc[("cuda+criu", "changes to the application"), "text"] == "a flag"
    assert get.loc[("cuda+criu", "state domains held"), "text"] == "cpu"
