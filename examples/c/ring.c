/* ring.c: 8 tbon daemons in one C process pass a token around a ring 1,000 times.
 *
 * Rank r receives the token (a hop counter) from rank r-1 and sends it, incremented, to rank
 * (r+1) mod 8, from inside its receive callback. Each rank checks every value it gets. Rank 0
 * starts the token and stops after LAPS laps. Also checks the blocking receive (with
 * truncation), misuse errors, a large broadcast pipelined in parts (`bcast_part_bytes`),
 * counters and a clean stop. Exits non-zero on any failure.
 *
 * Build and run (see README.md, "Using tbon from C"):
 *   cargo build --release --lib
 *   cc -std=c11 -Iinclude examples/c/ring.c -Ltarget/release -ltbon \
 *      -Wl,-rpath,$PWD/target/release -o ring && ./ring
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tbon.h"

#define N 8
#define LAPS 1000
#define TAG_TOKEN 100
#define TAG_HELLO 101
#define TAG_BIG 102
#define BIG_LEN 100000 /* broadcast in parts of 4096 bytes, delivered whole */
#define TIMEOUT_MS 60000 /* hang guard only */

struct rank_state {
    tbon_daemon d;
    uint32_t rank;
    atomic_uint received; /* tokens received */
    atomic_uint errors;
    atomic_uint big; /* large broadcasts received whole and right */
};

static struct rank_state ranks[N];
static atomic_int done;
static atomic_uint send_failures;

static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "ring: FAILED %s:%d: ", __FILE__, __LINE__);   \
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

static void on_sent(tbon_rc rc, void *user) {
    (void)user;
    if (rc != TBON_OK)
        atomic_fetch_add(&send_failures, 1);
}

/* Runs on rank r's loop thread. */
static void on_token(uint32_t origin, uint32_t tag, const uint8_t *data, size_t len, void *user) {
    struct rank_state *s = user;
    uint64_t hop;
    unsigned k = atomic_fetch_add(&s->received, 1); /* tokens seen before this one */
    uint32_t prev = (s->rank + N - 1) % N;
    if (origin != prev || tag != TAG_TOKEN || len != sizeof hop) {
        atomic_fetch_add(&s->errors, 1);
        return;
    }
    memcpy(&hop, data, sizeof hop);
    /* Rank r > 0 gets hop k*N + r; rank 0 gets (k+1)*N. */
    uint64_t want = s->rank == 0 ? (uint64_t)(k + 1) * N : (uint64_t)k * N + s->rank;
    if (hop != want) {
        atomic_fetch_add(&s->errors, 1);
        return;
    }
    if (s->rank == 0 && k + 1 == LAPS) {
        atomic_store(&done, 1);
        return;
    }
    hop++;
    /* Allowed in a callback: send. The payload is copied, so a stack buffer is fine. */
    if (tbon_send(s->d, (s->rank + 1) % N, TAG_TOKEN, &hop, sizeof hop, on_sent, NULL) != TBON_OK)
        atomic_fetch_add(&s->errors, 1);
    /* Not allowed in a callback: blocking calls return TBON_ERR_BUSY. */
    tbon_counters c;
    if (tbon_counters_get(s->d, &c) != TBON_ERR_BUSY)
        atomic_fetch_add(&s->errors, 1);
}

/* The large broadcast: every byte is a function of its position. */
static uint8_t big_byte(size_t i) { return (uint8_t)(i * 7 + i / 251); }

/* Runs on rank r's loop thread: the whole payload, once, however rank 0 split it. */
static void on_big(uint32_t origin, uint32_t tag, const uint8_t *data, size_t len, void *user) {
    struct rank_state *s = user;
    int ok = origin == 2 && tag == TAG_BIG && len == BIG_LEN;
    for (size_t i = 0; ok && i < len; i++)
        ok = data[i] == big_byte(i);
    if (ok)
        atomic_fetch_add(&s->big, 1);
    else
        atomic_fetch_add(&s->errors, 1);
}

static atomic_int big_done = -1;

static void on_big_done(tbon_rc rc, void *user) {
    (void)user;
    atomic_store(&big_done, (int)rc);
}

static atomic_uint lent_freed;

/* Free callback of tbon_send_nocopy: any thread, exactly once per buffer. */
static void free_lent(void *data, void *user) {
    (void)user;
    free(data);
    atomic_fetch_add(&lent_freed, 1);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    tbon_config cfg;
    CHECK_RC(tbon_config_new(&cfg));
    CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
    /* The DVM's job key (`tbon keygen FILE` makes one); never pass it on a command line. */
    const char *key_file = getenv("TBON_KEY_FILE");
    CHECK(key_file != NULL, "set TBON_KEY_FILE to a job key file (tbon keygen FILE)");
    CHECK_RC(tbon_config_set(cfg, "key_file", key_file));
    CHECK(tbon_config_set(cfg, "no_such_setting", "1") == TBON_ERR_CONFIG, "unknown setting");
    CHECK(tbon_config_set(cfg, "radix", NULL) == TBON_ERR_BAD_PARAM, "NULL value");
    CHECK_RC(tbon_config_set(cfg, "radix", "2")); /* a deep tree: tokens are relayed */
    /* Rank 0 splits broadcasts above 4 KiB into parts that every daemon forwards as they
     * arrive (pipelined); every daemon still delivers the payload whole. */
    CHECK_RC(tbon_config_set(cfg, "bcast_part_bytes", "4096"));

    /* Rank 0 first; the others join with its contact URI. */
    char uri[512];
    size_t len = sizeof uri;
    CHECK_RC(tbon_start(cfg, 0, N, NULL, &ranks[0].d));
    CHECK_RC(tbon_contact_uri(ranks[0].d, uri, &len));
    size_t small = 4;
    CHECK(tbon_contact_uri(ranks[0].d, uri, &small) == TBON_ERR_TOO_LARGE && small == len,
          "short URI buffer");
    /* Its addresses, one per network it listens on (here loopback only). */
    size_t naddr = 0;
    CHECK_RC(tbon_address_count(ranks[0].d, &naddr));
    CHECK(naddr >= 1, "%zu addresses", naddr);
    char addr[64];
    size_t alen = sizeof addr;
    CHECK_RC(tbon_address(ranks[0].d, 0, addr, &alen));
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0 && strstr(uri, addr + 10) != NULL,
          "address %s not in %s", addr, uri);
    alen = sizeof addr;
    CHECK(tbon_address(ranks[0].d, naddr, addr, &alen) == TBON_ERR_BAD_PARAM, "index past the end");
    for (uint32_t r = 1; r < N; r++)
        CHECK_RC(tbon_start(cfg, r, N, uri, &ranks[r].d));
    CHECK_RC(tbon_config_free(cfg));
    CHECK(tbon_config_free(cfg) == TBON_ERR_BAD_HANDLE, "double config free");
    if (failures)
        return 1;

    for (uint32_t r = 0; r < N; r++) {
        uint32_t rank = 99, size = 0;
        CHECK_RC(tbon_rank(ranks[r].d, &rank));
        CHECK_RC(tbon_size(ranks[r].d, &size));
        CHECK(rank == r && size == N, "rank %u size %u", rank, size);
        ranks[r].rank = r;
        CHECK_RC(tbon_wait_wired(ranks[r].d, TIMEOUT_MS));
    }

    /* Misuse gives error codes, not crashes. */
    CHECK(tbon_send(ranks[0].d, 1, 5, "x", 1, NULL, NULL) == TBON_ERR_RESERVED_TAG, "reserved tag");
    CHECK(tbon_send(ranks[0].d, N, TAG_HELLO, "x", 1, NULL, NULL) == TBON_ERR_RANK_OUT_OF_RANGE,
          "rank out of range");
    CHECK(tbon_send(ranks[0].d, 1, TAG_HELLO, NULL, 1, NULL, NULL) == TBON_ERR_BAD_PARAM, "NULL data");
    CHECK(tbon_send(12345678, 1, TAG_HELLO, "x", 1, NULL, NULL) == TBON_ERR_BAD_HANDLE, "bad handle");
    CHECK(tbon_recv(ranks[0].d, 1, TAG_HELLO, 0, NULL, NULL) == TBON_ERR_BAD_PARAM, "NULL callback");

    /* Blocking receive: rank 0 says hello to everyone, with a bigger message to rank 1. */
    for (uint32_t r = 1; r < N; r++) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "hello %u", r);
        if (r % 2) { /* copied: the stack buffer is fine */
            CHECK_RC(tbon_send(ranks[0].d, r, TAG_HELLO, msg, (size_t)n + 1, NULL, NULL));
        } else { /* zero-copy: tbon calls free_lent once it is done with the buffer */
            char *lent = malloc((size_t)n + 1);
            memcpy(lent, msg, (size_t)n + 1);
            CHECK_RC(tbon_send_nocopy(ranks[0].d, r, TAG_HELLO, lent, (size_t)n + 1, free_lent,
                                      NULL, NULL, NULL));
        }
    }
    /* An error still hands the buffer back before the call returns. (The buffers lent above
     * may be freed at any moment too, so count relative to what was freed just before.) */
    {
        unsigned freed_before = atomic_load(&lent_freed);
        CHECK(tbon_send_nocopy(ranks[0].d, 1, 5, malloc(8), 8, free_lent, NULL, NULL, NULL) ==
                  TBON_ERR_RESERVED_TAG && atomic_load(&lent_freed) >= freed_before + 1,
              "nocopy error path");
    }
    for (uint32_t r = 1; r < N; r++) {
        char buf[32], want[32];
        size_t blen = r == 1 ? 4 : sizeof buf; /* rank 1: too small, truncated */
        uint32_t origin = 99;
        tbon_rc rc = tbon_recv_blocking(ranks[r].d, 0, TAG_HELLO, TIMEOUT_MS, buf, &blen, &origin);
        int n = snprintf(want, sizeof want, "hello %u", r);
        if (r == 1) {
            CHECK(rc == TBON_ERR_TOO_LARGE && blen == (size_t)n + 1 && memcmp(buf, "hell", 4) == 0,
                  "truncation: rc %d len %zu", rc, blen);
        } else {
            CHECK(rc == TBON_OK && origin == 0 && strcmp(buf, want) == 0, "hello to %u: %s", r,
                  tbon_strerror(rc));
        }
    }
    size_t zero = 0;
    CHECK(tbon_recv_blocking(ranks[1].d, 0, TAG_HELLO, 10, NULL, &zero, NULL) == TBON_ERR_TIMED_OUT,
          "timeout");

    /* The ring: a persistent receive per rank, then rank 0 sends hop 1 to rank 1. */
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_recv(ranks[r].d, (r + N - 1) % N, TAG_TOKEN, 1, on_token, &ranks[r]));
    CHECK(tbon_recv(ranks[0].d, N - 1, TAG_TOKEN, 1, on_token, &ranks[0]) == TBON_ERR_DUPLICATE,
          "duplicate receive");
    uint64_t hop = 1;
    CHECK_RC(tbon_send(ranks[0].d, 1, TAG_TOKEN, &hop, sizeof hop, on_sent, NULL));
    for (long waited = 0; !atomic_load(&done) && waited < TIMEOUT_MS; waited += 1)
        sleep_ms(1);
    CHECK(atomic_load(&done), "the token did not come back %d times", LAPS);

    for (uint32_t r = 0; r < N; r++) {
        unsigned got = atomic_load(&ranks[r].received);
        CHECK(got == LAPS && atomic_load(&ranks[r].errors) == 0, "rank %u: %u tokens, %u errors", r,
              got, atomic_load(&ranks[r].errors));
        tbon_counters c;
        CHECK_RC(tbon_counters_get(ranks[r].d, &c));
        CHECK(c.delivered >= LAPS && c.failed_count == 0, "rank %u counters: delivered %llu", r,
              (unsigned long long)c.delivered);
        CHECK((r == 0) == (c.parent == TBON_RANK_NONE), "rank %u parent %u", r, c.parent);
        CHECK_RC(tbon_cancel(ranks[r].d, (r + N - 1) % N, TAG_TOKEN));
        /* Ranks beyond the DVM are argument errors, not silent no-ops. */
        CHECK(tbon_cancel(ranks[r].d, N, TAG_TOKEN) == TBON_ERR_RANK_OUT_OF_RANGE,
              "cancel of rank %u", N);
        CHECK(tbon_purge(ranks[r].d, TBON_RANK_ANY) == TBON_ERR_RANK_OUT_OF_RANGE,
              "purge of any rank");
    }
    CHECK(atomic_load(&lent_freed) == 1 + (N - 1) / 2, "%u lent buffers freed",
          atomic_load(&lent_freed));

    /* A large broadcast from rank 2 (its request goes to rank 0, which splits it). */
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_recv(ranks[r].d, 2, TAG_BIG, 0, on_big, &ranks[r]));
    uint8_t *big = malloc(BIG_LEN);
    for (size_t i = 0; i < BIG_LEN; i++)
        big[i] = big_byte(i);
    CHECK_RC(tbon_broadcast(ranks[2].d, TAG_BIG, big, BIG_LEN, on_big_done, NULL));
    free(big); /* copied */
    for (long waited = 0; atomic_load(&big_done) < 0 && waited < TIMEOUT_MS; waited += 1)
        sleep_ms(1);
    CHECK(atomic_load(&big_done) == TBON_OK, "large broadcast: %d", atomic_load(&big_done));
    for (uint32_t r = 0; r < N; r++)
        CHECK(atomic_load(&ranks[r].big) == 1 && atomic_load(&ranks[r].errors) == 0,
              "rank %u: %u large broadcasts, %u errors", r, atomic_load(&ranks[r].big),
              atomic_load(&ranks[r].errors));
    {
        /* Rank 0 sent its children parts, not one operation: 25 parts each. */
        tbon_counters c;
        CHECK_RC(tbon_counters_get(ranks[0].d, &c));
        CHECK(c.xcast_forwarded >= 2 * (BIG_LEN / 4096), "rank 0 forwarded %llu operations",
              (unsigned long long)c.xcast_forwarded);
    }
    CHECK(atomic_load(&send_failures) == 0, "%u send completions failed", atomic_load(&send_failures));

    /* Rank 0 stops the DVM; the others see it and stop by themselves. */
    CHECK_RC(tbon_shutdown_dvm(ranks[0].d));
    for (uint32_t r = 1; r < N; r++)
        CHECK_RC(tbon_wait_stopped(ranks[r].d, TIMEOUT_MS));
    CHECK(tbon_send(ranks[1].d, 2, TAG_TOKEN, "x", 1, NULL, NULL) == TBON_ERR_SHUT_DOWN,
          "send after stop");
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_free(ranks[r].d));
    CHECK(tbon_free(ranks[0].d) == TBON_ERR_BAD_HANDLE, "double free");
    CHECK(tbon_send(ranks[0].d, 1, TAG_TOKEN, "x", 1, NULL, NULL) == TBON_ERR_BAD_HANDLE,
          "send on a freed handle");

    if (failures) {
        fprintf(stderr, "ring: %d check(s) failed\n", failures);
        return 1;
    }
    printf("ring: ok, %d daemons, %d laps (%d hops)\n", N, LAPS, N * LAPS);
    return 0;
}
