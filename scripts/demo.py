#!/usr/bin/env python3
"""`make demo`: gpuscope on a simulated 8x H100 node with a scripted, changing workload.

The fake NVML library plays the node (tests/fakenvml); the agent is the real `gpuscope`
process, loading it through the real pynvml bindings. Prints the /metrics URL and a live
summary table until Ctrl-C (or --duration seconds).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakenvml.control import FakeNvml, ensure_built  # noqa: E402
from tests.promtext import Exposition  # noqa: E402

GIB = 2**30


def script_workload(fake: FakeNvml, stop: threading.Event) -> None:
    """A node the way it looks in practice: one busy job, one bursty, one idle reservation."""
    with fake.batch():
        # GPUs 0-3: a data-parallel training job; compute bursts with all-reduce stalls.
        for gpu in range(4):
            fake.set_utilization_pattern(gpu, [(2.6, 96, 55), (0.6, 8, 70), (0.3, 0, 5)])
            fake.set_memory_used(gpu, (62 + gpu) * GIB)
        # GPUs 4-5: an inference service whose load drifts (changed below).
        for gpu in (4, 5):
            fake.set_utilization(gpu, 35, 20)
            fake.set_memory_used(gpu, 18 * GIB)
        # GPU 6: reserved by a notebook that holds memory and computes nothing.
        fake.set_utilization(6, 0, 0)
        fake.set_memory_used(6, 21 * GIB)
        # GPU 7: free.
        fake.set_utilization(7, 0, 0)
    rng = random.Random(7)
    t0 = time.monotonic()
    tick = 0
    while not stop.wait(5.0):
        tick += 1
        phase = (time.monotonic() - t0) / 60.0 * 2 * math.pi
        with fake.batch():
            for gpu in (4, 5):
                load = 45 + 35 * math.sin(phase + gpu) + rng.uniform(-5, 5)
                fake.set_utilization(gpu, max(0.0, min(100.0, load)), load / 3)
        if tick % 6 == 0:
            fake.inject_xid(5, 31)  # an application's illegal memory access


def free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def summary(now: Exposition, before: Exposition | None, elapsed: float) -> str:
    rows = [
        f"{'GPU':>3}  {'model':<22} {'up':>2} {'util':>5} {'avg':>5} {'memory used':>14} "
        f"{'power':>7} {'temp':>5} {'XIDs':>4}"
    ]
    models = {dict(k)["gpu"]: dict(k)["model"] for k in now.series("gpuscope_gpu_info")}
    for gpu in sorted(models, key=int):

        def get(name: str, gpu: str = gpu, **kw: str) -> float | None:
            return now.get(name, gpu=gpu, **kw)

        busy = get("gpuscope_gpu_busy_seconds_total")
        busy_before = before.get("gpuscope_gpu_busy_seconds_total", gpu=gpu) if before else None
        avg = (
            f"{(busy - busy_before) / elapsed:5.0%}"
            if busy is not None and busy_before is not None and elapsed > 0
            else "    -"
        )
        util = get("gpuscope_gpu_utilization_ratio")
        used = get("gpuscope_gpu_memory_used_bytes") or 0
        total = get("gpuscope_gpu_memory_total_bytes") or 0
        power = get("gpuscope_gpu_power_watts")
        temp = get("gpuscope_gpu_temperature_celsius", sensor="gpu")
        xids = sum(now.series("gpuscope_gpu_xid_errors_total", gpu=gpu).values())
        rows.append(
            f"{gpu:>3}  {models[gpu][:22]:<22} {int(get('gpuscope_gpu_up') or 0):>2} "
            f"{(util or 0):5.0%} {avg} {used / GIB:6.1f}/{total / GIB:5.1f} GiB "
            f"{(power or 0):6.0f}W {(temp or 0):4.0f}C {int(xids):>4}"
        )
    return "\n".join(rows)


def network_line(m: Exposition) -> str:
    status = {c: int(v) for c, v in m.by_label("gpuscope_collector_success", "collector").items()}
    if not status.get("net"):
        return f"collectors: {status} (net needs root, BPF and tracefs: see the agent's log)"
    host_tx = sum(m.series("gpuscope_pod_network_transmit_bytes_total", pod_uid="").values())
    nics = len(m.series("gpuscope_nic_info"))
    return f"collectors: {status}; host sent {host_tx / 1e6:.2f} MB since start; {nics} NIC(s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "9400")))
    parser.add_argument("--duration", type=float, default=0, help="seconds; 0 = until Ctrl-C")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between tables")
    args = parser.parse_args()

    ensure_built()
    state_dir = REPO / "build" / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    fake = FakeNvml(args.profile, state_dir / "state")
    stop = threading.Event()
    threading.Thread(target=script_workload, args=(fake, stop), daemon=True).start()

    port = free_port(args.port)
    env = os.environ | fake.env()
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "--listen",
            f"127.0.0.1:{port}",
            "--kernel-headers",
            str(REPO / "build" / "kernel-headers" / "debian"),
            "--labels-mode",
            "none",  # no API server here; `gpuscope labels` shows what would be published
        ],
        cwd=REPO,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if fetch(base + "/readyz").startswith("ready"):
                break
        except OSError:
            pass
        if agent.poll() is not None or time.monotonic() > deadline:
            print("demo: the agent did not become ready", file=sys.stderr)
            agent.kill()
            return 1
        time.sleep(0.1)

    print(f"\ngpuscope is serving a simulated {args.profile} node at {base}/metrics")
    print("GPUs 0-3: training job; 4-5: drifting inference load; 6: reserved but idle; 7: free")
    print("Try: curl -s " + base + "/metrics | grep busy_seconds   (Ctrl-C to stop)\n")

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()
    before: Exposition | None = None
    before_at = time.monotonic()
    try:
        while not stop.is_set():
            now_at = time.monotonic()
            now = Exposition(fetch(base + "/metrics"))
            print(time.strftime("%H:%M:%S"), f"({len(now.samples)} series)")
            print(summary(now, before, now_at - before_at))
            print(network_line(now), flush=True)
            print()
            before, before_at = now, now_at
            if args.duration and now_at - started >= args.duration:
                break
            stop.wait(args.every)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        agent.terminate()
        agent.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
