"""The network collector's exposition, from fixed records: golden text, promtool-clean,
histogram buckets cumulative, host traffic in one pod_uid="" set."""

from __future__ import annotations

import os
import shutil
import subprocess

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.attribution.records import Attribution, PodName
from gpuscope.agent.net.bpf_program import RTT_SLOTS
from gpuscope.agent.net.collector import NetOptions
from gpuscope.agent.net.records import NetSnapshot, PodNetwork
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.net import render_net
from gpuscope.exporters.prometheus.render import RenderContext
from tests.support import GOLDEN_DIR
from tests.support.promtext import Exposition

GOLDEN = GOLDEN_DIR / "net-records.prom"
UID = "6f1d2c3b-8a9e-4f70-b1c2-d3e4f5a6b7c8"


def slots(**by_slot: int) -> tuple[int, ...]:
    counts = [0] * RTT_SLOTS
    for slot, n in by_slot.items():
        counts[int(slot.removeprefix("s"))] = n
    return tuple(counts)


SNAPSHOT = NetSnapshot(
    pods=(
        PodNetwork(
            pod_uid="",
            container_id="",
            transmit_bytes={"tcp": 1200, "udp": 64},
            receive_bytes={"tcp": 900},
            transmit_calls={"tcp": 3, "udp": 1},
            receive_calls={"tcp": 2},
        ),
        PodNetwork(
            pod_uid=UID,
            container_id="",
            transmit_bytes={"tcp": 10_000_000},
            receive_bytes={"tcp": 250_000},
            transmit_calls={"tcp": 153},
            receive_calls={"tcp": 40},
            tcp_retransmits=7,
            connections_opened=5,
            connections_closed=2,
            rtt_slots=slots(s3=2, s6=10, s7=4, s26=1),
            rtt_sum_seconds=0.0123,
            rtt_count=17,
        ),
    ),
    probes={
        "traffic": "tracepoint",
        "connections": "tracepoint",
        "retransmits": "tracepoint",
        "rtt": "tracepoint",
    },
    map_full={"traffic": 0, "sockets": 3, "tcp": 0, "rtt": 0},
    map_entries={"traffic": 6, "sockets": 12, "tcp": 2, "rtt": 4},
    map_max_entries={"traffic": 32768, "sockets": 262144, "tcp": 8192, "rtt": 131072},
)
# What the attribution stage adds: the pod's names, by UID.
NAMED = RenderContext(
    NetOptions(),
    Attribution(pod_names={UID: PodName("ml-team", "llama-ft-worker-0", "PyTorchJob", "llama-ft")}),
)


def render() -> str:
    out = Families(catalog())
    render_net(SNAPSHOT, out, NAMED)
    return out.render_text().decode()


def test_net_exposition_matches_golden() -> None:
    text = render()
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_net_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool
    result = subprocess.run(
        [promtool, "check", "metrics"], input=render(), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout


def test_rtt_histogram_is_cumulative_with_everything_in_inf() -> None:
    m = Exposition(render())
    buckets = m.by_label("gpuscope_pod_tcp_rtt_seconds_bucket", "le", pod_uid=UID)
    ordered = sorted(((float(le), v) for le, v in buckets.items()))
    counts = [v for _, v in ordered]
    assert counts == sorted(counts)
    assert buckets["1.6e-05"] == 2  # slots at or below 16 µs fold into the first bucket
    assert buckets["6.4e-05"] == 12  # slot 6 = [32, 64) µs
    assert buckets["0.000128"] == 16
    assert buckets["+Inf"] == 17  # the clamped top slot only in +Inf
    assert m.value("gpuscope_pod_tcp_rtt_seconds_count", pod_uid=UID) == 17
    assert m.value("gpuscope_pod_tcp_connections_active", pod_uid=UID) == 3


def test_host_traffic_is_one_set_and_udp_only_pods_have_no_tcp_series() -> None:
    m = Exposition(render())
    assert m.value("gpuscope_pod_network_transmit_bytes_total", pod_uid="", protocol="udp") == 64
    assert len(m.series("gpuscope_pod_network_transmit_bytes_total", pod_uid="")) == 2
    assert m.value("gpuscope_bpf_map_full_total", map="sockets") == 3


def test_histogram_text_equals_prometheus_client() -> None:
    from prometheus_client import generate_latest

    out = Families(catalog())
    render_net(SNAPSHOT, out, NAMED)
    out.add_histogram(
        "gpuscope_pod_tcp_rtt_seconds",
        ("ns", 'we"ird\\', "c\n1", "Job", "j", "c"),
        [(0.5, 1), (float("inf"), 2)],
        1.5,
    )

    class Fixed:
        def collect(self):
            return out.metrics()

    assert out.render_text() == generate_latest(Fixed())  # type: ignore[arg-type]
