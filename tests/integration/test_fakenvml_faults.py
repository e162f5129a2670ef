"""The fake NVML's fault controls, through the real pynvml: hung calls and error storms.

`FakeNvml.hang_call()` stands for a GPU whose firmware stopped answering (XID 119/120, GSP
timeout): its calls block, the other GPUs' do not. `error_storm()` stands for a driver in
trouble answering UNKNOWN/TIMEOUT/GPU_IS_LOST call after call. Tests wait for "the call is
now stuck" through `wait_blocked()`, never by sleeping. See tests/doubles/README.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as nv
import pytest

from tests.doubles.fakenvml.control import FakeNvml

T0 = 1_700_000_000.0  # frozen fake clock, epoch seconds
POWER = "nvmlDeviceGetPowerUsage"
TEMPERATURE = "nvmlDeviceGetTemperature"
JOIN_S = 20.0  # generous bound on any wait for a call that should return


class Call(threading.Thread):
    """One NVML call on its own thread; `result` or `error` once it returned."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def returned(self, timeout: float = JOIN_S) -> Any:
        """The call's result once it returned (bounded wait); raises what the call raised."""
        self.join(timeout)
        assert not self.is_alive(), f"the call did not return within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def make_fake(tmp_path: Path) -> Iterator[Callable[[str], FakeNvml]]:
    """make(profile): a fake at T0, activated in this process with nvmlInit done (one per
    test); every hang is released at teardown, so a failing test leaves no thread blocked."""
    made: list[FakeNvml] = []

    def make(profile: str) -> FakeNvml:
        assert not made, "one fake per test"
        f = FakeNvml(profile, tmp_path / "state", now=T0)
        f.activate()
        nv.nvmlInit()
        made.append(f)
        return f

    yield make
    for f in made:
        f.release_calls()
        f.clear_error_storm()
        nv.nvmlShutdown()


@pytest.fixture
def fake(make_fake: Callable[[str], FakeNvml]) -> FakeNvml:
    return make_fake("dgx-h100")


def h(i: int) -> Any:
    return nv.nvmlDeviceGetHandleByIndex(i)


def power(i: int) -> int:
    return int(nv.nvmlDeviceGetPowerUsage(h(i)))


def error_of(call: Callable[[], Any]) -> int | None:
    """The NVML error code the call raised, None if it answered."""
    try:
        call()
    except nv.NVMLError as e:
        return int(e.value)
    return None


def me(fake: FakeNvml) -> list[tuple[str, int | None]]:
    return [(c.function, c.gpu) for c in fake.blocked_calls() if c.pid == os.getpid()]


# ---- hangs ------------------------------------------------------------------------------------


def test_a_hung_gpu_blocks_its_calls_but_not_the_other_gpus(fake: FakeNvml) -> None:
    expected = power(1)
    fake.hang_call(POWER, gpu=1)

    stuck = Call(lambda: power(1))
    fake.wait_blocked(function=POWER, gpu=1, pid=os.getpid())
    # While that call is blocked: other GPUs, and other calls on GPU 1, answer.
    assert Call(lambda: power(0)).returned() == power(0)
    assert Call(lambda: nv.nvmlDeviceGetTemperature(h(1), 0)).returned() > 0
    # A second call on the hung GPU hangs the same way.
    second = Call(lambda: power(1))
    fake.wait_blocked(2, function=POWER, gpu=1, pid=os.getpid())
    assert stuck.is_alive() and second.is_alive()

    fake.release_calls()
    assert stuck.returned() == expected
    assert second.returned() == expected
    assert me(fake) == []


def test_a_hung_call_answers_from_the_state_when_it_returns(fake: FakeNvml) -> None:
    fake.hang_call(POWER, gpu=3)
    stuck = Call(lambda: power(3))
    fake.wait_blocked(function=POWER, gpu=3)
    fake.set_power(3, 432.5)  # the world moved on while the call was stuck
    fake.release_calls(gpu=3)
    assert stuck.returned() == 432500


def test_a_hang_with_seconds_ends_on_its_own(fake: FakeNvml) -> None:
    expected = power(2)
    fake.hang_call(gpu=2, seconds=2.0)  # every call on GPU 2, for 2 s of real time
    stuck = Call(lambda: power(2))
    assert fake.wait_blocked(gpu=2)[0].function == POWER
    assert stuck.returned() == expected  # never released
    assert Call(lambda: power(2)).returned() == expected  # the rule has expired for good
    assert me(fake) == []


def test_a_hung_gpu_hangs_its_mig_devices_too(make_fake: Callable[[str], FakeNvml]) -> None:
    fake = make_fake("hgx-a100-mig")  # GPUs 6 and 7 in MIG mode
    mig6, mig7 = (nv.nvmlDeviceGetMigDeviceHandleByIndex(h(i), 0) for i in (6, 7))
    fake.hang_call("nvmlDeviceGetMemoryInfo", gpu=6)
    stuck = Call(lambda: nv.nvmlDeviceGetMemoryInfo(mig6).total)
    assert fake.wait_blocked(function="nvmlDeviceGetMemoryInfo")[0].gpu == 6
    assert Call(lambda: nv.nvmlDeviceGetMemoryInfo(mig7).total).returned() > 0
    fake.release_calls()
    assert stuck.returned() == nv.nvmlDeviceGetMemoryInfo(mig6).total


def test_release_removes_only_the_matching_rules(fake: FakeNvml) -> None:
    fake.hang_call(POWER, gpu=1)
    fake.hang_call(TEMPERATURE, gpu=1)
    p = Call(lambda: power(1))
    t = Call(lambda: nv.nvmlDeviceGetTemperature(h(1), 0))
    fake.wait_blocked(2, gpu=1, pid=os.getpid())

    fake.release_calls(POWER)
    p.returned()
    assert me(fake) == [(TEMPERATURE, 1)]
    fake.release_calls(gpu=0)  # no rule there: nothing changes
    assert me(fake) == [(TEMPERATURE, 1)] and t.is_alive()
    fake.release_calls(gpu=1)
    assert t.returned() > 0


def test_a_hang_on_every_gpu_blocks_device_less_calls_too(fake: FakeNvml) -> None:
    version = nv.nvmlSystemGetDriverVersion()
    fake.hang_call("nvmlSystemGetDriverVersion")
    stuck = Call(nv.nvmlSystemGetDriverVersion)
    assert fake.wait_blocked(pid=os.getpid())[0].gpu is None
    assert Call(lambda: nv.nvmlDeviceGetCount()).returned() == 8
    fake.release_calls()
    assert stuck.returned() == version

    # A rule for one GPU never blocks a device-less call.
    fake.hang_call(gpu=4)
    assert Call(lambda: nv.nvmlDeviceGetCount()).returned() == 8
    assert Call(nv.nvmlSystemGetDriverVersion).returned() == version


def test_hang_arguments_are_checked(fake: FakeNvml) -> None:
    with pytest.raises(ValueError):
        fake.hang_call("GetPowerUsage")
    with pytest.raises(ValueError):
        fake.hang_call(seconds=0)
    with pytest.raises(ValueError):
        fake.hang_call(seconds=float("nan"))
    with pytest.raises(IndexError):
        fake.hang_call(gpu=8)


# ---- error storms ------------------------------------------------------------------------------


def test_an_error_storm_fails_exactly_count_calls_then_answers(fake: FakeNvml) -> None:
    expected = power(0)
    fake.error_storm(nv.NVML_ERROR_UNKNOWN, POWER, gpu=0, count=3)
    answers: list[int | str] = []
    for i in range(5):
        if i == 1:
            fake.set_temperature(5, 70)  # an unrelated rewrite of the state file
        try:
            answers.append(power(0))
        except nv.NVMLError as e:
            answers.append(f"error {e.value}")
    assert answers == ["error 999"] * 3 + [expected] * 2
    assert power(1) == power(1)  # other GPUs never failed


def test_an_endless_storm_lasts_until_cleared(fake: FakeNvml) -> None:
    fake.error_storm(nv.NVML_ERROR_GPU_IS_LOST, gpu=2)
    for _ in range(20):
        assert error_of(lambda: nv.nvmlDeviceGetTemperature(h(2), 0)) == 15
    assert nv.nvmlDeviceGetTemperature(h(3), 0) > 0
    fake.error_storm(nv.NVML_ERROR_TIMEOUT)  # every call, device-less ones too
    assert error_of(nv.nvmlSystemGetDriverVersion) == 10
    assert error_of(lambda: power(2)) == 10  # the newest storm wins where several match
    fake.clear_error_storm()
    assert nv.nvmlDeviceGetTemperature(h(2), 0) > 0
    assert nv.nvmlSystemGetDriverVersion()


def test_only_nvml_error_codes_are_accepted(fake: FakeNvml) -> None:
    for bad in (0, 31, 998, 1000, -1, True):
        with pytest.raises(ValueError):
            fake.error_storm(bad)
    with pytest.raises(ValueError):
        fake.error_storm(999, count=0)
    with pytest.raises(ValueError):
        fake.error_storm(999, "not-a-function")


# ---- across processes --------------------------------------------------------------------------

CHILD = """
import json, sys, pynvml as nv
nv.nvmlInit()
handle = nv.nvmlDeviceGetHandleByIndex(1)
out = []
for _ in range(3):
    try:
        out.append(nv.nvmlDeviceGetTemperature(handle, 0))
    except nv.NVMLError as e:
        out.append(e.value)
print("ready", flush=True)
out.append(nv.nvmlDeviceGetPowerUsage(handle))
print(json.dumps(out), flush=True)
nv.nvmlShutdown()
"""


def test_a_subprocess_is_hung_and_released_and_counts_its_own_storm(fake: FakeNvml) -> None:
    expected_power, expected_temp = power(1), nv.nvmlDeviceGetTemperature(h(1), 0)
    fake.error_storm(nv.NVML_ERROR_UNKNOWN, TEMPERATURE, gpu=1, count=2)
    for _ in range(2):  # this process spends its two failures ...
        assert error_of(lambda: nv.nvmlDeviceGetTemperature(h(1), 0)) == 999
    fake.hang_call(POWER, gpu=1)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env={**os.environ, **fake.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        blocked = fake.wait_blocked(pid=child.pid, timeout=JOIN_S)
        assert [(c.function, c.gpu) for c in blocked] == [(POWER, 1)]
        assert child.poll() is None
        fake.release_calls()
        out, err = child.communicate(timeout=JOIN_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    # ... and the child its own two: a storm's count is per process.
    assert json.loads(out) == [999, 999, expected_temp, expected_power]
    assert fake.blocked_calls() == []
