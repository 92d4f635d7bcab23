"""``python -m cutbench.receivers serve ...``: run the receiver service (see ``cutbench.receivers.command``)."""

import sys

from .command import main

sys.exit(main())
