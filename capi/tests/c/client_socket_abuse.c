/* client_socket_abuse.c: a daemon started from C survives local processes that abuse its
 * client socket (a regression test, not an example).
 *
 * Found by a probe: a process that connected to a C daemon's client socket, wrote garbage and
 * closed at once killed the daemon's whole process with SIGPIPE (exit 141). The daemon wrote
 * its refusal to a socket already closed, with write(2); a C program, unlike a Rust one, does
 * not ignore SIGPIPE. tbon now sends with MSG_NOSIGNAL. This program keeps SIGPIPE's default
 * action, starts one daemon with a client socket, opens and abandons 3,000 connections (half
 * with garbage, half silent), then checks that the daemon still runs and admits a real
 * client. Prints "client_socket_abuse: ok" and exits 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tbon.h"

#define FAIL(...)                                                                  \
    do {                                                                           \
        fprintf(stderr, "client_socket_abuse: FAILED: " __VA_ARGS__);              \
        fprintf(stderr, " (%s)\n", tbon_last_error());                             \
        return 1;                                                                  \
    } while (0)

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* as a C program that never touched it */
    char sock[108];
    snprintf(sock, sizeof sock, "/tmp/tbon-c-abuse-%d.sock", (int)getpid());
    unlink(sock);
    tbon_config cfg;
    if (tbon_config_new(&cfg) != TBON_OK) FAIL("config");
    const char *key = getenv("TBON_KEY_FILE");
    if (key == NULL || tbon_config_set(cfg, "key_file", key) != TBON_OK) FAIL("key_file");
    if (tbon_config_set(cfg, "client_socket", sock) != TBON_OK) FAIL("client_socket");
    tbon_daemon d;
    if (tbon_start(cfg, 0, 1, NULL, &d) != TBON_OK) FAIL("start");
    tbon_config_free(cfg);
    if (tbon_wait_wired(d, 60000) != TBON_OK) FAIL("wired");
    char key_hex[TBON_CLIENT_KEY_HEX_SIZE];
    if (tbon_client_job(d, 1, NULL, 0, key_hex) != TBON_OK) FAIL("client job");

    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
    for (int i = 0; i < 3000; i++) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0) FAIL("socket");
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0 && i % 2)
            (void)send(s, "not a client hello, not at all", 30, MSG_NOSIGNAL);
        close(s);
    }
    struct timespec settle = {0, 200000000L};
    nanosleep(&settle, NULL);

    if (tbon_wait_stopped(d, 0) != TBON_ERR_TIMED_OUT) FAIL("the daemon stopped");
    tbon_client c;
    if (tbon_client_connect(sock, 1, key_hex, &c) != TBON_OK) FAIL("a real client refused");
    uint32_t rank = 99;
    if (tbon_client_name(c, &rank, NULL) != TBON_OK || rank != 0) FAIL("client name");
    tbon_client_close(c);
    tbon_shutdown(d);
    tbon_free(d);
    printf("client_socket_abuse: ok\n");
    return 0;
}
