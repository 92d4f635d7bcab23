"""``adapter_faults``: ``request_service`` with its semantic adapters on, one of which misbehaves on purpose.

What the coordinator must survive from a subsystem it cannot trust: an adapter
that takes ``prepare_delay_ms`` to reach its boundary (longer than
``run.prepare_timeout_s``: it never answers in time), answers garbage, raises,
or is registered for a domain the workload does not declare (an error at
start-up). The cut must then be refused at ``prepare`` with the adapter's own
words, within the deadline plus a bounded abort, and the workload must go on
to the end with nothing half-checkpointed. ``benchmarks/adapter_pause.py``
measures the pause ``prepare`` adds and the time to abort with it.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from cutbench.workloads.adapters import RequestLog
from cutbench.workloads.common import check_range
from cutbench.workloads.request_service import RequestService

FAULTS: tuple[str, ...] = ("none", "garbage", "raise", "undeclared")


class SlowRequestLog(RequestLog):
    """A request log whose ``prepare`` takes ``delay_s`` and then does what ``fault`` says."""

    def __init__(self, path: Any, delay_s: float, fault: str):
        super().__init__(path)
        self.delay_s, self.fault = delay_s, fault

    def prepare(self, epoch: int, deadline: float) -> Any:
        """Wait ``delay_s`` (ignoring ``deadline``: a subsystem stuck at its boundary), then answer."""
        time.sleep(self.delay_s)
        if self.fault == "garbage":
            return 42
        if self.fault == "raise":
            raise RuntimeError(f"request log unavailable at epoch {epoch}")
        return super().prepare(epoch, deadline)


class StrayAdapter(RequestLog):
    """An adapter for a domain the workload does not declare."""

    domain = "peer"


class AdapterFaults(RequestService):
    """The workload ``request_service`` with adapters on and a request log that misbehaves as ``adapter_fault`` says."""

    name: ClassVar[str] = "adapter_faults"
    defaults: ClassVar[dict[str, Any]] = {**RequestService.defaults, "adapters": True, "adapter_fault": "none",
                                          "prepare_delay_ms": 0.0}
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {**RequestService.choices, "adapters": (True,),
                                                     "adapter_fault": FAULTS}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """The service's checks, and a delay of at most an hour."""
        super().check_params(p)
        check_range("prepare_delay_ms", p["prepare_delay_ms"], 0, 3_600_000)

    def join_cuts(self, queue: Any = None) -> None:
        """Register the misbehaving request log (and the stray adapter for ``undeclared``)."""
        p = self.p
        self.request_log = SlowRequestLog(self.rt.workdir / "request_log", p["prepare_delay_ms"] / 1000.0,
                                          p["adapter_fault"])
        self.rt.register_adapter(self.request_log)
        if p["adapter_fault"] == "undeclared":
            self.rt.register_adapter(StrayAdapter(self.rt.workdir / "stray_log"))
