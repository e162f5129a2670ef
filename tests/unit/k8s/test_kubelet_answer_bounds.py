"""The kubelet's PodResources answer cannot take the agent over its memory limit: an answer
over the bound is one clear failure of the kubelet collector and costs next to nothing, and
the memory a large accepted answer took goes back to the system once it is replaced.

Memory is read from /proc/self/status (VmRSS, VmHWM) of a separate process that runs only
the source, with the kubelet double in this one; the bounds are generous (tens of MB) and
sit well under what the same answers cost without the fix (see each test).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpuscope.agent.k8s.kubelet_source import MAX_ANSWER_BYTES, KubeletSource
from gpuscope.agent.k8s.podresources.v1 import api_pb2
from gpuscope.agent.runtime.sources import SourceRunner
from tests.doubles.kubelet_server import KubeletServer, container, devices, pod
from tests.support import REPO

MiB = 1024 * 1024


def dense_pods(count: int) -> list[api_pb2.PodResources]:
    """Pods with two containers of 8 GPUs and 256 pinned CPUs each: ~1.5 KB per pod."""
    gpus = [f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
    return [
        pod("ml", f"trainer-{i}",
            container("main", devices("nvidia.com/gpu", *gpus), cpu_ids=range(256)),
            container("sidecar", devices("nvidia.com/gpu", *gpus), cpu_ids=range(256)))
        for i in range(count)
    ]  # fmt: skip


def answer_bytes(pods: list[api_pb2.PodResources]) -> int:
    return api_pb2.ListPodResourcesResponse(pod_resources=pods).ByteSize()


@pytest.fixture
def kubelet() -> Iterator[KubeletServer]:
    with KubeletServer() as server:
        yield server


# The child polls once per line it reads and reports its memory in MB after each poll.
CHILD = r"""
import json, re, sys
from pathlib import Path
from gpuscope.agent.k8s.kubelet_source import KubeletSource

def status(key):
    text = Path("/proc/self/status").read_text()
    return int(re.search(key + r":\s+(\d+)", text).group(1)) // 1024

source = KubeletSource(Path(sys.argv[1]), background=False, **json.loads(sys.argv[2]))
for _ in sys.stdin:
    source.poll()
    print(json.dumps({"rss": status("VmRSS"), "peak": status("VmHWM"), "error": source._error}),
          flush=True)
"""


class Child:
    """The source alone in a process of its own, polled on demand."""

    def __init__(self, kubelet: KubeletServer, **options: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(kubelet.socket_path), json.dumps(options)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def poll(self) -> dict[str, object]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("poll\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the child died"
        report: dict[str, object] = json.loads(line)
        return report

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def megabytes(report: dict[str, object], key: str) -> int:
    value = report[key]
    assert isinstance(value, int)
    return value


def test_an_oversized_answer_is_one_clear_failure_of_the_collector(
    kubelet: KubeletServer,
) -> None:
    pods = dense_pods(3500)
    size = answer_bytes(pods)
    assert size > MAX_ANSWER_BYTES
    kubelet.set_pods(*pods)
    source = KubeletSource(kubelet.socket_path, background=False)
    runner = SourceRunner([source])
    try:
        (result,) = runner.collect().results.values()
        assert not result.success and result.records is None
        assert result.error == (
            f"kubelet PodResources socket {kubelet.socket_path}: answer of {size} bytes is "
            f"over the client's limit of {MAX_ANSWER_BYTES} bytes"
        )
        kubelet.set_pods(*dense_pods(2))  # the kubelet's answer shrinks: served again
        (result,) = runner.collect().results.values()
        assert result.success and result.records is not None and len(result.records.pods) == 2
    finally:
        runner.stop()


def test_an_oversized_answer_costs_almost_no_memory(kubelet: KubeletServer) -> None:
    kubelet.set_pods(*dense_pods(2))
    child = Child(kubelet)
    baseline = child.poll()
    pods = dense_pods(5000)  # 7.6 MB: accepted, it takes the peak up by about 50 MB
    assert answer_bytes(pods) > MAX_ANSWER_BYTES
    kubelet.set_pods(*pods)
    refused = child.poll()
    child.close()
    assert "over the client's limit" in str(refused["error"])
    assert megabytes(refused, "peak") - megabytes(baseline, "peak") < 20
    assert megabytes(refused, "rss") - megabytes(baseline, "rss") < 10


def test_memory_returns_after_a_large_answer(kubelet: KubeletServer) -> None:
    kubelet.set_pods(*dense_pods(2))
    child = Child(kubelet, max_answer_bytes=64 * MiB)  # let a large answer in
    baseline = child.poll()
    kubelet.set_pods(*dense_pods(5000))  # 7.6 MB; without releasing, ~38 MB stayed behind
    held = child.poll()
    kubelet.set_pods(*dense_pods(2))
    after = child.poll()
    child.close()
    assert held["error"] is None and after["error"] is None
    assert megabytes(held, "rss") > megabytes(baseline, "rss")  # the answer was really held
    assert megabytes(after, "rss") - megabytes(baseline, "rss") < 20
