/* Request/response over TCP loopback, for measuring probe overhead on small messages.
 *   rr server PORT            echo every message back, one connection at a time
 *   rr client PORT SIZE SECS  send SIZE bytes, wait for them back, repeat; print transactions/s
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int full(int fd, char *buf, size_t n, int sending) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = sending ? send(fd, buf + done, n - done, 0) : recv(fd, buf + done, n - done, 0);
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int one = 1;
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[65536];
    if (strcmp(argv[1], "server") == 0) {
        int srv = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(srv, (struct sockaddr *)&addr, sizeof addr) || listen(srv, 8))
            return 1;
        for (;;) {
            int c = accept(srv, NULL, NULL);
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            ssize_t r;
            while ((r = recv(c, buf, sizeof buf, 0)) > 0)
                if (full(c, buf, (size_t)r, 1))
                    break;
            close(c);
        }
    }
    size_t size = (size_t)atoi(argv[3]);
    double secs = atof(argv[4]);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr))
        return 1;
    memset(buf, 'r', size);
    long n = 0;
    double start = now(), end = start + secs;
    while (now() < end) {
        for (int i = 0; i < 100; i++) {
            if (full(fd, buf, size, 1) || full(fd, buf, size, 0))
                return 1;
        }
        n += 100;
    }
    printf("%.1f\n", (double)n / (now() - start));
    close(fd);
    return 0;
}
