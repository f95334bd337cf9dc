/* fork_and_bounds.c: a forked child's calls with its parent's handles, and lengths past every
 * bound, are errors, never a crash or a hang (a regression test, not an example).
 *
 * From an outside-in review of the C API: in a child made by fork(), the parent's daemon
 * handle took sends into the void (TBON_OK), tbon_free panicked and tbon_counters_get blocked
 * for ever; and tbon_group_new read a member array past its bound before checking it (SIGSEGV),
 * tbon_client_job aborted on a huge n_accept. Prints "fork_and_bounds: ok" and exits 0.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tbon.h"

static int failures;
#define CHECK_IS(call, want)                                                              \
    do {                                                                                  \
        tbon_rc rc_ = (call);                                                             \
        if (rc_ != (want)) {                                                              \
            fprintf(stderr, "fork_and_bounds: FAILED %s:%d: %s -> %s (%s), expected %s\n", \
                    __FILE__, __LINE__, #call, tbon_strerror(rc_), tbon_last_error(),      \
                    tbon_strerror(want));                                                 \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

static tbon_daemon start_one(const char *sock) {
    tbon_config cfg;
    tbon_daemon d = 0;
    CHECK_IS(tbon_config_new(&cfg), TBON_OK);
    CHECK_IS(tbon_config_set(cfg, "key_file", getenv("TBON_KEY_FILE")), TBON_OK);
    CHECK_IS(tbon_config_set(cfg, "if_include", "127.0.0.1/32"), TBON_OK);
    if (sock) CHECK_IS(tbon_config_set(cfg, "client_socket", sock), TBON_OK);
    CHECK_IS(tbon_start(cfg, 0, 1, NULL, &d), TBON_OK);
    CHECK_IS(tbon_config_free(cfg), TBON_OK);
    CHECK_IS(tbon_wait_wired(d, 60000), TBON_OK);
    return d;
}

int main(void) {
    char sock[108];
    snprintf(sock, sizeof sock, "/tmp/tbon-c-fork-%d.sock", (int)getpid());
    tbon_daemon d = start_one(sock);

    /* Lengths past every bound: refused before anything is read. */
    uint32_t two[2] = {0, 0};
    tbon_group g = 0;
    CHECK_IS(tbon_group_new(1, two, (size_t)TBON_GROUP_MEMBERS_MAX + 1, &g), TBON_ERR_TOO_LARGE);
    CHECK_IS(tbon_group_new(1, two, SIZE_MAX, &g), TBON_ERR_TOO_LARGE);
    CHECK_IS(tbon_group_new(1, two, (size_t)1 << 62, &g), TBON_ERR_TOO_LARGE);
    uint64_t jobs[2] = {2, 3};
    char key[TBON_CLIENT_KEY_HEX_SIZE];
    CHECK_IS(tbon_client_job(d, 1, jobs, SIZE_MAX, key), TBON_ERR_TOO_LARGE);
    CHECK_IS(tbon_client_job(d, 1, jobs, (size_t)1 << 62, key), TBON_ERR_TOO_LARGE);
    CHECK_IS(tbon_client_job(d, 1, jobs, 2, key), TBON_OK);
    tbon_outgoing one = {.dst = 0, .tag = 300, .data = "x", .len = 1};
    size_t sent = 0;
    CHECK_IS(tbon_send_batch(d, &one, SIZE_MAX, &sent), TBON_ERR_TOO_LARGE);

    /* A child made by fork(): the parent's handle is refused, never used. */
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t v = 0;
        CHECK_IS(tbon_send(d, 0, 300, "lost", 4, NULL, NULL), TBON_ERR_BAD_HANDLE);
        CHECK_IS(tbon_size(d, (uint32_t *)&v), TBON_ERR_BAD_HANDLE);
        CHECK_IS(tbon_free(d), TBON_ERR_BAD_HANDLE);
        /* The child may start a daemon of its own. */
        char own[108];
        snprintf(own, sizeof own, "/tmp/tbon-c-fork-%d.sock", (int)getpid());
        tbon_daemon c = start_one(own);
        CHECK_IS(tbon_send(c, 0, 301, "mine", 4, NULL, NULL), TBON_OK);
        char buf[8];
        size_t len = sizeof buf;
        CHECK_IS(tbon_recv_blocking(c, 0, 301, 60000, buf, &len, NULL), TBON_OK);
        CHECK_IS(tbon_free(c), TBON_OK);
        _exit(failures == 0 ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fork_and_bounds: FAILED: the child ended with status %d\n", status);
        failures++;
    }
    /* The parent's daemon is untouched. */
    CHECK_IS(tbon_send(d, 0, 302, "still", 5, NULL, NULL), TBON_OK);
    char buf[8];
    size_t len = sizeof buf;
    CHECK_IS(tbon_recv_blocking(d, 0, 302, 60000, buf, &len, NULL), TBON_OK);
    CHECK_IS(tbon_free(d), TBON_OK);
    if (failures) return 1;
    printf("fork_and_bounds: ok\n");
    return 0;
}
