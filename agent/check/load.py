"""The load generators: a CUDA duty-cycle kernel through libcuda.so.1 alone, or a hook
command (tests)."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import subprocess
import threading
import time
from typing import Any

# Spins until `ns` nanoseconds of %globaltimer have passed, then stores the time to `out`
# (a NULL `out` makes the store fault: that is how --provoke-xid gets an XID 31).
SPIN_PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 out, .param .u64 ns)
{
  .reg .pred %p;
  .reg .b64 %rd<7>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [ns];
  mov.u64 %rd3, %globaltimer;
  add.u64 %rd4, %rd3, %rd2;
LOOP:
  mov.u64 %rd5, %globaltimer;
  setp.lt.u64 %p, %rd5, %rd4;
  @%p bra LOOP;
  cvta.to.global.u64 %rd6, %rd1;
  st.global.u64 [%rd6], %rd5;
  ret;
}
"""


class CudaError(RuntimeError):
    pass


class Cuda:
    """GPU 0 through libcuda.so.1 alone (ctypes): a context, the spin kernel, launches.

    The primary context is retained and never released, so this process holds a CUDA context
    on GPU 0 until it exits: the process-path check looks for it."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        lib = self.lib
        self.check(lib.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "retain")
        self.make_current()
        sms = ctypes.c_int()
        self.check(lib.cuDeviceGetAttribute(ctypes.byref(sms), 16, device), "SM count")
        self.blocks = max(1, sms.value)
        self.function = self._load_kernel()
        self.out = ctypes.c_uint64()
        self.check(lib.cuMemAlloc_v2(ctypes.byref(self.out), ctypes.c_size_t(8)), "cuMemAlloc")

    def make_current(self) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _load_kernel(self) -> ctypes.c_void_p:
        """JIT the PTX, with the JIT's error log in the message if it fails."""
        module, log = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
        options = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER(_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(4096))
        code = self.lib.cuModuleLoadDataEx(ctypes.byref(module), SPIN_PTX, 2, options, values)
        if code != 0:
            raise CudaError(f"cuModuleLoadDataEx: {self.name(code)}: {log.value.decode()!r}")
        function = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, b"spin"), "fn")
        return function

    def name(self, code: int) -> str:
        text_ptr = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text_ptr)) == 0 and text_ptr.value:
            return f"{text_ptr.value.decode()} ({code})"
        return f"CUDA error {code}"

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise CudaError(f"{what}: {self.name(code)}")

    def launch(self, ns: int, out: int | None = None) -> int:
        """One spin kernel of `ns` nanoseconds; returns cuCtxSynchronize's code."""
        target = ctypes.c_uint64(self.out.value if out is None else out)
        duration = ctypes.c_uint64(ns)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(target), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(duration), ctypes.c_void_p),
        )
        code = self.lib.cuLaunchKernel(
            self.function, self.blocks, 1, 1, 128, 1, 1, 0, None, params, None
        )
        if code != 0:
            return int(code)
        return int(self.lib.cuCtxSynchronize())


class DutyLoad:
    """`duty` of every `slot` seconds busy on GPU 0, the rest idle; each kernel's host-side
    [start, end] is kept so the expected busy time is measured, not assumed."""

    kind = "cuda"
    holds_context = True

    def __init__(self, duty: float, slot: float) -> None:
        self.duty, self.slot = duty, slot
        self.error = ""
        self.intervals: list[tuple[float, float]] = []
        self.late_slots = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-load", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(timeout=120)  # context creation on a cold GPU can take seconds
        if not self._ready.is_set():
            self.error = "CUDA context not ready after 120 s"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            cuda = Cuda()
        except (OSError, CudaError) as exc:
            self.error = str(exc)
            self._ready.set()
            return
        self._ready.set()
        on_ns = int(self.duty * self.slot * 1e9)
        next_slot = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            code = cuda.launch(on_ns)
            if code != 0:
                self.error = f"kernel: {cuda.name(code)}"
                return
            self.intervals.append((t, time.monotonic()))
            next_slot += self.slot
            delay = next_slot - time.monotonic()
            if delay < 0:
                self.late_slots += 1
                next_slot = time.monotonic()
            else:
                self._stop.wait(delay)

    def measured_duty(self, a: float, b: float) -> float | None:
        """Share of [a, b] (monotonic) that kernels ran, as the host saw them."""
        busy = sum(max(0.0, min(e, b) - max(s, a)) for s, e in list(self.intervals))
        return busy / (b - a) if b > a else None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "duty": self.duty,
            "slot_s": self.slot,
            "kernels": len(self.intervals),
            "late_slots": self.late_slots,
        }


class HookLoad:
    """An outside load run by a command (`--fake-load`): tests drive the fake NVML with it."""

    kind = "hook"
    holds_context = True  # the hook is told this process's pid and registers it

    def __init__(self, command: str, duty: float, slot: float) -> None:
        self.argv = shlex.split(command)
        self.duty, self.slot = duty, slot
        self.error = ""
        self.calls: list[str] = []

    def run(self, *args: str) -> bool:
        self.calls.append(" ".join(args))
        try:
            subprocess.run([*self.argv, *args], check=True, timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = f"hook {' '.join(args)!r} failed: {exc}"
            return False
        return True

    def start(self) -> None:
        self.run("start", f"{self.duty:g}", f"{self.slot:g}", str(os.getpid()))

    def stop(self) -> None:
        self.run("stop")

    def measured_duty(self, a: float, b: float) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "duty": self.duty, "slot_s": self.slot, "calls": self.calls}


Load = DutyLoad | HookLoad


def make_load(args: argparse.Namespace) -> tuple[Load | None, str]:
    """The load generator, or None and why there is none."""
    if args.fake_load:
        return HookLoad(args.fake_load, args.duty, args.slot), ""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, f"libcuda.so.1 not loadable ({exc}) and no --fake-load hook given"
    return DutyLoad(args.duty, args.slot), ""


def fault_child() -> int:
    """Child mode: one kernel on GPU 0 stores to address 0 (CUDA_ERROR_ILLEGAL_ADDRESS, which
    the driver reports as XID 31); prints what CUDA answered. Only this child's context dies."""
    try:
        cuda = Cuda()
        code = cuda.launch(1000, out=0)
        print(json.dumps({"sync": code, "name": cuda.name(code)}))
    except (OSError, CudaError) as exc:
        print(json.dumps({"error": str(exc)}))
    return 0
