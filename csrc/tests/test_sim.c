/* The simulator's self-checks under the sanitizers: every MAC kernel against a plain loop and
 * the two-thread split bit for bit against one thread (ASan/UBSan: bounds of the packing and
 * edge tiles; TSan: the thread split and the once-probed host facts), and the fp16
 * conversions against the portable round-to-nearest-even reference. */
#include <pthread.h>

#include "sim/rj_sim_debug.h"
#include "test_util.h"

static void test_mac_kernels(void)
{
    int rc = rj_sim_mac_selftest();
    CHECK(rc == 0, "rj_sim_mac_selftest returned %d (shape index + 1; 100 + shape index = not deterministic)", rc);
}

static void *selftest_thread(void *arg)
{
    *(int *)arg = rj_sim_mac_selftest();
    return NULL;
}

/* Several simulators run at once in one process (one per fake rocket fd): the MAC code must
 * hold no shared mutable state. */
static void test_mac_kernels_concurrently(void)
{
    pthread_t th[3];
    int rc[3] = {-2, -2, -2};
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&th[i], NULL, selftest_thread, &rc[i]) == 0, "thread %d", i);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(rc[i] == 0, "thread %d: selftest %d", i, rc[i]);
    }
}

static void test_f16(void)
{
    int rc = rj_sim_f16_selftest();
    CHECK(rc == 0, "rj_sim_f16_selftest returned %d", rc);
}

int main(void)
{
    RUN(test_mac_kernels);
    RUN(test_mac_kernels_concurrently);
    RUN(test_f16);
    TEST_MAIN_END();
}
