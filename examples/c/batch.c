/* batch.c: many small messages with tbon_send_batch, from C.
 *
 * 4 daemons in one C process, radix 2: rank 3 is rank 1's child, rank 2 is reached through
 * rank 0, so half the messages are relayed. Rank 1 sends MSGS messages of 16 bytes, split
 * between ranks 2 and 3, in arrays of ARRAY messages (more than TBON_SEND_BATCH_MAX, so tbon
 * sends each array in groups). A refused tail (TBON_ERR_BUSY, flow control) is offered again
 * from `sent` on. Each receiver checks that the sequence numbers it gets from rank 1 arrive in
 * order, without gaps, and that every message arrived. Also checks the argument errors: a
 * reserved tag or a NULL payload anywhere in the array sends nothing. Exits non-zero on any
 * failure.
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

#define N 4
#define MSGS 200000
#define ARRAY 3000
#define TAG_DATA 100
#define TIMEOUT_MS 60000 /* hang guard only */

struct rank_state {
    tbon_daemon d;
    uint64_t next;    /* the sequence number expected next (loop thread only) */
    atomic_ulong got; /* messages received */
    atomic_uint errors;
};

static struct rank_state ranks[N];
static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "batch: FAILED %s:%d: ", __FILE__, __LINE__);  \
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

/* A message: the destination's own sequence number, then 8 bytes of filler. */
struct body {
    uint64_t seq;
    uint64_t filler;
};

static void on_data(uint32_t origin, uint32_t tag, const uint8_t *data, size_t len, void *user) {
    struct rank_state *s = user;
    struct body b;
    if (origin != 1 || tag != TAG_DATA || len != sizeof b) {
        atomic_fetch_add(&s->errors, 1);
        return;
    }
    memcpy(&b, data, sizeof b);
    if (b.seq != s->next || b.filler != ~b.seq)
        atomic_fetch_add(&s->errors, 1);
    s->next = b.seq + 1;
    atomic_fetch_add(&s->got, 1);
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    tbon_config cfg;
    CHECK_RC(tbon_config_new(&cfg));
    CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
    const char *key_file = getenv("TBON_KEY_FILE");
    CHECK(key_file != NULL, "set TBON_KEY_FILE to a job key file (tbon keygen FILE)");
    CHECK_RC(tbon_config_set(cfg, "key_file", key_file));
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
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_wait_wired(ranks[r].d, TIMEOUT_MS));
    for (uint32_t r = 2; r < N; r++)
        CHECK_RC(tbon_recv(ranks[r].d, 1, TAG_DATA, 1, on_data, &ranks[r]));

    static struct body bodies[ARRAY];
    static tbon_outgoing out[ARRAY];
    size_t sent = 99;

    /* Argument errors anywhere in the array send nothing. */
    for (int i = 0; i < 8; i++) {
        bodies[i] = (struct body){0, ~(uint64_t)0};
        out[i] = (tbon_outgoing){2, TAG_DATA, &bodies[i], sizeof bodies[i]};
    }
    out[5].tag = 7;
    CHECK(tbon_send_batch(ranks[1].d, out, 8, &sent) == TBON_ERR_RESERVED_TAG && sent == 0,
          "reserved tag: %s, sent %zu", tbon_last_error(), sent);
    out[5].tag = TAG_DATA;
    out[6].data = NULL;
    sent = 99;
    CHECK(tbon_send_batch(ranks[1].d, out, 8, &sent) == TBON_ERR_BAD_PARAM && sent == 0,
          "NULL data: %s, sent %zu", tbon_last_error(), sent);
    out[6].dst = N;
    out[6].data = &bodies[6];
    CHECK(tbon_send_batch(ranks[1].d, out, 8, &sent) == TBON_ERR_RANK_OUT_OF_RANGE && sent == 0,
          "rank out of range");
    CHECK(tbon_send_batch(ranks[1].d, NULL, 8, &sent) == TBON_ERR_BAD_PARAM, "NULL array");
    CHECK_RC(tbon_send_batch(ranks[1].d, NULL, 0, NULL));

    /* The stream: message i goes to rank 2 + (i % 2), with that rank's next sequence number. */
    uint64_t next_seq[N] = {0};
    unsigned long busy = 0;
    long deadline_us = (long)TIMEOUT_MS * 1000, waited_us = 0;
    for (size_t base = 0; base < MSGS && !failures; base += ARRAY) {
        size_t n = MSGS - base < ARRAY ? MSGS - base : ARRAY;
        for (size_t i = 0; i < n; i++) {
            uint32_t dst = 2 + (uint32_t)((base + i) % 2);
            uint64_t seq = next_seq[dst]++;
            bodies[i] = (struct body){seq, ~seq};
            out[i] = (tbon_outgoing){dst, TAG_DATA, &bodies[i], sizeof bodies[i]};
        }
        size_t from = 0;
        while (from < n) {
            tbon_rc rc = tbon_send_batch(ranks[1].d, out + from, n - from, &sent);
            from += sent;
            if (rc == TBON_OK)
                break;
            if (rc != TBON_ERR_BUSY || waited_us > deadline_us) {
                CHECK(0, "tbon_send_batch -> %s (%s)", tbon_strerror(rc), tbon_last_error());
                break;
            }
            busy++;
            sleep_us(200);
            waited_us += 200;
        }
    }
    /* Every message arrives (no faults here: nothing is lost). */
    for (long t = 0; t < TIMEOUT_MS; t += 10) {
        if (atomic_load(&ranks[2].got) + atomic_load(&ranks[3].got) >= MSGS)
            break;
        sleep_us(10000);
    }
    for (uint32_t r = 2; r < N; r++) {
        CHECK(atomic_load(&ranks[r].got) == MSGS / 2, "rank %u got %lu of %d", r,
              atomic_load(&ranks[r].got), MSGS / 2);
        CHECK(atomic_load(&ranks[r].errors) == 0, "rank %u: %u out of order or malformed", r,
              atomic_load(&ranks[r].errors));
    }
    tbon_counters c;
    CHECK_RC(tbon_counters_get(ranks[1].d, &c));
    CHECK(c.sent == MSGS, "rank 1 counted %llu sent", (unsigned long long)c.sent);

    CHECK_RC(tbon_shutdown_dvm(ranks[0].d));
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_free(ranks[r].d));
    if (failures)
        return 1;
    printf("batch: ok (%d messages, %lu busy retries)\n", MSGS, busy);
    return 0;
}
