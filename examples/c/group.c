/* group.c: two jobs on overlapping sets of daemons run their own collectives at once.
 *
 * A resource manager runs one tbon daemon per node and several jobs on subsets of the nodes;
 * each job's daemons need collectives among themselves only. Here the parent forks N daemon
 * processes (before touching tbon), which form a DVM with tbon_launch through a URI file, as
 * launch.c does (radix 2: 0 -> {1, 2}, 1 -> {3, 5}, 2 -> {4, 6}, 3 -> {7}). Two jobs:
 *
 *   job 7 on ranks 1, 3, 4, 6      job 8 on ranks 4, 6, 7      (4 and 6 run both)
 *
 * Every member makes a tbon_group for each of its jobs (the job's number as the context, the
 * job's ranks as members) and runs, in the same order as the other members: an allgather
 * (both jobs' in flight at once; every member checks every member's bytes), a barrier, and a
 * broadcast from the job's root (rank 3 for job 7, rank 6 for job 8). Ranks 0, 2 and 5 are in
 * no job and do nothing but stay up (0 and 2 relay for the members below them, 5 takes no part
 * at all); a call of theirs is refused TBON_ERR_NOT_MEMBER. All daemons then meet in a barrier
 * of the whole DVM; rank 7 fills its bound of group collectives in flight with a job whose
 * other member never calls (TBON_ERR_BUSY beyond it; those end TBON_ERR_SHUT_DOWN when the DVM
 * stops); rank 0 shuts the DVM down. Each daemon exits non-zero on any failure; the parent
 * checks every exit status, prints "group: ok" and exits 0, or exits non-zero.
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

static const uint32_t JOB7[] = {1, 3, 4, 6};
static const uint32_t JOB8[] = {4, 6, 7};

/* One job as one of its member daemons sees it. */
struct job {
    uint64_t number; /* the group's context */
    const uint32_t *members;
    size_t nmembers;
    uint32_t root; /* of the broadcast */
    tbon_group g;
    atomic_int gathered; /* the allgather's result: 0 not yet, 1 right, 2 wrong */
    atomic_int received; /* the broadcast's: the same */
};

static struct job jobs[2] = {
    {7, JOB7, sizeof JOB7 / sizeof JOB7[0], 3, 0, 0, 0},
    {8, JOB8, sizeof JOB8 / sizeof JOB8[0], 6, 0, 0, 0},
};

static uint32_t me; /* this process's rank */
static int failures;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "group: rank %u: FAILED %s:%d: ", me, __FILE__, __LINE__); \
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

/* What member `rank` contributes to job `j`'s allgather. */
static int contribution(char *buf, size_t cap, const struct job *j, uint32_t rank) {
    return snprintf(buf, cap, "job %llu rank %u", (unsigned long long)j->number, rank);
}

/* What the root broadcasts to job `j`. */
static int announcement(char *buf, size_t cap, const struct job *j) {
    return snprintf(buf, cap, "job %llu: step 2 from rank %u", (unsigned long long)j->number,
                    j->root);
}

/* The allgather's result, on the loop thread: the job's first collective (number 0), every
 * member's bytes in rank order, nobody excluded. */
static void on_gathered(tbon_rc rc, uint64_t id, const tbon_contribution *parts, size_t count,
                        const uint32_t *excluded, size_t nexcluded, void *user) {
    struct job *j = user;
    (void)excluded;
    int ok = rc == TBON_OK && id == 0 && count == j->nmembers && nexcluded == 0;
    for (size_t i = 0; ok && i < count; i++) {
        char want[64];
        int n = contribution(want, sizeof want, j, j->members[i]);
        ok = parts[i].rank == j->members[i] && parts[i].len == (size_t)n &&
             memcmp(parts[i].data, want, (size_t)n) == 0;
    }
    if (!ok)
        fprintf(stderr, "group: rank %u: job %llu's allgather: %s, id %llu, %zu parts\n", me,
                (unsigned long long)j->number, tbon_strerror(rc), (unsigned long long)id, count);
    atomic_store(&j->gathered, ok ? 1 : 2);
}

/* The broadcast, on the loop thread: the root's bytes, the job's third collective. */
static void on_announced(tbon_rc rc, uint64_t seq, const uint8_t *data, size_t len, void *user) {
    struct job *j = user;
    char want[64];
    int n = announcement(want, sizeof want, j);
    int ok = rc == TBON_OK && seq == 2 && len == (size_t)n && memcmp(data, want, len) == 0;
    if (!ok)
        fprintf(stderr, "group: rank %u: job %llu's broadcast: %s, seq %llu, %zu bytes\n", me,
                (unsigned long long)j->number, tbon_strerror(rc), (unsigned long long)seq, len);
    atomic_store(&j->received, ok ? 1 : 2);
}

/* Rank 7's calls that stay in flight (the other member never calls): counted as they end. */
static atomic_uint ended_shut_down, ended_otherwise;
static void on_never(tbon_rc rc, uint64_t id, const tbon_contribution *parts, size_t count,
                     const uint32_t *excluded, size_t nexcluded, void *user) {
    (void)id;
    (void)parts;
    (void)count;
    (void)excluded;
    (void)nexcluded;
    (void)user;
    atomic_fetch_add(rc == TBON_ERR_SHUT_DOWN ? &ended_shut_down : &ended_otherwise, 1);
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

/* Misuse answers with error codes and takes no number in the group's sequence. */
static void check_misuse(tbon_daemon d) {
    tbon_group g = 0;
    uint32_t two[] = {1, 2};
    CHECK_IS(tbon_group_new(1, NULL, 0, &g), TBON_ERR_BAD_PARAM); /* no members */
    CHECK_IS(tbon_group_new(1, NULL, 2, &g), TBON_ERR_BAD_PARAM);
    CHECK_IS(tbon_group_new(1, two, 2, NULL), TBON_ERR_BAD_PARAM);
    CHECK(strcmp(tbon_strerror(TBON_ERR_NOT_MEMBER), "unknown tbon_rc") != 0 &&
              strcmp(tbon_strerror(TBON_ERR_RESULT_LOST), "unknown tbon_rc") != 0,
          "the group codes have a description");

    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me)) {
            /* Not this daemon's job: refused, whatever the collective. */
            CHECK_IS(tbon_group_allgather(d, j->g, "x", 1, on_gathered, j), TBON_ERR_NOT_MEMBER);
            CHECK_IS(tbon_group_barrier(d, j->g, TIMEOUT_MS), TBON_ERR_NOT_MEMBER);
            CHECK_IS(tbon_group_broadcast(d, j->g, j->root, NULL, 0, on_announced, j),
                     TBON_ERR_NOT_MEMBER);
        } else {
            /* A root that is not a member; a missing callback. */
            CHECK_IS(tbon_group_broadcast(d, j->g, 5, NULL, 0, on_announced, j),
                     TBON_ERR_NOT_MEMBER);
            CHECK_IS(tbon_group_allgather(d, j->g, NULL, 0, NULL, NULL), TBON_ERR_BAD_PARAM);
        }
        uint64_t seq = 99;
        CHECK_RC(tbon_group_next_seq(j->g, &seq));
        CHECK(seq == 0, "job %llu: the refused calls took numbers (%llu)",
              (unsigned long long)j->number, (unsigned long long)seq);
    }
    /* A member beyond the DVM is found when the group is used. */
    uint32_t beyond[] = {me, N};
    CHECK_RC(tbon_group_new(99, beyond, 2, &g));
    CHECK_IS(tbon_group_barrier(d, g, TIMEOUT_MS), TBON_ERR_RANK_OUT_OF_RANGE);
    CHECK_RC(tbon_group_free(g));
    CHECK_IS(tbon_group_free(g), TBON_ERR_BAD_HANDLE);
    CHECK_IS(tbon_group_barrier(d, g, TIMEOUT_MS), TBON_ERR_BAD_HANDLE);
    CHECK_RC(tbon_group_free(0)); /* nothing to free */
}

/* A member's part in its jobs: three collectives each, in the same order at every member. */
static void run_jobs(tbon_daemon d) {
    /* 0: the allgather, both jobs' in flight at once. */
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me))
            continue;
        char mine[64];
        int n = contribution(mine, sizeof mine, j, me);
        CHECK_RC(tbon_group_allgather(d, j->g, mine, (size_t)n, on_gathered, j));
    }
    for (int k = 0; k < 2; k++)
        if (is_member(&jobs[k], me))
            CHECK(wait_flag(&jobs[k].gathered) == 1, "job %llu's allgather",
                  (unsigned long long)jobs[k].number);
    /* 1: the barrier, which blocks: job 7's, then job 8's (the order of ranks 4 and 6). */
    for (int k = 0; k < 2; k++)
        if (is_member(&jobs[k], me))
            CHECK_RC(tbon_group_barrier(d, jobs[k].g, TIMEOUT_MS));
    /* 2: the broadcast; only the root's bytes are read. */
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me))
            continue;
        char text[64];
        int n = announcement(text, sizeof text, j);
        if (me == j->root)
            CHECK_RC(tbon_group_broadcast(d, j->g, j->root, text, (size_t)n, on_announced, j));
        else
            CHECK_RC(tbon_group_broadcast(d, j->g, j->root, NULL, 0, on_announced, j));
    }
    for (int k = 0; k < 2; k++) {
        struct job *j = &jobs[k];
        if (!is_member(j, me))
            continue;
        CHECK(wait_flag(&j->received) == 1, "job %llu's broadcast", (unsigned long long)j->number);
        uint64_t seq = 0;
        CHECK_RC(tbon_group_next_seq(j->g, &seq));
        CHECK(seq == 3, "job %llu: next number %llu", (unsigned long long)j->number,
              (unsigned long long)seq);
    }
}

/* Only the part of the tree that holds members worked for the jobs. */
static void check_counters(tbon_daemon d) {
    tbon_counters c;
    CHECK_RC(tbon_counters_get(d, &c));
    int jobs_here = is_member(&jobs[0], me) + is_member(&jobs[1], me);
    if (me == 5) /* a leaf in no job */
        CHECK(c.group_sent + c.group_received + c.group_results + c.group_tracked == 0,
              "rank 5 took part: sent %llu received %llu", (unsigned long long)c.group_sent,
              (unsigned long long)c.group_received);
    if (me == 0 || me == 2) /* in no job, but members below */
        CHECK(c.group_received > 0, "rank %u relayed nothing", me);
    CHECK(c.group_results >= (uint64_t)(3 * jobs_here), "%llu group results delivered",
          (unsigned long long)c.group_results);
}

/* Rank 7: job 9 is ranks 0 and 7, and rank 0 never calls: rank 7's calls stay in flight up
 * to its bound; the next is refused and takes no number. */
static void fill_the_bound(tbon_daemon d) {
    uint32_t pair[] = {0, 7};
    tbon_group g;
    CHECK_RC(tbon_group_new(9, pair, 2, &g));
    for (size_t i = 0; i < TBON_GROUP_INFLIGHT_MAX; i++)
        CHECK_RC(tbon_group_allgather(d, g, NULL, 0, on_never, NULL));
    CHECK_IS(tbon_group_allgather(d, g, NULL, 0, on_never, NULL), TBON_ERR_BUSY);
    uint64_t seq = 0;
    CHECK_RC(tbon_group_next_seq(g, &seq));
    CHECK(seq == TBON_GROUP_INFLIGHT_MAX, "job 9: next number %llu", (unsigned long long)seq);
    CHECK_RC(tbon_group_free(g)); /* the calls go on */
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
        fprintf(stderr, "group: rank %u: tbon_launch: %s (%s)\n", me, tbon_strerror(rc),
                tbon_last_error());
        return 1;
    }
    CHECK_RC(tbon_wait_wired(d, TIMEOUT_MS));

    /* Every daemon makes both jobs' groups, so that the non-members can see their calls
     * refused; the members' are the ones that run. */
    for (int k = 0; k < 2; k++)
        CHECK_RC(tbon_group_new(jobs[k].number, jobs[k].members, jobs[k].nmembers, &jobs[k].g));
    check_misuse(d);
    if (failures == 0)
        run_jobs(d);

    /* The whole DVM meets once the jobs are done, then looks at its counters. */
    CHECK_RC(tbon_barrier(d, 1, TIMEOUT_MS));
    check_counters(d);
    if (me == 7)
        fill_the_bound(d);
    CHECK_RC(tbon_barrier(d, 2, TIMEOUT_MS));

    if (me == 0) {
        CHECK_RC(tbon_shutdown_dvm(d));
    } else {
        CHECK_RC(tbon_wait_stopped(d, TIMEOUT_MS));
        tbon_stop why = TBON_STOP_RUNNING;
        CHECK_RC(tbon_stop_reason(d, &why, NULL, NULL));
        CHECK(why == TBON_STOP_DVM_SHUTDOWN, "stopped for reason %d", (int)why);
    }
    CHECK_RC(tbon_free(d)); /* no callback runs after this */
    if (me == 7)
        CHECK(atomic_load(&ended_shut_down) == TBON_GROUP_INFLIGHT_MAX &&
                  atomic_load(&ended_otherwise) == 0,
              "job 9's calls: %u ended TBON_ERR_SHUT_DOWN, %u otherwise",
              atomic_load(&ended_shut_down), atomic_load(&ended_otherwise));
    for (int k = 0; k < 2; k++)
        CHECK_RC(tbon_group_free(jobs[k].g));
    return failures != 0;
}

int main(void) {
    if (getenv("TBON_KEY_FILE") == NULL) {
        fprintf(stderr, "group: set TBON_KEY_FILE to a job key file (tbon keygen FILE)\n");
        return 1;
    }
    char dir[] = "/tmp/tbon-group-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("group: mkdtemp");
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
            perror("group: fork");
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
            fprintf(stderr, "group: FAILED: rank %d exited with status %d\n", r, status);
            bad++;
        }
    }
    unlink(path);
    rmdir(dir);
    if (bad != 0)
        return 1;
    printf("group: ok (%d daemons; jobs 7 and 8 on overlapping ranks: allgather, barrier, "
           "broadcast each)\n",
           N);
    return 0;
}
