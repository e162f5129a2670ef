"""The GPUs of a simulated node (tests/doubles/simnode.py): one seam, a backend per vendor.

`SimNode` touches its fake GPU library only through a `GpuBackend`: the fake's batch (one
state-file write) and lock, how many devices the kubelet can allocate, the id the device
plugin advertises for each and its NUMA node, the processes each device lists (with their
memory and busy share) and, with `manage_devices`, the device's own memory used and
utilization as the sums over them. `backend_for(fake, workdir)` picks one by the fake's type:

* `NvidiaGpus` over `FakeNvml`: `nvidia.com/gpu`, GPU UUIDs (or `<uuid>::<n>` time-slicing
  replicas); exactly what SimNode did before the seam.
* `AmdGpus` over `FakeAmdSmi`: `amd.com/gpu` with the ids AMD's device plugin
  (ROCm/k8s-device-plugin) gives: a GPU's PCI address; on a compute-partitioned GPU (CPX)
  the PCI address for its first partition (XCP 0) and `amdgpu_xcp_<N>` for the others, N
  numbered node-wide as the amdgpu driver numbers its partition platform devices (7 per GPU,
  XCP 1..7, in probe order). It writes the sysfs tree the agent joins those names with
  (`<sysfs>/devices/platform/amdgpu_xcp_<N>/drm/renderD<minor>`, the minor being that
  processor's `enumeration_info.drm_render` in the fake's state), lists each container's pid
  in the processor's `amdsmi_get_gpu_process_list` (VRAM bytes, gfx busy share), and, since
  the fake's clock only moves when told, advances it with real time from a thread (so the
  agent's sampler sees busy and energy counters move as on a real node).

Device indexes are what the kubelet allocates: NVIDIA GPUs, AMD processors (on a CPX
profile the partitions: socket s, XCP k is processor s*8 + k).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakenvml.control import FakeNvml

# (bytes of device memory, busy percent, memory-busy percent) of one process on one device
Usage = tuple[int, float, float]
Changes = Mapping[tuple[int, int], Usage | None]  # (device, pid) -> usage; None: gone

MIB = 2**20
# amdgpu makes MAX_XCP - 1 partition platform devices per GPU that supports partitioning,
# numbered by one counter across the node (amdgpu_xcp_drm.c), the first partition keeping
# the GPU's own DRM device.
AMD_XCP_DEVICES_PER_GPU = 7
AMD_RENDER_BASE = 128  # renderD128: the first DRM render minor
AMD_CLOCK_TICK_S = 0.25  # how often the fake AMD clock follows real time


class GpuBackend(Protocol):
    vendor: str
    resource: str  # the extended resource the device plugin advertises
    fake: Any

    def batch(self) -> contextlib.AbstractContextManager[None]: ...
    def in_batch(self) -> bool: ...
    def count(self) -> int: ...
    def check(self, gpu: int) -> None: ...  # IndexError for a device the node lacks
    def device_id(self, gpu: int, replica: int | None) -> str: ...
    def numa(self, gpu: int) -> int: ...
    def product(self) -> str: ...
    def node_labels(self) -> dict[str, str]: ...

    def apply(
        self, changes: Changes, procs: dict[int, dict[int, Usage]], manage_devices: bool
    ) -> None:
        """Apply process changes to the fake and to `procs` (device -> pid -> usage), then,
        with manage_devices, each touched device's sums; in one batch."""

    def close(self) -> None: ...


class NvidiaGpus:
    """FakeNvml: GPU UUIDs, compute processes, memory used and utilization as NVML shows."""

    vendor = "nvidia"
    resource = "nvidia.com/gpu"

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.fake.batch()

    def in_batch(self) -> bool:
        return self.fake.in_batch()

    def count(self) -> int:
        return self.fake.gpu_count()

    def check(self, gpu: int) -> None:
        self.fake.gpu_uuid(gpu)

    def device_id(self, gpu: int, replica: int | None) -> str:
        uuid_ = self.fake.gpu_uuid(gpu)
        return uuid_ if replica is None else f"{uuid_}::{replica}"

    def numa(self, gpu: int) -> int:
        return int(self.fake.gpu_info(gpu).get("numa_node", 0))

    def product(self) -> str:
        info = self.fake.gpu_info(0) if self.fake.gpu_count() else {}
        return str(info.get("name", "")).replace(" ", "-")

    def node_labels(self) -> dict[str, str]:
        return {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product(),
            "nvidia.com/gpu.count": str(self.count()),
        }

    def apply(
        self, changes: Changes, procs: dict[int, dict[int, Usage]], manage_devices: bool
    ) -> None:
        with self.fake.batch():
            for (gpu, pid), usage in changes.items():
                table = procs.setdefault(gpu, {})
                if usage is None:
                    table.pop(pid, None)
                    self.fake.remove_process(gpu, pid)
                else:
                    table[pid] = usage
                    mem, sm, mem_util = usage
                    self.fake.add_process(gpu, pid, mem, min(sm, 100.0), min(mem_util, 100.0))
            if manage_devices:
                for gpu in {g for g, _ in changes}:
                    self._sync_device(gpu, procs.get(gpu, {}))

    def _sync_device(self, gpu: int, table: Mapping[int, Usage]) -> None:
        usages = table.values()
        info = self.fake.gpu_info(gpu)
        room = int(info["mem_total"]) - int(info["mem_reserved"])
        self.fake.set_memory_used(gpu, min(room, sum(p[0] for p in usages)))
        sm = min(100.0, sum(p[1] for p in usages))
        self.fake.set_utilization(gpu, sm, min(100.0, sum(p[2] for p in usages)))

    def close(self) -> None:
        pass


class AmdGpus:
    """FakeAmdSmi: processors as AMD's device plugin names them, their process lists, the
    partitions' sysfs devices, and the fake's clock following real time."""

    vendor = "amd"
    resource = "amd.com/gpu"

    def __init__(self, fake: FakeAmdSmi, sysfs: Path, *, real_time: bool = True) -> None:
        self.fake = fake
        self.sysfs = sysfs
        self._names: dict[int, str] = {}  # processor -> plugin id
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None
        with self.batch():
            self._names = self._plugin_names()
            self._write_sysfs()
        if real_time:
            self._clock = threading.Thread(target=self._follow_real_time, daemon=True)
            self._clock.start()

    # ---- identity ---------------------------------------------------------------------

    def _processors(self) -> list[dict[str, Any]]:
        return [self.fake.gpu(i) for i in range(self.fake.gpu_count)]

    def _render_minors(self) -> list[int | None]:
        state = self.fake.state()["processors"]
        return [p.get("enumeration_info", {}).get("drm_render") for p in state]

    def _plugin_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for i, p in enumerate(self._processors()):
            xcp, sock = int(p["xcp"]), int(p["socket"])
            if xcp == 0:
                names[i] = str(self.fake.profile["gpus"][sock]["bdf"]).lower()
            else:
                names[i] = f"amdgpu_xcp_{sock * AMD_XCP_DEVICES_PER_GPU + xcp - 1}"
        return names

    def _write_sysfs(self) -> None:
        """`devices/platform/amdgpu_xcp_<N>/drm/renderD<minor>` of every partition beyond
        the first, as the amdgpu driver makes them (on a partitioned profile only). A new
        sysfs directory is first made an overlay of the host's /sys (host_overlay)."""
        if not self.sysfs.exists():
            host_overlay(self.sysfs)
        if self.fake.partitions <= 1:
            return
        for i, minor in enumerate(self._render_minors()):
            name = self._names[i]
            if not name.startswith("amdgpu_xcp_") or minor is None:
                continue
            drm = self.sysfs / "devices" / "platform" / name / "drm"
            drm.mkdir(parents=True, exist_ok=True)
            (drm / f"renderD{minor}").mkdir(exist_ok=True)
            (drm / f"card{minor - AMD_RENDER_BASE + 1}").mkdir(exist_ok=True)

    # ---- the seam ---------------------------------------------------------------------

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.fake.batch()

    def in_batch(self) -> bool:
        return self.fake.in_batch()

    def count(self) -> int:
        return self.fake.gpu_count

    def check(self, gpu: int) -> None:
        if not 0 <= gpu < self.fake.gpu_count:
            raise IndexError(f"no AMD processor {gpu} (the node has {self.fake.gpu_count})")

    def device_id(self, gpu: int, replica: int | None) -> str:
        self.check(gpu)
        name = self._names[gpu]
        return name if replica is None else f"{name}::{replica}"

    def numa(self, gpu: int) -> int:
        return int(self.fake.gpu(gpu).get("numa_node", 0))

    def product(self) -> str:
        return str(self.fake.profile["gpus"][0].get("market_name", "")).replace(" ", "_")

    def node_labels(self) -> dict[str, str]:
        """As AMD's node labeller (ROCm/k8s-device-plugin) labels a node."""
        g = self.fake.profile["gpus"][0]
        labels = {
            "amd.com/gpu.product-name": self.product(),
            "amd.com/gpu.device-id": f"{int(g.get('device_id', 0)):x}",
            "amd.com/gpu.vram": f"{int(g.get('vram_total_mb', 0)) // 1024}G",
            "amd.com/gpu.count": str(self.count()),
        }
        compute = self.fake.profile.get("partition", {}).get("compute")
        if compute:
            labels["amd.com/compute-partitioning-mode"] = str(compute).lower()
        return labels

    def apply(
        self, changes: Changes, procs: dict[int, dict[int, Usage]], manage_devices: bool
    ) -> None:
        with self.batch():
            for (gpu, pid), usage in changes.items():
                table = procs.setdefault(gpu, {})
                if usage is None:
                    table.pop(pid, None)
                else:
                    table[pid] = usage
            for gpu in sorted({g for g, _ in changes}):
                table = procs.get(gpu, {})
                self.fake.set_processes(
                    gpu,
                    [
                        {"pid": pid, "name": "python3", "vram": mem,
                         "gfx_busy": min(sm, 100.0) / 100.0}
                        for pid, (mem, sm, _m) in sorted(table.items())
                    ],
                )  # fmt: skip
                if manage_devices:
                    self._sync_device(gpu, table)

    def _sync_device(self, gpu: int, table: Mapping[int, Usage]) -> None:
        usages = table.values()
        total_mb = int(self.fake.gpu(gpu)["vram_total_mb"])
        self.fake.set_vram_used(gpu, min(total_mb, sum(p[0] for p in usages) // MIB))
        gfx = round(min(100.0, sum(p[1] for p in usages)))
        umc = round(min(100.0, sum(p[2] for p in usages)))
        self.fake.set_activity(gpu, gfx, umc=umc)

    # ---- time -------------------------------------------------------------------------

    def _follow_real_time(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(AMD_CLOCK_TICK_S):
            now = time.monotonic()
            with contextlib.suppress(Exception):  # a closing node's state directory may go
                self.fake.advance(now - last)
            last = now

    def close(self) -> None:
        self._stop.set()
        if self._clock is not None:
            self._clock.join(timeout=5)


def host_overlay(root: Path, host: Path = Path("/sys")) -> Path:
    """`root` made a view of the host's sysfs the amdgpu devices can be added to: a link to
    every top-level entry but `devices`, in `devices` to every entry but `platform`, and in
    `platform` to every entry (the agent reads the real cgroups, NICs and PCI devices through
    it, `--sysfs root`)."""
    levels = [(host, root, "devices"), (host / "devices", root / "devices", "platform"),
              (host / "devices" / "platform", root / "devices" / "platform", None)]  # fmt: skip
    for real, view, keep in levels:
        view.mkdir(parents=True, exist_ok=True)
        for entry in sorted(real.iterdir()):
            if entry.name != keep and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    return root


def backend_for(fake: FakeNvml | FakeAmdSmi, sysfs: Path, *, real_time: bool = True) -> GpuBackend:
    """The backend of `fake`'s vendor; AMD's writes its partitions' devices under `sysfs`."""
    if isinstance(fake, FakeAmdSmi):
        return AmdGpus(fake, sysfs, real_time=real_time)
    return NvidiaGpus(fake)
