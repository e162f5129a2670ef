"""The BPF layer's pure parts: layouts as C lays the structs out, the program hash, where
pins go and which are stale (the kernel side is tests/kernel/test_bpf_pins.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuscope.agent.bpf.family import MapSpec, program_hash
from gpuscope.agent.bpf.layout import Layout, text
from gpuscope.agent.bpf.pins import bpffs_mount, building, published, stale_pins
from gpuscope.agent.net.bpf_program import RETIRED_FIELDS, MapLimits
from gpuscope.agent.net.probes import RETIRED, RTT, SOCKETS, TCP, TRAFFIC, NetFamily


@pytest.mark.parametrize(
    ("layout", "size"),
    [
        (TRAFFIC.key, 16),  # struct traffic_key { u64 cgroup; u32 proto; u32 dir; }
        (TRAFFIC.value, 16),
        (TCP.value, 40),
        (RTT.key, 16),
        (SOCKETS.value, 24),  # struct sock_val { u64; u64; u32; u32; }
        (RETIRED.key, 112),  # char[40] + char[72]
        (RETIRED.value, 8 * RETIRED_FIELDS),
        (Layout.of(("a", "u32"), ("b", "u64")), 16),  # padding before the u64
        (Layout.of(("a", "u64"), ("b", "u32")), 16),  # tail padding to the u64's alignment
        (Layout.of(("a", "char[3]"), ("b", "u16")), 6),
    ],
)
def test_layouts_have_the_sizes_c_gives_the_structs(layout: Layout, size: int) -> None:
    assert layout.size == size


def test_a_layout_round_trips_through_bytes_and_json() -> None:
    layout = Layout.of(("uid", "char[8]"), ("n", "u32"), ("total", "u64"))
    data = layout.encode((b"pod", 7, 2**40))
    assert len(data) == layout.size == 24
    uid, n, total = layout.decode(data)
    assert (text(uid), n, total) == ("pod", 7, 2**40)
    assert Layout.from_json(layout.to_json()) == layout
    spec = MapSpec("m", layout, Layout.of(("v", "u64")), percpu=True)
    assert MapSpec.from_json("m", spec.to_json()) == spec


def test_an_unknown_field_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown field type 'float'"):
        Layout.of(("x", "float"))


def test_the_program_hash_follows_what_changes_the_program() -> None:
    base = NetFamily()
    assert program_hash(base) == program_hash(NetFamily())
    assert len(program_hash(base)) == 16
    changed = [
        NetFamily(traffic_mode="cgroup_skb"),
        NetFamily(limits=MapLimits(cgroups=64)),
        NetFamily(limits=MapLimits(sockets=1024)),
        NetFamily(cgroup_root=Path("/sys/fs/cgroup/unified")),
    ]
    assert len({program_hash(base), *map(program_hash, changed)}) == 1 + len(changed)


def test_bpffs_is_found_at_the_deepest_mount_over_the_path(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "sysfs /sys sysfs rw 0 0\n"
        "bpf /sys/fs/bpf bpf rw,relatime 0 0\n"
        "tmpfs /sys/fs/bpf/elsewhere tmpfs rw 0 0\n"
    )
    assert bpffs_mount(Path("/sys/fs/bpf/gpuscope"), mounts) == Path("/sys/fs/bpf")
    assert bpffs_mount(Path("/sys/fs/bpf/elsewhere/gpuscope"), mounts) is None
    assert bpffs_mount(Path("/tmp/pins"), mounts) is None


def test_stale_pins_are_other_hashes_and_dead_helpers_builds(tmp_path: Path) -> None:
    keep = published(tmp_path, "net", "aaaa")
    for path in (
        keep,
        published(tmp_path, "net", "bbbb"),
        published(tmp_path, "nccl", "cccc"),  # another family's: not ours to remove
        building(tmp_path, "net", "dddd", os.getpid()),  # a helper still at work
        building(tmp_path, "net", "eeee", 2**22 + 1),  # no such process
    ):
        path.mkdir()
    stale = {(s.path.name, s.why) for s in stale_pins(tmp_path, "net", keep=keep.name)}
    assert stale == {
        ("net-bbbb", "another program"),
        (f"building-net-eeee-{2**22 + 1}", "unfinished"),
    }


def test_the_helper_the_agent_runs_loads_the_agents_own_probes(tmp_path: Path) -> None:
    """NetConfig.helper_args writes flags that `gpuscope bpf-load` parses back with the
    agent's parser (agent/app/bpf_load.py): the same program hash, the same pin root."""
    from gpuscope.agent.app.config import parse
    from gpuscope.agent.net.collector import NET, net_config
    from gpuscope.agent.net.source import NetConfig

    agent = NetConfig(
        sysfs=tmp_path / "sys",
        procfs=tmp_path / "proc",
        traffic_mode="cgroup_skb",
        limits=MapLimits(cgroups=100, sockets=2000),
        modules_dir=tmp_path / "modules",
        fallback_headers=tmp_path / "headers",
        pin_root=tmp_path / "pins",
    )
    root = tmp_path / "cgroup"
    parsed = parse(agent.helper_args(root), env={})
    helper = net_config(parsed.agent, parsed.of(NET))
    assert program_hash(helper.family(helper.cgroup_v2_root())) == program_hash(agent.family(root))
    for field in ("sysfs", "procfs", "modules_dir", "fallback_headers", "pin_root"):
        assert getattr(helper, field) == getattr(agent, field), field
