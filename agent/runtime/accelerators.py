"""The accelerator role: what the parts above the sources may ask of any accelerator
collector (NVIDIA's today, AMD's next) without knowing which vendor's it is.

A collector declares `role=ACCELERATOR` (agent/runtime/spec.py); the app finds the
accelerator collectors by role in the registry and hands their sources to whoever needs
them, typed by `DeviceWatch` here, never by the vendor's source class or its internals.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

ACCELERATOR = "accelerator"


@runtime_checkable
class DeviceWatch(Protocol):
    """What an accelerator source offers beyond `read`, for the node labels loop."""

    def lost_devices(self) -> frozenset[str]:
        """UUIDs of the devices the source has noticed are lost, cheaply (no library call),
        so the labels follow a lost GPU within a second instead of a labels interval."""
        ...

    def refresh_topology(self) -> None:
        """Read again what can change after start (NVIDIA's fabric registration completes
        minutes after boot). Does nothing before the source has started; may raise, which
        costs the caller only this round's fresh topology."""
        ...
