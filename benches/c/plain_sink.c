/* The plain C sink of benches/c_sink.rs and benches/preload.rs: the same
 * work as sink.c's mmsg mode on the C library's own calls (socket, bind,
 * recvmmsg), knowing nothing of spate: run as it is it reads kernel
 * sockets, under spate-run (or LD_PRELOAD with SPATE_ARGS) spate's.
 * `plain_sink N` reads N datagrams sent to port 9, every payload byte of
 * each, 32 at most per call, and prints from the first datagram to the
 * last: the reading thread's CPU time, the whole process's (every thread:
 * spate's lcore too, under spate-run), the machine's softirq time
 * (/proc/stat: the kernel's receive path) and the wall time. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#define BATCH 32

static long long clock_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long process_ns(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000000LL +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000LL;
}

/* The softirq time of every CPU, in ns (/proc/stat's 7th column). */
static long long softirq_ns(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[7] = {0};
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) != 7)
            v[6] = 0;
        fclose(f);
    }
    return (long long)v[6] * (1000000000LL / sysconf(_SC_CLK_TCK));
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 2;
    }
    long want = atol(argv[1]);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int rcvbuf = 128 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(9)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("bind");
        return 2;
    }
    printf("READY\n");
    fflush(stdout);
    static uint8_t bufs[BATCH][2048];
    struct iovec iov[BATCH];
    struct mmsghdr msgs[BATCH];
    for (int i = 0; i < BATCH; i++) {
        iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = sizeof bufs[i]};
        msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
    }
    long got = 0, calls = 0;
    uint64_t sum = 0;
    long long t0 = 0, p0 = 0, s0 = 0, w0 = 0;
    while (got < want) {
        int n = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
        if (n < 0) {
            perror("recvmmsg");
            return 1;
        }
        for (int i = 0; i < n; i++)
            for (unsigned j = 0; j < msgs[i].msg_len; j++)
                sum += bufs[i][j];
        if (got == 0) {
            t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            p0 = process_ns();
            s0 = softirq_ns();
            w0 = clock_ns(CLOCK_MONOTONIC);
        }
        got += n;
        calls++;
    }
    printf("sink datagrams=%ld calls=%ld cpu_ns=%lld process_ns=%lld softirq_ns=%lld wall_ns=%lld sum=%llu\n", got,
           calls, clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0, process_ns() - p0, softirq_ns() - s0,
           clock_ns(CLOCK_MONOTONIC) - w0, (unsigned long long)sum);
    fflush(stdout);
    return 0;
}
