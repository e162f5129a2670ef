/*
 * fakeamdsmi: a fake libamd_smi.so (AMD SMI, lib 26.x / ROCm 7.0) that the real Python
 * `amdsmi` 7.0.2 bindings load unchanged (ROCM_PATH=<dir>, <dir>/lib/libamd_smi.so).
 *
 * It exports exactly the 184 symbols amdsmi_wrapper.py binds at import. A few calls are
 * modelled (see tests/doubles/README.md, "fakeamdsmi"); every other one returns
 * AMDSMI_STATUS_NOT_INIT before amdsmi_init and AMDSMI_STATUS_NOT_SUPPORTED after it, without
 * touching its arguments (as AMD's own mock backend does for what it does not model).
 *
 * Values come from a JSON state file ($FAKEAMDSMI_STATE) written by control.py; it is read
 * at amdsmi_init and re-read by any later call when the file has been replaced or changed.
 *
 * Struct layouts are those of the ctypes definitions in amdsmi_wrapper.py (x86_64, packed
 * like the wrapper's _pack_ = 1 with its explicit PADDING_ fields); _Static_asserts pin them.
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

#define EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------- 1. ABI: types, codes */

typedef uint32_t amdsmi_status_t;
typedef void *amdsmi_processor_handle;
typedef void *amdsmi_socket_handle;

enum {
    AMDSMI_STATUS_SUCCESS = 0,
    AMDSMI_STATUS_INVAL = 1,
    AMDSMI_STATUS_NOT_SUPPORTED = 2,
    AMDSMI_STATUS_INIT_ERROR = 18,
    AMDSMI_STATUS_REFCOUNT_OVERFLOW = 19,
    AMDSMI_STATUS_NOT_INIT = 32,
};

#define AMDSMI_INIT_AMD_GPUS 2u
#define AMDSMI_GPU_UUID_SIZE 38u
#define AMDSMI_PROCESSOR_TYPE_AMD_GPU 1u
#define AMDSMI_TEMP_CURRENT 0u
#define N_TEMP_TYPES 7  /* EDGE 0, HOTSPOT/JUNCTION 1, VRAM 2, HBM_0..HBM_3 3..6 */
#define N_CLK_TYPES 10  /* GFX 0, DF 1, DCEF 2, SOC 3, MEM 4, PCIE 5, VCLK0/1 6/7, DCLK0/1 8/9 */
#define MAX_PROCESSORS 64
#define STRLEN 256

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

/* Not modelled yet; its layout is pinned for the next slice. */
typedef struct {
    uint32_t drm_render;
    uint32_t drm_card;
    uint32_t hsa_id;
    uint32_t hip_id;
    char hip_uuid[STRLEN];
} __attribute__((packed)) amdsmi_enumeration_info_t;

/* amdsmi_bdf_t: one uint64, function bits 0-2, device 3-7, bus 8-15, domain 16-63. */
typedef uint64_t amdsmi_bdf_t;

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
} proc_state;

typedef struct {
    uint32_t index; /* handles point here */
} socket_state;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int32_t g_refcount;
static proc_state g_procs[MAX_PROCESSORS];
static socket_state g_sockets[MAX_PROCESSORS];
static uint32_t g_nprocs, g_nsockets;
static struct stat g_loaded; /* the state file as last read */

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
    STR(market_name), STR(vendor_name), STR(asic_serial), STR(uuid),
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

static int load_proc(const jparser *jp, const jnode *obj, proc_state *p, uint32_t index) {
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
    if (root >= 0 && !jp.failed) {
        jskip(&jp);
        const jnode *top = &jp.nodes[root];
        const jnode *version = jget(&jp, top, "version");
        const jnode *list = jget(&jp, top, "processors");
        rc = *jp.p == '\0' && version && version->type == J_NUM && version->u64 == 1 && list &&
                     list->type == J_ARR
                 ? 0
                 : -1;
        for (const jnode *v = rc == 0 ? jat(&jp, list, 0) : NULL; v;
             v = v->next >= 0 ? &jp.nodes[v->next] : NULL) {
            if (n == MAX_PROCESSORS || v->type != J_OBJ || load_proc(&jp, v, &procs[n], n) != 0 ||
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
        fail("not a valid version 1 state file", path);
        return -1;
    }
    memcpy(g_procs, procs, sizeof procs);
    g_nprocs = n;
    g_nsockets = nsockets;
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
    if (g_refcount == 0 && load_state() != 0) return leave(AMDSMI_STATUS_INIT_ERROR);
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
        if (g_procs[i].socket != sock->index) continue;
        if (n == limit) break;
        if (handles) handles[n] = &g_procs[i];
        n++;
    }
    *count = n;
    return leave(AMDSMI_STATUS_SUCCESS);
}

/* The common start of a per-processor call: init, then the output pointer, then the handle. */
#define ENTER_PROC(handle, out)                                 \
    amdsmi_status_t s_ = enter();                               \
    if (s_ != AMDSMI_STATUS_SUCCESS) return s_;                 \
    if (!(out)) return leave(AMDSMI_STATUS_INVAL);              \
    proc_state *p = proc_of(handle);                            \
    if (!p) return leave(AMDSMI_STATUS_INVAL)

EXPORT amdsmi_status_t amdsmi_get_processor_type(amdsmi_processor_handle handle, uint32_t *type) {
    ENTER_PROC(handle, type);
    *type = AMDSMI_PROCESSOR_TYPE_AMD_GPU;
    return leave(AMDSMI_STATUS_SUCCESS);
}

EXPORT amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle handle,
                                                amdsmi_asic_info_t *info) {
    ENTER_PROC(handle, info);
    memset(info, 0, sizeof *info);
    memcpy(info->market_name, p->market_name, STRLEN);
    memcpy(info->vendor_name, p->vendor_name, STRLEN);
    memcpy(info->asic_serial, p->asic_serial, STRLEN);
    info->vendor_id = p->vendor_id;
    info->subvendor_id = p->subvendor_id;
    info->device_id = p->device_id;
    info->rev_id = p->rev_id;
    info->oam_id = p->oam_id;
    info->num_of_compute_units = p->num_compute_units;
    info->target_graphics_version = p->target_graphics_version;
    info->subsystem_id = p->subsystem_id;
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

EXPORT amdsmi_status_t amdsmi_get_power_info(amdsmi_processor_handle handle,
                                             amdsmi_power_info_t *info) {
    ENTER_PROC(handle, info);
    memset(info, 0, sizeof *info);
    info->socket_power = p->socket_power;
    info->current_socket_power = p->current_socket_power;
    info->average_socket_power = p->average_socket_power;
    info->gfx_voltage = p->gfx_voltage;
    info->soc_voltage = p->soc_voltage;
    info->mem_voltage = p->mem_voltage;
    info->power_limit = p->power_limit;
    return leave(AMDSMI_STATUS_SUCCESS);
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
    X(amdsmi_get_gpu_bad_page_info) \
    X(amdsmi_get_gpu_bad_page_threshold) \
    X(amdsmi_get_gpu_bdf_id) \
    X(amdsmi_get_gpu_board_info) \
    X(amdsmi_get_gpu_busy_percent) \
    X(amdsmi_get_gpu_cache_info) \
    X(amdsmi_get_gpu_compute_partition) \
    X(amdsmi_get_gpu_compute_process_gpus) \
    X(amdsmi_get_gpu_compute_process_info) \
    X(amdsmi_get_gpu_compute_process_info_by_pid) \
    X(amdsmi_get_gpu_cper_entries) \
    X(amdsmi_get_gpu_driver_info) \
    X(amdsmi_get_gpu_ecc_count) \
    X(amdsmi_get_gpu_ecc_enabled) \
    X(amdsmi_get_gpu_ecc_status) \
    X(amdsmi_get_gpu_enumeration_info) \
    X(amdsmi_get_gpu_event_notification) \
    X(amdsmi_get_gpu_fan_rpms) \
    X(amdsmi_get_gpu_fan_speed) \
    X(amdsmi_get_gpu_fan_speed_max) \
    X(amdsmi_get_gpu_id) \
    X(amdsmi_get_gpu_kfd_info) \
    X(amdsmi_get_gpu_mem_overdrive_level) \
    X(amdsmi_get_gpu_memory_partition) \
    X(amdsmi_get_gpu_memory_partition_config) \
    X(amdsmi_get_gpu_memory_reserved_pages) \
    X(amdsmi_get_gpu_memory_total) \
    X(amdsmi_get_gpu_memory_usage) \
    X(amdsmi_get_gpu_metrics_header_info) \
    X(amdsmi_get_gpu_metrics_info) \
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
    X(amdsmi_get_gpu_process_list) \
    X(amdsmi_get_gpu_ras_block_features_enabled) \
    X(amdsmi_get_gpu_ras_feature_info) \
    X(amdsmi_get_gpu_reg_table_info) \
    X(amdsmi_get_gpu_revision) \
    X(amdsmi_get_gpu_subsystem_id) \
    X(amdsmi_get_gpu_subsystem_name) \
    X(amdsmi_get_gpu_topo_numa_affinity) \
    X(amdsmi_get_gpu_total_ecc_count) \
    X(amdsmi_get_gpu_vbios_info) \
    X(amdsmi_get_gpu_vendor_name) \
    X(amdsmi_get_gpu_virtualization_mode) \
    X(amdsmi_get_gpu_volt_metric) \
    X(amdsmi_get_gpu_vram_info) \
    X(amdsmi_get_gpu_vram_vendor) \
    X(amdsmi_get_gpu_xcd_counter) \
    X(amdsmi_get_gpu_xgmi_link_status) \
    X(amdsmi_get_hsmp_metrics_table) \
    X(amdsmi_get_hsmp_metrics_table_version) \
    X(amdsmi_get_lib_version) \
    X(amdsmi_get_link_metrics) \
    X(amdsmi_get_link_topology_nearest) \
    X(amdsmi_get_minmax_bandwidth_between_processors) \
    X(amdsmi_get_pcie_info) \
    X(amdsmi_get_power_cap_info) \
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
    X(amdsmi_init_gpu_event_notification) \
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
    X(amdsmi_set_gpu_event_notification_mask) \
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
    X(amdsmi_stop_gpu_event_notification) \
    X(amdsmi_topo_get_link_type) \
    X(amdsmi_topo_get_link_weight) \
    X(amdsmi_topo_get_numa_node_number) \
    X(amdsmi_topo_get_p2p_status) \
    /* end */

#define STUB(name) \
    EXPORT amdsmi_status_t name(void) { return unmodelled(); }
UNMODELLED(STUB)
