/* The host-step worker pool and thread-count setting (rj_host_pool.h).
 *
 * Items are handed out by an atomic counter: whichever thread is free takes the next one, so a
 * worker that wakes late (a loaded host) costs only its share, and the caller alone finishes
 * any item no worker took. A job on offer names how many workers may join it; workers beyond
 * that keep sleeping. One job is on offer at a time: a second caller runs its items alone. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/rj_host_pool.h"
#include "runtime/rj_runtime.h"

typedef struct par_job {
    rj_host_item_fn fn;
    void *ctx;
    uint32_t nitems;
    atomic_uint next;
    uint64_t gen;
    uint32_t helpers;     /* workers that joined (guarded by pool.mu) */
    uint32_t max_helpers;
    uint32_t active;      /* workers running its items now (guarded by pool.mu) */
    uint32_t err_item;    /* lowest failing item (guarded by pool.mu), UINT32_MAX: none */
    int rc;
    rj_err err;
} par_job;

static struct {
    pthread_mutex_t mu;
    pthread_mutex_t shutdown_mu; /* one shutdown at a time */
    pthread_cond_t wake, done;
    pthread_t th[RJ_HOST_THREADS_MAX];
    uint32_t nworkers;
    uint32_t stopping;
    par_job *cur;
    uint64_t gen;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, {0}, 0, 0, NULL, 0};

static atomic_uint threads_setting; /* 0: RJ_HOST_THREADS or the default */

/* ---- the setting ------------------------------------------------------------------------ */

int rj_host_threads_set(uint32_t n, rj_err *err)
{
    if (n > RJ_HOST_THREADS_MAX)
        return rj_fail(err, RJ_EINVAL, "host threads: %u is more than the %d the runtime runs "
                       "(use 1..%d, or 0 for RJ_HOST_THREADS / the default %d)", n,
                       RJ_HOST_THREADS_MAX, RJ_HOST_THREADS_MAX, RJ_HOST_THREADS_DEFAULT);
    atomic_store(&threads_setting, n);
    return RJ_OK;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static uint32_t default_threads;

static void probe_default(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    default_threads = n - 1 >= RJ_HOST_THREADS_DEFAULT ? RJ_HOST_THREADS_DEFAULT
                      : n >= 2 ? (uint32_t)(n - 1) : 1;
}

uint32_t rj_host_threads_default(void)
{
    pthread_once(&default_once, probe_default);
    return default_threads;
}

int rj_host_threads_get(uint32_t *out, rj_err *err)
{
    uint32_t n = atomic_load(&threads_setting);
    if (!out)
        return rj_fail(err, RJ_EINVAL, "rj_host_threads_get: NULL output pointer");
    *out = 1;
    if (n) {
        *out = n;
        return RJ_OK;
    }
    const char *v = rj_env_get(RJ_ENV_HOST_THREADS);
    if (!v) {
        *out = rj_host_threads_default();
        return RJ_OK;
    }
    char *end = NULL;
    unsigned long k = strtoul(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end || k < 1 || k > RJ_HOST_THREADS_MAX)
        return rj_fail(err, RJ_EINVAL, "environment flag RJ_HOST_THREADS=%.32s is not a thread "
                       "count: use an integer from 1 (host steps on one thread) to %d, or unset "
                       "it for the default %d", v, RJ_HOST_THREADS_MAX, RJ_HOST_THREADS_DEFAULT);
    *out = (uint32_t)k;
    return RJ_OK;
}

uint32_t rj_host_split_threads(uint64_t bytes, uint64_t extent, uint32_t threads)
{
    if (threads > RJ_HOST_THREADS_MAX)
        threads = RJ_HOST_THREADS_MAX;
    if (threads <= 1 || bytes < RJ_HOST_SPLIT_MIN_BYTES || extent < 2)
        return 1;
    return extent < threads ? (uint32_t)extent : threads;
}

uint32_t rj_host_split_items(uint64_t extent, uint32_t threads)
{
    uint64_t n = 4ull * threads;
    return (uint32_t)(extent < n ? extent : n);
}

/* ---- the pool --------------------------------------------------------------------------- */

static void run_items(par_job *j)
{
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->nitems)
            return;
        rj_err e;
        memset(&e, 0, sizeof e);
        int rc = j->fn(j->ctx, i, &e);
        if (rc) {
            pthread_mutex_lock(&pool.mu);
            if (i < j->err_item) {
                j->err_item = i;
                j->rc = rc;
                j->err = e;
            }
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!pool.stopping && (!pool.cur || pool.cur->gen == seen))
            pthread_cond_wait(&pool.wake, &pool.mu);
        if (pool.stopping)
            break;
        par_job *j = pool.cur;
        seen = j->gen;
        if (j->helpers >= j->max_helpers)
            continue; /* enough workers on this one */
        j->helpers++;
        j->active++;
        pthread_mutex_unlock(&pool.mu);
        run_items(j);
        pthread_mutex_lock(&pool.mu);
        j->active--;
        pthread_cond_broadcast(&pool.done);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

/* fork() keeps only the calling thread: the child starts with no workers. */
static void pool_prefork(void) { pthread_mutex_lock(&pool.mu); }
static void pool_postfork_parent(void) { pthread_mutex_unlock(&pool.mu); }
static void pool_postfork_child(void)
{
    pthread_mutex_init(&pool.mu, NULL);
    pthread_mutex_init(&pool.shutdown_mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.nworkers = 0;
    pool.stopping = 0;
    pool.cur = NULL;
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void)
{
    pthread_atfork(pool_prefork, pool_postfork_parent, pool_postfork_child);
}

/* pool.mu held: start workers until there are `want` (fewer if the system refuses). */
static void grow_workers(uint32_t want)
{
    sigset_t all, old;
    /* workers block every signal: process signals (Ctrl-C in Python) stay with the threads
     * that handle them */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.nworkers < want &&
           pthread_create(&pool.th[pool.nworkers], NULL, worker_main, NULL) == 0) {
        /* named here, before anyone can ask, not by the worker when it first runs: a debugger,
         * `top -H` and the tests tell our workers from the threads other libraries in the
         * process start and stop on their own (best effort: a name is never needed to run) */
        (void)pthread_setname_np(pool.th[pool.nworkers], "rj-host");
        pool.nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int rj_host_parallel(uint32_t nitems, uint32_t threads, rj_host_item_fn fn, void *ctx,
                     uint32_t *used, rj_err *err)
{
    par_job j;
    memset(&j, 0, sizeof j);
    j.fn = fn;
    j.ctx = ctx;
    j.nitems = nitems;
    atomic_init(&j.next, 0);
    j.err_item = UINT32_MAX;
    if (threads > RJ_HOST_THREADS_MAX)
        threads = RJ_HOST_THREADS_MAX;
    uint32_t offered = 1;
    if (threads > 1 && nitems > 1) {
        pthread_once(&atfork_once, register_atfork);
        pthread_mutex_lock(&pool.mu);
        if (!pool.cur && !pool.stopping) {
            grow_workers(threads - 1);
            if (pool.nworkers) { /* fewer than asked when the system refused a thread */
                j.max_helpers = pool.nworkers < threads - 1 ? pool.nworkers : threads - 1;
                j.gen = ++pool.gen;
                pool.cur = &j;
                offered = j.max_helpers + 1;
                pthread_cond_broadcast(&pool.wake);
            }
        }
        pthread_mutex_unlock(&pool.mu);
    }
    run_items(&j);
    if (offered > 1) {
        pthread_mutex_lock(&pool.mu);
        pool.cur = NULL; /* withdraw the offer, then wait for the items workers took */
        while (j.active)
            pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    if (used)
        *used = offered;
    if (j.err_item != UINT32_MAX) {
        if (err)
            *err = j.err;
        return j.rc;
    }
    return RJ_OK;
}

void rj_host_pool_shutdown(void)
{
    pthread_mutex_lock(&pool.shutdown_mu);
    pthread_mutex_lock(&pool.mu);
    pool.stopping = 1;
    uint32_t n = pool.nworkers;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    /* no worker starts while stopping is set, so th[0..n) are all of them */
    for (uint32_t i = 0; i < n; i++)
        pthread_join(pool.th[i], NULL);
    pthread_mutex_lock(&pool.mu);
    pool.nworkers = 0;
    pool.stopping = 0;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.shutdown_mu);
}

uint32_t rj_host_pool_workers(void)
{
    pthread_mutex_lock(&pool.mu);
    uint32_t n = pool.nworkers;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

/* Joined when the library unloads (process exit), so no worker outlives it. */
__attribute__((destructor)) static void pool_fini(void) { rj_host_pool_shutdown(); }
