"""Known-bad workload variants and their correct twins: the sensitivity suite's ground truth.

Each pair computes exactly what ``counter`` computes (same parameters, same
reference), shares its phases, and differs in one recovery decision, so the
same cut plans run on both: the bad variant has one realistic recovery bug
that a matching cut exposes; the twin makes the same decision correctly and
must give zero findings. If the benchmark stops catching a bad variant, the
benchmark has lost sensitivity.

========================== ============== ============================================ =================
bad variant                twin           bug                                          finding
========================== ============== ============================================ =================
``outbox_mark_before_send`` ``outbox``     marks an op sent in its durable outbox       ``missing``
                                          before sending; after a restore it trusts
                                          the mark and skips the send
``resend_stale_digest``    ``resend``     after a restore inside an op, recomputes     ``mixed_epoch``
                                          the effect from the snapshot taken at the
                                          op's start: the previous op's state
``restore_hook_realloc``   ``restore_hook`` re-allocates its state buffer when it        ``pointer_changed``
                                          notices a restore
``echo_peer_noseq``        ``echo_peer``  peer protocol without sequence numbers       ``deadlock``
                                          (:mod:`cutbench.workloads.echo_peer`)
========================== ============== ============================================ =================

A workload notices a restore through ``rt.epoch``, which the harness bumps
before the restored process runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import Counter, digest
from cutbench.workloads.runtime import read_marker, write_marker


# -- outbox: a durable "already sent" mark consulted after a restore ----------


class Outbox(Counter):
    """Correct twin: marks an op in its durable outbox only once the receiver acknowledged it as delivered.

    Right after a restore (the first cut point the restored process passes)
    it reads the outbox and from then on skips sending ops the outbox says
    were delivered: with the mark written after the ack, a skipped op was
    really delivered. (An effect already in flight at the cut is still
    resent by the receiver client; under ``at_least_once`` that shows as a
    duplicate, as for ``counter``.)
    """

    name: ClassVar[str] = "outbox"
    phases: ClassVar[tuple[str, ...]] = ("admit", "launch", "device_done", "record", "outbox", "publish", "ack", "commit")
    mark_before_send: ClassVar[bool] = False

    def setup(self) -> None:
        """Counter's setup, plus the outbox path and the epoch the outbox was last read in."""
        super().setup()
        self.outbox = Path(self.rt.config.marker_path).with_name("outbox")
        self.checked_epoch = self.rt.epoch
        self.delivered = 0  # ops up to here are known delivered (read from the outbox after a restore)

    def on_point(self) -> None:
        """After a restore: learn from the durable outbox what was already delivered."""
        if self.rt.epoch != self.checked_epoch:
            self.checked_epoch = self.rt.epoch
            self.delivered = read_marker(self.outbox)

    def run_op(self, op: int) -> None:
        """Compute, (bad: mark,) publish unless the outbox says delivered, (twin: mark,) commit."""
        rt = self.rt
        self.compute(op)
        if self.mark_before_send:
            write_marker(self.outbox, op)
        self.point(op, "outbox")
        if op <= self.delivered:
            rt.log(f"op {op}: outbox says delivered, not sending")
            self.point(op, "publish")
            self.point(op, "ack")
        else:
            rt.receiver.send_effect(rt.trial, op, rt.epoch, self.last_digest)
            self.point(op, "publish")
            ack = rt.receiver.wait_ack(op)
            # A fenced receiver's ack says "prepared": not delivered until the
            # coordinator commits it, so it is no reason to skip a resend.
            if not self.mark_before_send and ack.get("decision") != "prepared":
                write_marker(self.outbox, op)
            self.point(op, "ack")
        self.commit(op)


class OutboxMarkBeforeSend(Outbox):
    """Known bad: marks the op delivered *before* sending it. A cut between the
    mark and the send, then a restore, makes it skip the send: ``missing``."""

    name: ClassVar[str] = "outbox_mark_before_send"
    mark_before_send: ClassVar[bool] = True


# -- resend: recomputing an op's effect after a restore -----------------------


class Resend(Counter):
    """Correct twin: when a restore lands inside an op, it recomputes the op's
    effect from the current state before publishing."""

    name: ClassVar[str] = "resend"
    phases: ClassVar[tuple[str, ...]] = PHASES
    stale: ClassVar[bool] = False

    def run_op(self, op: int) -> None:
        """Snapshot, compute; if restored meanwhile, recompute the payload; publish, commit."""
        started_epoch = self.rt.epoch
        snapshot = self.state.copy()  # the state before this op: the previous op's state
        self.compute(op)
        payload = self.last_digest
        if self.rt.epoch != started_epoch:
            payload = digest(self.xp, snapshot if self.stale else self.state)
        self.deliver(op, payload)
        self.commit(op)


class ResendStaleDigest(Resend):
    """Known bad: after a restore inside an op it recomputes the effect from the
    snapshot taken at the op's start — a digest of the previous op's state: ``mixed_epoch``."""

    name: ClassVar[str] = "resend_stale_digest"
    stale: ClassVar[bool] = True


# -- restore hook: what a workload does when it notices a restore -------------


class RestoreHook(Counter):
    """Correct twin: notices every restore (``rt.epoch``) and keeps using its buffers."""

    name: ClassVar[str] = "restore_hook"
    phases: ClassVar[tuple[str, ...]] = PHASES
    realloc: ClassVar[bool] = False

    def setup(self) -> None:
        """Counter's setup, plus the epoch last seen."""
        super().setup()
        self.seen_epoch = self.rt.epoch
        self.restores_seen = 0
        self._retired: list[Any] = []

    def on_point(self) -> None:
        """Once per restore noticed; the bad variant re-allocates its state buffer here."""
        if self.rt.epoch == self.seen_epoch:
            return
        self.seen_epoch = self.rt.epoch
        self.restores_seen += 1
        if self.realloc:
            # Keep the old buffer alive so the copy cannot land at its address.
            self._retired.append(self.state)
            self.state = self.state.copy()

    def run_op(self, op: int) -> None:
        """Counter's op, noticing restores at every cut point."""
        self.compute(op)
        self.deliver(op, self.last_digest)
        self.commit(op)

    def report(self) -> dict[str, Any]:
        """Counter's report plus the number of restores noticed (a restore after the last cut point counts too)."""
        self.on_point()
        return {**super().report(), "restores_seen": self.restores_seen}


class RestoreHookRealloc(RestoreHook):
    """Known bad: re-allocates its state buffer after a restore: ``pointer_changed``."""

    name: ClassVar[str] = "restore_hook_realloc"
    realloc: ClassVar[bool] = True
