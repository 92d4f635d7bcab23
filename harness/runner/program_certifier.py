"""Certificates for a program as it is, from the evidence it gives without knowing cutbench.

A workload of cutbench's says where it stands through its control file; a program does not. Its evidence is what
the outside world saw of it and its files:

- **The image's position**: the effects seen when a tool's capture stage took it (``ctx.mark``), or, for a
  checkpoint the program or its job script makes itself, the effects seen before its checkpoint file was
  written (``workload.params.checkpoint_file``, dated by its mtime).
- **What is visible at the restore decision**: every effect seen by then.
- **Its ``disk`` domain** (``workload.params.domains``) is ahead of the image when a file of its directory was
  written after the checkpoint file: restored, the process would meet files from its future.

:func:`~cutbench.harness.model.certificate.certify` judges them as any workload's. Under ``enforce`` an
ineligible restore is refused and the program stays down, except under a backend whose restored program reads a
decision (``decision_file``: the slurm backend's requeued job, ``$CUTBENCH_DECISION``). There the decision is
``restart`` and the job script starts the program again from the beginning, as a scheduler would; ``audit``
and an eligible certificate write ``restore``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cutbench.harness.model.certificate import CERTIFY_OFF, EXTERNAL, Certificate, Evidence, Position, certify
from cutbench.harness.model.plan import Cut

# An effect read this long after the checkpoint file's mtime was written before it: the observer reads a
# program's output as it comes, a poll or two late.
READ_LAG_S = 0.05


class ProgramCertifier:
    """The certifier of one cut of a program (the pipeline's :class:`~cutbench.harness.nemesis.base.Certifier`).

    ``seen``: returns the effects seen so far as ``(unix time, op)`` pairs (the reference's numbering);
    ``directory``: the program's; ``checkpoint_file``: its checkpoint's file, relative to it ("" for none);
    ``ignore``: names in it that are not the program's state (its output files); ``decision_file``: the
    backend's, or ""; ``certificates``: the trial's list, appended to.
    """

    def __init__(self, *, index: int, cut: Cut, receiver_mode: str, certify_mode: str, phases: tuple[str, ...],
                 domains: tuple[str, ...], covers: tuple[str, ...], seen: Any, directory: Path,
                 checkpoint_file: str, ignore: frozenset[str], decision_file: str,
                 certificates: list[dict[str, Any]]):
        self.evidence = Evidence(checkpoint=index, phases=phases, workload_domains=tuple(domains) + (EXTERNAL,),
                                 covers=covers, receiver_mode=receiver_mode, in_place=cut.fault == "none")
        self.certify_mode = certify_mode
        self.seen = seen
        self.directory = directory
        self.checkpoint_file = checkpoint_file
        self.ignore = ignore | {decision_file}
        self.decision_file = decision_file
        self.certificates = certificates
        self.certificate: Certificate | None = None
        self.decision = ""  # what the decision file says, when there is one

    @property
    def enforcing(self) -> bool:
        return self.certify_mode == "enforce"

    @property
    def certifying(self) -> bool:
        return self.certify_mode != CERTIFY_OFF

    def _through(self, until: float | None = None) -> int:
        """The highest op among the effects seen (by ``until``, a unix time), 0 for none."""
        return max((op for t, op in self.seen() if until is None or t <= until), default=0)

    # -- the pipeline's certifier protocol ----------------------------------------------
    def precheck(self) -> str | None:
        """Refuse before anything is touched when a domain is outside every image (enforce)."""
        if not self.certifying:
            return None
        cert = certify(self.evidence)
        if cert.unknown and self.enforcing:
            self._record(cert, decided=True)
            return f"certificate: {cert.reason}"
        return None

    def joined(self, joined: Any, *, parked: bool = True) -> None:
        """A program has no semantic adapters: nothing joins."""

    def captured(self, stage: str, *, op: int | None = None, phase: str | None = None) -> None:
        """Record the image's position at capture stage ``stage``: the effects seen now (or ``op``)."""
        through = self._through() if op is None else int(op)
        self.evidence.positions[stage] = Position(through, phase or "")
        self.evidence.sent_through = self.evidence.acked_through = through

    def checkpointed(self) -> None:
        """A restorable image exists: a backend with no capture stage took it now."""
        if not self.evidence.positions:
            self.captured("checkpoint")
        if self.evidence.in_place and self.certifying:
            self._record(certify(self.evidence), decided=False)

    def before_restore(self) -> str | None:
        """Date the image by the checkpoint file, gather what is visible, decide; return the refusal under
        enforce (None where the backend's restored program reads the decision instead)."""
        self._date_image()
        self.evidence.visible = tuple(sorted({op for _, op in self.seen()}))
        if not self.certifying:
            return None
        self.evidence.restore_decided = True
        cert = certify(self.evidence)
        self._record(cert, decided=True)
        refuse = self.enforcing and not cert.eligible
        if self.decision_file:
            self.decision = "restart" if refuse else "restore"
            (self.directory / self.decision_file).write_text(self.decision + "\n")
            return None
        return f"certificate: {cert.reason}" if refuse else None

    def in_flight(self) -> list[int]:
        """No adapter classifies a program's effects in flight."""
        return []

    def after_restore(self, restored: Any) -> str | None:
        """Nothing more to decide after a program's restore."""
        return None

    def restored(self) -> None:
        """The pipeline restored this cut: mark its certificate, unless the decision was to start again."""
        if self.certificate is not None and self.certificates and self.decision != "restart":
            self.certificates[-1]["restored"] = True

    # -- evidence ---------------------------------------------------------------------
    def _date_image(self) -> None:
        """The program's checkpoint file, when it has one, dates the image: its position is the effects seen
        before it was written, and files of the program written after it put the disk ahead of it."""
        if not self.checkpoint_file:
            return
        image = self.directory / self.checkpoint_file
        try:
            taken = image.stat().st_mtime
        except OSError:
            return  # no checkpoint was made: the requeued program starts over on its own
        self.captured("job_checkpoint", op=self._through(taken + READ_LAG_S))
        inside = image.parent.resolve()
        after = []
        for root, dirs, files in os.walk(self.directory):
            dirs[:] = [d for d in dirs if not d.startswith(".") and (Path(root) / d).resolve() != inside]
            for name in files:
                path = Path(root) / name
                if name.startswith(".") or name in self.ignore or path == image:
                    continue
                try:
                    if path.stat().st_mtime > taken:
                        after.append(str(path.relative_to(self.directory)))
                except OSError:
                    continue
        self.evidence.written_after = tuple(sorted(after))

    def _record(self, cert: Certificate, *, decided: bool) -> None:
        self.certificate = cert
        self.certificates.append({**cert.to_dict(), "certify": self.certify_mode, "restore_decided": decided,
                                  "restored": False})

    def evidence_of(self) -> dict[str, Any]:
        """The cut's evidence as stored in the trial record (``cut_evidence``)."""
        ev = self.evidence
        out: dict[str, Any] = {"checkpoint": ev.checkpoint, "positions": {k: p.label() for k, p in ev.positions.items()},
                               "sent_through": ev.sent_through, "acked_through": ev.acked_through, "epoch_steps": 0}
        if ev.written_after:
            out["written_after"] = list(ev.written_after)
        if self.decision:
            out["decision"] = self.decision
        return out


__all__ = ["ProgramCertifier"]
