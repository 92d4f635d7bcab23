"""A failing trial in plain words (``harness/reports/explain.py``): pure, from a trial row and receiver rows."""

from __future__ import annotations

import json

import pandas as pd

from cutbench.harness.reports.explain import explain, op_ranges, suggested_option


def row(**kw):
    base = {"trial_id": "t0001", "backend": "criu", "fault": "leave_running", "receiver_mode": "at_least_once",
            "cut_op": 3, "cut_phase": "admit", "outcome": "invalid", "error": "", "findings": "[]"}
    return {**base, **kw}


def deliveries(*rows):
    return pd.DataFrame([{"trial_id": "t0001", "arrival_seq": i, "op_id": op, "epoch": ep, "decision": d}
                         for i, (op, ep, d) in enumerate(rows)])


def test_op_ranges_reads_as_words():
    assert op_ranges([3]) == "op 3"
    assert op_ranges([6, 3, 4, 5]) == "ops 3–6"
    assert op_ranges([1, 2, 5, 7, 8]) == "ops 1–2, 5 and 7–8"


def test_a_duplicate_names_both_incarnations_and_the_receiver_s_rule():
    found = [{"kind": "duplicate", "op": op, "detail": "applied 2 times (epochs [0, 1])"} for op in (3, 4)]
    fx = deliveries((3, 0, "applied"), (4, 0, "applied"), (3, 1, "applied"), (4, 1, "applied"))
    words = explain(row(findings=json.dumps(found)), fx)
    assert words.startswith("The criu checkpoint was taken at op 3/admit; the original ran on after the checkpoint")
    assert "applied ops 3–4 twice or more, from the original (incarnation 0) and the restored process (incarnation 1)" in words
    assert "at_least_once mode applies every delivery it gets" in words


def test_rows_of_another_trial_are_not_read():
    found = [{"kind": "duplicate", "op": 3, "detail": "applied 2 times"}]
    fx = pd.concat([deliveries((3, 0, "applied")), deliveries((3, 5, "applied")).assign(trial_id="t0002")])
    assert "incarnation 5" not in explain(row(findings=json.dumps(found)), fx)


def test_missing_mixed_and_other_kinds_each_get_a_sentence():
    found = [{"kind": "missing", "op": 5, "detail": "committed by the workload, never applied"},
             {"kind": "mixed_epoch", "op": 4, "detail": "final state checksum ≠ reference after host op 4"},
             {"kind": "pointer_changed", "op": None, "detail": "state: 0x1000 → 0x2000"}]
    words = explain(row(findings=json.dumps(found), fault="kill"), deliveries())
    assert "the original was killed after the checkpoint" in words
    assert "committed op 5, but the receiver never applied it" in words
    assert "State of two moments at op 4: final state checksum ≠ reference after host op 4." in words
    assert "Pointer changed: state: 0x1000 → 0x2000." in words


def test_a_refusal_and_an_unknown_say_what_was_not_done():
    refused = explain(row(outcome="refused", error="criu dump exit 1: Dumping FAILED."))
    assert refused == ("The criu checkpoint asked for at op 3/admit was refused, and the workload ran on uncut: "
                       "criu dump exit 1: Dumping FAILED.")
    unknown = explain(row(outcome="unknown", error="receiver down"))
    assert "could not judge" in unknown and "says nothing of criu" in unknown
    assert explain(row(outcome="valid")) == ""


def test_rows_the_receiver_made_and_malformed_findings_do_not_break_the_words():
    """A refused commit's row (epoch -1), a NaN epoch, a float cut op, findings that are not a list of findings."""
    found = [{"kind": "duplicate", "op": 3, "detail": "applied 2 times"}]
    fx = deliveries((3, 0, "applied"), (3, 1, "applied"), (4, -1, "refused"), (5, float("nan"), "applied"))
    words = explain(row(findings=json.dumps(found), cut_op=3.0), fx)
    assert "op 3/admit" in words and "incarnation -1" not in words and "3.0" not in words
    assert explain(row(findings="{not json", outcome="invalid", cut_op=None)).startswith("The criu checkpoint was taken at its cut point")
    assert explain(row(findings=json.dumps({"kind": "x"}), outcome="invalid")).endswith("crashed.")


FILE_LOCKS = ("criu dump exit 1: 5269: Error (criu/file-lock.c:110): Some file locks are hold by dumping tasks! You can "
              "try --file-locks to dump them. | 5269: Error (criu/cr-dump.c:1975): Dumping FAILED.")


def test_a_refusal_whose_tool_suggests_an_option_says_so_and_how_to_pass_it():
    refused = {"trial_id": "t0001", "outcome": "refused", "backend": "criu", "cut_op": 12, "cut_phase": "effect",
               "error": FILE_LOCKS, "criu_options": ""}
    assert 'CRIU suggests its option --file-locks: pipeline.criu_options = [[], ["--file-locks"]]' in explain(refused)
    # Given already, or one each cut sets itself: no such advice.
    assert "suggests" not in explain({**refused, "criu_options": "--file-locks"})
    assert suggested_option("Error: try --tcp-established") == "" and suggested_option("please try again") == ""
    remap = "Error (criu/files-reg.c:1354): Can't create link remap for /dev/shm/sem.mp-x. Use link-remap option."
    assert "--link-remap" in suggested_option(remap)


def test_the_summary_groups_the_refused_trials_by_the_tool_s_words():
    from cutbench.harness.reports.summary import refusal_groups, render_refusals

    rows = [{"trial_id": f"t000{i}", "outcome": "refused", "arm": arm, "criu_options": "", "error": error}
            for i, (arm, error) in enumerate([("criu/a/kill", FILE_LOCKS), ("criu/b/kill", FILE_LOCKS.replace("5269", "5301")),
                                              ("criu/a/kill", "criu dump exit 1: Error (x): other")], 1)]
    trials = pd.DataFrame(rows + [{"trial_id": "t0004", "outcome": "valid", "arm": "criu/a/kill", "error": ""}])
    groups = refusal_groups(trials)
    # The two file-lock refusals differ only in CRIU's pid: one reason, both trials and arms, the suggestion.
    assert [g["trials"] for g in groups] == [["t0001", "t0002"], ["t0003"]]
    assert groups[0]["arms"] == ["criu/a/kill", "criu/b/kill"] and "--file-locks" in groups[0]["fix"]
    assert groups[0]["reason"].startswith("criu dump exit 1: Error (criu/file-lock.c:110)")
    text = "\n".join(render_refusals(trials))
    assert text.startswith("## Refused trials") and "- 2 trials (t0001, t0002; criu/a/kill, criu/b/kill)" in text


def shown(*rows):
    """A program's receiver rows: ``(op, stream, index, epoch)`` each."""
    return pd.DataFrame([{"trial_id": "t0001", "arrival_seq": i, "op_id": op, "stream": stream, "index": str(index),
                          "epoch": ep, "sender": ep, "decision": "applied"} for i, (op, stream, index, ep) in enumerate(rows)])


def test_a_program_s_findings_are_said_by_stream_and_range_in_a_few_sentences():
    # A streaming server's trial under new_id had one sentence per op (96 of them): now by stream and range.
    missing = [{"kind": "missing", "op": op, "detail": f"committed by the workload, never applied [r1#{op}]"}
               for op in range(16, 32)]
    never = [{"kind": "mixed_epoch", "op": 100 + i, "detail": "payload ab… ≠ reference (never shown… [an effect the "
                                                               "uninterrupted runs never showed]"} for i in range(1, 9)]
    fx = shown(*[(100 + i, "r1.1", i, 1) for i in range(1, 9)])
    words = explain(row(findings=json.dumps(missing + never), cut_phase="effect", cut_op=16), fx)
    assert words.count(".") <= 4, words
    assert "taken at effect 16" in words
    assert "The effects at r1 positions 16–31 never reached its client" in words
    assert "The effects at r1.1 positions 1–8 are ones the uninterrupted runs never showed there" in words
    assert "State of two moments" not in words and "receiver" not in words


def test_a_program_started_again_by_its_own_flag_or_from_its_beginning_says_so():
    dup = [{"kind": "duplicate", "op": op, "detail": "applied 2 times"} for op in (11, 12)]
    fx = shown((11, "stdout", 11, 0), (12, "stdout", 12, 0), (11, "stdout", 11, 1), (12, "stdout", 12, 1))
    app = explain(row(backend="app", fault="kill", findings=json.dumps(dup), cut_phase="effect", cut_op=12), fx,
                  resume="--resume")
    assert app.startswith("The program was killed at effect 12, and started again with its own --resume.")
    assert "stdout positions 11–12 twice or more" in app and "checkpoint" not in app
    restart = explain(row(backend="restart", fault="leave_running", findings=json.dumps(dup), cut_phase="effect",
                          cut_op=12), fx)
    assert restart.startswith("The program was left running past effect 12, then crashed, and started again from "
                              "its beginning.")


def test_alike_findings_of_a_workload_are_one_sentence():
    mixed = [{"kind": "mixed_epoch", "op": op, "detail": f"payload {op} ≠ reference"} for op in (4, 5, 6, 9)]
    words = explain(row(findings=json.dumps(mixed), fault="kill"), deliveries())
    assert "State of two moments at ops 4–6 and 9: payload 4 ≠ reference (3 more alike)." in words
