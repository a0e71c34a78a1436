/* Declarations cffi exposes to Python (parsed by cffi: no preprocessor logic here).
 * Keep in step with rj_api.h, rj_err.h and sim/rj_sim.h. */
uint32_t rj_abi_version(void);

typedef struct rj_err {
    int32_t code;
    uint32_t reserved;
    char msg[1024];
} rj_err;

/* ---- simulator (sim/rj_sim.h) ---- */
typedef struct rj_region {
    uint64_t iova;
    uint64_t size;
    uint8_t *host;
} rj_region;

typedef struct rj_task {
    uint64_t regcmd_iova;
    uint32_t regcmd_count;
    uint32_t reserved;
} rj_task;

typedef struct rj_sim_stats {
    uint64_t jobs;
    uint64_t tasks;
    uint64_t kicks;
    uint64_t macs;
    uint64_t bytes_read;
    uint64_t bytes_written;
} rj_sim_stats;

#define RJ_SIM_STRICT 1

typedef struct rj_sim rj_sim;
int rj_sim_create(rj_sim **out, uint32_t flags, rj_err *err);
void rj_sim_destroy(rj_sim *sim);
int rj_sim_run_job(rj_sim *sim, const rj_region *regions, uint32_t nregions,
                   const rj_task *tasks, uint32_t ntasks, rj_err *err);
void rj_sim_get_stats(const rj_sim *sim, rj_sim_stats *out);
