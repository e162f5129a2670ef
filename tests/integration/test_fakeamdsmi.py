"""Tests of the fake AMD SMI library (issue #23), driven only through the real ``amdsmi``
7.0.2 Python bindings.

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
    return FakeAmdSmi("mi300x", tmp_path / "amdsmi-state.json")


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
    assert exported - expected <= {"amdsmi_get_power_info_v2"} | (OLDEST_EXTRA - expected)


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
    profile = load_profile("mi300x")["gpus"]
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
            "subsystem_id": "0x74a1",
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
    assert idle["power"] == {
        "socket_power": 140,
        "current_socket_power": 140,
        "power_limit": 750,
        **na,
    }
    assert busy["power"] == {
        "socket_power": 702,
        "current_socket_power": 702,
        "power_limit": 750,
        **na,
    }
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
