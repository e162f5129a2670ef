/*
 * fakeamdsmi: a fake libamd_smi.so (AMD SMI, lib 26.x / ROCm 7.0, or lib 25.x / ROCm 6.4 as
 * the state file's lib_version says) that the real Python `amdsmi` bindings of that release
 * (7.0.2, 6.4.0) load unchanged (ROCM_PATH=<dir>, <dir>/lib/libamd_smi.so).
 *
 * It exports the 184 symbols the 7.0.2 amdsmi_wrapper.py binds at import, plus the one 6.4.0
 * binds that 7.0 dropped (amdsmi_get_power_info_v2). A few calls are
 * modelled (see tests/doubles/README.md, "fakeamdsmi"); every other one returns
 * AMDSMI_STATUS_NOT_INIT before amdsmi_init and AMDSMI_STATUS_NOT_SUPPORTED after it, without
 * touching its arguments (as AMD's own mock backend does for what it does not model).
 *
 * Values come from a JSON state file ($FAKEAMDSMI_STATE) written by control.py; it is read
 * at amdsmi_init and re-read by any later call when the file has been replaced or changed.
 *
 * Struct layouts are those of the ctypes definitions in amdsmi_wrapper.py (x86_64, packed
 * like the wrapper's _pack_ = 1 with its explicit PADDING_ fields); _Static_asserts pin them.
 * Where 6.4's differ (section 1b), the release table (section 2c) picks the layout.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------- 1. ABI: types, codes */

typedef uint32_t amdsmi_status_t;
typedef void *amdsmi_processor_handle;
typedef void *amdsmi_socket_handle;

enum {
    AMDSMI_STATUS_SUCCESS = 0,
    AMDSMI_STATUS_INVAL = 1,
    AMDSMI_STATUS_NOT_SUPPORTED = 2,
    AMDSMI_STATUS_OUT_OF_RESOURCES = 15,
    AMDSMI_STATUS_INIT_ERROR = 18,
    AMDSMI_STATUS_REFCOUNT_OVERFLOW = 19,
    AMDSMI_STATUS_NOT_INIT = 32,
    AMDSMI_STATUS_NO_DATA = 40,
    AMDSMI_STATUS_INSUFFICIENT_SIZE = 41,
};

#define AMDSMI_INIT_AMD_GPUS 2u
#define AMDSMI_GPU_UUID_SIZE 38u
#define AMDSMI_PROCESSOR_TYPE_AMD_GPU 1u
#define AMDSMI_TEMP_CURRENT 0u
#define N_TEMP_TYPES 7  /* EDGE 0, HOTSPOT/JUNCTION 1, VRAM 2, HBM_0..HBM_3 3..6 */
#define N_CLK_TYPES 10  /* GFX 0, DF 1, DCEF 2, SOC 3, MEM 4, PCIE 5, VCLK0/1 6/7, DCLK0/1 8/9 */
#define MAX_PROCESSORS 64
#define STRLEN 256
#define N_IMAGES 9
#define MAX_GPU_PROCESSES 64
#define MAX_PAGES 64
#define N_ECC_BLOCKS 19
#define MAX_FORCED 32
#define MAX_EVENTS 256
#define STATE_VERSION 2 /* of the state file; control.py's STATE_VERSION */

typedef struct {
    char market_name[STRLEN];
    uint32_t vendor_id;
    char vendor_name[STRLEN];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[STRLEN];
    uint32_t oam_id;
    uint32_t num_of_compute_units;
    uint8_t padding0[4];
    uint64_t target_graphics_version;
    uint32_t subsystem_id;
    uint32_t reserved[21];
} __attribute__((packed)) amdsmi_asic_info_t;

typedef struct {
    uint64_t socket_power;
    uint32_t current_socket_power;
    uint32_t average_socket_power;
    uint64_t gfx_voltage;
    uint64_t soc_voltage;
    uint64_t mem_voltage;
    uint32_t power_limit;
    uint8_t padding0[4];
    uint64_t reserved[18];
} __attribute__((packed)) amdsmi_power_info_t;

typedef struct {
    uint32_t vram_total;
    uint32_t vram_used;
    uint32_t reserved[2];
} __attribute__((packed)) amdsmi_vram_usage_t;

typedef struct {
    uint32_t gfx_activity;
    uint32_t umc_activity;
    uint32_t mm_activity;
    uint32_t reserved[13];
} __attribute__((packed)) amdsmi_engine_usage_t;

typedef struct {
    uint32_t clk;
    uint32_t min_clk;
    uint32_t max_clk;
    uint8_t clk_locked;
    uint8_t clk_deep_sleep;
    uint8_t padding0[2];
    uint32_t reserved[4];
} __attribute__((packed)) amdsmi_clk_info_t;

typedef struct {
    uint32_t drm_render;
    uint32_t drm_card;
    uint32_t hsa_id;
    uint32_t hip_id;
    char hip_uuid[STRLEN];
} __attribute__((packed)) amdsmi_enumeration_info_t;

/* amdsmi_bdf_t: one uint64, function bits 0-2, device 3-7, bus 8-15, domain 16-63. */
typedef uint64_t amdsmi_bdf_t;

/* gpu_metrics as lib 26.x lays it out (a superset of the kernel's gpu_metrics_v1_8). The
 * per-partition block (xcp_stats) is the one part that differs between the releases modelled
 * (section 1b), so the body is written once and instantiated per release. */
#define MAX_NUM_XCC 8
#define MAX_NUM_XCP 8
typedef struct {
    uint32_t gfx_busy_inst[MAX_NUM_XCC];
    uint16_t jpeg_busy[40];
    uint16_t vcn_busy[4];
    uint64_t gfx_busy_acc[MAX_NUM_XCC];
    uint64_t gfx_below_host_limit_acc[MAX_NUM_XCC];
    uint64_t gfx_below_host_limit_ppt_acc[MAX_NUM_XCC];
    uint64_t gfx_below_host_limit_thm_acc[MAX_NUM_XCC];
    uint64_t gfx_low_utilization_acc[MAX_NUM_XCC];
    uint64_t gfx_below_host_limit_total_acc[MAX_NUM_XCC];
} __attribute__((packed)) amdsmi_gpu_xcp_metrics_t;

#define GPU_METRICS_BODY(XCP_T)                                                             \
    uint16_t structure_size;                                                                \
    uint8_t format_revision, content_revision;                                              \
    uint16_t temperature_edge, temperature_hotspot, temperature_mem;                        \
    uint16_t temperature_vrgfx, temperature_vrsoc, temperature_vrmem;                       \
    uint16_t average_gfx_activity, average_umc_activity, average_mm_activity;               \
    uint16_t average_socket_power;                                                          \
    uint64_t energy_accumulator;                                                            \
    uint64_t system_clock_counter;                                                          \
    uint16_t average_gfxclk_frequency, average_socclk_frequency, average_uclk_frequency;    \
    uint16_t average_vclk0_frequency, average_dclk0_frequency, average_vclk1_frequency;     \
    uint16_t average_dclk1_frequency;                                                       \
    uint16_t current_gfxclk, current_socclk, current_uclk, current_vclk0, current_dclk0;    \
    uint16_t current_vclk1, current_dclk1;                                                  \
    uint32_t throttle_status;                                                               \
    uint16_t current_fan_speed, pcie_link_width, pcie_link_speed;                           \
    uint8_t padding0[2];                                                                    \
    uint32_t gfx_activity_acc, mem_activity_acc;                                            \
    uint16_t temperature_hbm[4];                                                            \
    uint64_t firmware_timestamp;                                                            \
    uint16_t voltage_soc, voltage_gfx, voltage_mem;                                         \
    uint8_t padding1[2];                                                                    \
    uint64_t indep_throttle_status;                                                         \
    uint16_t current_socket_power;                                                          \
    uint16_t vcn_activity[4];                                                               \
    uint8_t padding2[2];                                                                    \
    uint32_t gfxclk_lock_status;                                                            \
    uint16_t xgmi_link_width, xgmi_link_speed;                                              \
    uint8_t padding3[4];                                                                    \
    uint64_t pcie_bandwidth_acc, pcie_bandwidth_inst, pcie_l0_to_recov_count_acc;           \
    uint64_t pcie_replay_count_acc, pcie_replay_rover_count_acc;                            \
    uint64_t xgmi_read_data_acc[8], xgmi_write_data_acc[8]; /* KB */                        \
    uint16_t current_gfxclks[8], current_socclks[4], current_vclk0s[4], current_dclk0s[4];  \
    uint16_t jpeg_activity[32];                                                             \
    uint32_t pcie_nak_sent_count_acc, pcie_nak_rcvd_count_acc;                              \
    uint64_t accumulation_counter;                                                          \
    uint64_t prochot_residency_acc, ppt_residency_acc, socket_thm_residency_acc;            \
    uint64_t vr_thm_residency_acc, hbm_thm_residency_acc;                                   \
    uint16_t num_partition;                                                                 \
    uint8_t padding4[6];                                                                    \
    XCP_T xcp_stats[MAX_NUM_XCP];                                                           \
    uint32_t pcie_lc_perf_other_end_recovery;                                               \
    uint8_t padding5[4];                                                                    \
    uint64_t vram_max_bandwidth;                                                            \
    uint16_t xgmi_link_status[8];
typedef struct {
    GPU_METRICS_BODY(amdsmi_gpu_xcp_metrics_t)
} __attribute__((packed)) amdsmi_gpu_metrics_t;

typedef struct {
    struct {
        uint16_t max_pcie_width;
        uint8_t padding0[2];
        uint32_t max_pcie_speed, pcie_interface_version, slot_type, max_pcie_interface_version;
        uint8_t padding1[4];
        uint64_t reserved[9];
    } __attribute__((packed)) pcie_static;
    struct {
        uint16_t pcie_width;
        uint8_t padding0[2];
        uint32_t pcie_speed, pcie_bandwidth;
        uint8_t padding1[4];
        uint64_t pcie_replay_count, pcie_l0_to_recovery_count, pcie_replay_roll_over_count;
        uint64_t pcie_nak_sent_count, pcie_nak_received_count;
        uint32_t pcie_lc_perf_other_end_recovery_count;
        uint8_t padding2[4];
        uint64_t reserved[12];
    } __attribute__((packed)) pcie_metric;
    uint64_t reserved[32];
} __attribute__((packed)) amdsmi_pcie_info_t;

#define AMDSMI_MAX_NUM_XGMI_LINKS 8
typedef struct {
    uint32_t total_links;
    uint32_t status[AMDSMI_MAX_NUM_XGMI_LINKS]; /* DOWN 0, UP 1, DISABLE 2 */
    uint8_t padding0[4];
    uint64_t reserved[7];
} __attribute__((packed)) amdsmi_xgmi_link_status_t;

#define AMDSMI_MAX_NUM_XGMI_PHYSICAL_LINK 64
typedef struct {
    uint32_t num_links;
    uint8_t padding0[4];
    struct {
        amdsmi_bdf_t bdf;
        uint32_t bit_rate, max_bandwidth, link_type;
        uint8_t padding0[4];
        uint64_t read, write; /* KB */
        uint64_t reserved[2];
    } __attribute__((packed)) links[AMDSMI_MAX_NUM_XGMI_PHYSICAL_LINK];
    uint64_t reserved[7];
} __attribute__((packed)) amdsmi_link_metrics_t;

typedef struct {
    uint64_t correctable_count, uncorrectable_count, deferred_count;
    uint64_t reserved[5];
} __attribute__((packed)) amdsmi_error_count_t;

typedef struct {
    uint64_t page_address, page_size;
    uint32_t status; /* RESERVED 0, PENDING 1, UNRESERVABLE 2 */
    uint8_t padding0[4];
} __attribute__((packed)) amdsmi_retired_page_record_t;

typedef struct {
    char name[STRLEN];
    uint32_t pid;
    uint8_t padding0[4];
    uint64_t mem;
    struct {
        uint64_t gfx, enc; /* ns, cumulative */
        uint32_t reserved[12];
    } __attribute__((packed)) engine_usage;
    struct {
        uint64_t gtt_mem, cpu_mem, vram_mem;
        uint32_t reserved[10];
    } __attribute__((packed)) memory_usage;
    char container_name[STRLEN];
    uint32_t cu_occupancy;
    uint32_t reserved[11];
} __attribute__((packed)) amdsmi_proc_info_t;

typedef struct {
    char driver_version[STRLEN], driver_date[STRLEN], driver_name[STRLEN];
} __attribute__((packed)) amdsmi_driver_info_t;

typedef struct {
    uint32_t major, minor, release;
    uint8_t padding0[4];
    const char *build;
} __attribute__((packed)) amdsmi_version_t;

typedef struct {
    uint64_t kfd_id;
    uint32_t node_id, current_partition_id;
    uint32_t reserved[12];
} __attribute__((packed)) amdsmi_kfd_info_t;

typedef struct {
    uint64_t power_cap, default_power_cap, dpm_cap, min_power_cap, max_power_cap;
    uint64_t reserved[3];
} __attribute__((packed)) amdsmi_power_cap_info_t;

typedef struct {
    uint32_t vram_type; /* HBM3 4 */
    char vram_vendor[STRLEN];
    uint8_t padding0[4];
    uint64_t vram_size; /* MB */
    uint32_t vram_bit_width;
    uint8_t padding1[4];
    uint64_t vram_max_bandwidth; /* GB/s */
    uint64_t reserved[37];
} __attribute__((packed)) amdsmi_vram_info_t;

typedef struct {
    amdsmi_processor_handle processor_handle;
    uint32_t event;
    char message[256];
    uint8_t padding0[4];
} __attribute__((packed)) amdsmi_evt_notification_data_t;

_Static_assert(sizeof(amdsmi_asic_info_t) == 896, "asic_info is 896 bytes in amdsmi_wrapper.py");
_Static_assert(offsetof(amdsmi_asic_info_t, device_id) == 520, "asic_info.device_id at 520");
_Static_assert(offsetof(amdsmi_asic_info_t, target_graphics_version) == 800,
               "asic_info.target_graphics_version at 800");
_Static_assert(sizeof(amdsmi_power_info_t) == 192, "power_info is 192 bytes");
_Static_assert(offsetof(amdsmi_power_info_t, power_limit) == 40, "power_info.power_limit at 40");
_Static_assert(sizeof(amdsmi_vram_usage_t) == 16, "vram_usage is 16 bytes");
_Static_assert(sizeof(amdsmi_engine_usage_t) == 64, "engine_usage is 64 bytes");
_Static_assert(sizeof(amdsmi_clk_info_t) == 32, "clk_info is 32 bytes");
_Static_assert(sizeof(amdsmi_enumeration_info_t) == 272, "enumeration_info is 272 bytes");
_Static_assert(sizeof(amdsmi_bdf_t) == 8, "amdsmi_bdf_t is one uint64");
_Static_assert(sizeof(float) == 4, "counter_resolution is a C float");
_Static_assert(sizeof(amdsmi_gpu_xcp_metrics_t) == 504, "xcp_metrics is 504 bytes");
_Static_assert(offsetof(amdsmi_gpu_xcp_metrics_t, gfx_low_utilization_acc) == 376,
               "xcp_metrics.gfx_low_utilization_acc at 376");
_Static_assert(sizeof(amdsmi_gpu_metrics_t) == 4544, "gpu_metrics is 4544 bytes");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, gfx_activity_acc) == 80, "gfx_activity_acc at 80");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, firmware_timestamp) == 96, "firmware_timestamp at 96");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, pcie_bandwidth_acc) == 144, "pcie_bandwidth_acc at 144");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, xgmi_read_data_acc) == 184, "xgmi_read_data_acc at 184");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, accumulation_counter) == 424,
               "accumulation_counter at 424");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, xcp_stats) == 480, "xcp_stats at 480");
_Static_assert(offsetof(amdsmi_gpu_metrics_t, xgmi_link_status) == 4528, "xgmi_link_status at 4528");
_Static_assert(sizeof(amdsmi_pcie_info_t) == 512, "pcie_info is 512 bytes");
_Static_assert(offsetof(amdsmi_pcie_info_t, pcie_metric) == 96, "pcie_info.pcie_metric at 96");
_Static_assert(sizeof(amdsmi_xgmi_link_status_t) == 96, "xgmi_link_status is 96 bytes");
_Static_assert(sizeof(amdsmi_link_metrics_t) == 3648, "link_metrics is 3648 bytes");
_Static_assert(offsetof(amdsmi_link_metrics_t, reserved) == 3592, "link_metrics.reserved at 3592");
_Static_assert(sizeof(amdsmi_error_count_t) == 64, "error_count is 64 bytes");
_Static_assert(sizeof(amdsmi_retired_page_record_t) == 24, "retired_page_record is 24 bytes");
_Static_assert(sizeof(amdsmi_proc_info_t) == 704, "proc_info is 704 bytes");
_Static_assert(offsetof(amdsmi_proc_info_t, container_name) == 400, "proc_info.container_name at 400");
_Static_assert(offsetof(amdsmi_proc_info_t, cu_occupancy) == 656, "proc_info.cu_occupancy at 656");
_Static_assert(sizeof(amdsmi_driver_info_t) == 768, "driver_info is 768 bytes");
_Static_assert(sizeof(amdsmi_version_t) == 24, "version is 24 bytes");
_Static_assert(sizeof(amdsmi_kfd_info_t) == 64, "kfd_info is 64 bytes");
_Static_assert(sizeof(amdsmi_power_cap_info_t) == 64, "power_cap_info is 64 bytes");
_Static_assert(sizeof(amdsmi_vram_info_t) == 584, "vram_info is 584 bytes");
_Static_assert(offsetof(amdsmi_vram_info_t, vram_size) == 264, "vram_info.vram_size at 264");
_Static_assert(sizeof(amdsmi_evt_notification_data_t) == 272, "evt_notification_data is 272 bytes");

/* ---------------------------------------------------------------- 1b. The 6.4 ABI */
/* What lib 25.x (ROCm 6.4) lays out differently, from the amdsmi 6.4.0 wheel's
 * amdsmi_wrapper.py. Every other struct the fake writes is laid out alike in 6.4.0 and 7.0.2
 * (asic_info and proc_info too, but 6.4 has `reserved` where 7.0 has subsystem_id and
 * cu_occupancy: their field tables, section 2b, leave those out). */

typedef struct {
    uint32_t gfx_busy_inst[MAX_NUM_XCC];
    uint16_t jpeg_busy[32]; /* 7.0: 40 */
    uint16_t vcn_busy[4];
    uint64_t gfx_busy_acc[MAX_NUM_XCC];
    uint64_t gfx_below_host_limit_acc[MAX_NUM_XCC];
    /* 7.0 (gpu_metrics v1.8) adds the ppt/thm/total host-limit and low-utilisation arrays */
} __attribute__((packed)) amdsmi_gpu_xcp_metrics_v64_t;

typedef struct {
    GPU_METRICS_BODY(amdsmi_gpu_xcp_metrics_v64_t)
} __attribute__((packed)) amdsmi_gpu_metrics_v64_t;

typedef struct {
    uint64_t socket_power;
    uint32_t current_socket_power;
    uint32_t average_socket_power;
    uint32_t gfx_voltage, soc_voltage, mem_voltage; /* 7.0: uint64 */
    uint32_t power_limit;
    uint32_t reserved[2];
} __attribute__((packed)) amdsmi_power_info_v64_t;

typedef struct {
    uint32_t vram_type;
    uint32_t vram_vendor; /* amdsmi_vram_vendor_type_t (SAMSUNG 0 ...); 7.0: a string */
    uint64_t vram_size;   /* MB */
    uint32_t vram_bit_width;
    uint8_t padding0[4];
    uint64_t vram_max_bandwidth;
    uint64_t reserved[4];
} __attribute__((packed)) amdsmi_vram_info_v64_t;

typedef struct {
    uint32_t year; /* kept, deprecated (6.4.0 CHANGELOG); 7.0 drops it */
    uint32_t major, minor, release;
    const char *build;
} __attribute__((packed)) amdsmi_version_v64_t;

typedef struct {
    amdsmi_processor_handle processor_handle;
    uint32_t event;
    char message[96]; /* 7.0: 256 */
    uint8_t padding0[4];
} __attribute__((packed)) amdsmi_evt_notification_data_v64_t;

_Static_assert(sizeof(amdsmi_gpu_xcp_metrics_v64_t) == 232, "6.4: xcp_metrics is 232 bytes");
_Static_assert(offsetof(amdsmi_gpu_xcp_metrics_v64_t, gfx_below_host_limit_acc) == 168,
               "6.4: xcp_metrics.gfx_below_host_limit_acc at 168");
_Static_assert(sizeof(amdsmi_gpu_metrics_v64_t) == 2368, "6.4: gpu_metrics is 2368 bytes");
_Static_assert(offsetof(amdsmi_gpu_metrics_v64_t, xcp_stats) == 480, "6.4: xcp_stats at 480");
_Static_assert(offsetof(amdsmi_gpu_metrics_v64_t, pcie_lc_perf_other_end_recovery) == 2336,
               "6.4: pcie_lc_perf_other_end_recovery at 2336");
_Static_assert(offsetof(amdsmi_gpu_metrics_v64_t, xgmi_link_status) == 2352,
               "6.4: xgmi_link_status at 2352");
_Static_assert(sizeof(amdsmi_power_info_v64_t) == 40, "6.4: power_info is 40 bytes");
_Static_assert(offsetof(amdsmi_power_info_v64_t, power_limit) == 28, "6.4: power_limit at 28");
_Static_assert(sizeof(amdsmi_vram_info_v64_t) == 64, "6.4: vram_info is 64 bytes");
_Static_assert(offsetof(amdsmi_vram_info_v64_t, vram_max_bandwidth) == 24,
               "6.4: vram_info.vram_max_bandwidth at 24");
_Static_assert(sizeof(amdsmi_version_v64_t) == 24, "6.4: version is 24 bytes");
_Static_assert(offsetof(amdsmi_version_v64_t, build) == 16, "6.4: version.build at 16");
_Static_assert(sizeof(amdsmi_evt_notification_data_v64_t) == 112,
               "6.4: evt_notification_data is 112 bytes");
/* A 6.4 image is kept in the 7.0-sized buffer of its kind (proc_state). */
_Static_assert(sizeof(amdsmi_gpu_metrics_v64_t) <= sizeof(amdsmi_gpu_metrics_t), "fits");
_Static_assert(sizeof(amdsmi_vram_info_v64_t) <= sizeof(amdsmi_vram_info_t), "fits");

/* ---------------------------------------------------------------- 2. A small JSON reader */
/* Enough for the state file control.py writes: objects, arrays, strings (escapes, \uXXXX in
 * the BMP), numbers, true/false/null. Strings are unescaped in place in the file's buffer. */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct {
    jtype type;
    const char *key; /* member name inside an object, else NULL */
    const char *str; /* J_STR */
    double num;      /* J_NUM, J_BOOL */
    uint64_t u64;    /* J_NUM: exact for non-negative integers */
    int64_t i64;     /* J_NUM: exact for integers */
    int child;       /* first element / member, -1 if none */
    int next;        /* next sibling, -1 if none */
} jnode;

typedef struct {
    char *p;
    jnode *nodes;
    int n, cap;
    int failed;
} jparser;

static int jnew(jparser *jp, jtype type) {
    if (jp->n == jp->cap) {
        int cap = jp->cap ? jp->cap * 2 : 256;
        jnode *grown = realloc(jp->nodes, (size_t)cap * sizeof(jnode));
        if (!grown) {
            jp->failed = 1;
            return -1;
        }
        jp->nodes = grown;
        jp->cap = cap;
    }
    jnode *node = &jp->nodes[jp->n];
    memset(node, 0, sizeof *node);
    node->type = type;
    node->child = -1;
    node->next = -1;
    return jp->n++;
}

static void jskip(jparser *jp) {
    while (*jp->p == ' ' || *jp->p == '\n' || *jp->p == '\t' || *jp->p == '\r') jp->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* jp->p is at the opening quote; returns the unescaped string (in place) or NULL. */
static const char *jstring(jparser *jp) {
    char *r = jp->p + 1, *w = r, *start = r;
    for (;;) {
        char c = *r++;
        if (c == '\0') return NULL;
        if (c == '"') break;
        if (c != '\\') {
            *w++ = c;
            continue;
        }
        c = *r++;
        switch (c) {
        case '"': case '\\': case '/': *w++ = c; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned cp = 0;
            for (int i = 0; i < 4; i++) {
                int h = hexval(r[i]);
                if (h < 0) return NULL;
                cp = cp * 16u + (unsigned)h;
            }
            r += 4;
            if (cp < 0x80) {
                *w++ = (char)cp;
            } else if (cp < 0x800) {
                *w++ = (char)(0xC0u | (cp >> 6));
                *w++ = (char)(0x80u | (cp & 0x3Fu));
            } else {
                *w++ = (char)(0xE0u | (cp >> 12));
                *w++ = (char)(0x80u | ((cp >> 6) & 0x3Fu));
                *w++ = (char)(0x80u | (cp & 0x3Fu));
            }
            break;
        }
        default: return NULL;
        }
    }
    *w = '\0';
    jp->p = r;
    return start;
}

static int jvalue(jparser *jp, int depth);

static int jcontainer(jparser *jp, int depth, jtype type) {
    int self = jnew(jp, type), last = -1;
    char close = type == J_OBJ ? '}' : ']';
    if (self < 0) return -1;
    jp->p++;
    jskip(jp);
    if (*jp->p == close) {
        jp->p++;
        return self;
    }
    for (;;) {
        const char *key = NULL;
        jskip(jp);
        if (type == J_OBJ) {
            if (*jp->p != '"' || !(key = jstring(jp))) return -1;
            jskip(jp);
            if (*jp->p++ != ':') return -1;
        }
        int item = jvalue(jp, depth + 1);
        if (item < 0) return -1;
        jp->nodes[item].key = key;
        if (last < 0) jp->nodes[self].child = item;
        else jp->nodes[last].next = item;
        last = item;
        jskip(jp);
        if (*jp->p == ',') {
            jp->p++;
            continue;
        }
        if (*jp->p++ != close) return -1;
        return self;
    }
}

static int jvalue(jparser *jp, int depth) {
    if (depth > 32) return -1;
    jskip(jp);
    char c = *jp->p;
    if (c == '{') return jcontainer(jp, depth, J_OBJ);
    if (c == '[') return jcontainer(jp, depth, J_ARR);
    if (c == '"') {
        const char *s = jstring(jp);
        int self = s ? jnew(jp, J_STR) : -1;
        if (self >= 0) jp->nodes[self].str = s;
        return self;
    }
    if (strncmp(jp->p, "null", 4) == 0) {
        jp->p += 4;
        return jnew(jp, J_NULL);
    }
    if (strncmp(jp->p, "true", 4) == 0 || strncmp(jp->p, "false", 5) == 0) {
        int truth = c == 't';
        jp->p += truth ? 4 : 5;
        int self = jnew(jp, J_BOOL);
        if (self >= 0) {
            jp->nodes[self].num = truth ? 1.0 : 0.0;
            jp->nodes[self].u64 = (uint64_t)truth;
        }
        return self;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char *end = NULL;
        const char *start = jp->p;
        double num = strtod(start, &end);
        if (end == start) return -1;
        int self = jnew(jp, J_NUM);
        if (self < 0) return -1;
        jp->nodes[self].num = num;
        if (strcspn(start, ".eE") >= (size_t)(end - start)) {
            errno = 0;
            jp->nodes[self].i64 = strtoll(start, NULL, 10);
            if (c != '-') jp->nodes[self].u64 = strtoull(start, NULL, 10);
        } else {
            jp->nodes[self].i64 = (int64_t)num;
            jp->nodes[self].u64 = num > 0 ? (uint64_t)num : 0;
        }
        jp->p = end;
        return self;
    }
    return -1;
}

static const jnode *jget(const jparser *jp, const jnode *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = obj->child; i >= 0; i = jp->nodes[i].next)
        if (jp->nodes[i].key && strcmp(jp->nodes[i].key, key) == 0) return &jp->nodes[i];
    return NULL;
}

static const jnode *jat(const jparser *jp, const jnode *arr, int index) {
    if (!arr || arr->type != J_ARR) return NULL;
    int i = arr->child;
    for (; i >= 0 && index > 0; index--) i = jp->nodes[i].next;
    return i >= 0 ? &jp->nodes[i] : NULL;
}

/* ---------------------------------------------------------------- 2b. Structs from JSON */
/* A modelled struct is filled from a JSON object by a table of its fields: one line per field
 * (name, offset, element size, element count), so a state-file key is the wrapper's field
 * name. A key the object lacks leaves the field's all-ones, the library's "not supported";
 * strings stay empty; padding and `reserved` stay zero. */

typedef enum { F_UINT, F_STR, F_SUB } fkind;

typedef struct field {
    const char *name;
    size_t offset, size; /* element size (a string's buffer size; a sub-struct's stride) */
    size_t count;        /* 1 for a scalar, else the array length */
    fkind kind;
    const struct field *sub; /* F_SUB: the element's fields */
} field;

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define MEMBER(T, f) (((T *)0)->f)
#define FU(T, f) {#f, offsetof(T, f), sizeof(MEMBER(T, f)), 1, F_UINT, NULL}
#define FA(T, f) {#f, offsetof(T, f), sizeof(MEMBER(T, f)[0]), COUNT(MEMBER(T, f)), F_UINT, NULL}
#define FS(T, f) {#f, offsetof(T, f), sizeof(MEMBER(T, f)), 1, F_STR, NULL}
#define FSUB(T, f, t) {#f, offsetof(T, f), sizeof(MEMBER(T, f)[0]), COUNT(MEMBER(T, f)), F_SUB, t}
#define FEND {NULL, 0, 0, 0, F_UINT, NULL}

static const field xcp_fields[] = {
#define X(f) FA(amdsmi_gpu_xcp_metrics_t, f)
    X(gfx_busy_inst), X(jpeg_busy), X(vcn_busy), X(gfx_busy_acc), X(gfx_below_host_limit_acc),
    X(gfx_below_host_limit_ppt_acc), X(gfx_below_host_limit_thm_acc), X(gfx_low_utilization_acc),
    X(gfx_below_host_limit_total_acc), FEND,
#undef X
};

/* The same wrapper field names in both releases; only xcp_stats' element differs. */
static const field xcp_fields_v64[] = {
#define X(f) FA(amdsmi_gpu_xcp_metrics_v64_t, f)
    X(gfx_busy_inst), X(jpeg_busy), X(vcn_busy), X(gfx_busy_acc), X(gfx_below_host_limit_acc), FEND,
#undef X
};

#define METRICS_FIELD_LIST(xcp)                                                                    \
    U(structure_size), U(format_revision), U(content_revision), U(temperature_edge),               \
    U(temperature_hotspot), U(temperature_mem), U(temperature_vrgfx), U(temperature_vrsoc),        \
    U(temperature_vrmem), U(average_gfx_activity), U(average_umc_activity),                        \
    U(average_mm_activity), U(average_socket_power), U(energy_accumulator),                        \
    U(system_clock_counter), U(average_gfxclk_frequency), U(average_socclk_frequency),             \
    U(average_uclk_frequency), U(average_vclk0_frequency), U(average_dclk0_frequency),             \
    U(average_vclk1_frequency), U(average_dclk1_frequency), U(current_gfxclk), U(current_socclk),  \
    U(current_uclk), U(current_vclk0), U(current_dclk0), U(current_vclk1), U(current_dclk1),       \
    U(throttle_status), U(current_fan_speed), U(pcie_link_width), U(pcie_link_speed),              \
    U(gfx_activity_acc), U(mem_activity_acc), A(temperature_hbm), U(firmware_timestamp),           \
    U(voltage_soc), U(voltage_gfx), U(voltage_mem), U(indep_throttle_status),                      \
    U(current_socket_power), A(vcn_activity), U(gfxclk_lock_status), U(xgmi_link_width),           \
    U(xgmi_link_speed), U(pcie_bandwidth_acc), U(pcie_bandwidth_inst),                             \
    U(pcie_l0_to_recov_count_acc), U(pcie_replay_count_acc), U(pcie_replay_rover_count_acc),       \
    A(xgmi_read_data_acc), A(xgmi_write_data_acc), A(current_gfxclks), A(current_socclks),         \
    A(current_vclk0s), A(current_dclk0s), A(jpeg_activity), U(pcie_nak_sent_count_acc),            \
    U(pcie_nak_rcvd_count_acc), U(accumulation_counter), U(prochot_residency_acc),                 \
    U(ppt_residency_acc), U(socket_thm_residency_acc), U(vr_thm_residency_acc),                    \
    U(hbm_thm_residency_acc), U(num_partition),                                                    \
    FSUB(METRICS_T, xcp_stats, xcp), U(pcie_lc_perf_other_end_recovery),                           \
    U(vram_max_bandwidth), A(xgmi_link_status)
#define U(f) FU(METRICS_T, f)
#define A(f) FA(METRICS_T, f)
#define METRICS_T amdsmi_gpu_metrics_t
static const field metrics_fields[] = {METRICS_FIELD_LIST(xcp_fields), FEND};
#undef METRICS_T
#define METRICS_T amdsmi_gpu_metrics_v64_t
static const field metrics_fields_v64[] = {METRICS_FIELD_LIST(xcp_fields_v64), FEND};
#undef METRICS_T
#undef U
#undef A

/* pcie_info's two halves are flattened: the state file names their fields directly. */
static const field pcie_fields[] = {
    FU(amdsmi_pcie_info_t, pcie_static.max_pcie_width),
    FU(amdsmi_pcie_info_t, pcie_static.max_pcie_speed),
    FU(amdsmi_pcie_info_t, pcie_static.pcie_interface_version),
    FU(amdsmi_pcie_info_t, pcie_static.slot_type),
    FU(amdsmi_pcie_info_t, pcie_static.max_pcie_interface_version),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_width),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_speed),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_bandwidth),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_replay_count),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_l0_to_recovery_count),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_replay_roll_over_count),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_nak_sent_count),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_nak_received_count),
    FU(amdsmi_pcie_info_t, pcie_metric.pcie_lc_perf_other_end_recovery_count),
    FEND,
};

typedef __typeof__(MEMBER(amdsmi_link_metrics_t, links)[0]) link_t;
static const field link_fields[] = {
    FU(link_t, bdf), FU(link_t, bit_rate), FU(link_t, max_bandwidth), FU(link_t, link_type),
    FU(link_t, read), FU(link_t, write), FEND,
};
static const field link_metrics_fields[] = {
    FU(amdsmi_link_metrics_t, num_links), FSUB(amdsmi_link_metrics_t, links, link_fields), FEND,
};
static const field xgmi_status_fields[] = {
    FU(amdsmi_xgmi_link_status_t, total_links), FA(amdsmi_xgmi_link_status_t, status), FEND,
};
static const field error_count_fields[] = {
    FU(amdsmi_error_count_t, correctable_count), FU(amdsmi_error_count_t, uncorrectable_count),
    FU(amdsmi_error_count_t, deferred_count), FEND,
};
static const field page_fields[] = {
    FU(amdsmi_retired_page_record_t, page_address), FU(amdsmi_retired_page_record_t, page_size),
    FU(amdsmi_retired_page_record_t, status), FEND,
};
#define PROC_INFO_FIELD_LIST                                                                       \
    FS(amdsmi_proc_info_t, name), FU(amdsmi_proc_info_t, pid), FU(amdsmi_proc_info_t, mem),        \
    FU(amdsmi_proc_info_t, engine_usage.gfx), FU(amdsmi_proc_info_t, engine_usage.enc),            \
    FU(amdsmi_proc_info_t, memory_usage.gtt_mem), FU(amdsmi_proc_info_t, memory_usage.cpu_mem),    \
    FU(amdsmi_proc_info_t, memory_usage.vram_mem), FS(amdsmi_proc_info_t, container_name)
static const field proc_info_fields[] = {
    PROC_INFO_FIELD_LIST, FU(amdsmi_proc_info_t, cu_occupancy), FEND,
};
static const field proc_info_fields_v64[] = {PROC_INFO_FIELD_LIST, FEND}; /* no cu_occupancy */
static const field driver_fields[] = {
    FS(amdsmi_driver_info_t, driver_version), FS(amdsmi_driver_info_t, driver_date),
    FS(amdsmi_driver_info_t, driver_name), FEND,
};
static const field kfd_fields[] = {
    FU(amdsmi_kfd_info_t, kfd_id), FU(amdsmi_kfd_info_t, node_id),
    FU(amdsmi_kfd_info_t, current_partition_id), FEND,
};
static const field enumeration_fields[] = {
    FU(amdsmi_enumeration_info_t, drm_render), FU(amdsmi_enumeration_info_t, drm_card),
    FU(amdsmi_enumeration_info_t, hsa_id), FU(amdsmi_enumeration_info_t, hip_id),
    FS(amdsmi_enumeration_info_t, hip_uuid), FEND,
};
static const field power_cap_fields[] = {
    FU(amdsmi_power_cap_info_t, power_cap), FU(amdsmi_power_cap_info_t, default_power_cap),
    FU(amdsmi_power_cap_info_t, dpm_cap), FU(amdsmi_power_cap_info_t, min_power_cap),
    FU(amdsmi_power_cap_info_t, max_power_cap), FEND,
};
static const field vram_info_fields[] = {
    FU(amdsmi_vram_info_t, vram_type), FS(amdsmi_vram_info_t, vram_vendor),
    FU(amdsmi_vram_info_t, vram_size), FU(amdsmi_vram_info_t, vram_bit_width),
    FU(amdsmi_vram_info_t, vram_max_bandwidth), FEND,
};

static const field vram_info_fields_v64[] = {
    FU(amdsmi_vram_info_v64_t, vram_type), FU(amdsmi_vram_info_v64_t, vram_vendor),
    FU(amdsmi_vram_info_v64_t, vram_size), FU(amdsmi_vram_info_v64_t, vram_bit_width),
    FU(amdsmi_vram_info_v64_t, vram_max_bandwidth), FEND,
};

/* Structs the calls write field by field (put_uint/put_str below), per release. */
#define ASIC_FIELD_LIST                                                                            \
    FS(amdsmi_asic_info_t, market_name), FU(amdsmi_asic_info_t, vendor_id),                        \
    FS(amdsmi_asic_info_t, vendor_name), FU(amdsmi_asic_info_t, subvendor_id),                     \
    FU(amdsmi_asic_info_t, device_id), FU(amdsmi_asic_info_t, rev_id),                             \
    FS(amdsmi_asic_info_t, asic_serial), FU(amdsmi_asic_info_t, oam_id),                           \
    FU(amdsmi_asic_info_t, num_of_compute_units), FU(amdsmi_asic_info_t, target_graphics_version)
static const field asic_fields[] = {ASIC_FIELD_LIST, FU(amdsmi_asic_info_t, subsystem_id), FEND};
static const field asic_fields_v64[] = {ASIC_FIELD_LIST, FEND}; /* no subsystem_id */
#define POWER_FIELD_LIST(T)                                                                        \
    FU(T, socket_power), FU(T, current_socket_power), FU(T, average_socket_power),                 \
    FU(T, gfx_voltage), FU(T, soc_voltage), FU(T, mem_voltage), FU(T, power_limit), FEND
static const field power_fields[] = {POWER_FIELD_LIST(amdsmi_power_info_t)};
static const field power_fields_v64[] = {POWER_FIELD_LIST(amdsmi_power_info_v64_t)};
static const field version_fields[] = {
    FU(amdsmi_version_t, major), FU(amdsmi_version_t, minor), FU(amdsmi_version_t, release),
    FU(amdsmi_version_t, build), FEND,
};
static const field version_fields_v64[] = {
    FU(amdsmi_version_v64_t, year), FU(amdsmi_version_v64_t, major),
    FU(amdsmi_version_v64_t, minor), FU(amdsmi_version_v64_t, release),
    FU(amdsmi_version_v64_t, build), FEND,
};
#define EVENT_FIELD_LIST(T) FU(T, processor_handle), FU(T, event), FS(T, message), FEND
static const field event_fields[] = {EVENT_FIELD_LIST(amdsmi_evt_notification_data_t)};
static const field event_fields_v64[] = {EVENT_FIELD_LIST(amdsmi_evt_notification_data_v64_t)};

/* ---------------------------------------------------------------- 2c. Releases */
/* The library release a state file declares (its lib_version's major) picks the layout of
 * every struct that differs between releases; a struct not listed here is laid out alike in
 * all of them. 7.0 is the default: lib 26.x (ROCm 7.0; the 7.0.2 wheel). 6.4: lib 25.x
 * (ROCm 6.4.x: 25.3.0 in 6.4.0, per the ROCm 6.4.0 changelog; the 6.4.0 wheel). */

typedef struct {
    size_t size;
    const field *fields;
} layout;

enum { L_ASIC, L_POWER, L_VERSION, L_EVENT, L_PROC_INFO, L_METRICS, L_VRAM_INFO, N_LAYOUTS };

typedef struct {
    const char *name;
    uint32_t lib_major;         /* the lib_version major that selects it */
    int lib_version_needs_init; /* 6.4.0 CHANGELOG: "Removed initialization requirements for
                                   amdsmi_get_lib_version()" */
    layout of[N_LAYOUTS];
} release;

#define LAYOUT(T, fields) {sizeof(T), fields}
static const release releases[] = {
    {"7.0", 26, 1, {
        [L_ASIC] = LAYOUT(amdsmi_asic_info_t, asic_fields),
        [L_POWER] = LAYOUT(amdsmi_power_info_t, power_fields),
        [L_VERSION] = LAYOUT(amdsmi_version_t, version_fields),
        [L_EVENT] = LAYOUT(amdsmi_evt_notification_data_t, event_fields),
        [L_PROC_INFO] = LAYOUT(amdsmi_proc_info_t, proc_info_fields),
        [L_METRICS] = LAYOUT(amdsmi_gpu_metrics_t, metrics_fields),
        [L_VRAM_INFO] = LAYOUT(amdsmi_vram_info_t, vram_info_fields),
    }},
    {"6.4", 25, 0, {
        [L_ASIC] = LAYOUT(amdsmi_asic_info_t, asic_fields_v64),
        [L_POWER] = LAYOUT(amdsmi_power_info_v64_t, power_fields_v64),
        [L_VERSION] = LAYOUT(amdsmi_version_v64_t, version_fields_v64),
        [L_EVENT] = LAYOUT(amdsmi_evt_notification_data_v64_t, event_fields_v64),
        [L_PROC_INFO] = LAYOUT(amdsmi_proc_info_t, proc_info_fields_v64),
        [L_METRICS] = LAYOUT(amdsmi_gpu_metrics_v64_t, metrics_fields_v64),
        [L_VRAM_INFO] = LAYOUT(amdsmi_vram_info_v64_t, vram_info_fields_v64),
    }},
};
#undef LAYOUT

/* The release of a lib_version major: the one that lists it, else 7.0 (the releases
 * before 6.4, such as mi300x-rocm62's lib 24.x, are not modelled: they get 7.0's ABI). */
static const release *release_of(uint32_t lib_major) {
    for (size_t i = 0; i < COUNT(releases); i++)
        if (releases[i].lib_major == lib_major) return &releases[i];
    return &releases[0];
}

/* The JSON key of a field: its name after the last '.' (pcie_static.max_pcie_width is
 * "max_pcie_width"). */
static const char *field_key(const field *f) {
    const char *dot = strrchr(f->name, '.');
    return dot ? dot + 1 : f->name;
}

static void put_uint(char *dst, size_t size, const jnode *v) {
    uint64_t value = v->num < 0 ? (uint64_t)v->i64 : v->u64;
    memcpy(dst, &value, size); /* little-endian: the low `size` bytes */
}

/* Fill `base` (zeroed by the caller) from `obj`; -1 if a value has the wrong JSON type. */
static int fill(const jparser *jp, const jnode *obj, char *base, const field *fields) {
    for (const field *f = fields; f->name; f++) {
        char *dst = base + f->offset;
        const jnode *v = jget(jp, obj, field_key(f));
        if (f->kind == F_STR) {
            if (v && v->type == J_STR) strncpy(dst, v->str, f->size - 1);
            else if (v && v->type != J_NULL) return -1;
            continue;
        }
        for (size_t i = 0; i < f->count; i++) {
            const jnode *e = f->count == 1 && f->kind == F_UINT ? v : jat(jp, v, (int)i);
            char *at = dst + i * f->size;
            if (f->kind == F_SUB) {
                if (e && e->type == J_OBJ) {
                    if (fill(jp, e, at, f->sub) != 0) return -1;
                } else {
                    /* an absent element: its numbers all-ones, as the library presets them */
                    if (fill(jp, NULL, at, f->sub) != 0) return -1;
                }
            } else if (e && e->type == J_NUM) {
                put_uint(at, f->size, e);
            } else if (e && e->type != J_NULL) {
                return -1;
            } else {
                memset(at, 0xFF, f->size);
            }
        }
    }
    return 0;
}

/* Write one field of a struct laid out by `fields`, found by name; a field the release's
 * layout lacks is skipped (6.4's asic_info has no subsystem_id). */
static const field *field_named(const field *fields, const char *name) {
    for (const field *f = fields; f->name; f++)
        if (strcmp(field_key(f), name) == 0) return f;
    return NULL;
}

static void set_uint(const layout *l, void *out, const char *name, uint64_t value) {
    const field *f = field_named(l->fields, name);
    if (f) memcpy((char *)out + f->offset, &value, f->size); /* little-endian: low bytes */
}

static void set_str(const layout *l, void *out, const char *name, const char *value) {
    const field *f = field_named(l->fields, name);
    if (f) strncpy((char *)out + f->offset, value, f->size - 1);
}

/* ---------------------------------------------------------------- 3. The state */

typedef struct {
    int present;
    uint32_t clk, min_clk, max_clk;
    uint8_t locked, deep_sleep;
} clock_state;

typedef struct {
    uint32_t index; /* handles point here */
    uint32_t socket;
    char market_name[STRLEN], vendor_name[STRLEN], asic_serial[STRLEN];
    char uuid[AMDSMI_GPU_UUID_SIZE];
    uint32_t vendor_id, subvendor_id, rev_id, oam_id, num_compute_units, subsystem_id;
    uint64_t device_id, target_graphics_version, bdf;
    uint32_t vram_total_mb, vram_used_mb;
    uint32_t gfx_activity, umc_activity, mm_activity;
    uint64_t socket_power;
    uint32_t current_socket_power, average_socket_power, power_limit;
    uint64_t gfx_voltage, soc_voltage, mem_voltage;
    uint64_t energy_count, energy_timestamp_ns;
    float energy_resolution;
    int temp_present[N_TEMP_TYPES];
    int64_t temp[N_TEMP_TYPES];
    clock_state clocks[N_CLK_TYPES];
    /* Whole structs, built from the state file by their field tables (image_kinds[]). */
    int has_image[N_IMAGES];
    amdsmi_gpu_metrics_t metrics;
    amdsmi_pcie_info_t pcie;
    amdsmi_xgmi_link_status_t xgmi_status;
    amdsmi_link_metrics_t link_metrics;
    amdsmi_driver_info_t driver;
    amdsmi_kfd_info_t kfd;
    amdsmi_enumeration_info_t enumeration;
    amdsmi_power_cap_info_t power_cap;
    amdsmi_vram_info_t vram_info;
    /* Lists: count-then-fill calls. A negative count: the call is NOT_SUPPORTED. */
    int nprocesses, nbad_pages, nreserved_pages;
    amdsmi_proc_info_t processes[MAX_GPU_PROCESSES];
    amdsmi_retired_page_record_t bad_pages[MAX_PAGES], reserved_pages[MAX_PAGES];
    int ecc_present[N_ECC_BLOCKS]; /* by bit position: UMC (1<<0) .. MPIO (1<<18) */
    amdsmi_error_count_t ecc[N_ECC_BLOCKS];
    int has_numa;
    int32_t numa_node;
    char compute_partition[STRLEN], memory_partition[STRLEN];
    int link_present[MAX_PROCESSORS]; /* amdsmi_topo_get_link_type to processor i */
    uint64_t link_hops[MAX_PROCESSORS];
    uint32_t link_type[MAX_PROCESSORS];
    /* Faults and per-release support: a call's forced status, hung calls, a lost GPU. */
    int nforced, nhung;
    struct {
        char call[64];
        amdsmi_status_t status;
    } forced[MAX_FORCED];
    char hung[MAX_FORCED][64]; /* "*" hangs every call */
    int lost;
    amdsmi_status_t lost_status;
} proc_state;

enum {
    IMG_METRICS, IMG_PCIE, IMG_XGMI_STATUS, IMG_LINK_METRICS, IMG_DRIVER, IMG_KFD,
    IMG_ENUMERATION, IMG_POWER_CAP, IMG_VRAM_INFO,
};

/* Each whole struct: its state-file key (null or absent: the call is NOT_SUPPORTED). */
static const struct {
    const char *key;
    const field *fields; /* NULL: the release's layout `of` */
    int of;
    size_t offset, size;
} image_kinds[N_IMAGES] = {
#define IMG(key, fields, member) \
    {key, fields, -1, offsetof(proc_state, member), sizeof(((proc_state *)0)->member)}
#define IMG_OF(key, of, member) \
    {key, NULL, of, offsetof(proc_state, member), sizeof(((proc_state *)0)->member)}
    [IMG_METRICS] = IMG_OF("gpu_metrics", L_METRICS, metrics),
    [IMG_PCIE] = IMG("pcie_info", pcie_fields, pcie),
    [IMG_XGMI_STATUS] = IMG("xgmi_link_status", xgmi_status_fields, xgmi_status),
    [IMG_LINK_METRICS] = IMG("link_metrics", link_metrics_fields, link_metrics),
    [IMG_DRIVER] = IMG("driver_info", driver_fields, driver),
    [IMG_KFD] = IMG("kfd_info", kfd_fields, kfd),
    [IMG_ENUMERATION] = IMG("enumeration_info", enumeration_fields, enumeration),
    [IMG_POWER_CAP] = IMG("power_cap_info", power_cap_fields, power_cap),
    [IMG_VRAM_INFO] = IMG_OF("vram_info", L_VRAM_INFO, vram_info),
#undef IMG
#undef IMG_OF
};

/* Events queued by control.py's post_event(): each has a sequence number, so each is
 * delivered once however often the state file is re-read. */
typedef struct {
    uint64_t seq;
    uint32_t processor, event;
    char message[256];
} event_state;

typedef struct {
    uint32_t index; /* handles point here */
} socket_state;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int32_t g_refcount;
static proc_state g_procs[MAX_PROCESSORS];
static socket_state g_sockets[MAX_PROCESSORS];
static uint32_t g_nprocs, g_nsockets;
static struct stat g_loaded; /* the state file as last read */
static int g_hidden[MAX_PROCESSORS]; /* lost when the library was initialised: not enumerated */
static event_state g_events[MAX_EVENTS]; /* as the state file lists them */
static uint32_t g_nevents;
static uint64_t g_event_seen;                 /* highest sequence number taken from the file */
static event_state g_pending[MAX_EVENTS];     /* taken, not yet delivered */
static uint32_t g_npending;
static int g_evt_registered[MAX_PROCESSORS];  /* amdsmi_init_gpu_event_notification */
static uint64_t g_evt_mask[MAX_PROCESSORS];
static const release *g_rel = &releases[0]; /* of the state file as last read */
static uint32_t g_lib_version[4]; /* year (6.4 only), major, minor, release */
static char g_lib_build[STRLEN];

/* Numeric attributes of a processor: a missing key (or null) leaves the all-ones value of its
 * width, which the library itself uses for "not supported". */
static const struct {
    const char *key;
    size_t offset, width;
} num_keys[] = {
#define NUM(field) {#field, offsetof(proc_state, field), sizeof(((proc_state *)0)->field)}
    NUM(socket), NUM(vendor_id), NUM(subvendor_id), NUM(rev_id), NUM(oam_id),
    NUM(num_compute_units), NUM(subsystem_id), NUM(device_id), NUM(target_graphics_version),
    NUM(vram_total_mb), NUM(vram_used_mb), NUM(gfx_activity), NUM(umc_activity),
    NUM(mm_activity), NUM(socket_power), NUM(current_socket_power), NUM(average_socket_power),
    NUM(power_limit), NUM(gfx_voltage), NUM(soc_voltage), NUM(mem_voltage), NUM(energy_count),
    NUM(energy_timestamp_ns),
#undef NUM
};

static const struct {
    const char *key;
    size_t offset, size;
} str_keys[] = {
#define STR(field) {#field, offsetof(proc_state, field), sizeof(((proc_state *)0)->field)}
    STR(market_name), STR(vendor_name), STR(asic_serial), STR(uuid), STR(compute_partition),
    STR(memory_partition),
#undef STR
};

static void fail(const char *what, const char *path) {
    fprintf(stderr, "fakeamdsmi: %s: %s\n", path ? path : "$FAKEAMDSMI_STATE unset", what);
}

static uint32_t u32_or_ones(const jparser *jp, const jnode *obj, const char *key) {
    const jnode *v = jget(jp, obj, key);
    return v && v->type == J_NUM ? (uint32_t)v->u64 : UINT32_MAX;
}

static int parse_bdf(const char *text, uint64_t *bdf) {
    unsigned long domain, bus, device, function;
    char tail;
    if (sscanf(text, "%lx:%lx:%lx.%lx%c", &domain, &bus, &device, &function, &tail) != 4)
        return -1;
    if (bus > 0xFF || device > 0x1F || function > 7 || domain > 0xFFFFFFFFFFFFul) return -1;
    *bdf = ((uint64_t)domain << 16) | ((uint64_t)bus << 8) | ((uint64_t)device << 3) | function;
    return 0;
}

static int load_proc_extras(const jparser *jp, const jnode *obj, proc_state *p,
                            const release *rel);

static int load_proc(const jparser *jp, const jnode *obj, proc_state *p, uint32_t index,
                     const release *rel) {
    memset(p, 0xFF, sizeof *p);
    p->index = index;
    p->socket = index;
    for (size_t i = 0; i < sizeof str_keys / sizeof str_keys[0]; i++) {
        char *dst = (char *)p + str_keys[i].offset;
        const jnode *v = jget(jp, obj, str_keys[i].key);
        memset(dst, 0, str_keys[i].size);
        if (v && v->type == J_STR) strncpy(dst, v->str, str_keys[i].size - 1);
    }
    for (size_t i = 0; i < sizeof num_keys / sizeof num_keys[0]; i++) {
        const jnode *v = jget(jp, obj, num_keys[i].key);
        if (!v || v->type == J_NULL) continue;
        if (v->type != J_NUM) return -1;
        char *dst = (char *)p + num_keys[i].offset;
        if (num_keys[i].width == 8) {
            memcpy(dst, &v->u64, 8);
        } else {
            uint32_t narrow = (uint32_t)v->u64;
            memcpy(dst, &narrow, 4);
        }
    }
    const jnode *res = jget(jp, obj, "energy_resolution");
    p->energy_resolution = res && res->type == J_NUM ? (float)res->num : 0.0f;
    const jnode *bdf = jget(jp, obj, "bdf");
    if (bdf && (bdf->type != J_STR || parse_bdf(bdf->str, &p->bdf) != 0)) return -1;
    const jnode *temps = jget(jp, obj, "temperatures");
    for (int t = 0; t < N_TEMP_TYPES; t++) {
        const jnode *v = jat(jp, temps, t);
        p->temp_present[t] = v && v->type == J_NUM;
        p->temp[t] = p->temp_present[t] ? v->i64 : 0;
    }
    const jnode *clocks = jget(jp, obj, "clocks");
    for (int c = 0; c < N_CLK_TYPES; c++) {
        const jnode *v = jat(jp, clocks, c);
        clock_state *cs = &p->clocks[c];
        cs->present = v && v->type == J_OBJ;
        if (!cs->present) continue;
        cs->clk = u32_or_ones(jp, v, "clk");
        cs->min_clk = u32_or_ones(jp, v, "min_clk");
        cs->max_clk = u32_or_ones(jp, v, "max_clk");
        cs->locked = (uint8_t)u32_or_ones(jp, v, "clk_locked");
        cs->deep_sleep = (uint8_t)u32_or_ones(jp, v, "clk_deep_sleep");
    }
    return load_proc_extras(jp, obj, p, rel);
}

/* A list of structs: -1 (the call is NOT_SUPPORTED) for null or absent, else its length. */
static int load_list(const jparser *jp, const jnode *list, void *items, size_t size, int max,
                     const field *fields, int *count) {
    *count = -1;
    if (!list || list->type == J_NULL) return 0;
    if (list->type != J_ARR) return -1;
    int n = 0;
    for (const jnode *v = jat(jp, list, 0); v; v = v->next >= 0 ? &jp->nodes[v->next] : NULL) {
        if (n == max || v->type != J_OBJ) return -1;
        char *item = (char *)items + (size_t)n * size;
        memset(item, 0, size);
        if (fill(jp, v, item, fields) != 0) return -1;
        n++;
    }
    *count = n;
    return 0;
}

static int load_proc_extras(const jparser *jp, const jnode *obj, proc_state *p,
                            const release *rel) {
    for (int i = 0; i < N_IMAGES; i++) {
        char *image = (char *)p + image_kinds[i].offset;
        int of = image_kinds[i].of;
        const field *fields = of >= 0 ? rel->of[of].fields : image_kinds[i].fields;
        const jnode *v = jget(jp, obj, image_kinds[i].key);
        memset(image, 0, image_kinds[i].size);
        p->has_image[i] = v && v->type == J_OBJ;
        if (v && v->type != J_OBJ && v->type != J_NULL) return -1;
        if (p->has_image[i] && fill(jp, v, image, fields) != 0) return -1;
    }
    if (load_list(jp, jget(jp, obj, "processes"), p->processes, sizeof p->processes[0],
                  MAX_GPU_PROCESSES, rel->of[L_PROC_INFO].fields, &p->nprocesses) != 0 ||
        load_list(jp, jget(jp, obj, "bad_pages"), p->bad_pages, sizeof p->bad_pages[0],
                  MAX_PAGES, page_fields, &p->nbad_pages) != 0 ||
        load_list(jp, jget(jp, obj, "reserved_pages"), p->reserved_pages,
                  sizeof p->reserved_pages[0], MAX_PAGES, page_fields, &p->nreserved_pages) != 0)
        return -1;
    const jnode *ecc = jget(jp, obj, "ecc"); /* [19 × null | {correctable_count, ...}] */
    for (int b = 0; b < N_ECC_BLOCKS; b++) {
        const jnode *v = jat(jp, ecc, b);
        p->ecc_present[b] = v && v->type == J_OBJ;
        memset(&p->ecc[b], 0, sizeof p->ecc[b]);
        if (p->ecc_present[b] && fill(jp, v, (char *)&p->ecc[b], error_count_fields) != 0)
            return -1;
    }
    const jnode *numa = jget(jp, obj, "numa_node");
    p->has_numa = numa && numa->type == J_NUM;
    p->numa_node = p->has_numa ? (int32_t)numa->i64 : -1;
    const jnode *links = jget(jp, obj, "link_types"); /* [per processor: null | [hops, type]] */
    for (int i = 0; i < MAX_PROCESSORS; i++) {
        const jnode *v = jat(jp, links, i);
        const jnode *hops = jat(jp, v, 0), *type = jat(jp, v, 1);
        p->link_present[i] = hops && type && hops->type == J_NUM && type->type == J_NUM;
        p->link_hops[i] = p->link_present[i] ? hops->u64 : 0;
        p->link_type[i] = p->link_present[i] ? (uint32_t)type->u64 : 0;
    }
    const jnode *forced = jget(jp, obj, "status"); /* {"amdsmi_get_...": status} */
    p->nforced = 0;
    for (int i = forced && forced->type == J_OBJ ? forced->child : -1; i >= 0;
         i = jp->nodes[i].next) {
        const jnode *v = &jp->nodes[i];
        if (p->nforced == MAX_FORCED || v->type != J_NUM) return -1;
        snprintf(p->forced[p->nforced].call, sizeof p->forced[0].call, "%s", v->key);
        p->forced[p->nforced++].status = (amdsmi_status_t)v->u64;
    }
    const jnode *hung = jget(jp, obj, "hang"); /* ["amdsmi_get_...", ...] or ["*"] */
    p->nhung = 0;
    for (const jnode *v = jat(jp, hung, 0); v; v = v->next >= 0 ? &jp->nodes[v->next] : NULL) {
        if (p->nhung == MAX_FORCED || v->type != J_STR) return -1;
        snprintf(p->hung[p->nhung++], sizeof p->hung[0], "%s", v->str);
    }
    const jnode *lost = jget(jp, obj, "lost"); /* null, or the status every call returns */
    p->lost = lost && lost->type == J_NUM;
    p->lost_status = p->lost ? (amdsmi_status_t)lost->u64 : AMDSMI_STATUS_SUCCESS;
    return 0;
}

/* The top-level "events" list and "lib_version". */
static int load_globals(const jparser *jp, const jnode *top) {
    static event_state events[MAX_EVENTS];
    uint32_t n = 0;
    const jnode *list = jget(jp, top, "events");
    for (const jnode *v = jat(jp, list, 0); v; v = v->next >= 0 ? &jp->nodes[v->next] : NULL) {
        const jnode *seq = jget(jp, v, "seq"), *proc = jget(jp, v, "processor");
        const jnode *event = jget(jp, v, "event"), *message = jget(jp, v, "message");
        if (n == MAX_EVENTS || !seq || seq->type != J_NUM || !proc || proc->type != J_NUM ||
            !event || event->type != J_NUM)
            return -1;
        events[n].seq = seq->u64;
        events[n].processor = (uint32_t)proc->u64;
        events[n].event = (uint32_t)event->u64;
        memset(events[n].message, 0, sizeof events[n].message);
        if (message && message->type == J_STR)
            strncpy(events[n].message, message->str, sizeof events[n].message - 1);
        n++;
    }
    memcpy(g_events, events, sizeof events);
    g_nevents = n;
    const jnode *version = jget(jp, top, "lib_version");
    const jnode *build = jget(jp, version, "build");
    static const char *const keys[4] = {"year", "major", "minor", "release"};
    for (int i = 0; i < 4; i++) g_lib_version[i] = u32_or_ones(jp, version, keys[i]);
    snprintf(g_lib_build, sizeof g_lib_build, "%s", build && build->type == J_STR ? build->str : "");
    return 0;
}

/* Read the state file into the globals; on any error keep what was there and return -1. */
static int load_state(void) {
    const char *path = getenv("FAKEAMDSMI_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        fail("cannot stat the state file", path);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail("cannot open the state file", path);
        return -1;
    }
    char *text = malloc((size_t)st.st_size + 1);
    size_t got = text ? fread(text, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!text || got != (size_t)st.st_size) {
        free(text);
        fail("cannot read the state file", path);
        return -1;
    }
    text[got] = '\0';
    jparser jp = {.p = text};
    int root = jvalue(&jp, 0);
    int rc = -1;
    static proc_state procs[MAX_PROCESSORS];
    uint32_t n = 0, nsockets = 0;
    const release *rel = &releases[0];
    if (root >= 0 && !jp.failed) {
        jskip(&jp);
        const jnode *top = &jp.nodes[root];
        const jnode *version = jget(&jp, top, "version");
        const jnode *list = jget(&jp, top, "processors");
        rc = *jp.p == '\0' && version && version->type == J_NUM &&
                     version->u64 == STATE_VERSION && list && list->type == J_ARR &&
                     load_globals(&jp, top) == 0
                 ? 0
                 : -1;
        rel = release_of(g_lib_version[1]);
        for (const jnode *v = rc == 0 ? jat(&jp, list, 0) : NULL; v;
             v = v->next >= 0 ? &jp.nodes[v->next] : NULL) {
            if (n == MAX_PROCESSORS || v->type != J_OBJ || load_proc(&jp, v, &procs[n], n, rel) != 0 ||
                procs[n].socket >= MAX_PROCESSORS) {
                rc = -1;
                break;
            }
            if (procs[n].socket + 1 > nsockets) nsockets = procs[n].socket + 1;
            n++;
        }
    }
    free(jp.nodes);
    free(text);
    if (rc != 0) {
        fail("not a valid version 2 state file", path);
        return -1;
    }
    memcpy(g_procs, procs, sizeof procs);
    g_nprocs = n;
    g_nsockets = nsockets;
    g_rel = rel;
    for (uint32_t i = 0; i < nsockets; i++) g_sockets[i].index = i;
    g_loaded = st;
    return 0;
}

/* Re-read the state file if it was replaced (control.py renames a new file over it) or
 * changed in place. */
static void maybe_reload(void) {
    const char *path = getenv("FAKEAMDSMI_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_ino != g_loaded.st_ino || st.st_dev != g_loaded.st_dev ||
        st.st_size != g_loaded.st_size || st.st_mtim.tv_sec != g_loaded.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != g_loaded.st_mtim.tv_nsec)
        (void)load_state();
}

/* Take the lock for a call that needs an initialised library: NOT_INIT (lock released)
 * before amdsmi_init, else SUCCESS with the lock held and the state fresh. */
static amdsmi_status_t enter(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return AMDSMI_STATUS_NOT_INIT;
    }
    maybe_reload();
    return AMDSMI_STATUS_SUCCESS;
}

static amdsmi_status_t leave(amdsmi_status_t status) {
    pthread_mutex_unlock(&g_lock);
    return status;
}

/* A processor handle is the address of its g_procs entry; anything else is INVAL. */
static proc_state *proc_of(amdsmi_processor_handle handle) {
    uintptr_t addr = (uintptr_t)handle, base = (uintptr_t)g_procs;
    if (addr < base || (addr - base) % sizeof(proc_state) != 0) return NULL;
    uintptr_t index = (addr - base) / sizeof(proc_state);
    return index < g_nprocs ? &g_procs[index] : NULL;
}

static socket_state *socket_of(amdsmi_socket_handle handle) {
    uintptr_t addr = (uintptr_t)handle, base = (uintptr_t)g_sockets;
    if (addr < base || (addr - base) % sizeof(socket_state) != 0) return NULL;
    uintptr_t index = (addr - base) / sizeof(socket_state);
    return index < g_nsockets ? &g_sockets[index] : NULL;
}

/* ---------------------------------------------------------------- 4. Modelled entry points */

EXPORT amdsmi_status_t amdsmi_init(uint64_t flags) {
    /* amdsmi.h: "only AMDSMI_INIT_AMD_GPUS is supported"; a mask without it is refused. */
    if (!(flags & AMDSMI_INIT_AMD_GPUS)) return AMDSMI_STATUS_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == INT32_MAX) return leave(AMDSMI_STATUS_REFCOUNT_OVERFLOW);
    if (g_refcount == 0) {
        if (load_state() != 0) return leave(AMDSMI_STATUS_INIT_ERROR);
        /* The library enumerates at init: a GPU lost before it is not there at all. */
        for (uint32_t i = 0; i < MAX_PROCESSORS; i++) g_hidden[i] = i < g_nprocs && g_procs[i].lost;
        memset(g_evt_registered, 0, sizeof g_evt_registered);
        g_npending = 0;
        /* A new session (in one process, a test's next agent) starts from the file it reads:
         * events listed before it were raised before any GPU was registered, so the kernel
         * never queued them, whatever an earlier session took. */
        g_event_seen = 0;
        for (uint32_t i = 0; i < g_nevents; i++)
            if (g_events[i].seq > g_event_seen) g_event_seen = g_events[i].seq;
    }
    g_refcount++;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_shut_down(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount > 0 && --g_refcount == 0) {
        g_nprocs = 0; /* every handle is invalid from here on */
        g_nsockets = 0;
    }
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_socket_handles(uint32_t *count, amdsmi_socket_handle *handles) {
    amdsmi_status_t s = enter();
    if (s != AMDSMI_STATUS_SUCCESS) return s;
    if (!count) return leave(AMDSMI_STATUS_INVAL);
    if (!handles) {
        *count = g_nsockets;
        return leave(AMDSMI_STATUS_SUCCESS);
    }
    /* As amd_smi.cc: a short buffer gets the first *count handles, SUCCESS. */
    if (*count > g_nsockets) *count = g_nsockets;
    for (uint32_t i = 0; i < *count; i++) handles[i] = &g_sockets[i];
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket, uint32_t *count,
                                                    amdsmi_processor_handle *handles) {
    amdsmi_status_t s = enter();
    if (s != AMDSMI_STATUS_SUCCESS) return s;
    if (!count) return leave(AMDSMI_STATUS_INVAL);
    socket_state *sock = socket_of(socket);
    if (!sock) return leave(AMDSMI_STATUS_INVAL);
    uint32_t n = 0, limit = handles ? *count : UINT32_MAX;
    for (uint32_t i = 0; i < g_nprocs; i++) {
        if (g_procs[i].socket != sock->index || g_hidden[i]) continue;
        if (n == limit) break;
        if (handles) handles[n] = &g_procs[i];
        n++;
    }
    *count = n;
    return leave(AMDSMI_STATUS_SUCCESS);
}

static int is_hung(const proc_state *p, const char *call) {
    for (int i = 0; i < p->nhung; i++)
        if (strcmp(p->hung[i], "*") == 0 || strcmp(p->hung[i], call) == 0) return 1;
    return 0;
}

/* The faults and per-release support of a call on processor p (the lock held): a lost GPU's
 * status; a hung call waits, with the lock released so that other processors still answer,
 * until control.py releases it; a forced status (fail(), or a call the release lacks). */
static amdsmi_status_t gate(proc_state *p, const char *call) {
    while (!p->lost && is_hung(p, call)) {
        uint32_t index = p->index;
        pthread_mutex_unlock(&g_lock);
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        pthread_mutex_lock(&g_lock);
        maybe_reload();
        if (g_refcount == 0 || index >= g_nprocs) return AMDSMI_STATUS_NOT_INIT;
    }
    if (p->lost) return p->lost_status;
    for (int i = 0; i < p->nforced; i++)
        if (strcmp(p->forced[i].call, call) == 0) return p->forced[i].status;
    return AMDSMI_STATUS_SUCCESS;
}

/* The common start of a per-processor call: init, then the output pointer, then the handle,
 * then its faults. */
#define ENTER_PROC(handle, out)                                 \
    amdsmi_status_t s_ = enter();                               \
    if (s_ != AMDSMI_STATUS_SUCCESS) return s_;                 \
    if (!(out)) return leave(AMDSMI_STATUS_INVAL);              \
    proc_state *p = proc_of(handle);                            \
    if (!p) return leave(AMDSMI_STATUS_INVAL);                  \
    s_ = gate(p, __func__);                                     \
    if (s_ != AMDSMI_STATUS_SUCCESS) return leave(s_)

EXPORT amdsmi_status_t amdsmi_get_processor_type(amdsmi_processor_handle handle, uint32_t *type) {
    ENTER_PROC(handle, type);
    *type = AMDSMI_PROCESSOR_TYPE_AMD_GPU;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle handle,
                                                amdsmi_asic_info_t *info) {
    ENTER_PROC(handle, info);
    const layout *l = &g_rel->of[L_ASIC];
    memset(info, 0, l->size);
    set_str(l, info, "market_name", p->market_name);
    set_str(l, info, "vendor_name", p->vendor_name);
    set_str(l, info, "asic_serial", p->asic_serial);
    set_uint(l, info, "vendor_id", p->vendor_id);
    set_uint(l, info, "subvendor_id", p->subvendor_id);
    set_uint(l, info, "device_id", p->device_id);
    set_uint(l, info, "rev_id", p->rev_id);
    set_uint(l, info, "oam_id", p->oam_id);
    set_uint(l, info, "num_of_compute_units", p->num_compute_units);
    set_uint(l, info, "target_graphics_version", p->target_graphics_version);
    set_uint(l, info, "subsystem_id", p->subsystem_id); /* 7.0 only */
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle handle,
                                                  uint32_t *length, char *uuid) {
    amdsmi_status_t s = enter();
    if (s != AMDSMI_STATUS_SUCCESS) return s;
    /* amd_smi.cc: a NULL pointer or a buffer under AMDSMI_GPU_UUID_SIZE is INVAL. */
    if (!length || !uuid || *length < AMDSMI_GPU_UUID_SIZE) return leave(AMDSMI_STATUS_INVAL);
    proc_state *p = proc_of(handle);
    if (!p) return leave(AMDSMI_STATUS_INVAL);
    s = gate(p, __func__);
    if (s != AMDSMI_STATUS_SUCCESS) return leave(s);
    if (!p->uuid[0]) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    memcpy(uuid, p->uuid, AMDSMI_GPU_UUID_SIZE);
    *length = AMDSMI_GPU_UUID_SIZE;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_device_bdf(amdsmi_processor_handle handle,
                                                 amdsmi_bdf_t *bdf) {
    ENTER_PROC(handle, bdf);
    *bdf = p->bdf;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_vram_usage(amdsmi_processor_handle handle,
                                                 amdsmi_vram_usage_t *vram) {
    ENTER_PROC(handle, vram);
    /* amd_smi.cc writes only the two fields, leaving `reserved` as the caller had it. */
    vram->vram_total = p->vram_total_mb;
    vram->vram_used = p->vram_used_mb;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_activity(amdsmi_processor_handle handle,
                                               amdsmi_engine_usage_t *usage) {
    ENTER_PROC(handle, usage);
    memset(usage, 0, sizeof *usage);
    usage->gfx_activity = p->gfx_activity;
    usage->umc_activity = p->umc_activity;
    usage->mm_activity = p->mm_activity;
    return leave(AMDSMI_STATUS_SUCCESS);
}

static amdsmi_status_t fill_power_info(const proc_state *p, void *info) {
    const layout *l = &g_rel->of[L_POWER];
    memset(info, 0, l->size);
    set_uint(l, info, "socket_power", p->socket_power);
    set_uint(l, info, "current_socket_power", p->current_socket_power);
    set_uint(l, info, "average_socket_power", p->average_socket_power);
    /* uint64 in 7.0, uint32 in 6.4: the profile's 0xFFFF "N/A" fits either */
    set_uint(l, info, "gfx_voltage", p->gfx_voltage);
    set_uint(l, info, "soc_voltage", p->soc_voltage);
    set_uint(l, info, "mem_voltage", p->mem_voltage);
    set_uint(l, info, "power_limit", p->power_limit);
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_power_info(amdsmi_processor_handle handle, void *info) {
    ENTER_PROC(handle, info);
    return fill_power_info(p, info);
}

/* What the 6.4.0 bindings' amdsmi_get_power_info(handle, sensor_ind=0) calls (7.0 dropped
 * it). One power sensor per GPU, as for the power cap: another index is NOT_SUPPORTED (a
 * guess). Its faults are those of amdsmi_get_power_info: fail() and a secondary partition's
 * NOT_SUPPORTED apply to either entry point. */
EXPORT amdsmi_status_t amdsmi_get_power_info_v2(amdsmi_processor_handle handle,
                                                uint32_t sensor_ind, void *info) {
    amdsmi_status_t s = enter();
    if (s != AMDSMI_STATUS_SUCCESS) return s;
    if (!info) return leave(AMDSMI_STATUS_INVAL);
    proc_state *p = proc_of(handle);
    if (!p) return leave(AMDSMI_STATUS_INVAL);
    s = gate(p, "amdsmi_get_power_info");
    if (s != AMDSMI_STATUS_SUCCESS) return leave(s);
    if (sensor_ind != 0) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    return fill_power_info(p, info);
}

EXPORT amdsmi_status_t amdsmi_get_energy_count(amdsmi_processor_handle handle, uint64_t *energy,
                                               float *resolution, uint64_t *timestamp) {
    ENTER_PROC(handle, energy && resolution && timestamp);
    if (p->energy_count == UINT64_MAX) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *energy = p->energy_count;
    *resolution = p->energy_resolution;
    *timestamp = p->energy_timestamp_ns;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_temp_metric(amdsmi_processor_handle handle, uint32_t type,
                                              uint32_t metric, int64_t *temperature) {
    ENTER_PROC(handle, temperature);
    /* PLX (7) comes from gpu_metrics and the GPU board sensors (100-149, 150+) from
     * interfaces this fake does not model: NOT_SUPPORTED, as for an absent sensor. */
    if (type >= N_TEMP_TYPES && type != 7 && type < 100) return leave(AMDSMI_STATUS_INVAL);
    if (type >= N_TEMP_TYPES || !p->temp_present[type] || metric != AMDSMI_TEMP_CURRENT)
        return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *temperature = p->temp[type];
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_clock_info(amdsmi_processor_handle handle, uint32_t type,
                                             amdsmi_clk_info_t *info) {
    ENTER_PROC(handle, info);
    if (type >= N_CLK_TYPES) return leave(AMDSMI_STATUS_INVAL);
    const clock_state *c = &p->clocks[type];
    if (!c->present) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->clk = c->clk;
    info->min_clk = c->min_clk;
    info->max_clk = c->max_clk;
    info->clk_locked = c->locked;
    info->clk_deep_sleep = c->deep_sleep;
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* ---- Whole structs: a copy of the processor's image, NOT_SUPPORTED where it has none. */

static amdsmi_status_t copy_image(const proc_state *p, int kind, void *out) {
    if (!p->has_image[kind]) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    int of = image_kinds[kind].of;
    size_t size = of >= 0 ? g_rel->of[of].size : image_kinds[kind].size;
    memcpy(out, (const char *)p + image_kinds[kind].offset, size);
    return leave(AMDSMI_STATUS_SUCCESS);
}

#define IMAGE_CALL(name, type, kind)                                           \
    EXPORT amdsmi_status_t name(amdsmi_processor_handle handle, type *out) {   \
        ENTER_PROC(handle, out);                                               \
        return copy_image(p, kind, out);                                       \
    }
/* Only XCP 0 of a partitioned socket has gpu_metrics (AMD's partition docs): the profile
 * gives the others none. Fields an ASIC's table lacks are all-ones. */
IMAGE_CALL(amdsmi_get_gpu_metrics_info, amdsmi_gpu_metrics_t, IMG_METRICS)
IMAGE_CALL(amdsmi_get_pcie_info, amdsmi_pcie_info_t, IMG_PCIE)
IMAGE_CALL(amdsmi_get_gpu_xgmi_link_status, amdsmi_xgmi_link_status_t, IMG_XGMI_STATUS)
/* All 64 links are written; the 7.0.2 bindings read only the first 8. */
IMAGE_CALL(amdsmi_get_link_metrics, amdsmi_link_metrics_t, IMG_LINK_METRICS)
IMAGE_CALL(amdsmi_get_gpu_driver_info, amdsmi_driver_info_t, IMG_DRIVER)
IMAGE_CALL(amdsmi_get_gpu_kfd_info, amdsmi_kfd_info_t, IMG_KFD)
IMAGE_CALL(amdsmi_get_gpu_enumeration_info, amdsmi_enumeration_info_t, IMG_ENUMERATION)
IMAGE_CALL(amdsmi_get_gpu_vram_info, amdsmi_vram_info_t, IMG_VRAM_INFO)
#undef IMAGE_CALL

EXPORT amdsmi_status_t amdsmi_get_power_cap_info(amdsmi_processor_handle handle,
                                                 uint32_t sensor_ind,
                                                 amdsmi_power_cap_info_t *info) {
    ENTER_PROC(handle, info);
    /* One power sensor per GPU on the modelled ASICs (guess: the others NOT_SUPPORTED). */
    if (sensor_ind != 0) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    return copy_image(p, IMG_POWER_CAP, info);
}

/* ---- ECC: per RAS block (a single bit, UMC 1<<0 .. MPIO 1<<18), and their sum. */

EXPORT amdsmi_status_t amdsmi_get_gpu_ecc_count(amdsmi_processor_handle handle, uint64_t block,
                                                amdsmi_error_count_t *ec) {
    ENTER_PROC(handle, ec);
    if (block == 0 || (block & (block - 1)) != 0 || block > (1ull << (N_ECC_BLOCKS - 1)))
        return leave(AMDSMI_STATUS_INVAL);
    int bit = __builtin_ctzll(block);
    if (!p->ecc_present[bit]) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *ec = p->ecc[bit];
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_total_ecc_count(amdsmi_processor_handle handle,
                                                      amdsmi_error_count_t *ec) {
    ENTER_PROC(handle, ec);
    amdsmi_error_count_t sum = {0};
    int any = 0;
    for (int b = 0; b < N_ECC_BLOCKS; b++) {
        if (!p->ecc_present[b]) continue;
        any = 1;
        sum.correctable_count += p->ecc[b].correctable_count;
        sum.uncorrectable_count += p->ecc[b].uncorrectable_count;
        sum.deferred_count += p->ecc[b].deferred_count;
    }
    if (!any) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *ec = sum;
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* ---- Count-then-fill lists. */

/* Retired pages (rocm_smi's rsmi_dev_memory_reserved_pages_get): a NULL buffer gets the
 * count; a buffer gets min(*num, count) records, *num the number written, and
 * INSUFFICIENT_SIZE if some did not fit. */
static amdsmi_status_t fill_pages(const amdsmi_retired_page_record_t *pages, int n,
                                  uint32_t *num, amdsmi_retired_page_record_t *out) {
    if (n < 0) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    if (!out) {
        *num = (uint32_t)n;
        return leave(AMDSMI_STATUS_SUCCESS);
    }
    uint32_t fit = *num < (uint32_t)n ? *num : (uint32_t)n;
    memcpy(out, pages, fit * sizeof *pages);
    *num = fit;
    return leave(fit < (uint32_t)n ? AMDSMI_STATUS_INSUFFICIENT_SIZE : AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_bad_page_info(amdsmi_processor_handle handle, uint32_t *num,
                                                    amdsmi_retired_page_record_t *info) {
    ENTER_PROC(handle, num);
    return fill_pages(p->bad_pages, p->nbad_pages, num, info);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_memory_reserved_pages(amdsmi_processor_handle handle,
                                                            uint32_t *num,
                                                            amdsmi_retired_page_record_t *recs) {
    ENTER_PROC(handle, num);
    return fill_pages(p->reserved_pages, p->nreserved_pages, num, recs);
}

/* As amd_smi.cc: *max 0 (or no processes) gets the count; a NULL buffer otherwise is INVAL;
 * a short buffer is filled, *max set to the real count, OUT_OF_RESOURCES. */
EXPORT amdsmi_status_t amdsmi_get_gpu_process_list(amdsmi_processor_handle handle, uint32_t *max,
                                                   amdsmi_proc_info_t *list) {
    ENTER_PROC(handle, max);
    if (p->nprocesses < 0) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    uint32_t n = (uint32_t)p->nprocesses;
    if (*max == 0 || n == 0) {
        *max = n;
        return leave(AMDSMI_STATUS_SUCCESS);
    }
    if (!list) return leave(AMDSMI_STATUS_INVAL);
    uint32_t fit = *max < n ? *max : n, room = *max;
    memcpy(list, p->processes, fit * sizeof *list);
    *max = n;
    return leave(room >= n ? AMDSMI_STATUS_SUCCESS : AMDSMI_STATUS_OUT_OF_RESOURCES);
}

/* ---- Partitions, topology. */

/* rocm_smi copies the string into the caller's buffer: INVAL for none, INSUFFICIENT_SIZE
 * when it does not fit (the bindings pass 80 bytes). */
static amdsmi_status_t copy_partition(const char *value, char *buf, uint32_t len) {
    if (!value[0]) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    if (len == 0) return leave(AMDSMI_STATUS_INVAL);
    if (strlen(value) + 1 > len) return leave(AMDSMI_STATUS_INSUFFICIENT_SIZE);
    memcpy(buf, value, strlen(value) + 1);
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_compute_partition(amdsmi_processor_handle handle, char *buf,
                                                        uint32_t len) {
    ENTER_PROC(handle, buf);
    return copy_partition(p->compute_partition, buf, len);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_memory_partition(amdsmi_processor_handle handle, char *buf,
                                                       uint32_t len) {
    ENTER_PROC(handle, buf);
    return copy_partition(p->memory_partition, buf, len);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_topo_numa_affinity(amdsmi_processor_handle handle,
                                                         int32_t *numa_node) {
    ENTER_PROC(handle, numa_node);
    if (!p->has_numa) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *numa_node = p->numa_node;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_topo_get_link_type(amdsmi_processor_handle src,
                                                 amdsmi_processor_handle dst, uint64_t *hops,
                                                 uint32_t *type) {
    ENTER_PROC(src, hops && type);
    proc_state *to = proc_of(dst);
    if (!to) return leave(AMDSMI_STATUS_INVAL);
    if (!p->link_present[to->index]) return leave(AMDSMI_STATUS_NOT_SUPPORTED);
    *hops = p->link_hops[to->index];
    *type = p->link_type[to->index];
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* amd_smi.cc (6.3-dev): AMDSMI_CHECK_INIT first; 6.4 removed that (its CHANGELOG), so before
 * init the fake reads the state file to learn its release (and answers NOT_INIT for 7.0, as
 * before). `build` points at a static string. */
EXPORT amdsmi_status_t amdsmi_get_lib_version(void *version) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount > 0) maybe_reload();
    else if (load_state() != 0 || g_rel->lib_version_needs_init)
        return leave(AMDSMI_STATUS_NOT_INIT);
    if (!version) return leave(AMDSMI_STATUS_INVAL);
    const layout *l = &g_rel->of[L_VERSION];
    memset(version, 0, l->size);
    set_uint(l, version, "year", g_lib_version[0]); /* 6.4 only */
    set_uint(l, version, "major", g_lib_version[1]);
    set_uint(l, version, "minor", g_lib_version[2]);
    set_uint(l, version, "release", g_lib_version[3]);
    set_uint(l, version, "build", (uintptr_t)g_lib_build);
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* ---- Events (rocm_smi's KFD event file per registered GPU). */

EXPORT amdsmi_status_t amdsmi_init_gpu_event_notification(amdsmi_processor_handle handle) {
    ENTER_PROC(handle, handle);
    g_evt_registered[p->index] = 1;
    g_evt_mask[p->index] = 0;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_set_gpu_event_notification_mask(amdsmi_processor_handle handle,
                                                              uint64_t mask) {
    ENTER_PROC(handle, handle);
    if (!g_evt_registered[p->index]) return leave(AMDSMI_STATUS_INIT_ERROR);
    g_evt_mask[p->index] = mask;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_stop_gpu_event_notification(amdsmi_processor_handle handle) {
    ENTER_PROC(handle, handle);
    if (!g_evt_registered[p->index]) return leave(AMDSMI_STATUS_INIT_ERROR);
    g_evt_registered[p->index] = 0;
    /* what was queued for it goes with its event file */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < g_npending; i++)
        if (g_pending[i].processor != p->index) g_pending[kept++] = g_pending[i];
    g_npending = kept;
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* Take the events the state file has newly listed: the kernel queues an event only for a GPU
 * whose event file is open and whose mask has its bit (1 << (event - 1)); others are lost. */
static void take_events(void) {
    uint64_t seen = g_event_seen;
    for (uint32_t i = 0; i < g_nevents; i++) {
        const event_state *e = &g_events[i];
        if (e->seq <= g_event_seen) continue;
        if (e->seq > seen) seen = e->seq;
        if (e->processor >= g_nprocs || !g_evt_registered[e->processor] || e->event == 0 ||
            e->event > 64 || !(g_evt_mask[e->processor] & (1ull << (e->event - 1))) ||
            g_npending == MAX_EVENTS)
            continue;
        g_pending[g_npending++] = *e;
    }
    g_event_seen = seen;
}

/* Polls every registered GPU (not one handle) for up to timeout_ms; NO_DATA when nothing came
 * (rocm_smi's rsmi_event_notification_get). The lock is not held while waiting. */
EXPORT amdsmi_status_t amdsmi_get_gpu_event_notification(int32_t timeout_ms, uint32_t *num,
                                                         void *data) {
    amdsmi_status_t s = enter();
    if (s != AMDSMI_STATUS_SUCCESS) return s;
    if (!num || !data) return leave(AMDSMI_STATUS_INVAL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        take_events();
        if (g_npending > 0 || *num == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t waited_ms = (int64_t)(now.tv_sec - start.tv_sec) * 1000 +
                            (now.tv_nsec - start.tv_nsec) / 1000000;
        if (timeout_ms >= 0 && waited_ms >= timeout_ms) break;
        pthread_mutex_unlock(&g_lock);
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0) return leave(AMDSMI_STATUS_NOT_INIT);
        maybe_reload();
    }
    uint32_t n = *num < g_npending ? *num : g_npending;
    const layout *l = &g_rel->of[L_EVENT]; /* 6.4: 112 bytes, a 96-byte message */
    for (uint32_t i = 0; i < n; i++) {
        char *entry = (char *)data + i * l->size;
        memset(entry, 0, l->size);
        set_uint(l, entry, "processor_handle", (uintptr_t)&g_procs[g_pending[i].processor]);
        set_uint(l, entry, "event", g_pending[i].event);
        set_str(l, entry, "message", g_pending[i].message);
    }
    memmove(g_pending, g_pending + n, (g_npending - n) * sizeof g_pending[0]);
    g_npending -= n;
    *num = n;
    return leave(n ? AMDSMI_STATUS_SUCCESS : AMDSMI_STATUS_NO_DATA);
}

/* Needs no init in the real library either. Strings are this fake's own wording. */
EXPORT amdsmi_status_t amdsmi_status_code_to_string(amdsmi_status_t status, const char **text) {
    static const struct {
        amdsmi_status_t code;
        const char *text;
    } names[] = {
        {0, "AMDSMI_STATUS_SUCCESS: Call succeeded"},
        {1, "AMDSMI_STATUS_INVAL: Invalid parameters"},
        {2, "AMDSMI_STATUS_NOT_SUPPORTED: Command not supported"},
        {18, "AMDSMI_STATUS_INIT_ERROR: Initialization error"},
        {19, "AMDSMI_STATUS_REFCOUNT_OVERFLOW: Internal reference counter exceeded INT32_MAX"},
        {32, "AMDSMI_STATUS_NOT_INIT: Device not initialized"},
    };
    if (!text) return AMDSMI_STATUS_INVAL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].code == status) {
            *text = names[i].text;
            return AMDSMI_STATUS_SUCCESS;
        }
    }
    *text = "An unknown error occurred";
    return 0xFFFFFFFFu; /* AMDSMI_STATUS_UNKNOWN_ERROR */
}

/* Frees what amdsmi_get_cpu_... name/value calls allocate; none are modelled: nothing to do. */
EXPORT void amdsmi_free_name_value_pairs(void *pairs) { (void)pairs; }

/* ---------------------------------------------------------------- 5. Everything else */
/* Declared without parameters: the C calling convention lets callers pass any, and none of
 * them (output buffers included) is touched. */

static amdsmi_status_t unmodelled(void) {
    pthread_mutex_lock(&g_lock);
    amdsmi_status_t s = g_refcount ? AMDSMI_STATUS_NOT_SUPPORTED : AMDSMI_STATUS_NOT_INIT;
    return leave(s);
}

#define UNMODELLED(X) \
    X(amdsmi_clean_gpu_local_data) \
    X(amdsmi_cpu_apb_disable) \
    X(amdsmi_cpu_apb_enable) \
    X(amdsmi_first_online_core_on_cpu_socket) \
    X(amdsmi_get_afids_from_cper) \
    X(amdsmi_get_clk_freq) \
    X(amdsmi_get_cpu_affinity_with_scope) \
    X(amdsmi_get_cpu_cclk_limit) \
    X(amdsmi_get_cpu_core_boostlimit) \
    X(amdsmi_get_cpu_core_current_freq_limit) \
    X(amdsmi_get_cpu_core_energy) \
    X(amdsmi_get_cpu_cores_per_socket) \
    X(amdsmi_get_cpu_current_io_bandwidth) \
    X(amdsmi_get_cpu_current_xgmi_bw) \
    X(amdsmi_get_cpu_ddr_bw) \
    X(amdsmi_get_cpu_dimm_power_consumption) \
    X(amdsmi_get_cpu_dimm_temp_range_and_refresh_rate) \
    X(amdsmi_get_cpu_dimm_thermal_sensor) \
    X(amdsmi_get_cpu_family) \
    X(amdsmi_get_cpu_fclk_mclk) \
    X(amdsmi_get_cpu_handles) \
    X(amdsmi_get_cpu_hsmp_driver_version) \
    X(amdsmi_get_cpu_hsmp_proto_ver) \
    X(amdsmi_get_cpu_model) \
    X(amdsmi_get_cpu_model_name) \
    X(amdsmi_get_cpu_prochot_status) \
    X(amdsmi_get_cpu_pwr_svi_telemetry_all_rails) \
    X(amdsmi_get_cpu_smu_fw_version) \
    X(amdsmi_get_cpu_socket_c0_residency) \
    X(amdsmi_get_cpu_socket_count) \
    X(amdsmi_get_cpu_socket_current_active_freq_limit) \
    X(amdsmi_get_cpu_socket_energy) \
    X(amdsmi_get_cpu_socket_freq_range) \
    X(amdsmi_get_cpu_socket_lclk_dpm_level) \
    X(amdsmi_get_cpu_socket_power) \
    X(amdsmi_get_cpu_socket_power_cap) \
    X(amdsmi_get_cpu_socket_power_cap_max) \
    X(amdsmi_get_cpu_socket_temperature) \
    X(amdsmi_get_cpucore_handles) \
    X(amdsmi_get_esmi_err_msg) \
    X(amdsmi_get_fw_info) \
    X(amdsmi_get_gpu_accelerator_partition_profile) \
    X(amdsmi_get_gpu_accelerator_partition_profile_config) \
    X(amdsmi_get_gpu_available_counters) \
    X(amdsmi_get_gpu_bad_page_threshold) \
    X(amdsmi_get_gpu_bdf_id) \
    X(amdsmi_get_gpu_board_info) \
    X(amdsmi_get_gpu_busy_percent) \
    X(amdsmi_get_gpu_cache_info) \
    X(amdsmi_get_gpu_compute_process_gpus) \
    X(amdsmi_get_gpu_compute_process_info) \
    X(amdsmi_get_gpu_compute_process_info_by_pid) \
    X(amdsmi_get_gpu_cper_entries) \
    X(amdsmi_get_gpu_ecc_enabled) \
    X(amdsmi_get_gpu_ecc_status) \
    X(amdsmi_get_gpu_fan_rpms) \
    X(amdsmi_get_gpu_fan_speed) \
    X(amdsmi_get_gpu_fan_speed_max) \
    X(amdsmi_get_gpu_id) \
    X(amdsmi_get_gpu_mem_overdrive_level) \
    X(amdsmi_get_gpu_memory_partition_config) \
    X(amdsmi_get_gpu_memory_total) \
    X(amdsmi_get_gpu_memory_usage) \
    X(amdsmi_get_gpu_metrics_header_info) \
    X(amdsmi_get_gpu_od_volt_curve_regions) \
    X(amdsmi_get_gpu_od_volt_info) \
    X(amdsmi_get_gpu_overdrive_level) \
    X(amdsmi_get_gpu_pci_bandwidth) \
    X(amdsmi_get_gpu_pci_replay_counter) \
    X(amdsmi_get_gpu_pci_throughput) \
    X(amdsmi_get_gpu_perf_level) \
    X(amdsmi_get_gpu_pm_metrics_info) \
    X(amdsmi_get_gpu_power_profile_presets) \
    X(amdsmi_get_gpu_process_isolation) \
    X(amdsmi_get_gpu_ras_block_features_enabled) \
    X(amdsmi_get_gpu_ras_feature_info) \
    X(amdsmi_get_gpu_reg_table_info) \
    X(amdsmi_get_gpu_revision) \
    X(amdsmi_get_gpu_subsystem_id) \
    X(amdsmi_get_gpu_subsystem_name) \
    X(amdsmi_get_gpu_vbios_info) \
    X(amdsmi_get_gpu_vendor_name) \
    X(amdsmi_get_gpu_virtualization_mode) \
    X(amdsmi_get_gpu_volt_metric) \
    X(amdsmi_get_gpu_vram_vendor) \
    X(amdsmi_get_gpu_xcd_counter) \
    X(amdsmi_get_hsmp_metrics_table) \
    X(amdsmi_get_hsmp_metrics_table_version) \
    X(amdsmi_get_link_topology_nearest) \
    X(amdsmi_get_minmax_bandwidth_between_processors) \
    X(amdsmi_get_processor_count_from_handles) \
    X(amdsmi_get_processor_handle_from_bdf) \
    X(amdsmi_get_processor_handles_by_type) \
    X(amdsmi_get_processor_info) \
    X(amdsmi_get_soc_pstate) \
    X(amdsmi_get_socket_info) \
    X(amdsmi_get_threads_per_core) \
    X(amdsmi_get_utilization_count) \
    X(amdsmi_get_violation_status) \
    X(amdsmi_get_xgmi_info) \
    X(amdsmi_get_xgmi_plpd) \
    X(amdsmi_gpu_control_counter) \
    X(amdsmi_gpu_counter_group_supported) \
    X(amdsmi_gpu_create_counter) \
    X(amdsmi_gpu_destroy_counter) \
    X(amdsmi_gpu_driver_reload) \
    X(amdsmi_gpu_read_counter) \
    X(amdsmi_gpu_validate_ras_eeprom) \
    X(amdsmi_gpu_xgmi_error_status) \
    X(amdsmi_is_P2P_accessible) \
    X(amdsmi_is_gpu_power_management_enabled) \
    X(amdsmi_reset_gpu) \
    X(amdsmi_reset_gpu_fan) \
    X(amdsmi_reset_gpu_xgmi_error) \
    X(amdsmi_set_clk_freq) \
    X(amdsmi_set_cpu_core_boostlimit) \
    X(amdsmi_set_cpu_df_pstate_range) \
    X(amdsmi_set_cpu_gmi3_link_width_range) \
    X(amdsmi_set_cpu_pcie_link_rate) \
    X(amdsmi_set_cpu_pwr_efficiency_mode) \
    X(amdsmi_set_cpu_socket_boostlimit) \
    X(amdsmi_set_cpu_socket_lclk_dpm_level) \
    X(amdsmi_set_cpu_socket_power_cap) \
    X(amdsmi_set_cpu_xgmi_width) \
    X(amdsmi_set_gpu_accelerator_partition_profile) \
    X(amdsmi_set_gpu_clk_limit) \
    X(amdsmi_set_gpu_clk_range) \
    X(amdsmi_set_gpu_compute_partition) \
    X(amdsmi_set_gpu_fan_speed) \
    X(amdsmi_set_gpu_memory_partition) \
    X(amdsmi_set_gpu_memory_partition_mode) \
    X(amdsmi_set_gpu_od_clk_info) \
    X(amdsmi_set_gpu_od_volt_info) \
    X(amdsmi_set_gpu_overdrive_level) \
    X(amdsmi_set_gpu_pci_bandwidth) \
    X(amdsmi_set_gpu_perf_determinism_mode) \
    X(amdsmi_set_gpu_perf_level) \
    X(amdsmi_set_gpu_power_profile) \
    X(amdsmi_set_gpu_process_isolation) \
    X(amdsmi_set_power_cap) \
    X(amdsmi_set_soc_pstate) \
    X(amdsmi_set_xgmi_plpd) \
    X(amdsmi_topo_get_link_weight) \
    X(amdsmi_topo_get_numa_node_number) \
    X(amdsmi_topo_get_p2p_status) \
    /* end */

#define STUB(name) \
    EXPORT amdsmi_status_t name(void) { return unmodelled(); }
UNMODELLED(STUB)
