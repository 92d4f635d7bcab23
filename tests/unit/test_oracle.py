"""The oracle on recorded data: for every finding, a case where it must fire and one where it must not.

No CRIU, no GPU: trial records and receiver effect frames are built by hand
in the shapes the runner and the receiver store produce, and judged against
the real ``counter`` reference.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from cutbench.harness.checker import oracle
from cutbench.harness.checker.oracle import judge
from cutbench.workloads.counter import Counter

PARAMS = {"seed": 7, "state_size": 64}
REF = Counter.reference(PARAMS)
OPS = 5


def effects(*rows: tuple[int, int, int, str], digest_of=None) -> pd.DataFrame:
    """Effect rows ``(op, attempt, epoch, decision)``; the digest is the reference payload unless ``digest_of`` maps op -> digest."""
    digest_of = digest_of or {}
    return pd.DataFrame(
        [{"op_id": op, "attempt": att, "epoch": ep, "decision": dec, "digest": digest_of.get(op, REF.payload(op))}
         for op, att, ep, dec in rows],
        columns=["op_id", "attempt", "epoch", "decision", "digest"],
    )


def clean_effects(n: int = OPS) -> pd.DataFrame:
    return effects(*[(op, 1, 0, "applied") for op in range(1, n + 1)])


def report(host_op: int = OPS, **extra: Any) -> dict[str, Any]:
    out = {"host_op": host_op, "checksum": REF.checksum(host_op), "pointers_initial": {"state": 0x7F00},
           "pointers_final": {"state": 0x7F00}}
    out.update(extra)
    return out


def record(**overrides: Any) -> dict[str, Any]:
    """A completed one-restore trial of a cpu+receiver workload under a cpu+ipc backend."""
    rec = {"status": "completed", "error": "", "report": report(), "marker_op": OPS, "restores": 1,
           "cut_outcomes": [{"status": "restored", "stage": "", "error": ""}], "progress_op": OPS,
           "progress_phase": "commit", "workload_domains": ["cpu", "receiver"], "covered_domains": ["cpu", "ipc"]}
    rec.update(overrides)
    return rec


def kinds(verdict: oracle.Verdict) -> list[str]:
    return [f.kind for f in verdict.findings]


def test_a_clean_restored_trial_is_valid():
    v = judge(record(), clean_effects(), REF)
    assert (v.outcome, v.findings) == ("valid", ())


# -- duplicate -------------------------------------------------------------------


def test_duplicate_fires_for_an_op_applied_twice():
    """leave_running + at_least_once: op 3 and op 4 resent by the restored process and applied again."""
    e = pd.concat([clean_effects(), effects((3, 2, 1, "applied"), (4, 1, 1, "applied"))], ignore_index=True)
    v = judge(record(), e, REF)
    assert v.outcome == "invalid"
    assert [(f.kind, f.op) for f in v.findings] == [("duplicate", 3), ("duplicate", 4)]
    assert "epochs [0, 1]" in v.findings[0].detail


@pytest.mark.parametrize("decision", ["suppressed", "aborted", "prepared", "rejected"])
def test_duplicate_does_not_fire_for_redeliveries_that_were_not_applied(decision):
    """idempotent suppressed / fenced aborted redeliveries are the receiver doing its job."""
    e = pd.concat([clean_effects(), effects((3, 2, 1, decision))], ignore_index=True)
    assert judge(record(), e, REF).outcome == "valid"


def test_fenced_commits_count_as_visible():
    e = effects(*[(op, 1, 0, "committed") for op in range(1, OPS + 1)], (2, 2, 1, "committed"))
    assert kinds(judge(record(), e, REF)) == ["duplicate"]


# -- missing ---------------------------------------------------------------------


def test_missing_fires_for_a_committed_op_never_applied():
    """outbox_mark_before_send: op 2 marked delivered, skipped after the restore, yet committed."""
    e = effects(*[(op, 1, 0 if op < 2 else 1, "applied") for op in (1, 3, 4, 5)])
    v = judge(record(), e, REF)
    assert [(f.kind, f.op) for f in v.findings] == [("missing", 2)]


def test_missing_counts_only_up_to_the_committed_op():
    """Ops after the workload's last commit are not judged (the marker says op 3 when there is no report)."""
    e = effects((1, 1, 0, "applied"), (2, 1, 0, "applied"), (3, 1, 0, "applied"))
    assert judge(record(report=None, marker_op=3), e, REF).outcome == "valid"
    assert [(f.kind, f.op) for f in judge(record(report=None, marker_op=4), e, REF).findings] == [("missing", 4)]


def test_missing_does_not_count_suppressed_rows_as_applied():
    e = pd.concat([clean_effects(4), effects((5, 1, 0, "suppressed"))], ignore_index=True)
    assert [(f.kind, f.op) for f in judge(record(), e, REF).findings] == [("missing", 5)]


# -- mixed_epoch -----------------------------------------------------------------


def test_mixed_epoch_fires_for_a_payload_of_the_previous_op():
    """resend_stale_digest: op 3 published with the digest of the state after op 2."""
    e = effects(*[(op, 1, 0, "applied") for op in range(1, OPS + 1)], digest_of={3: REF.payload(2)})
    v = judge(record(), e, REF)
    assert [(f.kind, f.op) for f in v.findings] == [("mixed_epoch", 3)]


def test_mixed_epoch_fires_when_the_final_state_and_the_host_counter_disagree():
    v = judge(record(report=report(checksum=REF.checksum(OPS - 1))), clean_effects(), REF)
    assert [(f.kind, f.op) for f in v.findings] == [("mixed_epoch", OPS)]


def test_mixed_epoch_fires_for_domains_at_different_ops_at_resume_and_at_the_end():
    at_resume = report(resumes=[{"epoch": 1, "domain_ops": {"host": 3, "device": 4}}])
    assert [(f.kind, f.op) for f in judge(record(report=at_resume), clean_effects(), REF).findings] == [("mixed_epoch", 3)]
    at_end = report(domain_ops={"host": 5, "device": 4})
    assert kinds(judge(record(report=at_end), clean_effects(), REF)) == ["mixed_epoch"]


def test_mixed_epoch_does_not_fire_when_every_domain_agrees():
    ok = report(domain_ops={"host": 5, "device": 5}, resumes=[{"epoch": 1, "domain_ops": {"host": 3, "device": 3}}])
    assert judge(record(report=ok), clean_effects(), REF).outcome == "valid"


# -- pointer_changed -------------------------------------------------------------


def test_pointer_changed_fires_for_a_moved_buffer_and_a_broken_pointer_table():
    """restore_hook_realloc: the state buffer re-allocated after the restore."""
    moved = report(pointers_final={"state": 0x9F00})
    v = judge(record(report=moved), clean_effects(), REF)
    assert [(f.kind, f.detail) for f in v.findings] == [("pointer_changed", "state: 0x7f00 → 0x9f00")]
    gone = report(pointers_initial={"state": 0x7F00, "aux": 0x1000}, pointers_final={"state": 0x7F00})
    assert [f.detail for f in judge(record(report=gone), clean_effects(), REF).findings] == ["aux: 0x1000 → gone"]
    table = report(pointer_table_ok=False)
    assert kinds(judge(record(report=table), clean_effects(), REF)) == ["pointer_changed"]


def test_pointer_changed_does_not_fire_when_addresses_and_table_hold():
    assert judge(record(report=report(pointer_table_ok=True)), clean_effects(), REF).outcome == "valid"


# -- deadlock --------------------------------------------------------------------


def test_deadlock_fires_when_a_peer_waits_for_a_message_the_restored_process_believes_it_sent():
    """echo_peer_noseq after leave_running, cut after `send` of op 2: the restored process waits
    for the answer to a request it sent before the cut; the peer, on the new connection, waits
    for a request. Ops 1 applied, nothing after; the watchdog fired."""
    rec = record(status="deadlock", error="no progress for 3s", report=None, marker_op=1, progress_op=2,
                 progress_phase="send", log_tail="peer connection lost; reconnected; waiting for the answer to op 2 (request already sent)")
    v = judge(rec, clean_effects(1), REF)
    assert v.outcome == "invalid"
    assert [(f.kind, f.op) for f in v.findings] == [("deadlock", 2)]
    assert "stalled at 2/send after restore 1" in v.findings[0].detail


def test_deadlock_does_not_fire_when_the_restored_process_went_on():
    """The sequenced twin resent its request after reconnecting: the trial completed."""
    assert judge(record(), clean_effects(), REF).outcome == "valid"


def test_a_hang_without_any_cut_is_unknown_not_a_deadlock_finding():
    rec = record(status="deadlock", report=None, marker_op=1, restores=0, cut_outcomes=[])
    v = judge(rec, clean_effects(1), REF)
    assert (v.outcome, v.findings) == ("unknown", ())


# -- unsafe_acceptance -----------------------------------------------------------


def test_unsafe_acceptance_fires_for_a_restore_without_covering_a_used_domain():
    rec = record(workload_domains=["cpu", "cuda", "receiver"], covered_domains=["cpu", "ipc"])
    v = judge(rec, clean_effects(), REF)
    assert [(f.kind, f.detail) for f in v.findings] == [("unsafe_acceptance", "restored without covering cuda")]


def test_unsafe_acceptance_does_not_fire_without_a_restore_or_with_coverage():
    refused = record(status="refused", restores=0, cut_outcomes=[{"status": "refused", "stage": "criu_dump", "error": "x"}],
                     workload_domains=["cpu", "cuda", "receiver"])
    assert judge(refused, clean_effects(), REF).outcome == "refused"
    covered = record(workload_domains=["cpu", "cuda", "receiver"], covered_domains=["cpu", "cuda", "ipc"])
    assert judge(covered, clean_effects(), REF).outcome == "valid"
    # The receiver is the outside world: never "uncovered".
    assert judge(record(covered_domains=["cpu"]), clean_effects(), REF).outcome == "valid"


# -- outcomes --------------------------------------------------------------------


def test_unknown_status_is_unknown_even_with_suspicious_effects():
    e = pd.concat([clean_effects(), effects((3, 2, 1, "applied"))], ignore_index=True)
    v = judge(record(status="unknown", error="criu restore exit 1"), e, REF)
    assert (v.outcome, v.reason) == ("unknown", "criu restore exit 1")


# What the GPU runs recorded (results/reference/repro/, docs/DESIGN.md "Tool failure modes"),
# in the shapes the runner stores them.
DUMP_KILLED = ("criu_dump", "criu dump exit 1: Error (compel/src/lib/infect.c:417): Unable to detach from 1977: "
               "No such process | Error (criu/cr-dump.c:1975): Dumping FAILED. (workload did not survive)")
LOCK_TIMED_OUT = ("cuda_lock", "cuCheckpointProcessLock(pid 4410) -> CUDA_ERROR_NOT_READY: timed out waiting for "
                  "in-flight work to finish (lock timeout) (process left RUNNING)")


def test_a_dump_that_killed_the_process_is_process_lost_and_invalid():
    stage, error = DUMP_KILLED
    rec = record(status="lost", failed_stage=stage, error=error, report=None, restores=0, progress_op=3, marker_op=2,
                 cut_outcomes=[{"status": "failed", "stage": stage, "error": error}])
    v = judge(rec, clean_effects(2), REF)
    assert v.outcome == "invalid" and [f.kind for f in v.findings] == ["process_lost"]
    assert v.findings[0].op == 3 and v.findings[0].detail.startswith("criu_dump: criu dump exit 1")
    assert v.counts()["process_lost"] == 1


def test_a_lock_that_timed_out_with_the_process_running_is_refused_not_lost():
    stage, error = LOCK_TIMED_OUT
    rec = record(status="refused", failed_stage=stage, error=error, restores=0,
                 cut_outcomes=[{"status": "refused", "stage": stage, "error": error}])
    v = judge(rec, clean_effects(), REF)
    assert (v.outcome, v.findings, v.reason) == ("refused", (), error)


def test_a_harness_exception_is_unknown_never_lost():
    v = judge(record(status="unknown", error="harness: KeyError: 'progress_op'", report=None), clean_effects(2), REF)
    assert (v.outcome, v.findings) == ("unknown", ())


def test_findings_outrank_a_refusal_and_the_verdict_is_plain_data():
    e = pd.concat([clean_effects(), effects((2, 2, 1, "applied"))], ignore_index=True)
    v = judge(record(status="refused", error="split window refused"), e, REF)
    assert v.outcome == "invalid" and v.counts()["duplicate"] == 1
    assert v.to_dict() == {"outcome": "invalid", "reason": "",
                           "findings": [{"kind": "duplicate", "op": 2, "detail": "applied 2 times (epochs [0, 1])"}]}


def test_judge_is_pure():
    rec, e = record(), pd.concat([clean_effects(), effects((3, 2, 1, "applied"))], ignore_index=True)
    before = (repr(rec), e.copy())
    assert judge(rec, e, REF) == judge(rec, e, REF)
    assert repr(rec) == before[0] and e.equals(before[1])


def test_a_finder_that_raises_makes_the_trial_unknown_not_valid():
    def broken(rec, effects, ref):
        raise KeyError("digest")

    v = judge(record(), clean_effects(), REF, finders=(*oracle.FINDERS, ("broken", broken)))
    assert v.outcome == "unknown" and "finder broken raised KeyError" in v.reason


def test_the_checker_reads_a_typed_record_and_rejects_a_malformed_one():
    rec = oracle.TrialRecord.from_dict(record(restores="2", extra_key="ignored"))
    assert rec.restores == 2 and rec.committed_op == OPS
    assert judge(rec, clean_effects(), REF).outcome == "valid"
    bad = judge(record(status="exploded"), clean_effects(), REF)
    assert bad.outcome == "unknown" and "status = 'exploded'" in bad.reason
    assert judge(record(restores="many"), clean_effects(), REF).outcome == "unknown"


def test_a_restore_that_started_the_workload_again_is_restarted():
    """Ground truth: a second fresh start (from op 1) after a reported restore; never from a continuation."""
    v = judge(record(fresh_starts=2), clean_effects(), REF)
    assert kinds(v) == ["restarted"] and "started from op 1 again 1 time after 1 reported restore" in v.findings[0].detail
    assert judge(record(fresh_starts=1), clean_effects(), REF).outcome == "valid"  # a restore that continued
    assert judge(record(), clean_effects(), REF).outcome == "valid"  # records from before the count: one start
    assert judge(record(restores=0, cut_outcomes=[], fresh_starts=2), clean_effects(), REF).outcome == "valid"
