/* grow.c: a DVM that grows and shrinks while it runs, in C (issue "Rejoin and grow").
 *
 * The parent plays the launcher. It starts 4 daemons as processes in a DVM with room for 6
 * (every daemon gets size 6 and "initial_size" 4: ranks 4 and 5 are absent at first). Once rank
 * 0 says the DVM is wired (a marker file), it starts ranks 4 and 5 with "rejoin" set: they join
 * the running DVM, each sends a greeting to rank 0 and to rank 1, which wait for them. All six
 * enter a barrier. Then rank 5 leaves in order (tbon_leave): it must stop with
 * TBON_STOP_LEFT. Once it has exited, the parent tells rank 0 (another marker file); rank 0
 * checks its counters (2 joins, 1 departure) and shuts the DVM down; every other daemon checks
 * that it stopped for that reason, and rank 1 that its repair handler (tbon_on_repair) saw
 * both joins and the departure, and no failure. Prints "grow: ok" and exits 0, or exits non-zero.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C"); TBON_KEY_FILE names the
 * job key, read by every child.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define INITIAL 4
#define CAPACITY 6
#define TAG_HELLO 100
#define TIMEOUT_MS 60000 /* hang guard only */

static char dir[] = "/tmp/tbon-grow-XXXXXX";

static void marker(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

/* Waits (hang guard: TIMEOUT_MS) until the marker file `name` exists. */
static int wait_marker(const char *name) {
    char path[128];
    marker(path, sizeof path, name);
    for (int i = 0; i < TIMEOUT_MS / 20; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        struct timespec t = {0, 20 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return 1;
}

static void touch(const char *name) {
    char path[128];
    marker(path, sizeof path, name);
    FILE *f = fopen(path, "w");
    if (f != NULL)
        fclose(f);
}

/* One daemon's life: 0 if everything it checked was right. */
/* What rank 1's repair handler saw in global repairs (read after its loop stopped). */
static unsigned joins_seen, departures_seen, failures_seen;

static void on_repair(const tbon_repair *r, void *user) {
    (void)user;
    if (r->scope != TBON_SCOPE_GLOBAL)
        return;
    joins_seen += (unsigned)r->nrestored;
    departures_seen += (unsigned)r->ndeparted;
    failures_seen += (unsigned)r->nfailed;
}

static int daemon_main(uint32_t rank, const char *rendezvous) {
    int joining = rank >= INITIAL;
    tbon_config cfg;
    tbon_daemon d;
    char initial[16];
    snprintf(initial, sizeof initial, "%d", INITIAL);
    if (tbon_config_new(&cfg) != TBON_OK ||
        tbon_config_set(cfg, "if_include", "127.0.0.1/32") != TBON_OK ||
        tbon_config_set(cfg, "key_file", getenv("TBON_KEY_FILE")) != TBON_OK ||
        tbon_config_set(cfg, "initial_size", initial) != TBON_OK ||
        (joining && tbon_config_set(cfg, "rejoin", "true") != TBON_OK)) {
        fprintf(stderr, "rank %u: configuration: %s\n", rank, tbon_last_error());
        return 1;
    }
    tbon_rc rc = tbon_launch(cfg, -1, -1, rendezvous, &d);
    tbon_config_free(cfg);
    if (rc != TBON_OK) {
        fprintf(stderr, "rank %u: tbon_launch: %s (%s)\n", rank, tbon_strerror(rc),
                tbon_last_error());
        return 1;
    }
    int bad = 0;
    if (rank == 1 && tbon_on_repair(d, on_repair, NULL) != TBON_OK) {
        fprintf(stderr, "rank 1: tbon_on_repair: %s\n", tbon_last_error());
        bad = 1;
    }
    /* A joining daemon is wired once every living daemon knows it joined. */
    if (tbon_wait_wired(d, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: not wired\n", rank);
        bad = 1;
    }
    if (rank == 0 && !bad) {
        /* Before the joins, ranks 4 and 5 are absent (room to grow), not dead. */
        tbon_status st = 0;
        tbon_status_counts n;
        if (tbon_status_get(d, 5000, 0, &st) != TBON_OK ||
            tbon_status_summary(st, &n) != TBON_OK || n.absent != 2 || n.dead != 0 ||
            n.answered != INITIAL) {
            fprintf(stderr, "rank 0: status before the joins: %s\n", tbon_last_error());
            bad = 1;
        }
        tbon_status_free(st);
        touch("wired");
    }
    if (joining && !bad) {
        char hello[64];
        snprintf(hello, sizeof hello, "rank %u joined", rank);
        for (uint32_t to = 0; to < 2; to++) {
            if (tbon_send_reliable(d, to, TAG_HELLO, hello, strlen(hello) + 1, NULL, NULL) !=
                TBON_OK) {
                fprintf(stderr, "rank %u: send to %u: %s\n", rank, to, tbon_last_error());
                bad = 1;
            }
        }
    }
    if (rank < 2 && !bad) {
        /* Rank 0 and rank 1 hear from both new ranks. */
        for (uint32_t from = INITIAL; from < CAPACITY; from++) {
            char got[64];
            size_t len = sizeof got;
            uint32_t origin = 0;
            if (tbon_recv_blocking(d, from, TAG_HELLO, TIMEOUT_MS, got, &len, &origin) !=
                    TBON_OK ||
                origin != from) {
                fprintf(stderr, "rank %u: no greeting from %u: %s\n", rank, from,
                        tbon_last_error());
                bad = 1;
            }
        }
    }
    /* A barrier of all six: ranks 2 and 3 may enter it before the joins are known (then it
     * does not wait for the new ranks, whose entry returns its result), ranks 0 and 1 enter
     * after both greetings; every entry returns TBON_OK. */
    if (!bad && tbon_barrier(d, 1, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: barrier: %s\n", rank, tbon_last_error());
        bad = 1;
    }
    tbon_stop expected = TBON_STOP_DVM_SHUTDOWN;
    if (rank == CAPACITY - 1 && !bad) {
        /* The last rank leaves in order: the others repair around it without a failure. */
        expected = TBON_STOP_LEFT;
        if (tbon_leave(d) != TBON_OK) {
            fprintf(stderr, "rank %u: leave: %s\n", rank, tbon_last_error());
            bad = 1;
        }
    }
    if (rank == 0) {
        if (wait_marker("left") != 0) {
            fprintf(stderr, "rank 0: rank %d never left\n", CAPACITY - 1);
            bad = 1;
        }
        /* Rank 0 admitted both new ranks and confirmed one departure (not a failure). */
        tbon_counters c;
        if (tbon_counters_get(d, &c) != TBON_OK || c.rejoins != 2 || c.departures != 1) {
            fprintf(stderr, "rank 0: counters: %llu rejoins, %llu departures\n",
                    (unsigned long long)c.rejoins, (unsigned long long)c.departures);
            bad = 1;
        }
        tbon_shutdown_dvm(d);
        expected = TBON_STOP_REQUESTED;
    } else if (tbon_wait_stopped(d, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: did not stop\n", rank);
        bad = 1;
    }
    tbon_stop why = TBON_STOP_RUNNING;
    size_t why_len = 0;
    tbon_stop_reason(d, &why, NULL, &why_len);
    if (why != expected) {
        fprintf(stderr, "rank %u: stopped for reason %d, not %d\n", rank, (int)why,
                (int)expected);
        bad = 1;
    }
    if (rank == 1 && (joins_seen != 2 || departures_seen != 1 || failures_seen != 0)) {
        fprintf(stderr, "rank 1: repairs: %u joins, %u departures, %u failures\n", joins_seen,
                departures_seen, failures_seen);
        bad = 1;
    }
    tbon_free(d);
    return bad;
}

static pid_t start(int r, const char *rendezvous) {
    pid_t pid = fork();
    if (pid == 0) {
        char rank[16], size[16];
        snprintf(rank, sizeof rank, "%d", r);
        snprintf(size, sizeof size, "%d", CAPACITY);
        setenv("TBON_RANK", rank, 1);
        setenv("TBON_SIZE", size, 1);
        _exit(daemon_main((uint32_t)r, rendezvous));
    }
    return pid;
}

static int reap(int r, pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "grow: FAILED: rank %d exited with status %d\n", r, status);
        return 1;
    }
    return 0;
}

int main(void) {
    if (getenv("TBON_KEY_FILE") == NULL) {
        fprintf(stderr, "grow: set TBON_KEY_FILE to a job key file (tbon keygen FILE)\n");
        return 1;
    }
    if (mkdtemp(dir) == NULL) {
        perror("grow: mkdtemp");
        return 1;
    }
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/hnp.uri", dir);
    char rendezvous[sizeof path + 8];
    snprintf(rendezvous, sizeof rendezvous, "file:%s", path);

    pid_t pids[CAPACITY];
    for (int r = INITIAL - 1; r >= 0; r--)
        pids[r] = start(r, rendezvous);
    int failures = 0;
    if (wait_marker("wired") != 0) {
        fprintf(stderr, "grow: FAILED: the DVM never wired up\n");
        failures++;
    }
    for (int r = INITIAL; r < CAPACITY; r++)
        pids[r] = start(r, rendezvous);
    /* The leaving rank exits first; then rank 0 may shut the DVM down. */
    failures += reap(CAPACITY - 1, pids[CAPACITY - 1]);
    touch("left");
    for (int r = 0; r < CAPACITY - 1; r++)
        failures += reap(r, pids[r]);
    char m[128];
    marker(m, sizeof m, "wired");
    unlink(m);
    marker(m, sizeof m, "left");
    unlink(m);
    unlink(path);
    rmdir(dir);
    if (failures != 0)
        return 1;
    printf("grow: ok (%d daemons, %d joined, 1 left in order)\n", INITIAL, CAPACITY - INITIAL);
    return 0;
}
