"""A session with the NVML library, and the one place NVML errors are translated.

Every NVML call the agent makes goes through `Nvml.query` or `Nvml.call`, so the error
policy lives here and nowhere else:

* NOT_SUPPORTED / FUNCTION_NOT_FOUND: the device or driver lacks the feature. Quiet, the
  value is `None` and its series is omitted (never exported as 0). A function the pynvml
  bindings themselves lack (older nvidia-ml-py releases) and pynvml's
  `NVMLLibraryMismatchError` (an unversioned wrapper over a symbol the driver lacks) read
  the same way: "not supported", never an exception that escapes.
* GPU_IS_LOST / RESET_REQUIRED: the GPU fell off the bus (XID 79) or needs a reset.
  Raised as `GpuLost` so the caller marks that GPU down and moves on to the next one.
* Anything else: counted per (function, error) for `scripts/gpu-check`, logged once, and
  the value is `None`.

`pynvml` is imported lazily so that a host without the bindings or the driver still runs
every other source.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpuscope.agent.runtime.sources import SourceAbsent, SourceNotInstalled, SourceUnavailable

log = logging.getLogger("gpuscope.gpu.nvml")

# Return codes from nvml.h; duplicated here so translating errors needs no pynvml import.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
INSUFFICIENT_SIZE = 7

_QUIET = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
_LOST = frozenset({GPU_IS_LOST, RESET_REQUIRED})


class GpuLost(Exception):
    """The GPU stopped answering; everything else on the node keeps working."""


class _Failed(Exception):
    """One failed call, whatever pynvml raised: the NVML return code and its message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bindings_version(lib: Any) -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - only for a message
        return getattr(lib, "__version__", "(unknown version)")


class NvmlCallError(Exception):
    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message}")
        self.function = function
        self.code = code


def text(value: object) -> str:
    """NVML strings arrive as bytes or str depending on the pynvml version."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return str(value)


class Nvml:
    """An initialized NVML session. Thread-safe: NVML itself is, and our bookkeeping is locked."""

    library = "NVML"  # its name in the gates' log lines (agent/accelerators/gate.py)

    def __init__(self) -> None:
        self._lib: Any = None
        self._lock = threading.Lock()
        self.errors: Counter[tuple[str, str]] = Counter()
        self._field_requests: dict[tuple[tuple[int, int], ...], Any] = {}
        # The NVML function each thread is in now, by thread id: a GPU's gate names the call
        # its worker is blocked in (agent/accelerators/gate.py). Two dict operations per call.
        self._current: dict[int, str] = {}

    def current_call(self, thread_id: int) -> str | None:
        """The NVML function thread `thread_id` is in now, or None between calls."""
        return self._current.get(thread_id)

    @property
    def initialized(self) -> bool:
        return self._lib is not None

    @property
    def lib(self) -> Any:
        if self._lib is None:
            raise SourceUnavailable("NVML is not initialized")
        return self._lib

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a packaging error, not a host state
            raise SourceUnavailable(f"the pynvml bindings are not installed ({exc})") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            # No library or no driver at all: NVIDIA GPUs are absent, not failing; without the
            # library not even installed (a node of another vendor, or none).
            if exc.value == LIBRARY_NOT_FOUND:
                raise SourceNotInstalled(_init_failure(exc.value, str(exc))) from exc
            absent = exc.value == DRIVER_NOT_LOADED
            raise (SourceAbsent if absent else SourceUnavailable)(
                _init_failure(exc.value, str(exc))
            ) from exc
        self._lib = pynvml

    def shutdown(self) -> None:
        if self._lib is None:
            return
        lib, self._lib = self._lib, None
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def call(self, function: str, *args: Any, expected: frozenset[int] = frozenset()) -> Any:
        """Call an NVML function that must work; any failure raises.

        Codes in `expected` (a wait's TIMEOUT, say) raise `NvmlCallError` without being
        counted as errors.
        """
        try:
            return self._invoke(function, args)
        except _Failed as failed:
            if failed.code in _LOST:
                raise GpuLost(f"{function}: {failed.message}") from failed
            if failed.code not in expected and failed.code not in _QUIET:
                self._record(function, failed.code, failed.message)
            raise NvmlCallError(function, failed.code, failed.message) from failed

    def query(self, function: str, *args: Any, absent: frozenset[int] = frozenset()) -> Any | None:
        """Call an NVML function whose value is optional: `None` when unsupported or failing.

        Codes in `absent` also mean "no value" without being errors (NOT_FOUND from
        nvmlDeviceGetSamples when no new sample exists yet, say).
        """
        try:
            return self._invoke(function, args)
        except _Failed as failed:
            self._absent(function, failed, absent)
            return None

    def raw_call(self, function: str, *args: Any, expected: frozenset[int] = frozenset()) -> int:
        """Call the C function itself, with the caller's own ctypes arguments, and return its
        NVML code (for structs the agent lays out itself). A symbol the library lacks is
        FUNCTION_NOT_FOUND, as from pynvml. Lost GPUs raise `GpuLost`; codes other than
        success, NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH and `expected`
        are counted like any failed call."""
        lib = self.lib
        try:
            fn = lib._nvmlGetFunctionPointer(function)
        except lib.NVMLError as exc:
            return int(exc.value)
        ident = threading.get_ident()
        self._current[ident] = function
        try:
            code = int(fn(*args))
        finally:
            self._current.pop(ident, None)
        if code in _LOST:
            raise GpuLost(f"{function}: error {code}")
        if code not in (0, *_QUIET, ARGUMENT_VERSION_MISMATCH) and code not in expected:
            self._record(function, code, f"error {code}")
        return code

    def supports(self, function: str, *args: Any) -> bool:
        """True unless the call answers NOT_SUPPORTED / FUNCTION_NOT_FOUND."""
        try:
            self._invoke(function, args)
        except _Failed as failed:
            return failed.code not in _QUIET
        return True

    def _invoke(self, function: str, args: Sequence[Any]) -> Any:
        """Call `function` through pynvml; every way it can fail becomes `_Failed`."""
        lib = self.lib
        fn = getattr(lib, function, None)
        if fn is None:  # older bindings: the wrapper does not exist
            raise _Failed(FUNCTION_NOT_FOUND, f"not in pynvml {_bindings_version(lib)}")
        ident = threading.get_ident()
        self._current[ident] = function
        try:
            return fn(*args)
        except lib.NVMLError as exc:
            raise _Failed(int(exc.value), str(exc)) from exc
        except getattr(lib, "NVMLLibraryMismatchError", _Failed) as exc:
            # An unversioned wrapper over a versioned symbol the driver lacks (pynvml >= 11.510)
            raise _Failed(FUNCTION_NOT_FOUND, str(exc)) from exc
        finally:
            self._current.pop(ident, None)

    def _absent(self, function: str, failed: _Failed, absent: frozenset[int]) -> None:
        """A failed optional call: quiet when expected, `GpuLost` when lost, else counted."""
        if failed.code in _QUIET or failed.code in absent:
            return None
        if failed.code in _LOST:
            raise GpuLost(f"{function}: {failed.message}") from failed
        self._record(function, failed.code, failed.message)
        return None

    def field_values(
        self, handle: Any, fields: Sequence[tuple[int, int]]
    ) -> list[int | float | None]:
        """One batched nvmlDeviceGetFieldValues call; per-field failures become `None`."""
        if not fields:
            return []
        request = tuple(fields)
        lib = self.lib
        try:
            values = self.field_slots(handle, request)
        except lib.NVMLError as exc:
            self._absent("nvmlDeviceGetFieldValues", _Failed(int(exc.value), str(exc)), frozenset())
            values = None
        if values is None:
            return [None] * len(fields)
        out: list[int | float | None] = []
        get = ctypes.Structure.__getattribute__  # pynvml's override converts bytes: none here
        for (field_id, _scope), v in zip(fields, values, strict=True):
            ret = int(get(v, "nvmlReturn"))
            if ret == 0:
                out.append(union_value(get(v, "valueType"), get(v, "value")))
                continue
            if ret in _LOST:
                raise GpuLost(f"nvmlDeviceGetFieldValues: field {field_id}: error {ret}")
            if ret not in _QUIET:
                self._record(f"nvmlDeviceGetFieldValues[{field_id}]", ret, f"error {ret}")
            out.append(None)
        return out

    def field_slots(self, handle: Any, request: tuple[tuple[int, int], ...]) -> Any:
        """The raw nvmlFieldValue_t array of one batched nvmlDeviceGetFieldValues call (return
        code, value type, latency and timestamp per field, as NVML filled them in), for
        `field_values` and `gpuscope check`'s field census.

        pynvml's nvmlDeviceGetFieldValues without its Python work per field: the request
        (ids and scopes, 123 of them per GPU per scrape) is built once per field list and
        copied with one memmove; NVML fills in the rest."""
        lib = self.lib
        template = self._field_requests.get(request)
        if template is None:
            template = (lib.c_nvmlFieldValue_t * len(request))()
            for slot, (field_id, scope) in zip(template, request, strict=True):
                slot.fieldId, slot.scopeId = field_id, scope
            self._field_requests[request] = template
        values = type(template)()
        ctypes.memmove(values, template, ctypes.sizeof(template))
        fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ident = threading.get_ident()
        self._current[ident] = "nvmlDeviceGetFieldValues"
        try:
            code = fn(handle, ctypes.c_int32(len(request)), ctypes.byref(values))
        finally:
            self._current.pop(ident, None)
        lib._nvmlCheckReturn(code)
        return values

    def record_error(self, function: str, code: int, message: str) -> None:
        """Count (and log the first of) an error found inside a call's output, such as one
        metric's status in a batched answer."""
        self._record(function, code, message)

    def _record(self, function: str, code: int, message: str) -> None:
        key = (function, message)
        with self._lock:
            first = key not in self.errors
            self.errors[key] += 1
        if first:
            log.warning("NVML call %s failed: %s (code %d)", function, message, code)


_UNION_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def union_value(value_type: int, union: Any) -> int | float:
    """An nvmlValue_t union read by its NVML_VALUE_TYPE_* tag."""
    kind = int(value_type)
    member = _UNION_MEMBERS.get(kind, "ullVal")
    value = getattr(union, member)
    return float(value) if kind == 0 else int(value)


def _init_failure(code: int, message: str) -> str:
    if code == LIBRARY_NOT_FOUND:
        return (
            "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this host, "
            "or the driver libraries are not mounted into the container"
        )
    if code == DRIVER_NOT_LOADED:
        return "NVIDIA driver is not loaded (nvmlInit: driver not loaded)"
    if code == NO_PERMISSION:
        return "no permission to open the NVIDIA device files (/dev/nvidia*)"
    if code == LIB_RM_VERSION_MISMATCH:
        return "NVML library and kernel driver versions differ; reboot or reload the driver"
    return f"nvmlInit failed: {message}"
