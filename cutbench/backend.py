"""What a checkpoint tool's author imports (``docs/backends.md``): the protocol, what a stage gets, what it raises.

- ``Checkpointer``, the protocol a backend class meets, and ``Capabilities``,
  what it declares it covers;
- ``CutContext``, what each stage is handed, and ``Child``, the process handle
  a stage gets (and ``launch`` returns);
- the outcomes a stage raises: ``StageRefused`` (the tool declined, the
  application went on), ``StageFailed`` (it took the application with it),
  ``HarnessFault`` (the harness could not carry the stage out), and
  ``hung_reason``, the words of a stage that never returned;
- ``CHECKPOINTERS``, the registry (built-ins and entry points);
- for a backend that runs CRIU: ``require_criu`` (the CRIU cutbench runs: its
  ``argv``, or ``Unavailable`` naming the fix) and ``release_network_lock``
  (the nftables table a stopped dump leaves until its image is restored, deleted
  for an image that never will be).

Its public names are exactly what it imports.
"""

from cutbench.errors import HarnessFault, StageFailed, StageRefused, hung_reason
from cutbench.harness.nemesis.base import Capabilities, Checkpointer, CutContext
from cutbench.harness.nemesis.probe_kit import release_network_lock
from cutbench.harness.provision.criu.locate import require_criu
from cutbench.procs import Child
from cutbench.registry import CHECKPOINTERS
