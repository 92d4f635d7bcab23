"""Recovery-cut certificates and effect fences through real CRIU.

The must-shows of the certificate work on the CPU: a fenced receiver's
control arm is valid on every built-in workload; under fenced effects a
leave_running rollback duplicates nothing and loses nothing; ``audit``
certifies and restores, and every restore it called eligible is valid;
``enforce`` refuses what it calls ineligible (before touching the workload
when a domain is outside the image, at the restore decision when effects
escaped), and accepts no invalid restore.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.conftest import REPO


def run(results: Path, scenario: str, *sets: str, variants: tuple[str, ...] = ()) -> tuple[pd.DataFrame, Path]:
    # Two trials at a time: a parallel run stores a serial one's verdicts (tests/criu/test_parallel.py), in less wall time.
    args = [sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / scenario), "--out", str(results), "--json",
            "--jobs", "2"]
    for s in sets:
        args += ["--set", s]
    for v in variants:
        args += ["--variant", v]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = (results / "latest").resolve()
    return pd.read_parquet(run_dir / "trials.parquet"), run_dir


def test_fenced_control_arm_is_valid_on_every_workload(criu, results_root):
    trials, _ = run(results_root, "all-workloads.toml", 'receiver.modes=["fenced"]', 'pipeline.faults=["none"]',
                    "plan.source=random", "plan.trials=1")
    print(trials[["variant", "arm", "plan", "outcome", "error"]].to_string())
    assert len(trials) >= 10
    assert (trials["outcome"] == "valid").all(), trials[trials["outcome"] != "valid"][["variant", "outcome", "findings", "error"]]
    assert trials["release_latency_median_s"].notna().all()


def test_certificates_hold_against_the_oracle_on_counter(criu, results_root):
    trials, run_dir = run(results_root, "quick.toml", 'receiver.modes=["fenced", "at_least_once"]',
                          'pipeline.faults=["kill", "leave_running"]', 'pipeline.certify=["audit", "enforce"]',
                          'plan.phases=["launch", "publish"]')  # launch first (the audit trial's epoch), publish: a fenced effect in flight
    print(trials[["arm", "plan", "outcome", "cert_eligible", "cert_reason"]].to_string())
    assert len(trials) == 16 and (trials["outcome"] != "unknown").all()
    # Output commit: a rollback after a crash duplicates nothing and loses nothing.
    fenced = trials[trials["receiver_mode"] == "fenced"]
    assert (fenced["outcome"] == "valid").all() and (fenced["cert_eligible"] == True).all()  # noqa: E712
    assert (fenced["duplicate"] == 0).all() and (fenced["missing"] == 0).all()
    alo_lr = trials[(trials["receiver_mode"] == "at_least_once") & (trials["fault"] == "leave_running")]
    audit, enforce = alo_lr[alo_lr["certify"] == "audit"], alo_lr[alo_lr["certify"] == "enforce"]
    assert (audit["outcome"] == "invalid").all() and (audit["cert_eligible"] == False).all()  # noqa: E712
    assert (enforce["outcome"] == "refused").all() and enforce["cert_reason"].str.contains("at_least_once has no fence").all()
    assert (enforce["restores"] == 0).all()
    # The claim is sound: no eligible restore is invalid, so certificate_unsound never fires.
    eligible = trials[trials["cert_eligible"] == True]  # noqa: E712
    assert (eligible["outcome"] == "valid").all() and (trials["certificate_unsound"] == 0).all()

    certs = pd.read_parquet(run_dir / "certificates.parquet")
    assert len(certs) == 16 and set(certs["certify"]) == {"audit", "enforce"}
    one = json.loads((run_dir / "trials" / f"{audit['trial_id'].iloc[0]}.json").read_text())["record"]["certificates"][0]
    assert one["application_epoch"] == "3/launch" and one["external_effect_fence"] == "none"
    assert set(one["in_flight"].values()) == {"escaped"}
    summary = (run_dir / "summary.md").read_text()
    assert "## Recovery-cut certificates" in summary and "soundness: invalid among eligible 0.0%" in summary
    assert "## Effect fences" in summary


def test_enforce_refuses_an_uncovered_domain_before_touching_the_workload(criu, results_root):
    # The workloads whose state leaves the image (disk, a shared file, peers) beside two that keep it all in it.
    trials, run_dir = run(results_root, "all-workloads.toml", 'receiver.modes=["idempotent"]', 'pipeline.faults=["kill"]',
                          'pipeline.certify=["enforce"]', 'plan.phases=["publish"]',
                          variants=("counter", "request_service/external-queue", "training/external-cursor",
                                    "allocator_churn/shared-table", "stream_callbacks"))
    external = trials[trials["variant"] == "request_service/external-queue"]
    assert len(external) == 1 and external["outcome"].iloc[0] == "refused"
    assert external["failed_stage"].iloc[0] == "certify" and "no checkpoint holds disk" in external["cert_reason"].iloc[0]
    assert external["restores"].iloc[0] == 0 and external["host_op"].iloc[0] == 10  # the workload ran on to its end
    # Every restore enforce let through was one its certificate called eligible.
    assert (trials[trials["outcome"] == "valid"]["cert_eligible"] == True).all()  # noqa: E712
