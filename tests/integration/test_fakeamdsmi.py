"""Tests of the fake AMD SMI library (issue #23), driven only through the real ``amdsmi``
Python bindings: 7.0.2 (the test venv), and 6.4.0 over the mi300x-rocm64 profile (`make
oldest-amdsmi`: $GPUSCOPE_TEST_AMD_PROFILE replaces the default "mi300x"; a profile of the
other release's ABI is skipped).

``amdsmi`` loads ``libamd_smi.so`` when imported, once per process, so every test runs it in
a subprocess with the fake's environment (``FakeAmdSmi.env()``); this module never imports it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.fakeamdsmi.control import (
    LIB_PATH,
    TEMPERATURE_TYPES,
    FakeAmdSmi,
    ensure_built,
    list_profiles,
    load_profile,
    run_profile,
    unreadable_reason,
)

SUCCESS, INVAL, NOT_SUPPORTED, INIT_ERROR, NOT_INIT = 0, 1, 2, 18, 32
OUT_OF_RESOURCES, NO_DATA, INSUFFICIENT_SIZE = 15, 40, 41
# What 7.0.2 dropped from the oldest bindings' list (6.4.0): exported as unmodelled.
OLDEST_EXTRA = {"amdsmi_get_power_info_v2"}

# Run before each test's code: the bindings, and helpers that turn a call into its status.
PRELUDE = """
import ctypes, json, sys
import amdsmi
from amdsmi import *
from amdsmi import amdsmi_wrapper as w

def status(fn, *args):
    try:
        fn(*args)
    except AmdSmiLibraryException as e:
        return e.get_error_code()
    return 0

def out(value):
    print(json.dumps(value), flush=True)
"""


@pytest.fixture
def fake(tmp_path: Path) -> FakeAmdSmi:
    ensure_built()
    profile = run_profile("mi300x")
    if reason := unreadable_reason(profile):
        pytest.skip(reason)
    return FakeAmdSmi(profile, tmp_path / "amdsmi-state.json")


def run(fake: FakeAmdSmi, code: str, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` with the real amdsmi on ``fake``; the JSON it last ``out()``s."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env={**os.environ, **fake.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wrapper_symbols() -> set[str]:
    """The symbols amdsmi_wrapper.py binds, read from the installed file (not imported)."""
    spec = importlib.util.find_spec("amdsmi")
    assert spec is not None and spec.submodule_search_locations
    text = (Path(spec.submodule_search_locations[0]) / "amdsmi_wrapper.py").read_text()
    return set(re.findall(r"_libraries\['libamd_smi\.so'\]\.([A-Za-z0-9_]+)", text))


def test_exports_exactly_what_the_wrapper_binds() -> None:
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(ensure_built())],
        capture_output=True,
        text=True,
        check=True,
    )
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    expected = wrapper_symbols()
    # 184 for 7.0.2; the oldest bindings (6.4.0, `make oldest-amdsmi`) bind one more that
    # 7.0 dropped: amdsmi_get_power_info_v2.
    assert len(expected) in (184, 177)
    assert expected <= exported
    assert len(exported) == 184 + len(OLDEST_EXTRA)  # 7.0.2's and what only 6.4 binds


def test_real_bindings_import_and_load_the_fake(fake: FakeAmdSmi) -> None:
    got = run(fake, "out([amdsmi.__file__, w._libraries['libamd_smi.so']._name])")
    assert "site-packages" in got[0]
    assert Path(got[1]) == LIB_PATH


def test_profiles_load() -> None:
    assert "mi300x" in list_profiles()
    profile = load_profile("mi300x")
    assert len(profile["gpus"]) == 8
    assert all(g["device_id"] == 0x74A1 for g in profile["gpus"])


def test_init_gives_one_gpu_per_socket(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        amdsmi_init(AmdSmiInitFlags.INIT_AMD_GPUS)
        sockets = amdsmi_get_socket_handles()
        per_socket = []
        for s in sockets:
            n = ctypes.c_uint32(0)
            assert w.amdsmi_get_processor_handles(s, ctypes.byref(n), None) == 0
            per_socket.append(n.value)
        handles = amdsmi_get_processor_handles()
        types = [amdsmi_get_processor_type(h)["processor_type"] for h in handles]
        out([len(sockets), per_socket, len(handles), types])
        """,
    )
    assert got == [8, [1] * 8, 8, ["AMDSMI_PROCESSOR_TYPE_AMD_GPU"] * 8]


def test_identity_reads_back_the_profile(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        amdsmi_init()
        out([{"asic": amdsmi_get_gpu_asic_info(h), "uuid": amdsmi_get_gpu_device_uuid(h),
              "bdf": amdsmi_get_gpu_device_bdf(h)} for h in amdsmi_get_processor_handles()])
        """,
    )
    profile = load_profile(fake.name)["gpus"]
    assert [g["bdf"] for g in got] == [p["bdf"] for p in profile]
    assert [g["uuid"] for g in got] == [p["uuid"] for p in profile]
    assert len({g["uuid"] for g in got}) == 8
    for g, p in zip(got, profile, strict=True):
        assert g["asic"] == {
            "market_name": "AMD Instinct MI300X",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": p["asic_serial"],
            "oam_id": p["oam_id"],
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            # 6.4's asic_info has no subsystem_id (its wrapper: `reserved` there)
            **({"subsystem_id": "0x74a1"} if fake.abi == "7.0" else {}),
        }


def test_metrics_read_back_the_profile(fake: FakeAmdSmi) -> None:
    fake.set_activity(3, 87, 41)
    fake.set_power(3, 702)
    fake.set_vram_used(3, 150_000)
    fake.set_temperature(3, "junction", 81)
    got = run(
        fake,
        """
        amdsmi_init()
        res = []
        for h in amdsmi_get_processor_handles():
            temps = {}
            for t in AmdSmiTemperatureType:
                if t.value > 6:
                    continue
                try:
                    temps[t.name] = amdsmi_get_temp_metric(h, t, AmdSmiTemperatureMetric.CURRENT)
                except AmdSmiLibraryException as e:
                    temps[t.name] = e.get_error_code()
            res.append({
                "vram": amdsmi_get_gpu_vram_usage(h),
                "activity": amdsmi_get_gpu_activity(h),
                "power": amdsmi_get_power_info(h),
                "temps": temps,
                "gfx_clk": amdsmi_get_clock_info(h, AmdSmiClkType.GFX),
                "mem_clk": amdsmi_get_clock_info(h, AmdSmiClkType.MEM),
                "pcie_clk": status(amdsmi_get_clock_info, h, AmdSmiClkType.PCIE),
                "temp_max": status(amdsmi_get_temp_metric, h, AmdSmiTemperatureType.HOTSPOT,
                                   AmdSmiTemperatureMetric.MAX),
            })
        out(res)
        """,
    )
    idle, busy = got[0], got[3]
    assert idle["vram"] == {"vram_total": 196608, "vram_used": 283}
    assert busy["vram"] == {"vram_total": 196608, "vram_used": 150_000}
    assert idle["activity"] == {"gfx_activity": 0, "umc_activity": 0, "mm_activity": "N/A"}
    assert busy["activity"] == {"gfx_activity": 87, "umc_activity": 41, "mm_activity": "N/A"}
    na = dict.fromkeys(["average_socket_power", "gfx_voltage", "soc_voltage", "mem_voltage"], "N/A")
    # The 6.4.0 bindings leave socket_power out of the dict (their interface).
    socket = (lambda w: {"socket_power": w}) if fake.abi == "7.0" else (lambda w: {})
    assert idle["power"] == {**socket(140), "current_socket_power": 140, "power_limit": 750, **na}
    assert busy["power"] == {**socket(702), "current_socket_power": 702, "power_limit": 750, **na}
    # MI3x: junction (HOTSPOT), VRAM and four HBM stacks; no edge sensor.
    assert idle["temps"] == {"EDGE": NOT_SUPPORTED, "HOTSPOT": 42, "VRAM": 38,
                             "HBM_0": 37, "HBM_1": 38, "HBM_2": 36, "HBM_3": 37}  # fmt: skip
    assert busy["temps"]["HOTSPOT"] == 81
    assert idle["gfx_clk"] == {"clk": 132, "min_clk": 500, "max_clk": 2100, "clk_locked": False,
                               "clk_deep_sleep": 1}  # fmt: skip
    assert idle["mem_clk"]["max_clk"] == 1300
    assert idle["pcie_clk"] == NOT_SUPPORTED
    assert idle["temp_max"] == NOT_SUPPORTED
    assert len(TEMPERATURE_TYPES) == 7


def test_calls_before_init_and_after_the_last_shutdown_are_not_init(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        null = w.amdsmi_processor_handle()
        res = [status(amdsmi_get_processor_handles), status(amdsmi_get_gpu_asic_info, null),
               status(amdsmi_get_gpu_board_info, null)]  # modelled, modelled, not modelled
        amdsmi_init()
        h = amdsmi_get_processor_handles()[0]
        amdsmi_init()  # reference-counted: the first shutdown keeps the library up
        amdsmi_shut_down()
        res.append(status(amdsmi_get_gpu_asic_info, h))
        amdsmi_shut_down()
        res += [status(amdsmi_get_gpu_asic_info, h), status(amdsmi_get_gpu_board_info, h)]
        out(res)
        """,
    )
    assert got == [NOT_INIT, NOT_INIT, NOT_INIT, SUCCESS, NOT_INIT, NOT_INIT]


def test_unmodelled_calls_are_not_supported_and_leave_buffers_alone(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        amdsmi_init()
        h = amdsmi_get_processor_handles()[0]
        board = w.amdsmi_board_info_t()
        ctypes.memset(ctypes.byref(board), 0xAB, ctypes.sizeof(board))
        rc = w.amdsmi_get_gpu_board_info(h, ctypes.byref(board))
        untouched = set(bytes(board)) == {0xAB}
        out([rc, untouched, status(amdsmi_get_violation_status, h),
             status(amdsmi_get_gpu_pci_throughput, h), status(amdsmi_get_xgmi_info, h)])
        """,
    )
    assert got == [NOT_SUPPORTED, True, NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED]


def test_invalid_handles_and_arguments_are_inval(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        amdsmi_init()
        h = amdsmi_get_processor_handles()[0]
        s = amdsmi_get_socket_handles()[0]
        bogus = w.amdsmi_processor_handle(ctypes.addressof(ctypes.c_uint64(0)))
        n = ctypes.c_uint32(38)
        uuid = ctypes.create_string_buffer(64)
        short = ctypes.c_uint32(37)
        out([
            status(amdsmi_get_gpu_asic_info, w.amdsmi_processor_handle()),
            status(amdsmi_get_gpu_vram_usage, bogus),
            w.amdsmi_get_processor_handles(w.amdsmi_socket_handle(), ctypes.byref(n), None),
            w.amdsmi_get_processor_handles(s, None, None),
            w.amdsmi_get_gpu_asic_info(h, None),
            w.amdsmi_get_gpu_device_uuid(h, ctypes.byref(short), uuid),
            w.amdsmi_get_clock_info(h, 10, ctypes.byref(w.amdsmi_clk_info_t())),
        ])
        """,
    )
    assert got == [INVAL] * 7


def test_count_then_fill_protocol(fake: FakeAmdSmi) -> None:
    got = run(
        fake,
        """
        amdsmi_init()
        n = ctypes.c_uint32(0)
        res = [w.amdsmi_get_socket_handles(ctypes.byref(n), None), n.value]
        buf = (w.amdsmi_socket_handle * 3)()
        n.value = 3  # a short buffer gets what fits, SUCCESS (amd_smi.cc)
        res += [w.amdsmi_get_socket_handles(ctypes.byref(n), buf), n.value,
                len({buf[i] for i in range(3)})]
        big = (w.amdsmi_socket_handle * 10)()
        n.value = 10
        res += [w.amdsmi_get_socket_handles(ctypes.byref(n), big), n.value]
        procs = (w.amdsmi_processor_handle * 4)()
        n.value = 0
        res += [w.amdsmi_get_processor_handles(buf[0], ctypes.byref(n), procs), n.value]
        out(res)
        """,
    )
    assert got == [SUCCESS, 8, SUCCESS, 3, 3, SUCCESS, 8, SUCCESS, 0]


def test_energy_grows_as_the_control_module_advances_it(fake: FakeAmdSmi) -> None:
    fake.set_power(0, 500)
    code = PRELUDE + textwrap.dedent(
        """
        amdsmi_init()
        hs = amdsmi_get_processor_handles()
        def read():
            return [amdsmi_get_energy_count(hs[0]), amdsmi_get_energy_count(hs[1]),
                    amdsmi_get_gpu_activity(hs[0])["gfx_activity"]]
        out(read())
        sys.stdin.readline()
        out(read())
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **fake.env()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        before = json.loads(proc.stdout.readline())
        fake.advance(10.0)  # the running process re-reads the state file on its next call
        fake.set_activity(0, 95)
        proc.stdin.write("\n")
        proc.stdin.flush()
        after = json.loads(proc.stdout.readline())
    assert proc.returncode == 0

    def joules(reading: dict[str, Any]) -> float:
        return float(reading["energy_accumulator"] * reading["counter_resolution"] / 1e6)

    assert before[0]["energy_accumulator"] > 0  # counting since boot (a day at idle)
    assert before[0]["counter_resolution"] == pytest.approx(15.259, rel=1e-6)
    assert after[0]["timestamp"] - before[0]["timestamp"] == 10_000_000_000
    assert joules(after[0]) - joules(before[0]) == pytest.approx(500 * 10, abs=0.01)
    assert joules(after[1]) - joules(before[1]) == pytest.approx(140 * 10, abs=0.01)
    assert [before[2], after[2]] == [0, 95]


def test_init_without_a_state_file_is_an_init_error(fake: FakeAmdSmi, tmp_path: Path) -> None:
    got = run(
        fake,
        """
        res = [w.amdsmi_init(2)]
        res.append(status(amdsmi_get_processor_handles))
        out(res)
        """,
        env={"FAKEAMDSMI_STATE": str(tmp_path / "missing.json")},
    )
    assert got == [INIT_ERROR, NOT_INIT]


def test_init_needs_the_gpu_flag(fake: FakeAmdSmi) -> None:
    got = run(fake, "out([w.amdsmi_init(1), w.amdsmi_init(2), w.amdsmi_shut_down()])")
    assert got == [NOT_SUPPORTED, SUCCESS, SUCCESS]


# ---- the calls of the second slice: one subprocess per profile or fault where possible ----


def fake_of(tmp_path: Path, profile: str) -> FakeAmdSmi:
    ensure_built()
    if reason := unreadable_reason(profile):
        pytest.skip(reason)
    return FakeAmdSmi(profile, tmp_path / f"{profile}.json")


def test_mi300x_metrics_pcie_xgmi_ecc_and_identity(fake: FakeAmdSmi) -> None:
    fake.set_activity(0, 80, 40)
    fake.set_xgmi_link(0, 0, read_kbps=1000, write_kbps=500)
    fake.set_xgmi_link(0, 6, status="down", read_kbps=9999)
    fake.set_pcie_bandwidth(0, 12)
    fake.set_throttle(0, ppt=0.25)
    fake.set_ecc(0, "umc", 3, 1, 2)
    fake.set_ecc(0, "gfx", 1, 0)
    fake.advance(10)
    got = run(
        fake,
        """
        amdsmi_init()
        hs = amdsmi_get_processor_handles()
        h = hs[0]
        m = amdsmi_get_gpu_metrics_info(h)
        # the 6.4.0 interface has no amdsmi_get_link_metrics (its wrapper binds the C call)
        lm = amdsmi_get_link_metrics(h) if "amdsmi_get_link_metrics" in globals() else None
        raw = w.amdsmi_link_metrics_t()
        w.amdsmi_get_link_metrics(h, ctypes.byref(raw))
        out({"m": m, "pcie": amdsmi_get_pcie_info(h), "xgmi": amdsmi_get_gpu_xgmi_link_status(h),
             "lm": lm, "raw_links": raw.num_links, "total": amdsmi_get_gpu_total_ecc_count(h),
             "umc": amdsmi_get_gpu_ecc_count(h, AmdSmiGpuBlock.UMC),
             "sem": status(amdsmi_get_gpu_ecc_count, h, AmdSmiGpuBlock.SEM),
             "bad_block": w.amdsmi_get_gpu_ecc_count(h, 3, ctypes.byref(w.amdsmi_error_count_t())),
             "driver": amdsmi_get_gpu_driver_info(h), "lib": amdsmi_get_lib_version(),
             "kfd": amdsmi_get_gpu_kfd_info(h), "enum": amdsmi_get_gpu_enumeration_info(h),
             "parts": [amdsmi_get_gpu_compute_partition(h), amdsmi_get_gpu_memory_partition(h)],
             "short": w.amdsmi_get_gpu_compute_partition(h, ctypes.create_string_buffer(8), 3),
             "numa": [amdsmi_get_gpu_topo_numa_affinity(x) for x in hs],
             "link": amdsmi_topo_get_link_type(h, hs[3]),
             "self": status(amdsmi_topo_get_link_type, h, h),
             "cap": amdsmi_get_power_cap_info(h),
             "cap1": w.amdsmi_get_power_cap_info(h, 1, ctypes.byref(w.amdsmi_power_cap_info_t())),
             "vram": amdsmi_get_gpu_vram_info(h)})
        """,
    )
    m, v70 = got["m"], fake.abi == "7.0"
    if v70:  # the 6.4.0 interface leaves the header out of the dict
        revision = (m["common_header.format_revision"], m["common_header.content_revision"])
        assert revision == (1, 8)
    assert m["temperature_edge"] == "N/A" and m["temperature_hotspot"] == 42
    assert m["throttle_status"] == "N/A" and m["average_socket_power"] == "N/A"
    assert m["average_gfx_activity"] == 80 and m["current_socket_power"] == 140
    assert m["accumulation_counter"] == 86_410_000  # a day of uptime + 10 s at 1 ms
    assert m["gfx_activity_acc"] == 80 * 10_000 and m["mem_activity_acc"] == 40 * 10_000
    assert m["ppt_residency_acc"] == 2500 and m["prochot_residency_acc"] == 0
    assert m["xgmi_read_data_acc"][:2] == [10_000, 0] and m["xgmi_write_data_acc"][0] == 5000
    assert m["xgmi_read_data_acc"][6] == 0  # a link that is down moves nothing
    assert m["xgmi_link_status"][:7] == [1, 1, 1, 1, 1, 1, 0]
    assert m["pcie_bandwidth_acc"] == 12 * 10_000 and m["pcie_bandwidth_inst"] == 12
    assert m["num_partition"] == 1
    assert m["xcp_stats.gfx_busy_inst"][0] == [80] * 8
    assert m["xcp_stats.gfx_busy_inst"][1] == ["N/A"] * 8  # SPX: one partition
    # The 6.4.0 bindings validate gfx_busy_acc as an activity (isActivity=True): any count
    # over 100 reads "N/A" there, a bug of theirs that stays reachable.
    assert m["xcp_stats.gfx_busy_acc"][0] == ([800_000] if v70 else ["N/A"]) * 8
    if v70:  # gpu_metrics v1.8: not in 6.4's xcp_stats
        assert m["xcp_stats.gfx_low_utilization_acc"][0] == [0] * 8
    else:
        assert "xcp_stats.gfx_low_utilization_acc" not in m
    assert got["pcie"]["pcie_metric"]["pcie_speed"] == 32000
    assert got["pcie"]["pcie_static"]["slot_type"] == "OAM"
    assert got["xgmi"] == {"status": ["U"] * 6 + ["D", "X"], "total_links": 8}
    assert got["raw_links"] == 7
    if v70:
        assert len(got["lm"]["links"]) == 8  # Python reads 8 of 64
        links = got["lm"]["links"]
        assert links[0]["read"] == 10_000 and links[0]["bdf"] == "0000:26:00.0"
        assert links[7]["bdf"] != "0000:00:00.0"  # slot 8 is all-ones, not a peer
    else:
        assert got["lm"] is None
    assert got["total"] == {"correctable_count": 4, "uncorrectable_count": 1, "deferred_count": 2}
    assert got["umc"] == {"correctable_count": 3, "uncorrectable_count": 1, "deferred_count": 2}
    assert [got["sem"], got["bad_block"]] == [NOT_SUPPORTED, INVAL]
    assert got["driver"]["driver_name"] == "amdgpu"
    lib = fake.profile["lib_version"]
    assert got["lib"]["major"] == lib["major"] and got["lib"]["minor"] == lib["minor"]
    assert got["lib"]["build"] == "2"  # the bindings read 1 char
    assert got["kfd"]["current_partition_id"] == 0
    assert got["enum"]["drm_render"] == 128
    assert got["parts"] == ["SPX", "NPS1"] and got["short"] == INSUFFICIENT_SIZE
    assert got["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert got["link"] == {"hops": 1, "type": 2} and got["self"] == NOT_SUPPORTED
    assert got["cap"]["power_cap"] == 750_000_000 and got["cap1"] == NOT_SUPPORTED
    assert got["vram"]["vram_size"] == 196608 and got["vram"]["vram_type"] == 4


def test_processes_count_then_fill_and_engine_ns(fake: FakeAmdSmi) -> None:
    fake.set_processes(
        1,
        [
            {"pid": 4242, "name": "python3", "vram": 8 << 30, "gfx_busy": 0.5, "cu_occupancy": 76},
            {"pid": 77, "name": "", "vram": 1 << 20},  # a root process: no name
        ],
    )
    fake.advance(2)
    got = run(
        fake,
        """
        amdsmi_init()
        h = amdsmi_get_processor_handles()[1]
        n = ctypes.c_uint32(0)
        rc0 = w.amdsmi_get_gpu_process_list(h, ctypes.byref(n), None)
        count = n.value
        one = (w.amdsmi_proc_info_t * 1)()
        n.value = 1
        rc1 = w.amdsmi_get_gpu_process_list(h, ctypes.byref(n), one)
        n.value = 2
        rc2 = w.amdsmi_get_gpu_process_list(h, ctypes.byref(n), None)
        empty = amdsmi_get_gpu_process_list(amdsmi_get_processor_handles()[0])
        out([rc0, count, rc1, n.value, one[0].pid, rc2, amdsmi_get_gpu_process_list(h), empty])
        """,
    )
    rc0, count, rc1, _, pid0, rc2, procs, empty = got
    assert [rc0, count, rc1, pid0, rc2] == [SUCCESS, 2, OUT_OF_RESOURCES, 4242, INVAL]
    assert empty == []
    first = procs[0]
    assert first["name"] == "python3" and first["engine_usage"]["gfx"] == 1_000_000_000
    assert first["memory_usage"]["vram_mem"] == 8 << 30
    assert procs[1]["name"] == "N/A"
    if fake.abi == "7.0":
        assert first["cu_occupancy"] == 76 and procs[1]["cu_occupancy"] == "N/A"
    else:  # 6.4's proc_info has no cu_occupancy
        assert "cu_occupancy" not in first


def test_pages_and_the_reserved_pages_type_error(fake: FakeAmdSmi) -> None:
    fake.set_bad_pages(2, [(0x1000, 4096, "reserved"), (0x8000, 4096, "pending")])
    fake.set_reserved_pages(2, [(0x1000, 4096, "reserved")])
    got = run(
        fake,
        """
        amdsmi_init()
        h = amdsmi_get_processor_handles()[2]
        try:
            reserved = amdsmi_get_gpu_memory_reserved_pages(h)
        except TypeError as e:
            reserved = "TypeError"
        n = ctypes.c_uint32(1)
        one = (w.amdsmi_retired_page_record_t * 1)()
        rc = w.amdsmi_get_gpu_bad_page_info(h, ctypes.byref(n), one)
        out([amdsmi_get_gpu_bad_page_info(h), reserved, rc, n.value,
             amdsmi_get_gpu_memory_reserved_pages(amdsmi_get_processor_handles()[0])])
        """,
    )
    bad, reserved, rc, written, none = got
    assert len(bad) == 2 and [b["status"] for b in bad] == [0, 1]  # RESERVED, PENDING
    assert reserved == "TypeError"  # the 7.0.2 bindings' bug, whenever a page is reserved
    assert [rc, written, none] == [INSUFFICIENT_SIZE, 1, []]


def test_events_are_delivered_once_across_reloads(fake: FakeAmdSmi) -> None:
    code = PRELUDE + textwrap.dedent(
        """
        amdsmi_init()
        hs = amdsmi_get_processor_handles()
        null = w.amdsmi_processor_handle()
        res = [w.amdsmi_set_gpu_event_notification_mask(hs[2], 1)]  # not initialised
        r0 = AmdSmiEventReader(hs[0], [AmdSmiEvtNotificationType.VMFAULT,
                                       AmdSmiEvtNotificationType.GPU_PRE_RESET])
        r1 = AmdSmiEventReader(hs[1], [AmdSmiEvtNotificationType.THERMAL_THROTTLE])
        print("ready", flush=True)
        sys.stdin.readline()
        events = r0.read(2000, 10)
        again = status(r0.read, 50, 10)
        index = {h.value: i for i, h in enumerate(hs)}
        # 7.0.2's reader gives the handle as a c_void_p, 6.4.0's as an int
        events = [(index[getattr(e["processor_handle"], "value", e["processor_handle"])],
                   e["event"], e["message"]) for e in events]
        out([res, events,
             again, status(r1.stop), status(r1.stop)])
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **fake.env()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        fake.post_event(0, "vmfault", "fault at 0x1000")
        fake.post_event(1, "thermal_throttle", "hot")
        fake.post_event(2, "vmfault", "not registered: lost")
        fake.post_event(0, "migrate_start", "masked out: lost")
        fake.advance(1)  # a reload that changes nothing about the events
        fake.post_event(0, "gpu_pre_reset", "reset")
        proc.stdin.write("\n")
        proc.stdin.flush()
        res, events, again, stop1, stop2 = json.loads(proc.stdout.readline())
    assert proc.returncode == 0
    assert res == [INIT_ERROR]
    # one read polls every registered GPU: GPU 1's event comes with GPU 0's
    assert sorted(events) == sorted(
        [[0, "VMFAULT", "fault at 0x1000"], [1, "THERMAL_THROTTLE", "hot"],
         [0, "GPU_PRE_RESET", "reset"]]
    )  # fmt: skip
    assert again == NO_DATA and [stop1, stop2] == [SUCCESS, INIT_ERROR]


def test_faults_fail_hang_release_and_lose(fake: FakeAmdSmi) -> None:
    fake.fail(3, "amdsmi_get_gpu_metrics_info", 7)  # API_FAILED
    fake.hang(4, "amdsmi_get_gpu_activity")
    code = PRELUDE + textwrap.dedent(
        """
        import threading, time
        amdsmi_init()
        hs = amdsmi_get_processor_handles()
        res = {"failed": status(amdsmi_get_gpu_metrics_info, hs[3]),
               "other_call": status(amdsmi_get_gpu_activity, hs[3])}
        done = {}
        t = threading.Thread(target=lambda: done.update(v=amdsmi_get_gpu_activity(hs[4])))
        t.start()
        time.sleep(0.3)
        res["blocked"] = "v" not in done
        res["others_answer"] = amdsmi_get_gpu_activity(hs[5])["gfx_activity"]
        print(json.dumps(res), flush=True)
        sys.stdin.readline()  # released
        t.join(5)
        res["after_release"] = done.get("v", {}).get("gfx_activity")
        sys.stdin.readline()  # lost
        res["lost"] = [status(amdsmi_get_gpu_asic_info, hs[6]),
                       status(amdsmi_get_gpu_metrics_info, hs[6])]
        res["still_listed"] = len(amdsmi_get_processor_handles())
        amdsmi_shut_down()
        amdsmi_init()
        res["after_reinit"] = len(amdsmi_get_processor_handles())
        res["cleared"] = status(amdsmi_get_gpu_metrics_info, amdsmi_get_processor_handles()[3])
        out(res)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **fake.env()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        fake.release(4)
        proc.stdin.write("\n")
        proc.stdin.flush()
        fake.lose(6)
        fake.clear_fail(3)
        proc.stdin.write("\n")
        proc.stdin.flush()
        res = json.loads(proc.stdout.readline())
    assert proc.returncode == 0
    assert first == {"failed": 7, "other_call": SUCCESS, "blocked": True, "others_answer": 0}
    assert res["after_release"] == 0
    assert res["lost"] == [NOT_SUPPORTED, NOT_SUPPORTED] and res["still_listed"] == 8
    assert res["after_reinit"] == 7 and res["cleared"] == SUCCESS


def test_mi300x_cpx_partitions(tmp_path: Path) -> None:
    fake = fake_of(tmp_path, "mi300x-cpx")
    fake.set_activity(1, 60)
    fake.advance(1)
    got = run(
        fake,
        """
        amdsmi_init()
        sockets = amdsmi_get_socket_handles()
        hs = amdsmi_get_processor_handles()
        p = hs[:8]
        m = amdsmi_get_gpu_metrics_info(p[0])
        out({"n": [len(sockets), len(hs)], "bdf": [amdsmi_get_gpu_device_bdf(h) for h in p],
             "uuids": len({amdsmi_get_gpu_device_uuid(h) for h in p}),
             "kfd": [amdsmi_get_gpu_kfd_info(h)["current_partition_id"] for h in p],
             "metrics": [status(amdsmi_get_gpu_metrics_info, h) for h in p[1:]],
             "activity1": status(amdsmi_get_gpu_activity, p[1]),
             "num_partition": m["num_partition"],
             "xcp1": m["xcp_stats.gfx_busy_inst"][1],
             "vram": [amdsmi_get_gpu_vram_usage(h)["vram_total"] for h in p[:2]],
             "parts": [amdsmi_get_gpu_compute_partition(p[5]),
                       amdsmi_get_gpu_memory_partition(p[5])],
             "link": [amdsmi_topo_get_link_type(p[0], p[1]),
                      amdsmi_topo_get_link_type(p[0], hs[8])]})
        """,
    )
    assert got["n"] == [8, 64]
    assert got["bdf"] == [f"0000:05:00.{i}" for i in range(8)]
    assert got["uuids"] == 8 and got["kfd"] == list(range(8))
    assert got["metrics"] == [NOT_SUPPORTED] * 7 and got["activity1"] == NOT_SUPPORTED
    assert got["num_partition"] == 8
    assert got["xcp1"] == [60] + ["N/A"] * 7  # one XCC per CPX partition
    assert got["vram"] == [49152, 49152]
    assert got["parts"] == ["CPX", "NPS4"]
    assert got["link"] == [{"hops": 1, "type": 2}, {"hops": 1, "type": 2}]


def test_mi250x_gcds(tmp_path: Path) -> None:
    fake = fake_of(tmp_path, "mi250x")
    got = run(
        fake,
        """
        amdsmi_init()
        hs = amdsmi_get_processor_handles()
        m = amdsmi_get_gpu_metrics_info(hs[0])
        out({"n": len(hs), "bdf": [amdsmi_get_gpu_device_bdf(h) for h in hs[:2]],
             "power": [amdsmi_get_power_info(h) for h in hs[:2]],
             "cap": [amdsmi_get_power_cap_info(h)["power_cap"] for h in hs[:2]],
             "rev": [m["common_header.format_revision"], m["common_header.content_revision"]],
             "acc": [m["accumulation_counter"], m["xgmi_read_data_acc"][0], m["temperature_edge"],
                     m["average_socket_power"], m["current_socket_power"]],
             "gfx": amdsmi_get_gpu_asic_info(hs[0])["target_graphics_version"],
             "vram": amdsmi_get_gpu_vram_usage(hs[1])["vram_total"],
             "partition": status(amdsmi_get_gpu_compute_partition, hs[0]),
             "far": amdsmi_topo_get_link_type(hs[0], hs[7])["hops"]})
        """,
    )
    assert got["n"] == 8 and got["bdf"] == ["0000:29:00.0", "0000:2a:00.0"]
    assert got["power"][0]["average_socket_power"] == 90
    assert got["power"][0]["current_socket_power"] == "N/A"
    assert got["power"][1]["average_socket_power"] == "N/A"
    assert got["cap"] == [560_000_000, 0]
    assert got["rev"] == [1, 3]
    assert got["acc"] == ["N/A", "N/A", 35, 90, "N/A"]
    assert got["gfx"] == "gfx90a" and got["vram"] == 65536
    assert got["partition"] == NOT_SUPPORTED and got["far"] == 2


def test_mi300x_rocm62_release(tmp_path: Path) -> None:
    fake = fake_of(tmp_path, "mi300x-rocm62")
    got = run(
        fake,
        """
        amdsmi_init()
        p = amdsmi_get_processor_handles()[:8]
        m = amdsmi_get_gpu_metrics_info(p[0])
        out({"uuids": len({amdsmi_get_gpu_device_uuid(h) for h in p}),
             "rev": m["common_header.content_revision"],
             "acc": [m["accumulation_counter"], m["num_partition"], m["xgmi_read_data_acc"][0]],
             "missing": [status(f, p[0]) for f in (amdsmi_get_gpu_kfd_info,
                         amdsmi_get_gpu_enumeration_info, amdsmi_get_gpu_xgmi_link_status)],
             "lib": amdsmi_get_lib_version()["major"],
             "link_metrics": amdsmi_get_link_metrics(p[0])["num_links"]})
        """,
    )
    assert got["uuids"] == 1 and got["rev"] == 5
    assert got["acc"] == ["N/A", "N/A", 0]
    assert got["missing"] == [NOT_SUPPORTED] * 3
    assert got["lib"] == 24 and got["link_metrics"] == 7
