"""The oracle on recorded data: for every finding, a case where it must fire and one where it must not.

No CRIU, no GPU: trial records and receiver effect frames are built by hand
in the shapes the runner and the receiver store produce, and judged against
the real ``counter`` reference.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutbench.harness.checker import oracle
from tests.fixtures import per_op
from cutbench.harness.checker.oracle import judge
from cutbench.workloads.common import ReplayReference
from cutbench.workloads.counter import Counter
from tests.conftest import FULL_SUITE

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


# -- the effect finders against their plain per-op definitions -------------------
#
# The oracle judges the effects table with whole-column operations; per_op holds
# the same definitions as loops over ops and rows. They must agree on every
# table, finding for finding (kind, op, detail, order) and, where a table is
# malformed, on the reason the trial is unknown.

DECISIONS = ("applied", "committed", "suppressed", "aborted", "prepared", "rejected")
# What an effect carries: its own payload, the previous op's (a stale digest), other text, or nothing.
DIGESTS = ("own", "previous", "other", "none")
# The dtypes an effects table comes in: the store's (int64 and Arrow strings), plain objects (pandas 2),
# floats with NaN ops and epochs, pandas' nullable types; and a table lacking one column.
LAYOUTS = ("store", "object", "float", "nullable")
DROPPABLE = ("op_id", "digest", "decision", "epoch")


def digest_for(op: int, kind: str) -> str | None:
    return {"own": REF.payload(op), "previous": REF.payload(op - 1), "other": "0" * 32, "none": None}[kind]


@st.composite
def effect_tables(draw: Any) -> pd.DataFrame | None:
    """Random receiver tables: duplicates, gaps, stale payloads, unseen decisions, odd dtypes, a missing column."""
    rows = draw(st.lists(st.tuples(st.integers(-1, 12), st.integers(1, 3), st.integers(0, 3),
                                   st.sampled_from(DECISIONS), st.sampled_from(DIGESTS)), max_size=30))
    if not rows and draw(st.booleans()):
        return draw(st.sampled_from((None, oracle.empty_effects())))
    layout = draw(st.sampled_from(LAYOUTS))
    dropped = draw(st.sampled_from(DROPPABLE)) if draw(st.integers(0, 4)) == 0 else None  # one table in five
    frame = pd.DataFrame({
        "op_id": [op for op, *_ in rows], "attempt": [a for _, a, *_ in rows], "epoch": [e for _, _, e, *_ in rows],
        "decision": [d for *_, d, _ in rows], "digest": [digest_for(op, k) for op, *_, k in rows],
    }, columns=list(oracle.EFFECT_COLUMNS))
    frame = frame.astype({"op_id": "int64", "attempt": "int64", "epoch": "int64"})
    if layout == "store":
        frame = frame.astype({"digest": "str", "decision": "str"})
        cut = draw(st.integers(0, len(frame)))  # a table put together from parts holds its strings in several chunks
        frame = pd.concat([frame.iloc[:cut], frame.iloc[cut:]], ignore_index=True)
    elif layout == "object":
        frame = frame.astype(object)
    elif layout == "float":  # op -1 and epoch 3 stand for values the receiver lost
        frame["op_id"] = frame["op_id"].astype(float).where(frame["op_id"] >= 0)
        frame["epoch"] = frame["epoch"].astype(float).where(frame["epoch"] < 3)
    else:
        frame = frame.astype({"op_id": "Int64", "epoch": "Int64", "digest": "string", "decision": "string"})
        frame["op_id"] = frame["op_id"].where(frame["op_id"] >= 0)
    if draw(st.booleans()):  # who sent each row, as clients that say so record it (-1: not said)
        frame["sender"] = pd.array(draw(st.lists(st.integers(-1, 3), min_size=len(frame), max_size=len(frame))),
                                   dtype="int64")
    return frame.drop(columns=[dropped]) if dropped else frame


def outcome_of(finder: Any, *args: Any) -> Any:
    """The findings, or the exception's type and text: both must agree."""
    try:
        return finder(*args)
    except Exception as exc:
        return type(exc), str(exc)


@settings(max_examples=300 if FULL_SUITE else 100, deadline=None)  # the full 300 with CUTBENCH_FULL_SUITE=1
@given(effect_tables(), st.integers(0, 14))
def test_the_vectorised_effect_finders_agree_with_their_per_op_definitions(e, committed):
    assert outcome_of(oracle.find_duplicates, e) == outcome_of(per_op.find_duplicates, e)
    assert outcome_of(oracle.find_missing, e, committed) == outcome_of(per_op.find_missing, e, committed)
    assert outcome_of(oracle.payload_mismatches, e, REF) == outcome_of(per_op.payload_mismatches, e, REF)
    rec = record(report=report(committed), marker_op=committed)
    assert judge(rec, e, REF) == judge(rec, e, REF, finders=per_op.FINDERS)


def test_findings_keep_their_order_and_detail_on_a_shuffled_table():
    """Duplicates and gaps in op order; stale payloads in the order their (op, payload) pairs arrived."""
    e = effects((5, 1, 0, "applied"), (2, 1, 0, "applied"), (5, 2, 1, "applied"), (4, 1, 0, "applied"),
                (2, 2, 2, "applied"), (2, 3, 1, "committed"), (4, 2, 1, "suppressed"),
                digest_of={5: REF.payload(4), 4: "f" * 32})
    e = e.astype({"digest": "str", "decision": "str"})
    rec = record(report=None, marker_op=6)
    v = judge(rec, e, REF)
    assert v == judge(rec, e, REF, finders=per_op.FINDERS)
    assert [(f.kind, f.op, f.detail) for f in v.findings] == [
        ("duplicate", 2, "applied 3 times (epochs [0, 1, 2])"),
        ("duplicate", 5, "applied 2 times (epochs [0, 1])"),
        ("missing", 1, "committed by the workload, never applied"),
        ("missing", 3, "committed by the workload, never applied"),
        ("missing", 6, "committed by the workload, never applied"),
        ("mixed_epoch", 5, f"payload {REF.payload(4)[:12]}… ≠ reference {REF.payload(5)[:12]}…"),
        ("mixed_epoch", 4, f"payload {'f' * 12}… ≠ reference {REF.payload(4)[:12]}…"),
    ]


def test_a_table_without_a_column_the_finders_read_is_unknown_for_the_same_reason():
    e = clean_effects().drop(columns=["digest"])
    v = judge(record(), e, REF)
    assert v.outcome == "unknown" and "finder mixed_epoch raised KeyError" in v.reason
    assert v == judge(record(), e, REF, finders=per_op.FINDERS)


class HashedRun:
    """A stand-in workload model for large tables: the payload of op i is a hash of i."""

    def __init__(self) -> None:
        self.op = 0

    def step(self, op: int) -> str:
        self.op = op
        return hashlib.blake2b(str(op).encode(), digest_size=16).hexdigest()

    def checksum(self) -> str:
        return hashlib.blake2b(f"state {self.op}".encode(), digest_size=16).hexdigest()


def test_the_oracle_judges_a_hundred_thousand_effects_asking_the_reference_once_per_op():
    """10⁵ effects judged whole-column: the findings of the per-op definitions, and ``reference.payload`` asked
    once per distinct visible op, never per row. The CPU it took is printed as a figure (about 0.1 s, the per-op
    finders over 2 s); benchmarks/oracle_speed.py measures the rate, since a bound on time fails on a busy host.
    """
    ref = ReplayReference(HashedRun)
    ops = np.arange(1, 99_001)
    once, again = ops[ops % 1000 != 7], ops[::100]  # 0.1% of the ops never applied, 1% applied again
    op_id = np.r_[once, again]
    e = pd.DataFrame({"op_id": op_id, "attempt": 1, "epoch": np.r_[np.zeros(len(once), int), np.ones(len(again), int)],
                      "decision": pd.array(["applied"] * len(op_id), dtype="str"),
                      "digest": pd.array([ref.payload(op) for op in op_id.tolist()], dtype="str")})
    final = {"host_op": len(ops), "checksum": ref.checksum(len(ops)), "pointers_initial": {}, "pointers_final": {}}
    rec = record(report=final, marker_op=len(ops))

    class Counted:
        """``ref``, counting the payloads asked of it."""

        asked = 0

        def payload(self, op: int) -> str:
            Counted.asked += 1
            return ref.payload(op)

        def __getattr__(self, name: str):
            return getattr(ref, name)

    t0 = time.process_time()
    v = judge(rec, e, Counted())
    cpu = time.process_time() - t0
    assert len(e) == 99_891 and v.counts()["duplicate"] == 990 and v.counts()["missing"] == 99 and v.outcome == "invalid"
    assert Counted.asked == len(np.unique(op_id)) == 98_901
    print(f"\njudging {len(e)} effects: {cpu:.2f} s of CPU (a figure, not a bound)")
