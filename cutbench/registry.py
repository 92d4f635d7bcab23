"""Plug-ins by name: the built-ins of one kind plus those installed under an entry-point group.

A :class:`Registry` maps names to ``"module:attr"`` import paths and imports a
plug-in only when it is asked for (so a CPU machine never imports GPU
bindings it lacks). Each kind's table of built-ins lives next to what it
lists: the workloads' in ``workloads/api.py`` (handed in as a dict), the
backends' in ``harness/nemesis/backends/__init__.py``, which this floor names
by its address alone and reads on first use (see ``CHECKPOINTERS``).
Third-party packages add plug-ins with an entry point in their own
``pyproject.toml``::

    [project.entry-points."cutbench.checkpointers"]
    my-tool = "my_package.backend:MyCheckpointer"

The plug-in itself declares what it can do (a checkpointer's
``capabilities``, a workload's ``domains`` and ``phases``); a registry keeps
names only, so nothing else holds a copy of a plug-in's abilities.

``CHECKPOINTERS`` lives here, on the ground floor, because the model (scenario
validation) must know backend names and capabilities while sitting below the
nemesis that implements them; its table is the backends' own, read through
one address. Workloads keep their own registry
(``cutbench.workloads.api.WORKLOADS``).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from cutbench.errors import InvalidArgument, Unavailable


class Registry:
    """Named plug-ins of one ``kind``: the built-ins first, then the entry points of ``group``.

    ``builtin`` is the table of built-ins (name to ``"module:attr"``), or the ``"module:attr"`` address of that
    table, read on first use: a floor below the plug-ins names where their table is, not what is in it.
    """

    def __init__(self, kind: str, group: str, builtin: dict[str, str] | str):
        self.kind = kind
        self.group = group
        self._builtin = dict(builtin) if isinstance(builtin, dict) else None
        self._table = builtin if isinstance(builtin, str) else ""

    @property
    def builtin(self) -> dict[str, str]:
        """Return the built-ins' table, name to import path, in its listed order."""
        if self._builtin is None:
            self._builtin = dict(import_target(self._table, f"the {self.kind}s' table"))
        return self._builtin

    def available(self) -> dict[str, str]:
        """Every registered name mapped to its import path (built-ins win a name clash)."""
        found = dict(self.builtin)
        for ep in entry_points(group=self.group):
            found.setdefault(ep.name, ep.value)
        return found

    def names(self) -> tuple[str, ...]:
        """The registered names, built-ins in their listed order, then entry points sorted."""
        found = self.available()
        return tuple(self.builtin) + tuple(sorted(set(found) - set(self.builtin)))

    def target(self, name: str) -> str:
        """The import path of ``name``; :class:`InvalidArgument` naming the allowed names when unknown."""
        if name in self.builtin:  # built-ins win a clash anyway: no entry-point scan on the common path
            return self.builtin[name]
        found = self.available()
        if name not in found:
            raise InvalidArgument(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}")
        return found[name]

    def load(self, name: str) -> Any:
        """The object registered as ``name`` (imported now).

        Raises :class:`InvalidArgument` for an unknown name and
        :class:`Unavailable` when its module cannot be imported here.
        """
        return import_target(self.target(name), f"{self.kind} {name!r}")


def import_target(target: str, what: str) -> Any:
    """The attribute named by ``"module:attr"``; :class:`Unavailable` (naming ``what``) when it cannot be imported."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"{what}: import path {target!r} is not 'module:attr'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise Unavailable(f"{what}: cannot import {target!r}: {exc}") from exc


def backend_capabilities(name: str) -> Any:
    """The ``capabilities`` backend ``name`` declares on its class (its module is imported, no instance built).

    Raises :class:`InvalidArgument` for an unknown name or a backend that
    declares none, :class:`Unavailable` when its module cannot be imported.
    """
    return declared_capabilities(CHECKPOINTERS.load(name), name)


def declared_capabilities(cls: Any, name: str) -> Any:
    """The ``capabilities`` the backend class ``cls`` (registered as ``name``) declares; :class:`InvalidArgument`
    when it declares none."""
    caps = getattr(cls, "capabilities", None)
    if caps is None:
        raise InvalidArgument(f"backend {name!r} declares no capabilities (a Capabilities instance on the class)")
    return caps


# The built-in checkpoint backends: their table is ``BUILTIN`` next to them, in harness/nemesis/backends/
# (adding one: a module there and one line in that table; outside this repository, an entry point in the group
# below). See docs/backends.md.
CHECKPOINTERS = Registry("backend", "cutbench.checkpointers", "cutbench.harness.nemesis.backends:BUILTIN")
