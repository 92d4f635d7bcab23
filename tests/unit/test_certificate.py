"""The certificate rule on recorded evidence, and the oracle checking it; no CRIU, no GPU."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.checker import oracle
from cutbench.harness.checker.stats import certificate_matrix
from cutbench.harness.model.certificate import Evidence, Position, certify, compatible
from cutbench.harness.model.scenario import parse_scenario
from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import Counter


def evidence(**kw: Any) -> Evidence:
    base = dict(checkpoint=0, phases=PHASES, workload_domains=("cpu", "receiver"), covers=("cpu", "ipc"),
                receiver_mode="at_least_once", positions={"criu_freeze": Position(3, "publish")}, sent_through=3,
                acked_through=2, restore_decided=True)
    base.update(kw)
    return Evidence(**base)


def test_a_kill_at_the_cut_is_eligible_and_names_each_domain():
    cert = certify(evidence())
    assert cert.eligible and cert.reason == ""
    assert cert.application_epoch == "3/publish"
    assert cert.domains == {"cpu": "frozen@3/publish", "receiver": "none"}
    assert cert.unknown == () and cert.coverage == ("cpu", "ipc")


def test_an_uncovered_domain_is_unknown_and_ineligible():
    cert = certify(evidence(workload_domains=("cpu", "disk", "receiver")))
    assert not cert.eligible and cert.unknown == ("disk",)
    assert cert.domains["disk"] == "unknown" and "no checkpoint holds disk" in cert.reason


def test_effects_escaped_after_the_cut_depend_on_the_receiver_mode():
    escaped = dict(visible=(1, 2, 3, 4, 5))
    alo = certify(evidence(**escaped))
    assert not alo.eligible and alo.in_flight == {4: "escaped", 5: "escaped"}
    assert "ops 4, 5" in alo.reason
    idem = certify(evidence(receiver_mode="idempotent", **escaped))
    assert idem.eligible and idem.in_flight == {4: "replay", 5: "replay"} and idem.external_effect_fence == "deduplicated"
    fenced = certify(evidence(receiver_mode="fenced", visible=(1, 2, 3), aborted=(4, 5)))
    assert fenced.eligible and fenced.external_effect_fence == "committed_through(3)"
    assert fenced.in_flight == {4: "discard", 5: "discard"}


def test_files_written_after_the_image_put_the_disk_ahead_of_it():
    ahead = dict(workload_domains=("cpu", "disk", "receiver"), covers=("cpu", "disk"), receiver_mode="idempotent",
                 written_after=("jobs.db", "jobs.db-wal", "log/1", "log/2"))
    cert = certify(evidence(**ahead))
    assert not cert.eligible and cert.domains["disk"] == "ahead of the image (jobs.db, jobs.db-wal, log/1 and 1 more)"
    assert cert.reason.startswith("disk: jobs.db, jobs.db-wal, log/1 and 1 more written after the image")
    # A program without a disk domain keeps no state in its files: what it wrote is not the image's concern.
    assert certify(evidence(**{**ahead, "workload_domains": ("cpu", "receiver")})).eligible
    assert certify(evidence(**{**ahead, "written_after": ()})).eligible


def test_a_reconnecting_restore_resends_what_was_not_acknowledged():
    # Cut after publish of op 3: sent, not yet acknowledged. A leave_running restore closes the
    # connection, so the restored client sends op 3 again: a duplicate under at_least_once.
    cert = certify(evidence(visible=(1, 2, 3), reconnects=True))
    assert not cert.eligible and cert.in_flight == {3: "escaped"}
    assert certify(evidence(visible=(1, 2, 3), reconnects=False)).eligible


def test_split_window_positions_are_different_epochs_yet_compatible_without_device_work():
    split = {"cuda_lock": Position(3, "device_done"), "criu_freeze": Position(3, "publish")}
    cert = certify(evidence(workload_domains=("cpu", "cuda", "receiver"), covers=("cpu", "cuda", "ipc"), positions=split))
    assert cert.domains["cuda"] == "checkpointed@3/device_done" and cert.domains["cpu"] == "frozen@3/publish"
    assert cert.eligible
    apart = {"cuda_lock": Position(3, "device_done"), "criu_freeze": Position(4, "launch")}
    cert = certify(evidence(workload_domains=("cpu", "cuda", "receiver"), covers=("cpu", "cuda", "ipc"), positions=apart))
    assert not cert.eligible and "incompatible epochs" in cert.reason


@pytest.mark.parametrize("a, b, ok", [
    (Position(3, "record"), Position(3, "commit"), True),
    (Position(3, "admit"), Position(3, "launch"), False),
    (Position(3, "commit"), Position(4, "admit"), True),
    (Position(3, "commit"), Position(4, "device_done"), False),
    (Position(5, "ack"), Position(5, "ack"), True),
])
def test_compatible_positions(a, b, ok):
    assert compatible(a, b, PHASES) is ok and compatible(b, a, PHASES) is ok


REF = Counter.reference({"seed": 7, "state_size": 64})


def _record(certs: list[dict[str, Any]]) -> dict[str, Any]:
    report = {"host_op": 3, "checksum": REF.checksum(3), "pointers_initial": {}, "pointers_final": {}}
    return {"status": "completed", "report": report, "marker_op": 3, "restores": 1,
            "cut_outcomes": [{"status": "restored"}], "workload_domains": ["cpu", "receiver"],
            "covered_domains": ["cpu", "ipc"], "certificates": certs}


def _effects(ops: list[int]) -> pd.DataFrame:
    return pd.DataFrame([{"op_id": op, "attempt": 1, "epoch": 0, "decision": "applied", "digest": REF.payload(op)} for op in ops])


def test_an_eligible_restore_that_the_oracle_finds_invalid_is_certificate_unsound():
    cert = {**certify(evidence()).to_dict(), "restored": True, "restore_decided": True}
    kinds = [f.kind for f in oracle.judge(_record([cert]), _effects([1, 2, 2, 3]), REF).findings]
    assert kinds == ["duplicate", "certificate_unsound"]
    assert oracle.judge(_record([cert]), _effects([1, 2, 3]), REF).outcome == "valid"
    ineligible = {**cert, "eligible": False}
    assert "certificate_unsound" not in [f.kind for f in oracle.judge(_record([ineligible]), _effects([1, 2, 2, 3]), REF).findings]


def test_the_confusion_matrix_counts_claims_against_verdicts():
    trials = pd.DataFrame([
        {"cert_eligible": True, "outcome": "valid", "certify": "audit", "restores": 1},
        {"cert_eligible": False, "outcome": "invalid", "certify": "audit", "restores": 1},
        {"cert_eligible": False, "outcome": "valid", "certify": "audit", "restores": 1},
        {"cert_eligible": False, "outcome": "refused", "certify": "enforce", "restores": 0},
        {"cert_eligible": True, "outcome": "valid", "certify": "enforce", "restores": 1},
        {"cert_eligible": None, "outcome": "valid", "certify": "off", "restores": 1},
    ])
    m = certificate_matrix(trials)
    assert m["certified"] == 5 and m["eligible_valid"] == 2 and m["ineligible_invalid"] == 1
    assert m["soundness"][0] == 0.0 and m["over_refusal"][0] == pytest.approx(1 / 3)
    assert (m["enforce_accepted"], m["enforce_accepted_invalid"]) == (1, 0)


def test_pipeline_certify_is_an_arm_axis_and_validated():
    scen = parse_scenario({"pipeline": {"certify": ["audit", "enforce"], "faults": ["kill"]}})
    assert [a.certify for a in scen.arms()] == ["audit", "enforce"]
    assert scen.arms()[1].label() == "criu/at_least_once/kill/enforce"
    assert parse_scenario({"pipeline": {"certify": "audit"}}).certify == ("audit",)
    with pytest.raises(InvalidArgument, match="pipeline.certify contains 'always'"):
        parse_scenario({"pipeline": {"certify": ["always"]}})


def test_a_precheck_names_only_what_no_checkpoint_holds():
    cert = certify(evidence(positions={}, workload_domains=("cpu", "disk", "receiver")))
    assert not cert.eligible and cert.reason == "no checkpoint holds disk"
    assert cert.domains["cpu"] == "not captured"


def test_suspend_resume_in_place_keeps_what_the_image_does_not_hold():
    cert = certify(evidence(workload_domains=("cpu", "cuda", "receiver"), covers=("cuda",), in_place=True,
                            positions={"cuda_lock": Position(2, "record")}, restore_decided=False))
    assert cert.eligible and cert.unknown == () and cert.domains["cpu"] == "live"
    assert cert.domains["cuda"] == "checkpointed@2/record"


def test_an_application_on_numpy_declares_no_cuda_feature():
    from cutbench.workloads import api as workload_api
    from cutbench.workloads.inference_worker import InferenceWorker

    assert workload_api.declared_features(InferenceWorker, {}, "numpy") == frozenset()
    assert workload_api.declared_features(InferenceWorker, {}, "cupy") == {"device_memory", "cublas"}
