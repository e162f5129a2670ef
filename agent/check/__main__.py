"""`python -m gpuscope.agent.check`: `gpuscope check` without the agent's CLI; the check's own
child processes (process probe, fault child) start this way."""

import sys

from gpuscope.agent.check.main import main

sys.exit(main())
