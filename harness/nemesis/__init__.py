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
every reproducer it writes), ``engine_kit`` a container engine's (docker,
podman) on top of it; ``hunt`` opens its sessions, writes the reproducers
and runs them on their own.

``get(name)`` returns a backend instance; availability is asked separately
(``unavailable_reason()``) so a sweep can report or skip what this machine
cannot run.
"""

from __future__ import annotations

from cutbench.harness.nemesis.base import Capabilities, Checkpointer, CutContext
from cutbench.registry import CHECKPOINTERS


def get(name: str) -> Checkpointer:
    """A fresh instance of backend ``name``.

    Raises :class:`~cutbench.errors.InvalidArgument` for a name nothing
    registers and :class:`~cutbench.errors.Unavailable` for a registered
    backend whose module cannot be imported here.
    """
    return CHECKPOINTERS.load(name)()


__all__ = ["CHECKPOINTERS", "Capabilities", "Checkpointer", "CutContext", "get"]
