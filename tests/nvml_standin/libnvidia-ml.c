/*
 * A stand-in for the NVIDIA Management Library (libnvidia-ml.so.1), for tests on machines
 * without a GPU.  Built by tests/fixtures/nvml.py:
 *
 *     gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 libnvidia-ml.c -lpthread
 *
 * and loaded by the real pynvml bindings through LD_LIBRARY_PATH.  It exports only the entry
 * points hub_ext/docker/nvml.py calls, under the (versioned) symbol names pynvml resolves, with the
 * signatures, struct layouts and return codes of nvml.h.
 *
 * The node is described by the JSON file named in NVML_STANDIN_JSON, in the schema documented
 * in hub_ext/docker/inventory.py.  The file is re-read whenever it changes (inode, size or mtime),
 * checked on every call, so a test can change utilization or break a GPU while a process keeps
 * NVML initialised.  A file that cannot be parsed (e.g. caught mid-write) keeps the last good
 * state; nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED when there is no good state at all.
 * A document beyond the limits below (16 GPUs, 8 MIG devices and 32 processes each) is
 * refused as unparseable rather than truncated.
 *
 * Behaviour that follows the NVML reference (docs.nvidia.com/deploy/nvml-api):
 * - "lost": true makes every query of that GPU, and of its MIG devices, return
 *   NVML_ERROR_GPU_IS_LOST, nvmlDeviceGetHandleByIndex_v2 and nvmlDeviceGetUUID included.
 * - a key that is absent means the query is not supported: "temperature", "mig_mode" and
 *   "ecc_uncorrected_volatile" (ECC disabled) give NVML_ERROR_NOT_SUPPORTED.
 * - a process without "used_memory_mib" reports NVML_VALUE_NOT_AVAILABLE.
 * - MIG devices: utilization and temperature are not supported; nvmlDeviceGetMaxMigDeviceCount
 *   is 7 (an A100/H100), and empty slots give NVML_ERROR_NOT_FOUND; the profile ("1g.5gb",
 *   "1c.2g.10gb") is reported through nvmlDeviceGetAttributes_v2 as slice counts and memory.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- nvml.h: the types and codes used here ---- */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used; /* bytes */
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    unsigned int gpu, memory; /* percent */
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory; /* bytes */
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount;
    unsigned int sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    unsigned int gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)
#define NVML_VALUE_NOT_AVAILABLE_UINT (~0U)
#define NVML_TEMPERATURE_GPU 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_AGGREGATE_ECC 1
#define MAX_MIG_SLOTS 7
#define MIB (1024ULL * 1024ULL)

/* ---- the node, as read from the JSON file ---- */

#define MAX_DEVICES 16
#define MAX_MIGS 8
#define MAX_PROCS 32
#define TEXT 96

typedef struct {
    unsigned int pid;
    unsigned long long used_mib; /* NVML_VALUE_NOT_AVAILABLE_ULL when absent */
} proc_t;

typedef struct {
    char uuid[TEXT], profile[32];
    unsigned long long memory_total_mib, memory_used_mib;
    int nprocs;
    proc_t procs[MAX_PROCS];
} mig_t;

typedef struct {
    char uuid[TEXT], name[TEXT];
    unsigned int index, utilization, temperature;
    unsigned long long memory_total_mib, memory_used_mib, ecc;
    int has_temperature, has_ecc, has_mig_mode, mig_mode, lost;
    int nprocs, nmigs;
    proc_t procs[MAX_PROCS];
    mig_t migs[MAX_MIGS];
} gpu_t;

typedef struct {
    int ngpus;
    gpu_t gpus[MAX_DEVICES];
} node_t;

/* A handle points into this table: slot 0 is the GPU, slot 1 + k its MIG device k. */
struct nvmlDevice_st {
    int gpu, mig;
};
static struct nvmlDevice_st handles[MAX_DEVICES][MAX_MIGS + 1];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static int have_node;
static node_t node, scratch;
static struct stat loaded; /* the file as last parsed */

/* ---- a minimal JSON reader: values are parsed into a tree, then copied into node_t ---- */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct json {
    int type, n;
    double num;
    char *str;          /* J_STR */
    char **keys;        /* J_OBJ */
    struct json *items; /* J_ARR, J_OBJ */
} json;

typedef struct {
    const char *p;
    int depth;
} parser;

static void skip_ws(parser *ps) {
    while (*ps->p && isspace((unsigned char)*ps->p)) ps->p++;
}

static int parse_value(parser *ps, json *out);

static char *parse_string(parser *ps) {
    size_t cap = 32, len = 0;
    char *s = malloc(cap);
    if (!s || *ps->p != '"') goto fail;
    ps->p++;
    while (*ps->p != '"') {
        char c = *ps->p++;
        if (c == '\0') goto fail;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case '"': case '\\': case '/': c = e; break;
            case 'u': { /* only ASCII escapes are kept; others become '?' */
                char hex[5] = {0};
                for (int i = 0; i < 4; i++)
                    if (!isxdigit((unsigned char)(hex[i] = *ps->p++))) goto fail;
                long code = strtol(hex, NULL, 16);
                c = code > 0 && code < 128 ? (char)code : '?';
                break;
            }
            default: goto fail;
            }
        }
        if (len + 2 > cap) {
            char *bigger = realloc(s, cap *= 2);
            if (!bigger) goto fail;
            s = bigger;
        }
        s[len++] = c;
    }
    ps->p++;
    s[len] = '\0';
    return s;
fail:
    free(s);
    return NULL;
}

static void json_free(json *v) {
    for (int i = 0; i < v->n; i++) {
        if (v->keys) free(v->keys[i]);
        json_free(&v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v->str);
    memset(v, 0, sizeof *v);
}

static int parse_members(parser *ps, json *out, int object, char close) {
    ps->p++;
    skip_ws(ps);
    if (*ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        json *items = realloc(out->items, (out->n + 1) * sizeof *items);
        if (!items) return -1;
        out->items = items;
        memset(&items[out->n], 0, sizeof *items);
        if (object) {
            char **keys = realloc(out->keys, (out->n + 1) * sizeof *keys);
            if (!keys) return -1;
            out->keys = keys;
            skip_ws(ps);
            keys[out->n] = parse_string(ps);
            if (!keys[out->n]) return -1;
            skip_ws(ps);
            if (*ps->p++ != ':') {
                out->n++; /* so the key is freed */
                return -1;
            }
        }
        int rc = parse_value(ps, &items[out->n]);
        out->n++;
        if (rc) return -1;
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p++ != close) return -1;
        return 0;
    }
}

static int parse_value(parser *ps, json *out) {
    memset(out, 0, sizeof *out);
    skip_ws(ps);
    if (++ps->depth > 32) return -1;
    int rc = 0;
    const char *p = ps->p;
    if (*p == '{') {
        out->type = J_OBJ;
        rc = parse_members(ps, out, 1, '}');
    } else if (*p == '[') {
        out->type = J_ARR;
        rc = parse_members(ps, out, 0, ']');
    } else if (*p == '"') {
        out->type = J_STR;
        out->str = parse_string(ps);
        rc = out->str ? 0 : -1;
    } else if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
        out->type = J_BOOL;
        out->num = *p == 't';
        ps->p += *p == 't' ? 4 : 5;
    } else if (!strncmp(p, "null", 4)) {
        out->type = J_NULL;
        ps->p += 4;
    } else {
        char *end;
        out->type = J_NUM;
        out->num = strtod(p, &end);
        rc = end == p ? -1 : 0;
        ps->p = end;
    }
    ps->depth--;
    return rc;
}

/* The member `key` of an object; NULL when absent or null (an absent key). */
static const json *get(const json *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) return obj->items[i].type == J_NULL ? NULL : &obj->items[i];
    return NULL;
}

static int get_number(const json *obj, const char *key, unsigned long long *out) {
    const json *v = get(obj, key);
    if (!v) return 0;
    if (v->type != J_NUM && v->type != J_BOOL) return -1;
    *out = v->num < 0 ? 0 : (unsigned long long)v->num;
    return 1;
}

static int get_text(const json *obj, const char *key, char *out, size_t size) {
    const json *v = get(obj, key);
    if (!v) return 0;
    if (v->type != J_STR || strlen(v->str) >= size) return -1;
    strcpy(out, v->str);
    return 1;
}

static int read_procs(const json *obj, proc_t *procs, int *count) {
    const json *list = get(obj, "processes");
    *count = 0;
    if (!list) return 0;
    if (list->type != J_ARR || list->n > MAX_PROCS) return -1;
    for (int i = 0; i < list->n; i++) {
        unsigned long long pid = 0, used = NVML_VALUE_NOT_AVAILABLE_ULL;
        if (get_number(&list->items[i], "pid", &pid) != 1) return -1;
        if (get_number(&list->items[i], "used_memory_mib", &used) < 0) return -1;
        procs[i].pid = (unsigned int)pid;
        procs[i].used_mib = used;
    }
    *count = list->n;
    return 0;
}

/* Parse the "Cc.Gg.Xgb" / "Gg.Xgb" profile name into its slice counts and memory (GB). */
static void parse_profile(const char *profile, unsigned *ci, unsigned *gi, unsigned *gb) {
    unsigned a = 0, b = 0, c = 0;
    *ci = *gi = *gb = 0;
    if (sscanf(profile, "%uc.%ug.%ugb", &a, &b, &c) == 3) {
        *ci = a, *gi = b, *gb = c;
    } else if (sscanf(profile, "%ug.%ugb", &b, &c) == 2) {
        *ci = b, *gi = b, *gb = c;
    }
}

static int read_gpu(const json *obj, int position, gpu_t *g) {
    unsigned long long v;
    memset(g, 0, sizeof *g);
    g->index = position;
    g->memory_total_mib = 16384; /* the defaults of hub_ext.docker.inventory.devices_from_json */
    strcpy(g->name, "Simulated GPU");
    if (obj->type != J_OBJ || get_text(obj, "uuid", g->uuid, TEXT) != 1) return -1;
    if (get_text(obj, "name", g->name, TEXT) < 0) return -1;
    if (get_number(obj, "index", &v) == 1) g->index = (unsigned)v;
    if (get_number(obj, "memory_total_mib", &g->memory_total_mib) < 0) return -1;
    if (get_number(obj, "memory_used_mib", &g->memory_used_mib) < 0) return -1;
    if (get_number(obj, "utilization_gpu", &v) == 1) g->utilization = (unsigned)v;
    if ((g->has_temperature = get_number(obj, "temperature", &v)) == 1) g->temperature = (unsigned)v;
    if ((g->has_ecc = get_number(obj, "ecc_uncorrected_volatile", &g->ecc)) < 0) return -1;
    if (get_number(obj, "lost", &v) == 1) g->lost = v != 0;
    if ((g->has_mig_mode = get_number(obj, "mig_mode", &v)) == 1) g->mig_mode = v != 0;
    if (g->has_mig_mode < 0 || read_procs(obj, g->procs, &g->nprocs)) return -1;
    const json *migs = get(obj, "mig_devices");
    if (!migs) return 0;
    if (migs->type != J_ARR || migs->n > MAX_MIGS) return -1;
    for (int i = 0; i < migs->n; i++) {
        const json *m = &migs->items[i];
        mig_t *out = &g->migs[i];
        unsigned ci, gi, gb;
        if (m->type != J_OBJ || get_text(m, "uuid", out->uuid, TEXT) != 1) return -1;
        if (get_text(m, "profile", out->profile, sizeof out->profile) < 0) return -1;
        parse_profile(out->profile, &ci, &gi, &gb);
        out->memory_total_mib = gb * 1024ULL;
        if (get_number(m, "memory_total_mib", &out->memory_total_mib) < 0) return -1;
        if (get_number(m, "memory_used_mib", &out->memory_used_mib) < 0) return -1;
        if (read_procs(m, out->procs, &out->nprocs)) return -1;
    }
    g->nmigs = migs->n;
    return 0;
}

/* Parse the file into `scratch`; 0 on success. */
static int parse_file(FILE *f) {
    char *text = NULL;
    long size;
    json root;
    int rc = -1;
    if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) return -1;
    if (!(text = calloc(1, size + 1)) || fread(text, 1, size, f) != (size_t)size) {
        free(text);
        return -1;
    }
    parser ps = {text, 0};
    if (parse_value(&ps, &root) == 0) {
        const json *devices = get(&root, "devices");
        skip_ws(&ps);
        if (*ps.p == '\0' && devices && devices->type == J_ARR && devices->n <= MAX_DEVICES) {
            rc = 0;
            scratch.ngpus = devices->n;
            for (int i = 0; i < devices->n && rc == 0; i++)
                rc = read_gpu(&devices->items[i], i, &scratch.gpus[i]);
        }
    }
    json_free(&root);
    free(text);
    return rc;
}

/* Re-read the file if it changed since it was last parsed.  Called with `lock` held. */
static void refresh(void) {
    const char *path = getenv("NVML_STANDIN_JSON");
    struct stat st;
    FILE *f;
    if (!path || stat(path, &st)) return;
    if (have_node && st.st_ino == loaded.st_ino && st.st_size == loaded.st_size &&
        st.st_mtim.tv_sec == loaded.st_mtim.tv_sec && st.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return;
    if (!(f = fopen(path, "r"))) return;
    if (parse_file(f) == 0) {
        node = scratch;
        loaded = st;
        have_node = 1;
    } else {
        fprintf(stderr, "libnvidia-ml stand-in: cannot parse %s%s\n", path,
                have_node ? "; keeping the last good state" : "");
    }
    fclose(f);
}

/* Lock, refresh, and resolve a handle.  Every return path of a caller goes through done(). */
static nvmlReturn_t begin(nvmlDevice_t device, gpu_t **gpu, mig_t **mig) {
    pthread_mutex_lock(&lock);
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    refresh();
    if (!device || device < &handles[0][0] || device >= &handles[0][0] + sizeof handles / sizeof handles[0][0])
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->gpu >= node.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &node.gpus[device->gpu];
    *mig = NULL;
    if ((*gpu)->lost) return NVML_ERROR_GPU_IS_LOST;
    if (device->mig >= 0) {
        if (!(*gpu)->mig_mode || device->mig >= (*gpu)->nmigs) return NVML_ERROR_INVALID_ARGUMENT;
        *mig = &(*gpu)->migs[device->mig];
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t done(nvmlReturn_t rc) {
    pthread_mutex_unlock(&lock);
    return rc;
}

#define BEGIN(device)                                      \
    gpu_t *gpu;                                            \
    mig_t *mig;                                            \
    nvmlReturn_t rc_ = begin((device), &gpu, &mig);        \
    if (rc_ != NVML_SUCCESS) return done(rc_);             \
    (void)mig

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

/* ---- the exported entry points ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    refresh();
    if (!have_node) return done(NVML_ERROR_DRIVER_NOT_LOADED);
    for (int i = 0; i < MAX_DEVICES; i++)
        for (int k = 0; k <= MAX_MIGS; k++) handles[i][k] = (struct nvmlDevice_st){i, k - 1};
    init_count++;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (!init_count) return done(NVML_ERROR_UNINITIALIZED);
    init_count--;
    return done(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    if (!init_count) return done(NVML_ERROR_UNINITIALIZED);
    if (!count) return done(NVML_ERROR_INVALID_ARGUMENT);
    refresh();
    *count = node.ngpus;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= MAX_DEVICES || !device) return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN(&handles[index][0]);
    *device = &handles[index][0];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    BEGIN(device);
    if (!index) return done(NVML_ERROR_INVALID_ARGUMENT);
    *index = gpu->index;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN(device);
    return done(copy_text(mig ? mig->uuid : gpu->uuid, uuid, length));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    char text[2 * TEXT];
    BEGIN(device);
    if (mig)
        snprintf(text, sizeof text, "%s MIG %s", gpu->name, mig->profile);
    else
        snprintf(text, sizeof text, "%s", gpu->name);
    return done(copy_text(text, name, length));
}

static void memory_bytes(gpu_t *gpu, mig_t *mig, unsigned long long *total, unsigned long long *used) {
    *total = (mig ? mig->memory_total_mib : gpu->memory_total_mib) * MIB;
    *used = (mig ? mig->memory_used_mib : gpu->memory_used_mib) * MIB;
    if (*used > *total) *used = *total;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    BEGIN(device);
    if (!memory) return done(NVML_ERROR_INVALID_ARGUMENT);
    memory_bytes(gpu, mig, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    BEGIN(device);
    if (!memory) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return done(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory_bytes(gpu, mig, &memory->total, &memory->used);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    BEGIN(device);
    if (!utilization) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (mig) return done(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = gpu->utilization;
    utilization->memory = gpu->memory_total_mib ? gpu->memory_used_mib * 100 / gpu->memory_total_mib : 0;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp) {
    BEGIN(device);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (mig || !gpu->has_temperature) return done(NVML_ERROR_NOT_SUPPORTED);
    *temp = gpu->temperature;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    BEGIN(device);
    if (!infoCount) return done(NVML_ERROR_INVALID_ARGUMENT);
    int n = mig ? mig->nprocs : gpu->nprocs;
    const proc_t *procs = mig ? mig->procs : gpu->procs;
    if (*infoCount < (unsigned)n || (!infos && n)) {
        *infoCount = n;
        return done(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *infoCount = n;
    for (int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory =
            procs[i].used_mib == NVML_VALUE_NOT_AVAILABLE_ULL ? NVML_VALUE_NOT_AVAILABLE_ULL : procs[i].used_mib * MIB;
        infos[i].gpuInstanceId = mig ? (unsigned)(device->mig + 1) : NVML_VALUE_NOT_AVAILABLE_UINT;
        infos[i].computeInstanceId = mig ? 0 : NVML_VALUE_NOT_AVAILABLE_UINT;
    }
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *eccCounts) {
    BEGIN(device);
    if (!eccCounts || errorType < 0 || errorType > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counterType < 0 ||
        counterType > NVML_AGGREGATE_ECC)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (mig || !gpu->has_ecc) return done(NVML_ERROR_NOT_SUPPORTED);
    *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? gpu->ecc : 0;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    BEGIN(device);
    if (!currentMode || !pendingMode) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (mig || !gpu->has_mig_mode) return done(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = *pendingMode = gpu->mig_mode;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    BEGIN(device);
    if (!count || mig) return done(NVML_ERROR_INVALID_ARGUMENT);
    *count = gpu->mig_mode ? (gpu->nmigs > MAX_MIG_SLOTS ? gpu->nmigs : MAX_MIG_SLOTS) : 0;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    BEGIN(device);
    if (!migDevice || mig || !gpu->mig_mode) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned)gpu->nmigs) return done(NVML_ERROR_NOT_FOUND);
    *migDevice = &handles[device->gpu][index + 1];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    unsigned ci, gi, gb;
    BEGIN(device);
    if (!attributes) return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig) return done(NVML_ERROR_NOT_SUPPORTED); /* "only supports MIG device handles" */
    parse_profile(mig->profile, &ci, &gi, &gb);
    memset(attributes, 0, sizeof *attributes);
    attributes->gpuInstanceSliceCount = gi;
    attributes->computeInstanceSliceCount = ci;
    attributes->multiprocessorCount = 14 * ci;
    attributes->memorySizeMB = mig->memory_total_mib;
    return done(NVML_SUCCESS);
}
