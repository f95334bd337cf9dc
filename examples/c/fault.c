/* fault.c: a fault demo. 4 tbon daemons in one C process (radix 2: 0 -> {1, 2}, 1 -> {3}).
 * Rank 1, an interior daemon, is stopped the way a crash looks (tbon_abort). The survivors'
 * fault handlers fire (rank 0's confirmation reaches every survivor with a new epoch), rank 3
 * is adopted around the hole, messaging among the survivors goes on (plain and reliable), and a
 * send to the dead rank, plain or reliable, completes with TBON_ERR_NODE_DOWN; the survivors
 * run an allgather (the dead rank excluded) and a barrier. Exits non-zero on any failure.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C").
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define N 4
#define DEAD 1
#define TAG_MSG 100
#define TIMEOUT_MS 60000 /* hang guard only */

struct rank_state {
    tbon_daemon d;
    uint32_t rank;
    atomic_uint failed_mask;   /* every rank any handler call reported */
    atomic_ullong global_epoch; /* epoch of the last TBON_SCOPE_GLOBAL call, 0 if none */
    atomic_uint calls;
    atomic_int gathered; /* allgather 1: 0 not yet, 1 right, 2 wrong */
};

static struct rank_state ranks[N];
static atomic_int send_rc = -1;
static atomic_int rsend_rc = -1;
static atomic_uint barrier_ok, barrier_bad;
static int failures;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "fault: FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
            failures++;                                                   \
        }                                                                 \
    } while (0)

#define CHECK_RC(call)                                                                \
    do {                                                                              \
        tbon_rc rc_ = (call);                                                         \
        CHECK(rc_ == TBON_OK, "%s -> %s (%s)", #call, tbon_strerror(rc_), tbon_last_error()); \
    } while (0)

/* Runs on the loop thread of the daemon that registered it. */
static void on_fault(const uint32_t *failed, size_t nfailed, tbon_scope scope, uint64_t epoch,
                     void *user) {
    struct rank_state *s = user;
    for (size_t i = 0; i < nfailed; i++)
        if (failed[i] < 32)
            atomic_fetch_or(&s->failed_mask, 1u << failed[i]);
    if (scope == TBON_SCOPE_GLOBAL)
        atomic_store(&s->global_epoch, epoch);
    atomic_fetch_add(&s->calls, 1);
}

/* Allgather 1's result at one survivor: the survivors' "rank R" in rank order, DEAD excluded.
 * Sets `gathered` to 1 if right, 2 if not. */
static void on_gathered(tbon_rc rc, uint64_t id, const tbon_contribution *parts, size_t count,
                        const uint32_t *excluded, size_t nexcluded, void *user) {
    struct rank_state *s = user;
    int ok = rc == TBON_OK && id == 1 && count == N - 1 && nexcluded == 1 && excluded[0] == DEAD;
    for (size_t i = 0; ok && i < count; i++) {
        char want[32];
        uint32_t r = (uint32_t)(i < DEAD ? i : i + 1);
        int n = snprintf(want, sizeof want, "rank %u", r);
        ok = parts[i].rank == r && parts[i].len == (size_t)n && memcmp(parts[i].data, want, (size_t)n) == 0;
    }
    atomic_store(&s->gathered, ok ? 1 : 2);
}

static void on_barrier(tbon_rc rc, uint64_t id, const tbon_contribution *parts, size_t count,
                       const uint32_t *excluded, size_t nexcluded, void *user) {
    (void)parts;
    (void)user;
    if (rc == TBON_OK && id == 2 && count == N - 1 && nexcluded == 1 && excluded[0] == DEAD)
        atomic_fetch_add(&barrier_ok, 1);
    else
        atomic_fetch_add(&barrier_bad, 1);
}

static void on_sent(tbon_rc rc, void *user) {
    (void)user;
    atomic_store(&send_rc, (int)rc);
}

static void on_rsent(tbon_rc rc, void *user) {
    (void)user;
    atomic_store(&rsend_rc, (int)rc);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (hang guard only) for a completion callback to store its result. */
static int wait_rc(atomic_int *rc) {
    for (long waited = 0; atomic_load(rc) < 0 && waited < TIMEOUT_MS; waited += 1)
        sleep_ms(1);
    return atomic_load(rc);
}

/* Sends a string from rank `from` to rank `to` and receives it there with a blocking receive. */
static void exchange(uint32_t from, uint32_t to) {
    char msg[64], buf[64];
    int n = snprintf(msg, sizeof msg, "from %u to %u after the fault", from, to);
    size_t len = sizeof buf;
    uint32_t origin = 99;
    CHECK_RC(tbon_send(ranks[from].d, to, TAG_MSG, msg, (size_t)n + 1, NULL, NULL));
    CHECK_RC(tbon_recv_blocking(ranks[to].d, from, TAG_MSG, TIMEOUT_MS, buf, &len, &origin));
    CHECK(origin == from && len == (size_t)n + 1 && strcmp(buf, msg) == 0, "%u -> %u", from, to);
}

/* The same with a reliable send: its completion says TBON_OK once rank `to` has posted it. */
static void exchange_reliable(uint32_t from, uint32_t to) {
    char msg[64], buf[64];
    int n = snprintf(msg, sizeof msg, "reliably from %u to %u", from, to);
    size_t len = sizeof buf;
    uint32_t origin = 99;
    atomic_store(&rsend_rc, -1);
    CHECK_RC(tbon_send_reliable(ranks[from].d, to, TAG_MSG + 1, msg, (size_t)n + 1, on_rsent, NULL));
    CHECK_RC(tbon_recv_blocking(ranks[to].d, from, TAG_MSG + 1, TIMEOUT_MS, buf, &len, &origin));
    CHECK(origin == from && len == (size_t)n + 1 && strcmp(buf, msg) == 0, "reliable %u -> %u", from,
          to);
    CHECK(wait_rc(&rsend_rc) == TBON_OK, "reliable %u -> %u completed %d", from, to,
          atomic_load(&rsend_rc));
}

/* tbon's log records, at INFO and above: counted, and warnings printed. Runs on the logging
 * thread (a daemon's loop thread); must not call tbon. */
static atomic_uint log_records;
static void on_log(tbon_log_level level, const char *target, const char *message, void *user) {
    (void)user;
    atomic_fetch_add(&log_records, 1);
    if (level <= TBON_LOG_WARN)
        fprintf(stderr, "[%s] %s\n", target, message);
}

int main(void) {
    CHECK(tbon_log_callback(NULL, NULL, TBON_LOG_INFO) == TBON_ERR_BAD_PARAM, "NULL log cb");
    CHECK(tbon_log_callback(on_log, NULL, 9) == TBON_ERR_BAD_PARAM, "log level 9");
    CHECK_RC(tbon_log_callback(on_log, NULL, TBON_LOG_INFO));
    CHECK(tbon_log_callback(on_log, NULL, TBON_LOG_INFO) == TBON_ERR_BUSY, "one logger only");
    tbon_config cfg;
    CHECK_RC(tbon_config_new(&cfg));
    CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
    /* The DVM's job key: this program launches the DVM, so it makes a fresh key for it (as
     * `tbon keygen FILE` would) in a new owner-only file; never pass a key on a command line. */
    char key_file[128];
    snprintf(key_file, sizeof key_file, "/tmp/tbon-fault-example-%ld.key", (long)getpid());
    CHECK_RC(tbon_key_generate(key_file));
    CHECK(tbon_key_generate(key_file) == TBON_ERR_CONFIG, "an existing key file is never replaced");
    CHECK_RC(tbon_config_set(cfg, "key_file", key_file));
    {
        /* Interface settings that leave no address of this host: a configuration error. */
        tbon_config none;
        tbon_daemon d;
        CHECK_RC(tbon_config_new(&none));
        CHECK_RC(tbon_config_set(none, "key_file", key_file));
        CHECK_RC(tbon_config_set(none, "if_include", "192.0.2.1/32"));
        CHECK(tbon_start(none, 0, N, NULL, &d) == TBON_ERR_CONFIG, "if_include matching nothing");
        CHECK_RC(tbon_config_free(none));
    }
    CHECK_RC(tbon_config_set(cfg, "radix", "2"));

    char uri[512];
    size_t len = sizeof uri;
    CHECK_RC(tbon_start(cfg, 0, N, NULL, &ranks[0].d));
    CHECK_RC(tbon_contact_uri(ranks[0].d, uri, &len));
    for (uint32_t r = 1; r < N; r++)
        CHECK_RC(tbon_start(cfg, r, N, uri, &ranks[r].d));
    CHECK_RC(tbon_config_free(cfg));
    if (failures)
        return 1;
    for (uint32_t r = 0; r < N; r++) {
        ranks[r].rank = r;
        CHECK_RC(tbon_wait_wired(ranks[r].d, TIMEOUT_MS));
        CHECK_RC(tbon_on_fault(ranks[r].d, on_fault, &ranks[r]));
    }
    exchange(3, 2); /* through rank 1 before the fault */

    /* The crash. */
    CHECK_RC(tbon_abort(ranks[DEAD].d));

    /* Every survivor hears rank 0's confirmation. */
    for (long waited = 0; waited < TIMEOUT_MS; waited += 10) {
        int all = 1;
        for (uint32_t r = 0; r < N; r++)
            if (r != DEAD && atomic_load(&ranks[r].global_epoch) == 0)
                all = 0;
        if (all)
            break;
        sleep_ms(10);
    }
    for (uint32_t r = 0; r < N; r++) {
        if (r == DEAD)
            continue;
        unsigned mask = atomic_load(&ranks[r].failed_mask);
        unsigned long long epoch = atomic_load(&ranks[r].global_epoch);
        CHECK(epoch > 0 && mask == 1u << DEAD, "rank %u: epoch %llu, failed mask %#x", r, epoch, mask);
        tbon_counters c;
        CHECK_RC(tbon_counters_get(ranks[r].d, &c));
        CHECK(c.failed_count == 1 && c.epoch == epoch, "rank %u counters: failed %llu epoch %llu", r,
              (unsigned long long)c.failed_count, (unsigned long long)c.epoch);
        if (r == 3)
            CHECK(c.parent != DEAD, "rank 3 still has the dead rank as its parent");
        printf("fault: rank %u saw rank %d fail (%u handler calls, epoch %llu, parent %d)\n", r, DEAD,
               atomic_load(&ranks[r].calls), epoch, c.parent == TBON_RANK_NONE ? -1 : (int)c.parent);
    }

    /* Messaging goes on among the survivors, including through the repaired tree. */
    exchange(3, 2);
    exchange(2, 3);
    exchange(0, 3);
    exchange(3, 0);
    exchange_reliable(3, 2);
    exchange_reliable(0, 3);

    /* A send to the dead rank fails in its completion. */
    CHECK_RC(tbon_send(ranks[2].d, DEAD, TAG_MSG, "x", 1, on_sent, NULL));
    for (long waited = 0; atomic_load(&send_rc) < 0 && waited < TIMEOUT_MS; waited += 1)
        sleep_ms(1);
    CHECK(atomic_load(&send_rc) == TBON_ERR_NODE_DOWN, "send to the dead rank: %d",
          atomic_load(&send_rc));
    atomic_store(&rsend_rc, -1);
    CHECK_RC(tbon_send_reliable(ranks[2].d, DEAD, TAG_MSG, "x", 1, on_rsent, NULL));
    CHECK(wait_rc(&rsend_rc) == TBON_ERR_NODE_DOWN, "reliable send to the dead rank: %d",
          atomic_load(&rsend_rc));
    {
        tbon_counters c;
        CHECK_RC(tbon_counters_get(ranks[2].d, &c));
        CHECK(c.relm_posted == 1 && c.relm_unacked == 0, "rank 2: relm_posted %llu, relm_unacked %llu",
              (unsigned long long)c.relm_posted, (unsigned long long)c.relm_unacked);
    }
    /* The aborted daemon's handle is still valid until freed, and says it is shut down. */
    CHECK(tbon_send(ranks[DEAD].d, 0, TAG_MSG, "x", 1, NULL, NULL) == TBON_ERR_SHUT_DOWN,
          "send from the aborted daemon");

    /* An allgather among the survivors: the dead rank is excluded, the others ordered by rank. */
    for (uint32_t r = 0; r < N; r++) {
        if (r == DEAD)
            continue;
        char mine[32];
        int n = snprintf(mine, sizeof mine, "rank %u", r);
        CHECK_RC(tbon_allgather(ranks[r].d, 1, mine, (size_t)n, on_gathered, &ranks[r]));
    }
    for (long waited = 0; waited < TIMEOUT_MS; waited += 1) {
        int all = 1;
        for (uint32_t r = 0; r < N; r++)
            if (r != DEAD && atomic_load(&ranks[r].gathered) == 0)
                all = 0;
        if (all)
            break;
        sleep_ms(1);
    }
    for (uint32_t r = 0; r < N; r++)
        if (r != DEAD)
            CHECK(atomic_load(&ranks[r].gathered) == 1, "rank %u: allgather result %d", r,
                  atomic_load(&ranks[r].gathered));
    /* A barrier: every survivor but rank 0 enters it without waiting (a barrier is an allgather
     * of nothing), then rank 0 waits in tbon_barrier until all have. */
    for (uint32_t r = 1; r < N; r++)
        if (r != DEAD)
            CHECK_RC(tbon_allgather(ranks[r].d, 2, NULL, 0, on_barrier, &ranks[r]));
    CHECK_RC(tbon_barrier(ranks[0].d, 2, TIMEOUT_MS));
    CHECK(tbon_barrier(ranks[0].d, 2, TIMEOUT_MS) == TBON_ERR_DUPLICATE, "barrier id reused");
    for (long waited = 0; atomic_load(&barrier_ok) + atomic_load(&barrier_bad) < N - 2 &&
                          waited < TIMEOUT_MS;
         waited += 1)
        sleep_ms(1);
    CHECK(atomic_load(&barrier_ok) == N - 2 && atomic_load(&barrier_bad) == 0,
          "barrier results: %u right, %u wrong", atomic_load(&barrier_ok), atomic_load(&barrier_bad));

    CHECK_RC(tbon_shutdown_dvm(ranks[0].d));
    for (uint32_t r = 0; r < N; r++) {
        CHECK_RC(tbon_wait_stopped(ranks[r].d, TIMEOUT_MS));
        /* Why each stopped: rank 0 asked, the others heard rank 0 shut the DVM down, and the
         * dead one was aborted. A supervisor treats any other reason as a failure. */
        tbon_stop why = TBON_STOP_RUNNING;
        char text[128];
        size_t len = sizeof text;
        CHECK_RC(tbon_stop_reason(ranks[r].d, &why, text, &len));
        tbon_stop want = r == 0      ? TBON_STOP_REQUESTED
                         : r == DEAD ? TBON_STOP_ABORTED
                                     : TBON_STOP_DVM_SHUTDOWN;
        CHECK(why == want, "rank %u stopped with reason %d (%s), expected %d", r, (int)why, text,
              (int)want);
        size_t need = 0; /* a size query: no buffer */
        CHECK_RC(tbon_stop_reason(ranks[r].d, &why, NULL, &need));
        CHECK(need == strlen(text) + 1, "rank %u: the reason's text needs %zu bytes", r, need);
        CHECK_RC(tbon_free(ranks[r].d));
    }
    unlink(key_file);
    /* Wire-up and the repair log at INFO: the records reached the callback. */
    CHECK(atomic_load(&log_records) > 0, "no log record reached the callback");
    if (failures) {
        fprintf(stderr, "fault: %d check(s) failed\n", failures);
        return 1;
    }
    printf("fault: ok\n");
    return 0;
}
