"""The attribution stages, in the order they run: the one place a stage is listed
(agent/attribution/spec.py says how each declares itself).

Each stage reads only what the collectors and the stages before it give
(tests/unit/attribution/test_stages.py checks the declarations, and that each stage reads
and adds what it declares). The order is otherwise the data's: names before everything
that names a pod; holdings before usage (a container's name can come from the kubelet's
holders); `signals` before `accounts` (each idle interval is charged to a cause from the
holders' signals); `accounts` before `limits` (the counters decide what was left out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.agent.attribution.accounts import ACCOUNTS
from gpuscope.agent.attribution.energy import ENERGY
from gpuscope.agent.attribution.holdings import HOLDINGS
from gpuscope.agent.attribution.limits import LIMITS
from gpuscope.agent.attribution.names import NAMES
from gpuscope.agent.attribution.pods import PODS_NAMED
from gpuscope.agent.attribution.signals import SIGNALS
from gpuscope.agent.attribution.startup import STARTUPS
from gpuscope.agent.attribution.usage import USAGE

if TYPE_CHECKING:
    from gpuscope.agent.attribution.spec import StageSpec

STAGES: tuple[StageSpec, ...] = (
    NAMES,
    HOLDINGS,
    USAGE,
    STARTUPS,
    SIGNALS,
    ACCOUNTS,
    LIMITS,
    ENERGY,
    PODS_NAMED,
)
