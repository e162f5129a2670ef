"""A session with AMD SMI (the `amdsmi` package, ctypes over ROCm's `libamd_smi.so`), and
the one place its errors are translated.

`amdsmi` loads the library when it is imported, and a library it cannot find is not an
ImportError: the wrapper prints the OSError and raises KeyError. So the session looks for
the library first, in the wrapper's own order (`library_path`), and reports a host without
ROCm as absent in one line, never importing the package there. The import happens in
`init`, on the source's thread, never when the agent starts: a GPU-only NVIDIA agent pays
nothing for it.

The bindings and the library must be of one ROCm release: the bindings lay out the structs
the library fills (a gpu_metrics table is 2,368 bytes in ROCm 6.4 and 4,544 in 7.0), and a
mismatched pair reads garbage, not an error. So the node's own bindings come first where its
ROCm has them (`$ROCM_PATH/share/amd_smi`, what ROCm's `amd-smi-lib` package installs),
else the image's; and the pair is checked before any reading (`check_release`): a library
of another release than the bindings' is refused in one line naming both.

Every call goes through `call` (raises `AmdSmiCallError` with the status) or `query` (None
where the device or release does not support it, or the agent may not ask); both record
which library function each thread is in, so a GPU stuck in a call is reported with the
function's name (agent/accelerators/gate.py).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuscope.agent.runtime.sources import SourceNotInstalled, SourceUnavailable

log = logging.getLogger("gpuscope.amd")

LIBRARY = "libamd_smi.so"

# amdsmi_status_t (amdsmi.h), the names operators search for.
STATUS: Mapping[int, str] = {
    0: "SUCCESS",
    1: "INVAL",
    2: "NOT_SUPPORTED",
    3: "NOT_YET_IMPLEMENTED",
    4: "FAIL_LOAD_MODULE",
    5: "FAIL_LOAD_SYMBOL",
    6: "DRM_ERROR",
    7: "API_FAILED",
    8: "TIMEOUT",
    9: "RETRY",
    10: "NO_PERM",
    11: "INTERRUPT",
    12: "IO",
    13: "ADDRESS_FAULT",
    14: "FILE_ERROR",
    15: "OUT_OF_RESOURCES",
    16: "INTERNAL_EXCEPTION",
    17: "INPUT_OUT_OF_BOUNDS",
    18: "INIT_ERROR",
    19: "REFCOUNT_OVERFLOW",
    20: "DIRECTORY_NOT_FOUND",
    30: "BUSY",
    31: "NOT_FOUND",
    32: "NOT_INIT",
    33: "NO_SLOT",
    34: "DRIVER_NOT_LOADED",
    39: "MORE_DATA",
    40: "NO_DATA",
    41: "INSUFFICIENT_SIZE",
    42: "UNEXPECTED_SIZE",
    43: "UNEXPECTED_DATA",
    52: "FILE_NOT_FOUND",
    53: "ARG_PTR_NULL",
    54: "AMDGPU_RESTART_ERR",
    55: "SETTING_UNAVAILABLE",
    56: "CORRUPTED_EEPROM",
    0xFFFFFFFE: "MAP_ERROR",
    0xFFFFFFFF: "UNKNOWN_ERROR",
}
NOT_SUPPORTED = 2
NOT_YET_IMPLEMENTED = 3
NO_PERM = 10
MISSING = -1  # not a library status: the installed bindings have no such function

# The bindings' release (major, minor) -> the release number its library reports first
# (`amdsmi_get_lib_version`: 7.0's `major`, 6.4's `year`; ROCm 7.0 ships library 26.x,
# ROCm 6.4 library 25.x). Releases not listed are not checked (one line says so).
LIBRARY_RELEASE: Mapping[tuple[int, int], int] = {(7, 0): 26, (7, 1): 26, (6, 4): 25}
# Answers that mean "this device, release or agent cannot have it": the series is absent.
UNAVAILABLE = frozenset({NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_PERM, MISSING})


class AmdSmiCallError(Exception):
    """A library call that returned a status other than success."""

    def __init__(self, function: str, status: int, detail: str = "") -> None:
        self.function = function
        self.status = status
        name = "missing in the installed amdsmi" if status == MISSING else status_name(status)
        super().__init__(f"{function}: {name}{f' ({detail})' if detail else ''}")


def status_name(status: int) -> str:
    return f"AMDSMI_STATUS_{STATUS[status]}" if status in STATUS else f"status {status}"


def library_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Where `amdsmi` will load libamd_smi.so from, in the wrapper's order: $ROCM_HOME/lib
    (else $ROCM_PATH/lib), a directory of LD_LIBRARY_PATH (the loader's search by bare
    name), the package's own directory, ${ROCM_PATH:-/opt/rocm}/lib. None: nowhere, so
    importing the package would fail."""
    env = os.environ if env is None else env
    candidates: list[Path] = []
    rocm_home = env.get("ROCM_HOME") or env.get("ROCM_PATH")
    if rocm_home:
        candidates.append(Path(rocm_home) / "lib" / LIBRARY)
    candidates += [Path(d) / LIBRARY for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    spec = importlib.util.find_spec("amdsmi")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(d) / LIBRARY for d in spec.submodule_search_locations]
    candidates.append(Path(env.get("ROCM_PATH") or "/opt/rocm") / "lib" / LIBRARY)
    return next((c for c in candidates if c.is_file()), None)


class AmdSmi:
    """An initialised AMD SMI session. The library serialises its own calls; our
    bookkeeping (errors, the call each thread is in) is locked."""

    library = "AMD SMI"  # its name in the gates' log lines

    def __init__(self) -> None:
        self._m: ModuleType | None = None
        self._lock = threading.Lock()
        self._current: dict[int, str] = {}
        self.errors: Counter[tuple[str, str]] = Counter()
        self.bindings_version = ""
        self.path: Path | None = None
        self.library_version = ""  # as the library reports it, e.g. 26.0.0
        self.node_bindings: Path | None = None  # the node's ROCm bindings, when used

    @property
    def initialized(self) -> bool:
        return self._m is not None

    @property
    def module(self) -> ModuleType:
        if self._m is None:
            raise SourceUnavailable("AMD SMI is not initialised")
        return self._m

    def init(self) -> None:
        """Import the bindings (loading the library) and initialise for AMD GPUs. Raises
        `SourceNotInstalled` where there is no library or no package, `SourceUnavailable`
        where they are there but unusable."""
        if importlib.util.find_spec("amdsmi") is None:
            raise SourceNotInstalled(
                "AMD SMI: the amdsmi package is not installed (pip install gpuscope[amd])"
            )
        self.path = library_path()
        if self.path is None:
            rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
            raise SourceNotInstalled(
                f"AMD SMI library {LIBRARY} not found (ROCM_PATH={rocm}): no ROCm on this host"
            )
        self.node_bindings = node_bindings()
        if self.node_bindings is not None and str(self.node_bindings) not in sys.path:
            sys.path.insert(0, str(self.node_bindings))
        printed = io.StringIO()
        try:
            # The wrapper prints why a load failed to stdout, which is the agent's log.
            with contextlib.redirect_stdout(printed):
                module = importlib.import_module("amdsmi")
        except Exception as exc:
            said = " ".join(printed.getvalue().split())
            raise SourceUnavailable(
                f"AMD SMI: the amdsmi bindings cannot load {self.path}: "
                f"{type(exc).__name__}: {exc}{f' ({said})' if said else ''}"
            ) from exc
        try:
            module.amdsmi_init(module.AmdSmiInitFlags.INIT_AMD_GPUS)
        except module.AmdSmiLibraryException as exc:
            code = int(exc.get_error_code())
            raise SourceUnavailable(f"AMD SMI init failed: {status_name(code)}") from exc
        self.bindings_version = str(getattr(module, "__version__", ""))
        self._m = module
        try:
            check_release(self)
        except SourceUnavailable:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        module, self._m = self._m, None
        if module is not None:
            try:
                module.amdsmi_shut_down()
            except Exception as exc:  # noqa: BLE001 - leaving anyway
                log.debug("amdsmi_shut_down: %s", exc)

    def call(self, function: str, *args: Any) -> Any:
        """`amdsmi.<function>(*args)`; raises `AmdSmiCallError` for any status but success,
        and for a function the installed bindings lack (an older release)."""
        module = self.module
        fn = getattr(module, function, None)
        if fn is None:
            raise AmdSmiCallError(function, MISSING)
        with self._inside(function):
            try:
                return fn(*args)
            except module.AmdSmiLibraryException as exc:
                status = int(exc.get_error_code())
                self._count(function, status)
                raise AmdSmiCallError(function, status) from exc

    def raw(self, function: str, *args: Any) -> None:
        """The C entry point `function` through the bindings' wrapper (ctypes arguments, the
        wrapper's own struct types: its layout is its library's), its status checked as the
        bindings check it, the call tracked as `call`'s are. For reading a few fields of a
        large struct without the bindings converting all of it."""
        fn = getattr(self.module.amdsmi_wrapper, function, None)
        if fn is None:
            raise AmdSmiCallError(function, MISSING)
        with self._inside(function):
            status = int(fn(*args))
        if status != 0:
            self._count(function, status)
            raise AmdSmiCallError(function, status)

    def query(self, function: str, *args: Any) -> Any:
        """As `call`, but None where the answer is "not here": not supported by the device
        or release, not implemented, not permitted, or missing from the bindings."""
        try:
            return self.call(function, *args)
        except AmdSmiCallError as exc:
            if exc.status in UNAVAILABLE:
                return None
            raise

    @contextlib.contextmanager
    def _inside(self, function: str) -> Iterator[None]:
        """This thread is in `function` meanwhile (`current_call`)."""
        tid = threading.get_ident()
        self._current[tid] = function
        try:
            yield
        finally:
            self._current.pop(tid, None)

    def current_call(self, thread_id: int) -> str | None:
        """The library function thread `thread_id` is in now, or None between calls."""
        return self._current.get(thread_id)

    def _count(self, function: str, status: int) -> None:
        with self._lock:
            self.errors[(function, status_name(status))] += 1


def number(value: Any) -> float | None:
    """A value the bindings returned as a number, or None for their "N/A" (a string) and
    anything else that is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def node_bindings(env: Mapping[str, str] | None = None) -> Path | None:
    """The directory holding the node's own `amdsmi` package, where its ROCm installed one
    (`<ROCM_PATH>/share/amd_smi/amdsmi`): bindings of the library's own release."""
    env = os.environ if env is None else env
    root = env.get("ROCM_HOME") or env.get("ROCM_PATH")
    if not root:
        return None
    candidate = Path(root) / "share" / "amd_smi"
    return candidate if (candidate / "amdsmi" / "__init__.py").is_file() else None


def release_of(version: Mapping[str, Any]) -> tuple[int | None, str]:
    """The library's release number (`major`: 26 in ROCm 7.0, 25 in 6.4, whose struct also
    has a deprecated `year` first) and its version as text, from
    `amdsmi_get_lib_version()`'s dict."""
    parts = [version.get(k) for k in ("major", "minor", "release")]
    text = ".".join(str(p) for p in parts if isinstance(p, int))
    return (parts[0] if isinstance(parts[0], int) else None), text


def check_release(lib: AmdSmi) -> None:
    """Refuse a library of another ROCm release than the bindings' (see the module's
    docstring); record the library's version."""
    version = lib.query("amdsmi_get_lib_version") or {}
    first, lib.library_version = release_of(version)
    parts = lib.bindings_version.split(".")
    key = (
        (int(parts[0]), int(parts[1]))
        if len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit()
        else None
    )
    expected = LIBRARY_RELEASE.get(key) if key is not None else None
    if expected is None or first is None:
        log.info(
            "AMD SMI: amdsmi %s with library %s: pairing not checked (unknown release)",
            lib.bindings_version or "(version unknown)",
            lib.library_version or "(version unknown)",
        )
        return
    if first != expected:
        where = f"the node's {lib.node_bindings}" if lib.node_bindings else "the image's"
        raise SourceUnavailable(
            f"AMD SMI library {lib.library_version} ({lib.path}) is not of the release of "
            f"{where} amdsmi {lib.bindings_version} bindings (library {expected}.x): their "
            "structs differ; mount a ROCm whose share/amd_smi holds its own bindings, or run "
            "an image with matching amdsmi"
        )
