/* The C sink of benches/c_sink.rs: `sink MODE N [spate flags]` reads N
 * datagrams sent to port 9, every payload byte of each, with
 * spate_recvmmsg (MODE mmsg) or the zero-copy calls (MODE zc), 32 at
 * most per call, on the main thread while spate polls on its lcore.
 * Prints what it read and the thread's CPU time from the first datagram
 * to the last. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <spate.h>

#define BATCH 32

static long long thread_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s mmsg|zc N [spate flags]\n", argv[0]);
        return 2;
    }
    int zc = !strcmp(argv[1], "zc");
    long want = atol(argv[2]);
    if (spate_init(argc - 2, (const char *const *)argv + 2) != 0 || spate_start() != 0) {
        perror("spate");
        return 2;
    }
    int fd = spate_socket(AF_INET, SOCK_DGRAM, 0);
    int rcvbuf = 128 << 20; /* doubled: room for every datagram of a run */
    spate_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(9)};
    if (spate_bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("spate_bind");
        return 2;
    }
    printf("READY\n");
    fflush(stdout);
    static uint8_t bufs[BATCH][2048];
    struct iovec iov[BATCH];
    struct mmsghdr msgs[BATCH];
    spate_datagram d[BATCH];
    memset(d, 0, sizeof d);
    for (int i = 0; i < BATCH; i++) {
        iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = sizeof bufs[i]};
        msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
    }
    long got = 0, calls = 0;
    uint64_t sum = 0;
    long long start = 0;
    while (got < want) {
        int n;
        if (zc) {
            n = spate_recv_zc(fd, d, BATCH, 0);
            for (int i = 0; i < n; i++)
                for (uint32_t j = 0; j < d[i].seg_len; j++)
                    sum += d[i].data[j];
            spate_release(d, n > 0 ? n : 0);
        } else {
            n = spate_recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
            for (int i = 0; i < n; i++)
                for (unsigned j = 0; j < msgs[i].msg_len; j++)
                    sum += bufs[i][j];
        }
        if (n < 0) {
            perror("receive");
            return 1;
        }
        if (got == 0)
            start = thread_ns();
        got += n;
        calls++;
    }
    long long ns = thread_ns() - start;
    printf("sink datagrams=%ld calls=%ld cpu_ns=%lld sum=%llu\n", got, calls, ns, (unsigned long long)sum);
    fflush(stdout);
    spate_fini();
    return 0;
}
