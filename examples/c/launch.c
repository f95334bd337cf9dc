/* launch.c: a tiny resource manager in C that starts a DVM of N daemons as separate processes.
 *
 * The parent plays the launcher: it forks N children (before touching tbon, so no tbon thread
 * is ever forked) and gives each its rank in TBON_RANK and the size in TBON_SIZE, as srun or
 * mpirun would. Each child calls tbon_launch with the rendezvous "file:DIR/hnp.uri": rank 0
 * writes its contact URI there, the others wait for the file and dial rank 0. Then each
 * daemon sends a greeting to the next rank around the ring and waits for the previous one's,
 * all meet in a barrier, and rank 0 shuts the DVM down; every other daemon checks that it
 * stopped for that reason. The parent checks every child's exit status and that rank 0
 * removed its URI file. Prints "launch: ok" and exits 0, or exits non-zero.
 *
 * Build and run like ring.c (see README.md, "Using tbon from C"); TBON_KEY_FILE names the
 * job key, read by every child.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tbon.h"

#define N 4
#define TAG_HELLO 100
#define TIMEOUT_MS 60000 /* hang guard only */

/* One daemon's life: 0 if everything it checked was right. */
static int daemon_main(uint32_t rank, const char *rendezvous) {
    tbon_config cfg;
    tbon_daemon d;
    if (tbon_config_new(&cfg) != TBON_OK ||
        tbon_config_set(cfg, "if_include", "127.0.0.1/32") != TBON_OK ||
        tbon_config_set(cfg, "key_file", getenv("TBON_KEY_FILE")) != TBON_OK) {
        fprintf(stderr, "rank %u: configuration: %s\n", rank, tbon_last_error());
        return 1;
    }
    /* Rank and size: -1 reads them from the launcher's environment (TBON_RANK, TBON_SIZE
     * here; SLURM_PROCID and OMPI_COMM_WORLD_RANK under srun and mpirun). */
    tbon_rc rc = tbon_launch(cfg, -1, -1, rendezvous, &d);
    tbon_config_free(cfg);
    if (rc != TBON_OK) {
        fprintf(stderr, "rank %u: tbon_launch: %s (%s)\n", rank, tbon_strerror(rc),
                tbon_last_error());
        return 1;
    }
    int bad = 0;
    if (tbon_wait_wired(d, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: not wired\n", rank);
        bad = 1;
    }
    char hello[64];
    snprintf(hello, sizeof hello, "hello from %u", rank);
    if (!bad && tbon_send(d, (rank + 1) % N, TAG_HELLO, hello, strlen(hello) + 1, NULL, NULL) !=
                    TBON_OK) {
        fprintf(stderr, "rank %u: send: %s\n", rank, tbon_last_error());
        bad = 1;
    }
    char got[64];
    size_t len = sizeof got;
    uint32_t origin = 0;
    uint32_t previous = (rank + N - 1) % N;
    if (!bad && (tbon_recv_blocking(d, previous, TAG_HELLO, TIMEOUT_MS, got, &len, &origin) !=
                     TBON_OK ||
                 origin != previous)) {
        fprintf(stderr, "rank %u: no greeting from %u: %s\n", rank, previous, tbon_last_error());
        bad = 1;
    }
    if (!bad && tbon_barrier(d, 1, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: barrier: %s\n", rank, tbon_last_error());
        bad = 1;
    }
    if (rank == 0) {
        tbon_shutdown_dvm(d);
    } else if (tbon_wait_stopped(d, TIMEOUT_MS) != TBON_OK) {
        fprintf(stderr, "rank %u: the DVM did not stop\n", rank);
        bad = 1;
    }
    tbon_stop why = TBON_STOP_RUNNING;
    size_t why_len = 0;
    tbon_stop_reason(d, &why, NULL, &why_len);
    if (rank != 0 && why != TBON_STOP_DVM_SHUTDOWN) {
        fprintf(stderr, "rank %u: stopped for reason %d, not the DVM shutdown\n", rank, (int)why);
        bad = 1;
    }
    tbon_free(d); /* rank 0: removes its URI file */
    return bad;
}

int main(void) {
    if (getenv("TBON_KEY_FILE") == NULL) {
        fprintf(stderr, "launch: set TBON_KEY_FILE to a job key file (tbon keygen FILE)\n");
        return 1;
    }
    char dir[] = "/tmp/tbon-launch-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("launch: mkdtemp");
        return 1;
    }
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/hnp.uri", dir);
    char rendezvous[sizeof path + 8];
    snprintf(rendezvous, sizeof rendezvous, "file:%s", path);

    pid_t pids[N];
    char size[16];
    snprintf(size, sizeof size, "%d", N);
    /* Ranks N-1 down to 0: the others are already waiting for the file when rank 0 starts. */
    for (int r = N - 1; r >= 0; r--) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("launch: fork");
            return 1;
        }
        if (pid == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("TBON_RANK", rank, 1);
            setenv("TBON_SIZE", size, 1);
            _exit(daemon_main((uint32_t)r, rendezvous));
        }
        pids[r] = pid;
    }
    int failures = 0;
    for (int r = 0; r < N; r++) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "launch: FAILED: rank %d exited with status %d\n", r, status);
            failures++;
        }
    }
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "launch: FAILED: rank 0 left its URI file %s\n", path);
        failures++;
        unlink(path);
    }
    rmdir(dir);
    if (failures != 0)
        return 1;
    printf("launch: ok (%d daemons as processes, found rank 0 through %s)\n", N, path);
    return 0;
}
