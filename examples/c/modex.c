/* modex.c: two jobs on overlapping daemons exchange their endpoints (the PMI "modex").
 *
 * Before a job's processes can talk, each node's daemon publishes what its part of the job
 * needs known (an endpoint, the cores it has) and reads the others'. Here the parent forks N
 * daemon processes (before touching tbon), which form a DVM with tbon_launch through a URI
 * file, as group.c does (radix 2: 0 -> {1, 2}, 1 -> {3, 5}, 2 -> {4, 6}, 3 -> {7}). Two jobs:
 *
 *   job 21 on ranks 1, 3, 4, 6  (full fence)     job 22 on ranks 2, 4, 6, 7  (direct fence)
 *
 * Ranks 4 and 6 run both, job 21 first. Every member, for each of its jobs: tbon_put an
 * "endpoint" (first a wrong one, then the right one: the later put replaces it), "cores"
 * (16 binary bytes with a NUL inside) and an empty value under the longest key there may be
 * (TBON_MODEX_KEY_MAX bytes), tbon_commit, then tbon_put "late" (not committed before the
 * fence), then tbon_fence: job 21 in TBON_FENCE_FULL (every member's data comes to every
 * member), job 22 in TBON_FENCE_DIRECT (a get fetches the owner's data on first use). Then it
 * reads every member's values with tbon_get and checks them; "never-put" and "late" are
 * TBON_ERR_NOT_FOUND; a buffer too small is TBON_ERR_TOO_LARGE with the length needed in *len
 * and nothing copied (NULL and 0 ask the length); a rank outside the job is
 * TBON_ERR_NOT_MEMBER; bad keys are TBON_ERR_BAD_PARAM. The counters show that job 21's gets
 * needed no fetch (every one answered here) and that job 22's fetched each other member's data
 * once, the later gets answered from the cache. Job 22 also reads every endpoint through
 * tbon_get_cb. Each job then fences again with tbon_fence_cb (nobody excluded: everyone has
 * read everything). Job 21 is then over (tbon_forget_group: even this daemon's own value is
 * TBON_ERR_NOT_FOUND after it). Job 22 runs a second round: every member commits a new key,
 * fences (direct: what was cached of the job is dropped, so the gets fetch each owner's new
 * data once more instead of answering from the first round's), reads every member's new value
 * and endpoint, and fences again before it forgets the job; each member served each other
 * member once per round. Ranks 0 and 5 are in no job: their calls are refused
 * TBON_ERR_NOT_MEMBER (gets included: only members read a job's data) and their modex
 * counters stay 0. All daemons meet in barriers of the whole DVM and rank 0 shuts it down.
 * Each daemon exits non-zero on any failure; the parent checks every exit status, prints
 * "modex: ok" and exits 0, or exits non-zero.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C"); TBON_KEY_FILE names the job
 * key, read by every daemon.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define N 8
#define TIMEOUT_MS 60000 /* hang guard only */

static const uint32_t JOB21[] = {1, 3, 4, 6};
static const uint32_t JOB22[] = {2, 4, 6, 7};

/* One job as one of its member daemons sees it. */
struct job {
    uint64_t number; /* the group's context */
    const uint32_t *members;
    size_t nmembers;
    int mode; /* a tbon_fence_mode */
    tbon_group g;
    atomic_int fenced; /* the second fence's outcome: 0 not yet, 1 right, 2 wrong */
};

static struct job jobs[2] = {
    {21, JOB21, sizeof JOB21 / sizeof JOB21[0], TBON_FENCE_FULL, 0, 0},
    {22, JOB22, sizeof JOB22 / sizeof JOB22[0], TBON_FENCE_DIRECT, 0, 0},
};

static uint32_t me; /* this process's rank */
static int failures;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "modex: rank %u: FAILED %s:%d: ", me, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            failures++;                                                                \
        }                                                                              \
    } while (0)

#define CHECK_RC(call)                                                                \
    do {                                                                              \
        tbon_rc rc_ = (call);                                                         \
        CHECK(rc_ == TBON_OK, "%s -> %s (%s)", #call, tbon_strerror(rc_), tbon_last_error()); \
    } while (0)

/* The same expected result, `want` the code: prints what came otherwise. */
#define CHECK_IS(call, want)                                                                  \
    do {                                                                                      \
        tbon_rc rc_ = (call);                                                                 \
        CHECK(rc_ == (want), "%s -> %s (%s), expected %s", #call, tbon_strerror(rc_),         \
              tbon_last_error(), tbon_strerror(want));                                        \
    } while (0)

static int is_member(const struct job *j, uint32_t rank) {
    for (size_t i = 0; i < j->nmembers; i++)
        if (j->members[i] == rank)
            return 1;
    return 0;
}

/* Member `rank`'s endpoint in job `j` (text, without its NUL). */
static size_t endpoint(char *buf, size_t cap, const struct job *j, uint32_t rank) {
    int n = snprintf(buf, cap, "job %llu: rank %u listens on 10.0.%u.1:%llu",
                     (unsigned long long)j->number, rank, rank,
                     (unsigned long long)(5000 + j->number));
    return (size_t)n;
}

/* Member `rank`'s cores in job `j`: 16 binary bytes, a zero among them. */
static void cores(uint32_t out[4], const struct job *j, uint32_t rank) {
    out[0] = rank;
    out[1] = 2 * rank;
    out[2] = 0;
    out[3] = (uint32_t)j->number;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (hang guard only) until a callback stored its verdict in `flag`. */
static int wait_flag(atomic_int *flag) {
    for (long waited = 0; atomic_load(flag) == 0 && waited < TIMEOUT_MS; waited++)
        sleep_ms(1);
    return atomic_load(flag);
}

static tbon_counters counters(tbon_daemon d) {
    tbon_counters c;
    memset(&c, 0, sizeof c);
    CHECK_RC(tbon_counters_get(d, &c));
    return c;
}

/* The longest key there may be (TBON_MODEX_KEY_MAX bytes), its value empty. */
static char longest_key[TBON_MODEX_KEY_MAX + 1];

/* Publishes this daemon's data for job `j` and enters its fence. */
static void publish(tbon_daemon d, struct job *j) {
    char text[128];
    uint32_t mine[4];
    CHECK_RC(tbon_put(d, j->g, longest_key, NULL, 0));
    CHECK_RC(tbon_put(d, j->g, "endpoint", "wrong", 5)); /* replaced below */
    size_t n = endpoint(text, sizeof text, j, me);
    CHECK_RC(tbon_put(d, j->g, "endpoint", text, n));
    cores(mine, j, me);
    CHECK_RC(tbon_put(d, j->g, "cores", mine, sizeof mine));
    CHECK_RC(tbon_commit(d, j->g));
    /* Put after the commit: staged here, never seen by anyone (nor by this daemon's gets). */
    CHECK_RC(tbon_put(d, j->g, "late", "x", 1));
    CHECK_RC(tbon_fence(d, j->g, j->mode, TIMEOUT_MS));
}

/* Reads every member's values of job `j` with tbon_get; returns how many gets the daemon
 * answered (those not refused at once). */
static uint64_t read_all(tbon_daemon d, struct job *j) {
    uint64_t gets = 0;
    for (size_t i = 0; i < j->nmembers; i++) {
        uint32_t m = j->members[i];
        char want[128], got[128];
        size_t n = endpoint(want, sizeof want, j, m), len = 0;
        CHECK_RC(tbon_get(d, j->g, m, "endpoint", got, sizeof got, &len, TIMEOUT_MS));
        CHECK(len == n && memcmp(got, want, n) == 0, "job %llu: rank %u's endpoint: %.*s",
              (unsigned long long)j->number, m, (int)(len < sizeof got ? len : sizeof got),
              got);
        uint32_t cw[4], cg[4] = {9, 9, 9, 9};
        cores(cw, j, m);
        len = 0;
        CHECK_RC(tbon_get(d, j->g, m, "cores", cg, sizeof cg, &len, TIMEOUT_MS));
        CHECK(len == sizeof cw && memcmp(cg, cw, sizeof cw) == 0,
              "job %llu: rank %u's cores (%zu bytes)", (unsigned long long)j->number, m, len);
        len = 77;
        CHECK_IS(tbon_get(d, j->g, m, "never-put", got, sizeof got, &len, TIMEOUT_MS),
                 TBON_ERR_NOT_FOUND);
        CHECK(len == 77, "*len changed on TBON_ERR_NOT_FOUND: %zu", len);
        CHECK_IS(tbon_get(d, j->g, m, "late", got, sizeof got, &len, TIMEOUT_MS),
                 TBON_ERR_NOT_FOUND);
        len = 77;
        CHECK_RC(tbon_get(d, j->g, m, longest_key, NULL, 0, &len, TIMEOUT_MS));
        CHECK(len == 0, "rank %u's empty value has %zu bytes", m, len);
        gets += 5;
    }

    /* The buffer too small: nothing copied, *len the length needed. NULL and 0 ask it. */
    uint32_t other = j->members[0] == me ? j->members[1] : j->members[0];
    char want[128], got[128];
    size_t n = endpoint(want, sizeof want, j, other), len = 0;
    CHECK_IS(tbon_get(d, j->g, other, "endpoint", NULL, 0, &len, TIMEOUT_MS),
             TBON_ERR_TOO_LARGE);
    CHECK(len == n, "the size query said %zu, the endpoint has %zu", len, n);
    memset(got, '#', sizeof got);
    len = 0;
    CHECK_IS(tbon_get(d, j->g, other, "endpoint", got, n - 1, &len, TIMEOUT_MS),
             TBON_ERR_TOO_LARGE);
    CHECK(len == n && got[0] == '#', "too small: *len %zu (want %zu), copied '%c'", len, n,
          got[0]);
    len = 0;
    CHECK_RC(tbon_get(d, j->g, other, "endpoint", got, n, &len, TIMEOUT_MS)); /* just fits */
    CHECK(len == n && memcmp(got, want, n) == 0 && got[n] == '#', "the exact fit");
    gets += 3;

    /* Refused at once, asking nothing. */
    len = 0;
    CHECK_IS(tbon_get(d, j->g, 5, "endpoint", got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_NOT_MEMBER); /* rank 5 is in no job */
    CHECK_IS(tbon_get(d, j->g, N, "endpoint", got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_RANK_OUT_OF_RANGE); /* not even a rank of the DVM */
    char long_key[TBON_MODEX_KEY_MAX + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK_IS(tbon_get(d, j->g, other, long_key, got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_get(d, j->g, other, "\xff\xfe", got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_BAD_PARAM); /* not UTF-8 */
    CHECK_IS(tbon_get(d, j->g, other, NULL, got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_get(d, j->g, other, "endpoint", got, sizeof got, NULL, TIMEOUT_MS),
             TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_get(d, j->g, other, "endpoint", NULL, 8, &len, TIMEOUT_MS),
             TBON_ERR_BAD_PARAM);
    return gets;
}

/* tbon_get_cb's answers, counted as they come (on the loop thread). */
static atomic_int answers_right, answers_wrong;
static void on_value(tbon_rc rc, uint32_t rank, const char *key, const uint8_t *data, size_t len,
                     void *user) {
    struct job *j = user;
    char want[128];
    size_t n = endpoint(want, sizeof want, j, rank);
    int ok = rc == TBON_OK && strcmp(key, "endpoint") == 0 && len == n &&
             memcmp(data, want, n) == 0;
    if (!ok)
        fprintf(stderr, "modex: rank %u: tbon_get_cb of rank %u's %s: %s, %zu bytes\n", me, rank,
                key, tbon_strerror(rc), len);
    atomic_fetch_add(ok ? &answers_right : &answers_wrong, 1);
}

/* The second fence's outcome (on the loop thread): the group's second collective, nobody
 * excluded. */
static void on_fenced(tbon_rc rc, uint64_t seq, const uint32_t *excluded, size_t nexcluded,
                      void *user) {
    struct job *j = user;
    int ok = rc == TBON_OK && seq == 1 && nexcluded == 0 && excluded == NULL;
    if (!ok)
        fprintf(stderr, "modex: rank %u: job %llu's second fence: %s, seq %llu, %zu excluded\n",
                me, (unsigned long long)j->number, tbon_strerror(rc), (unsigned long long)seq,
                nexcluded);
    atomic_store(&j->fenced, ok ? 1 : 2);
}

/* Member `rank`'s value of "round" in job 22's second round. */
static size_t round2(char *buf, size_t cap, uint32_t rank) {
    return (size_t)snprintf(buf, cap, "round 2: rank %u", rank);
}

static uint64_t next_seq(const struct job *j) {
    uint64_t seq = 99;
    CHECK_RC(tbon_group_next_seq(j->g, &seq));
    return seq;
}

/* The job is over here: its data goes, this daemon's own value included. */
static void forget(tbon_daemon d, const struct job *j) {
    char got[128];
    size_t len = 0;
    CHECK_RC(tbon_forget_group(d, j->g));
    CHECK_IS(tbon_get(d, j->g, me, "endpoint", got, sizeof got, &len, TIMEOUT_MS),
             TBON_ERR_NOT_FOUND);
}

/* A member's part in its jobs. */
static void run_jobs(tbon_daemon d) {
    struct job *full = &jobs[0], *direct = &jobs[1];
    for (int k = 0; k < 2; k++)
        if (is_member(&jobs[k], me))
            publish(d, &jobs[k]);

    /* The full job: every get answered here, no fetch. */
    tbon_counters c0 = counters(d);
    if (is_member(full, me)) {
        uint64_t gets = read_all(d, full);
        tbon_counters c1 = counters(d);
        CHECK(c1.modex_fetches == c0.modex_fetches,
              "job 21 (full fence) fetched %llu times",
              (unsigned long long)(c1.modex_fetches - c0.modex_fetches));
        CHECK(c1.modex_hits - c0.modex_hits == gets, "job 21: %llu of %llu gets answered here",
              (unsigned long long)(c1.modex_hits - c0.modex_hits), (unsigned long long)gets);
        c0 = c1;
    }
    /* The direct job: one fetch per other member, then the cache. */
    if (is_member(direct, me)) {
        uint64_t gets = read_all(d, direct);
        tbon_counters c1 = counters(d);
        uint64_t fetches = c1.modex_fetches - c0.modex_fetches;
        CHECK(fetches == direct->nmembers - 1, "job 22 (direct fence): %llu fetches, want %zu",
              (unsigned long long)fetches, direct->nmembers - 1);
        CHECK(c1.modex_hits - c0.modex_hits == gets - fetches,
              "job 22: %llu of %llu gets answered here",
              (unsigned long long)(c1.modex_hits - c0.modex_hits), (unsigned long long)gets);
        /* The callback form, every member's endpoint at once (all from the cache now). */
        for (size_t i = 0; i < direct->nmembers; i++)
            CHECK_RC(tbon_get_cb(d, direct->g, direct->members[i], "endpoint", on_value, direct));
        for (long waited = 0; atomic_load(&answers_right) + atomic_load(&answers_wrong) <
                                  (int)direct->nmembers &&
                              waited < TIMEOUT_MS;
             waited++)
            sleep_ms(1);
        CHECK(atomic_load(&answers_right) == (int)direct->nmembers && atomic_load(&answers_wrong) == 0,
              "tbon_get_cb: %d right, %d wrong", atomic_load(&answers_right),
              atomic_load(&answers_wrong));
        CHECK_IS(tbon_get_cb(d, direct->g, 1, "endpoint", on_value, direct),
                 TBON_ERR_NOT_MEMBER); /* rank 1 is in job 21 only */
        CHECK_IS(tbon_get_cb(d, direct->g, me, "endpoint", NULL, NULL), TBON_ERR_BAD_PARAM);
        tbon_counters c2 = counters(d);
        CHECK(c2.modex_fetches == c1.modex_fetches, "tbon_get_cb fetched again");
    }

    /* Everyone has read everything of the first round once the second fence ends. */
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me))
            continue;
        CHECK_IS(tbon_fence_cb(d, j->g, 7, on_fenced, j), TBON_ERR_BAD_PARAM); /* no such mode */
        CHECK_IS(tbon_fence_cb(d, j->g, TBON_FENCE_DIRECT, NULL, j), TBON_ERR_BAD_PARAM);
        CHECK_RC(tbon_fence_cb(d, j->g, TBON_FENCE_DIRECT, on_fenced, j));
    }
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me))
            continue;
        CHECK(wait_flag(&j->fenced) == 1, "job %llu's second fence", (unsigned long long)j->number);
        CHECK(next_seq(j) == 2, "job %llu: next number %llu", (unsigned long long)j->number,
              (unsigned long long)next_seq(j));
    }

    /* Job 21 is over: its data goes. */
    if (is_member(full, me)) {
        if (!is_member(direct, me)) {
            tbon_counters c = counters(d);
            CHECK(c.modex_served == 0, "a member of the full job only served %llu fetches",
                  (unsigned long long)c.modex_served);
        }
        forget(d, full);
    }

    /* Job 22's second round: a new key, committed once everyone has read the first round. The
     * next fence drops what this daemon cached of the job (a direct fence starts a new round),
     * so its gets fetch the new data instead of answering from the first round's. */
    if (is_member(direct, me)) {
        size_t others = direct->nmembers - 1;
        tbon_counters c = counters(d);
        CHECK(c.modex_served == others, "round 1: served %llu fetches, want %zu",
              (unsigned long long)c.modex_served, others);
        char text[64], got[128];
        size_t n = round2(text, sizeof text, me), len = 0;
        CHECK_RC(tbon_put(d, direct->g, "round", text, n));
        CHECK_RC(tbon_commit(d, direct->g));
        CHECK_RC(tbon_fence(d, direct->g, TBON_FENCE_DIRECT, TIMEOUT_MS));
        tbon_counters c0 = counters(d);
        for (size_t i = 0; i < direct->nmembers; i++) {
            uint32_t m = direct->members[i];
            n = round2(text, sizeof text, m);
            CHECK_RC(tbon_get(d, direct->g, m, "round", got, sizeof got, &len, TIMEOUT_MS));
            CHECK(len == n && memcmp(got, text, n) == 0, "round 2: rank %u's value", m);
            n = endpoint(text, sizeof text, direct, m);
            CHECK_RC(tbon_get(d, direct->g, m, "endpoint", got, sizeof got, &len, TIMEOUT_MS));
            CHECK(len == n && memcmp(got, text, n) == 0, "round 2: rank %u's endpoint", m);
        }
        tbon_counters c1 = counters(d);
        CHECK(c1.modex_fetches - c0.modex_fetches == others, "round 2: %llu fetches, want %zu",
              (unsigned long long)(c1.modex_fetches - c0.modex_fetches), others);
        /* Everyone has read the second round. */
        CHECK_RC(tbon_fence(d, direct->g, TBON_FENCE_DIRECT, TIMEOUT_MS));
        CHECK(next_seq(direct) == 4, "job 22: next number %llu",
              (unsigned long long)next_seq(direct));
        c = counters(d);
        CHECK(c.modex_served == 2 * others, "rounds 1 and 2: served %llu fetches, want %zu",
              (unsigned long long)c.modex_served, 2 * others);
        forget(d, direct);
    }
}

/* Ranks 0 and 5, in no job: refused, and nothing counted. */
static void not_a_member(tbon_daemon d) {
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        CHECK_IS(tbon_put(d, j->g, "endpoint", "x", 1), TBON_ERR_NOT_MEMBER);
        CHECK_IS(tbon_commit(d, j->g), TBON_ERR_NOT_MEMBER);
        CHECK_IS(tbon_fence(d, j->g, j->mode, TIMEOUT_MS), TBON_ERR_NOT_MEMBER);
        CHECK_IS(tbon_fence_cb(d, j->g, j->mode, on_fenced, j), TBON_ERR_NOT_MEMBER);
        /* Only members read a job's data. */
        char got[128];
        size_t len = 0;
        CHECK_IS(tbon_get(d, j->g, j->members[0], "endpoint", got, sizeof got, &len, TIMEOUT_MS),
                 TBON_ERR_NOT_MEMBER);
        CHECK_IS(tbon_get_cb(d, j->g, j->members[0], "endpoint", on_value, j),
                 TBON_ERR_NOT_MEMBER);
        CHECK_RC(tbon_forget_group(d, j->g)); /* cleanup: nothing to forget */
        uint64_t seq = 99;
        CHECK_RC(tbon_group_next_seq(j->g, &seq));
        CHECK(seq == 0, "job %llu: the refused fences took numbers (%llu)",
              (unsigned long long)j->number, (unsigned long long)seq);
    }
}

/* Argument errors any daemon gets. */
static void check_misuse(tbon_daemon d) {
    struct job *j = is_member(&jobs[0], me) ? &jobs[0] : &jobs[1];
    char long_key[TBON_MODEX_KEY_MAX + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK_IS(tbon_put(d, j->g, NULL, "x", 1), TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_put(d, j->g, "\xc3(", "x", 1), TBON_ERR_BAD_PARAM); /* not UTF-8 */
    CHECK_IS(tbon_put(d, j->g, long_key, "x", 1), TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_put(d, j->g, "endpoint", NULL, 1), TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_put(d, 0, "endpoint", "x", 1), TBON_ERR_BAD_HANDLE);
    CHECK_IS(tbon_fence(d, j->g, -1, TIMEOUT_MS), TBON_ERR_BAD_PARAM);
    CHECK(strcmp(tbon_strerror(TBON_ERR_NOT_FOUND), "unknown tbon_rc") != 0,
          "TBON_ERR_NOT_FOUND has a description");
}

/* One daemon's life: 0 if everything it checked was right. */
static int daemon_main(const char *rendezvous) {
    tbon_config cfg;
    tbon_daemon d;
    CHECK_RC(tbon_config_new(&cfg));
    CHECK_RC(tbon_config_set(cfg, "if_include", "127.0.0.1/32"));
    CHECK_RC(tbon_config_set(cfg, "key_file", getenv("TBON_KEY_FILE")));
    CHECK_RC(tbon_config_set(cfg, "radix", "2"));
    tbon_rc rc = tbon_launch(cfg, -1, -1, rendezvous, &d); /* TBON_RANK, TBON_SIZE */
    tbon_config_free(cfg);
    if (rc != TBON_OK || failures) {
        fprintf(stderr, "modex: rank %u: tbon_launch: %s (%s)\n", me, tbon_strerror(rc),
                tbon_last_error());
        return 1;
    }
    CHECK_RC(tbon_wait_wired(d, TIMEOUT_MS));
    memset(longest_key, 'k', TBON_MODEX_KEY_MAX);

    /* Every daemon makes both jobs' groups, so that the others can see their calls refused. */
    for (int k = 0; k < 2; k++)
        CHECK_RC(tbon_group_new(jobs[k].number, jobs[k].members, jobs[k].nmembers, &jobs[k].g));
    check_misuse(d);
    if (!is_member(&jobs[0], me) && !is_member(&jobs[1], me))
        not_a_member(d);
    else if (failures == 0)
        run_jobs(d);

    /* The whole DVM meets once the jobs are done. */
    CHECK_RC(tbon_barrier(d, 1, TIMEOUT_MS));
    if (!is_member(&jobs[0], me) && !is_member(&jobs[1], me)) {
        tbon_counters c = counters(d);
        CHECK(c.modex_hits + c.modex_fetches + c.modex_served + c.modex_evicted == 0,
              "in no job, yet modex counters %llu %llu %llu %llu",
              (unsigned long long)c.modex_hits, (unsigned long long)c.modex_fetches,
              (unsigned long long)c.modex_served, (unsigned long long)c.modex_evicted);
    }
    CHECK_RC(tbon_barrier(d, 2, TIMEOUT_MS)); /* every daemon looked before the stop */

    if (me == 0) {
        CHECK_RC(tbon_shutdown_dvm(d));
    } else {
        CHECK_RC(tbon_wait_stopped(d, TIMEOUT_MS));
        tbon_stop why = TBON_STOP_RUNNING;
        CHECK_RC(tbon_stop_reason(d, &why, NULL, NULL));
        CHECK(why == TBON_STOP_DVM_SHUTDOWN, "stopped for reason %d", (int)why);
    }
    /* A stopped daemon: the exchange needs a running one (misuse is told first); forgetting
     * is cleanup. */
    char got[16];
    size_t len = 0;
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        tbon_rc want = is_member(j, me) ? TBON_ERR_SHUT_DOWN : TBON_ERR_NOT_MEMBER;
        CHECK_IS(tbon_get(d, j->g, j->members[0], "endpoint", got, sizeof got, &len, TIMEOUT_MS),
                 want);
        CHECK_IS(tbon_put(d, j->g, "endpoint", "x", 1), want);
        CHECK_RC(tbon_forget_group(d, j->g));
    }
    CHECK_RC(tbon_free(d)); /* no callback runs after this */
    CHECK_IS(tbon_commit(d, jobs[0].g), TBON_ERR_BAD_HANDLE);
    for (int k = 0; k < 2; k++)
        CHECK_RC(tbon_group_free(jobs[k].g));
    return failures != 0;
}

int main(void) {
    if (getenv("TBON_KEY_FILE") == NULL) {
        fprintf(stderr, "modex: set TBON_KEY_FILE to a job key file (tbon keygen FILE)\n");
        return 1;
    }
    char dir[] = "/tmp/tbon-modex-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("modex: mkdtemp");
        return 1;
    }
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/hnp.uri", dir);
    char rendezvous[sizeof path + 8];
    snprintf(rendezvous, sizeof rendezvous, "file:%s", path);

    pid_t pids[N];
    char size[16];
    snprintf(size, sizeof size, "%d", N);
    for (int r = 0; r < N; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("modex: fork");
            return 1;
        }
        if (pid == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("TBON_RANK", rank, 1);
            setenv("TBON_SIZE", size, 1);
            me = (uint32_t)r;
            _exit(daemon_main(rendezvous));
        }
        pids[r] = pid;
    }
    int bad = 0;
    for (int r = 0; r < N; r++) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "modex: FAILED: rank %d exited with status %d\n", r, status);
            bad++;
        }
    }
    unlink(path);
    rmdir(dir);
    if (bad != 0)
        return 1;
    printf("modex: ok (%d daemons; job 21 by full fence, job 22 by direct fetches, on "
           "overlapping ranks)\n",
           N);
    return 0;
}
