"""What a workload's author imports (``docs/workload-api.md``): one module, the workload runtime behind it.

- the protocols a workload class meets: ``Workload`` and ``Reference``, with
  ``PHASES`` (its cut points), ``DOMAINS`` (the state it keeps) and
  ``MatrixRow`` (a support-matrix probe's row);
- the ``Runtime`` a workload gets as ``rt``;
- the built-ins' base classes ``BaseWorkload`` and ``RecordedWorkload``, and
  ``ReplayReference`` (a reference that replays the workload on NumPy);
- semantic adapters: ``Adapter``, ``Ready``, ``ConsumerOffset``, ``RequestLog``;
- the array helpers that work on NumPy, CuPy and PyTorch alike (``pointer``,
  ``synchronize``, ``to_host``, …);
- ``WORKLOADS``, the registry (built-ins and entry points).

The errors a workload meets (``WorkloadError``, ``ArrayTypeError``,
``ArrayBackendUnavailable``) are in :mod:`cutbench.errors`. Importing this
module loads neither pandas nor the harness: it runs inside the checkpointed
process (``tests/unit/test_layout.py`` checks both). Its public names are
exactly what it imports.
"""

from cutbench.workloads.adapters import Adapter, ConsumerOffset, Ready, RequestLog
from cutbench.workloads.api import DOMAINS, WORKLOADS, MatrixRow, Reference, Workload
from cutbench.workloads.common import BaseWorkload, RecordedWorkload, ReplayReference
from cutbench.workloads.control import PHASES
from cutbench.workloads.runtime import Runtime
from cutbench.workloads.xp import (backend_name, device_uuid, host_words, is_device, pointer, release_cached_memory,
                                   shift_right, synchronize, to_host, word, word_dtype)
