"""The certified coordinator: effect fences and recovery-cut certificates for one trial.

Two jobs, both at the cut's stage boundaries (the nemesis pipeline calls the
:class:`~cutbench.harness.nemesis.base.Certifier` of each cut):

- **Effect fences** (``fenced`` receivers, output commit): once a cut has a
  restorable image, the receiver's fence advances to the last effect the
  checkpointed process had sent and those prepared effects commit; before a
  restore, what the rolled-back process prepared after the cut is aborted
  (the restored process prepares it again); when the trial ends, the fence
  moves to the last effect sent and the rest commits. This runs whatever
  ``pipeline.certify`` says: a fenced receiver releases nothing otherwise.
- **Certificates** (``pipeline.certify`` = ``audit`` or ``enforce``): the
  evidence of each cut (positions at each capture stage, what had been sent
  and acknowledged, what the receiver shows at the restore decision) goes
  through :func:`cutbench.harness.model.certificate.certify`. ``enforce``
  refuses an ineligible cut as early as the evidence allows: before anything
  is touched (an uncovered domain), at the capture stage that breaks the
  epoch (the backend undoes its stages), or at the restore decision (the
  restore is declined and the crashed workload stays down). ``audit``
  records and restores anyway, so the oracle's verdict can be set against
  the claim.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from cutbench.errors import HarnessFault, StageRefused
from cutbench.harness.model.certificate import (CERTIFY_OFF, Certificate, Evidence, Position, certify, epoch_steps,
                                                in_flight_candidates)
from cutbench.harness.model.plan import Cut
from cutbench.receivers.client import workload_client_name

# How long a commit waits for its prepared delivery to be stored: the
# workload sent it before the cut, but on another connection.
COMMIT_WAIT_S = 2.0
# How long a restore waits for the receiver to read a crashed incarnation's last frames (milliseconds, usually).
SETTLE_S = 10.0
VISIBLE = ("applied", "committed")


class TrialCoordinator:
    """Fences and certificates of one trial; the runner makes one per trial."""

    def __init__(self, client: Any, receiver_trial: str, mode: str, certify_mode: str, control: Any,
                 phases: tuple[str, ...], workload_domains: tuple[str, ...], covers: tuple[str, ...], *,
                 features: tuple[str, ...] = (), support: dict[str, dict[str, tuple[str, str]]] | None = None):
        self.client = client
        self.trial = receiver_trial
        self.mode = mode
        self.certify_mode = certify_mode
        self.control = control
        self.phases = phases
        self.workload_domains = workload_domains
        self.covers = covers
        # The CUDA features the workload declares, and what the support matrix says of them ({fault: {feature: ...}}).
        self.features = features
        self.support = support or {}
        self.fence = 0
        self.commit_times: dict[int, float] = {}  # op -> wall time its commit was acknowledged
        self.certificates: list[dict[str, Any]] = []

    def for_cut(self, index: int, cut: Cut) -> "CutCertifier":
        """The certifier of cut ``index``. With nothing to fence or certify it only gathers
        the cut's evidence (positions, effects sent and acknowledged), which reading the
        control file costs; the search's signals are made of it."""
        return CutCertifier(self, index, cut)

    def evidence_of(self, certifier: "CutCertifier") -> dict[str, Any]:
        """The cut's evidence as stored in the trial record (``cut_evidence``)."""
        ev = certifier.evidence
        out = {"checkpoint": ev.checkpoint, "positions": {k: p.label() for k, p in ev.positions.items()},
               "sent_through": ev.sent_through, "acked_through": ev.acked_through,
               "epoch_steps": epoch_steps(list(ev.positions.values()), self.phases)}
        if certifier.said:
            out["adapters"] = dict(certifier.said)
            unjoined = sorted(set(certifier.said) - set(ev.adapters))
            if unjoined:
                out["not_joined"] = unjoined  # said ready, but the cut did not hold them (or restored failed)
        if ev.classified:
            out["classified"] = {str(k): v for k, v in sorted(ev.classified.items())}
        if certifier.unclassified:
            out["unclassified"] = certifier.unclassified
        return out

    # -- effect fences ---------------------------------------------------------------
    def advance_fence(self, through: int) -> None:
        """Fenced receivers: fence at ``through`` and commit every open prepared effect up to it."""
        if self.mode != "fenced" or through <= 0:
            return
        if through > self.fence:
            self.client.fence(self.trial, through)
            self.fence = through
        for op in _open_prepared(self._rows(), upto=self.fence):
            self._commit(op)

    def finish(self) -> None:
        """At the end of the trial: fence at the last effect sent and commit what is still prepared."""
        if self.mode == "fenced":
            self.advance_fence(max(self.fence, self.control.get("sent_effect")))

    def restore_view(self, certifying: bool, *, ran_on: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Before a restore, from one read of the receiver: the ops a fenced receiver had open from the
        current (rolled-back) incarnation, now aborted, and (when certifying) the ops visible. ``ran_on``: that
        incarnation ran on after the cut and was crashed, so the read waits for its last frames (:meth:`settle`)."""
        if ran_on and (self.mode == "fenced" or certifying):
            self.settle()
        rows = self._rows() if self.mode == "fenced" or certifying else None
        aborted: tuple[int, ...] = ()
        if self.mode == "fenced":
            epoch = self.control.get("incarnation")
            aborted = tuple(_open_prepared(rows, upto=None, epoch=epoch))
            if aborted:
                self.client.abort(self.trial, from_epoch=epoch)
        visible = _visible(rows) if certifying else ()
        return aborted, visible

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Wait until the receiver has stored every frame of the trial's crashed workload: no connection of its
        name is open (every frame read and its write queued), then a write of the harness's own, queued after them,
        is acknowledged. A crashed process's last effects can sit in its socket's buffer after its death; read
        before they are stored, an effect it sent would look unsent, and its resend would be certified.
        Raises :class:`~cutbench.errors.HarnessFault` when the connection stays open ``timeout_s``."""
        name = workload_client_name(self.trial)
        deadline = time.monotonic() + timeout_s
        while name in self.client.clients():
            if time.monotonic() > deadline:
                raise HarnessFault("restore", f"the receiver still held the crashed workload's connection after "
                                              f"{timeout_s:.0f} s: what it sent last cannot be read")
            time.sleep(0.005)
        self.client.open_trial(self.trial, self.mode)  # a no-op write: its ack follows the queued ones' storing

    def _rows(self) -> Any:
        return self.client.export(self.trial)

    def _commit(self, op: int) -> None:
        deadline = time.monotonic() + COMMIT_WAIT_S
        while True:
            ack = self.client.commit(self.trial, op)
            if ack.get("decision") == "committed":
                self.commit_times.setdefault(op, time.time())
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"fenced commit of op {op} refused: {ack.get('reason')}")
            time.sleep(0.01)

    def release_latencies(self, effects: Any) -> list[float]:
        """Seconds from each committed effect's arrival (prepare) to its commit."""
        if effects is None or effects.empty or not self.commit_times:
            return []
        rows = effects[effects["decision"] == "committed"]
        return [max(0.0, self.commit_times[int(r.op_id)] - float(r.received_at))
                for r in rows.itertuples() if int(r.op_id) in self.commit_times]


def _open_prepared(rows: Any, upto: int | None, epoch: int | None = None) -> list[int]:
    """Ops of the receiver ``rows`` with a prepared delivery not yet committed (up to ``upto``, of ``epoch`` or later)."""
    if rows.empty:
        return []
    done = set(rows.loc[rows["decision"] == "committed", "op_id"])
    open_ = rows[(rows["decision"] == "prepared") & ~rows["op_id"].isin(done)]
    if upto is not None:
        open_ = open_[open_["op_id"] <= upto]
    if epoch is not None:
        open_ = open_[open_["epoch"] >= epoch]
    return sorted(int(op) for op in set(open_["op_id"]))


def _visible(rows: Any) -> tuple[int, ...]:
    """Ops whose effect the receiver ``rows`` show as visible (applied or committed)."""
    return tuple(sorted(int(op) for op in set(rows.loc[rows["decision"].isin(VISIBLE), "op_id"]))) if not rows.empty else ()


class CutCertifier:
    """The certifier of one cut (the pipeline's :class:`~cutbench.harness.nemesis.base.Certifier`)."""

    def __init__(self, coordinator: TrialCoordinator, index: int, cut: Cut):
        self.co = coordinator
        self.cut = cut
        self.evidence = Evidence(
            checkpoint=index, phases=coordinator.phases, workload_domains=coordinator.workload_domains,
            covers=coordinator.covers, receiver_mode=coordinator.mode,
            reconnects=cut.fault == "leave_running",  # CRIU restores a closed connection then
            in_place=cut.fault == "none",
            features=coordinator.features, support=dict(coordinator.support.get(cut.fault, {})),
        )
        self.certificate: Certificate | None = None
        # The restore decision waits for the restored process's adapters to classify the effects in flight.
        self.deferred = False
        self.unclassified = ""  # why the adapters gave no classification ("" when they gave one or none was asked)
        self.said: dict[str, str] = {}  # every adapter's state at prepare, joined or not
        self.parked = True

    @property
    def enforcing(self) -> bool:
        return self.co.certify_mode == "enforce"

    @property
    def certifying(self) -> bool:
        return self.co.certify_mode != CERTIFY_OFF

    def precheck(self) -> str | None:
        """Refuse before anything is touched when a domain is outside every image (enforce)."""
        if not self.certifying:
            return None
        self._device_domain()
        cert = certify(self.evidence)
        if cert.unknown and self.enforcing:
            self._record(cert, decided=True)
            return f"certificate: {cert.reason}"
        return None

    def joined(self, joined: Any, *, parked: bool = True) -> None:
        """What the workload's semantic adapters said at prepare (a :class:`~cutbench.harness.nemesis.adapters.Joined`):
        the domains that joined this cut count as covered; ``parked``: the restored process will be parked
        at the cut, so the restore decision may wait for its adapters' classification."""
        self.evidence.adapters = dict(joined.states)
        self.said = dict(joined.said)
        self.parked = parked

    def captured(self, stage: str, *, op: int | None = None, phase: str | None = None) -> None:
        """Record the workload's position at capture stage ``stage``; under enforce, refuse an incompatible epoch."""
        c = self.co.control
        if op is None:
            idx = c.get("progress_phase")
            op = c.get("progress_op")
            phase = self.co.phases[idx] if c.get("progress_count") and 0 <= idx < len(self.co.phases) else ""
        sent = c.get("sent_effect")
        self._device_domain()
        self.evidence.positions[stage] = Position(int(op), phase or "")
        # An explicit position (an application save) covers the effects up to its op only.
        self.evidence.sent_through = min(sent, int(op)) if phase == "" and stage == "app_save" else sent
        self.evidence.acked_through = min(c.get("acked_effect"), self.evidence.sent_through)
        if self.enforcing and len(self.evidence.positions) > 1:
            cert = certify(self.evidence)
            if not cert.eligible:
                self._record(cert, decided=True)
                raise StageRefused("certify", f"certificate: {cert.reason}")

    def checkpointed(self) -> None:
        """A restorable image exists: advance the fence to what it had sent; certify a cut no restore follows."""
        if not self.evidence.positions:  # a backend with no capture stage: its position is now
            self.captured("checkpoint")
        self.co.advance_fence(self.evidence.sent_through)
        if self.cut.fault == "none" and self.certifying:
            self._record(certify(self.evidence), decided=False)

    def before_restore(self) -> str | None:
        """After the fault: abort what the rolled-back process prepared, gather the receiver's view, decide."""
        self.evidence.aborted, self.evidence.visible = self.co.restore_view(
            self.certifying, ran_on=self.cut.fault == "leave_running")
        if not self.certifying:
            return None
        self.evidence.restore_decided = True
        cert = certify(self.evidence)
        if not cert.eligible and self.evidence.adapters and self.parked:
            # Only effects in flight stand in the way: the restored process's adapters may know them delivered.
            hopeful = replace(self.evidence, classified={op: "committed" for op in in_flight_candidates(self.evidence)})
            if certify(hopeful).eligible:
                self.deferred = True
                return None
        self._record(cert, decided=True)
        if self.enforcing and not cert.eligible:
            return f"certificate: {cert.reason}"
        return None

    def in_flight(self) -> list[int]:
        """The effect ids the restored process's adapters are asked to classify (none unless the decision waits)."""
        return in_flight_candidates(self.evidence) if self.deferred else []

    def after_restore(self, restored: Any) -> str | None:
        """What the restored process's adapters did (a :class:`~cutbench.harness.nemesis.adapters.Restored`):
        a failed ``restored`` takes their domains out of the cut (nothing brought them back) and re-decides;
        a deferred restore is decided on their classification. The refusal reason under enforce, else None."""
        if restored.failed and self.evidence.adapters:
            self.evidence.adapters = {}
            self.unclassified = f"restored failed: {restored.failed}"
            if self.certifying:
                self.evidence.classified = {}
                cert = certify(self.evidence)
                cert = replace(cert, reason=f"{cert.reason} (the adapters' restored failed: {restored.failed})")
                self._record(cert, decided=True, replace_last=not self.deferred)
                self.deferred = False
                return f"certificate: {cert.reason}" if self.enforcing and not cert.eligible else None
        if not self.deferred:
            return None
        if isinstance(restored.classes, str):
            self.unclassified = restored.classes
        else:
            self.evidence.classified = dict(restored.classes)
        cert = certify(self.evidence)
        if self.unclassified:
            cert = replace(cert, reason=f"{cert.reason} (the adapters gave no classification: {self.unclassified})")
        self._record(cert, decided=True)
        if self.enforcing and not cert.eligible:
            return f"certificate: {cert.reason}"
        return None

    def _device_domain(self) -> None:
        """A workload whose arrays are on the GPU (it says so at start) uses the ``cuda`` domain too."""
        if self.co.control.get("on_device") and "cuda" not in self.evidence.workload_domains:
            self.evidence.workload_domains += ("cuda",)

    def _record(self, cert: Certificate, *, decided: bool, replace_last: bool = False) -> None:
        if replace_last and self.certificate is not None and self.co.certificates:
            self.co.certificates.pop()  # this cut's earlier decision, now re-made
        self.certificate = cert
        self.co.certificates.append({**cert.to_dict(), "certify": self.co.certify_mode, "restore_decided": decided,
                                     "restored": False})

    def restored(self) -> None:
        """The pipeline restored this cut: mark its certificate."""
        if self.certificate is not None and self.co.certificates:
            self.co.certificates[-1]["restored"] = True


__all__ = ["CutCertifier", "TrialCoordinator"]
