"""The nemesis: checkpoint backends behind one protocol, and the cut pipeline that drives them.

The protocol is :class:`~cutbench.harness.nemesis.base.Checkpointer` (``base``, with what a stage is
handed); every
backend declares what it can do on itself (``capabilities``, a
:class:`~cutbench.harness.nemesis.base.Capabilities`) and registers in
:data:`cutbench.registry.CHECKPOINTERS` (built-ins) or the entry-point group
``cutbench.checkpointers`` (third parties). ``pipeline``'s ``execute_cut`` is the
one place that knows the order checkpoint → fault → restore. Backends live
in ``backends``, one module each. ``adapters`` is the harness's side of the
semantic adapters (the coordinator's two phases over the control file). ``lifecycle_kit`` drives one tool's
lifecycle by hand with no cutbench in it (the hunt's hands and the body of
every reproducer it writes) on the probe and the tools' hands of ``probe_kit``,
``engine_kit`` a container engine's (docker, podman) on top of it (the hunt's sessions and reproducers are
:mod:`cutbench.harness.hunt.nemesis`'s). ``cpu_account`` measures what a trial's processes
(the workload's, the tool's helpers) spend in each stage: CPU seconds, faults,
bytes written.

A run resolves its backends once, in a :class:`Backends` it hands down (the
checks, the session's per-thread instances, the pid-namespace check, the
record in ``run.toml`` that the store and reports read). Availability is
asked separately (``Backends.unavailable_reason``) so a sweep can report or
skip what this machine cannot run.
"""

from __future__ import annotations

import threading
from typing import Any

from cutbench.errors import CutbenchError, Unavailable
from cutbench.harness.nemesis.base import Capabilities, Checkpointer, CutContext, optional
from cutbench.registry import CHECKPOINTERS, declared_capabilities


class Backends:
    """The backend classes of one run (or one command), each resolved from the registry once, on first ask.

    Every method raises :class:`~cutbench.errors.InvalidArgument` for a name
    nothing registers and :class:`~cutbench.errors.Unavailable` for a backend
    whose module cannot be imported here (asked again, it raises again).
    """

    def __init__(self) -> None:
        self._classes: dict[str, Any] = {}
        self._lock = threading.Lock()  # a run's worker threads ask at once

    def cls(self, name: str) -> Any:
        """The class registered as ``name``."""
        with self._lock:
            if name not in self._classes:
                self._classes[name] = CHECKPOINTERS.load(name)  # the one lookup by name
            return self._classes[name]

    def new(self, name: str) -> Checkpointer:
        """A fresh instance of backend ``name``."""
        return self.cls(name)()  # type: ignore[no-any-return]

    def capabilities(self, name: str) -> Capabilities:
        """What backend ``name`` declares it can do (:class:`Capabilities`)."""
        return declared_capabilities(self.cls(name), name)  # type: ignore[no-any-return]

    def declares(self, name: str, attr: str) -> Any:
        """Backend ``name``'s optional member ``attr`` (:data:`~cutbench.harness.nemesis.base.OPTIONAL`), or its default."""
        return optional(self.cls(name), attr)

    def unavailable_reason(self, name: str) -> str | None:
        """Why backend ``name`` cannot run on this machine (with the fix), or None when it can: its own answer,
        or why its module cannot be imported here. :class:`~cutbench.errors.InvalidArgument` for an unknown name."""
        try:
            return self.new(name).unavailable_reason()
        except Unavailable as exc:
            return str(exc)

    def record(self, names: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """What ``run.toml`` keeps of each backend in ``names`` that loads here: the capabilities the store and
        the reports read back (stages, the state domains it covers, what it needs of a workload's code)."""
        out = {}
        for name in names:
            try:
                caps = self.capabilities(name)
            except CutbenchError:  # one that cannot load here is skipped as an arm: no record
                continue
            out[name] = {"stages": list(caps.stages), "covers": sorted(caps.covers),
                         "workload_changes": caps.workload_changes, "drives_cuda": caps.drives_cuda}
        return out


__all__ = ["CHECKPOINTERS", "Backends", "Capabilities", "Checkpointer", "CutContext"]
