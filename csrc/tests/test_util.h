#ifndef TEST_UTIL_H
#define TEST_UTIL_H
/* A minimal harness: CHECK records a failure and continues; main returns the count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_checks;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        test_checks++;                                                                     \
        if (!(cond)) {                                                                     \
            test_failures++;                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

/* rc must be RJ_OK; print the error message otherwise. */
#define CHECK_OK(rc, err) CHECK((rc) == 0, "rc %d: %s", (int)(rc), (err).msg)
/* rc must be `want` and the message must mention `needle`. */
#define CHECK_FAILS(rc, want, err, needle)                                                 \
    CHECK((rc) == (want) && strstr((err).msg, (needle)) != NULL,                           \
          "rc %d (want %d), msg '%s' (want it to mention '%s')", (int)(rc), (int)(want),     \
          (err).msg, (needle))

#define RUN(fn)                                                                            \
    do {                                                                                   \
        int before = test_failures;                                                        \
        fn();                                                                              \
        printf("%-40s %s\n", #fn, test_failures == before ? "ok" : "FAILED");              \
    } while (0)

#define TEST_MAIN_END()                                                                    \
    do {                                                                                   \
        printf("%d checks, %d failures\n", test_checks, test_failures);                    \
        return test_failures ? 1 : 0;                                                      \
    } while (0)

/* Read a whole file; NULL when absent. */
static inline unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        *size = (size_t)n;
    return buf;
}

#endif
