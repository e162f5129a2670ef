"""`python -m gpuscope`: the same entry point as the `gpuscope` console script."""

import sys

from gpuscope.agent.app.cli import main

sys.exit(main())
