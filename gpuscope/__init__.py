"""gpuscope: node-level GPU and network observability agent for Kubernetes.

The one import name the distribution installs. In a checkout, `gpuscope/agent` and
`gpuscope/exporters` are symbolic links to the top-level `agent/` and `exporters/` folders
(the design's layout); the wheel holds real copies. docs/architecture.md says why.
"""

__version__ = "0.1.0"

# Before any dataclass is created: their compiled methods are kept between runs
# (agent/codecache.py). It imports nothing of the agent but the package.
from gpuscope.agent import codecache as _codecache

_codecache.install()
