"""Semantic adapters through real CRIU (scenarios/adapters.toml): a serving runtime whose queue offset and
reply log live outside the process, with its adapters off and on, certified; adapters that misbehave."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd

from tests.conftest import REPO


def test_adapters_make_external_state_eligible_and_misbehaving_ones_are_refused(criu, results_root):
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "adapters.toml"),
                           "--out", str(results_root), "--json"], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = (results_root / "latest").resolve()
    trials = pd.read_parquet(run_dir / "trials.parquet")
    print(trials[["variant", "plan", "outcome", "failed_stage", "cert_eligible", "error"]].to_string())
    assert (trials["outcome"] != "unknown").all()
    by = {name: group for name, group in trials.groupby("variant")}

    # Off: the offset and the log are in no image; every cut is ineligible, and the oracle agrees.
    off = by["adapters-off"]
    assert len(off) == 6 and (off["cert_eligible"] == False).all() and (off["outcome"] == "invalid").all()  # noqa: E712
    assert off["cert_reason"].str.contains("no checkpoint holds disk").all()

    # On: both domains join every cut; a kill at the cut is eligible and valid.
    on = by["adapters-on"]
    kills = on[on["fault"] == "kill"]
    assert len(kills) == 3 and (kills["cert_eligible"] == True).all() and (kills["outcome"] == "valid").all()  # noqa: E712
    # After leave_running the restored process's log classified the effects in flight: sound either way, and
    # an ineligible one names the effect sent without an acknowledgement (it is the duplicate the oracle finds).
    assert (trials["certificate_unsound"] == 0).all()
    _sound_after_leave_running(on)
    record = json.loads((run_dir / "trials" / f"{kills['trial_id'].iloc[0]}.json").read_text())["record"]
    cert, evidence = record["certificates"][0], record["cut_evidence"][0]
    assert cert["domains"]["disk"] == "offset(3)@3/launch" and cert["domains"]["request_log"].startswith("committed_through(")
    assert set(evidence["adapters"]) == {"disk", "request_log"} and record["joined_domains"] == ["disk", "request_log"]
    stages = pd.read_parquet(run_dir / "timeline.parquet")
    one = stages[stages["trial_id"] == kills["trial_id"].iloc[0]]["stage"].tolist()
    assert one.index("prepare") < one.index("criu_dump") < one.index("restored")

    # The inference worker: the same two domains, the same difference (kill: eligible and valid only with them).
    inference_off, inference_on = by["inference-adapters-off"], by["inference-adapters-on"]
    assert (inference_off["cert_eligible"] == False).all() and (inference_off["outcome"] == "invalid").all()  # noqa: E712
    inference_kill = inference_on[inference_on["fault"] == "kill"]
    assert len(inference_kill) == 1 and inference_kill["cert_eligible"].all() and (inference_kill["outcome"] == "valid").all()

    # Training: the data cursor joins the cut; without it a rollback trains on skipped batches.
    assert (by["training-adapters-off"]["cert_eligible"] == False).all()  # noqa: E712
    train_on = by["training-adapters-on"]
    train_kill = train_on[train_on["fault"] == "kill"]
    assert len(train_on) == 2 and len(train_kill) == 1 and train_kill["cert_eligible"].all() and (train_kill["outcome"] == "valid").all()
    # leave_running: the original incarnation ran on and may have sent a step's metrics that its log had not yet
    # recorded when it was stopped; whether it did is the host's timing, and the certificate says which.
    _sound_after_leave_running(train_on)

    # Ranks: the pause joins every rank at rank 0's collective (rank_set in the certificate); a late rank makes it
    # fail at prepare, naming the rank, and the job runs to its end; a one-rank cut stays ineligible.
    pause = by["ranks-pause"]
    assert (pause["cert_eligible"] == True).all() and (pause["outcome"] == "valid").all()  # noqa: E712
    record = json.loads((run_dir / "trials" / f"{pause['trial_id'].iloc[0]}.json").read_text())["record"]
    assert record["certificates"][0]["domains"]["rank_set"] == "ranks {0,1,2} at op 3@3/allreduce"
    slow = by["ranks-slow-rank"].iloc[0]
    assert slow["outcome"] == "refused" and slow["failed_stage"] == "prepare"
    assert "rank_set: not ready: rank 2 at op 2, not at op 3's boundary" in slow["error"] and slow["host_op"] == 6
    one = by["ranks-one-rank"].iloc[0]
    assert one["cert_eligible"] == False and "no checkpoint holds peer" in one["cert_reason"]  # noqa: E712

    # Enforce: nothing invalid gets through; a declined restore is decided after the classification.
    enforce = by["adapters-on-enforce"]
    assert not (enforce["outcome"] == "invalid").any()
    assert set(enforce[enforce["outcome"] == "refused"]["failed_stage"]) <= {"certify_restore"}

    # Misbehaving adapters: refused at prepare in their own words, nothing restored, the workload ran on.
    words = {"adapter-late": "no answer to prepare within 1s",
             "adapter-garbage": "request_log: prepare returned 42",
             "adapter-raises": "request_log: prepare raised RuntimeError: request log unavailable at epoch 1"}
    for variant, text in words.items():
        row = by[variant].iloc[0]
        assert row["outcome"] == "refused" and row["failed_stage"] == "prepare", row.to_dict()
        assert text in row["error"] and row["restores"] == 0 and row["host_op"] == 8
        assert "abort" in stages[stages["trial_id"] == row["trial_id"]]["stage"].tolist()


def _sound_after_leave_running(trials: pd.DataFrame) -> None:
    """Every eligible trial is valid; an ineligible one is ineligible because of an effect its original incarnation
    sent without an acknowledgement, named in the reason, and that duplicate is the oracle's only finding."""
    assert (trials[trials["cert_eligible"] == True]["outcome"] == "valid").all()  # noqa: E712
    for row in trials[trials["cert_eligible"] == False].itertuples():  # noqa: E712
        findings = json.loads(row.findings)
        assert {f["kind"] for f in findings} == {"duplicate"}, findings
        assert f"ops {findings[0]['op']} " in row.cert_reason


def test_the_adapter_pause_benchmark_reports_its_figures(criu, tmp_path):
    # The report's shape, at its smallest: the refusals themselves are the adapters scenario's (the test above).
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "adapter_pause.py"), "--trials", "1",
                           "--deadlines", "0.3", "--abort-phases", "publish", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "The pause prepare adds" in proc.stdout and "Time to abort" in proc.stdout
    figures = json.loads((tmp_path / "adapter_pause.json").read_text())
    assert figures["pause_on"]["prepare"]["n"] == 1 and figures["pause_off"]["prepare"]["n"] == 0
    assert [a["case"] for a in figures["abort"]] == ["late adapter", "slow rank"]
    for abort in figures["abort"]:
        assert abort["deadline_s"] == 0.3 and abort["refused_at_prepare"] == abort["trials"] == 1 and abort["n"] == 1
