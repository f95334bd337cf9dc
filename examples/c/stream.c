/* stream.c: a consumer fetches a file-sized object from a producer, from C.
 *
 * 7 daemons in one C process, radix 2. Rank 3 serves "object": the request is the text
 * "seed=S len=L" and the answer is L bytes of a pattern made from S, written from the
 * request's offset (a stream that resumed after a relay died asks again from there). Rank 6
 * fetches a 16 MiB object through the tree (6 -> 2 -> 0 -> 1 -> 3), reads it into a small
 * buffer and checks every byte; then the same with a callback per chunk, and a 4 MiB buffer the
 * producer lends without a copy (tbon_writer_write_nocopy, freed once). It also checks the
 * ends a consumer must tell apart: no such service, the producer's own failure with its code,
 * a refused fail that still ends the writer, and a cancel that reaches the producer's writer;
 * a service slower to its first byte than a quarter of the idle time (probed, called once);
 * that the stream data took a bulk connection; bad arguments; and that after tbon_free no
 * service callback runs any more. Exits non-zero on any failure.
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

#define N 7
#define PRODUCER 3
#define CONSUMER 6
#define OBJECT_LEN (16u << 20)
#define TIMEOUT_MS 60000 /* hang guard only */

static tbon_daemon d[N];
static int failures;
static atomic_int writer_cancelled;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "stream: FAILED %s:%d: ", __FILE__, __LINE__); \
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

static uint8_t pattern(uint64_t seed, uint64_t i) {
    return (uint8_t)((i * 2654435761u + seed) >> 7);
}

/* The "object" service: runs on a thread of its own for each stream. */
static void serve_object(tbon_writer w, uint32_t consumer, const char *service,
                         const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)user;
    char text[64] = {0};
    unsigned long long seed, total;
    memcpy(text, request, len < sizeof text - 1 ? len : sizeof text - 1);
    if (sscanf(text, "seed=%llu len=%llu", &seed, &total) != 2) {
        tbon_writer_fail(w, 22, "bad request");
        return;
    }
    static _Thread_local uint8_t piece[64 * 1024];
    for (uint64_t at = offset; at < total;) {
        size_t n = total - at < sizeof piece ? (size_t)(total - at) : sizeof piece;
        for (size_t k = 0; k < n; k++)
            piece[k] = pattern(seed, at + k);
        /* Waits for the consumer's credit: a slow consumer holds this thread back. */
        tbon_rc rc = tbon_writer_write(w, piece, n, TBON_WAIT_FOREVER, NULL);
        if (rc != TBON_OK)
            return; /* cancelled, or the consumer died: the writer is ended for us */
        at += n;
    }
    tbon_writer_finish(w);
}

static void serve_failing(tbon_writer w, uint32_t consumer, const char *service,
                          const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)offset, (void)user;
    tbon_writer_fail(w, 2, "no such file");
}

static void serve_endless(tbon_writer w, uint32_t consumer, const char *service,
                          const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)offset, (void)user;
    static const uint8_t zeros[10000];
    for (;;) {
        tbon_rc rc = tbon_writer_write(w, zeros, sizeof zeros, TBON_WAIT_FOREVER, NULL);
        if (rc != TBON_OK) {
            if (rc == TBON_ERR_CANCELLED)
                atomic_store(&writer_cancelled, 1);
            return;
        }
    }
}

/* The "reserved" service: a fail with a code reserved for the runtime is refused, and the
 * writer is invalid afterwards all the same (the stream fails as abandoned). */
static atomic_int reserved_rc = -1, reserved_then_rc = -1;

static void serve_reserved(tbon_writer w, uint32_t consumer, const char *service,
                           const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)offset, (void)user;
    atomic_store(&reserved_rc, tbon_writer_fail(w, TBON_STREAM_FAIL_RESERVED_MIN, "mine"));
    atomic_store(&reserved_then_rc, tbon_writer_write(w, "x", 1, 0, NULL));
}

/* The "slow-end" service: writes until its writer fails (the daemon stopping), then takes a
 * while to return. A stop must wait for it: after tbon_free, no callback runs. */
static atomic_int slow_end_returned;

static void serve_slow_end(tbon_writer w, uint32_t consumer, const char *service,
                           const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)offset, (void)user;
    static const uint8_t ones[10000] = {1};
    while (tbon_writer_write(w, ones, sizeof ones, TBON_WAIT_FOREVER, NULL) == TBON_OK) {
    }
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&slow_end_returned, 1);
}

/* The "slow-first" service: slow to its first byte (a file on slow storage), past two of the
 * consumer's probes (a quarter of its idle time each). It is called once, not again at each
 * quarter. */
static atomic_int slow_first_calls;

static void serve_slow_first(tbon_writer w, uint32_t consumer, const char *service,
                             const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)user;
    atomic_fetch_add(&slow_first_calls, 1);
    tbon_counters c = {0};
    for (int waited = 0; waited < TIMEOUT_MS && atomic_load(&slow_first_calls) == 1; waited += 10) {
        if (tbon_counters_get(d[CONSUMER], &c) != TBON_OK || c.stream_probes >= 2)
            break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    static const uint8_t fives[1000] = {5};
    if (tbon_writer_write(w, fives + offset, sizeof fives - offset, TBON_WAIT_FOREVER, NULL) ==
        TBON_OK)
        tbon_writer_finish(w);
}

/* The "lent" service: one 4 MiB buffer lent to tbon without a copy (tbon_writer_write_nocopy);
 * tbon calls on_freed once it no longer reads it. */
#define LENT_LEN (4u << 20)
static uint8_t *lent_buf;
static atomic_int lent_frees;

static void on_freed(void *data, void *user) {
    (void)user;
    if (data == lent_buf)
        atomic_fetch_add(&lent_frees, 1);
}

static void serve_lent(tbon_writer w, uint32_t consumer, const char *service,
                       const uint8_t *request, size_t len, uint64_t offset, void *user) {
    (void)consumer, (void)service, (void)request, (void)len, (void)user;
    if (offset > LENT_LEN)
        offset = LENT_LEN;
    /* Only the rest from `offset` is lent (a resumed stream); the free callback gets its start. */
    size_t written = 0;
    tbon_rc rc = tbon_writer_write_nocopy(w, lent_buf + offset, LENT_LEN - offset, on_freed, NULL,
                                          TBON_WAIT_FOREVER, &written);
    if (rc == TBON_OK)
        tbon_writer_finish(w);
}

/* Fetches "seed=S len=L" and reads it whole with tbon_stream_read; 0 when every byte is right. */
static int fetch_and_check(uint64_t seed, uint64_t total) {
    char req[64];
    snprintf(req, sizeof req, "seed=%llu len=%llu", (unsigned long long)seed,
             (unsigned long long)total);
    tbon_stream s;
    tbon_rc rc = tbon_fetch(d[CONSUMER], PRODUCER, "object", req, strlen(req), NULL, &s);
    CHECK(rc == TBON_OK, "tbon_fetch -> %s (%s)", tbon_strerror(rc), tbon_last_error());
    if (rc != TBON_OK)
        return -1;
    static uint8_t buf[100000];
    uint64_t at = 0;
    int wrong = 0;
    for (;;) {
        size_t got;
        rc = tbon_stream_read(s, buf, sizeof buf, &got, TIMEOUT_MS);
        if (rc != TBON_OK || got == 0)
            break; /* an error, or the end of the stream */
        for (size_t k = 0; k < got; k++)
            wrong += buf[k] != pattern(seed, at + k);
        at += got;
    }
    CHECK(rc == TBON_OK, "tbon_stream_read -> %s (%s)", tbon_strerror(rc), tbon_last_error());
    CHECK(at == total, "read %llu of %llu bytes", (unsigned long long)at,
          (unsigned long long)total);
    CHECK(wrong == 0, "%d wrong bytes", wrong);
    CHECK_RC(tbon_stream_close(s));
    return rc == TBON_OK && at == total && wrong == 0 ? 0 : -1;
}

/* The callback reader: on the loop thread. */
static uint64_t cb_at;
static atomic_int cb_wrong, cb_done;
static tbon_rc cb_end_rc = TBON_ERR_INTERNAL;

static void on_chunk(const uint8_t *data, size_t len, const tbon_stream_end *end, void *user) {
    uint64_t seed = *(const uint64_t *)user;
    if (end != NULL) {
        cb_end_rc = end->rc;
        atomic_store(&cb_done, 1);
        return;
    }
    for (size_t k = 0; k < len; k++)
        if (data[k] != pattern(seed, cb_at + k))
            atomic_fetch_add(&cb_wrong, 1);
    cb_at += len;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
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
        CHECK_RC(tbon_start(cfg, r, N, r == 0 ? NULL : uri, &d[r]));
        CHECK_RC(tbon_config_free(cfg));
        if (r == 0) {
            size_t len = sizeof uri;
            CHECK_RC(tbon_contact_uri(d[0], uri, &len));
        }
        if (failures)
            return 1;
    }
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_wait_wired(d[r], TIMEOUT_MS));
    CHECK_RC(tbon_serve(d[PRODUCER], "object", serve_object, NULL));
    CHECK_RC(tbon_serve(d[PRODUCER], "fails", serve_failing, NULL));
    CHECK_RC(tbon_serve(d[PRODUCER], "endless", serve_endless, NULL));
    lent_buf = malloc(LENT_LEN);
    CHECK(lent_buf != NULL, "malloc");
    for (uint32_t k = 0; k < LENT_LEN; k++)
        lent_buf[k] = pattern(77, k);
    CHECK_RC(tbon_serve(d[PRODUCER], "lent", serve_lent, NULL));
    CHECK_RC(tbon_serve(d[PRODUCER], "reserved", serve_reserved, NULL));
    CHECK_RC(tbon_serve(d[PRODUCER], "slow-end", serve_slow_end, NULL));
    CHECK_RC(tbon_serve(d[PRODUCER], "slow-first", serve_slow_first, NULL));

    /* 1. A file-sized object, read into a small buffer. */
    fetch_and_check(5, OBJECT_LEN);

    /* 2. The same through a callback per chunk. */
    static uint64_t seed = 9;
    char req[64];
    snprintf(req, sizeof req, "seed=%llu len=%u", (unsigned long long)seed, 3u << 20);
    uint64_t id;
    CHECK_RC(tbon_fetch_cb(d[CONSUMER], PRODUCER, "object", req, strlen(req), NULL, on_chunk,
                           &seed, &id));
    for (int waited = 0; !atomic_load(&cb_done) && waited < TIMEOUT_MS; waited += 10)
        sleep_ms(10);
    CHECK(atomic_load(&cb_done) && cb_end_rc == TBON_OK, "callback stream ended %s",
          tbon_strerror(cb_end_rc));
    CHECK(cb_at == 3u << 20 && atomic_load(&cb_wrong) == 0, "callback stream: %llu bytes, %d wrong",
          (unsigned long long)cb_at, atomic_load(&cb_wrong));

    /* 3. A buffer lent without a copy: every byte right, and freed once. */
    {
        tbon_stream ls;
        CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "lent", NULL, 0, NULL, &ls));
        static uint8_t lbuf[65536];
        uint64_t at = 0;
        int wrong = 0;
        for (;;) {
            size_t got = 0;
            tbon_rc rc = tbon_stream_read(ls, lbuf, sizeof lbuf, &got, TIMEOUT_MS);
            CHECK(rc == TBON_OK, "lent stream: %s (%s)", tbon_strerror(rc), tbon_last_error());
            if (rc != TBON_OK || got == 0)
                break;
            for (size_t k = 0; k < got; k++)
                wrong += lbuf[k] != pattern(77, at + k);
            at += got;
        }
        CHECK(at == LENT_LEN && wrong == 0, "lent stream: %llu bytes, %d wrong",
              (unsigned long long)at, wrong);
        CHECK_RC(tbon_stream_close(ls));
        for (int waited = 0; atomic_load(&lent_frees) == 0 && waited < TIMEOUT_MS; waited += 10)
            sleep_ms(10);
        CHECK(atomic_load(&lent_frees) == 1, "the lent buffer was freed %d times",
              atomic_load(&lent_frees));
    }

    /* 4. The ends a consumer tells apart. */
    tbon_stream s;
    uint8_t buf[4096];
    size_t got;
    CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "nothing", "x", 1, NULL, &s));
    tbon_rc rc = tbon_stream_read(s, buf, sizeof buf, &got, TIMEOUT_MS);
    CHECK(rc == TBON_ERR_NO_SERVICE, "no service: %s", tbon_strerror(rc));
    CHECK_RC(tbon_stream_close(s));

    CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "fails", "x", 1, NULL, &s));
    rc = tbon_stream_read(s, buf, sizeof buf, &got, TIMEOUT_MS);
    CHECK(rc == TBON_ERR_STREAM_FAILED, "failing service: %s", tbon_strerror(rc));
    CHECK(strstr(tbon_last_error(), "no such file") != NULL, "reason: %s", tbon_last_error());
    uint32_t code = 0;
    CHECK_RC(tbon_stream_fail_code(s, &code));
    CHECK(code == 2, "fail code %u", code);
    CHECK_RC(tbon_stream_close(s));

    /* A small window, and a route of its own: it asks for a direct link (which the producer,
     * with the default route setting "tree", denies: the stream takes the tree). */
    tbon_fetch_opts small = {.window = 256 * 1024, .idle_ms = 0, .route = TBON_FETCH_ROUTE_DIRECT};
    CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "endless", NULL, 0, &small, &s));
    CHECK_RC(tbon_stream_read(s, buf, sizeof buf, &got, TIMEOUT_MS));
    CHECK(got > 0, "endless: nothing read");
    CHECK_RC(tbon_stream_close(s)); /* cancels: the producer's writer sees it */
    for (int waited = 0; !atomic_load(&writer_cancelled) && waited < TIMEOUT_MS; waited += 10)
        sleep_ms(10);
    CHECK(atomic_load(&writer_cancelled), "the producer's writer did not see the cancel");

    /* A refused fail still ends the writer: the consumer reads it abandoned. */
    CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "reserved", NULL, 0, NULL, &s));
    rc = tbon_stream_read(s, buf, sizeof buf, &got, TIMEOUT_MS);
    CHECK(rc == TBON_ERR_STREAM_FAILED, "reserved: %s", tbon_strerror(rc));
    CHECK_RC(tbon_stream_fail_code(s, &code));
    CHECK(code == TBON_STREAM_FAIL_ABANDONED, "reserved: fail code %u", code);
    CHECK(atomic_load(&reserved_rc) == TBON_ERR_BAD_PARAM, "a reserved fail code: %s",
          tbon_strerror(atomic_load(&reserved_rc)));
    CHECK(atomic_load(&reserved_then_rc) == TBON_ERR_BAD_HANDLE,
          "the writer after a refused fail: %s", tbon_strerror(atomic_load(&reserved_then_rc)));
    CHECK_RC(tbon_stream_close(s));

    /* Bad arguments are refused, nothing else happens. */
    char long_name[300];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    CHECK(tbon_fetch(d[CONSUMER], PRODUCER, long_name, NULL, 0, NULL, &s) == TBON_ERR_TOO_LARGE,
          "a service name of 299 bytes was accepted");
    CHECK(strstr(tbon_last_error(), "service name") != NULL, "the error says: %s",
          tbon_last_error());
    CHECK(tbon_serve(d[PRODUCER], long_name, serve_object, NULL) == TBON_ERR_TOO_LARGE,
          "a service name of 299 bytes was served");
    CHECK(tbon_fetch(d[CONSUMER], N, "object", "x", 1, NULL, &s) == TBON_ERR_RANK_OUT_OF_RANGE,
          "a producer out of range was accepted");
    tbon_fetch_opts bad_route = {.window = 0, .idle_ms = 0, .route = 7};
    CHECK(tbon_fetch(d[CONSUMER], PRODUCER, "object", "x", 1, &bad_route, &s) == TBON_ERR_BAD_PARAM,
          "a bad route was accepted");
    CHECK(tbon_stream_read(s + 1000, buf, sizeof buf, &got, 0) == TBON_ERR_BAD_HANDLE,
          "a made-up stream was accepted");
    CHECK(tbon_writer_finish(12345) == TBON_ERR_BAD_HANDLE, "a made-up writer was accepted");
    {
        tbon_stream cs;
        CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "endless", NULL, 0, &small, &cs));
        CHECK(tbon_stream_read(cs, buf, 0, &got, TIMEOUT_MS) == TBON_ERR_BAD_PARAM,
              "a read of 0 bytes was accepted (it would look like the end)");
        CHECK_RC(tbon_stream_close(cs));
    }

    /* A service slower to its first byte than a quarter of the idle time: probed, not called
     * again, and the stream ends with all its bytes. */
    {
        tbon_fetch_opts patient = {.window = 0, .idle_ms = 2000, .route = 0};
        tbon_stream ss;
        CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "slow-first", NULL, 0, &patient, &ss));
        size_t total = 0;
        do {
            rc = tbon_stream_read(ss, buf, sizeof buf, &got, TIMEOUT_MS);
            total += got;
        } while (rc == TBON_OK && got > 0);
        CHECK(rc == TBON_OK && total == 1000, "slow-first: %s after %zu bytes", tbon_strerror(rc),
              total);
        CHECK(atomic_load(&slow_first_calls) == 1, "the slow service was called %d times",
              atomic_load(&slow_first_calls));
        CHECK_RC(tbon_stream_close(ss));
    }

    tbon_counters c;
    CHECK_RC(tbon_counters_get(d[CONSUMER], &c));
    CHECK(c.stream_probes >= 2, "%llu probes", (unsigned long long)c.stream_probes);
    CHECK(c.stream_finished == 4, "%llu streams finished", (unsigned long long)c.stream_finished);
    CHECK(c.stream_bytes_received >= OBJECT_LEN + (3u << 20), "%llu bytes received",
          (unsigned long long)c.stream_bytes_received);
    /* The producer's stream data took a bulk connection to its parent (setting
     * bulk_connection, on by default), beside the link that carries everything else. */
    tbon_counters pc;
    CHECK_RC(tbon_counters_get(d[PRODUCER], &pc));
    CHECK(pc.bulk_connections >= 1, "the producer dialled %llu bulk connections",
          (unsigned long long)pc.bulk_connections);

    /* A stream left open across the stop: its producer's callback is still writing. */
    tbon_stream open_stream;
    CHECK_RC(tbon_fetch(d[CONSUMER], PRODUCER, "slow-end", NULL, 0, &small, &open_stream));
    CHECK_RC(tbon_stream_read(open_stream, buf, sizeof buf, &got, TIMEOUT_MS));

    CHECK_RC(tbon_shutdown_dvm(d[0]));
    for (uint32_t r = 0; r < N; r++)
        CHECK_RC(tbon_free(d[r]));
    /* No callback runs once tbon_free has returned: the service's had returned. */
    CHECK(atomic_load(&slow_end_returned) == 1, "a service callback outlived tbon_free");
    /* A stream is closed also after its daemon was freed (its memory is freed then). */
    CHECK_RC(tbon_stream_close(open_stream));
    free(lent_buf);
    if (failures)
        return 1;
    printf("stream: ok (%u bytes checked, %llu streams finished)\n", OBJECT_LEN + (3u << 20),
           (unsigned long long)c.stream_finished);
    return 0;
}
