"""``python -m cutbench ...`` is the ``cutbench`` command."""

from cutbench.harness.integrations.cli import main

main()
