"""``python -m cutbench.receivers serve ...``: run the receiver service (see ``cutbench.receivers.server.main``)."""

import sys

from .server import main

sys.exit(main())
