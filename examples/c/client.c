/* client.c: application processes routed through their daemons (tbon_client_*), started the
 * way a resource manager starts a job's processes.
 *
 * The parent forks N daemon processes that form a DVM as in launch.c, each with client_socket
 * in a private directory. Rank 1 opens job 1 and starts client "a"; rank 2 opens job 1 and
 * starts "b", and job 2 and starts "c" (rank 0 only relays). A daemon starts a client with
 * posix_spawn of this program (a daemon has threads: never fork without exec), the job's
 * credential in TBON_CLIENT_SOCKET, TBON_CLIENT_JOB and TBON_CLIENT_KEY, and two pipes: the
 * client writes its name (rank, local id) once admitted, the daemons gather the names with
 * tbon_allgather and write the table to their clients. Then:
 *   - a and b (job 1, on different daemons) each send N_MSG numbered messages to the other
 *     and check that every one arrives once, in order, with the right bytes (the first with
 *     a zero-size buffer: TBON_ERR_TOO_LARGE gives its length and keeps it);
 *   - a's message to c (job 2) is TBON_ERR_NOT_PERMITTED, to a name never given
 *     TBON_ERR_UNKNOWN_CLIENT; c's message to b is TBON_ERR_NOT_PERMITTED;
 *   - b watches a and c, then tells a "bye"; a gets it through tbon_client_recv_cb and exits;
 *     b's watch says TBON_CLIENT_EXITED, after which a send to a is TBON_ERR_CLIENT_GONE; c
 *     exits once it saw a exit, and b once it saw c exit.
 * Each daemon checks its clients' exit statuses, closes its jobs, meets the others in a
 * barrier, and rank 0 shuts the DVM down. Prints "client: ok" and exits 0, or exits non-zero.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C"); TBON_KEY_FILE names the job
 * key, read by every daemon.
 */
#define _GNU_SOURCE /* pipe2 */
#include <fcntl.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define N 3
#define N_MSG 200
#define TAG 200
#define TAG_BYE 201
#define TIMEOUT_MS 60000 /* hang guard only */

enum { A, B, C, ROLES };
static const char *ROLE_NAMES[ROLES] = {"a", "b", "c"};
static const uint32_t RANK_OF[ROLES] = {1, 2, 2}; /* the daemon that starts it */
static const uint64_t JOB_OF[ROLES] = {1, 1, 2};
static uint32_t names[ROLES][2]; /* (rank, local) of every client */
static atomic_int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "client: FAILED %s:%d: ", __FILE__, __LINE__);     \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)
#define CHECK_IS(call, want)                                                              \
    do {                                                                                  \
        tbon_rc rc_ = (call);                                                             \
        CHECK(rc_ == (want), "%s -> %s (%s), expected %s", #call, tbon_strerror(rc_),     \
              tbon_last_error(), tbon_strerror(want));                                    \
    } while (0)
#define CHECK_RC(call) CHECK_IS(call, TBON_OK)

/* Waits (hang guard only) until callbacks brought `v` to at least `want`; returns it. */
static int wait_for(atomic_int *v, int want) {
    struct timespec ms = {0, 1000000L};
    for (long waited = 0; atomic_load(v) < want && waited < TIMEOUT_MS; waited++)
        nanosleep(&ms, NULL);
    return atomic_load(v);
}

/* ---- The client processes. ---- */

static void on_sent(tbon_rc rc, void *user) {
    CHECK(rc == TBON_OK, "a send completed %s", tbon_strerror(rc));
    atomic_fetch_add((atomic_int *)user, 1);
}

static void on_bye(uint32_t rank, uint32_t local, uint32_t tag, const uint8_t *data,
                   size_t len, void *user) {
    int right = rank == names[B][0] && local == names[B][1] && tag == TAG_BYE && len == 3 &&
                memcmp(data, "bye", 3) == 0;
    atomic_store((atomic_int *)user, right ? 1 : 2);
}

static void on_exit_seen(uint32_t rank, uint32_t local, tbon_client_exit reason, void *user) {
    (void)rank, (void)local;
    atomic_store((atomic_int *)user, (int)reason);
}

/* `me` and `peer` send each other N_MSG messages; each checks what it receives. */
static void exchange(tbon_client c, int me, int peer) {
    uint32_t pr = names[peer][0], pl = names[peer][1];
    atomic_int acked = 0;
    char msg[64], got[64];
    for (int i = 0; i < N_MSG; i++) {
        int n = snprintf(msg, sizeof msg, "%s->%s %d", ROLE_NAMES[me], ROLE_NAMES[peer], i);
        CHECK_RC(tbon_client_send(c, pr, pl, TAG, msg, (size_t)n, on_sent, &acked));
    }
    for (int i = 0; i < N_MSG; i++) {
        int n = snprintf(msg, sizeof msg, "%s->%s %d", ROLE_NAMES[peer], ROLE_NAMES[me], i);
        size_t len = 0;
        uint32_t fr = 0, fl = 0, tag = 0;
        if (i == 0) { /* its length first: the message is kept */
            CHECK_IS(tbon_client_recv(c, pr, pl, TAG, NULL, 0, &len, NULL, NULL, NULL,
                                      TIMEOUT_MS), TBON_ERR_TOO_LARGE);
            CHECK(len == (size_t)n, "length %zu, expected %d", len, n);
        }
        CHECK_RC(tbon_client_recv(c, TBON_CLIENT_ANY, TBON_CLIENT_ANY, TBON_TAG_ANY, got,
                                  sizeof got, &len, &fr, &fl, &tag, TIMEOUT_MS));
        CHECK(len == (size_t)n && memcmp(got, msg, len) == 0 && fr == pr && fl == pl &&
                  tag == TAG, "message %d from %u.%u: \"%.*s\", expected \"%s\"", i, fr, fl,
              (int)len, got, msg);
    }
    int done = wait_for(&acked, N_MSG);
    CHECK(done == N_MSG, "%d of %d sends completed", done, N_MSG);
}

static int client_main(int role) {
    tbon_client c = 0;
    tbon_rc rc;
    if (role == B) { /* the explicit form; a and c read the same three variables */
        const char *job = getenv("TBON_CLIENT_JOB");
        rc = tbon_client_connect(getenv("TBON_CLIENT_SOCKET"), job ? strtoull(job, NULL, 10) : 0,
                                 getenv("TBON_CLIENT_KEY"), &c);
    } else {
        rc = tbon_client_from_env(&c);
    }
    if (rc != TBON_OK) {
        fprintf(stderr, "client %s: not admitted: %s (%s)\n", ROLE_NAMES[role], tbon_strerror(rc),
                tbon_last_error());
        return 1;
    }
    uint32_t rank = 0, local = 0, size = 0;
    CHECK_RC(tbon_client_name(c, &rank, &local));
    CHECK_RC(tbon_client_size(c, &size));
    CHECK(size == N, "DVM size %u", size);
    printf("%u %u\n", rank, local); /* to our daemon, which answers with every name */
    fflush(stdout);
    for (int r = 0; r < ROLES; r++)
        if (scanf("%u %u", &names[r][0], &names[r][1]) != 2)
            return 1;
    atomic_int a_gone = 0, c_gone = 0, bye = 0;
    if (role == A) {
        exchange(c, A, B);
        CHECK_IS(tbon_client_send_wait(c, names[C][0], names[C][1], TAG, "x", 1, TIMEOUT_MS),
                 TBON_ERR_NOT_PERMITTED);
        CHECK_IS(tbon_client_send_wait(c, names[B][0], 999, TAG, "x", 1, TIMEOUT_MS),
                 TBON_ERR_UNKNOWN_CLIENT);
        uint64_t id = 0;
        CHECK_RC(tbon_client_recv_cb(c, names[B][0], names[B][1], TAG_BYE, 0, on_bye, &bye, &id));
        CHECK(wait_for(&bye, 1) == 1, "no right \"bye\" from b");
    } else if (role == B) {
        exchange(c, B, A);
        CHECK_RC(tbon_client_watch(c, names[A][0], names[A][1], on_exit_seen, &a_gone));
        CHECK_RC(tbon_client_watch(c, names[C][0], names[C][1], on_exit_seen, &c_gone));
        CHECK_RC(tbon_client_send_wait(c, names[A][0], names[A][1], TAG_BYE, "bye", 3,
                                       TIMEOUT_MS));
        CHECK(wait_for(&a_gone, 1) == TBON_CLIENT_EXITED, "a's exit: %d", atomic_load(&a_gone));
        CHECK_IS(tbon_client_send_wait(c, names[A][0], names[A][1], TAG, "late", 4, TIMEOUT_MS),
                 TBON_ERR_CLIENT_GONE);
        CHECK(wait_for(&c_gone, 1) == TBON_CLIENT_EXITED, "c's exit: %d", atomic_load(&c_gone));
    } else {
        CHECK_IS(tbon_client_send_wait(c, names[B][0], names[B][1], TAG, "x", 1, TIMEOUT_MS),
                 TBON_ERR_NOT_PERMITTED);
        CHECK_RC(tbon_client_watch(c, names[A][0], names[A][1], on_exit_seen, &a_gone));
        CHECK(wait_for(&a_gone, 1) == TBON_CLIENT_EXITED, "a's exit: %d", atomic_load(&a_gone));
    }
    int lost = 1;
    CHECK_RC(tbon_client_daemon_lost(c, &lost, NULL, NULL));
    CHECK(lost == 0, "the daemon is gone");
    CHECK_RC(tbon_client_close(c)); /* the daemon tells those watching */
    return failures != 0;
}

/* ---- The daemons. ---- */

struct kid { int role; pid_t pid; FILE *to, *from; /* its stdin and stdout */ };

static atomic_int gathered;

static void on_names(tbon_rc rc, uint64_t id, const tbon_contribution *parts, size_t count,
                     const uint32_t *excluded, size_t nexcluded, void *user) {
    (void)id, (void)excluded, (void)nexcluded, (void)user;
    for (size_t i = 0; rc == TBON_OK && i < count; i++)
        for (size_t k = 0; k + 3 <= parts[i].len / 4; k += 3) {
            uint32_t t[3];
            memcpy(t, parts[i].data + 4 * k, sizeof t);
            if (t[0] < ROLES)
                names[t[0]][0] = t[1], names[t[0]][1] = t[2];
        }
    atomic_store(&gathered, rc == TBON_OK ? 1 : 2);
}

/* Opens `job` on `d` and starts client `role` with its credential and two pipes. */
static int start_client(tbon_daemon d, uint64_t job, struct kid *k, int role) {
    char key[TBON_CLIENT_KEY_HEX_SIZE], path[256];
    size_t len = sizeof path;
    if (tbon_client_job(d, job, NULL, 0, key) != TBON_OK ||
        tbon_client_socket_path(d, path, &len) != TBON_OK)
        return -1;
    static char vars[3][400];
    snprintf(vars[0], sizeof vars[0], "TBON_CLIENT_SOCKET=%s", path);
    snprintf(vars[1], sizeof vars[1], "TBON_CLIENT_JOB=%llu", (unsigned long long)job);
    snprintf(vars[2], sizeof vars[2], "TBON_CLIENT_KEY=%s", key);
    extern char **environ;
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc(n + 4, sizeof *env);
    int in[2], out[2];
    if (env == NULL || pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return -1;
    memcpy(env, environ, n * sizeof *env);
    env[n] = vars[0], env[n + 1] = vars[1], env[n + 2] = vars[2];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char *argv[] = {"client", "--client", (char *)ROLE_NAMES[role], NULL};
    int err = posix_spawn(&k->pid, "/proc/self/exe", &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(in[0]);
    close(out[1]);
    k->role = role;
    k->to = fdopen(in[1], "w");
    k->from = fdopen(out[0], "r");
    return err == 0 && k->to != NULL && k->from != NULL ? 0 : -1;
}

static int daemon_main(uint32_t rank, const char *dir, const char *rendezvous) {
    char sock[256];
    snprintf(sock, sizeof sock, "%s/d%u.sock", dir, rank);
    tbon_config cfg;
    tbon_daemon d;
    if (tbon_config_new(&cfg) != TBON_OK ||
        tbon_config_set(cfg, "if_include", "127.0.0.1/32") != TBON_OK ||
        tbon_config_set(cfg, "key_file", getenv("TBON_KEY_FILE")) != TBON_OK ||
        tbon_config_set(cfg, "client_socket", sock) != TBON_OK ||
        tbon_launch(cfg, -1, -1, rendezvous, &d) != TBON_OK) {
        fprintf(stderr, "client: rank %u: %s\n", rank, tbon_last_error());
        return 1;
    }
    tbon_config_free(cfg);
    CHECK_RC(tbon_wait_wired(d, TIMEOUT_MS));
    struct kid kids[ROLES];
    int nkids = 0;
    for (int r = 0; r < ROLES; r++) {
        if (RANK_OF[r] != rank)
            continue;
        if (start_client(d, JOB_OF[r], &kids[nkids], r) == 0)
            nkids++;
        else
            CHECK(0, "start %s: %s", ROLE_NAMES[r], tbon_last_error());
    }
    /* Every client's name to every daemon: (role, rank, local) triples. */
    uint32_t mine[3 * ROLES];
    for (int i = 0; i < nkids; i++) {
        mine[3 * i] = (uint32_t)kids[i].role;
        if (fscanf(kids[i].from, "%u %u", &mine[3 * i + 1], &mine[3 * i + 2]) != 2)
            CHECK(0, "client %s gave no name", ROLE_NAMES[kids[i].role]);
    }
    CHECK_RC(tbon_allgather(d, 1, mine, 12 * (size_t)nkids, on_names, NULL));
    CHECK(wait_for(&gathered, 1) == 1, "the names were not gathered");
    for (int i = 0; i < nkids; i++) {
        for (int r = 0; r < ROLES; r++)
            fprintf(kids[i].to, "%u %u\n", names[r][0], names[r][1]);
        fclose(kids[i].to);
    }
    for (int i = 0; i < nkids; i++) {
        int status = 0;
        CHECK(waitpid(kids[i].pid, &status, 0) == kids[i].pid && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0, "client %s ended with status %d",
              ROLE_NAMES[kids[i].role], status);
        fclose(kids[i].from);
        CHECK_RC(tbon_client_job_close(d, JOB_OF[kids[i].role])); /* no more processes here */
    }
    CHECK_RC(tbon_barrier(d, 2, TIMEOUT_MS));
    if (rank == 0)
        tbon_shutdown_dvm(d);
    else
        CHECK_RC(tbon_wait_stopped(d, TIMEOUT_MS));
    tbon_free(d);
    return failures != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--client") == 0)
        for (int r = 0; r < ROLES; r++)
            if (strcmp(argv[2], ROLE_NAMES[r]) == 0)
                return client_main(r);
    if (getenv("TBON_KEY_FILE") == NULL) {
        fprintf(stderr, "client: set TBON_KEY_FILE to a job key file (tbon keygen FILE)\n");
        return 1;
    }
    char dir[] = "/tmp/tbon-client-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("client: mkdtemp");
        return 1;
    }
    char rendezvous[sizeof dir + 16];
    snprintf(rendezvous, sizeof rendezvous, "file:%s/hnp.uri", dir);
    pid_t pids[N];
    char size[16];
    snprintf(size, sizeof size, "%d", N);
    for (int r = N - 1; r >= 0; r--) {
        if ((pids[r] = fork()) < 0) {
            perror("client: fork");
            return 1;
        }
        if (pids[r] == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("TBON_RANK", rank, 1);
            setenv("TBON_SIZE", size, 1);
            _exit(daemon_main((uint32_t)r, dir, rendezvous));
        }
    }
    int bad = 0;
    for (int r = 0; r < N; r++) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "client: FAILED: daemon %d exited with status %d\n", r, status);
            bad++;
        }
    }
    if (rmdir(dir) != 0) { /* rank 0 removes the URI file, each daemon its socket */
        fprintf(stderr, "client: FAILED: %s is not empty\n", dir);
        bad++;
    }
    if (bad != 0)
        return 1;
    printf("client: ok (%d daemons, clients a and b of job 1 exchanged %d messages each way, "
           "job 2 kept apart, a's exit seen)\n", N, N_MSG);
    return 0;
}
