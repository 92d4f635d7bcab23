"""The checker: a pure function from a trial's recorded data to a verdict.

Inputs are plain data — the trial record (runner status, the workload's final
report, the commit marker, declared domains, the backend's coverage), the
receiver's effects for the trial as a DataFrame, and the workload's
reference — so a stored run is re-analysed with the same verdict and every
finding is unit-testable without CRIU or a GPU.

Outcomes (as Jepsen's ``:valid?``): ``valid``; ``invalid`` (one finding or
more); ``refused`` (a stage declined cleanly and the workload went on);
``unknown`` (the harness or tool failed; never counted as valid).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

FINDING_KINDS: tuple[str, ...] = (
    "duplicate",
    "missing",
    "mixed_epoch",
    "pointer_changed",
    "deadlock",
    "unsafe_acceptance",
)
OUTCOMES: tuple[str, ...] = ("valid", "invalid", "refused", "unknown")

# Decisions at the receiver that make an effect externally visible.
APPLIED = ("applied", "committed")
# Domains that are the outside world by definition: no checkpoint covers the
# receiver; what it saw is judged by ``duplicate``/``missing`` instead.
EXTERNAL_DOMAINS = frozenset({"receiver"})


@dataclass(frozen=True)
class Finding:
    """One thing that went wrong: its kind, the op concerned (if any), and why."""

    kind: str
    op: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The outcome of a trial and the findings behind it."""

    outcome: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def counts(self) -> dict[str, int]:
        """Number of findings per kind (every kind present, zeros included)."""
        out = {k: 0 for k in FINDING_KINDS}
        for f in self.findings:
            out[f.kind] += 1
        return out


def applied_counts(effects: pd.DataFrame) -> pd.Series:
    """How many times each op was applied (visible) at the receiver, indexed by op."""
    if effects.empty:
        return pd.Series(dtype="int64")
    visible = effects[effects["decision"].isin(APPLIED)]
    return visible.groupby("op_id").size()


def find_duplicates(effects: pd.DataFrame) -> list[Finding]:
    """``duplicate``: an op applied (or committed) more than once at the receiver."""
    counts = applied_counts(effects)
    return [Finding("duplicate", int(op), f"applied {int(n)} times") for op, n in counts.items() if n > 1]


def find_missing(effects: pd.DataFrame, committed_op: int) -> list[Finding]:
    """``missing``: an op ≤ the workload's final committed op that was never applied.

    The workload only commits an op after the receiver acknowledged it, so a
    committed op absent from the store is an acknowledged effect that was lost.
    """
    counts = applied_counts(effects)
    return [Finding("missing", op, "committed by the workload, never applied") for op in range(1, committed_op + 1) if counts.get(op, 0) == 0]


def find_mixed_epoch(effects: pd.DataFrame, report: dict[str, Any] | None, reference: Any) -> list[Finding]:
    """``mixed_epoch``: state from two moments.

    Fires when an applied effect's payload differs from ``reference.payload(op)``
    (the effect was computed from state of another op), when the final device
    checksum differs from ``reference.checksum(host_op)`` (device and host
    counters disagree), or when the report's own per-domain epochs disagree
    (``report["domain_ops"]``, for workloads that keep several).
    """
    out: list[Finding] = []
    if not effects.empty:
        visible = effects[effects["decision"].isin(APPLIED)]
        for op, digest in visible[["op_id", "digest"]].drop_duplicates().itertuples(index=False):
            expected = reference.payload(int(op))
            if digest != expected:
                out.append(Finding("mixed_epoch", int(op), f"payload {digest[:12]}… ≠ reference {expected[:12]}…"))
    if report is not None:
        host_op = int(report.get("host_op", 0))
        checksum = report.get("checksum")
        if checksum is not None:
            expected = reference.checksum(host_op)
            if checksum != expected:
                out.append(Finding("mixed_epoch", host_op, f"device checksum ≠ reference after host op {host_op}"))
        domain_ops = report.get("domain_ops") or {}
        if len(set(domain_ops.values())) > 1:
            out.append(Finding("mixed_epoch", host_op, f"domains at different ops: {domain_ops}"))
    return out


def find_pointer_changes(report: dict[str, Any] | None) -> list[Finding]:
    """``pointer_changed``: a buffer address recorded before the cut differs after restore,
    or the workload's device-side pointer table no longer verifies (``report["pointer_table_ok"] is False``)."""
    if report is None:
        return []
    before = report.get("pointers_initial") or {}
    after = report.get("pointers_final") or {}
    out = [
        Finding("pointer_changed", None, f"{name}: {before[name]:#x} → {after.get(name, 0):#x}")
        for name in sorted(before)
        if after.get(name) != before[name]
    ]
    if report.get("pointer_table_ok") is False:
        out.append(Finding("pointer_changed", None, "device-side pointer table no longer verifies"))
    return out


def find_unsafe_acceptance(trial: dict[str, Any]) -> list[Finding]:
    """``unsafe_acceptance``: a restore went ahead although the workload uses a
    state domain the backend does not cover (external domains excluded)."""
    if int(trial.get("restores", 0)) == 0:
        return []
    used = set(trial.get("workload_domains", ())) - EXTERNAL_DOMAINS
    uncovered = sorted(used - set(trial.get("covered_domains", ())))
    if not uncovered:
        return []
    return [Finding("unsafe_acceptance", None, f"restored without covering {', '.join(uncovered)}")]


def judge(trial: dict[str, Any], effects: pd.DataFrame, reference: Any) -> Verdict:
    """The verdict for one trial.

    ``trial`` needs ``status`` (runner: ``completed``, ``deadlock``, ``refused``
    or ``unknown``), ``report`` (dict or None), ``marker_op``, ``restores``,
    ``workload_domains`` and ``covered_domains``. ``effects`` are the
    receiver's rows for this trial (columns ``op_id``, ``digest``, ``decision``).
    """
    status = trial.get("status")
    if status == "unknown":
        return Verdict("unknown")
    report = trial.get("report")
    findings: list[Finding] = []
    if status == "deadlock":
        findings.append(Finding("deadlock", trial.get("progress_op"), trial.get("error") or "no progress within the watchdog"))
    committed = int(report["host_op"]) if report else int(trial.get("marker_op") or 0)
    findings += find_duplicates(effects)
    findings += find_missing(effects, committed)
    findings += find_mixed_epoch(effects, report, reference)
    findings += find_pointer_changes(report)
    findings += find_unsafe_acceptance(trial)
    if findings:
        return Verdict("invalid", tuple(findings))
    if status == "refused":
        return Verdict("refused")
    if status != "completed":
        return Verdict("unknown")
    return Verdict("valid")
