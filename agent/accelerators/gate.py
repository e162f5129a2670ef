"""Per-GPU call gates: whatever one GPU's driver does, it holds one thread and its own
readings, never the scrape, the sampler or the other GPUs. Vendor-neutral: NVIDIA's source
(agent/gpu) and AMD's (agent/amd) each keep one `GpuGates` per library session.

Neither NVML nor AMD SMI has timeouts. A call into a GPU whose firmware stopped answering
(NVIDIA's XID 119, "GSP RPC timeout": the driver itself waits 45 s per RPC) blocks in the
kernel, and a thread blocked there cannot be interrupted or abandoned cheaply. So every
piece of per-GPU library work runs on that GPU's own worker thread (one per GPU, created on
first use, never a second), one unit at a time (one more may wait in line: see `Gate`), and
the caller waits for it up to a deadline; callers hand all GPUs their units first and then
wait, so the GPUs are read in parallel and a collection takes the slowest GPU's time, not
the sum:

* done within the deadline: the caller gets the value (or the exception it raised);
* not done: the GPU is *stuck* since the unit began. The caller gets `Blocked` and moves
  on; nothing more is queued for that GPU (what waited in line is dropped, its caller gets
  `Blocked` too), and later callers get `Blocked` at once without
  waiting, so a hang costs one thread and one deadline, however many scrapes and ticks
  come. When the blocked call returns, its late result is dropped (it describes a moment
  long past) and the next caller is served normally. One log line each way.

After a fatal XID (`xid.FATAL_XIDS`) a gate is *fenced*: it runs no work at all but one
cheap probe at a time, with a backoff on the agent's clock (10 s doubling to 5 min), as
DCGM stops calling a GPU after XID 119. A probe answered within the deadline lifts the
fence: after a GPU reset the driver answers again, and the agent cannot otherwise tell.

Deadlines are measured on the real monotonic clock (a hang is real time); the stuck time
that is exported and the probe schedule are on the agent's clock, so tests can move them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import DeviceIdentity
    from gpuscope.agent.clock import Clock

log = logging.getLogger("gpuscope.gpu")

T = TypeVar("T")

DEFAULT_DEADLINE = 2.0  # seconds a caller waits for one GPU's unit of work (--gpu-read-deadline)
PROBE_FIRST = 10.0  # seconds from a fatal XID to the first probe of the fenced GPU ...
PROBE_MAX = 300.0  # ... doubling up to this between probes
CLOSE_WAIT = 2.0  # seconds `close` waits for a busy worker before leaving it behind


class CallTracker(Protocol):
    """The vendor library's wrapper, which knows which library function a thread is in."""

    @property
    def library(self) -> str:
        """The library's name in log lines: "NVML", "AMD SMI"."""
        ...

    def current_call(self, thread_id: int) -> str | None: ...


class HasIdentity(Protocol):
    """A device as the gates know it: by its identity (index and UUID)."""

    @property
    def identity(self) -> DeviceIdentity: ...


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a GPU's work did not run, or did not finish within the deadline."""

    stuck_seconds: float | None = None  # how long its outstanding call has run, if stuck
    function: str = ""  # the library function that call is in, where known
    fenced_xid: int | None = None  # the fatal XID after which the agent stopped calling it


class Job(Generic[T]):
    """One unit of work handed to a gate; `wait` collects its result."""

    __slots__ = ("_done", "_error", "_fn", "_gate", "_probe", "_value")

    def __init__(self, gate: Gate, fn: Callable[[], T], *, probe: bool = False) -> None:
        self._gate = gate
        self._fn = fn
        self._probe = probe
        self._done = threading.Event()
        self._value: T | None = None
        self._error: Exception | None = None

    def run(self) -> None:
        try:
            self._value = self._fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, deadline_at: float) -> T | Blocked:
        """The result (raising what the work raised), or `Blocked` if it is not done by
        `deadline_at` (time.monotonic()), or shortly after where it began late."""
        while not self._done.wait(max(0.0, deadline_at - time.monotonic())):
            blocked, deadline_at = self._gate._overdue(self)
            if blocked is not None:
                return blocked
        if self._probe:
            self._gate._probe_answered(self._error is None and bool(self._value))
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set: the work returned


class Gate:
    """One GPU's worker thread and its stuck / fenced state (see the module docstring).

    At most two units are outstanding: the one running and one queued behind it, so that
    callers never wait for each other to hand work over (a scrape that meets a sampler
    tick's unit queues its own and moves on to the next GPU). A caller who finds the slot
    taken too waits for it, up to its deadline. A unit is judged stuck only once it has
    run for at least half the deadline itself: one that started late, behind another,
    gets that long before its caller gives up on it."""

    def __init__(
        self,
        index: int,
        uuid: str,
        calls: CallTracker,
        clock: Clock,
        deadline: float = DEFAULT_DEADLINE,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.deadline = deadline
        self._calls = calls
        self._clock = clock
        self._cond = threading.Condition()
        self._running: Job[Any] | None = None
        self._queued: Job[Any] | None = None  # next, not yet taken by the worker
        self._began = 0.0  # time.monotonic() the running unit began
        self._began_clock = 0.0  # the same moment on the agent's clock
        self._stuck = False
        self._thread: threading.Thread | None = None
        self._worker_id: int | None = None
        self._closed = False
        self._fenced_xid: int | None = None
        self._probe_at = 0.0
        self._backoff = PROBE_FIRST

    @property
    def name(self) -> str:
        return f"GPU {self.index} ({self.uuid or 'not yet identified'})"

    @property
    def fenced_xid(self) -> int | None:
        return self._fenced_xid

    @property
    def started(self) -> bool:
        """Whether its worker thread was ever started."""
        return self._thread is not None

    def blocked(self) -> Blocked | None:
        """The gate's state now, without waiting: `Blocked` if stuck or fenced."""
        with self._cond:
            if self._stuck or self._fenced_xid is not None:
                return self._blocked()
            return None

    def busy(self) -> bool:
        with self._cond:
            return self._running is not None or self._queued is not None

    def begin(self, fn: Callable[[], T], deadline_at: float) -> Job[T] | Blocked:
        """Hand `fn` to the worker; `Blocked` if the GPU is stuck or fenced. Called on the
        worker itself (work that needs more work on its own GPU), `fn` runs inline."""
        if threading.get_ident() == self._worker_id:
            job = Job(self, fn)
            job.run()
            return job
        with self._cond:
            if self._fenced_xid is not None:
                return self._blocked()
            return self._enqueue(Job(self, fn), deadline_at)

    def begin_probe(self, fn: Callable[[], bool], deadline_at: float) -> Job[bool] | Blocked | None:
        """On a fenced gate whose probe is due: hand the probe `fn` (True: the GPU
        answered) to the worker and schedule the next one. None when no probe is due."""
        with self._cond:
            if self._fenced_xid is None or self._clock.monotonic() < self._probe_at:
                return None
            self._schedule_probe()
            return self._enqueue(Job(self, fn, probe=True), deadline_at)

    def fence(self, xid: int) -> None:
        """Stop calling this GPU after fatal XID `xid`, but for probes (see begin_probe)."""
        with self._cond:
            if self._fenced_xid is not None:
                return
            self._fenced_xid = xid
            self._backoff = PROBE_FIRST
            self._schedule_probe()
            if self._queued is not None and not self._queued._probe:
                self._queued = None  # not begun: it will not be (its caller gets Blocked)
                self._cond.notify_all()
        log.warning(
            "%s: XID %d is fatal: no more %s calls to it, but a probe every %g s to %g s "
            "until it answers",
            self.name,
            xid,
            self._calls.library,
            PROBE_FIRST,
            PROBE_MAX,
        )

    def close(self) -> None:
        """Let the worker exit once idle (a worker blocked in the driver exits when its call
        returns; it is a daemon thread, so it never holds the process)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        deadline_at = time.monotonic() + timeout
        with self._cond:
            while self._running is not None or self._queued is not None:
                remaining = deadline_at - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    # --- under the lock ---------------------------------------------------------------------

    def _enqueue(self, job: Job[T], deadline_at: float) -> Job[T] | Blocked:
        while not self._stuck and self._queued is not None:
            remaining = deadline_at - time.monotonic()
            if remaining <= 0:
                self._mark_stuck()  # the slot stayed taken: the running unit holds the GPU
                return self._blocked()
            self._cond.wait(remaining)
        if self._stuck:
            return self._blocked()
        self._queued = job
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name=f"gpu-{self.index}", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()
        return job

    def _schedule_probe(self) -> None:
        """The next probe one backoff from now; the backoff doubles (10, 20, 40 ... 300 s)."""
        self._probe_at = self._clock.monotonic() + self._backoff
        self._backoff = min(2 * self._backoff, PROBE_MAX)

    def _blocked(self) -> Blocked:
        stuck = self._stuck
        function = ""
        if stuck and self._worker_id is not None:
            function = self._calls.current_call(self._worker_id) or ""
        return Blocked(
            stuck_seconds=max(0.0, self._clock.monotonic() - self._began_clock) if stuck else None,
            function=function,
            fenced_xid=self._fenced_xid,
        )

    def _mark_stuck(self) -> None:
        if self._stuck or self._running is None:
            return
        self._stuck = True
        self._queued = None  # nothing waits behind a stuck unit (its caller gets Blocked)
        self._cond.notify_all()
        function = self._calls.current_call(self._worker_id) if self._worker_id else None
        log.warning(
            "%s stuck in %s for %.1f s: reported down, and not called again, until it answers",
            self.name,
            function or f"(no {self._calls.library} call)",
            time.monotonic() - self._began,
        )

    # --- called by Job ----------------------------------------------------------------------

    def _overdue(self, job: Job[Any]) -> tuple[Blocked | None, float]:
        """A caller's deadline passed with `job` not done: `Blocked` if the GPU is stuck
        (or the job was dropped, or the gate fenced before it began), else (None, when to
        look again) for a unit that has not yet run for half the deadline."""
        with self._cond:
            if job.done():
                return None, 0.0
            if self._running is not None and not self._stuck:
                settle = self._began + self.deadline / 2
                if time.monotonic() < settle:
                    return None, settle  # it, or the unit ahead of it, began late
                self._mark_stuck()
            if job is self._queued:
                self._queued = None
            return self._blocked(), 0.0

    def _probe_answered(self, answered: bool) -> None:
        if not answered:
            log.debug("%s: probe not answered; fenced still", self.name)
            return
        with self._cond:
            xid, self._fenced_xid = self._fenced_xid, None
        if xid is not None:
            log.info("%s answers a probe after XID %d: calling it again", self.name, xid)

    # --- the worker -------------------------------------------------------------------------

    def _work(self) -> None:
        self._worker_id = threading.get_ident()
        while True:
            with self._cond:
                while self._queued is None and not self._closed:
                    self._cond.wait()
                job, self._queued = self._queued, None
                if job is None:  # closed and idle
                    return
                self._running = job
                self._began = time.monotonic()
                self._began_clock = self._clock.monotonic()
                self._cond.notify_all()
            job.run()
            with self._cond:
                self._running = None
                if self._stuck:
                    self._stuck = False
                    fenced = self._fenced_xid
                    log.info(
                        "%s answers again after %.0f s%s",
                        self.name,
                        time.monotonic() - self._began,
                        f" (fenced still, after XID {fenced})" if fenced is not None else "",
                    )
                self._cond.notify_all()


class RunOnGpu(Protocol):
    """Runs one unit of work for one GPU and waits for it: its value, or `Blocked`."""

    def __call__(self, device: HasIdentity, fn: Callable[[], T], /) -> T | Blocked: ...


def direct(device: HasIdentity, fn: Callable[[], T], /) -> T | Blocked:
    """A `RunOnGpu` with no gate: the work runs on the calling thread (the default for
    callers that bring no gates, e.g. scripts reading one GPU at a time)."""
    return fn()


class GpuGates:
    """The gates of one library session, one per GPU index (stable while the driver is
    loaded; a GPU not yet identified has its gate too)."""

    def __init__(
        self, calls: CallTracker, clock: Clock, deadline: float = DEFAULT_DEADLINE
    ) -> None:
        self._calls = calls
        self._clock = clock
        self.deadline = deadline
        self._lock = threading.Lock()
        self._gates: dict[int, Gate] = {}

    def gate(self, index: int, uuid: str = "") -> Gate:
        with self._lock:
            gate = self._gates.get(index)
            if gate is None:
                gate = self._gates[index] = Gate(
                    index, uuid, self._calls, self._clock, self.deadline
                )
            elif uuid and not gate.uuid:
                gate.uuid = uuid
            return gate

    def of(self, device: HasIdentity) -> Gate:
        return self.gate(device.identity.index, device.identity.uuid)

    def deadline_at(self) -> float:
        """A deadline (time.monotonic()) for work begun now."""
        return time.monotonic() + self.deadline

    def run(self, device: HasIdentity, fn: Callable[[], T], /) -> T | Blocked:
        """A `RunOnGpu` through the device's gate, with a deadline of its own."""
        deadline_at = self.deadline_at()
        job = self.of(device).begin(fn, deadline_at)
        return job if isinstance(job, Blocked) else job.wait(deadline_at)

    def fence(self, uuid: str, xid: int) -> bool:
        """Fence the GPU with this UUID (False if no gate knows it)."""
        with self._lock:
            gates = [g for g in self._gates.values() if g.uuid == uuid]
        for gate in gates:
            gate.fence(xid)
        return bool(gates)

    def threads(self) -> int:
        """Worker threads started (for tests and self-checks: at most one per GPU)."""
        with self._lock:
            return sum(g.started for g in self._gates.values())

    def close_then(self, shutdown: Callable[[], None], wait: float = CLOSE_WAIT) -> None:
        """Close every gate, then shut the library down, unless a worker is still blocked in
        a call: the library's shutdown could block behind it, and the process is exiting
        anyway (the kernel releases the driver's handles). One line names those GPUs."""
        busy = self.close(wait)
        if busy:
            names = ", ".join(g.name for g in busy)
            log.warning(
                "%s left initialized: %s still blocked in a call", self._calls.library, names
            )
            return
        shutdown()

    def close(self, wait: float = CLOSE_WAIT) -> list[Gate]:
        """Close every gate; return those still busy after waiting up to `wait` seconds."""
        with self._lock:
            gates = list(self._gates.values())
        deadline_at = time.monotonic() + wait
        busy = [g for g in gates if not g.wait_idle(max(0.0, deadline_at - time.monotonic()))]
        for gate in gates:
            gate.close()
        return busy
