"""First contact with a real GPU: what its library really does, and whether gpuscope reads it right.

Run once per node type, as root, on a machine with the NVIDIA driver and `nvidia-smi` (no
CUDA toolkit): in the DaemonSet's pod, or from a checkout with only `nvidia-ml-py` and
`prometheus-client` installed (no package registry needed):

    kubectl exec -n gpuscope ds/gpuscope -- gpuscope check   # in the agent's pod
    gpuscope check                 # about 2.5 minutes; exit status 1 if a check failed
    gpuscope check --provoke-xid   # also fault a kernel of its own to see an XID arrive
    scripts/gpu-check              # the same, from a checkout

It runs the agent's GPU collector in this process (`--collectors gpu`, background sampler)
and, beside it, records what NVML itself answers, so that every check leaves evidence even
when it fails. The full report is JSON (`--json`, default `gpu-check-report.json` in $OUT or
the current directory); the terminal gets one line per check. One module of this package
per check; each reads the agent only through its public interfaces.

Checks:
  load_generator    a duty-cycle load on GPU 0 (a PTX kernel that spins on %globaltimer,
                    launched through libcuda.so.1 with ctypes): its measured duty
  util_samples      the raw nvmlDeviceGetSamples stream of GPU 0 while idle and loaded:
                    spacing, NOT_FOUND while idle, values > 100, timestamp 0, and which clock
                    the timestamps follow (the agent reads them as epoch microseconds)
  idle_accounting   every GPU's idle seconds over the idle window, busy + not busy +
                    unsampled = wall
  busy_accounting   GPU 0's gpuscope_gpu_busy_seconds_total over the duty window: within 5%
                    of duty x wall, never above wall
  process_util      nvmlDeviceGetProcessUtilization under load: cadence (the agent holds the
                    last figures for HOLD_SECONDS), values > 100, INSUFFICIENT_SIZE
  fields            the agent's batched nvmlDeviceGetFieldValues request: return code, type and
                    latency per field, each field alone, and unknown field ids
  costs             100 timed repetitions of each sampler-tick and scrape-time call (the
                    GPM ones too, on GPUs with GPM): a tick over 30% of its interval or a
                    collection over 250 ms fails
  process_path      the agent's ProcessReader with the DaemonSet's capabilities exactly, then
                    with CAP_SYS_ADMIN, against nvidia-smi --query-compute-apps
  xid_registration  the agent's XID event registration on every GPU
  xid_delivery      an XID the script provokes reaches the agent (only with --provoke-xid)
  nvidia_smi        name, memory, driver, power (10%) and utilization under load vs nvidia-smi
  nvml_errors       NVML calls the agent saw fail with anything but NOT_SUPPORTED

On an AMD node (NVML absent, AMD SMI present; or `--vendor amd`) it runs the `amd` collector
instead and these checks (agent/check/amd.py):
  amd_accumulators  the activity accumulators' busy share over the duty window against the
                    activity sampled every 100 ms, per GPU; the accumulation counter's rate
  amd_costs         each AMD SMI call the collector makes on GPU 0, timed; a whole read()
  amd_processes     the process list as the agent sees it: PIDs in /proc, VRAM reported
  amd_events        every GPU registered for vm_fault, thermal and reset events
  amd_memory        each GPU's memory (derived from its XCPs when partitioned) against the
                    model's data sheet
  amd_xgmi          links up, and per-link counters against gpu_metrics' XGMI accumulators
  series_budget     at most 40 series per GPU at the default level

Nothing here resets a GPU or changes clocks, power limits, MIG or persistence mode.
`--quick` shortens every phase (for tests); `--fake-load CMD` replaces the CUDA load with a
command run as `CMD start <duty> <slot_s> <pid>`, `CMD stop` and `CMD xid <gpu>`.
"""

SUMMARY = (
    "first contact with a real GPU (NVIDIA or AMD): what its library does, and whether "
    "gpuscope reads it right"
)
DESCRIPTION = __doc__.split("\n", 2)[2] if __doc__ else ""
