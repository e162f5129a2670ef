"""A probe family: BPF programs as C text for bcc, where they attach, and their maps'
layouts (ebpf_exporter's idea: the program and what user space makes of its maps are one
declaration).

The helper (`gpuscope bpf-load`) compiles a family's program and pins its maps and links
under bpffs; the agent reads the maps back through bpf(2) with the layouts the helper wrote
in the manifest. A family's *program hash* covers everything that decides its program on a
kernel (the C templates, the layouts, the options): the agent computes it without bcc or
tracefs, to find the pins that match it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuscope.agent.bpf.layout import Layout

# Bumped when the pin layout or the manifest's meaning changes: old pins are then replaced.
PIN_FORMAT = 1


@dataclass(frozen=True, slots=True)
class MapSpec:
    """A map user space reads. `percpu`: the kernel keeps one value per possible CPU, and
    the reader sums them field by field."""

    name: str
    key: Layout
    value: Layout
    percpu: bool = False

    def to_json(self) -> dict[str, object]:
        return {"key": self.key.to_json(), "value": self.value.to_json(), "percpu": self.percpu}

    @classmethod
    def from_json(cls, name: str, value: Mapping[str, object]) -> MapSpec:
        key, val = value["key"], value["value"]
        assert isinstance(key, list) and isinstance(val, list)
        return cls(name, Layout.from_json(key), Layout.from_json(val), bool(value["percpu"]))


@dataclass(frozen=True, slots=True)
class Attachment:
    """Where a program function runs: a tracepoint ("sock:sock_send_length") or the cgroup v2
    root's socket buffers ("cgroup_skb:ingress", "cgroup_skb:egress")."""

    function: str
    target: str

    @property
    def kind(self) -> str:
        return "cgroup_skb" if self.target.startswith("cgroup_skb:") else "tracepoint"

    @property
    def link_name(self) -> str:
        return self.target.replace(":", "__")


@dataclass(frozen=True, slots=True)
class Program:
    """What a family compiles on this kernel, after feature detection."""

    text: str
    maps: tuple[MapSpec, ...]
    attachments: tuple[Attachment, ...]
    modes: Mapping[str, str] = field(default_factory=dict)  # what was detected, for logs


class ProbeFamily(Protocol):
    """A set of probes loaded, pinned and read together."""

    @property
    def name(self) -> str: ...

    def source(self) -> str:
        """Every C template the family may compile, before substitution (for the hash)."""
        ...

    def request(self) -> Mapping[str, object]:
        """The options that change the program (map sizes, modes), JSON values."""
        ...

    def layouts(self) -> tuple[MapSpec, ...]:
        """Every map the family's program may have that user space reads."""
        ...

    def program(self, tracefs: Path) -> Program:
        """The program for this kernel (feature detection through tracefs); raises
        SourceUnavailable when the kernel cannot run it."""
        ...


def program_hash(family: ProbeFamily) -> str:
    """16 hex digits naming the pins of `family` with these options on this kernel."""
    canonical = json.dumps(
        {
            "format": PIN_FORMAT,
            "family": family.name,
            "source": family.source(),
            "request": dict(family.request()),
            "maps": {m.name: m.to_json() for m in family.layouts()},
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
