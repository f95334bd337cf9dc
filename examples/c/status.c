/* status.c: an operator's view of a DVM from C. 7 tbon daemons in one process (radix 2).
 * Clock offsets from rank 0 (tbon_status_clock) lie within their bounds of 0 (one clock).
 * Rank 0's status (tbon_status_get) shows every daemon in one healthy subtree; the same view
 * comes through the operator's path (tbon_status_query with the credential that
 * tbon_operator_credential derives from the job key), while the job key itself is refused as
 * a credential. After rank 1 (interior) is aborted, the status shows it dead and everyone
 * else answering; its JSON names it. Exits non-zero on any failure.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C").
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define N 7
#define DEAD 1
#define BUDGET_MS 2000
#define TIMEOUT_MS 60000 /* hang guard only */

static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "status: FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            failures++;                                                    \
        }                                                                  \
    } while (0)

#define CHECK_RC(call)                                                                \
    do {                                                                              \
        tbon_rc rc_ = (call);                                                         \
        CHECK(rc_ == TBON_OK, "%s -> %s (%s)", #call, tbon_strerror(rc_), tbon_last_error()); \
    } while (0)

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The status's JSON, in a buffer the caller frees (the two-call size query). */
static char *json_of(tbon_status s) {
    size_t len = 0;
    CHECK(tbon_status_json(s, NULL, &len) == TBON_ERR_TOO_LARGE && len > 1, "JSON size query");
    char *buf = malloc(len);
    if (!buf)
        return NULL;
    CHECK_RC(tbon_status_json(s, buf, &len));
    return buf;
}

int main(void) {
    tbon_daemon d[N];
    tbon_config cfg;
    char key_file[128], cred_file[128];
    snprintf(key_file, sizeof key_file, "/tmp/tbon-status-example-%ld.key", (long)getpid());
    snprintf(cred_file, sizeof cred_file, "/tmp/tbon-status-example-%ld.cred", (long)getpid());
    CHECK_RC(tbon_key_generate(key_file));
    CHECK_RC(tbon_operator_credential(key_file, cred_file));
    CHECK(tbon_operator_credential(key_file, cred_file) == TBON_ERR_CONFIG, "never replaced");
    CHECK_RC(tbon_config_new(&cfg));
    CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
    CHECK_RC(tbon_config_set(cfg, "key_file", key_file));
    CHECK_RC(tbon_config_set(cfg, "radix", "2"));
    char uri[512];
    size_t len = sizeof uri;
    CHECK_RC(tbon_start(cfg, 0, N, NULL, &d[0]));
    CHECK_RC(tbon_contact_uri(d[0], uri, &len));
    for (uint32_t r = 1; r < N; r++)
        CHECK_RC(tbon_start(cfg, r, N, uri, &d[r]));
    CHECK_RC(tbon_config_free(cfg));
    if (failures)
        return 1;
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_wait_wired(d[r], TIMEOUT_MS));

    /* From the daemon itself. */
    tbon_status s;
    tbon_status_counts c;
    CHECK_RC(tbon_status_get(d[0], BUDGET_MS, 0, &s));
    CHECK_RC(tbon_status_summary(s, &c));
    CHECK(c.size == N && c.radix == 2 && c.from == 0 && c.answered == N && c.dead == 0 &&
              c.no_answer == 0,
          "healthy: size %u answered %u dead %u", c.size, c.answered, c.dead);
    {
        /* Summarised (no TBON_STATUS_ALL): only the daemons in detail have offsets. */
        int64_t offset;
        uint64_t bound;
        CHECK(tbon_status_clock(s, 1, &offset, &bound) == TBON_ERR_NODE_DOWN, "rank 1 folded");
        CHECK(tbon_status_clock(s, 1, NULL, &bound) == TBON_ERR_BAD_PARAM, "NULL offset");
    }
    for (uint32_t r = 0; r < N; r++) {
        tbon_rank_state st;
        CHECK_RC(tbon_status_rank(s, r, &st));
        CHECK(st == TBON_RANK_HEALTHY, "rank %u: state %d", r, (int)st);
    }
    tbon_rank_state st;
    CHECK(tbon_status_rank(s, N, &st) == TBON_ERR_RANK_OUT_OF_RANGE, "rank N");
    CHECK_RC(tbon_status_free(s));
    CHECK(tbon_status_free(s) == TBON_ERR_BAD_HANDLE, "freed twice");
    CHECK(tbon_status_get(d[0], BUDGET_MS, 0x80, &s) == TBON_ERR_BAD_PARAM, "unknown flags");

    /* As an operator's tool, with the credential; every daemon in detail. */
    CHECK_RC(tbon_status_query(uri, cred_file, BUDGET_MS, TBON_STATUS_ALL, &s));
    CHECK_RC(tbon_status_summary(s, &c));
    CHECK(c.answered == N, "the tool's view: answered %u", c.answered);
    /* One process, one clock: every daemon's offset from rank 0 lies within its bound of 0. */
    for (uint32_t r = 0; r < N; r++) {
        int64_t offset = 1;
        uint64_t bound = 0;
        CHECK_RC(tbon_status_clock(s, r, &offset, &bound));
        CHECK((offset < 0 ? (uint64_t)-offset : (uint64_t)offset) <= bound,
              "rank %u: clock offset %lld ns beyond its bound %llu ns", r, (long long)offset,
              (unsigned long long)bound);
    }
    char *json = json_of(s);
    CHECK(json && strstr(json, "\"part\":\"daemon\"") != NULL, "detail in the JSON: %s", json);
    free(json);
    CHECK_RC(tbon_status_free(s));
    CHECK(tbon_status_query(uri, key_file, BUDGET_MS, 0, &s) == TBON_ERR_CREDENTIAL,
          "the job key is not the operator credential: %s", tbon_last_error());
    CHECK(tbon_status_query("not a uri", cred_file, BUDGET_MS, 0, &s) == TBON_ERR_BAD_PARAM,
          "a bad URI");

    /* Rank 1 crashes: dead once the DVM repaired, the rest answering. */
    CHECK_RC(tbon_abort(d[DEAD]));
    int seen = 0;
    for (long waited = 0; waited < TIMEOUT_MS && !seen; waited += 100) {
        CHECK_RC(tbon_status_get(d[0], BUDGET_MS, 0, &s));
        CHECK_RC(tbon_status_summary(s, &c));
        if (c.dead == 1 && c.answered == N - 1 && !c.views_differ) {
            CHECK_RC(tbon_status_rank(s, DEAD, &st));
            CHECK(st == TBON_RANK_DEAD, "rank %d: state %d", DEAD, (int)st);
            json = json_of(s);
            CHECK(json && strstr(json, "\"dead\":[1]") != NULL, "%s", json);
            free(json);
            seen = 1;
        }
        CHECK_RC(tbon_status_free(s));
        if (!seen)
            sleep_ms(100);
    }
    CHECK(seen, "no status with rank %d dead and the rest answering", DEAD);
    printf("status: %u daemons, rank %d dead, %u answering (epoch %llu)\n", c.size, DEAD,
           c.answered, (unsigned long long)c.epoch);

    CHECK_RC(tbon_shutdown_dvm(d[0]));
    for (uint32_t r = 0; r < N; r++) {
        CHECK_RC(tbon_wait_stopped(d[r], TIMEOUT_MS));
        CHECK_RC(tbon_free(d[r]));
    }
    unlink(key_file);
    unlink(cred_file);
    if (failures) {
        fprintf(stderr, "status: %d check(s) failed\n", failures);
        return 1;
    }
    printf("status: ok\n");
    return 0;
}
