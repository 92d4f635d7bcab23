"""What a run can be made of here: the registered workloads, the backends (with whether they run on this
machine) and the scenario files within reach (``cutbench list``).

Each function returns plain records, one per item; the command line decides
how to show them. Nothing here runs a trial or writes anything.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import cutbench
from cutbench.harness import nemesis
from cutbench.workloads import api as workload_api
from cutbench.workloads.xp import DEVICE_BACKENDS


def workloads() -> list[dict[str, Any]]:
    """Return every registered workload as ``{"name", "target", "description", "arrays", "needs_gpu"}``, by name.

    The description is the first paragraph of the class's docstring, or of
    its module's where the class defers to it, as plain text (reST's
    literals lose their backquotes); ``arrays`` the array libraries it runs
    on and ``needs_gpu`` whether none of them is the host's. A workload that
    cannot be loaded says why instead.
    """
    items: list[dict[str, Any]] = []
    classes = workload_api.loadable()
    for name, target in sorted(workload_api.available().items()):
        arrays: list[str] = []
        cls = classes[name]
        if isinstance(cls, workload_api.WorkloadError):
            doc = f"(cannot load: {cls})"
        else:
            doc = (cls.__doc__ or "").strip()
            if not doc or "see module docstring" in doc:  # the module says what the workload is
                doc = (sys.modules[cls.__module__].__doc__ or doc).strip()
            doc = _plain(" ".join(doc.split("\n\n")[0].split()))  # its first paragraph, on one line
            arrays = list(workload_api.optional(cls, "arrays"))
        items.append({"name": name, "target": target, "description": doc, "arrays": arrays,
                      "needs_gpu": bool(arrays) and all(a in DEVICE_BACKENDS for a in arrays)})
    return items


def _plain(text: str) -> str:
    """reST inline markup as plain text: ````x```` and ``:role:`x``` become ``x``, ``*x*`` stays."""
    return re.sub(r"(?::[a-z]+:)?`{1,2}([^`]+)`{1,2}", r"\1", text)


def backends() -> list[dict[str, Any]]:
    """Return every registered backend as ``{"name", "available", "reason", "target"}`` (``reason``: why it
    cannot run on this machine, None when it can)."""
    items: list[dict[str, Any]] = []
    resolved = nemesis.Backends()
    for name in nemesis.CHECKPOINTERS.names():
        reason = resolved.unavailable_reason(name)
        items.append({"name": name, "available": reason is None, "reason": reason,
                      "target": nemesis.CHECKPOINTERS.target(name)})
    return items


def scenario_files() -> list[dict[str, Any]]:
    """Return the scenario files within reach as ``{"path"}``: ``./scenarios`` first (a project's own), then
    those of the cutbench checkout in use; each file once."""
    checkout = cutbench.source_checkout()
    roots = [Path("scenarios")] + ([checkout / "scenarios"] if checkout else [])
    seen: set[Path] = set()
    items: list[dict[str, Any]] = []
    for root in roots:
        for path in sorted(root.glob("*.toml")):
            if path.resolve() not in seen:
                seen.add(path.resolve())
                items.append({"path": str(path)})
    return items
