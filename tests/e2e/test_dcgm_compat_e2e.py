"""End to end, the agent's DCGM compatibility names (--dcgm-compat): two real agents on the
simulated node (tests/doubles/simnode.py: pods on GPUs 0-6, GPU 6 time-sliced between two
notebooks, GPU 7 free), one with `--dcgm-compat on`, one with `exported-labels`, each scraped
by a real Prometheus of its own, and for both

- every counter of dcgm-exporter's default list (the fixture
  tests/rules/dcgm-exporter/default-counters.csv) is served, or has no series where gpuscope
  has no source; every DCGM_FI_* name has a series for every GPU that has its source (all
  eight GPUs of the fake DGX H100 have them all), one per holding container;
- each carries exactly dcgm-exporter's labels, with the values gpuscope's own series give:
  Hostname and hostname both the node, device nvidia<gpu>, UUID, modelName, pci_bus_id and
  DCGM_FI_DRIVER_VERSION from gpuscope_gpu_info, the holders in gpuscope_gpu_allocation_info
  (none on the free GPU) as namespace/pod/container, or exported_namespace/_pod/_container
  in the variant, and the scrape's own target labels (job, instance, cluster, node);
- each value equals the unit conversion of its source in the same scrape (queried at the
  sample's own timestamp): % = ratio x 100, MiB, MHz, mJ, and XID_ERRORS the highest XID
  number counted on the GPU, computed here from the xid labels. The throughputs are the GPU
  source's per-second figures, which no gpuscope series holds: NVLink's, the counters'
  increase between two collections, is held to `irate()` of gpuscope's byte counters (the
  agents collect once per scrape here, --collection-max-age 0); PCIe's, on this driver the
  sampler's latest throughput reading, to `rate()` over the last minute of the integrated
  counter, within the steps that counter moves in (each GPU every 8 s here: one GPU a
  sampler tick), once the agents have run for more than that minute (RATES_AFTER_S).

The whole-GPU check runs the agents at the default detail level, with the SM, tensor and
DRAM ratios included (--metrics-include) so that their DCGM names have a gpuscope series to
be compared with; SM occupancy and the FP pipes (full detail only) serve nothing. On the
fake's MIG profile (GPUs 6 and 7 in MIG mode), run at full detail, each GPU instance also
has its own FB_USED, FB_FREE and DCGM_FI_PROF_* series with GPU_I_ID and GPU_I_PROFILE,
valued as its MIG devices' gpuscope_mig_* series.

The checks repeat until one round passes, within a bounded wait (the agents start, the
holders are found, the XIDs are counted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.simnode import SimNode, training_scenario
from tests.e2e import test_prometheus_e2e as prometheus_e2e
from tests.e2e.test_prometheus_e2e import CLUSTER, Prometheus, PromQLError
from tests.support import AgentProcess, dcgm, sim_node_args

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.root(reason="the simulated node puts its pods in cgroups"),
]

SIM_NODE = "sim-node-1"
GPUS = 8
SETTLE_TIMEOUT_S = 25.0
# GPU -> XIDs injected (DCGM value: the highest). None of them fences the GPU (79, 119, 120
# would: its series would go, but for up, info and XIDs).
XIDS = {4: (13, 48), 5: (109,)}
HOLDER_LABELS = dcgm.HOLDER_LABELS  # gpuscope_gpu_allocation_info's

# Each compatibility series' source in dcgm-exporter's unit, one series per uuid: written
# here from docs/metrics.md's units, independently of the renderer.
SOURCES: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "100 * gpuscope_gpu_utilization_ratio",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "100 * gpuscope_gpu_memory_utilization_ratio",
    "DCGM_FI_DEV_FB_USED": "gpuscope_gpu_memory_used_bytes / 2^20",
    "DCGM_FI_DEV_FB_FREE": "(gpuscope_gpu_memory_total_bytes - gpuscope_gpu_memory_used_bytes"
    " - gpuscope_gpu_memory_reserved_bytes) / 2^20",
    "DCGM_FI_DEV_FB_RESERVED": "gpuscope_gpu_memory_reserved_bytes / 2^20",
    "DCGM_FI_DEV_POWER_USAGE": "gpuscope_gpu_power_watts",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "gpuscope_gpu_energy_joules_total * 1000",
    "DCGM_FI_DEV_SM_CLOCK": 'gpuscope_gpu_clock_hertz{clock="sm"} / 1e6',
    "DCGM_FI_DEV_MEM_CLOCK": 'gpuscope_gpu_clock_hertz{clock="memory"} / 1e6',
    "DCGM_FI_DEV_GPU_TEMP": 'gpuscope_gpu_temperature_celsius{sensor="gpu"}',
    "DCGM_FI_DEV_MEMORY_TEMP": 'gpuscope_gpu_temperature_celsius{sensor="memory"}',
    "DCGM_FI_PROF_PCIE_TX_BYTES": "rate(gpuscope_gpu_pcie_transmit_bytes_total[1m])",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "rate(gpuscope_gpu_pcie_receive_bytes_total[1m])",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": "rate(gpuscope_gpu_pcie_transmit_bytes_total[1m]) / 1024",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": "rate(gpuscope_gpu_pcie_receive_bytes_total[1m]) / 1024",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "gpuscope_gpu_pcie_replay_errors_total",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "(irate(gpuscope_gpu_nvlink_transmit_bytes_total[30s])"
    " + irate(gpuscope_gpu_nvlink_receive_bytes_total[30s])) / 1e6",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "gpuscope_gpu_remapped_rows_total"
    '{type="uncorrectable"}',
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 'gpuscope_gpu_remapped_rows_total{type="correctable"}',
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gpuscope_gpu_row_remap_failure",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpuscope_gpu_graphics_engine_active_ratio",
    # The last GPM window's ratios (served at the default level with INCLUDE_RATIOS).
    "DCGM_FI_PROF_SM_ACTIVE": "gpuscope_gpu_sm_active_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpuscope_gpu_tensor_active_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gpuscope_gpu_dram_active_ratio",
}
INCLUDE_RATIOS = "gpuscope_gpu_(sm|tensor|dram)_active_ratio"
# Rates: the source's own window is not a gpuscope series, so the values are compared within
# a tolerance (the module docstring says why each): relative, by name.
RATE_TOLERANCE = {
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0.1,
    **dict.fromkeys(
        ["DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
         "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"],
        0.2,
    ),
}  # fmt: skip
RATES_AFTER_S = 80.0  # the PCIe counters' minute of history, and the first readings' hold
# Sources served at full detail only: these record nothing at the default level.
FULL_DETAIL_ONLY = {
    "DCGM_FI_PROF_SM_OCCUPANCY": "gpuscope_gpu_sm_occupancy_ratio",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 'gpuscope_gpu_pipe_active_ratio{pipe="fp64"}',
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 'gpuscope_gpu_pipe_active_ratio{pipe="fp32"}',
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 'gpuscope_gpu_pipe_active_ratio{pipe="fp16"}',
}
COMPUTED_HERE = {"DCGM_FI_DEV_XID_ERRORS": "from the xid labels of gpuscope_gpu_xid_errors_total"}


def compat_names() -> list[str]:
    return dcgm.served_names()


def test_every_compatibility_series_has_a_source_here() -> None:
    assert sorted(compat_names()) == sorted([*SOURCES, *FULL_DETAIL_ONLY, *COMPUTED_HERE])


def test_every_counter_of_the_list_is_checked_here() -> None:
    """The fixture's series counters are each checked for a value or for having no series,
    and its label fields are labels the checks expect on every series."""
    checked = {*SOURCES, *FULL_DETAIL_ONLY, *COMPUTED_HERE, *dcgm.NO_GPUSCOPE_SOURCE}
    missing = [c.name for c in dcgm.metric_counters() if c.name not in checked]
    assert not missing, f"counters of dcgm-exporter's list no check covers: {missing}"
    labels = [c.name for c in dcgm.default_counters() if c.type == "label"]
    assert labels and set(labels) <= dcgm.DEVICE_LABELS


@dataclass
class CompatNode:
    sim: SimNode
    agents: dict[str, AgentProcess]  # --dcgm-compat value -> the agent running with it
    proms: dict[str, Prometheus]  # --dcgm-compat value -> the Prometheus scraping that agent
    started: float  # monotonic, when the agents were started


@pytest.fixture
def compat_node(
    tmp_path: Path,
    agent_process: Callable[..., AgentProcess],
    sim_node: Callable[..., SimNode],
) -> Iterator[CompatNode]:
    sim = sim_node(SIM_NODE)  # on real time: the agents' samplers run
    training_scenario(sim)
    sim.fake.set_remapped_rows(3, 2, 1, pending=False, failure=True)
    started = time.monotonic()
    # One agent per variant on the one node, each scraped by a Prometheus of its own (with
    # gpuscope's rules, start_prometheus's RULES: no DCGM rules exist), once a collection.
    agents = {
        variant: agent_process(
            *sim_node_args(sim), "--collectors", "gpu,kubelet,pods", "--dcgm-compat", variant,
            "--metrics-include", INCLUDE_RATIOS, "--collection-max-age", "0",
            env=sim.fake.env(),
        )
        for variant in dcgm.VARIANTS
    }  # fmt: skip
    proms: dict[str, Prometheus] = {}
    try:
        for variant, agent in agents.items():
            proms[variant] = prometheus_e2e.start_prometheus(
                tmp_path / variant, {SIM_NODE: f"127.0.0.1:{agent.port}"}
            )
        yield CompatNode(sim, agents, proms, started)
    finally:
        for prom in proms.values():
            prom.proc.terminate()
        for prom in proms.values():
            prom.proc.wait(10)


def _by_uuid(result: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in result:
        uuid = s["metric"].get("uuid") or s["metric"].get("UUID", "")
        assert uuid not in out, f"two series for {uuid}: {result}"
        out[uuid] = float(s["value"][1])
    return out


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _query_at(prom: Prometheus, expr: str, at: float) -> list[dict[str, Any]]:
    data = prom.get("/api/v1/query", query=expr, time=f"{at:.3f}")
    result: list[dict[str, Any]] = data["result"]
    return result


def _xid_values(prom: Prometheus, at: float) -> dict[str, float]:
    """DCGM's XID_ERRORS as the compatibility layer defines it, from gpuscope's counters:
    the highest XID number counted on the GPU, 0 where XID events are watched and none came
    (the default detail level serves the watched flag only where it is 0)."""
    watched = "gpuscope_gpu_info unless on (uuid) gpuscope_gpu_xid_events_watched == 0"
    values = {uuid: 0.0 for uuid in _by_uuid(_query_at(prom, watched, at))}
    for s in _query_at(prom, "gpuscope_gpu_xid_errors_total", at):
        uuid = s["metric"]["uuid"]
        values[uuid] = max(values.get(uuid, 0.0), float(s["metric"]["xid"]))
    return values


def _near(value: float, want: float, tolerance: float) -> bool:
    return math.isclose(value, want, rel_tol=tolerance, abs_tol=1e-9)


def check_round(node: CompatNode, variant: str, *, rates: bool = True) -> dict[str, str]:
    """One round of every check against the Prometheus scraping the agent with `variant`;
    {where: what is wrong}, empty when all hold. `rates`: compare the throughputs' values
    too (the agents have run long enough, RATES_AFTER_S)."""
    prom, problems = node.proms[variant], {}
    holder_names = dcgm.VARIANTS[variant]  # what the holders' labels are called on its series
    info = {s["metric"]["uuid"]: s["metric"] for s in prom.query("gpuscope_gpu_info")}
    holders: dict[str, set[tuple[str, ...]]] = {uuid: set() for uuid in info}
    for s in prom.query("gpuscope_gpu_allocation_info"):
        holders[s["metric"]["uuid"]].add(tuple(s["metric"][k] for k in HOLDER_LABELS))
    if len(info) != GPUS or not any(holders.values()):
        return {"sources": f"{len(info)} GPUs in gpuscope_gpu_info, holders {holders}"}
    for name in FULL_DETAIL_ONLY:
        if prom.query(name):
            problems[name] = "served at the default detail level, where it is full only"
    for name in dcgm.NO_GPUSCOPE_SOURCE:
        if prom.query(f"{{__name__='{name}'}}"):
            problems[name] = "served, although gpuscope has no source for it"
    for name in compat_names():
        if name in FULL_DETAIL_ONLY:
            continue
        series = prom.query(f"{name}{{Hostname='{SIM_NODE}', hostname='{SIM_NODE}'}}")
        got_holders: dict[str, set[tuple[str, ...]]] = {uuid: set() for uuid in info}
        for s in series:
            labels = dict(s["metric"])
            pod = holder_names[1]
            where = f"{name}{{gpu={labels.get('gpu')}, {pod}={labels.get(pod)}}}"
            uuid = labels.get("UUID", "")
            source = info.get(uuid)
            if source is None:
                problems[where] = f"UUID {uuid!r} is no GPU of gpuscope_gpu_info"
                continue
            expected = {
                "__name__": name,
                "gpu": source["gpu"],
                "UUID": uuid,
                "device": f"nvidia{source['gpu']}",
                "modelName": source["model"],
                "Hostname": SIM_NODE,
                "hostname": SIM_NODE,
                "pci_bus_id": source["pci_bus_id"],
                "DCGM_FI_DRIVER_VERSION": source["driver_version"],
                "job": "gpuscope",
                "instance": f"127.0.0.1:{node.agents[variant].port}",
                "cluster": CLUSTER,  # the scrape's target labels, as on every series
                "node": SIM_NODE,
            }
            holder = tuple(labels.pop(k, "") for k in holder_names)
            if labels != expected:
                problems[where] = f"labels {labels}, expected {expected}"
            got_holders[uuid].add(holder)
        want_series = sum(len(h) or 1 for h in holders.values())
        if len(series) != want_series:  # one series per GPU and holder, both host labels on it
            problems[f"{name} series"] = f"{len(series)}, expected {want_series}"
        for uuid, want in holders.items():
            want = want or {("", "", "")}
            if got_holders[uuid] != want:
                problems[f"{name} GPU {info[uuid]['gpu']}"] = (
                    f"holders {sorted(got_holders[uuid])}, expected {sorted(want)}"
                )
        stamps = {float(s["value"][1]) for s in prom.query(f"timestamp({name})")}
        if len(stamps) != 1:
            problems[f"{name} timestamp"] = f"{stamps}"
            continue
        (at,) = stamps
        recorded = _query_at(prom, name, at)
        expected_values = (
            _xid_values(prom, at)
            if name in COMPUTED_HERE
            else _by_uuid(_query_at(prom, SOURCES[name], at))
        )
        if set(expected_values) != set(info):
            problems[f"{name} source"] = f"for {len(expected_values)} of {GPUS} GPUs"
        tolerance = RATE_TOLERANCE.get(name)
        if tolerance is not None and not rates:
            continue
        for s in recorded:
            uuid = s["metric"]["UUID"]
            value, want_value = float(s["value"][1]), expected_values.get(uuid, math.nan)
            near = (
                _close(value, want_value)
                if tolerance is None
                else _near(value, want_value, tolerance)
            )
            if not near:
                problems[f"{name} GPU {s['metric']['gpu']} value"] = (
                    f"{value} != {want_value} (source at {at})"
                )
    return problems


def test_every_compatibility_series_has_dcgm_labels_and_its_sources_value(
    compat_node: CompatNode,
) -> None:
    fake = compat_node.sim.fake
    for gpu, xids in XIDS.items():
        for xid in xids:
            fake.inject_xid(gpu, xid)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    pending: dict[str, dict[str, str]] = {
        variant: {"": "not checked"} for variant in compat_node.proms
    }
    rounds = 0
    # Both variants are checked in the same rounds, each until one round of its passes.
    while any(pending.values()) and time.monotonic() < deadline:
        time.sleep(1)
        rounds += 1
        for variant, problems in pending.items():
            if not problems:
                continue
            try:
                pending[variant] = check_round(compat_node, variant, rates=False)
            except PromQLError as err:
                pending[variant] = {"query": str(err)}
    # Then the throughputs' values, once their sources have a minute of history.
    time.sleep(max(0.0, compat_node.started + RATES_AFTER_S - time.monotonic()))
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for variant, problems in pending.items():
        pending[variant] = problems or {"": "not checked"}
    while any(pending.values()) and time.monotonic() < deadline:
        time.sleep(1)
        rounds += 1
        for variant, problems in pending.items():
            if problems:
                try:
                    pending[variant] = check_round(compat_node, variant, rates=True)
                except PromQLError as err:
                    pending[variant] = {"query": str(err)}
    for variant, problems in pending.items():
        prom = compat_node.proms[variant]
        report = "\n".join(f"  {where}: {why}" for where, why in sorted(problems.items()))
        assert not problems, (
            f"{variant}: {len(problems)} problem(s) after {rounds} rounds:\n{report}\n"
            f"prometheus log:\n{prom.logs()}\n"
            f"agent log (tail):\n{compat_node.agents[variant].logs()[-2000:]}"
        )
    for variant, prom in compat_node.proms.items():
        # The injected XIDs were counted, so XID_ERRORS was checked against numbers, not zeros.
        values = {
            int(s["metric"]["gpu"]): float(s["value"][1])
            for s in prom.query("max by (gpu) (DCGM_FI_DEV_XID_ERRORS)")
        }
        assert values == {gpu: float(max(XIDS.get(gpu, (0,)))) for gpu in range(GPUS)}
        # Time-slicing: GPU 6 has one series per notebook, each with the whole GPU's value,
        # told apart by the variant's pod label.
        pod = dcgm.VARIANTS[variant][1]
        pods = {s["metric"].get(pod) for s in prom.query('DCGM_FI_DEV_FB_USED{gpu="6"}')}
        assert len(pods) == 2 and "" not in pods and None not in pods, (variant, pods)
        # The derived PCIe names are the new ones / 1024 exactly, in the same scrape.
        ratio = prom.query(
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT * 1024 / (DCGM_FI_PROF_PCIE_TX_BYTES > 0)"
        )
        assert ratio and {float(s["value"][1]) for s in ratio} == {1.0}, ratio
    print(f"\nall compatibility series matched their sources after {rounds} round(s)")


# --- MIG: one series per GPU instance -----------------------------------------------------

MIG_PROFILE = "dgx-h100-mig"  # GPUs 6 and 7 in MIG mode, four GPU instances each
MIG_SOURCES: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "gpuscope_mig_memory_used_bytes / 2^20",
    "DCGM_FI_DEV_FB_FREE": "(gpuscope_mig_memory_total_bytes - gpuscope_mig_memory_used_bytes)"
    " / 2^20",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpuscope_mig_graphics_engine_active_ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "gpuscope_mig_sm_active_ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "gpuscope_mig_sm_occupancy_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpuscope_mig_tensor_active_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gpuscope_mig_dram_active_ratio",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 'gpuscope_mig_pipe_active_ratio{pipe="fp64"}',
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 'gpuscope_mig_pipe_active_ratio{pipe="fp32"}',
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 'gpuscope_mig_pipe_active_ratio{pipe="fp16"}',
}


def check_mig_round(prom: Prometheus, port: int) -> dict[str, str]:
    """Every MIG GPU instance has each per-instance field, with the parent's dcgm labels plus
    GPU_I_ID and GPU_I_PROFILE and no holder labels, valued as its MIG devices' source."""
    problems: dict[str, str] = {}
    info = {s["metric"]["uuid"]: s["metric"] for s in prom.query("gpuscope_gpu_info")}
    migs = {s["metric"]["mig_uuid"]: s["metric"] for s in prom.query("gpuscope_mig_info")}
    instances = {(m["uuid"], m["gpu_instance"]): m["profile"] for m in migs.values()}
    if not instances:
        return {"sources": "no gpuscope_mig_info yet"}
    for name, source in MIG_SOURCES.items():
        stamps = {float(s["value"][1]) for s in prom.query(f"timestamp({name})")}
        if len(stamps) != 1:
            problems[f"{name} timestamp"] = f"{stamps}"
            continue
        (at,) = stamps
        expected: dict[tuple[str, str], float] = {}
        for s in _query_at(prom, source, at):
            m = migs[s["metric"]["mig_uuid"]]
            key = (m["uuid"], m["gpu_instance"])
            expected[key] = max(expected.get(key, -math.inf), float(s["value"][1]))
        got = {}
        for s in _query_at(prom, f'{name}{{GPU_I_ID!=""}}', at):
            labels = dict(s["metric"])
            key = (labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
            parent = info.get(key[0], {})
            want = {
                "__name__": name,
                "gpu": parent.get("gpu"),
                "UUID": key[0],
                "device": f"nvidia{parent.get('gpu')}",
                "modelName": parent.get("model"),
                "Hostname": SIM_NODE,
                "hostname": SIM_NODE,
                "pci_bus_id": parent.get("pci_bus_id"),
                "DCGM_FI_DRIVER_VERSION": parent.get("driver_version"),
                "GPU_I_ID": key[1],
                "GPU_I_PROFILE": instances.get(key),
                "job": "gpuscope",
                "instance": f"127.0.0.1:{port}",
                "cluster": CLUSTER,
                "node": SIM_NODE,
            }
            if labels != want:
                problems[f"{name} {key}"] = f"labels {labels}, expected {want}"
            got[key] = float(s["value"][1])
        if set(got) != set(instances) or set(expected) != set(instances):
            problems[f"{name} instances"] = f"{sorted(got)} / sources {sorted(expected)}"
        for key, value in got.items():
            if not _close(value, expected.get(key, math.nan)):
                problems[f"{name} {key} value"] = f"{value} != {expected.get(key)}"
    return problems


def test_mig_gpu_instances_get_their_own_series_with_gpu_i_id_and_profile(
    tmp_path: Path,
    agent_process: Callable[..., AgentProcess],
) -> None:
    fake = FakeNvml(MIG_PROFILE, tmp_path / "mig.state")
    agent = agent_process(
        "--collectors", "gpu", "--labels-mode", "none", "--metrics-detail", "full",
        "--dcgm-compat", "on", "--node-name", SIM_NODE, env=fake.env(),
    )  # fmt: skip
    prom = prometheus_e2e.start_prometheus(tmp_path / "prom", {SIM_NODE: f"127.0.0.1:{agent.port}"})
    try:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        problems: dict[str, str] = {"": "not checked"}
        while problems and time.monotonic() < deadline:
            time.sleep(1)
            try:
                problems = check_mig_round(prom, agent.port)
            except PromQLError as err:
                problems = {"query": str(err)}
        report = "\n".join(f"  {where}: {why}" for where, why in sorted(problems.items()))
        assert not problems, f"{len(problems)} problem(s):\n{report}\n{prom.logs()}"
        # Eight instances on GPUs 6 and 7; the per-GPU series of every GPU stay (not split).
        assert len(prom.query('DCGM_FI_DEV_FB_USED{GPU_I_ID!=""}')) == 8
        assert len(prom.query('DCGM_FI_DEV_FB_USED{GPU_I_ID=""}')) == GPUS
    finally:
        prom.proc.terminate()
        prom.proc.wait(10)
