"""``python -m receivers serve ...``: run the receiver service (see ``receivers.server.main``)."""

import sys

from .server import main

sys.exit(main())
