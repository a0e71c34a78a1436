/* The one table of environment flags (design.md convention 11). Code reads a flag by its
 * RJ_ENV_* id, so an unregistered name cannot be read anywhere. */
#include <stdlib.h>
#include <string.h>

#include "runtime/rj_runtime.h"

static const rj_env_flag_info flags[RJ_ENV_COUNT] = {
    [RJ_ENV_FAKE_ROCKET] = {"RJ_FAKE_ROCKET",
                            "1: RocketDevice talks to the in-process ioctl fake of /dev/accel/accel0 "
                            "(csrc/rocket/fake_rocket.c) instead of the kernel; jobs run on the simulator"},
    [RJ_ENV_TRACE_STEPS] = {"RJ_TRACE_STEPS",
                            "1: print one line per program step (kind, jobs, host bytes) to stderr"},
    [RJ_ENV_DUMP_REGCMD] = {"RJ_DUMP_REGCMD",
                            "DIR: after load, write each job's task words to DIR/job%04u_task%04u.regcmd "
                            "(u64 little-endian, relocations applied)"},
    [RJ_ENV_POISON_BOS] = {"RJ_POISON_BOS",
                           "1: fill new BOs with 0xAA instead of zeros, so reads of never-written memory show"},
    [RJ_ENV_SIM_FAITHFUL] = {"RJ_SIM_FAITHFUL",
                             "1: every simulator created reproduces the documented LUT quirks it models "
                             "(QUIRK 2 x~0 spike, QUIRK 4 q=0 entry) instead of refusing them, for foreign "
                             "programs (csrc/sim/rj_sim.h RJ_SIM_FAITHFUL)"},
};

uint32_t rj_env_flag_count(void) { return RJ_ENV_COUNT; }

int rj_env_flag_describe(uint32_t id, rj_env_flag_info *out)
{
    if (id >= RJ_ENV_COUNT || !out)
        return RJ_EINVAL;
    *out = flags[id];
    return RJ_OK;
}

const char *rj_env_get(uint32_t id)
{
    if (id >= RJ_ENV_COUNT)
        return NULL;
    const char *v = getenv(flags[id].name);
    return (v && *v) ? v : NULL;
}

int rj_env_on(uint32_t id)
{
    const char *v = rj_env_get(id);
    return v && strcmp(v, "0") != 0;
}
