"""The public Python API: every name code outside cutbench needs, from one module.

- **Runs** (``docs/python-api.md``): ``run`` (a scenario, as ``cutbench run``),
  ``open_run`` (a stored one), ``Run`` and what its methods return
  (``Comparison``, ``Reanalysis``, ``RunVerdict``); ``cutbench.run`` and
  ``cutbench.open_run`` are the same functions.
- **A backend** (``docs/backends.md``): the ``Checkpointer`` protocol,
  ``Capabilities``, ``CutContext``, ``Child`` (the process handle a stage gets
  and ``launch`` returns), the errors a stage raises (``StageRefused``,
  ``StageFailed``, ``HarnessFault``) and the registry ``CHECKPOINTERS``.
- **A workload** (``docs/workload-api.md``): the ``Workload`` and ``Reference``
  protocols, ``PHASES`` and ``DOMAINS``, the ``Runtime`` a workload gets as
  ``rt``, the built-ins' base classes (``BaseWorkload``, ``RecordedWorkload``)
  and ``ReplayReference``, ``MatrixRow``, semantic adapters (``Adapter``,
  ``Ready``, ``ConsumerOffset``, ``RequestLog``), the array helpers
  (``pointer``, ``synchronize``, ``to_host``, …) and the registry ``WORKLOADS``.
- **Errors**: ``CutbenchError`` and the ones above, ``InvalidArgument``,
  ``Unavailable``, ``WorkloadError``.

Each name is imported on first use from the module that defines it (PEP 562),
so a name costs only what its module loads: a workload process that imports
``BaseWorkload`` from here loads the workload runtime, not pandas and not the
harness (``tests/unit/test_layout.py`` checks that); only the stored-run names
load pandas.

This module is the package's front door for code, as ``cutbench.__main__`` is
for the shell: it may import every room, and nothing inside the package
imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every public name and the module that defines it. The block under TYPE_CHECKING below names the same
# (tests/unit/test_layout.py keeps the two equal), so that a type checker sees each name's real type.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("run", "open_run", "Run", "Comparison", "Reanalysis", "RunVerdict"), "cutbench.harness.integrations.runs"),
    **dict.fromkeys(("CutbenchError", "InvalidArgument", "Unavailable", "StageRefused", "StageFailed", "HarnessFault"),
                    "cutbench.errors"),
    **dict.fromkeys(("Checkpointer", "Capabilities", "CutContext"), "cutbench.harness.nemesis.base"),
    "Child": "cutbench.procs",
    "CHECKPOINTERS": "cutbench.registry",
    **dict.fromkeys(("Workload", "Reference", "WorkloadError", "MatrixRow", "DOMAINS", "WORKLOADS"), "cutbench.workloads.api"),
    "PHASES": "cutbench.workloads.control",
    "Runtime": "cutbench.workloads.runtime",
    **dict.fromkeys(("BaseWorkload", "RecordedWorkload", "ReplayReference"), "cutbench.workloads.common"),
    **dict.fromkeys(("Adapter", "Ready", "ConsumerOffset", "RequestLog"), "cutbench.workloads.adapters"),
    **dict.fromkeys(("pointer", "synchronize", "to_host", "release_cached_memory", "is_device", "backend_name", "device_uuid",
                     "word_dtype", "word", "shift_right", "host_words", "ArrayTypeError", "ArrayBackendUnavailable"),
                    "cutbench.workloads.xp"),
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` and return it; later look-ups find it here directly."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cutbench.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # `X as X`: a re-export, for type checkers (each name's type) and linters (not unused)
    from cutbench.errors import (CutbenchError as CutbenchError, HarnessFault as HarnessFault,
                                 InvalidArgument as InvalidArgument, StageFailed as StageFailed, StageRefused as StageRefused,
                                 Unavailable as Unavailable)
    from cutbench.harness.integrations.runs import (Comparison as Comparison, Reanalysis as Reanalysis, Run as Run,
                                                    RunVerdict as RunVerdict, open_run as open_run, run as run)
    from cutbench.harness.nemesis.base import (Capabilities as Capabilities, Checkpointer as Checkpointer,
                                               CutContext as CutContext)
    from cutbench.procs import Child as Child
    from cutbench.registry import CHECKPOINTERS as CHECKPOINTERS
    from cutbench.workloads.adapters import (Adapter as Adapter, ConsumerOffset as ConsumerOffset, Ready as Ready,
                                             RequestLog as RequestLog)
    from cutbench.workloads.api import (DOMAINS as DOMAINS, WORKLOADS as WORKLOADS, MatrixRow as MatrixRow,
                                        Reference as Reference, Workload as Workload, WorkloadError as WorkloadError)
    from cutbench.workloads.common import (BaseWorkload as BaseWorkload, RecordedWorkload as RecordedWorkload,
                                           ReplayReference as ReplayReference)
    from cutbench.workloads.control import PHASES as PHASES
    from cutbench.workloads.runtime import Runtime as Runtime
    from cutbench.workloads.xp import (ArrayBackendUnavailable as ArrayBackendUnavailable, ArrayTypeError as ArrayTypeError,
                                       backend_name as backend_name, device_uuid as device_uuid, host_words as host_words,
                                       is_device as is_device, pointer as pointer,
                                       release_cached_memory as release_cached_memory, shift_right as shift_right,
                                       synchronize as synchronize, to_host as to_host, word as word, word_dtype as word_dtype)
