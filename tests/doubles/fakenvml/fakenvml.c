/*
 * fakenvml: a fake NVIDIA Management Library (libnvidia-ml.so.1) for tests.
 *
 * It implements a subset of the NVML C ABI with the real signatures, struct
 * layouts and return codes, so that unmodified bindings (pynvml) and agents run
 * against it on machines without a GPU.  Everything it reports comes from a
 * flat text "state file" named by $FAKENVML_STATE (written by control.py), plus
 * a small dynamic model evaluated at the current fake time:
 *
 *   - utilization timelines (append-only history of repeating patterns), from
 *     which samples, utilization, power, energy, clocks, temperature, PCIe and
 *     NVLink counters are derived, all as exact integrals;
 *   - static identity, memory, ECC / row remapping, MIG instances, processes,
 *     XID events, lost GPUs, link states and error counters.
 *
 * The state file is re-read whenever it changes (stat: device, inode, size,
 * mtime); writers replace it atomically by rename.  See README.md for the
 * format.  All entry points take one global mutex, and never hold it while they wait
 * (call latency, hangs).
 *
 * Test controls that are not NVML behaviour, each standing for a real failure (section 5,
 * "faults"): "hang" rules block matching calls (one GPU's, or every call) until released or
 * for a time, as an ioctl blocks for tens of seconds when a GPU's firmware stops answering
 * (XID 119/120, GSP timeout), while other GPUs' calls go on; "storm" rules make the next N
 * matching calls return an NVML error code, as a driver in trouble answers
 * NVML_ERROR_UNKNOWN, TIMEOUT or GPU_IS_LOST call after call.  Blocked calls are listed in
 * "$FAKENVML_STATE.blocked/", one file each, so a test can wait for "stuck in the call".
 *
 * Layout of this file:
 *   1. NVML ABI: return codes, constants, structs (mirroring nvml.h)
 *   2. In-memory state model
 *   3. State-file parser
 *   4. Model math (utilization integrals, power, energy, link counters)
 *   5. Library lifecycle, handles, locking
 *   6. API: system / identity / power+thermal / utilization / PCIe / NVLink +
 *      field values / memory + ECC / events / processes / MIG / topology
 *      (PCIe common ancestor, NVLink remote ends, GPU fabric)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ======================================================================== */
/* 1. NVML ABI                                                               */
/* ======================================================================== */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* Enumerations are passed as unsigned int (same ABI as the C enums in nvml.h). */
typedef unsigned int nvmlEnableState_t;
typedef unsigned int nvmlBrandType_t;
typedef unsigned int nvmlTemperatureSensors_t;
typedef unsigned int nvmlClockType_t;
typedef unsigned int nvmlSamplingType_t;
typedef unsigned int nvmlValueType_t;
typedef unsigned int nvmlPcieUtilCounter_t;
typedef unsigned int nvmlMemoryErrorType_t;
typedef unsigned int nvmlEccCounterType_t;
typedef unsigned int nvmlDeviceArchitecture_t;
typedef unsigned int nvmlGpuTopologyLevel_t;
typedef unsigned int nvmlIntNvLinkDeviceType_t;
typedef unsigned int nvmlNvLinkCapability_t;
typedef unsigned int nvmlGpuFabricState_t; /* unsigned char in nvml.h; c_uint in pynvml */

#define NVML_TEMPERATURE_GPU 0u
#define NVML_CLOCK_GRAPHICS 0u
#define NVML_CLOCK_SM 1u
#define NVML_CLOCK_MEM 2u
#define NVML_CLOCK_VIDEO 3u

#define NVML_TOTAL_POWER_SAMPLES 0u
#define NVML_GPU_UTILIZATION_SAMPLES 1u
#define NVML_MEMORY_UTILIZATION_SAMPLES 2u

#define NVML_VALUE_TYPE_DOUBLE 0u
#define NVML_VALUE_TYPE_UNSIGNED_INT 1u
#define NVML_VALUE_TYPE_UNSIGNED_LONG 2u
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3u
#define NVML_VALUE_TYPE_SIGNED_LONG_LONG 4u

#define NVML_PCIE_UTIL_TX_BYTES 0u
#define NVML_PCIE_UTIL_RX_BYTES 1u

#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0u
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1u
#define NVML_VOLATILE_ECC 0u
#define NVML_AGGREGATE_ECC 1u

#define NVML_NVLINK_MAX_LINKS 36u
#define NVML_NVLINK_STATE_INACTIVE 0u
#define NVML_NVLINK_STATE_ACTIVE 1u

#define NVML_NVLINK_DEVICE_TYPE_GPU 0x00u
#define NVML_NVLINK_DEVICE_TYPE_IBMNPU 0x01u
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 0x02u
#define NVML_NVLINK_DEVICE_TYPE_UNKNOWN 0xFFu
#define NVML_NVLINK_CAP_P2P_SUPPORTED 0u
#define NVML_NVLINK_CAP_P2P_ATOMICS 2u
#define NVML_NVLINK_CAP_VALID 5u
#define NVML_NVLINK_CAP_COUNT 6u

#define NVML_TOPOLOGY_INTERNAL 0u
#define NVML_TOPOLOGY_SINGLE 10u
#define NVML_TOPOLOGY_MULTIPLE 20u
#define NVML_TOPOLOGY_HOSTBRIDGE 30u
#define NVML_TOPOLOGY_NODE 40u
#define NVML_TOPOLOGY_SYSTEM 50u

#define NVML_GPU_FABRIC_UUID_LEN 16

#define NVML_DEVICE_MIG_DISABLE 0u
#define NVML_DEVICE_MIG_ENABLE 1u

#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL
#define nvmlClocksEventReasonGpuIdle 0x0000000000000001ULL
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION(sizeof(nvmlGpuFabricInfo_v2_t), 2)
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(sizeof(nvmlGpuFabricInfo_v3_t), 3)

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_SERIAL_BUFFER_SIZE 30
#define NVML_DEVICE_PART_NUMBER_BUFFER_SIZE 80
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

/* Field identifiers (nvmlFieldValue_t.fieldId). */
#define NVML_FI_DEV_ECC_CURRENT 1u
#define NVML_FI_DEV_ECC_PENDING 2u
#define NVML_FI_DEV_ECC_SBE_VOL_TOTAL 3u
#define NVML_FI_DEV_ECC_DBE_VOL_TOTAL 4u
#define NVML_FI_DEV_ECC_SBE_AGG_TOTAL 5u
#define NVML_FI_DEV_ECC_DBE_AGG_TOTAL 6u
#define NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0 32u
#define NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL 38u
#define NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 39u
#define NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL 45u
#define NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 46u
#define NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL 52u
#define NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0 53u
#define NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL 59u
#define NVML_FI_DEV_MEMORY_TEMP 82u
#define NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION 83u
#define NVML_FI_DEV_NVLINK_LINK_COUNT 91u
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94u
#define NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER 95u
#define NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6 96u
#define NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 102u
#define NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6 108u
#define NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6 114u
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138u
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139u
#define NVML_FI_DEV_REMAPPED_COR 142u
#define NVML_FI_DEV_REMAPPED_UNC 143u
#define NVML_FI_DEV_REMAPPED_PENDING 144u
#define NVML_FI_DEV_REMAPPED_FAILURE 145u
#define NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY 161u
#define NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY 162u
#define NVML_FI_DEV_NVLINK_ERROR_DL_CRC 163u
#define NVML_FI_DEV_NVLINK_GET_STATE 165u
#define NVML_FI_DEV_NVLINK_GET_VERSION 166u
#define NVML_FI_DEV_PCIE_COUNT_TX_BYTES 197u
#define NVML_FI_DEV_PCIE_COUNT_RX_BYTES 198u
#define NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS 213u
#define NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS 214u
#define NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS 215u
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230u

#define NVML_DEVICE_ARCH_BLACKWELL 10u

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlSample_st {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* nvmlEventSetWait (v1) fills the first three members only. */
typedef struct nvmlEventData_v1_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} nvmlEventData_v1_t;

/* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (used by the _v2 and _v3 entry points). */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlProcessInfo_t of the first R535 header (CUDA 12.2.81, driver 535.54): the v2 fields
 * plus usedGpuCcProtectedMemory, 32 bytes.  The 535.104 header (12.2.140) moved that field to
 * nvmlProcessDetail_v1_t (nvmlDeviceGetRunningProcessDetailList) and nvmlProcessInfo_t back to
 * the v2 layout; _v3 fills whichever its driver's header declares. */
typedef struct nvmlProcessInfoCc_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfoCc_t;

typedef struct nvmlConfComputeMemSizeInfo_st {
    unsigned long long protectedMemSizeKib;
    unsigned long long unprotectedMemSizeKib;
} nvmlConfComputeMemSizeInfo_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

/* nvmlDeviceGetGpuFabricInfo (deprecated, unversioned). */
typedef struct nvmlGpuFabricInfo_st {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

/* nvmlDeviceGetGpuFabricInfoV: v2 (== nvmlGpuFabricInfoV_t in pynvml) and v3. */
typedef struct nvmlGpuFabricInfo_v2_st {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct nvmlGpuFabricInfo_v3_st {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

/* Layouts as pynvml's ctypes mirrors of nvml.h (x86_64 / aarch64 LP64). */
_Static_assert(sizeof(nvmlValue_t) == 8, "nvmlValue_t");
_Static_assert(sizeof(nvmlSample_t) == 16, "nvmlSample_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(offsetof(nvmlFieldValue_t, valueType) == 24, "nvmlFieldValue_t.valueType");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t.value");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(sizeof(nvmlProcessInfoCc_t) == 32, "nvmlProcessInfoCc_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 36, "nvmlGpuFabricInfo_v2_t");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024u, "nvmlGpuFabricInfo_v2");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 40, "nvmlGpuFabricInfo_v3_t");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028u, "nvmlGpuFabricInfo_v3");
_Static_assert(offsetof(nvmlGpuFabricInfo_v3_t, healthSummary) == 36, "healthSummary");

/* GPM (GPU Performance Monitoring), first in the R520 header: nvml.h's nvmlGpmSample_t (an
 * opaque handle from nvmlGpmSampleAlloc), nvmlGpmMetric_t, nvmlGpmMetricsGet_t and
 * nvmlGpmSupport_t.  nvmlGpmMetricsGet_t ends in metrics[NVML_GPM_METRIC_MAX]; that maximum
 * grew with the headers (98 up to R535, 477 in nvidia-ml-py 13.x) while
 * NVML_GPM_METRICS_GET_VERSION stayed 1, so the library reads and writes only the first
 * numMetrics entries, and accepts at most the 98 of the oldest header. */
#define NVML_DEVICE_ARCH_HOPPER 9u
#define NVML_GPM_METRICS_GET_VERSION 1u
#define NVML_GPM_SUPPORT_VERSION 1u
#define FAKE_GPM_METRIC_MAX 98u

#define NVML_GPM_METRIC_GRAPHICS_UTIL 1u
#define NVML_GPM_METRIC_SM_UTIL 2u
#define NVML_GPM_METRIC_SM_OCCUPANCY 3u
#define NVML_GPM_METRIC_INTEGER_UTIL 4u
#define NVML_GPM_METRIC_ANY_TENSOR_UTIL 5u
#define NVML_GPM_METRIC_IMMA_TENSOR_UTIL 9u
#define NVML_GPM_METRIC_DRAM_BW_UTIL 10u
#define NVML_GPM_METRIC_FP64_UTIL 11u
#define NVML_GPM_METRIC_FP32_UTIL 12u
#define NVML_GPM_METRIC_FP16_UTIL 13u
#define NVML_GPM_METRIC_PCIE_TX_PER_SEC 20u
#define NVML_GPM_METRIC_PCIE_RX_PER_SEC 21u
#define NVML_GPM_METRIC_NVDEC_0_UTIL 30u
#define NVML_GPM_METRIC_NVDEC_7_UTIL 37u
#define NVML_GPM_METRIC_NVJPG_0_UTIL 40u
#define NVML_GPM_METRIC_NVJPG_7_UTIL 47u
#define NVML_GPM_METRIC_NVOFA_0_UTIL 50u
#define NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC 60u
#define NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC 97u

typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[FAKE_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t");
_Static_assert(offsetof(nvmlGpmMetric_t, value) == 8, "nvmlGpmMetric_t.value");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, sample1) == 8, "nvmlGpmMetricsGet_t.sample1");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t.metrics");
_Static_assert(sizeof(nvmlGpmSupport_t) == 8, "nvmlGpmSupport_t");

/* ======================================================================== */
/* 2. State model                                                            */
/* ======================================================================== */

#define FAKE_MAX_GPUS 32
#define FAKE_MAX_LINKS ((int)NVML_NVLINK_MAX_LINKS)
#define FAKE_MAX_MIG 8
#define FAKE_MAX_SETS 64
#define FAKE_MAX_SEGMENTS 4096
#define FAKE_SAMPLE_RING 120
#define FAKE_PCIE_INTERVAL_US 20000 /* nvmlDeviceGetPcieThroughput's measuring interval */
#define FAKE_MAX_NUMA 64
#define FAKE_MAX_CPUS 4096
#define FAKE_CPU_WORDS (FAKE_MAX_CPUS / 64)
#define FAKE_STATE_MAGIC "fakenvml-state"
#define FAKE_STATE_VERSION 1

typedef struct {
    int64_t dur;       /* microseconds, > 0 */
    double pct[2];     /* [0] = gpu (SM) utilization, [1] = memory utilization */
} seg_t;

typedef struct {
    int64_t start;     /* epoch microseconds */
    int repeat;        /* 1: pattern repeats; 0: last segment is held */
    int nseg;
    seg_t *seg;
    int64_t len;       /* sum of durations */
    double cyc[2];     /* integral over one cycle, pct * us */
    double before[2];  /* integral from the first entry's start to this entry's start */
} uentry_t;

typedef struct {
    int64_t start;
    double watts;      /* < 0: back to the utilization model */
} pentry_t;

typedef struct {
    int64_t start;
    int link;
    int up;
} lentry_t;

enum { LERR_CRC_FLIT, LERR_CRC_DATA, LERR_REPLAY, LERR_RECOVERY, LERR_COUNT };

/* A scripted fabric state from `start` on ("fs" line). */
typedef struct {
    int64_t start;
    unsigned state;
    unsigned status;
} fentry_t;

/* An extra latency for calls ("lat" line): `fn` "*" = every call, `gpu` < 0 = every GPU. */
typedef struct {
    int64_t us;
    int gpu;
    char fn[64];
} latency_t;

/* Fault-injection test controls (see section 5, "faults"): a hung call ("hang" line) and an
 * error storm ("storm" line).  `fn` "*" = every call, `gpu` < 0 = every GPU and device-less
 * calls.  `seq` names the rule for the whole life of the state file (control.py never reuses
 * one), so per-process bookkeeping survives re-reading the file. */
typedef struct {
    unsigned long long seq;
    int64_t until_us; /* real (CLOCK_REALTIME) epoch us the hang ends by itself; 0: never */
    int gpu;
    char fn[64];
} hang_t;

typedef struct {
    unsigned long long seq;
    unsigned code;   /* an NVML error code (nvml.h), never NVML_SUCCESS */
    int64_t count;   /* calls that fail, per process; -1: until the rule is cleared */
    int gpu;
    char fn[64];
} storm_t;

/* GPM activity ("gpm" line): from `start` on, each modelled GPM metric of one scope (the
 * whole GPU, gi < 0, or one MIG GPU instance) is this fraction of the GPU's utilization
 * timeline; see gpm_percent(). */
enum { GPM_GR, GPM_SM, GPM_OCC, GPM_TENSOR, GPM_DRAM, GPM_FP64, GPM_FP32, GPM_FP16, GPM_INT,
       GPM_COUNT };

typedef struct {
    int64_t start;
    int gi;            /* -1: the whole GPU (not in MIG mode) */
    double f[GPM_COUNT];
} gpment_t;

typedef struct {
    unsigned gi;
    unsigned ci;
    unsigned slices;
    unsigned long long mem_total;
    unsigned long long mem_used;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char profile[32];
} mig_t;

typedef struct {
    unsigned pid;
    unsigned long long used;
    unsigned sm;
    unsigned mem;
    unsigned gi;
    unsigned ci;
} proc_t;

/* The far end of one NVLink ("nvr" line). */
typedef struct {
    unsigned set;                 /* 0: unknown, the remote-end queries are NOT_SUPPORTED */
    unsigned type;                /* NVML_NVLINK_DEVICE_TYPE_* */
    unsigned has_pci;             /* 0: not a PCI device of this node (remote PCI info N/S) */
    unsigned domain, bus, device, function;
    unsigned pci_device_id, pci_subsystem_id;
} nvremote_t;

typedef struct {
    unsigned long long seq;
    unsigned gpu;
    unsigned long long xid;
    unsigned gi;
    unsigned ci;
} event_t;

typedef struct {
    /* identity */
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char part_number[NVML_DEVICE_PART_NUMBER_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned pci_domain, pci_bus, pci_device, pci_function; /* parsed from pci_bus_id */
    unsigned pci_device_id;       /* (device << 16) | vendor */
    unsigned pci_subsystem_id;
    unsigned arch;
    int cc_major, cc_minor;
    int numa_node;                /* < 0: NOT_SUPPORTED */
    unsigned minor;
    unsigned brand;
    unsigned persistence;
    /* memory */
    unsigned long long mem_total, mem_reserved, mem_used;
    /* power and thermals */
    unsigned power_limit_mw;
    double power_idle_w, power_max_w;
    double temp_base, temp_slope, temp_override; /* override: NAN = model */
    unsigned mem_temp_supported;
    double mem_temp_base, mem_temp_slope;
    /* clocks (MHz) */
    unsigned clk_graphics_max, clk_graphics_idle, clk_sm_max, clk_sm_idle;
    unsigned clk_mem, clk_video_max, clk_video_idle;
    unsigned long long throttle_mask;
    /* PCIe */
    unsigned pcie_gen_max, pcie_gen_gpu_max, pcie_width_max, pcie_gen, pcie_width;
    double pcie_tx_kibps, pcie_rx_kibps;
    unsigned pcie_byte_counters;
    unsigned pcie_replay;
    /* NVLink */
    unsigned nvlink_count;        /* 0: no NVLink, every NVLink query is NOT_SUPPORTED */
    unsigned nvlink_version;
    double nvlink_kibps;          /* per link, per direction, at 100 % utilization */
    unsigned long long link_err[FAKE_MAX_LINKS][LERR_COUNT];
    unsigned nvlink_caps;         /* bit i = nvmlNvLinkCapability_t i, the same on every link */
    nvremote_t nvr[FAKE_MAX_LINKS];
    /* PCIe topology: "" = unknown (topology queries NOT_SUPPORTED) */
    char topo_host_bridge[64];
    char topo_switches[256];      /* switch names, outermost first, space-separated; "-" none */
    /* GPU fabric (multi-node NVLink) */
    unsigned fabric;              /* 0: NOT_SUPPORTED */
    char fabric_cluster_uuid[40]; /* 32 hex digits */
    unsigned fabric_status, fabric_clique, fabric_state, fabric_health_mask;
    unsigned fabric_health_summary;
    fentry_t *fs;                 /* scripted fabric states ("fs" lines), start non-decreasing */
    int nfs, cfs;
    /* ECC and row remapping */
    unsigned ecc;
    unsigned long long ecc_corr_vol, ecc_unc_vol, ecc_corr_agg, ecc_unc_agg;
    unsigned row_remap;
    unsigned rr_corr, rr_unc, rr_pending, rr_failure;
    unsigned recovery_action; /* NVML_GPU_RECOVERY_ACTION_* (field 230, R570+) */
    /* MIG */
    unsigned mig_capable, mig_mode, mig_pending, mig_max;
    int nmig;
    mig_t mig[FAKE_MAX_MIG];
    /* events and health */
    unsigned long long event_types;
    unsigned lost;
    double proc_util_scale;       /* per-process utilization samples x this, unclamped */
    /* timelines */
    uentry_t *u;
    int nu, cu;
    pentry_t *p;
    int np, cp;
    lentry_t *ls;
    int nls, cls;
    proc_t *procs;
    int nprocs, cprocs;
    gpment_t *gpm;                /* GPM activity, start non-decreasing per scope */
    int ngpm, cgpm;
} gpu_t;

typedef struct {
    int has_now;
    int64_t now;
    int64_t boot;
    int64_t period;
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    unsigned branch; /* driver branch (leading number of `driver`); UINT_MAX: unknown */
    unsigned branch_minor; /* "535.54.03" -> 54: releases within a branch differ too */
    int cuda;
    int ngpu;
    gpu_t gpu[FAKE_MAX_GPUS];
    event_t *ev;
    int nev, cev;
    unsigned long long max_seq;
    int has_numa_cpus;
    unsigned long long numa_cpus[FAKE_MAX_NUMA][FAKE_CPU_WORDS]; /* "numa" lines */
    /* realistic-timing mode ("realistic 1"): utilization samples only while busy, process
     * samples every proc_period, nvmlDeviceGetPcieThroughput blocks for its 20 ms interval */
    int realistic;
    int64_t proc_period;
    latency_t *lat; /* "lat" lines */
    int nlat, clat;
    hang_t *hang; /* "hang" lines */
    int nhang, chang;
    storm_t *storm; /* "storm" lines */
    int nstorm, cstorm;
} state_t;

/* ======================================================================== */
/* 3. State-file parser                                                      */
/* ======================================================================== */

static int debug_enabled(void) {
    const char *d = getenv("FAKENVML_DEBUG");
    return d != NULL && d[0] != '\0' && d[0] != '0';
}

static void state_free(state_t *s) {
    if (s == NULL) return;
    for (int i = 0; i < FAKE_MAX_GPUS; i++) {
        gpu_t *g = &s->gpu[i];
        for (int j = 0; j < g->nu; j++) free(g->u[j].seg);
        free(g->u);
        free(g->p);
        free(g->ls);
        free(g->procs);
        free(g->fs);
        free(g->gpm);
    }
    free(s->ev);
    free(s->lat);
    free(s->hang);
    free(s->storm);
    free(s);
}

/* Grows *arr (of element size `size`) so that it holds at least n+1 elements. */
static int grow(void **arr, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    int ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, (size_t)ncap * size);
    if (p == NULL) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

static char *skip_ws(char *p) {
    while (*p == ' ' || *p == '\t') p++;
    return p;
}

static int next_i64(char **p, int64_t *out) {
    char *s = skip_ws(*p), *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno != 0) return -1;
    *out = (int64_t)v;
    *p = end;
    return 0;
}

static int next_u64(char **p, unsigned long long *out) {
    char *s = skip_ws(*p), *end;
    if (*s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno != 0) return -1;
    *out = v;
    *p = end;
    return 0;
}

static int next_u32(char **p, unsigned *out) {
    unsigned long long v;
    if (next_u64(p, &v) != 0 || v > UINT_MAX) return -1;
    *out = (unsigned)v;
    return 0;
}

static int next_dbl(char **p, double *out) {
    char *s = skip_ws(*p), *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0) return -1;
    *out = v;
    *p = end;
    return 0;
}

static int next_word(char **p, char *out, size_t cap) {
    char *s = skip_ws(*p);
    size_t n = 0;
    while (s[n] != '\0' && s[n] != ' ' && s[n] != '\t') n++;
    if (n == 0 || n >= cap) return -1;
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return 0;
}

static int at_end(char *p) { return *skip_ws(p) == '\0'; }

static int copy_value(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) return -1;
    memcpy(dst, src, n + 1);
    return 0;
}

typedef enum { K_STR, K_U32, K_I32, K_U64, K_DBL } ktype_t;

typedef struct {
    const char *key;
    ktype_t type;
    size_t off;
    size_t size;
} gkey_t;

#define GK(k, t, m) {k, t, offsetof(gpu_t, m), sizeof(((gpu_t *)0)->m)}

/* Per-GPU attributes: "g <gpu> <key> <value>". */
static const gkey_t gpu_keys[] = {
    GK("name", K_STR, name),
    GK("uuid", K_STR, uuid),
    GK("serial", K_STR, serial),
    GK("part_number", K_STR, part_number),
    GK("pci_bus_id", K_STR, pci_bus_id),
    GK("pci_device_id", K_U32, pci_device_id),
    GK("pci_subsystem_id", K_U32, pci_subsystem_id),
    GK("arch", K_U32, arch),
    GK("cc_major", K_I32, cc_major),
    GK("cc_minor", K_I32, cc_minor),
    GK("numa_node", K_I32, numa_node),
    GK("minor", K_U32, minor),
    GK("brand", K_U32, brand),
    GK("persistence", K_U32, persistence),
    GK("mem_total", K_U64, mem_total),
    GK("mem_reserved", K_U64, mem_reserved),
    GK("mem_used", K_U64, mem_used),
    GK("power_limit_mw", K_U32, power_limit_mw),
    GK("power_idle_w", K_DBL, power_idle_w),
    GK("power_max_w", K_DBL, power_max_w),
    GK("temp_base", K_DBL, temp_base),
    GK("temp_slope", K_DBL, temp_slope),
    GK("temp_override", K_DBL, temp_override),
    GK("mem_temp_supported", K_U32, mem_temp_supported),
    GK("mem_temp_base", K_DBL, mem_temp_base),
    GK("mem_temp_slope", K_DBL, mem_temp_slope),
    GK("clk_graphics_max", K_U32, clk_graphics_max),
    GK("clk_graphics_idle", K_U32, clk_graphics_idle),
    GK("clk_sm_max", K_U32, clk_sm_max),
    GK("clk_sm_idle", K_U32, clk_sm_idle),
    GK("clk_mem", K_U32, clk_mem),
    GK("clk_video_max", K_U32, clk_video_max),
    GK("clk_video_idle", K_U32, clk_video_idle),
    GK("throttle_mask", K_U64, throttle_mask),
    GK("pcie_gen_max", K_U32, pcie_gen_max),
    GK("pcie_gen_gpu_max", K_U32, pcie_gen_gpu_max),
    GK("pcie_width_max", K_U32, pcie_width_max),
    GK("pcie_gen", K_U32, pcie_gen),
    GK("pcie_width", K_U32, pcie_width),
    GK("pcie_tx_kibps", K_DBL, pcie_tx_kibps),
    GK("pcie_rx_kibps", K_DBL, pcie_rx_kibps),
    GK("pcie_byte_counters", K_U32, pcie_byte_counters),
    GK("pcie_replay", K_U32, pcie_replay),
    GK("nvlink_count", K_U32, nvlink_count),
    GK("nvlink_version", K_U32, nvlink_version),
    GK("nvlink_kibps", K_DBL, nvlink_kibps),
    GK("ecc", K_U32, ecc),
    GK("ecc_corr_vol", K_U64, ecc_corr_vol),
    GK("ecc_unc_vol", K_U64, ecc_unc_vol),
    GK("ecc_corr_agg", K_U64, ecc_corr_agg),
    GK("ecc_unc_agg", K_U64, ecc_unc_agg),
    GK("row_remap", K_U32, row_remap),
    GK("rr_corr", K_U32, rr_corr),
    GK("rr_unc", K_U32, rr_unc),
    GK("rr_pending", K_U32, rr_pending),
    GK("rr_failure", K_U32, rr_failure),
    GK("recovery_action", K_U32, recovery_action),
    GK("mig_capable", K_U32, mig_capable),
    GK("mig_mode", K_U32, mig_mode),
    GK("mig_pending", K_U32, mig_pending),
    GK("mig_max", K_U32, mig_max),
    GK("event_types", K_U64, event_types),
    GK("lost", K_U32, lost),
    GK("proc_util_scale", K_DBL, proc_util_scale),
    GK("nvlink_caps", K_U32, nvlink_caps),
    GK("topo_host_bridge", K_STR, topo_host_bridge),
    GK("topo_switches", K_STR, topo_switches),
    GK("fabric", K_U32, fabric),
    GK("fabric_cluster_uuid", K_STR, fabric_cluster_uuid),
    GK("fabric_status", K_U32, fabric_status),
    GK("fabric_clique", K_U32, fabric_clique),
    GK("fabric_state", K_U32, fabric_state),
    GK("fabric_health_mask", K_U32, fabric_health_mask),
    GK("fabric_health_summary", K_U32, fabric_health_summary),
};

static int set_gpu_key(gpu_t *g, const char *key, char *value) {
    for (size_t i = 0; i < sizeof gpu_keys / sizeof gpu_keys[0]; i++) {
        const gkey_t *k = &gpu_keys[i];
        if (strcmp(k->key, key) != 0) continue;
        char *dst = (char *)g + k->off;
        char *p = value;
        switch (k->type) {
        case K_STR:
            return copy_value(dst, k->size, value);
        case K_U32: {
            unsigned v;
            if (next_u32(&p, &v) != 0 || !at_end(p)) return -1;
            memcpy(dst, &v, sizeof v);
            return 0;
        }
        case K_I32: {
            int64_t v;
            if (next_i64(&p, &v) != 0 || !at_end(p) || v < INT_MIN || v > INT_MAX) return -1;
            int iv = (int)v;
            memcpy(dst, &iv, sizeof iv);
            return 0;
        }
        case K_U64: {
            unsigned long long v;
            if (next_u64(&p, &v) != 0 || !at_end(p)) return -1;
            memcpy(dst, &v, sizeof v);
            return 0;
        }
        case K_DBL: {
            double v;
            if (next_dbl(&p, &v) != 0 || !at_end(p)) return -1;
            memcpy(dst, &v, sizeof v);
            return 0;
        }
        }
        return -1;
    }
    return 0; /* unknown keys are ignored: newer writers may add attributes */
}

static void gpu_defaults(gpu_t *g) {
    g->temp_override = NAN;
    g->numa_node = -1;
    g->brand = 14; /* NVML_BRAND_NVIDIA */
    g->arch = 0xFFFFFFFFu;
    g->event_types = 0x1Full;
    g->proc_util_scale = 1.0;
    g->nvlink_caps = (1u << NVML_NVLINK_CAP_P2P_SUPPORTED) | (1u << NVML_NVLINK_CAP_P2P_ATOMICS) |
                     (1u << NVML_NVLINK_CAP_VALID);
}

/* "u <gpu> <start_us> <repeat> <nseg> (<dur_us> <gpu_pct> <mem_pct>){nseg}" */
static int parse_util(state_t *s, char *p) {
    unsigned gi;
    int64_t start, repeat, nseg;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_i64(&p, &start) != 0 || next_i64(&p, &repeat) != 0 || next_i64(&p, &nseg) != 0)
        return -1;
    if (nseg < 1 || nseg > FAKE_MAX_SEGMENTS) return -1;
    gpu_t *g = &s->gpu[gi];
    if (g->nu > 0 && start < g->u[g->nu - 1].start) return -1; /* append-only */
    if (grow((void **)&g->u, &g->cu, g->nu, sizeof(uentry_t)) != 0) return -1;
    uentry_t e;
    memset(&e, 0, sizeof e);
    e.start = start;
    e.repeat = repeat != 0;
    e.nseg = (int)nseg;
    e.seg = calloc((size_t)nseg, sizeof(seg_t));
    if (e.seg == NULL) return -1;
    for (int i = 0; i < e.nseg; i++) {
        seg_t *sg = &e.seg[i];
        if (next_i64(&p, &sg->dur) != 0 || sg->dur <= 0 || next_dbl(&p, &sg->pct[0]) != 0 ||
            next_dbl(&p, &sg->pct[1]) != 0) {
            free(e.seg);
            return -1;
        }
        e.len += sg->dur;
        e.cyc[0] += (double)sg->dur * sg->pct[0];
        e.cyc[1] += (double)sg->dur * sg->pct[1];
    }
    if (!at_end(p)) {
        free(e.seg);
        return -1;
    }
    g->u[g->nu++] = e;
    return 0;
}

/* "p <gpu> <start_us> <watts>" (watts < 0: utilization model) */
static int parse_power(state_t *s, char *p) {
    unsigned gi;
    pentry_t e;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_i64(&p, &e.start) != 0 || next_dbl(&p, &e.watts) != 0 || !at_end(p)) return -1;
    gpu_t *g = &s->gpu[gi];
    if (g->np > 0 && e.start < g->p[g->np - 1].start) return -1;
    if (grow((void **)&g->p, &g->cp, g->np, sizeof(pentry_t)) != 0) return -1;
    g->p[g->np++] = e;
    return 0;
}

/* "fs <gpu> <start_us> <state> <status>" */
static int parse_fabric_script(state_t *s, char *p) {
    unsigned gi;
    fentry_t e;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_i64(&p, &e.start) != 0 || next_u32(&p, &e.state) != 0 ||
        next_u32(&p, &e.status) != 0 || !at_end(p))
        return -1;
    gpu_t *g = &s->gpu[gi];
    if (g->nfs > 0 && e.start < g->fs[g->nfs - 1].start) return -1;
    if (grow((void **)&g->fs, &g->cfs, g->nfs, sizeof(fentry_t)) != 0) return -1;
    g->fs[g->nfs++] = e;
    return 0;
}

/* "lat <us> <function|*> <gpu|-1>" */
static int parse_latency(state_t *s, char *p) {
    latency_t e;
    int64_t gpu;
    memset(&e, 0, sizeof e);
    if (next_i64(&p, &e.us) != 0 || e.us < 0 || next_word(&p, e.fn, sizeof e.fn) != 0 ||
        next_i64(&p, &gpu) != 0 || gpu < -1 || gpu >= FAKE_MAX_GPUS || !at_end(p))
        return -1;
    e.gpu = (int)gpu;
    if (grow((void **)&s->lat, &s->clat, s->nlat, sizeof(latency_t)) != 0) return -1;
    s->lat[s->nlat++] = e;
    return 0;
}

/* "hang <seq> <until_us|0> <function|*> <gpu|-1>" */
static int parse_hang(state_t *s, char *p) {
    hang_t e;
    int64_t gpu;
    memset(&e, 0, sizeof e);
    if (next_u64(&p, &e.seq) != 0 || next_i64(&p, &e.until_us) != 0 || e.until_us < 0 ||
        next_word(&p, e.fn, sizeof e.fn) != 0 || next_i64(&p, &gpu) != 0 || gpu < -1 ||
        gpu >= FAKE_MAX_GPUS || !at_end(p))
        return -1;
    e.gpu = (int)gpu;
    if (grow((void **)&s->hang, &s->chang, s->nhang, sizeof(hang_t)) != 0) return -1;
    s->hang[s->nhang++] = e;
    return 0;
}

/* Whether `code` is an error code nvml.h defines (NVML_SUCCESS is not an error). */
static int is_nvml_error(unsigned code) {
    return (code >= NVML_ERROR_UNINITIALIZED && code <= NVML_ERROR_RESET_TYPE_NOT_SUPPORTED) ||
           code == NVML_ERROR_UNKNOWN;
}

/* "storm <seq> <code> <count|-1> <function|*> <gpu|-1>" */
static int parse_storm(state_t *s, char *p) {
    storm_t e;
    int64_t gpu;
    memset(&e, 0, sizeof e);
    if (next_u64(&p, &e.seq) != 0 || next_u32(&p, &e.code) != 0 || !is_nvml_error(e.code) ||
        next_i64(&p, &e.count) != 0 || e.count < -1 || e.count == 0 ||
        next_word(&p, e.fn, sizeof e.fn) != 0 || next_i64(&p, &gpu) != 0 || gpu < -1 ||
        gpu >= FAKE_MAX_GPUS || !at_end(p))
        return -1;
    e.gpu = (int)gpu;
    if (grow((void **)&s->storm, &s->cstorm, s->nstorm, sizeof(storm_t)) != 0) return -1;
    s->storm[s->nstorm++] = e;
    return 0;
}

/* "ls <gpu> <link> <start_us> <up>" */
static int parse_link_state(state_t *s, char *p) {
    unsigned gi, link, up;
    int64_t start;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_u32(&p, &link) != 0 || link >= NVML_NVLINK_MAX_LINKS) return -1;
    if (next_i64(&p, &start) != 0 || next_u32(&p, &up) != 0 || !at_end(p)) return -1;
    gpu_t *g = &s->gpu[gi];
    if (g->nls > 0 && start < g->ls[g->nls - 1].start) return -1;
    if (grow((void **)&g->ls, &g->cls, g->nls, sizeof(lentry_t)) != 0) return -1;
    g->ls[g->nls].start = start;
    g->ls[g->nls].link = (int)link;
    g->ls[g->nls].up = up != 0;
    g->nls++;
    return 0;
}

/* "link <gpu> <link> <crc_flit> <crc_data> <replay> <recovery>" */
static int parse_link_errors(state_t *s, char *p) {
    unsigned gi, link;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_u32(&p, &link) != 0 || link >= NVML_NVLINK_MAX_LINKS) return -1;
    for (int k = 0; k < LERR_COUNT; k++)
        if (next_u64(&p, &s->gpu[gi].link_err[link][k]) != 0) return -1;
    return at_end(p) ? 0 : -1;
}

/* "mig <gpu> <gi> <ci> <slices> <mem_total> <mem_used> <uuid> <profile>" */
static int parse_mig(state_t *s, char *p) {
    unsigned gi;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    gpu_t *g = &s->gpu[gi];
    if (g->nmig >= FAKE_MAX_MIG) return -1;
    mig_t *m = &g->mig[g->nmig];
    if (next_u32(&p, &m->gi) != 0 || next_u32(&p, &m->ci) != 0 || next_u32(&p, &m->slices) != 0 ||
        next_u64(&p, &m->mem_total) != 0 || next_u64(&p, &m->mem_used) != 0 ||
        next_word(&p, m->uuid, sizeof m->uuid) != 0 ||
        next_word(&p, m->profile, sizeof m->profile) != 0 || !at_end(p))
        return -1;
    g->nmig++;
    return 0;
}

/* "gpm <gpu> <gi|-1> <start_us> <gr> <sm> <occ> <tensor> <dram> <fp64> <fp32> <fp16> <int>",
 * each a fraction in [0, 1]. */
static int parse_gpm(state_t *s, char *p) {
    unsigned gi;
    int64_t inst;
    gpment_t e;
    memset(&e, 0, sizeof e);
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_i64(&p, &inst) != 0 || inst < -1 || inst > INT_MAX || next_i64(&p, &e.start) != 0)
        return -1;
    e.gi = (int)inst;
    for (int k = 0; k < GPM_COUNT; k++)
        if (next_dbl(&p, &e.f[k]) != 0 || !(e.f[k] >= 0.0 && e.f[k] <= 1.0)) return -1;
    if (!at_end(p)) return -1;
    gpu_t *g = &s->gpu[gi];
    for (int i = g->ngpm - 1; i >= 0; i--) {
        if (g->gpm[i].gi != e.gi) continue;
        if (e.start < g->gpm[i].start) return -1; /* append-only per scope */
        break;
    }
    if (grow((void **)&g->gpm, &g->cgpm, g->ngpm, sizeof(gpment_t)) != 0) return -1;
    g->gpm[g->ngpm++] = e;
    return 0;
}

/* "proc <gpu> <pid> <used_bytes> <sm_pct> <mem_pct> <gi> <ci>" */
static int parse_proc(state_t *s, char *p) {
    unsigned gi;
    proc_t pr;
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_u32(&p, &pr.pid) != 0 || next_u64(&p, &pr.used) != 0 || next_u32(&p, &pr.sm) != 0 ||
        next_u32(&p, &pr.mem) != 0 || next_u32(&p, &pr.gi) != 0 || next_u32(&p, &pr.ci) != 0 ||
        !at_end(p))
        return -1;
    gpu_t *g = &s->gpu[gi];
    if (grow((void **)&g->procs, &g->cprocs, g->nprocs, sizeof(proc_t)) != 0) return -1;
    g->procs[g->nprocs++] = pr;
    return 0;
}

/* "nvr <gpu> <link> <type> <bus_id|-> <pci_device_id> <pci_subsystem_id>" */
static int parse_nvlink_remote(state_t *s, char *p) {
    unsigned gi, link;
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    nvremote_t r;
    memset(&r, 0, sizeof r);
    if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
    if (next_u32(&p, &link) != 0 || link >= NVML_NVLINK_MAX_LINKS) return -1;
    if (next_u32(&p, &r.type) != 0 || next_word(&p, bus_id, sizeof bus_id) != 0 ||
        next_u32(&p, &r.pci_device_id) != 0 || next_u32(&p, &r.pci_subsystem_id) != 0 ||
        !at_end(p))
        return -1;
    if (strcmp(bus_id, "-") != 0) {
        if (sscanf(bus_id, "%x:%x:%x.%x", &r.domain, &r.bus, &r.device, &r.function) != 4)
            return -1;
        r.has_pci = 1;
    }
    r.set = 1;
    s->gpu[gi].nvr[link] = r;
    return 0;
}

/* "numa <node> <cpulist>", cpulist as in sysfs: "0-55,112-167" */
static int parse_numa_cpus(state_t *s, char *p) {
    unsigned node;
    if (next_u32(&p, &node) != 0 || node >= FAKE_MAX_NUMA) return -1;
    p = skip_ws(p);
    if (*p == '\0') return -1;
    for (;;) {
        unsigned lo, hi;
        if (next_u32(&p, &lo) != 0) return -1;
        hi = lo;
        if (*p == '-') {
            p++;
            if (next_u32(&p, &hi) != 0) return -1;
        }
        if (lo > hi || hi >= FAKE_MAX_CPUS) return -1;
        for (unsigned cpu = lo; cpu <= hi; cpu++)
            s->numa_cpus[node][cpu / 64] |= 1ULL << (cpu % 64);
        if (*p != ',') break;
        p++;
    }
    if (!at_end(p)) return -1;
    s->has_numa_cpus = 1;
    return 0;
}

/* "ev <seq> <gpu> <xid> <gi> <ci>" */
static int parse_event(state_t *s, char *p) {
    event_t e;
    if (next_u64(&p, &e.seq) != 0 || next_u32(&p, &e.gpu) != 0 || next_u64(&p, &e.xid) != 0 ||
        next_u32(&p, &e.gi) != 0 || next_u32(&p, &e.ci) != 0 || !at_end(p))
        return -1;
    if (s->nev > 0 && e.seq <= s->ev[s->nev - 1].seq) return -1;
    if (grow((void **)&s->ev, &s->cev, s->nev, sizeof(event_t)) != 0) return -1;
    s->ev[s->nev++] = e;
    if (e.seq > s->max_seq) s->max_seq = e.seq;
    return 0;
}

static int parse_line(state_t *s, char *line, int *seen_end) {
    char kw[32];
    char *p = line;
    if (next_word(&p, kw, sizeof kw) != 0) return -1;
    if (strcmp(kw, "g") == 0) {
        unsigned gi;
        char key[48];
        if (next_u32(&p, &gi) != 0 || gi >= (unsigned)s->ngpu) return -1;
        if (next_word(&p, key, sizeof key) != 0) return -1;
        return set_gpu_key(&s->gpu[gi], key, skip_ws(p));
    }
    if (strcmp(kw, "u") == 0) return parse_util(s, p);
    if (strcmp(kw, "p") == 0) return parse_power(s, p);
    if (strcmp(kw, "ls") == 0) return parse_link_state(s, p);
    if (strcmp(kw, "link") == 0) return parse_link_errors(s, p);
    if (strcmp(kw, "mig") == 0) return parse_mig(s, p);
    if (strcmp(kw, "proc") == 0) return parse_proc(s, p);
    if (strcmp(kw, "gpm") == 0) return parse_gpm(s, p);
    if (strcmp(kw, "ev") == 0) return parse_event(s, p);
    if (strcmp(kw, "nvr") == 0) return parse_nvlink_remote(s, p);
    if (strcmp(kw, "numa") == 0) return parse_numa_cpus(s, p);
    if (strcmp(kw, "fs") == 0) return parse_fabric_script(s, p);
    if (strcmp(kw, "lat") == 0) return parse_latency(s, p);
    if (strcmp(kw, "hang") == 0) return parse_hang(s, p);
    if (strcmp(kw, "storm") == 0) return parse_storm(s, p);
    if (strcmp(kw, "realistic") == 0) {
        int64_t v;
        if (next_i64(&p, &v) != 0 || !at_end(p)) return -1;
        s->realistic = v != 0;
        return 0;
    }
    if (strcmp(kw, "proc_period") == 0) {
        if (next_i64(&p, &s->proc_period) != 0 || s->proc_period <= 0) return -1;
        return 0;
    }
    if (strcmp(kw, "now") == 0) {
        s->has_now = 1;
        return next_i64(&p, &s->now);
    }
    if (strcmp(kw, "boot") == 0) return next_i64(&p, &s->boot);
    if (strcmp(kw, "period") == 0) {
        if (next_i64(&p, &s->period) != 0 || s->period <= 0) return -1;
        return 0;
    }
    if (strcmp(kw, "driver") == 0) return copy_value(s->driver, sizeof s->driver, skip_ws(p));
    if (strcmp(kw, "nvml") == 0)
        return copy_value(s->nvml_version, sizeof s->nvml_version, skip_ws(p));
    if (strcmp(kw, "cuda") == 0) {
        int64_t v;
        if (next_i64(&p, &v) != 0 || v < 0 || v > INT_MAX) return -1;
        s->cuda = (int)v;
        return 0;
    }
    if (strcmp(kw, "seq") == 0) {
        unsigned long long v;
        if (next_u64(&p, &v) != 0) return -1;
        if (v > s->max_seq) s->max_seq = v;
        return 0;
    }
    if (strcmp(kw, "gpus") == 0) {
        unsigned n;
        if (s->ngpu != 0 || next_u32(&p, &n) != 0 || n > FAKE_MAX_GPUS) return -1;
        s->ngpu = (int)n;
        return 0;
    }
    if (strcmp(kw, "end") == 0) {
        *seen_end = 1;
        return 0;
    }
    return 0; /* unknown line types are ignored */
}

static void parse_bus_id(gpu_t *g) {
    unsigned d = 0, b = 0, dev = 0, f = 0;
    if (sscanf(g->pci_bus_id, "%x:%x:%x.%x", &d, &b, &dev, &f) == 4) {
        g->pci_domain = d;
        g->pci_bus = b;
        g->pci_device = dev;
        g->pci_function = f;
    }
}

static void util_prefix_sums(gpu_t *g); /* section 4 */

/* "535.161.08" -> 535; UINT_MAX (no API level limits) when there is no leading number. */
static unsigned driver_branch(const char *driver) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(driver, &end, 10);
    if (end == driver || errno != 0 || v == 0 || v >= UINT_MAX) return UINT_MAX;
    return (unsigned)v;
}

/* "535.54.03" -> 54; 0 when there is none. */
static unsigned driver_minor(const char *driver) {
    const char *dot = strchr(driver, '.');
    if (dot == NULL) return 0;
    unsigned long v = strtoul(dot + 1, NULL, 10);
    return v >= UINT_MAX ? 0 : (unsigned)v;
}

/* Parses a whole state file (modified in place).  Returns NULL on error. */
static state_t *parse_state(char *text, char *err, size_t errlen) {
    state_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < FAKE_MAX_GPUS; i++) gpu_defaults(&s->gpu[i]);
    s->period = 166667;
    s->proc_period = 5000000;
    int lineno = 0, seen_end = 0, seen_magic = 0;
    char *line = text;
    while (line != NULL && *line != '\0') {
        char *nl = strchr(line, '\n');
        if (nl != NULL) *nl = '\0';
        lineno++;
        size_t n = strlen(line);
        while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = '\0';
        char *p = skip_ws(line);
        if (*p != '\0' && *p != '#') {
            if (!seen_magic) {
                int version = 0;
                if (sscanf(p, FAKE_STATE_MAGIC " %d", &version) != 1 ||
                    version != FAKE_STATE_VERSION) {
                    snprintf(err, errlen, "line %d: not a fakenvml state file (version %d)",
                             lineno, FAKE_STATE_VERSION);
                    state_free(s);
                    return NULL;
                }
                seen_magic = 1;
            } else if (parse_line(s, p, &seen_end) != 0) {
                snprintf(err, errlen, "line %d: cannot parse '%.80s'", lineno, p);
                state_free(s);
                return NULL;
            }
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    if (!seen_magic || !seen_end) {
        snprintf(err, errlen, "incomplete state file (missing header or 'end')");
        state_free(s);
        return NULL;
    }
    s->branch = driver_branch(s->driver);
    s->branch_minor = driver_minor(s->driver);
    for (int i = 0; i < s->ngpu; i++) {
        parse_bus_id(&s->gpu[i]);
        if (s->gpu[i].nvlink_count > NVML_NVLINK_MAX_LINKS) s->gpu[i].nvlink_count = 0;
        util_prefix_sums(&s->gpu[i]);
    }
    return s;
}

/* ======================================================================== */
/* 4. Model math                                                             */
/* ======================================================================== */

enum { UTIL_GPU = 0, UTIL_MEM = 1 };

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* Integral of the pattern from its start over [0, x), x within one cycle. */
static double pattern_partial(const uentry_t *e, int which, int64_t x) {
    double sum = 0.0;
    for (int i = 0; i < e->nseg && x > 0; i++) {
        int64_t d = e->seg[i].dur < x ? e->seg[i].dur : x;
        sum += (double)d * e->seg[i].pct[which];
        x -= d;
    }
    return sum;
}

/* F(x) = integral of the entry's pattern over [0, x), pct * us. */
static double pattern_integral(const uentry_t *e, int which, int64_t x) {
    if (x <= 0) return 0.0;
    if (x < e->len) return pattern_partial(e, which, x);
    if (!e->repeat) return e->cyc[which] + (double)(x - e->len) * e->seg[e->nseg - 1].pct[which];
    int64_t n = x / e->len, r = x % e->len;
    return (double)n * e->cyc[which] + pattern_partial(e, which, r);
}

static double pattern_value(const uentry_t *e, int which, int64_t x) {
    if (x < 0) return 0.0;
    if (x >= e->len) {
        if (!e->repeat) return e->seg[e->nseg - 1].pct[which];
        x %= e->len;
    }
    for (int i = 0; i < e->nseg; i++) {
        if (x < e->seg[i].dur) return e->seg[i].pct[which];
        x -= e->seg[i].dur;
    }
    return e->seg[e->nseg - 1].pct[which];
}

/* Index of the last utilization entry with start <= t, or -1. */
static int util_entry_at(const gpu_t *g, int64_t t) {
    int lo = 0, hi = g->nu - 1, ans = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->u[mid].start <= t) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

static double util_at(const gpu_t *g, int which, int64_t t) {
    int i = util_entry_at(g, t);
    if (i < 0) return 0.0;
    return pattern_value(&g->u[i], which, t - g->u[i].start);
}

/* Integral of utilization from the first entry's start to t, pct * us. */
static double util_cumulative(const gpu_t *g, int which, int64_t t) {
    int i = util_entry_at(g, t);
    if (i < 0) return 0.0;
    return g->u[i].before[which] + pattern_integral(&g->u[i], which, t - g->u[i].start);
}

/* Integral of utilization over [a, b), pct * us: O(log n) thanks to the prefix sums. */
static double util_integral(const gpu_t *g, int which, int64_t a, int64_t b) {
    if (b <= a || g->nu == 0) return 0.0;
    return util_cumulative(g, which, b) - util_cumulative(g, which, a);
}

/* Fills uentry_t.before (entry i covers [start_i, start_i+1)). */
static void util_prefix_sums(gpu_t *g) {
    for (int i = 0; i < g->nu; i++) {
        for (int w = 0; w < 2; w++) {
            g->u[i].before[w] =
                i == 0 ? 0.0
                       : g->u[i - 1].before[w] +
                             pattern_integral(&g->u[i - 1], w, g->u[i].start - g->u[i - 1].start);
        }
    }
}

static double model_power_w(const gpu_t *g, double util_pct) {
    return g->power_idle_w + (g->power_max_w - g->power_idle_w) * util_pct / 100.0;
}

static double power_w_at(const gpu_t *g, int64_t t) {
    for (int i = g->np - 1; i >= 0; i--) {
        if (g->p[i].start <= t) {
            if (g->p[i].watts >= 0.0) return g->p[i].watts;
            break;
        }
    }
    return model_power_w(g, util_at(g, UTIL_GPU, t));
}

/* Energy in mJ over [a, b) at a constant override (watts >= 0) or the model. */
static double energy_interval_mj(const gpu_t *g, int64_t a, int64_t b, double watts) {
    if (b <= a) return 0.0;
    double dt = (double)(b - a);
    if (watts >= 0.0) return watts * dt / 1000.0; /* W * us = 1e-3 mJ */
    return (g->power_idle_w * dt +
            (g->power_max_w - g->power_idle_w) * util_integral(g, UTIL_GPU, a, b) / 100.0) /
           1000.0;
}

/* Total energy since boot in mJ (exact integral of the power model/overrides). */
static double energy_mj(const gpu_t *g, int64_t boot, int64_t t) {
    double e = 0.0, watts = -1.0;
    int64_t cur = boot;
    for (int i = 0; i < g->np && cur < t; i++) {
        int64_t s = g->p[i].start;
        if (s > cur) {
            int64_t end = s < t ? s : t;
            e += energy_interval_mj(g, cur, end, watts);
            cur = end;
        }
        watts = g->p[i].watts;
    }
    if (t > cur) e += energy_interval_mj(g, cur, t, watts);
    return e;
}

/* GPM: a metric of one scope (gi < 0: the whole GPU) over [a, b), in percent: the integral
 * of (activity fraction x GPU utilization) over the window divided by its length, the
 * fraction following the scope's "gpm" lines (zero before the first; the graphics engine is
 * active whenever a kernel runs, 1, unless scripted).  Exact whatever the window, so a
 * caller's rates and integrals can be checked to the last digit. */
static double gpm_scope_percent(const gpu_t *g, int gi, int metric, int64_t a, int64_t b) {
    if (b <= a) return 0.0;
    double sum = 0.0, f = metric == GPM_GR ? 1.0 : 0.0;
    int64_t cur = a;
    for (int i = 0; i < g->ngpm && cur < b; i++) {
        const gpment_t *e = &g->gpm[i];
        if (e->gi != gi) continue;
        if (e->start > cur) {
            int64_t end = e->start < b ? e->start : b;
            sum += f * util_integral(g, UTIL_GPU, cur, end);
            cur = end;
        }
        f = e->f[metric];
    }
    if (b > cur) sum += f * util_integral(g, UTIL_GPU, cur, b);
    return sum / (double)(b - a);
}

#define FAKE_MIG_SLICES 7u /* compute slices of a whole MIG-capable GPU */

/* A scope's metric; a MIG-enabled GPU as a whole is its GPU instances weighted by their
 * compute slices (idle slices count as idle). */
static double gpm_percent(const gpu_t *g, int gi, int metric, int64_t a, int64_t b) {
    if (gi >= 0 || !g->mig_mode) return gpm_scope_percent(g, gi, metric, a, b);
    double sum = 0.0;
    for (int m = 0; m < g->nmig; m++) {
        int seen = 0; /* a GPU instance with several compute instances counts once */
        for (int j = 0; j < m; j++) seen |= g->mig[j].gi == g->mig[m].gi;
        if (seen) continue;
        sum += (double)g->mig[m].slices *
               gpm_scope_percent(g, (int)g->mig[m].gi, metric, a, b);
    }
    return sum / (double)FAKE_MIG_SLICES;
}

static int link_up_at(const gpu_t *g, int link, int64_t t) {
    int up = 1;
    for (int i = 0; i < g->nls && g->ls[i].start <= t; i++)
        if (g->ls[i].link == link) up = g->ls[i].up;
    return up;
}

/* Integral of utilization over the intervals in [boot, t) where the link was up. */
static double link_util_integral(const gpu_t *g, int link, int64_t boot, int64_t t) {
    double sum = 0.0;
    int up = 1;
    int64_t cur = boot;
    for (int i = 0; i < g->nls && g->ls[i].start < t; i++) {
        if (g->ls[i].link != link) continue;
        int64_t s = g->ls[i].start > boot ? g->ls[i].start : boot;
        if (up && s > cur) sum += util_integral(g, UTIL_GPU, cur, s);
        if (s > cur) cur = s;
        up = g->ls[i].up;
    }
    if (up && t > cur) sum += util_integral(g, UTIL_GPU, cur, t);
    return sum;
}

/* Cumulative KiB moved on one link in one direction since boot. */
static unsigned long long link_kib(const gpu_t *g, int link, int64_t boot, int64_t t) {
    double kib = g->nvlink_kibps * link_util_integral(g, link, boot, t) / 100.0 / 1e6;
    return kib > 0.0 ? (unsigned long long)kib : 0ULL;
}

static unsigned u32_round(double v) {
    if (!(v > 0.0)) return 0u;
    if (v >= 4294967295.0) return UINT_MAX;
    return (unsigned)(v + 0.5);
}

static unsigned long long u64_floor(double v) {
    if (!(v > 0.0)) return 0ULL;
    if (v >= 18446744073709549568.0) return ULLONG_MAX;
    return (unsigned long long)v;
}

/* ======================================================================== */
/* 5. Lifecycle, handles, locking                                            */
/* ======================================================================== */

struct nvmlDevice_st {
    unsigned char opaque;
};

struct nvmlEventSet_st {
    int in_use;
    unsigned long long start_seq; /* events with seq <= start_seq predate the set */
    unsigned long long cursor;    /* last delivered seq */
    unsigned long long types[FAKE_MAX_GPUS];
    unsigned long long reg_seq[FAKE_MAX_GPUS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static state_t *g_state;
static char g_path[4096];
static struct {
    int valid;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} g_ident;
static struct nvmlDevice_st g_dev[FAKE_MAX_GPUS];
static struct nvmlDevice_st g_mig[FAKE_MAX_GPUS][FAKE_MAX_MIG];
static struct nvmlEventSet_st g_sets[FAKE_MAX_SETS];

/* Error storms spent so far in this process: calls failed per "storm" rule, keyed by the
 * rule's seq.  Kept outside the state (which every re-read replaces) so that rewriting the
 * file for an unrelated change does not restart a count; forgotten when the rule leaves the
 * file and at the last nvmlShutdown.  Lock held. */
typedef struct {
    unsigned long long seq;
    int64_t used;
} storm_use_t;
static storm_use_t *g_storm_use;
static int g_nstorm_use, g_cstorm_use;

/* Drops the counts of rules no longer in `s`. */
static void prune_storm_use(const state_t *s) {
    int kept = 0;
    for (int i = 0; i < g_nstorm_use; i++) {
        for (int j = 0; j < s->nstorm; j++) {
            if (s->storm[j].seq == g_storm_use[i].seq) {
                g_storm_use[kept++] = g_storm_use[i];
                break;
            }
        }
    }
    g_nstorm_use = kept;
}

static int ident_matches(const struct stat *st) {
    return g_ident.valid && st->st_dev == g_ident.dev && st->st_ino == g_ident.ino &&
           st->st_size == g_ident.size && st->st_mtim.tv_sec == g_ident.mtime.tv_sec &&
           st->st_mtim.tv_nsec == g_ident.mtime.tv_nsec;
}

static void ident_set(const struct stat *st) {
    g_ident.valid = 1;
    g_ident.dev = st->st_dev;
    g_ident.ino = st->st_ino;
    g_ident.size = st->st_size;
    g_ident.mtime = st->st_mtim;
}

/* Reads and parses the state file.  Returns 0 and swaps in the new state, -1 if
 * the file cannot be opened, -2 if it cannot be parsed (old state kept). */
static int load_state(void) {
    FILE *f = fopen(g_path, "rb");
    if (f == NULL) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || st.st_size > (off_t)(256 << 20)) {
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (buf == NULL) {
        fclose(f);
        return -1;
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    buf[got] = '\0';
    ident_set(&st); /* even on parse errors: do not re-parse the same broken file */
    char err[256];
    state_t *s = parse_state(buf, err, sizeof err);
    free(buf);
    if (s == NULL) {
        fprintf(stderr, "fakenvml: %s: %s\n", g_path, err);
        return -2;
    }
    state_free(g_state);
    g_state = s;
    prune_storm_use(s);
    if (debug_enabled()) fprintf(stderr, "fakenvml: loaded %s (%d GPUs)\n", g_path, s->ngpu);
    return 0;
}

/* Re-reads the state file if it was replaced or modified.  Lock held. */
static void refresh_state(void) {
    struct stat st;
    if (stat(g_path, &st) != 0) return; /* keep the last good state */
    if (!ident_matches(&st)) (void)load_state();
}

static int64_t realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + (int64_t)(ts.tv_nsec / 1000);
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

static int64_t fake_now(const state_t *s) { return s->has_now ? s->now : realtime_us(); }

/* What a call needs once it holds the lock. */
typedef struct {
    const state_t *s;
    const gpu_t *g;
    unsigned gpu;
    int mig; /* index into g->mig, or -1 for a physical GPU handle */
    int64_t now;
} ctx_t;

enum { ALLOW_MIG = 1 };

static int resolve_handle(nvmlDevice_t dev, unsigned *gpu, int *mig) {
    uintptr_t p = (uintptr_t)dev;
    uintptr_t base = (uintptr_t)&g_dev[0];
    if (p >= base && p < base + sizeof g_dev) {
        if ((p - base) % sizeof g_dev[0] != 0) return -1;
        *gpu = (unsigned)((p - base) / sizeof g_dev[0]);
        *mig = -1;
        return 0;
    }
    base = (uintptr_t)&g_mig[0][0];
    if (p >= base && p < base + sizeof g_mig) {
        uintptr_t off = p - base;
        if (off % sizeof g_mig[0][0] != 0) return -1;
        uintptr_t idx = off / sizeof g_mig[0][0];
        *gpu = (unsigned)(idx / FAKE_MAX_MIG);
        *mig = (int)(idx % FAKE_MAX_MIG);
        return 0;
    }
    return -1;
}

/* ---- call latency ---------------------------------------------------------
 * A call's answer is computed under the lock at its start; the extra time it takes (the "lat"
 * lines, and nvmlDeviceGetPcieThroughput's 20 ms in realistic mode) is slept in leave(), after
 * the lock is released, so a slow call does not hold up other threads' calls.  With no "lat"
 * line the cost is one test of s->nlat per call. */
static _Thread_local int64_t t_delay_us; /* slept by leave(), then reset */

/* The most specific "lat" rule for (fn, gpu): function and GPU > function > GPU > any. */
static int64_t call_latency_us(const state_t *s, const char *fn, int gpu) {
    int best = -1;
    int64_t us = 0;
    for (int i = 0; i < s->nlat; i++) {
        const latency_t *l = &s->lat[i];
        int fn_match = strcmp(l->fn, fn) == 0, any_fn = strcmp(l->fn, "*") == 0;
        if (!fn_match && !any_fn) continue;
        if (l->gpu >= 0 && l->gpu != gpu) continue;
        int score = (fn_match ? 2 : 0) + (l->gpu >= 0 ? 1 : 0);
        if (score >= best) {
            best = score;
            us = l->us;
        }
    }
    return us;
}

static void sleep_us(int64_t us) {
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- API levels -----------------------------------------------------------
 * A driver has only the entry points of its branch.  pynvml resolves every symbol on
 * first use (_nvmlGetFunctionPointer: getattr on the CDLL, i.e. dlsym) and turns a missing
 * one into NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND), the same exception it raises when a
 * call returns 13; so an entry point newer than the profile's driver branch returns
 * NVML_ERROR_FUNCTION_NOT_FOUND before looking at its arguments.  (A caller that dlsym()s
 * by itself still finds the symbol: one library serves every branch.)
 *
 * First branch of each entry point the fake exports that is not in every supported driver,
 * from the nvml.h of consecutive releases (cuda-nvml-dev headers: 11.7.91 = R515, 11.8.86 =
 * R520, 12.0.76 = R525, 12.1.55 = R530, 12.2.81 = R535, 12.3.52 = R545, 12.4.99 = R550,
 * 12.5.39 = R555, 12.6.37 = R560, 12.8.90 = R570, 12.9.79 = R575, 13.0.39 = R580) and, before
 * R515, from nvidia-ml-py, whose releases mirror nvml.h (11.470.66, 11.495.46, 11.510.69):
 *
 *   nvmlDeviceGetComputeRunningProcesses_v3  510  not in pynvml 11.495.46, in 11.510.69; in the
 *                                                 R515 header (nvml.h of R510 itself not read)
 *   nvmlDeviceGetMemoryInfo_v2               510  same evidence; in the nvml.h of 510.39.01
 *                                                 (NVIDIA/nvidia-settings issue #78)
 *   nvmlGpm* (QueryDeviceSupport, SampleAlloc, SampleFree, SampleGet, MigSampleGet,
 *   MetricsGet)                              520  not in the R515 header, in R520
 *   nvmlDeviceGetGpuMaxPcieLinkGeneration    525  not in the R520 header, in R525
 *   nvmlDeviceGetGpuFabricInfo               525  not in the R520 header, in R525
 *   nvmlDeviceGetCurrentClocksEventReasons   535  not in the R530 header, in R535
 *   nvmlDeviceGetGpuFabricInfoV              550  not in the R545 header, in R550
 *   nvmlDeviceGetNumaNodeId                  550  not in the R545 header, in R550
 *
 * Not exported at all (FUNCTION_NOT_FOUND at every level): the Graphics and MPSCompute
 * RunningProcesses calls (their _v3 came with the compute one, R510).  Every other export is
 * in pynvml 11.470.66, the oldest level modelled.
 * nvmlGpuFabricInfo_v3 (healthSummary), first in the R580 header, answers
 * ARGUMENT_VERSION_MISMATCH before R580, and _v3 of the running processes fills the 32-byte
 * entry of the 535.54 header on R535 before 535.104 (cc_process_entry()).
 */
typedef enum {
    API_COMPUTE_PROCS_V3,
    API_MEMORY_INFO_V2,
    API_GPU_MAX_PCIE_GEN,
    API_FABRIC_INFO,
    API_CLOCKS_EVENT_REASONS,
    API_FABRIC_INFO_V,
    API_NUMA_NODE_ID,
    API_CONF_COMPUTE_MEM_SIZE,
    API_PROCESS_DETAIL_LIST,
    API_GPM,
    API_COUNT
} api_t;

static const unsigned api_first_branch[API_COUNT] = {
    [API_COMPUTE_PROCS_V3] = 510,     [API_MEMORY_INFO_V2] = 510,
    [API_GPU_MAX_PCIE_GEN] = 525,     [API_FABRIC_INFO] = 525,
    [API_CLOCKS_EVENT_REASONS] = 535, [API_FABRIC_INFO_V] = 550,
    [API_NUMA_NODE_ID] = 550,         [API_CONF_COMPUTE_MEM_SIZE] = 535,
    [API_PROCESS_DETAIL_LIST] = 535, [API_GPM] = 520,
};

/* Entry points that came within a branch: first minor release, else 0 (the branch's first).
 * nvmlDeviceGetRunningProcessDetailList: not in the 535.54 header (CUDA 12.2.81), in 535.104's
 * (12.2.140).  nvmlDeviceGetConfComputeMemSizeInfo: in 535.54's, not in R530's (12.1.55). */
static const unsigned api_first_minor[API_COUNT] = {
    [API_PROCESS_DETAIL_LIST] = 104,
};

/* ---- faults: hung calls and error storms ----------------------------------
 * Test controls, not NVML behaviour.  They stand for real failures: a GPU whose firmware
 * stopped answering (XID 119/120, "GSP timeout": the driver's ioctl blocks for tens of
 * seconds before the call returns) and a driver in trouble that answers NVML_ERROR_UNKNOWN,
 * TIMEOUT or GPU_IS_LOST call after call.
 *
 * A call that matches a "hang" rule lists itself in "<state file>.blocked/" (write_marker()),
 * releases the library lock and polls the state file every FAKE_HANG_POLL_US until no rule
 * matches any more (released, or its until_us passed); then it starts over as if just
 * called, so it answers from the state of the moment it returns.  Since no lock is held
 * while it waits, it holds up only calls that match a hang rule themselves: further calls to
 * the same GPU, never another GPU's.  A matching "storm" rule with calls left makes the call
 * answer the rule's code without touching its outputs. */
#define FAKE_HANG_POLL_US 10000

static int rule_matches(const char *rule_fn, int rule_gpu, const char *fn, int gpu) {
    if (strcmp(rule_fn, "*") != 0 && strcmp(rule_fn, fn) != 0) return 0;
    return rule_gpu < 0 || rule_gpu == gpu;
}

/* A hang rule for (fn, gpu) in force at real time `now_us`, or NULL.  `gpu` < 0: a
 * device-less call, which only rules for every GPU match. */
static const hang_t *find_hang(const state_t *s, const char *fn, int gpu, int64_t now_us) {
    for (int i = 0; i < s->nhang; i++) {
        const hang_t *h = &s->hang[i];
        if ((h->until_us == 0 || now_us < h->until_us) && rule_matches(h->fn, h->gpu, fn, gpu))
            return h;
    }
    return NULL;
}

static storm_use_t *storm_use(unsigned long long seq) {
    for (int i = 0; i < g_nstorm_use; i++)
        if (g_storm_use[i].seq == seq) return &g_storm_use[i];
    if (grow((void **)&g_storm_use, &g_cstorm_use, g_nstorm_use, sizeof(storm_use_t)) != 0)
        return NULL;
    storm_use_t *u = &g_storm_use[g_nstorm_use++];
    u->seq = seq;
    u->used = 0;
    return u;
}

/* The code of the newest storm rule for (fn, gpu) that has calls left in this process, one
 * call spent; NVML_SUCCESS if none. */
static nvmlReturn_t storm_code(const state_t *s, const char *fn, int gpu) {
    const storm_t *best = NULL;
    storm_use_t *best_use = NULL;
    for (int i = 0; i < s->nstorm; i++) {
        const storm_t *e = &s->storm[i];
        if (!rule_matches(e->fn, e->gpu, fn, gpu) || (best != NULL && e->seq < best->seq))
            continue;
        storm_use_t *u = NULL;
        if (e->count > 0) {
            u = storm_use(e->seq);
            if (u == NULL) return NVML_ERROR_MEMORY;
            if (u->used >= e->count) continue;
        }
        best = e;
        best_use = u;
    }
    if (best == NULL) return NVML_SUCCESS;
    if (best_use != NULL) best_use->used++;
    return (nvmlReturn_t)best->code;
}

static unsigned long long g_marker_n; /* blocked-call markers written by this process */

/* Lists a blocked call as the file "<state file>.blocked/<pid>-<n>" holding one line
 * "<pid> <function> <gpu|-1> <rule seq> <since, epoch us>", written to a dot-file first and
 * renamed, so a reader never sees half a line.  Lock held (g_path).  Returns 0 and the
 * marker's path in `path`, or -1 if it could not be written (the call hangs all the same). */
static int write_marker(char *path, size_t cap, const char *fn, int gpu,
                        unsigned long long seq) {
    char dir[sizeof g_path + 16], tmp[sizeof g_path + 80];
    int n = snprintf(dir, sizeof dir, "%s.blocked", g_path);
    if (n < 0 || (size_t)n >= sizeof dir) return -1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    const long pid = (long)getpid();
    const unsigned long long id = ++g_marker_n;
    n = snprintf(path, cap, "%s/%ld-%llu", dir, pid, id);
    if (n < 0 || (size_t)n >= cap) return -1;
    n = snprintf(tmp, sizeof tmp, "%s/.%ld-%llu.tmp", dir, pid, id);
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    FILE *f = fopen(tmp, "w");
    if (f == NULL) return -1;
    int ok = fprintf(f, "%ld %s %d %llu %lld\n", pid, fn, gpu, seq, (long long)realtime_us()) > 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        (void)remove(tmp);
        return -1;
    }
    return 0;
}

/* Blocks while a hang rule matches (fn, gpu), starting with `h`.  Lock held on entry and on
 * return, released while waiting. */
static void hang_wait(const hang_t *h, const char *fn, int gpu) {
    char marker[sizeof g_path + 64];
    const int listed = write_marker(marker, sizeof marker, fn, gpu, h->seq) == 0;
    if (!listed && debug_enabled()) fprintf(stderr, "fakenvml: cannot list a blocked %s\n", fn);
    int64_t until = h->until_us;
    for (;;) {
        pthread_mutex_unlock(&g_lock);
        int64_t nap = FAKE_HANG_POLL_US;
        if (until > 0) {
            int64_t left = until - realtime_us();
            if (left < nap) nap = left > 0 ? left : 0;
        }
        sleep_us(nap);
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0 || g_state == NULL) break; /* shut down meanwhile */
        refresh_state();
        const hang_t *next = find_hang(g_state, fn, gpu, realtime_us());
        if (next == NULL) break;
        until = next->until_us;
    }
    if (listed) (void)remove(marker);
}

/* ---- entering a call ------------------------------------------------------ */

enum { ENTER_DEV = 2, ENTER_NO_FAULTS = 4 }; /* enter_full() flags, with ALLOW_MIG */

/* Takes the lock (the caller must always release it with leave()), re-reads the state,
 * checks the entry point against the driver's branch (`api` >= 0), resolves and validates the
 * handle (ENTER_DEV), sets the call's latency, applies hangs and storms (unless
 * ENTER_NO_FAULTS) and then the lost-GPU and MIG checks.  `fn` names the entry point for the
 * "lat", "hang" and "storm" rules; the macros below pass __func__.  On SUCCESS c->s (and for
 * ENTER_DEV c->g, c->gpu, c->mig) are valid until leave(). */
static nvmlReturn_t enter_full(ctx_t *c, const char *fn, int api, nvmlDevice_t dev, int flags) {
    pthread_mutex_lock(&g_lock);
    for (;;) {
        memset(c, 0, sizeof *c);
        c->mig = -1;
        t_delay_us = 0;
        if (g_refcount == 0 || g_state == NULL) return NVML_ERROR_UNINITIALIZED;
        refresh_state();
        const state_t *s = g_state;
        c->s = s;
        c->now = fake_now(s);
        if (s->nlat > 0) t_delay_us = call_latency_us(s, fn, -1);
        if (api >= 0) {
            const unsigned branch = s->branch, first = api_first_branch[api];
            if (branch < first || (branch == first && s->branch_minor < api_first_minor[api]))
                return NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        int gpu = -1;
        if (flags & ENTER_DEV) {
            unsigned gi;
            int mig;
            if (dev == NULL || resolve_handle(dev, &gi, &mig) != 0 || gi >= (unsigned)s->ngpu)
                return NVML_ERROR_INVALID_ARGUMENT;
            const gpu_t *g = &s->gpu[gi];
            if (mig >= 0 && (!g->mig_mode || mig >= g->nmig)) return NVML_ERROR_INVALID_ARGUMENT;
            c->g = g;
            c->gpu = gi;
            c->mig = mig;
            gpu = (int)gi;
            if (s->nlat > 0) t_delay_us = call_latency_us(s, fn, gpu);
        }
        if (!(flags & ENTER_NO_FAULTS)) {
            const hang_t *h = s->nhang > 0 ? find_hang(s, fn, gpu, realtime_us()) : NULL;
            if (h != NULL) {
                hang_wait(h, fn, gpu);
                continue; /* the state may have changed: start over */
            }
            nvmlReturn_t r = s->nstorm > 0 ? storm_code(s, fn, gpu) : NVML_SUCCESS;
            if (r != NVML_SUCCESS) return r;
        }
        if (c->g != NULL) {
            if (c->g->lost) return NVML_ERROR_GPU_IS_LOST;
            if (c->mig >= 0 && !(flags & ALLOW_MIG)) return NVML_ERROR_NOT_SUPPORTED;
        }
        return NVML_SUCCESS;
    }
}

static nvmlReturn_t enter_at(ctx_t *c, const char *fn) { return enter_full(c, fn, -1, NULL, 0); }

static nvmlReturn_t enter_dev_api_at(ctx_t *c, nvmlDevice_t dev, int flags, api_t api,
                                     const char *fn) {
    return enter_full(c, fn, (int)api, dev, flags | ENTER_DEV);
}

static nvmlReturn_t enter_dev_at(ctx_t *c, nvmlDevice_t dev, int flags, const char *fn) {
    return enter_full(c, fn, -1, dev, flags | ENTER_DEV);
}

/* Entry points call these; helpers shared by several entry points take the entry point's
 * name and call the _at() forms. */
#define enter(c) enter_at((c), __func__)
#define enter_dev(c, dev, flags) enter_dev_at((c), (dev), (flags), __func__)
#define enter_dev_api(c, dev, flags, api) enter_dev_api_at((c), (dev), (flags), (api), __func__)

static nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&g_lock);
    if (t_delay_us > 0) {
        int64_t us = t_delay_us;
        t_delay_us = 0;
        sleep_us(us);
    }
    return r;
}

static nvmlReturn_t copy_str(char *dst, unsigned length, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if ((size_t)length < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* Whether the calling process holds CAP_SYS_ADMIN (bit 21 of CapEff), read at nvmlInit.
 * In MIG mode the driver answers processes and memory through the parent GPU handle only to
 * such a caller (nvml.h, nvmlDeviceGetMemoryInfo and the RunningProcesses calls: "In MIG
 * mode, if device handle is provided, the API returns aggregate information, only if the
 * caller has appropriate privileges. Per-instance information can be queried by using
 * specific MIG device handles."); uid 0 alone is not enough. */
static int g_sys_admin = 1;

static int read_sys_admin(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return 1;
    char line[256];
    int found = 1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "CapEff:", 7) == 0) {
            unsigned long long caps = strtoull(line + 7, NULL, 16);
            found = (caps >> 21) & 1u ? 1 : 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* NO_PERMISSION for aggregate queries through a MIG-enabled GPU's parent handle without
 * CAP_SYS_ADMIN (see g_sys_admin). */
static nvmlReturn_t mig_parent_check(const ctx_t *c) {
    return c->mig < 0 && c->g->mig_mode && !g_sys_admin ? NVML_ERROR_NO_PERMISSION
                                                        : NVML_SUCCESS;
}

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount > 0) {
        g_refcount++;
        return leave(NVML_SUCCESS);
    }
    const char *path = getenv("FAKENVML_STATE");
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof g_path) {
        if (debug_enabled()) fprintf(stderr, "fakenvml: FAKENVML_STATE is not set\n");
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    memcpy(g_path, path, strlen(path) + 1);
    g_ident.valid = 0;
    state_free(g_state);
    g_state = NULL;
    int rc = load_state();
    if (rc != 0) {
        g_ident.valid = 0;
        if (debug_enabled()) fprintf(stderr, "fakenvml: cannot load %s\n", g_path);
        return leave(rc == -1 ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_ERROR_UNKNOWN);
    }
    memset(g_sets, 0, sizeof g_sets);
    g_nstorm_use = 0; /* a new session: storms count afresh */
    g_sys_admin = read_sys_admin();
    g_refcount = 1;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

static void gpm_forget_samples(void); /* section 6, GPM */

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (--g_refcount == 0) {
        gpm_forget_samples();
        state_free(g_state);
        g_state = NULL;
        g_ident.valid = 0;
        memset(g_sets, 0, sizeof g_sets);
        g_nstorm_use = 0;
    }
    return leave(NVML_SUCCESS);
}

/* ======================================================================== */
/* 6. API                                                                    */
/* ======================================================================== */

/* ---- system ------------------------------------------------------------- */

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, because ECC is "
               "enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
        return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE:
        return "Resource not in correct state to perform requested operation";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "The requested reset type is not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r == NVML_SUCCESS) r = copy_str(version, length, c.s->driver);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r == NVML_SUCCESS) r = copy_str(version, length, c.s->nvml_version);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    ctx_t c;
    if (cudaDriverVersion == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter(&c);
    if (r == NVML_SUCCESS) *cudaDriverVersion = c.s->cuda;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- enumeration and identity ------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r == NVML_SUCCESS) {
        if (deviceCount == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *deviceCount = (unsigned)c.s->ngpu;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r == NVML_SUCCESS) {
        if (device == NULL || index >= (unsigned)c.s->ngpu) r = NVML_ERROR_INVALID_ARGUMENT;
        else *device = &g_dev[index];
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r != NVML_SUCCESS) return leave(r);
    if (uuid == NULL || device == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < c.s->ngpu; i++) {
        const gpu_t *g = &c.s->gpu[i];
        if (strcmp(g->uuid, uuid) == 0) {
            *device = &g_dev[i];
            return leave(NVML_SUCCESS);
        }
        for (int m = 0; g->mig_mode && m < g->nmig; m++) {
            if (strcmp(g->mig[m].uuid, uuid) == 0) {
                *device = &g_mig[i][m];
                return leave(NVML_SUCCESS);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r != NVML_SUCCESS) return leave(r);
    if (pciBusId == NULL || device == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned d = 0, b = 0, dev = 0, f = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &d, &b, &dev, &f) != 4) {
        d = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &b, &dev, &f) != 3)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (int i = 0; i < c.s->ngpu; i++) {
        const gpu_t *g = &c.s->gpu[i];
        if (g->pci_domain == d && g->pci_bus == b && g->pci_device == dev && g->pci_function == f) {
            *device = &g_dev[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (index == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *index = c.gpu;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (minorNumber == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *minorNumber = c.g->minor;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r == NVML_SUCCESS) {
        if (c.mig < 0) {
            r = copy_str(name, length, c.g->name);
        } else {
            char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 40];
            snprintf(buf, sizeof buf, "%s MIG %s", c.g->name, c.g->mig[c.mig].profile);
            r = copy_str(name, length, buf);
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r == NVML_SUCCESS) r = copy_str(uuid, length, c.mig < 0 ? c.g->uuid : c.g->mig[c.mig].uuid);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) r = copy_str(serial, length, c.g->serial);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                 unsigned int length) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) r = copy_str(partNumber, length, c.g->part_number);
    return leave(r);
}

static void fill_pci_info(nvmlPciInfo_t *pci, unsigned domain, unsigned bus, unsigned device,
                          unsigned function, unsigned device_id, unsigned subsystem_id) {
    memset(pci, 0, sizeof *pci);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = device_id;
    pci->pciSubSystemId = subsystem_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFFu,
             bus & 0xFFu, device & 0xFFu, function & 0xFu);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus & 0xFFu,
             device & 0xFFu, function & 0xFu);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (pci == NULL) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            const gpu_t *g = c.g;
            fill_pci_info(pci, g->pci_domain, g->pci_bus, g->pci_device, g->pci_function,
                          g->pci_device_id, g->pci_subsystem_id);
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (arch == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *arch = c.g->arch;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                       int *minor) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (major == NULL || minor == NULL) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *major = c.g->cc_major;
            *minor = c.g->cc_minor;
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_NUMA_NODE_ID);
    if (r == NVML_SUCCESS) {
        if (node == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else if (c.g->numa_node < 0) r = NVML_ERROR_NOT_SUPPORTED;
        else *node = (unsigned)c.g->numa_node;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (mode == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *mode = c.g->persistence ? 1u : 0u;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (type == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *type = c.g->brand;
    }
    return leave(r);
}

/* ---- power, energy, thermals, clocks ------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (power == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *power = u32_round(power_w_at(c.g, c.now) * 1000.0);
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (limit == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *limit = c.g->power_limit_mw;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                        unsigned long long *energy) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (energy == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *energy = u64_floor(energy_mj(c.g, c.s->boot, c.now));
    }
    return leave(r);
}

static unsigned gpu_temp(const ctx_t *c) {
    if (!isnan(c->g->temp_override)) return u32_round(c->g->temp_override);
    return u32_round(c->g->temp_base + c->g->temp_slope * util_at(c->g, UTIL_GPU, c->now));
}

static unsigned mem_temp(const ctx_t *c) {
    return u32_round(c->g->mem_temp_base +
                     c->g->mem_temp_slope * util_at(c->g, UTIL_MEM, c->now));
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                             nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (temp == NULL || sensorType != NVML_TEMPERATURE_GPU) r = NVML_ERROR_INVALID_ARGUMENT;
        else *temp = gpu_temp(&c);
    }
    return leave(r);
}

static nvmlReturn_t clock_mhz(const gpu_t *g, nvmlClockType_t type, int busy, unsigned *out) {
    switch (type) {
    case NVML_CLOCK_GRAPHICS: *out = busy ? g->clk_graphics_max : g->clk_graphics_idle; break;
    case NVML_CLOCK_SM: *out = busy ? g->clk_sm_max : g->clk_sm_idle; break;
    case NVML_CLOCK_MEM: *out = g->clk_mem; break;
    case NVML_CLOCK_VIDEO: *out = busy ? g->clk_video_max : g->clk_video_idle; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                           unsigned int *clock) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (clock == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else r = clock_mhz(c.g, type, util_at(c.g, UTIL_GPU, c.now) > 0.0, clock);
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                              unsigned int *clock) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (clock == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else r = clock_mhz(c.g, type, 1, clock);
    }
    return leave(r);
}

/* The throttle-reason mask under either name; the "clocks event" name is R535+. */
static nvmlReturn_t clocks_event_reasons(nvmlDevice_t device, unsigned long long *reasons,
                                         int event_name, const char *fn) {
    ctx_t c;
    nvmlReturn_t r = event_name ? enter_dev_api_at(&c, device, 0, API_CLOCKS_EVENT_REASONS, fn)
                                : enter_dev_at(&c, device, 0, fn);
    if (r == NVML_SUCCESS) {
        if (reasons == NULL) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *reasons = c.g->throttle_mask;
            if (!(util_at(c.g, UTIL_GPU, c.now) > 0.0)) *reasons |= nvmlClocksEventReasonGpuIdle;
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    return clocks_event_reasons(device, reasons, 1, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    return clocks_event_reasons(device, reasons, 0, __func__);
}

/* ---- utilization --------------------------------------------------------- */

/* Sample timestamps are multiples of the period in (max(boot, now - ring), now]. */
static int64_t newest_sample_ts(const ctx_t *c) {
    return floor_div(c->now, c->s->period) * c->s->period;
}

static int64_t oldest_sample_ts(const ctx_t *c) {
    int64_t p = c->s->period;
    int64_t first = -floor_div(-c->s->boot, p) * p; /* ceil(boot / p) * p */
    int64_t ring = newest_sample_ts(c) - (FAKE_SAMPLE_RING - 1) * p;
    return first > ring ? first : ring;
}

/* Average of a quantity over (ts - period, ts]. */
static double sample_avg(const ctx_t *c, nvmlSamplingType_t type, int64_t ts) {
    int64_t p = c->s->period;
    int64_t a = ts - p, b = ts; /* (ts - p, ts]: same integral as [ts - p, ts) */
    if (type == NVML_TOTAL_POWER_SAMPLES) {
        double mj = energy_mj(c->g, c->s->boot, b) - energy_mj(c->g, c->s->boot, a);
        return mj * 1000.0 * 1000.0 / (double)p; /* mJ / us -> mW */
    }
    int which = type == NVML_MEMORY_UTILIZATION_SAMPLES ? UTIL_MEM : UTIL_GPU;
    return util_integral(c->g, which, a, b) / (double)p;
}

/* Realistic mode: the driver takes a utilization sample only while the GPU is busy, so the
 * ring holds the newest FAKE_SAMPLE_RING grid points whose period (ts - period, ts] had any GPU
 * utilization, however old.  Fills ring[] newest first; returns how many.  Idle stretches are
 * skipped a block of periods at a time (one integral per block). */
#define FAKE_IDLE_BLOCK 64
static int busy_sample_ring(const ctx_t *c, int64_t ring[FAKE_SAMPLE_RING]) {
    const int64_t p = c->s->period;
    const int64_t first = -floor_div(-c->s->boot, p) * p;
    int n = 0;
    int64_t ts = newest_sample_ts(c);
    while (ts >= first && n < FAKE_SAMPLE_RING) {
        int64_t block_lo = ts - FAKE_IDLE_BLOCK * p; /* the block's periods: (block_lo, ts] */
        if (block_lo < first - p) block_lo = first - p;
        if (!(util_integral(c->g, UTIL_GPU, block_lo, ts) > 0.0)) {
            ts = block_lo;
            continue;
        }
        for (; ts > block_lo && n < FAKE_SAMPLE_RING; ts -= p)
            if (util_integral(c->g, UTIL_GPU, ts - p, ts) > 0.0) ring[n++] = ts;
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                         unsigned long long lastSeenTimeStamp,
                                         nvmlValueType_t *sampleValType, unsigned int *sampleCount,
                                         nvmlSample_t *samples) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (sampleValType == NULL || sampleCount == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (type != NVML_GPU_UTILIZATION_SAMPLES && type != NVML_MEMORY_UTILIZATION_SAMPLES &&
        type != NVML_TOTAL_POWER_SAMPLES)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (type != NVML_TOTAL_POWER_SAMPLES && c.g->mig_mode) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (c.s->realistic && type != NVML_TOTAL_POWER_SAMPLES) {
        int64_t ring[FAKE_SAMPLE_RING];
        int have = busy_sample_ring(&c, ring);
        unsigned n = 0; /* ring[0..n) are newer than lastSeenTimeStamp */
        while (n < (unsigned)have && (unsigned long long)ring[n] > lastSeenTimeStamp) n++;
        if (n == 0) return leave(NVML_ERROR_NOT_FOUND);
        *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
        if (samples == NULL) {
            *sampleCount = n;
            return leave(NVML_SUCCESS);
        }
        unsigned give = *sampleCount < n ? *sampleCount : n; /* the oldest ones, as below */
        for (unsigned i = 0; i < give; i++) {
            int64_t ts = ring[n - 1 - i];
            memset(&samples[i], 0, sizeof samples[i]);
            samples[i].timeStamp = (unsigned long long)ts;
            samples[i].sampleValue.uiVal = u32_round(sample_avg(&c, type, ts));
        }
        *sampleCount = give;
        return leave(NVML_SUCCESS);
    }
    int64_t p = c.s->period;
    int64_t newest = newest_sample_ts(&c);
    int64_t first = oldest_sample_ts(&c);
    if (lastSeenTimeStamp <= (unsigned long long)INT64_MAX) {
        int64_t after = (floor_div((int64_t)lastSeenTimeStamp, p) + 1) * p;
        if (after > first) first = after;
    } else {
        first = newest + p;
    }
    if (first > newest) return leave(NVML_ERROR_NOT_FOUND);
    unsigned n = (unsigned)((newest - first) / p + 1);
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (samples == NULL) {
        *sampleCount = n;
        return leave(NVML_SUCCESS);
    }
    /* A caller buffer smaller than the available samples gets the oldest ones, so
     * that a caller advancing lastSeenTimeStamp never skips samples. */
    if (*sampleCount < n) n = *sampleCount;
    for (unsigned i = 0; i < n; i++) {
        int64_t ts = first + (int64_t)i * p;
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].timeStamp = (unsigned long long)ts;
        samples[i].sampleValue.uiVal = u32_round(sample_avg(&c, type, ts));
    }
    *sampleCount = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (utilization == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.g->mig_mode) return leave(NVML_ERROR_NOT_SUPPORTED);
    int64_t newest = newest_sample_ts(&c);
    utilization->gpu = 0;
    utilization->memory = 0;
    if (newest >= oldest_sample_ts(&c)) {
        utilization->gpu = u32_round(sample_avg(&c, NVML_GPU_UTILIZATION_SAMPLES, newest));
        utilization->memory = u32_round(sample_avg(&c, NVML_MEMORY_UTILIZATION_SAMPLES, newest));
    }
    return leave(NVML_SUCCESS);
}

/* ---- PCIe ---------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                unsigned int *value) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (value == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    double rate;
    if (counter == NVML_PCIE_UTIL_TX_BYTES) rate = c.g->pcie_tx_kibps;
    else if (counter == NVML_PCIE_UTIL_RX_BYTES) rate = c.g->pcie_rx_kibps;
    else return leave(NVML_ERROR_INVALID_ARGUMENT);
    *value = u32_round(rate * util_at(c.g, UTIL_GPU, c.now) / 100.0);
    /* nvml.h: "This function is querying a byte counter over a 20ms interval and thus is the
     * PCIe throughput over that interval."  Realistic mode takes that long (slept in leave()). */
    if (c.s->realistic) t_delay_us += FAKE_PCIE_INTERVAL_US;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (value == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *value = c.g->pcie_replay;
    }
    return leave(r);
}

enum { PCIE_GEN_CUR, PCIE_GEN_MAX, PCIE_GEN_GPU_MAX, PCIE_WIDTH_CUR, PCIE_WIDTH_MAX };

static nvmlReturn_t pcie_link_query(nvmlDevice_t device, int what, unsigned int *out,
                                    const char *fn) {
    ctx_t c;
    nvmlReturn_t r = what == PCIE_GEN_GPU_MAX
                         ? enter_dev_api_at(&c, device, 0, API_GPU_MAX_PCIE_GEN, fn)
                         : enter_dev_at(&c, device, 0, fn);
    if (r != NVML_SUCCESS) return leave(r);
    if (out == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    switch (what) {
    case PCIE_GEN_CUR: *out = c.g->pcie_gen; break;
    case PCIE_GEN_MAX: *out = c.g->pcie_gen_max; break;
    case PCIE_GEN_GPU_MAX: *out = c.g->pcie_gen_gpu_max; break;
    case PCIE_WIDTH_CUR: *out = c.g->pcie_width; break;
    default: *out = c.g->pcie_width_max; break;
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return pcie_link_query(device, PCIE_GEN_CUR, gen, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return pcie_link_query(device, PCIE_GEN_MAX, gen, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return pcie_link_query(device, PCIE_GEN_GPU_MAX, gen, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return pcie_link_query(device, PCIE_WIDTH_CUR, width, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return pcie_link_query(device, PCIE_WIDTH_MAX, width, __func__);
}

/* ---- NVLink and field values --------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             nvmlEnableState_t *isActive) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (c.g->nvlink_count == 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (isActive == NULL || link >= c.g->nvlink_count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = link_up_at(c.g, (int)link, c.now) ? 1u : 0u;
    return leave(NVML_SUCCESS);
}

static void fv_uint(nvmlFieldValue_t *v, unsigned x) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = x;
}

static void fv_ull(nvmlFieldValue_t *v, unsigned long long x) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = x;
}

/* Maps the legacy per-link error fields (..._L0..L5, ..._L6..L11, ..._TOTAL).
 * Returns the error kind and sets *link (-1 for the total), or -1. */
static int legacy_link_field(unsigned id, int *link) {
    static const struct {
        unsigned l0, total, l6;
        int kind;
    } map[] = {
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
         NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, LERR_CRC_FLIT},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
         NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, LERR_CRC_DATA},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
         NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, LERR_REPLAY},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
         NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, LERR_RECOVERY},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (id >= map[i].l0 && id < map[i].l0 + 6) {
            *link = (int)(id - map[i].l0);
            return map[i].kind;
        }
        if (id >= map[i].l6 && id < map[i].l6 + 6) {
            *link = 6 + (int)(id - map[i].l6);
            return map[i].kind;
        }
        if (id == map[i].total) {
            *link = -1;
            return map[i].kind;
        }
    }
    return -1;
}

static unsigned long long link_err_sum(const gpu_t *g, int kind) {
    unsigned long long sum = 0;
    for (unsigned l = 0; l < g->nvlink_count; l++) sum += g->link_err[l][kind];
    return sum;
}

/* First driver branch whose nvml.h defines a field id the fake serves (0: every branch
 * modelled).  Ids up to 160 are in nvidia-ml-py 11.470.66 (NVML_FI_MAX 161, as in the R515
 * header); 161-166 (NVLink DL errors, state, version) are first in the R520 header (FI_MAX
 * 167); 197/198 (PCIe byte counters) first in R555 (12.5.39; the R550 header has a gap at
 * 197-198 and FI_MAX 200); 213-215 (NVLink5 link recovery counters) first in R560 (12.6.37);
 * 230 (GPU recovery action) first in R570 (12.570.86; 12.560.30 has NVML_FI_MAX 230).
 *
 * A field id the driver does not know: nvml.h documents no per-field code for it (the call
 * returns SUCCESS "if any values were populated"; `value` is undefined unless the field's
 * nvmlReturn is SUCCESS), and no source read here records what a driver puts there.  The
 * fake answers NVML_ERROR_NOT_SUPPORTED, as it does for any id it does not model; a caller
 * must read every non-SUCCESS as "no value". */
static unsigned field_first_branch(unsigned id) {
    if (id >= NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY && id <= NVML_FI_DEV_NVLINK_GET_VERSION)
        return 520;
    if (id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES || id == NVML_FI_DEV_PCIE_COUNT_RX_BYTES) return 555;
    if (id >= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS &&
        id <= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS)
        return 560;
    if (id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) return 570;
    return 0;
}

/* Blackwell and later (NVLink5): nvml.h (R570 from 12.8.90 on, R580) marks fields 161-163
 * "unsupported for Blackwell+. Please use NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*", and the
 * NVML_FI_DEV_NVLINK_COUNT_* block (201-222) is described as "in NVLink5". */
static int nvlink5(const gpu_t *g) {
    return g->arch >= NVML_DEVICE_ARCH_BLACKWELL && g->arch != NVML_VALUE_NOT_AVAILABLE_UINT;
}

/* Up -> down transitions of a link before t: recoveries that failed (the link was declared
 * down), for NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS. */
static unsigned long long link_down_events(const gpu_t *g, int link, int64_t t) {
    unsigned long long n = 0;
    int up = 1;
    for (int i = 0; i < g->nls && g->ls[i].start <= t; i++) {
        if (g->ls[i].link != link) continue;
        if (up && !g->ls[i].up) n++;
        up = g->ls[i].up;
    }
    return n;
}

/* Fills one nvmlFieldValue_t; the per-field status goes to v->nvmlReturn. */
static nvmlReturn_t field_value(const ctx_t *c, nvmlFieldValue_t *v) {
    const gpu_t *g = c->g;
    const unsigned id = v->fieldId, scope = v->scopeId;
    const int has_nvlink = g->nvlink_count > 0;
    int link, kind;

    if (c->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (c->s->branch < field_first_branch(id)) return NVML_ERROR_NOT_SUPPORTED; /* unknown id */
    if ((kind = legacy_link_field(id, &link)) >= 0) {
        if (!has_nvlink) return NVML_ERROR_NOT_SUPPORTED;
        if (link < 0) {
            fv_ull(v, link_err_sum(g, kind));
        } else {
            if ((unsigned)link >= g->nvlink_count) return NVML_ERROR_NOT_SUPPORTED;
            fv_ull(v, g->link_err[link][kind]);
        }
        return NVML_SUCCESS;
    }
    switch (id) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING:
        if (!g->ecc) return NVML_ERROR_NOT_SUPPORTED;
        fv_uint(v, 1);
        return NVML_SUCCESS;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        if (!g->ecc) return NVML_ERROR_NOT_SUPPORTED;
        fv_ull(v, id == NVML_FI_DEV_ECC_SBE_VOL_TOTAL   ? g->ecc_corr_vol
                  : id == NVML_FI_DEV_ECC_DBE_VOL_TOTAL ? g->ecc_unc_vol
                  : id == NVML_FI_DEV_ECC_SBE_AGG_TOTAL ? g->ecc_corr_agg
                                                        : g->ecc_unc_agg);
        return NVML_SUCCESS;
    case NVML_FI_DEV_MEMORY_TEMP:
        if (!g->mem_temp_supported) return NVML_ERROR_NOT_SUPPORTED;
        fv_uint(v, mem_temp(c));
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        fv_ull(v, u64_floor(energy_mj(g, c->s->boot, c->now)));
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        if (!has_nvlink) return NVML_ERROR_NOT_SUPPORTED;
        fv_uint(v, g->nvlink_count);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        fv_ull(v, g->pcie_replay);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER:
        fv_ull(v, 0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
        if (!has_nvlink) return NVML_ERROR_NOT_SUPPORTED;
        if (scope == UINT_MAX) { /* all links */
            unsigned long long sum = 0;
            for (unsigned l = 0; l < g->nvlink_count; l++)
                sum += link_kib(g, (int)l, c->s->boot, c->now);
            fv_ull(v, sum);
            return NVML_SUCCESS;
        }
        if (scope >= g->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
        fv_ull(v, link_kib(g, (int)scope, c->s->boot, c->now));
        return NVML_SUCCESS;
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (!g->row_remap) return NVML_ERROR_NOT_SUPPORTED;
        fv_uint(v, id == NVML_FI_DEV_REMAPPED_COR       ? g->rr_corr
                   : id == NVML_FI_DEV_REMAPPED_UNC     ? g->rr_unc
                   : id == NVML_FI_DEV_REMAPPED_PENDING ? g->rr_pending
                                                        : g->rr_failure);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        if (!has_nvlink || nvlink5(g)) return NVML_ERROR_NOT_SUPPORTED;
        if (scope >= g->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
        kind = id == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY     ? LERR_REPLAY
               : id == NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY ? LERR_RECOVERY
                                                            : LERR_CRC_FLIT;
        fv_ull(v, g->link_err[scope][kind]);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_GET_STATE:
        if (!has_nvlink) return NVML_ERROR_NOT_SUPPORTED;
        if (scope >= g->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
        fv_uint(v, link_up_at(g, (int)scope, c->now) ? NVML_NVLINK_STATE_ACTIVE
                                                     : NVML_NVLINK_STATE_INACTIVE);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_GET_VERSION:
        if (!has_nvlink) return NVML_ERROR_NOT_SUPPORTED;
        fv_uint(v, g->nvlink_version);
        return NVML_SUCCESS;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        fv_uint(v, g->recovery_action);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: {
        if (!g->pcie_byte_counters) return NVML_ERROR_NOT_SUPPORTED;
        double kibps = id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES ? g->pcie_tx_kibps : g->pcie_rx_kibps;
        double busy = util_integral(g, UTIL_GPU, c->s->boot, c->now) / 100.0 / 1e6; /* seconds */
        fv_ull(v, u64_floor(kibps * 1024.0 * busy));
        return NVML_SUCCESS;
    }
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: {
        /* successful = the "recovery" error counter, failed = times the link went down */
        if (!has_nvlink || !nvlink5(g)) return NVML_ERROR_NOT_SUPPORTED;
        if (scope >= g->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
        unsigned long long ok = g->link_err[scope][LERR_RECOVERY];
        unsigned long long failed = link_down_events(g, (int)scope, c->now);
        fv_ull(v, id == NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS ? ok
                  : id == NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS   ? failed
                                                                                 : ok + failed);
        return NVML_SUCCESS;
    }
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r != NVML_SUCCESS) return leave(r);
    if (values == NULL || valuesCount < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)c.now;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        memset(&v->value, 0, sizeof v->value);
        v->nvmlReturn = field_value(&c, v);
    }
    return leave(NVML_SUCCESS);
}

/* ---- memory, ECC, row remapping ----------------------------------------- */

static void memory_numbers(const ctx_t *c, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used) {
    if (c->mig >= 0) {
        const mig_t *m = &c->g->mig[c->mig];
        *total = m->mem_total;
        *reserved = 0;
        *used = m->mem_used < m->mem_total ? m->mem_used : m->mem_total;
        return;
    }
    *total = c->g->mem_total;
    *reserved = c->g->mem_reserved < *total ? c->g->mem_reserved : *total;
    *used = c->g->mem_used < *total - *reserved ? c->g->mem_used : *total - *reserved;
}

/* v1 has no reserved member: nvml.h defines its used as the "Sum of Reserved and Allocated
 * device memory" (v2 reports the two apart, its used being the allocated part). */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r != NVML_SUCCESS) return leave(r);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((r = mig_parent_check(&c)) != NVML_SUCCESS) return leave(r);
    unsigned long long total, reserved, used;
    memory_numbers(&c, &total, &reserved, &used);
    memory->total = total;
    memory->used = reserved + used;
    memory->free = total - reserved - used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, ALLOW_MIG, API_MEMORY_INFO_V2);
    if (r != NVML_SUCCESS) return leave(r);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if ((r = mig_parent_check(&c)) != NVML_SUCCESS) return leave(r);
    unsigned long long total, reserved, used;
    memory_numbers(&c, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - reserved - used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType,
                                                unsigned long long *eccCounts) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (!c.g->ecc) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (eccCounts == NULL || errorType > NVML_MEMORY_ERROR_TYPE_UNCORRECTED ||
        counterType > NVML_AGGREGATE_ECC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const int corrected = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    if (counterType == NVML_VOLATILE_ECC)
        *eccCounts = corrected ? c.g->ecc_corr_vol : c.g->ecc_unc_vol;
    else
        *eccCounts = corrected ? c.g->ecc_corr_agg : c.g->ecc_unc_agg;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (!c.g->row_remap) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = c.g->rr_corr;
    *uncRows = c.g->rr_unc;
    *isPending = c.g->rr_pending ? 1u : 0u;
    *failureOccurred = c.g->rr_failure ? 1u : 0u;
    return leave(NVML_SUCCESS);
}

/* ---- events ------------------------------------------------------------- */

static struct nvmlEventSet_st *resolve_set(nvmlEventSet_t set) {
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)&g_sets[0];
    if (set == NULL || p < base || p >= base + sizeof g_sets || (p - base) % sizeof g_sets[0] != 0)
        return NULL;
    struct nvmlEventSet_st *s = &g_sets[(p - base) / sizeof g_sets[0]];
    return s->in_use ? s : NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *eventTypes) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r == NVML_SUCCESS) {
        if (eventTypes == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *eventTypes = c.g->event_types;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r != NVML_SUCCESS) return leave(r);
    if (set == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < FAKE_MAX_SETS; i++) {
        if (!g_sets[i].in_use) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].in_use = 1;
            g_sets[i].start_seq = c.s->max_seq;
            g_sets[i].cursor = c.s->max_seq;
            *set = &g_sets[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_MEMORY);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    struct nvmlEventSet_st *es = resolve_set(set);
    if (es == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((eventTypes & ~c.g->event_types) != 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (es->types[c.gpu] == 0) es->reg_seq[c.gpu] = c.s->max_seq;
    es->types[c.gpu] |= eventTypes;
    return leave(NVML_SUCCESS);
}

/* Finds the next undelivered event for the set; lock held. */
static const event_t *next_event(const state_t *s, const struct nvmlEventSet_st *es) {
    for (int i = 0; i < s->nev; i++) {
        const event_t *e = &s->ev[i];
        if (e->seq <= es->cursor || e->gpu >= (unsigned)s->ngpu) continue;
        if (!(es->types[e->gpu] & nvmlEventTypeXidCriticalError)) continue;
        if (e->seq <= es->reg_seq[e->gpu]) continue;
        /* An XID from inside a MIG slice reaches only a caller with CAP_SYS_ADMIN. */
        if (e->gi != NVML_VALUE_NOT_AVAILABLE_UINT && !g_sys_admin) continue;
        return e;
    }
    return NULL;
}

/* An inotify descriptor on the state file's directory (the file is replaced by a rename),
 * or -1: what an event wait blocks on between looks at the state. */
static int watch_state_dir(void) {
    char dir[sizeof g_path];
    pthread_mutex_lock(&g_lock);
    memcpy(dir, g_path, sizeof dir);
    pthread_mutex_unlock(&g_lock);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        dir[0] = '.';
        dir[1] = '\0';
    } else if (slash == dir) {
        dir[1] = '\0';
    } else {
        *slash = '\0';
    }
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return -1;
    if (inotify_add_watch(fd, dir, IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB | IN_CREATE) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sleep until the state directory changes or `ms` pass (at most EVENT_BLOCK_MS at a time:
 * an event set registered meanwhile by another thread writes no file). Without inotify,
 * look again after 5 ms, as the fake always did. */
enum { EVENT_BLOCK_MS = 250 };
static void wait_for_state(int watch, int64_t ms) {
    if (watch < 0) {
        struct timespec ts = {0, (long)((ms < 5 ? ms : 5) * 1000000)};
        nanosleep(&ts, NULL);
        return;
    }
    struct pollfd pfd = {.fd = watch, .events = POLLIN, .revents = 0};
    if (poll(&pfd, 1, (int)(ms < EVENT_BLOCK_MS ? ms : EVENT_BLOCK_MS)) > 0) {
        char buf[4096];
        while (read(watch, buf, sizeof buf) > 0) {
        }
    }
}

static nvmlReturn_t event_wait_on(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms,
                                  const char *fn, int watch);

/* A real driver blocks in the kernel until an event or the timeout: this one blocks on the
 * state file changing (events only come with a new state), so a waiting thread costs about
 * what it costs on a driver, not a look at the state every 5 ms (issue #24: that polling was
 * most of a GPU-only agent's CPU on the fake). */
static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms,
                               const char *fn) {
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const int watch = timeoutms > 0 ? watch_state_dir() : -1;
    nvmlReturn_t r = event_wait_on(set, data, timeoutms, fn, watch);
    if (watch >= 0) close(watch);
    return r;
}

static nvmlReturn_t event_wait_on(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms,
                                  const char *fn, int watch) {
    const int64_t deadline = monotonic_ms() + (int64_t)timeoutms;
    for (int polls = 0;; polls++) {
        ctx_t c;
        /* a call's latency is slept, and its hang or storm applied, once, not at every poll */
        nvmlReturn_t r = enter_full(&c, fn, -1, NULL, polls > 0 ? ENTER_NO_FAULTS : 0);
        if (polls > 0) t_delay_us = 0;
        if (r != NVML_SUCCESS) return leave(r);
        struct nvmlEventSet_st *es = resolve_set(set);
        if (es == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
        const event_t *e = next_event(c.s, es);
        if (e != NULL) {
            memset(data, 0, sizeof *data);
            data->device = &g_dev[e->gpu];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = e->xid;
            data->gpuInstanceId = e->gi;
            data->computeInstanceId = e->ci;
            es->cursor = e->seq;
            return leave(NVML_SUCCESS);
        }
        (void)leave(NVML_SUCCESS);
        int64_t left = deadline - monotonic_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        wait_for_state(watch, left);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms) {
    return event_wait(set, data, timeoutms, __func__);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data,
                                     unsigned int timeoutms) {
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t full;
    nvmlReturn_t r = event_wait(set, &full, timeoutms, __func__);
    if (r == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r != NVML_SUCCESS) return leave(r);
    struct nvmlEventSet_st *es = resolve_set(set);
    if (es == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(es, 0, sizeof *es);
    return leave(NVML_SUCCESS);
}

/* ---- processes ------------------------------------------------------------ */

static int proc_visible(const ctx_t *c, const proc_t *p) {
    if (c->mig < 0) return 1;
    const mig_t *m = &c->g->mig[c->mig];
    return p->gi == m->gi && p->ci == m->ci;
}

static int cc_process_entry(const state_t *s);

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos, int v3, const char *fn) {
    ctx_t c;
    nvmlReturn_t r = v3 ? enter_dev_api_at(&c, device, ALLOW_MIG, API_COMPUTE_PROCS_V3, fn)
                        : enter_dev_at(&c, device, ALLOW_MIG, fn);
    if (r != NVML_SUCCESS) return leave(r);
    if (infoCount == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((r = mig_parent_check(&c)) != NVML_SUCCESS) return leave(r);
    unsigned n = 0;
    for (int i = 0; i < c.g->nprocs; i++) n += proc_visible(&c, &c.g->procs[i]) ? 1u : 0u;
    if (n == 0) {
        *infoCount = 0;
        return leave(NVML_SUCCESS);
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    const int cc_entry = v3 && cc_process_entry(c.s);
    unsigned k = 0;
    for (int i = 0; i < c.g->nprocs; i++) {
        const proc_t *p = &c.g->procs[i];
        if (!proc_visible(&c, p)) continue;
        if (cc_entry) {
            nvmlProcessInfoCc_t *e = &((nvmlProcessInfoCc_t *)(void *)infos)[k];
            memset(e, 0, sizeof *e);
            e->pid = p->pid;
            e->usedGpuMemory = p->used;
            e->gpuInstanceId = p->gi;
            e->computeInstanceId = p->ci;
        } else {
            memset(&infos[k], 0, sizeof infos[k]);
            infos[k].pid = p->pid;
            infos[k].usedGpuMemory = p->used;
            infos[k].gpuInstanceId = p->gi;
            infos[k].computeInstanceId = p->ci;
        }
        k++;
    }
    *infoCount = k;
    return leave(NVML_SUCCESS);
}

/* The drivers whose header declared the 32-byte nvmlProcessInfo_t: R535 before 535.104. */
static int cc_process_entry(const state_t *s) {
    return s->branch == 535 && s->branch_minor < api_first_minor[API_PROCESS_DETAIL_LIST];
}

/* Confidential-computing memory sizes: no modelled GPU runs in CC mode. */
EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device,
                                                        nvmlConfComputeMemSizeInfo_t *memInfo) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_CONF_COMPUTE_MEM_SIZE);
    if (r != NVML_SUCCESS) return leave(r);
    if (memInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

/* Only its presence is modelled (which tells a caller the _v3 entry's layout): it answers
 * NOT_SUPPORTED, and the agent lists processes through _v3. */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, void *plist) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_PROCESS_DETAIL_LIST);
    if (r != NVML_SUCCESS) return leave(r);
    if (plist == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return running_processes(device, infoCount, infos, 1, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return running_processes(device, infoCount, infos, 0, __func__);
}

/* One sample per registered process, stamped with the newest utilization sample. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (processSamplesCount == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.g->mig_mode) return leave(NVML_ERROR_NOT_SUPPORTED);
    int64_t ts = newest_sample_ts(&c);
    unsigned n = (unsigned)c.g->nprocs;
    if (c.s->realistic) {
        /* Process samples come every proc_period only, and (nvml.h, this call) "One
         * utilization sample structure is returned per process running, that had some non-zero
         * utilization during the last sample period". */
        const int64_t pp = c.s->proc_period;
        ts = floor_div(c.now, pp) * pp;
        n = 0;
        for (int i = 0; i < c.g->nprocs; i++)
            if (c.g->procs[i].sm > 0 || c.g->procs[i].mem > 0) n++;
        if (ts < c.s->boot) n = 0;
    } else if (ts < oldest_sample_ts(&c)) {
        n = 0;
    }
    if (n == 0 || (unsigned long long)ts <= lastSeenTimeStamp) return leave(NVML_ERROR_NOT_FOUND);
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned k = 0;
    for (int i = 0; i < c.g->nprocs; i++) {
        const proc_t *p = &c.g->procs[i];
        if (c.s->realistic && p->sm == 0 && p->mem == 0) continue;
        memset(&utilization[k], 0, sizeof utilization[k]);
        utilization[k].pid = p->pid;
        utilization[k].timeStamp = (unsigned long long)ts;
        /* proc_util_scale (default 1): values above 100 %, as suspected on real hardware */
        utilization[k].smUtil = u32_round((double)p->sm * c.g->proc_util_scale);
        utilization[k].memUtil = u32_round((double)p->mem * c.g->proc_util_scale);
        k++;
    }
    *processSamplesCount = n;
    return leave(NVML_SUCCESS);
}

/* ---- MIG ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (!c.g->mig_capable) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (currentMode == NULL || pendingMode == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = c.g->mig_mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = c.g->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* As documented: zero if MIG is not supported or not enabled. */
    *count = c.g->mig_capable && c.g->mig_mode ? c.g->mig_max : 0u;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (!c.g->mig_capable) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (migDevice == NULL || !c.g->mig_mode || index >= c.g->mig_max)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned)c.g->nmig) return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = &g_mig[c.gpu][index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r == NVML_SUCCESS) {
        if (isMigDevice == NULL) r = NVML_ERROR_INVALID_ARGUMENT;
        else *isMigDevice = c.mig >= 0 ? 1u : 0u;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r != NVML_SUCCESS) return leave(r);
    if (id == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.mig < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = c.g->mig[c.mig].gi;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, ALLOW_MIG);
    if (r != NVML_SUCCESS) return leave(r);
    if (id == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.mig < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = c.g->mig[c.mig].ci;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                 nvmlDevice_t *device) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, migDevice, ALLOW_MIG);
    if (r != NVML_SUCCESS) return leave(r);
    if (device == NULL || c.mig < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_dev[c.gpu];
    return leave(NVML_SUCCESS);
}

/* ---- topology: PCIe common ancestor, NVLink remote ends, GPU fabric --------
 * The PCIe tree comes from each GPU's host bridge and chain of PCIe switches
 * (outermost first) plus its NUMA node; the level between two GPUs is the
 * first that holds of: same GPU (INTERNAL), same innermost switch (SINGLE),
 * any switch in common (MULTIPLE), same host bridge (HOSTBRIDGE), same NUMA
 * node (NODE), else SYSTEM.  A GPU without topology makes them NOT_SUPPORTED.
 */

#define TOPO_MAX_SWITCHES 8

typedef struct {
    int n;
    char name[TOPO_MAX_SWITCHES][64];
} switch_path_t;

static void switch_path(const gpu_t *g, switch_path_t *out) {
    const char *p = g->topo_switches;
    out->n = 0;
    for (;;) {
        while (*p == ' ') p++;
        size_t len = strcspn(p, " ");
        if (len == 0 || out->n >= TOPO_MAX_SWITCHES) return;
        if (!(len == 1 && p[0] == '-') && len < sizeof out->name[0]) {
            memcpy(out->name[out->n], p, len);
            out->name[out->n][len] = '\0';
            out->n++;
        }
        p += len;
    }
}

static int has_topology(const gpu_t *g) { return g->topo_host_bridge[0] != '\0'; }

static unsigned topology_level(const state_t *s, unsigned a, unsigned b) {
    if (a == b) return NVML_TOPOLOGY_INTERNAL;
    const gpu_t *ga = &s->gpu[a], *gb = &s->gpu[b];
    switch_path_t pa, pb;
    switch_path(ga, &pa);
    switch_path(gb, &pb);
    if (pa.n > 0 && pb.n > 0 && strcmp(pa.name[pa.n - 1], pb.name[pb.n - 1]) == 0)
        return NVML_TOPOLOGY_SINGLE;
    for (int i = 0; i < pa.n; i++)
        for (int j = 0; j < pb.n; j++)
            if (strcmp(pa.name[i], pb.name[j]) == 0) return NVML_TOPOLOGY_MULTIPLE;
    if (strcmp(ga->topo_host_bridge, gb->topo_host_bridge) == 0) return NVML_TOPOLOGY_HOSTBRIDGE;
    if (ga->numa_node >= 0 && ga->numa_node == gb->numa_node) return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

static int valid_topology_level(unsigned level) {
    return level == NVML_TOPOLOGY_INTERNAL || level == NVML_TOPOLOGY_SINGLE ||
           level == NVML_TOPOLOGY_MULTIPLE || level == NVML_TOPOLOGY_HOSTBRIDGE ||
           level == NVML_TOPOLOGY_NODE || level == NVML_TOPOLOGY_SYSTEM;
}

/* A second device argument (lock held): a physical GPU that is not lost. */
static nvmlReturn_t peer_dev(const ctx_t *c, nvmlDevice_t dev, unsigned *gpu) {
    int mig;
    if (dev == NULL || resolve_handle(dev, gpu, &mig) != 0 || *gpu >= (unsigned)c->s->ngpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *g = &c->s->gpu[*gpu];
    if (mig >= 0 && (!g->mig_mode || mig >= g->nmig)) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* The count protocol of the GPU-set queries: a NULL array or a zero *count asks for the
 * number of matches; otherwise up to *count handles are written and *count is set to the
 * number written. */
static nvmlReturn_t return_gpu_set(const unsigned char *match, int ngpu, unsigned *count,
                                   nvmlDevice_t *deviceArray) {
    unsigned n = 0;
    for (int i = 0; i < ngpu; i++) n += match[i] ? 1u : 0u;
    if (deviceArray == NULL || *count == 0) {
        *count = n;
        return NVML_SUCCESS;
    }
    unsigned written = 0;
    for (int i = 0; i < ngpu && written < *count; i++)
        if (match[i]) deviceArray[written++] = &g_dev[i];
    *count = written;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        nvmlGpuTopologyLevel_t *pathInfo) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device1, 0);
    if (r != NVML_SUCCESS) return leave(r);
    unsigned other;
    if ((r = peer_dev(&c, device2, &other)) != NVML_SUCCESS) return leave(r);
    if (pathInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!has_topology(c.g) || !has_topology(&c.s->gpu[other]))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *pathInfo = topology_level(c.s, c.gpu, other);
    return leave(NVML_SUCCESS);
}

/* The other GPUs at `level` or closer. */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device,
                                                     nvmlGpuTopologyLevel_t level,
                                                     unsigned int *count,
                                                     nvmlDevice_t *deviceArray) {
    ctx_t c;
    nvmlReturn_t r = enter_dev(&c, device, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (count == NULL || !valid_topology_level(level)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!has_topology(c.g)) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned char match[FAKE_MAX_GPUS] = {0};
    for (int i = 0; i < c.s->ngpu; i++)
        match[i] = (unsigned)i != c.gpu && has_topology(&c.s->gpu[i]) &&
                   topology_level(c.s, c.gpu, (unsigned)i) <= level;
    return leave(return_gpu_set(match, c.s->ngpu, count, deviceArray));
}

/* The GPUs whose NUMA node holds CPU `cpuNumber` (per the profile's numa_cpus). */
EXPORT nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count,
                                                nvmlDevice_t *deviceArray) {
    ctx_t c;
    nvmlReturn_t r = enter(&c);
    if (r != NVML_SUCCESS) return leave(r);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.s->has_numa_cpus) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (cpuNumber >= FAKE_MAX_CPUS) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const unsigned long long bit = 1ULL << (cpuNumber % 64);
    int known = 0;
    for (int n = 0; n < FAKE_MAX_NUMA; n++) known |= (c.s->numa_cpus[n][cpuNumber / 64] & bit) != 0;
    if (!known) return leave(NVML_ERROR_INVALID_ARGUMENT); /* no such CPU */
    unsigned char match[FAKE_MAX_GPUS] = {0};
    for (int i = 0; i < c.s->ngpu; i++) {
        int node = c.s->gpu[i].numa_node;
        match[i] = node >= 0 && node < FAKE_MAX_NUMA &&
                   (c.s->numa_cpus[node][cpuNumber / 64] & bit) != 0;
    }
    return leave(return_gpu_set(match, c.s->ngpu, count, deviceArray));
}

/* Resolves (device, link) for the per-link NVLink queries; on success *remote is the far end. */
static nvmlReturn_t nvlink_link(ctx_t *c, nvmlDevice_t device, unsigned link, const void *out,
                                const nvremote_t **remote) {
    nvmlReturn_t r = enter_dev(c, device, 0);
    if (r != NVML_SUCCESS) return r;
    if (c->g->nvlink_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (out == NULL || link >= c->g->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
    *remote = &c->g->nvr[link];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *type) {
    ctx_t c;
    const nvremote_t *rem = NULL;
    nvmlReturn_t r = nvlink_link(&c, device, link, type, &rem);
    if (r != NVML_SUCCESS) return leave(r);
    if (!rem->set) return leave(NVML_ERROR_NOT_SUPPORTED);
    *type = rem->type;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci) {
    ctx_t c;
    const nvremote_t *rem = NULL;
    nvmlReturn_t r = nvlink_link(&c, device, link, pci, &rem);
    if (r != NVML_SUCCESS) return leave(r);
    if (!rem->set || !rem->has_pci) return leave(NVML_ERROR_NOT_SUPPORTED);
    fill_pci_info(pci, rem->domain, rem->bus, rem->device, rem->function, rem->pci_device_id,
                  rem->pci_subsystem_id);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                  nvmlNvLinkCapability_t capability,
                                                  unsigned int *capResult) {
    ctx_t c;
    const nvremote_t *rem = NULL;
    nvmlReturn_t r = nvlink_link(&c, device, link, capResult, &rem);
    if (r != NVML_SUCCESS) return leave(r);
    if (capability >= NVML_NVLINK_CAP_COUNT) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *capResult = (c.g->nvlink_caps >> capability) & 1u;
    return leave(NVML_SUCCESS);
}

/* clusterUuid from 32 hex digits (dashes ignored); zeros if malformed. */
static void fabric_uuid(const gpu_t *g, unsigned char out[NVML_GPU_FABRIC_UUID_LEN]) {
    unsigned char buf[NVML_GPU_FABRIC_UUID_LEN] = {0};
    int nibbles = 0;
    memset(out, 0, NVML_GPU_FABRIC_UUID_LEN);
    for (const char *p = g->fabric_cluster_uuid; *p != '\0'; p++) {
        int v;
        if (*p >= '0' && *p <= '9') v = *p - '0';
        else if (*p >= 'a' && *p <= 'f') v = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') v = *p - 'A' + 10;
        else if (*p == '-') continue;
        else return;
        if (nibbles >= 2 * NVML_GPU_FABRIC_UUID_LEN) return;
        buf[nibbles / 2] = (unsigned char)(buf[nibbles / 2] | (v << (nibbles % 2 ? 0 : 4)));
        nibbles++;
    }
    if (nibbles == 2 * NVML_GPU_FABRIC_UUID_LEN) memcpy(out, buf, sizeof buf);
}

/* The fabric state and status at `now`: the last "fs" entry started by then, else the "g" keys. */
static void fabric_state_at(const gpu_t *g, int64_t now, unsigned *state, unsigned *status) {
    *state = g->fabric_state;
    *status = g->fabric_status;
    for (int i = 0; i < g->nfs && g->fs[i].start <= now; i++) {
        *state = g->fs[i].state;
        *status = g->fs[i].status;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                               nvmlGpuFabricInfo_t *gpuFabricInfo) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_FABRIC_INFO);
    if (r != NVML_SUCCESS) return leave(r);
    if (gpuFabricInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.g->fabric) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(gpuFabricInfo, 0, sizeof *gpuFabricInfo);
    fabric_uuid(c.g, gpuFabricInfo->clusterUuid);
    unsigned state, status;
    fabric_state_at(c.g, c.now, &state, &status);
    gpuFabricInfo->status = (nvmlReturn_t)status;
    gpuFabricInfo->cliqueId = c.g->fabric_clique;
    gpuFabricInfo->state = state;
    return leave(NVML_SUCCESS);
}

/* Accepts nvmlGpuFabricInfo_v2 (healthMask) and _v3 (also healthSummary). */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                nvmlGpuFabricInfo_v3_t *gpuFabricInfo) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_FABRIC_INFO_V);
    if (r != NVML_SUCCESS) return leave(r);
    if (gpuFabricInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const unsigned version = gpuFabricInfo->version;
    /* v3 (healthSummary) is first in the R580 header (CUDA 13.0.39, absent from 12.9.79). */
    if (version != nvmlGpuFabricInfo_v2 && (version != nvmlGpuFabricInfo_v3 || c.s->branch < 580))
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!c.g->fabric) return leave(NVML_ERROR_NOT_SUPPORTED);
    nvmlGpuFabricInfo_v2_t v2;
    memset(&v2, 0, sizeof v2);
    v2.version = version;
    fabric_uuid(c.g, v2.clusterUuid);
    unsigned state, status;
    fabric_state_at(c.g, c.now, &state, &status);
    v2.status = (nvmlReturn_t)status;
    v2.cliqueId = c.g->fabric_clique;
    v2.state = state;
    v2.healthMask = c.g->fabric_health_mask;
    memcpy(gpuFabricInfo, &v2, sizeof v2); /* a v2 caller's struct is only this large */
    if (version == nvmlGpuFabricInfo_v3)
        gpuFabricInfo->healthSummary = (unsigned char)c.g->fabric_health_summary;
    return leave(NVML_SUCCESS);
}

/* ---- GPM (GPU Performance Monitoring) --------------------------------------
 * Hopper and later only (nvml.h: "For Hopper or newer fully supported devices"): on older
 * architectures nvmlGpmQueryDeviceSupport answers isSupportedDevice 0 and the sample calls
 * NOT_SUPPORTED.  A sample records its scope (GPU, MIG GPU instance) and the fake time it was
 * taken; nvmlGpmMetricsGet computes each metric over the window between two samples of the
 * same scope (gpm_percent()), so a caller's rates are exact.  What nvml.h leaves open is
 * answered the strict way: a freed, never-allocated or never-filled sample, samples of
 * different scopes and a second sample not later than the first are INVALID_ARGUMENT; a
 * GPU instance that does not exist is NOT_FOUND; a MIG device handle is NOT_SUPPORTED
 * (GPM samples a GPU, or a GPU instance through its parent).  Metrics NVML defines but the
 * fake does not model (PCIe, NVLink, NVDEC/NVJPG/NVOFA, the DFMA/HMMA/DMMA/IMMA tensor
 * pipes) answer NOT_SUPPORTED per metric; ids nvml.h does not define, INVALID_ARGUMENT. */
#define FAKE_GPM_SAMPLES 512

struct nvmlGpmSample_st {
    int allocated;
    int filled;
    unsigned gpu;
    int gi; /* -1: the whole GPU */
    int64_t ts;
};

static struct nvmlGpmSample_st g_gpm[FAKE_GPM_SAMPLES]; /* lock held */

/* At the last nvmlShutdown every sample is forgotten: using or freeing one afterwards is
 * INVALID_ARGUMENT (a driver's are host memory the caller must free; the fake is stricter,
 * and a test process that starts many agents never runs out of its fixed pool). */
static void gpm_forget_samples(void) { memset(g_gpm, 0, sizeof g_gpm); }

static struct nvmlGpmSample_st *resolve_gpm_sample(nvmlGpmSample_t sample) {
    uintptr_t p = (uintptr_t)sample, base = (uintptr_t)&g_gpm[0];
    if (p < base || p >= base + sizeof g_gpm || (p - base) % sizeof g_gpm[0] != 0) return NULL;
    struct nvmlGpmSample_st *e = &g_gpm[(p - base) / sizeof g_gpm[0]];
    return e->allocated ? e : NULL;
}

static int gpm_capable(const gpu_t *g) {
    return g->arch != 0xFFFFFFFFu && g->arch >= NVML_DEVICE_ARCH_HOPPER;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_GPM);
    if (r != NVML_SUCCESS) return leave(r);
    if (gpmSupport == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = gpm_capable(c.g) ? 1u : 0u;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    ctx_t c;
    nvmlReturn_t r = enter_full(&c, __func__, (int)API_GPM, NULL, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (gpmSample == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < FAKE_GPM_SAMPLES; i++) {
        if (g_gpm[i].allocated) continue;
        memset(&g_gpm[i], 0, sizeof g_gpm[i]);
        g_gpm[i].allocated = 1;
        *gpmSample = &g_gpm[i];
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_MEMORY);
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    ctx_t c;
    nvmlReturn_t r = enter_full(&c, __func__, (int)API_GPM, NULL, 0);
    if (r != NVML_SUCCESS) return leave(r);
    struct nvmlGpmSample_st *e = resolve_gpm_sample(gpmSample);
    if (e == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(e, 0, sizeof *e);
    return leave(NVML_SUCCESS);
}

/* Fills a sample of (GPU, gi); lock held, c from enter_dev. */
static nvmlReturn_t gpm_fill(const ctx_t *c, int gi, nvmlGpmSample_t gpmSample) {
    if (!gpm_capable(c->g)) return NVML_ERROR_NOT_SUPPORTED;
    struct nvmlGpmSample_st *e = resolve_gpm_sample(gpmSample);
    if (e == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    e->filled = 1;
    e->gpu = c->gpu;
    e->gi = gi;
    e->ts = c->now;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_GPM);
    if (r != NVML_SUCCESS) return leave(r);
    return leave(gpm_fill(&c, -1, gpmSample));
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                        nvmlGpmSample_t gpmSample) {
    ctx_t c;
    nvmlReturn_t r = enter_dev_api(&c, device, 0, API_GPM);
    if (r != NVML_SUCCESS) return leave(r);
    if (!gpm_capable(c.g) || !c.g->mig_mode) return leave(NVML_ERROR_NOT_SUPPORTED);
    int found = 0;
    for (int m = 0; m < c.g->nmig; m++) found |= c.g->mig[m].gi == gpuInstanceId;
    if (!found || gpuInstanceId > (unsigned)INT_MAX) return leave(NVML_ERROR_NOT_FOUND);
    return leave(gpm_fill(&c, (int)gpuInstanceId, gpmSample));
}

typedef struct {
    unsigned id;
    int metric; /* GPM_* */
    const char *short_name, *long_name, *unit;
} gpm_metric_info_t;

static const gpm_metric_info_t gpm_metrics[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, GPM_GR, "GR_UTIL", "Graphics Utilization", "%"},
    {NVML_GPM_METRIC_SM_UTIL, GPM_SM, "SM_UTIL", "SM Utilization", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, GPM_OCC, "SM_OCCUPANCY", "SM Occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, GPM_INT, "INTEGER_UTIL", "Integer Utilization", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, GPM_TENSOR, "ANY_TENSOR_UTIL", "Tensor Utilization", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, GPM_DRAM, "DRAM_BW_UTIL", "DRAM Bandwidth Utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, GPM_FP64, "FP64_UTIL", "FP64 Utilization", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, GPM_FP32, "FP32_UTIL", "FP32 Utilization", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, GPM_FP16, "FP16_UTIL", "FP16 Utilization", "%"},
};

/* Whether nvml.h (of R520-R535, NVML_GPM_METRIC_MAX 98) defines metric `id`. */
static int gpm_metric_defined(unsigned id) {
    return (id >= NVML_GPM_METRIC_GRAPHICS_UTIL && id <= NVML_GPM_METRIC_FP16_UTIL) ||
           id == NVML_GPM_METRIC_PCIE_TX_PER_SEC || id == NVML_GPM_METRIC_PCIE_RX_PER_SEC ||
           (id >= NVML_GPM_METRIC_NVDEC_0_UTIL && id <= NVML_GPM_METRIC_NVDEC_7_UTIL) ||
           (id >= NVML_GPM_METRIC_NVJPG_0_UTIL && id <= NVML_GPM_METRIC_NVJPG_7_UTIL) ||
           id == NVML_GPM_METRIC_NVOFA_0_UTIL ||
           (id >= NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC && id <= NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC);
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    /* The samples name the GPU, so that "hang" and "storm" rules for one GPU match this
     * device-less call too: look it up first, then enter as a call on that GPU. */
    unsigned gpu = 0;
    int have_gpu = 0;
    pthread_mutex_lock(&g_lock);
    if (metricsGet != NULL && metricsGet->version == NVML_GPM_METRICS_GET_VERSION) {
        const struct nvmlGpmSample_st *e = resolve_gpm_sample(metricsGet->sample1);
        if (e != NULL && e->filled) {
            gpu = e->gpu;
            have_gpu = 1;
        }
    }
    pthread_mutex_unlock(&g_lock);
    ctx_t c;
    nvmlReturn_t r = have_gpu && gpu < FAKE_MAX_GPUS
                         ? enter_dev_api(&c, &g_dev[gpu], 0, API_GPM)
                         : enter_full(&c, __func__, (int)API_GPM, NULL, 0);
    if (r != NVML_SUCCESS) return leave(r);
    if (metricsGet == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (metricsGet->numMetrics > FAKE_GPM_METRIC_MAX) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct nvmlGpmSample_st *s1 = resolve_gpm_sample(metricsGet->sample1);
    const struct nvmlGpmSample_st *s2 = resolve_gpm_sample(metricsGet->sample2);
    if (s1 == NULL || s2 == NULL || !s1->filled || !s2->filled || s1->gpu != s2->gpu ||
        s1->gi != s2->gi || s2->ts <= s1->ts || s1->gpu >= (unsigned)c.s->ngpu)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const gpu_t *g = &c.s->gpu[s1->gpu];
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        const unsigned id = m->metricId;
        m->value = 0.0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        m->nvmlReturn = gpm_metric_defined(id) ? NVML_ERROR_NOT_SUPPORTED
                                               : NVML_ERROR_INVALID_ARGUMENT;
        for (size_t k = 0; k < sizeof gpm_metrics / sizeof gpm_metrics[0]; k++) {
            const gpm_metric_info_t *info = &gpm_metrics[k];
            if (info->id != id) continue;
            m->value = gpm_percent(g, s1->gi, info->metric, s1->ts, s2->ts);
            m->metricInfo.shortName = (char *)(uintptr_t)info->short_name;
            m->metricInfo.longName = (char *)(uintptr_t)info->long_name;
            m->metricInfo.unit = (char *)(uintptr_t)info->unit;
            m->nvmlReturn = NVML_SUCCESS;
        }
    }
    return leave(NVML_SUCCESS);
}
