"""Every collector gpuscope has, in the order they are collected and documented.

Adding a collector is a new folder with its source, records and `collector.py`
declaration, a renderer in exporters/prometheus/, and one line here (docs/architecture.md,
"Adding a collector").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpuscope.agent.amd.collector import AMD
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.k8s.collector import KUBELET, PODS
from gpuscope.agent.k8s.dra_collector import DRA
from gpuscope.agent.net.collector import NET, NIC, RDMA
from gpuscope.agent.runtime.accelerators import ACCELERATOR

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.runtime.spec import CollectorSpec

COLLECTORS: tuple[CollectorSpec[Any, Any], ...] = (GPU, AMD, NET, NIC, RDMA, KUBELET, PODS, DRA)

BY_NAME: dict[str, CollectorSpec[Any, Any]] = {c.name: c for c in COLLECTORS}
DEFAULT_COLLECTORS: tuple[str, ...] = tuple(c.name for c in COLLECTORS if c.default)


def accelerators(enabled: Iterable[str]) -> tuple[CollectorSpec[AnyAccelerators, Any], ...]:
    """The collectors among `enabled` that read accelerators (role ACCELERATOR,
    agent/runtime/accelerators.py), in registry order: what attribution, node labels and
    the exporter's build info read, whichever vendor's they are."""
    names = set(enabled)
    return tuple(c for c in COLLECTORS if c.role == ACCELERATOR and c.name in names)
