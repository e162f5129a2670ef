"""What every accelerator renderer does the same way, whichever vendor's records it renders
(exporters/prometheus/gpu.py for NVIDIA, amd.py for AMD): device series carry `gpu` and
`uuid` only; a value the library lacked is left out, never exported as 0."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyReading, InterconnectLink
    from gpuscope.exporters.prometheus.families import Families

DeviceLabels = tuple[str, str]  # the (gpu, uuid) labels every device series starts with

Scalars = Iterable[tuple[str, float | int | bool | None]]
Labelled = Iterable[tuple[str, Mapping[str, float] | Mapping[str, int] | Mapping[str, bool]]]


def device_labels(r: AnyReading) -> DeviceLabels:
    return (str(r.identity.index), r.identity.uuid)


def add_scalars(out: Families, dev: DeviceLabels, scalars: Scalars) -> None:
    """One sample per family with only the device labels; None is left out."""
    for name, value in scalars:
        if value is not None:
            out.add(name, dev, float(value))


def add_labelled(out: Families, dev: DeviceLabels, labelled: Labelled) -> None:
    """Families with one label more (sensor, clock, reason, state, type): one sample per key
    the reading has, in the reading's own key order."""
    for name, values in labelled:
        for label, value in values.items():
            out.add(name, (*dev, label), float(value))


def add_stuck(out: Families, dev: DeviceLabels, r: AnyReading) -> None:
    """How long a call to the device has been blocked past its read deadline, and in which
    function: at the default level only while it is (every device, 0, at full detail)."""
    if r.stuck_seconds or out.full("gpuscope_gpu_stuck_seconds"):
        out.add("gpuscope_gpu_stuck_seconds", dev, r.stuck_seconds or 0.0)
    if r.stuck_seconds is not None and r.stuck_call:
        out.add("gpuscope_gpu_stuck_call_info", (*dev, r.stuck_call), 1)


def add_unsampled(out: Families, dev: DeviceLabels, r: AnyReading) -> None:
    """Time no utilization sample covered: at the default level once there is any (a healthy
    sampler has none), at full detail from 0."""
    unsampled = r.unsampled_seconds
    if unsampled is not None and (unsampled or out.full("gpuscope_gpu_unsampled_seconds_total")):
        out.add("gpuscope_gpu_unsampled_seconds_total", dev, float(unsampled))


def add_link_states(
    out: Families, dev: DeviceLabels, family: str, links: Sequence[InterconnectLink]
) -> None:
    """How many of the device's links (NVLink, XGMI) are up and down; nothing where the
    library tells no link's state."""
    states = [link.up for link in links if link.up is not None]
    if states:
        out.add(family, (*dev, "up"), sum(1 for up in states if up))
        out.add(family, (*dev, "down"), sum(1 for up in states if not up))
