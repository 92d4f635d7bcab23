"""The checker: a pure function from a trial's recorded data to a verdict.

Inputs are plain data — the trial record (runner status, the workload's final
report, the commit marker, declared domains, the backend's coverage), the
receiver's effects for the trial as a DataFrame, and the workload's
reference — so a stored run is re-analysed with the same verdict and every
finding is unit-testable without CRIU or a GPU.

Outcomes (as Jepsen's ``:valid?``): ``valid``; ``invalid`` (one finding or
more); ``refused`` (a stage declined cleanly and the workload went on);
``unknown`` (the harness itself could not judge; never counted as valid).

The findings, each defined precisely in its function's docstring:

==================== =====================================================
``duplicate``        :func:`find_duplicates`
``missing``          :func:`find_missing`
``mixed_epoch``      :func:`find_mixed_epoch`
``pointer_changed``  :func:`find_pointer_changes`
``deadlock``         :func:`find_deadlock`
``unsafe_acceptance`` :func:`find_unsafe_acceptance`
``process_lost``     :func:`find_process_lost`
``restarted``        :func:`find_restarted`
``certificate_unsound`` :func:`find_certificate_unsound`
==================== =====================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from cutbench.errors import CutbenchError
from cutbench.harness.model.trial import FINDING_KINDS, OUTCOMES, Finding, TrialRecord, Verdict

# Decisions at the receiver that make an effect externally visible: applied
# (at_least_once, idempotent) or committed (fenced). Suppressed, prepared,
# aborted and rejected deliveries were recorded but are not visible.
APPLIED = ("applied", "committed")


# The receiver columns the findings read; an empty effects frame has exactly these.
EFFECT_COLUMNS: tuple[str, ...] = ("op_id", "digest", "decision", "attempt", "epoch")


def empty_effects() -> pd.DataFrame:
    """An effects frame with no rows and the columns the oracle reads."""
    return pd.DataFrame(columns=list(EFFECT_COLUMNS))


def visible(effects: pd.DataFrame | None) -> pd.DataFrame:
    """The receiver rows that made an effect visible (decision ``applied`` or ``committed``)."""
    if effects is None or effects.empty:
        return empty_effects()
    return effects[effects["decision"].isin(APPLIED)]


def applied_counts(effects: pd.DataFrame | None) -> pd.Series:
    """How many times each op was applied (visible) at the receiver, indexed by op."""
    rows = visible(effects)
    if rows.empty:
        return pd.Series(dtype="int64")
    return rows.groupby("op_id").size()


def find_duplicates(effects: pd.DataFrame | None) -> list[Finding]:
    """``duplicate``: an op whose effect became visible at the receiver more than once.

    Fires once per op with two or more rows whose decision is ``applied`` or
    ``committed``, whatever their attempt or epoch. A redelivery the receiver
    suppressed (``idempotent``) or aborted (``fenced``) is not visible and does
    not count: that is the receiver doing its job.
    """
    rows = visible(effects)
    out = []
    for op, group in rows.groupby("op_id", sort=True):
        if len(group) > 1:
            epochs = sorted({int(e) for e in group["epoch"]}) if "epoch" in group else []
            out.append(Finding("duplicate", int(op), f"applied {len(group)} times (epochs {epochs})"))
    return out


def find_missing(effects: pd.DataFrame | None, committed: int) -> list[Finding]:
    """``missing``: an op ``i <= committed`` that has no visible row at the receiver.

    ``committed`` is :attr:`TrialRecord.committed_op`: the last op the workload itself
    considers done. A workload commits op *i* only after the receiver
    acknowledged it, so a committed op absent from the store is an
    acknowledged effect that was lost, or one the workload believed it had
    sent and never did. Ops after ``committed`` are not judged (the workload
    may legitimately not have reached them).
    """
    counts = applied_counts(effects)
    return [Finding("missing", op, "committed by the workload, never applied") for op in range(1, committed + 1) if counts.get(op, 0) == 0]


def find_mixed_epoch(effects: pd.DataFrame | None, report: dict[str, Any] | None, reference: Any) -> list[Finding]:
    """``mixed_epoch``: state observed at one moment that comes from two.

    Fires when

    * a visible effect of op *i* carries a payload ≠ ``reference.payload(i)``
      (it was computed from state of another op, e.g. the previous one);
    * the final state checksum ``report["checksum"]`` ≠
      ``reference.checksum(report["host_op"])``: device/host state and the
      host's op counter disagree at the end;
    * the report's own domains disagree: ``report["domain_ops"]`` (op reached
      by each state domain at the end) has more than one value;
    * at a resume: an entry of ``report["resumes"]`` (one per restore the
      workload noticed, each ``{"epoch": e, "domain_ops": {domain: op}}``)
      has domains at different ops — the restored process came back with,
      say, the device at op 4 and the host at op 3.
    """
    out: list[Finding] = []
    rows = visible(effects)
    if not rows.empty:
        for op, digest in rows[["op_id", "digest"]].drop_duplicates().itertuples(index=False):
            expected = reference.payload(int(op))
            if digest != expected:
                out.append(Finding("mixed_epoch", int(op), f"payload {str(digest)[:12]}… ≠ reference {expected[:12]}…"))
    if report is None:
        return out
    host_op = int(report.get("host_op", 0))
    checksum = report.get("checksum")
    if checksum is not None and checksum != reference.checksum(host_op):
        out.append(Finding("mixed_epoch", host_op, f"final state checksum ≠ reference after host op {host_op}"))
    domain_ops = report.get("domain_ops") or {}
    if len(set(domain_ops.values())) > 1:
        out.append(Finding("mixed_epoch", host_op, f"domains at different ops at the end: {domain_ops}"))
    for resume in report.get("resumes") or ():
        ops = resume.get("domain_ops") or {}
        if len(set(ops.values())) > 1:
            first = min(int(v) for v in ops.values())
            out.append(Finding("mixed_epoch", first, f"domains at different ops at resume (epoch {resume.get('epoch')}): {ops}"))
    return out


def find_pointer_changes(report: dict[str, Any] | None) -> list[Finding]:
    """``pointer_changed``: pointer identity did not survive the restore.

    Fires for every buffer name in ``report["pointers_initial"]`` (addresses
    recorded before any cut) whose address in ``report["pointers_final"]``
    differs or is absent, and when the workload's device-side pointer table
    (addresses stored in device memory and traversed there) no longer
    verifies: ``report["pointer_table_ok"] is False``. No report, nothing to judge.
    """
    if report is None:
        return []
    before = report.get("pointers_initial") or {}
    after = report.get("pointers_final") or {}
    out = [
        Finding("pointer_changed", None, f"{name}: {before[name]:#x} → {after[name]:#x}" if name in after else f"{name}: {before[name]:#x} → gone")
        for name in sorted(before)
        if after.get(name) != before[name]
    ]
    if report.get("pointer_table_ok") is False:
        out.append(Finding("pointer_changed", None, "device-side pointer table no longer verifies"))
    return out


def find_deadlock(trial: TrialRecord) -> list[Finding]:
    """``deadlock``: no progress within the watchdog after a cut.

    Fires when the runner's status is ``deadlock`` — its watchdog saw no cut
    point passed for ``watchdog_s`` while the workload had not finished — and
    at least one cut was carried out (``cut_outcomes`` not empty): the hang
    is the recovery's. Typical cause: after a restore a peer waits for a
    message that the restored process believes it already sent, and the
    restored process waits for the peer's answer. ``progress_op`` /
    ``progress_phase`` say where the workload stood last.
    """
    if trial.status != "deadlock" or not trial.cut_outcomes:
        return []
    op = trial.progress_op
    where = f"{op}/{trial.progress_phase}" if trial.progress_phase else f"op {op}"
    after = f" after restore {trial.restores}" if trial.restores else ""
    why = trial.error or "no progress within the watchdog"
    return [Finding("deadlock", op, f"stalled at {where}{after}: {why}")]


def find_unsafe_acceptance(trial: TrialRecord) -> list[Finding]:
    """``unsafe_acceptance``: a restore went ahead although a domain the workload uses is not covered.

    The workload declares the state domains it uses (``workload_domains``:
    cpu, cuda, peer, ipc, uvm, disk, receiver); the backend declares what a
    restore brings back (``covered_domains``). Fires when at least one restore
    was accepted (``restores >= 1``) and a used domain other than the
    external ``receiver`` is not covered: the tool said yes where it should
    have refused. A refused cut never fires this.
    """
    if trial.restores == 0:
        return []
    uncovered = trial.uncovered_domains  # the receiver is judged by duplicate/missing instead
    if not uncovered:
        return []
    return [Finding("unsafe_acceptance", None, f"restored without covering {', '.join(uncovered)}")]


def find_process_lost(trial: TrialRecord) -> list[Finding]:
    """``process_lost``: a stage the checkpoint tool owns destroyed the application or its checkpoint.

    Fires when the runner's status is ``lost``: a backend stage failed and
    the application did not survive it — the process died during the dump or
    a CUDA call, was left LOCKED or CHECKPOINTED, or the checkpoint it
    reported as taken could not be restored. Distinct from ``refused`` (the
    tool declined and the application went on) and from ``unknown`` (the
    harness could not judge). ``failed_stage`` and ``error`` say which stage
    and in the tool's own words; the op is where the workload stood.
    """
    if trial.status != "lost":
        return []
    stage = trial.failed_stage or "a checkpoint stage"
    return [Finding("process_lost", trial.progress_op or None, f"{stage}: {trial.error}")]


def find_restarted(trial: TrialRecord) -> list[Finding]:
    """``restarted``: a restore was reported, but the execution started anew instead of continuing from the cut.

    Ground truth, not the tool's word: every workload process that begins at
    op 1 — neither a restored image nor an application-level resume — counts
    one ``fresh_starts``. A trial with a restore and more than one fresh start
    was begun again. For the ``restart`` baseline (a scheduler's requeue) this
    is its nature; for a checkpoint tool it is a defect. The op is where the
    workload stood at the end.
    """
    if trial.restores == 0 or trial.fresh_starts <= 1:
        return []
    again = trial.fresh_starts - 1
    return [Finding("restarted", None, f"the workload started from op 1 again {again} time{'s' * (again > 1)} "
                                       f"after {trial.restores} reported restore{'s' * (trial.restores > 1)}")]


def find_certificate_unsound(trial: TrialRecord, findings: list[Finding]) -> list[Finding]:
    """``certificate_unsound``: a restore the certificate called eligible, in a trial the other findings make invalid.

    The certificate is a claim and the oracle the ground truth: an eligible,
    restored cut followed by a duplicate, a missing op, a mixed epoch or any
    other finding means the certificate's rule missed something. ``findings``
    are the other finders' results for this trial.
    """
    if not findings:
        return []
    kinds = ", ".join(sorted({f.kind for f in findings}))
    return [Finding("certificate_unsound", None, f"cut {c.get('checkpoint')} was certified eligible and restored; the trial has {kinds}")
            for c in trial.certificates if c.get("eligible") and c.get("restored")]


# The finders, composed by ``judge``: each takes the trial's record, its
# effects and the workload's reference and returns its findings. One that
# raises makes the trial ``unknown`` (naming it), never ``valid``.
Finder = Callable[[TrialRecord, "pd.DataFrame | None", Any], list[Finding]]
FINDERS: tuple[tuple[str, Finder], ...] = (
    ("deadlock", lambda rec, effects, ref: find_deadlock(rec)),
    ("duplicate", lambda rec, effects, ref: find_duplicates(effects)),
    ("missing", lambda rec, effects, ref: find_missing(effects, rec.committed_op)),
    ("mixed_epoch", lambda rec, effects, ref: find_mixed_epoch(effects, rec.report, ref)),
    ("pointer_changed", lambda rec, effects, ref: find_pointer_changes(rec.report)),
    ("unsafe_acceptance", lambda rec, effects, ref: find_unsafe_acceptance(rec)),
    ("process_lost", lambda rec, effects, ref: find_process_lost(rec)),
    ("restarted", lambda rec, effects, ref: find_restarted(rec)),
)


def judge(trial: TrialRecord | dict[str, Any], effects: pd.DataFrame | None, reference: Any,
          finders: tuple[tuple[str, Finder], ...] = FINDERS) -> Verdict:
    """The verdict for one trial.

    ``trial`` is a :class:`TrialRecord` (or its stored dict form): ``status``
    (runner: ``completed``, ``deadlock``, ``refused``, ``lost`` or ``unknown``),
    ``report``, ``marker_op``, ``restores``, ``cut_outcomes``,
    ``workload_domains`` and ``covered_domains``; ``progress_op``,
    ``progress_phase`` and ``error`` feed details. ``effects`` are the
    receiver's rows for this trial (columns ``op_id``, ``digest``,
    ``decision``, ``epoch``). ``reference`` gives ``payload(i)`` and ``checksum(i)``.

    ``unknown`` whenever the runner could not finish the trial, for a hang in
    a trial where no cut was carried out (not a recovery failure), and when a
    finder raises.
    """
    try:
        rec = TrialRecord.from_dict(trial)
    except CutbenchError as exc:
        return Verdict("unknown", reason=f"checker: {exc}")
    if rec.status == "unknown":
        return Verdict("unknown", reason=rec.error)
    if rec.status == "deadlock" and not rec.cut_outcomes:
        return Verdict("unknown", reason=f"hang before any cut: {rec.error}")
    findings: list[Finding] = []
    for name, finder in finders:
        try:
            findings += finder(rec, effects, reference)
        except Exception as exc:  # a checker bug must not pass a trial
            return Verdict("unknown", reason=f"checker: finder {name} raised {type(exc).__name__}: {exc}")
    if findings:
        findings += find_certificate_unsound(rec, findings)
        return Verdict("invalid", tuple(findings))
    if rec.status == "refused":
        return Verdict("refused", reason=rec.error)
    return Verdict("valid")


__all__ = ["FINDERS", "FINDING_KINDS", "OUTCOMES", "Finding", "TrialRecord", "Verdict", "empty_effects", "judge"]
