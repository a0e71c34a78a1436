/* The one table of environment flags and the one grammar their values follow (design.md
 * convention 11). Code reads a flag by its RJ_ENV_* id, so an unregistered name cannot be read
 * anywhere. rockjit/debugflags.py reads this table and these words through rj_env_flag_describe
 * and rj_env_bool_word (tests/reliability/test_envflags.py checks both sides agree).
 *
 * A switch (RJ_ENV_BOOL) takes one of the words below, case-insensitively; an empty value is
 * the same as unset. Any other value is refused with the flag's name and the accepted words,
 * because a typo (RJ_FAKE_ROCKET=flase) that silently picked a side would run the rocket
 * backend on the simulator, or the other way round. A text flag (RJ_ENV_TEXT, a directory)
 * takes its value as it is. To add a flag: one enum id in rj_runtime.h/runtime.cdef, one row
 * here. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/rj_runtime.h"

static const rj_env_flag_info flags[RJ_ENV_COUNT] = {
    [RJ_ENV_FAKE_ROCKET] = {"RJ_FAKE_ROCKET",
                            "on: RocketDevice talks to the in-process ioctl fake of /dev/accel/accel0 "
                            "(csrc/rocket/fake_rocket.c) instead of the kernel; jobs run on the simulator",
                            RJ_ENV_BOOL, 0},
    [RJ_ENV_TRACE_STEPS] = {"RJ_TRACE_STEPS",
                            "on: print one line per program step (kind, jobs, host bytes, wall ns) "
                            "to stderr",
                            RJ_ENV_BOOL, 0},
    [RJ_ENV_DUMP_REGCMD] = {"RJ_DUMP_REGCMD",
                            "DIR: after load, write each job's task words to DIR/job%04u_task%04u.regcmd "
                            "(u64 little-endian, relocations applied)",
                            RJ_ENV_TEXT, 0},
    [RJ_ENV_POISON_BOS] = {"RJ_POISON_BOS",
                           "on: fill new BOs with 0xAA instead of zeros, so reads of never-written memory show",
                           RJ_ENV_BOOL, 0},
    [RJ_ENV_SIM_FAITHFUL] = {"RJ_SIM_FAITHFUL",
                             "on: every simulator created reproduces the documented LUT quirks it models "
                             "(QUIRK 2 x~0 spike, QUIRK 4 q=0 entry) instead of refusing them, for foreign "
                             "programs (csrc/sim/rj_sim.h RJ_SIM_FAITHFUL)",
                             RJ_ENV_BOOL, 0},
    [RJ_ENV_HOST_THREADS] = {"RJ_HOST_THREADS",
                             "N: host steps of at least 256 KiB split over N threads (1..8; 1 = one "
                             "thread; unset: 3, the board's A76 cores but one, or the host's CPUs but one if fewer; "
                             "csrc/runtime/rj_host_pool.h). "
                             "rockjit.runtime.set_host_threads overrides it",
                             RJ_ENV_TEXT, 0},
};

/* The switch words, "on" word first in each pair. */
static const struct {
    const char *word;
    int on;
} bool_words[] = {
    {"1", 1}, {"0", 0}, {"true", 1}, {"false", 0}, {"yes", 1}, {"no", 0}, {"on", 1}, {"off", 0},
};
#define N_BOOL_WORDS (sizeof(bool_words) / sizeof(bool_words[0]))
#define ACCEPTED "1/0, true/false, yes/no, on/off (any case), or empty/unset for off"

uint32_t rj_env_flag_count(void) { return RJ_ENV_COUNT; }

int rj_env_flag_describe(uint32_t id, rj_env_flag_info *out)
{
    if (id >= RJ_ENV_COUNT || !out)
        return RJ_EINVAL;
    *out = flags[id];
    return RJ_OK;
}

const char *rj_env_bool_word(uint32_t i, int *on)
{
    if (i >= N_BOOL_WORDS)
        return NULL;
    if (on)
        *on = bool_words[i].on;
    return bool_words[i].word;
}

int rj_env_parse_bool(const char *value, int *on)
{
    if (!on)
        return RJ_EINVAL;
    *on = 0;
    if (!value || !*value)
        return RJ_OK;
    for (uint32_t i = 0; i < N_BOOL_WORDS; i++)
        if (strcasecmp(value, bool_words[i].word) == 0) {
            *on = bool_words[i].on;
            return RJ_OK;
        }
    return RJ_EINVAL;
}

const char *rj_env_get(uint32_t id)
{
    if (id >= RJ_ENV_COUNT)
        return NULL;
    const char *v = getenv(flags[id].name);
    return (v && *v) ? v : NULL;
}

int rj_env_switch(uint32_t id, int *on, rj_err *err)
{
    if (!on)
        return rj_fail(err, RJ_EINVAL, "rj_env_switch: NULL output pointer");
    *on = 0;
    if (id >= RJ_ENV_COUNT)
        return rj_fail(err, RJ_EINVAL, "rj_env_switch: flag id %u is not registered", id);
    if (flags[id].kind != RJ_ENV_BOOL)
        return rj_fail(err, RJ_EINVAL, "rj_env_switch: %s is a text flag, not a switch", flags[id].name);
    const char *v = rj_env_get(id);
    if (rj_env_parse_bool(v, on) != RJ_OK)
        return rj_fail(err, RJ_EINVAL, "environment flag %s=%.64s%s is not a switch value; use " ACCEPTED
                       " (%s)", flags[id].name, v, strlen(v) > 64 ? "..." : "", flags[id].description);
    return RJ_OK;
}
