"""What a checkpoint tool's author imports (``docs/backends.md``): the protocol, what a stage gets, what it raises.

- ``Checkpointer``, the protocol a backend class meets, and ``Capabilities``,
  what it declares it covers;
- ``CutContext``, what each stage is handed, and ``Child``, the process handle
  a stage gets (and ``launch`` returns);
- the outcomes a stage raises: ``StageRefused`` (the tool declined, the
  application went on), ``StageFailed`` (it took the application with it),
  ``HarnessFault`` (the harness could not carry the stage out), and
  ``hung_reason``, the words of a stage that never returned;
- ``CHECKPOINTERS``, the registry (built-ins and entry points).

Its public names are exactly what it imports.
"""

from cutbench.errors import HarnessFault, StageFailed, StageRefused, hung_reason
from cutbench.harness.nemesis.base import Capabilities, Checkpointer, CutContext
from cutbench.procs import Child
from cutbench.registry import CHECKPOINTERS
