/* direct.c: a direct link between two leaves, from C.
 *
 * 15 daemons in one C process, radix 2, every one with the setting route=tree except rank 14
 * (route=auto, so it grants requests). Ranks 7 and 14 are leaves five relays apart. Rank 7
 * sends with tbon_send_routed(..., TBON_ROUTE_DIRECT, ...): the first send asks rank 14 for a
 * direct link, and the messages keep going (over the tree until the link is granted, then on
 * the link). Rank 14 checks that the sequence numbers arrive in order, without gaps; the
 * counters show the link, and that messages sent once it is open take it (none is relayed or
 * falls back to the tree). Also checks
 * that a bad route is refused. Exits non-zero on any failure.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C").
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tbon.h"

#define N 15
#define FROM 7
#define TO 14
#define TAG_DATA 100
#define TIMEOUT_MS 60000 /* hang guard only */

static tbon_daemon d[N];
static uint64_t next_seq; /* expected next at rank TO (its loop thread only) */
static atomic_ulong got;
static atomic_uint errors;
static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "direct: FAILED %s:%d: ", __FILE__, __LINE__); \
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

static void on_data(uint32_t origin, uint32_t tag, const uint8_t *data, size_t len, void *user) {
    (void)user;
    uint64_t seq;
    if (origin != FROM || tag != TAG_DATA || len != sizeof seq) {
        atomic_fetch_add(&errors, 1);
        return;
    }
    memcpy(&seq, data, sizeof seq);
    if (seq != next_seq)
        atomic_fetch_add(&errors, 1);
    next_seq = seq + 1;
    atomic_fetch_add(&got, 1);
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

/* Sends [from, to) from rank FROM to rank TO, offering a refused (busy) message again. */
static void send_range(uint64_t from, uint64_t to) {
    for (uint64_t seq = from; seq < to && !failures; seq++) {
        long waited_us = 0;
        for (;;) {
            tbon_rc rc = tbon_send_routed(d[FROM], TO, TAG_DATA, &seq, sizeof seq,
                                          TBON_ROUTE_DIRECT, NULL, NULL);
            if (rc == TBON_OK)
                break;
            if (rc != TBON_ERR_BUSY || waited_us > (long)TIMEOUT_MS * 1000) {
                CHECK(0, "tbon_send_routed -> %s (%s)", tbon_strerror(rc), tbon_last_error());
                return;
            }
            sleep_us(200);
            waited_us += 200;
        }
    }
}

static void wait_for(uint64_t n) {
    for (long t = 0; t < TIMEOUT_MS && atomic_load(&got) < n; t += 10)
        sleep_us(10000);
    CHECK(atomic_load(&got) == n, "rank %d got %lu of %llu", TO, atomic_load(&got),
          (unsigned long long)n);
}

static uint64_t relayed(void) {
    uint64_t sum = 0;
    for (uint32_t r = 0; r < N; r++) {
        tbon_counters c;
        CHECK_RC(tbon_counters_get(d[r], &c));
        sum += c.relayed;
    }
    return sum;
}

int main(void) {
    const char *key_file = getenv("TBON_KEY_FILE");
    CHECK(key_file != NULL, "set TBON_KEY_FILE to a job key file (tbon keygen FILE)");
    if (failures)
        return 1;
    char uri[512];
    for (uint32_t r = 0; r < N; r++) {
        tbon_config cfg;
        CHECK_RC(tbon_config_new(&cfg));
        CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
        CHECK_RC(tbon_config_set(cfg, "key_file", key_file));
        CHECK_RC(tbon_config_set(cfg, "radix", "2"));
        CHECK_RC(tbon_config_set(cfg, "route", r == TO ? "auto" : "tree"));
        CHECK_RC(tbon_start(cfg, r, N, r == 0 ? NULL : uri, &d[r]));
        CHECK_RC(tbon_config_free(cfg));
        if (failures)
            return 1;
        if (r == 0) {
            size_t len = sizeof uri;
            CHECK_RC(tbon_contact_uri(d[0], uri, &len));
        }
    }
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_wait_wired(d[r], TIMEOUT_MS));
    CHECK_RC(tbon_recv(d[TO], FROM, TAG_DATA, 1, on_data, NULL));

    uint64_t seq = 0;
    CHECK(tbon_send_routed(d[FROM], TO, TAG_DATA, &seq, sizeof seq, 7, NULL, NULL) ==
              TBON_ERR_BAD_PARAM,
          "route 7 accepted");

    /* Until the link is open at rank FROM, and 1000 more: they cross the switch in order. */
    tbon_counters c;
    uint64_t n = 0;
    for (;;) {
        CHECK_RC(tbon_counters_get(d[FROM], &c));
        if (c.direct_links_open == 1 || failures || n > 1000000)
            break;
        send_range(n, n + 100);
        n += 100;
    }
    CHECK(c.direct_links_open == 1, "no link after %llu messages", (unsigned long long)n);
    send_range(n, n + 1000);
    n += 1000;
    wait_for(n);
    /* On the link: every message takes it and none falls back to the tree. The relays may
     * still carry the link's own control messages (a marker that was late under load is asked
     * for again over the tree), never the messages: those would be five relays each. */
    uint64_t before = relayed();
    CHECK_RC(tbon_counters_get(d[FROM], &c));
    uint64_t direct_before = c.direct_messages;
    send_range(n, n + 1000);
    n += 1000;
    wait_for(n);
    uint64_t relays = relayed() - before;
    CHECK_RC(tbon_counters_get(d[FROM], &c));
    CHECK(c.direct_messages - direct_before == 1000 && c.direct_fallbacks == 0,
          "of 1000 messages on an open link %llu took it, %llu fallbacks",
          (unsigned long long)(c.direct_messages - direct_before),
          (unsigned long long)c.direct_fallbacks);
    CHECK(relays < 1000, "%llu frames relayed while 1000 messages crossed the link",
          (unsigned long long)relays);
    CHECK(c.direct_requests_sent == 1 && c.direct_messages >= 1000,
          "requests %llu, direct messages %llu", (unsigned long long)c.direct_requests_sent,
          (unsigned long long)c.direct_messages);
    CHECK(atomic_load(&errors) == 0, "%u out of order or malformed", atomic_load(&errors));

    CHECK_RC(tbon_shutdown_dvm(d[0]));
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_free(d[r]));
    if (failures)
        return 1;
    printf("direct: ok (%llu messages, one link)\n", (unsigned long long)n);
    return 0;
}
