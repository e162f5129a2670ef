#!/usr/bin/env python3
"""Network-probe benchmarks on this machine's real kernel (needs root).

Overhead of the probes on the traffic they watch, as ratios measured in one run with
rounds alternating probes attached / not attached (client pinned to CPU 0, server to CPU 1):
  * iperf3 TCP stream over loopback (budget: >= 0.97 of baseline throughput);
  * TCP request/response with small messages, bench/rr.c (budget: >= 0.95 of baseline TPS).
Also: probe compile + load time (the bpf-load helper, run by the source; median), the cost of
reading the pinned maps per scrape at 110 pods through bpf(2) against bcc's own table
iteration over the same maps (in one run), and the real agent's memory with the GPU source
only and with GPU + network (budget: ready <= 2 s; RSS <= 60 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuscope.agent.net.source import NetConfig, NetSource  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml, ensure_built  # noqa: E402
from tests.support import free_port  # noqa: E402

HEADERS = REPO / "build" / "kernel-headers" / "debian"
PINS = Path("/sys/fs/bpf/gpuscope-bench")  # removed after each use: nothing stays attached


def net_source() -> NetSource:
    return NetSource(NetConfig(fallback_headers=HEADERS, pin_root=PINS))


def stop(source: NetSource) -> None:
    source.stop()
    shutil.rmtree(PINS, ignore_errors=True)


RR = REPO / "build" / "bench" / "rr"


def iperf3_round(port: int, seconds: float) -> float:
    out = subprocess.run(
        ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J", "-A", "0,1"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])


def rr_round(port: int, size: int, seconds: float) -> float:
    out = subprocess.run(
        ["taskset", "-c", "0", str(RR), "client", str(port), str(size), str(seconds)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(out.strip())


def alternate(measure, rounds: int) -> tuple[float, float, list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Median with and without the probes, rounds interleaved so drift hits both alike."""
    with_probes: list[float] = []
    without: list[float] = []
    for i in range(rounds * 2):
        attached = i % 2 == 1
        source = None
        if attached:
            source = net_source()
            source.start()
        try:
            (with_probes if attached else without).append(measure())
        finally:
            if source is not None:
                source.read()  # read the maps once, as a scrape would
                stop(source)
    return statistics.median(with_probes), statistics.median(without), with_probes, without


def ratio_interval(on: list[float], off: list[float]) -> tuple[float, float]:
    """95% bootstrap interval of median(on) / median(off): how sure the ratio is."""
    rng = random.Random(7)
    ratios = sorted(
        statistics.median(rng.choices(on, k=len(on)))
        / statistics.median(rng.choices(off, k=len(off)))
        for _ in range(2000)
    )
    return ratios[50], ratios[1949]


def program_costs(rr_port: int) -> dict[str, float]:
    """Kernel-measured run time per event of each probe (kernel.bpf_stats_enabled), during
    one request/response round, minus that of an empty program on the same tracepoint
    (the statistics' own cost). Steadier than end-to-end ratios on a noisy 2-vCPU VM."""
    import bcc

    def stats() -> dict[str, tuple[int, int]]:
        out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
        return {
            p["name"]: (p.get("run_cnt", 0), p.get("run_time_ns", 0))
            for p in json.loads(out.stdout or "[]")
            if p.get("type") == "tracepoint"
        }

    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
    os.environ.setdefault("BCC_KERNEL_SOURCE", str(HEADERS))  # the empty program's compile
    try:
        empty = bcc.BPF(text=b"TRACEPOINT_PROBE(sock, sock_send_length) { return 0; }")
        rr_round(rr_port, 64, 1.0)
        (cnt, ns), *_ = stats().values()
        floor = ns / max(cnt, 1)
        empty.cleanup()
        source = net_source()
        source.start()
        rr_round(rr_port, 64, 1.0)
        costs = {
            name.split("__")[-1]: ns / cnt - floor
            for name, (cnt, ns) in stats().items()
            if cnt > 1000
        }
        stop(source)
        return {"stats floor": floor, **costs}
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=False)


def load_times(n: int) -> list[float]:
    times = []
    for _ in range(n):
        source = net_source()
        t = time.perf_counter()
        source.start()  # no pins: runs the bpf-load helper and waits for it
        times.append(time.perf_counter() - t)
        stop(source)
    return times


def map_read_costs(pods: int = 110, reads: int = 200) -> dict[str, float]:
    """Milliseconds per read of the traffic, tcp and rtt maps holding `pods` cgroups' entries
    (each with TCP and UDP both ways and 8 RTT slots), on the same maps: through bpf(2) with
    the declared layouts (the agent today) and through bcc's tables (the agent before #24:
    items_lookup_batch, per-CPU values summed in Python). Medians. The maps are those of the
    net family compiled here with bcc and not attached: nothing else writes them."""
    from gpuscope.agent.bpf import syscall
    from gpuscope.agent.bpf.host import HeaderTree, import_bcc, require_tracefs
    from gpuscope.agent.bpf.loader import _compile
    from gpuscope.agent.bpf.maps import PinnedMap
    from gpuscope.agent.net import probes
    from gpuscope.agent.net.ebpf import NetMaps

    program = probes.NetFamily().program(require_tracefs())
    bpf = _compile(import_bcc(), program, HeaderTree(HEADERS, "fallback"))
    try:
        cpus = syscall.possible_cpus()
        specs = {m.name: m for m in program.maps}
        maps = {}
        for name, spec in specs.items():
            fd = bpf[name.encode()].map_fd
            maps[name] = PinnedMap(spec, fd, syscall.map_info(fd), cpus)
        base = 1 << 40  # cgroup ids no real cgroup has
        for i in range(pods):
            cgroup = base + i
            for proto in (0, 1):
                for direction in (0, 1):
                    key = specs["traffic"].key.encode((cgroup, proto, direction))
                    value = specs["traffic"].value.encode((1000 + i, 10)) * cpus
                    syscall.update(maps["traffic"].fd, key, value)
            maps["tcp"].put((cgroup,), (1, 0, 0, 100, 1))
            for slot in range(8):
                maps["rtt"].put((cgroup, slot), (3,))

        class Pinned:  # what NetMaps reads: the maps by name, and the manifest's modes
            manifest: ClassVar[dict[str, object]] = {"modes": program.modes}

            def __getitem__(self, name: str) -> PinnedMap:
                return maps[name]

            def __contains__(self, name: str) -> bool:
                return name in maps

        reader = NetMaps(Pinned())  # type: ignore[arg-type]
        assert len(reader.read().traffic) == pods * 4

        def with_bcc() -> None:  # BpfProbes.read before #24
            {(int(k.cgroup), int(k.proto), int(k.dir)):
                (sum(int(c.bytes) for c in v), sum(int(c.calls) for c in v))
             for k, v in bpf[b"traffic"].items_lookup_batch()}  # fmt: skip
            {int(k): (int(v.opened), int(v.closed), int(v.retransmits), int(v.rtt_sum_us),
                      int(v.rtt_count)) for k, v in bpf[b"tcp"].items_lookup_batch()}  # fmt: skip
            {(int(k.cgroup), int(k.slot)): int(v) for k, v in bpf[b"rtt"].items_lookup_batch()}
            [int(bpf[b"map_full"][bpf[b"map_full"].Key(i)].value) for i in range(4)]

        def median_ms(read) -> float:  # type: ignore[no-untyped-def]
            times = []
            for _ in range(reads):
                t = time.perf_counter()
                read()
                times.append(time.perf_counter() - t)
            return statistics.median(times) * 1e3

        return {"bpf(2)": median_ms(reader.read), "bcc": median_ms(with_bcc)}
    finally:
        bpf.cleanup()


def agent_memory(collectors: str, state: Path) -> dict[str, float]:
    fake = FakeNvml("dgx-h100", state)
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscope", "--listen", f"127.0.0.1:{port}", "--collectors",
         collectors, "--kernel-headers", str(HEADERS), "--log-level", "warning",
         "--bpf-pin-root", str(PINS)],
        cwd=REPO, env=os.environ | fake.env(),
    )  # fmt: skip
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() - started > 60:
                    raise
                time.sleep(0.02)
        ready = time.monotonic() - started
        for _ in range(5):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        fields = {
            line.split(":")[0]: int(line.split()[1]) / 1024
            for line in status.splitlines()
            if line.startswith(("VmRSS", "RssAnon", "RssFile"))
        }
        threads = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads")
        )
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        compiler = sum(lib in maps for lib in ("libLLVM", "libclang", "libbcc"))
        return {"ready_s": ready, **fields, "threads": threads, "compiler_libs": compiler}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(PINS, ignore_errors=True)


Rounds = tuple[float, float, list[float], list[float]]


def build_rr() -> None:
    """Compile bench/rr.c each run, so the request/response client matches this machine."""
    RR.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(RR), str(REPO / "bench" / "rr.c")], check=True)


def measure_traffic(rounds: int, seconds: float) -> tuple[Rounds, Rounds, dict[str, float]]:
    """The stream and request/response rounds and per-program costs, with both servers up
    only for as long as they are measured against."""
    iperf_port, rr_port = free_port(), free_port()
    servers = [
        subprocess.Popen(["iperf3", "-s", "-p", str(iperf_port)], stdout=subprocess.DEVNULL),
        subprocess.Popen(["taskset", "-c", "1", str(RR), "server", str(rr_port)]),
    ]
    time.sleep(0.5)
    try:
        stream = alternate(lambda: iperf3_round(iperf_port, seconds), rounds)
        rr = alternate(lambda: rr_round(rr_port, 64, seconds), rounds)
        costs = program_costs(rr_port) if shutil.which("bpftool") else {}
    finally:
        for s in servers:
            s.terminate()
            s.wait()
    return stream, rr, costs


def print_overhead(stream: Rounds, rr: Rounds, costs: dict[str, float], rounds: int) -> None:
    """The traffic ratios with their intervals, so a reader sees how sure each one is."""
    print("gpuscope network-probe benchmark (loopback, real kernel, probes in tracepoint mode)")
    print(f"  iperf3 TCP stream, probes on    {stream[0] / 1e9:8.2f} Gbit/s (median of {rounds})")
    print(f"  iperf3 TCP stream, probes off   {stream[1] / 1e9:8.2f} Gbit/s")
    lo, hi = ratio_interval(stream[2], stream[3])
    print(f"  ratio                           {stream[0] / stream[1]:8.3f}   (budget >= 0.97; "
          f"95% interval {lo:.3f}-{hi:.3f})")  # fmt: skip
    print(f"  64-byte request/response, on    {rr[0]:8.0f} transactions/s")
    print(f"  64-byte request/response, off   {rr[1]:8.0f} transactions/s")
    lo, hi = ratio_interval(rr[2], rr[3])
    print(f"  ratio                           {rr[0] / rr[1]:8.3f}   (budget >= 0.95; "
          f"95% interval {lo:.3f}-{hi:.3f})")  # fmt: skip
    for name, ns in costs.items():
        print(f"  program time per event, {name:<20} {ns:6.0f} ns")


def print_agent(loads: list[float], gpu_only: dict[str, float], both: dict[str, float]) -> None:
    """Load time and the agent's memory against the budgets in the module docstring."""
    print(
        f"  probe compile + load, median    {statistics.median(loads):8.2f} s  ({len(loads)} loads)"
    )
    print(f"  agent ready, GPU only           {gpu_only['ready_s']:8.2f} s")
    print(f"  agent ready, GPU + net          {both['ready_s']:8.2f} s   (budget <= 2 s)")
    for label, mem in (("GPU only", gpu_only), ("GPU + net", both)):
        print(
            f"  agent RSS, {label:<20} {mem['VmRSS']:8.1f} MB "
            f"(RssAnon {mem['RssAnon']:.1f}, RssFile {mem['RssFile']:.1f}), "
            f"{mem['threads']:.0f} threads, {mem['compiler_libs']:.0f} compiler libraries mapped"
        )
    print("  budget: RSS <= 60 MB with both sources, no compiler library mapped")


def print_rounds(stream: Rounds, rr: Rounds) -> None:
    """Every round, on / off, so drift or an outlier shows behind the medians."""
    print("  rounds (on / off):")
    print("    stream  " + " ".join(f"{v / 1e9:.2f}" for v in stream[2]) + " / "
          + " ".join(f"{v / 1e9:.2f}" for v in stream[3]))  # fmt: skip
    print("    rr      " + " ".join(f"{v:.0f}" for v in rr[2]) + " / "
          + " ".join(f"{v:.0f}" for v in rr[3]))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_net: needs root (BPF)", file=sys.stderr)
        return 1
    ensure_built()
    build_rr()
    stream, rr, costs = measure_traffic(args.rounds, args.seconds)
    loads = load_times(5)
    reads = map_read_costs()
    with tempfile.TemporaryDirectory() as tmp:
        gpu_only = agent_memory("gpu", Path(tmp) / "a")
        both = agent_memory("gpu,net", Path(tmp) / "b")
    print_overhead(stream, rr, costs, args.rounds)
    print_agent(loads, gpu_only, both)
    print(
        f"map read at 110 pods (traffic, tcp, rtt): bpf(2) {reads['bpf(2)']:.2f} ms, "
        f"bcc tables {reads['bcc']:.2f} ms (ratio {reads['bpf(2)'] / reads['bcc']:.2f})"
    )
    print_rounds(stream, rr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
