"""The network probes on the real kernel: kubelet-style cgroups, real traffic over loopback
and between network namespaces, packet loss from nftables.

Needs root, BPF and tracefs (`make kernel` mounts it); these run in CI as they do here.
The servers' fixed ports (27101-27108) are below Linux's ephemeral range (32768-60999): a
port there could be any other process's outgoing connection, and the bind would fail.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.agent.clock import ManualClock
from gpuscope.agent.net.bpf_program import RTT_SLOTS
from gpuscope.agent.net.records import NetSnapshot, PodNetwork
from gpuscope.agent.net.source import NetConfig, NetSource
from tests.doubles.netlab import NetnsPair, Pod, Pods, finish, wait_ready
from tests.support import REPO
from tests.support.bpf import pin_root, remove_pins

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.root(reason="eBPF probes, cgroups, network namespaces"),
]

HEADERS = REPO / "build" / "kernel-headers"
GRACE = 30.0


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture(scope="module")
def net(clock: ManualClock) -> Iterator[NetSource]:
    root = pin_root("net-kernel")
    source = NetSource(
        NetConfig(fallback_headers=HEADERS / "debian", prune_grace=GRACE, pin_root=root),
        clock=clock,
    )
    source.start()
    yield source
    source.stop()
    remove_pins(root)


@pytest.fixture
def pods() -> Iterator[Pods]:
    lab = Pods()
    yield lab
    lab.close()


@pytest.fixture
def netns() -> Iterator[NetnsPair]:
    pair = NetnsPair()
    yield pair
    pair.close()


def collect(net: NetSource) -> NetSnapshot:
    """Collect as a scrape would, a little later: the cgroup walk is rate-limited to 1/s."""
    assert isinstance(net.clock, ManualClock)
    net.clock.advance(1.1)
    return net.read()


def pod_of(snapshot: NetSnapshot, pod: Pod) -> PodNetwork:
    found = [p for p in snapshot.pods if p.pod_uid == pod.uid]
    assert len(found) == 1, f"pod {pod.uid} not in {[p.pod_uid for p in snapshot.pods]}"
    return found[0]


def rtt_median_seconds(p: PodNetwork) -> float:
    """Upper bound of the log2 slot holding the median sample."""
    total, seen = sum(p.rtt_slots), 0
    for slot, n in enumerate(p.rtt_slots):
        seen += n
        if seen * 2 >= total:
            return 2.0**slot / 1e6
    return float("inf")


def tcp_exchange(
    pods: Pods, server: Pod, client: Pod, host: str, port: int, nbytes: int, conns: int,
    server_ns: str | None = None, client_ns: str | None = None,
) -> None:  # fmt: skip
    srv = pods.run(server, ["tcp-server", host, str(port), str(conns)], netns=server_ns)
    wait_ready(srv)
    finish(pods.run(client, ["tcp-client", host, str(port), str(nbytes), str(conns)],
                    netns=client_ns))  # fmt: skip
    assert int(finish(srv)) == nbytes * conns


def test_tcp_bytes_are_exact_per_pod_over_loopback(net: NetSource, pods: Pods) -> None:
    server, client = pods.add(driver="systemd"), pods.add(driver="systemd", qos="guaranteed")
    nbytes, conns = 1_000_003, 3
    tcp_exchange(pods, server, client, "127.0.0.1", 27101, nbytes, conns)

    snap = collect(net)
    s, c = pod_of(snap, server), pod_of(snap, client)
    assert c.transmit_bytes == {"tcp": nbytes * conns}
    assert s.receive_bytes == {"tcp": nbytes * conns}
    assert "tcp" not in c.receive_bytes and "tcp" not in s.transmit_bytes
    # Connections: the client's active opens and the server's passive ones, all closed.
    assert (c.connections_opened, c.connections_closed, c.connections_active) == (3, 3, 0)
    assert (s.connections_opened, s.connections_closed, s.connections_active) == (3, 3, 0)
    # RTT on loopback: samples, and a median between 1 µs and 1 ms.
    assert len(c.rtt_slots) == RTT_SLOTS and c.rtt_count > 0 and s.rtt_count > 0
    assert 1e-6 <= rtt_median_seconds(s) <= 1e-3
    assert 0 < s.rtt_sum_seconds / s.rtt_count < 1e-3


def test_bytes_are_exact_between_namespaces_cgroupfs_layout(
    net: NetSource, pods: Pods, netns: NetnsPair
) -> None:
    server, client = pods.add(driver="cgroupfs"), pods.add(driver="cgroupfs", qos="besteffort")
    tcp_exchange(pods, server, client, "198.18.0.2", 27102, 2_500_000, 2,
                 server_ns=netns.b, client_ns=netns.a)  # fmt: skip
    udp_srv = pods.run(server, ["udp-server", "198.18.0.2", "27103", "100"], netns=netns.b)
    wait_ready(udp_srv)
    finish(pods.run(client, ["udp-client", "198.18.0.2", "27103", "100", "1200"], netns=netns.a))
    assert int(finish(udp_srv)) == 120_000

    snap = collect(net)
    s, c = pod_of(snap, server), pod_of(snap, client)
    assert c.transmit_bytes == {"tcp": 5_000_000, "udp": 120_000}
    assert s.receive_bytes == {"tcp": 5_000_000, "udp": 120_000}
    assert c.transmit_calls["udp"] == 100 and s.receive_calls["udp"] == 100
    assert (c.connections_opened, s.connections_opened) == (2, 2)


def test_retransmits_are_attributed_to_the_sender_and_match_the_kernel(
    net: NetSource, pods: Pods, netns: NetnsPair
) -> None:
    server, client = pods.add(), pods.add()
    netns.segment_per_packet()
    netns.drop_inbound(netns.b, one_in=20, port=27104)  # ~5% of the data segments lost
    before = netns.retrans_segs(netns.a)
    tcp_exchange(pods, server, client, "198.18.0.2", 27104, 8_000_000, 1,
                 server_ns=netns.b, client_ns=netns.a)  # fmt: skip
    kernel = netns.retrans_segs(netns.a) - before

    snap = collect(net)
    ours = pod_of(snap, client).tcp_retransmits
    assert kernel > 50, "the loss rule did not cause retransmissions"
    assert abs(ours - kernel) <= 0.05 * kernel, f"pod {ours} vs kernel RetransSegs {kernel}"
    assert pod_of(snap, server).tcp_retransmits <= 0.05 * kernel


def test_series_of_a_removed_pod_go_after_the_grace_period(
    net: NetSource, pods: Pods, clock: ManualClock
) -> None:
    keep, gone = pods.add(), pods.add()
    for pod in (keep, gone):
        srv = pods.run(None, ["udp-server", "127.0.0.1", "27105", "1"])
        wait_ready(srv)
        finish(pods.run(pod, ["udp-client", "127.0.0.1", "27105", "1", "100"]))
        finish(srv)
    assert {keep.uid, gone.uid} <= {p.pod_uid for p in collect(net).pods}

    pods.remove(gone)
    clock.advance(2)
    assert gone.uid in {p.pod_uid for p in collect(net).pods}  # within the grace period
    clock.advance(GRACE)
    remaining = {p.pod_uid for p in collect(net).pods}
    assert gone.uid not in remaining and keep.uid in remaining


def test_containers_of_a_pod_sum_into_the_pod_or_split_with_the_flag(
    net: NetSource, pods: Pods
) -> None:
    first = pods.add()
    second = pods.add_container(first)
    receiver = pods.run(None, ["udp-server", "127.0.0.1", "27107", "2"])
    wait_ready(receiver)
    finish(pods.run(first, ["udp-client", "127.0.0.1", "27107", "1", "300"]))
    finish(pods.run(second, ["udp-client", "127.0.0.1", "27107", "1", "700"]))
    finish(receiver)
    assert pod_of(collect(net), first).transmit_bytes == {"udp": 1000}

    split = NetSource(
        NetConfig(
            fallback_headers=HEADERS / "debian", per_container=True, pin_root=pin_root("split")
        ),
        clock=ManualClock(1000.0),
    )
    split.start()
    try:
        receiver = pods.run(None, ["udp-server", "127.0.0.1", "27108", "2"])
        wait_ready(receiver)
        finish(pods.run(first, ["udp-client", "127.0.0.1", "27108", "1", "30"]))
        finish(pods.run(second, ["udp-client", "127.0.0.1", "27108", "1", "70"]))
        finish(receiver)
        rows = {
            p.container_id: p.transmit_bytes for p in collect(split).pods if p.pod_uid == first.uid
        }
        assert rows == {first.container_id: {"udp": 30}, second.container_id: {"udp": 70}}
    finally:
        split.stop()


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


WORKER = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
home = sys.argv[1]
for line in sys.stdin:
    path = line.strip()
    with open(path + "/cgroup.procs", "w") as f: f.write("0")
    sock.sendto(b"x" * 64, ("127.0.0.1", 9))
    with open(home + "/cgroup.procs", "w") as f: f.write("0")
    print("ok", flush=True)
"""


def test_maps_stay_bounded_while_5000_cgroups_come_and_go(
    net: NetSource, pods: Pods, clock: ManualClock
) -> None:
    home = pods.root / f"gpuscope-test-{pods.tag}"
    home.mkdir(exist_ok=True)
    pods.created.append(home)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pods.procs.append(worker)
    assert worker.stdin is not None and worker.stdout is not None
    collect(net)
    rss_before = rss_anon_kib()
    entries_before = collect(net).map_entries["traffic"]
    peak = 0
    for i in range(5000):
        cg = home / f"kubepods-besteffort-pod{i:08d}_0000_4000_8000_000000000000.slice"
        cg.mkdir()
        worker.stdin.write(f"{cg}\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "ok"
        cg.rmdir()
        if i % 500 == 499:
            clock.advance(GRACE + 1)
            collect(net)  # notes what vanished
            clock.advance(GRACE + 1)
            peak = max(peak, collect(net).map_entries["traffic"])
    clock.advance(GRACE + 1)
    collect(net)
    clock.advance(GRACE + 1)
    snap = collect(net)
    worker.stdin.close()
    worker.wait()

    assert peak <= entries_before + 1100  # never more than two batches alive
    assert snap.map_entries["traffic"] <= entries_before + 50
    assert snap.map_full["traffic"] == 0
    grown_mib = (rss_anon_kib() - rss_before) / 1024
    assert grown_mib < 16, f"agent memory grew {grown_mib:.1f} MiB over 5000 cgroups"


def load_in_subprocess(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys, json; from pathlib import Path;"
        "from agent.net.source import NetConfig, NetSource;"
        f"s = NetSource(NetConfig({', '.join(args)})); s.start();"
        "print(json.dumps(s.probes.modes)); s.stop()"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("tree", ["debian", "alt"])
def test_probes_compile_and_load_against_two_header_trees(tree: str) -> None:
    path = HEADERS / tree
    assert (path / "include/linux/kconfig.h").exists(), f"{path} missing: run `make kernel`"
    env = {k: v for k, v in os.environ.items() if k != "BCC_KERNEL_SOURCE"}
    env["BCC_KERNEL_SOURCE"] = str(path)
    root = pin_root(f"tree-{tree}")
    try:
        result = load_in_subprocess(env, f"pin_root=Path({str(root)!r})")
    finally:
        remove_pins(root)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"traffic": "tracepoint"' in result.stdout
    assert '"absent"' not in result.stdout
    version = os.readlink(path / ".source")
    print(f"{tree}: {version}")


def test_cgroup_skb_fallback_counts_packets_of_each_pod(net: NetSource, pods: Pods) -> None:
    fallback = NetSource(
        NetConfig(fallback_headers=HEADERS / "debian", traffic_mode="cgroup_skb",
                  pin_root=pin_root("cgroup-skb")),
        clock=ManualClock(1000.0),
    )  # fmt: skip
    fallback.start()
    try:
        assert fallback.probes is not None
        assert fallback.probes.modes["traffic"] == "cgroup_skb"
        server, client = pods.add(), pods.add()
        tcp_exchange(pods, server, client, "127.0.0.1", 27106, 1_000_000, 1)
        c = pod_of(collect(fallback), client)
        # IP packets: the payload plus headers (and handshake/ACK packets), not less.
        assert 1_000_000 <= c.transmit_bytes["tcp"] <= 1_000_000 * 1.1 + 10_000
    finally:
        fallback.stop()


def test_median_helper() -> None:
    p = PodNetwork(pod_uid="x", container_id="", rtt_slots=tuple([0] * 5 + [3] + [0] * 21))
    assert rtt_median_seconds(p) == 32e-6
    assert statistics.median([1, 2, 3]) == 2
