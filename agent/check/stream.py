"""NVML's raw utilization and per-process sample streams, recorded beside the agent."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuscope.agent.check.common import clocks_us, error_names
from gpuscope.agent.gpu.nvml import union_value
from gpuscope.agent.gpu.sampler import NVML_GPU_UTILIZATION_SAMPLES


class StreamRecorder:
    """Polls GPU 0's raw utilization samples and per-process utilization samples, as NVML
    answers them, on its own thread; `phase` labels what the GPU is doing meanwhile."""

    def __init__(self, lib: Any, handle: Any, interval: float = 0.25) -> None:
        self.lib, self.handle, self.interval = lib, handle, interval
        self.codes = error_names(lib)
        self.phase = "start"
        self.polls: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.proc_polls: list[dict[str, Any]] = []
        self.proc_samples: list[dict[str, Any]] = []
        self._last = 0
        self._proc_last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-recorder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll_samples()
            self._poll_processes()

    def _code(self, exc: Any) -> str:
        return self.codes.get(int(exc.value), str(exc.value))

    def _poll_samples(self) -> None:
        now, phase = clocks_us(), self.phase
        poll: dict[str, Any] = {"phase": phase, "realtime_us": now["realtime"]}
        try:
            value_type, got = self.lib.nvmlDeviceGetSamples(
                self.handle, NVML_GPU_UTILIZATION_SAMPLES, self._last
            )
        except self.lib.NVMLError as exc:
            poll["result"] = self._code(exc)
            self.polls.append(poll)
            return
        new = [(int(s.timeStamp), union_value(value_type, s.sampleValue)) for s in got]
        poll.update(result="SUCCESS", count=len(new), value_type=int(value_type))
        for ts, value in new:
            self.samples.append({"ts": ts, "value": value, "phase": phase})
        stamps = [ts for ts, _ in new if ts > 0]
        if stamps:
            newest = max(stamps)
            poll["age_us"] = {clock: t - newest for clock, t in now.items()}
            self._last = max(self._last, newest)
        self.polls.append(poll)

    def _poll_processes(self) -> None:
        phase = self.phase
        poll: dict[str, Any] = {"phase": phase, "realtime_us": time.time() * 1e6}
        try:
            got = self.lib.nvmlDeviceGetProcessUtilization(self.handle, self._proc_last)
        except self.lib.NVMLError as exc:
            poll["result"] = self._code(exc)  # INSUFFICIENT_SIZE here: the second call's
            self.proc_polls.append(poll)
            return
        poll.update(result="SUCCESS", count=len(got))
        for s in got:
            ts = int(s.timeStamp)
            if ts <= self._proc_last:
                continue
            self.proc_samples.append(
                {
                    "pid": int(s.pid),
                    "ts": ts,
                    "sm": int(s.smUtil),
                    "mem": int(s.memUtil),
                    "enc": int(s.encUtil),
                    "dec": int(s.decUtil),
                    "phase": phase,
                }
            )
        self._proc_last = max([self._proc_last, *(int(s.timeStamp) for s in got)])
        self.proc_polls.append(poll)
