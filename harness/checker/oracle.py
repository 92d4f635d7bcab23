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

The effect finders work on whole columns of the effects table (a trial of a
million effects is judged in about a second); ``per_op`` holds the same
definitions as plain loops, and the tests hold the two to the same findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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


# The effect finders below read the visible rows column by column: masking a
# whole stored effects table (fourteen columns, a million rows) costs more than
# the finders themselves. Each reads its columns in the order the plain
# definitions do, so a table lacking one raises the same KeyError (and the
# trial is ``unknown`` for the same reason).


def _visible_mask(effects: pd.DataFrame) -> np.ndarray:
    """Which rows of ``effects`` made an effect visible (see :func:`visible`)."""
    return effects["decision"].isin(APPLIED).to_numpy(dtype=bool)


def _is_int(dtype: Any) -> bool:
    return isinstance(dtype, np.dtype) and dtype.kind in "iu"


def _ints(values: pd.Series) -> np.ndarray:
    """``values`` as Python's ``int()`` reads them: one C pass for an integer column, ``int()`` per value otherwise."""
    if _is_int(values.dtype):
        return values.to_numpy()
    # Floats truncate, NaN raises ValueError, exactly as int() does (the store writes int64; this is the rare path).
    return np.fromiter(map(int, values), dtype=object, count=len(values))


def _differs(digests: pd.Series, expected: list[Any], codes: np.ndarray) -> np.ndarray:
    """Row by row, ``digests[i] != expected[codes[i]]`` as Python's ``!=`` answers it."""
    dtype = digests.dtype
    if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow" and getattr(dtype, "na_value", None) is np.nan:
        # The store's text columns are Arrow strings: compare them in Arrow rather than
        # make a Python object of every digest. A missing digest (NaN) differs from
        # any payload, as NaN != "…" does.
        have = pa.array(digests.array)
        try:
            want = pa.array(expected, type=have.type)
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            want = None  # a reference that answers with something other than text: compare as Python objects
        if want is not None:
            return pc.fill_null(pc.not_equal(have, want.take(pa.array(codes))), True).to_numpy(zero_copy_only=False)
    return digests.to_numpy(dtype=object) != np.fromiter(expected, dtype=object, count=len(expected))[codes]


def find_duplicates(effects: pd.DataFrame | None) -> list[Finding]:
    """Find ``duplicate``: an op whose effect became visible at the receiver more than once.

    Fires once per op with two or more rows whose decision is ``applied`` or
    ``committed``, whatever their attempt or epoch. A redelivery the receiver
    suppressed (``idempotent``) or aborted (``fenced``) is not visible and does
    not count: that is the receiver doing its job. Findings come in op order;
    the detail gives the count and the sorted epochs of the visible rows, and
    the incarnations that sent them where the table says (``sender`` ≥ 0).
    """
    if effects is None or effects.empty:
        return []
    mask = _visible_mask(effects)
    ops = effects["op_id"][mask]
    # Only ops seen twice or more matter (``duplicated``: one hashing pass); rows without an op belong to none.
    again = ops.duplicated(keep=False).to_numpy() & ops.notna().to_numpy()
    if not again.any():
        return []
    dup = pd.DataFrame({"op_id": ops.to_numpy()[again]})
    sizes = dup.groupby("op_id", sort=True).size()
    if "epoch" not in effects:
        return [Finding("duplicate", int(op), f"applied {n} times (epochs [])") for op, n in sizes.items()]
    epochs = _distinct_per_op(dup.assign(value=_ints(effects["epoch"][mask][again])))
    # Who sent each copy, where the clients said (a resend after a restore keeps the op's epoch, not its sender's).
    sent = (_distinct_per_op(dup.assign(value=_ints(effects["sender"][mask][again].fillna(-1))))
            if "sender" in effects else [[] for _ in epochs])
    return [Finding("duplicate", int(op), f"applied {n} times (epochs {e}"
                    + (f"; sent by incarnations {by})" if (by := [x for x in s if x >= 0]) else ")"))
            for (op, n), e, s in zip(sizes.items(), epochs, sent, strict=True)]


def _distinct_per_op(rows: pd.DataFrame) -> list[list[int]]:
    """Per op of ``rows`` (columns ``op_id``, ``value``), in op order, the sorted distinct values (Python ints)."""
    pairs = rows.drop_duplicates().sort_values(["op_id", "value"], kind="stable")
    op_of = pairs["op_id"].to_numpy()
    bounds = [0, *(np.flatnonzero(op_of[1:] != op_of[:-1]) + 1).tolist(), len(op_of)]
    values = [int(v) for v in pairs["value"].tolist()]
    return [values[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def find_missing(effects: pd.DataFrame | None, committed: int) -> list[Finding]:
    """Find ``missing``: an op ``i <= committed`` that has no visible row at the receiver.

    ``committed`` is :attr:`TrialRecord.committed_op`: the last op the workload itself
    considers done. A workload commits op *i* only after the receiver
    acknowledged it, so a committed op absent from the store is an
    acknowledged effect that was lost, or one the workload believed it had
    sent and never did. Ops after ``committed`` are not judged (the workload
    may legitimately not have reached them). Findings come in op order.
    """
    present = np.empty(0, dtype="int64")
    if effects is not None and not effects.empty:
        mask = _visible_mask(effects)
        if mask.any():
            present = effects["op_id"].to_numpy()[mask]
    if committed < 1:
        return []
    wanted = np.arange(1, committed + 1)
    lost = wanted[~pd.Index(wanted).isin(present)]
    return [Finding("missing", op, "committed by the workload, never applied") for op in lost.tolist()]


def payload_mismatches(effects: pd.DataFrame | None, reference: Any) -> list[Finding]:
    """The effect half of ``mixed_epoch``: a visible effect of op *i* whose payload ≠ ``reference.payload(i)``.

    One finding per distinct (op, payload) pair that differs, in the order the
    pairs first arrived at the receiver. ``reference.payload`` is asked once per
    distinct op, in the same order. A visible row without an op makes the
    finder raise (the trial is ``unknown``), as ``int()`` of it does.
    """
    if effects is None or effects.empty:
        return []
    mask = _visible_mask(effects)
    if not mask.any():
        return []
    rows = effects[["op_id", "digest"]][mask]
    no_op = rows["op_id"].isna().to_numpy()
    if no_op.any():
        # Judged pair by pair, the rows before the first one without an op would be
        # checked first, and could raise first: check them, then fail on that row.
        at = int(no_op.argmax())
        _payload_mismatches(rows.iloc[:at], reference)
        int(rows["op_id"].iloc[at])  # raises: a missing value is no op
    return _payload_mismatches(rows, reference)


def _payload_mismatches(rows: pd.DataFrame, reference: Any) -> list[Finding]:
    """:func:`payload_mismatches` over visible ``op_id``/``digest`` rows that all have an op."""
    codes, ops = pd.factorize(rows["op_id"])  # ops in order of first arrival
    # The reference is a plain Python object: one call per distinct op, in C's loop rather than Python's.
    keys = ops.tolist() if _is_int(ops.dtype) else map(int, ops)
    expected = list(map(reference.payload, keys))
    differs = _differs(rows["digest"], expected, codes)
    if not differs.any():
        return []
    # A pair differs or not as a whole, so the first row of each differing pair keeps the pairs' arrival order.
    bad = rows[differs]
    first = ~bad.duplicated().to_numpy()
    return [Finding("mixed_epoch", int(op), f"payload {str(digest)[:12]}… ≠ reference {want[:12]}…")
            for op, digest, want in zip(bad["op_id"].to_numpy()[first].tolist(), bad["digest"].to_numpy(dtype=object)[first],
                                        [expected[c] for c in codes[differs][first].tolist()], strict=True)]


def state_mismatches(report: dict[str, Any] | None, reference: Any) -> list[Finding]:
    """The report half of ``mixed_epoch``: final checksum, domains at the end and at each resume (see :func:`find_mixed_epoch`)."""
    if report is None:
        return []
    out: list[Finding] = []
    host_op = int(report.get("host_op", 0))
    checksum = report.get("checksum")
    if checksum is not None and checksum != reference.checksum(host_op):
        # A program's artefacts compared by a callable and found apart say how far each is from the reference's.
        apart = "; ".join(f"{name}: {said}" for name, said in (report.get("artefacts") or {}).items())
        out.append(Finding("mixed_epoch", host_op, f"final state checksum ≠ reference after host op {host_op}"
                                                   + (f" ({apart})" if apart else "")))
    domain_ops = report.get("domain_ops") or {}
    if len(set(domain_ops.values())) > 1:
        out.append(Finding("mixed_epoch", host_op, f"domains at different ops at the end: {domain_ops}"))
    for resume in report.get("resumes") or ():
        ops = resume.get("domain_ops") or {}
        if len(set(ops.values())) > 1:
            first = min(int(v) for v in ops.values())
            out.append(Finding("mixed_epoch", first, f"domains at different ops at resume (epoch {resume.get('epoch')}): {ops}"))
    return out


def find_mixed_epoch(effects: pd.DataFrame | None, report: dict[str, Any] | None, reference: Any) -> list[Finding]:
    """Find ``mixed_epoch``: state observed at one moment that comes from two.

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

    Payload findings (:func:`payload_mismatches`) come first, then the report's
    (:func:`state_mismatches`).
    """
    return payload_mismatches(effects, reference) + state_mismatches(report, reference)


def find_pointer_changes(report: dict[str, Any] | None) -> list[Finding]:
    """Find ``pointer_changed``: pointer identity did not survive the restore.

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
    """Find ``deadlock``: no progress within the watchdog after a cut.

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
    """Find ``unsafe_acceptance``: a restore went ahead although a domain the workload uses is not covered.

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
    """Find ``process_lost``: a stage the checkpoint tool owns destroyed the application or its checkpoint.

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
    """Find ``restarted``: a restore was reported, but the execution started anew instead of continuing from the cut.

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
    """Find ``certificate_unsound``: a restore the certificate called eligible, in a trial the other findings make invalid.

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


def _named(findings: list[Finding], reference: Any) -> list[Finding]:
    """``findings`` with each op's identity appended where the reference names it (a program's effect:
    "stream#index"); unchanged for a workload's ops."""
    describe = getattr(reference, "describe", None)
    if not callable(describe):
        return findings
    out = []
    for f in findings:
        # Only findings about one effect: a duplicate, a missing one, a payload (not the final state, nor where
        # a lost or stalled program stood).
        about_effect = f.kind in ("duplicate", "missing") or (f.kind == "mixed_epoch" and f.detail.startswith("payload"))
        what = describe(f.op) if about_effect and f.op is not None else ""
        out.append(replace(f, detail=f"{f.detail} [{what}]") if what else f)
    return out


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
        findings = _named(findings, reference)
        findings += find_certificate_unsound(rec, findings)
        return Verdict("invalid", tuple(findings))
    if rec.status == "refused":
        return Verdict("refused", reason=rec.error)
    return Verdict("valid")


__all__ = ["FINDERS", "FINDING_KINDS", "OUTCOMES", "Finding", "TrialRecord", "Verdict", "empty_effects", "judge"]
