/* A C program on spate's C API, run by tests/c_api.rs against the kernel
 * in a network namespace. `capi_peer MODE [spate flags...]`:
 *   echo    an event loop (epoll) over an IPv4 socket (level-triggered),
 *           an IPv6 socket (edge-triggered, one-shot) and a self-pipe
 *           that SIGTERM writes to; datagrams come back with
 *           spate_recvmmsg/spate_sendmmsg.
 *   cmsg    prints each datagram's control messages; replies with
 *           sendmsg control messages (ECN, TTL, UDP_SEGMENT); reads
 *           datagrams with recvmmsg into short buffers, nothing else asked.
 *   signals blocking receives interrupted by a signal, with and without
 *           SA_RESTART, and SO_RCVTIMEO.
 *   stop    threads blocked in calls when the stack stops.
 *   runstop the same when spate_run's callback stops it; a send blocked
 *           on the held lcore's full queue interrupted by a signal.
 *   errno   the errno of bad arguments.
 *   zerocopy an echo on the zero-copy calls.
 * Prints "READY" when it listens, and a line per finding. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <spate.h>

#ifdef __SANITIZE_ADDRESS__
/* The stack lives until the process ends, partly in DPDK's hugepage
 * memory, which LeakSanitizer does not scan for pointers: what it holds
 * would be reported as leaked at exit. Errors in use are still caught. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}
#endif

#define BATCH 32
#define BIG 65536

static int failures;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                           \
            printf(__VA_ARGS__);                                                  \
            printf(" (errno %d %s)\n", errno, strerror(errno));                   \
            failures++;                                                           \
        }                                                                         \
    } while (0)

static int bound_socket(int family, int port)
{
    int fd = spate_socket(family, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("spate_socket");
        exit(2);
    }
    int rc;
    if (family == AF_INET) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        rc = spate_bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any};
        int on = 1;
        spate_setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
        rc = spate_bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc < 0) {
        perror("spate_bind");
        exit(2);
    }
    return fd;
}

/* ---- echo: an event loop over two spate sockets and a pipe ---- */

static int self_pipe[2];

static void on_term(int sig)
{
    (void)sig;
    char b = 1;
    if (write(self_pipe[1], &b, 1) < 0) {
    }
}

struct batch {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_storage from[BATCH];
    char *bufs[BATCH];
};

static void batch_init(struct batch *b)
{
    for (int i = 0; i < BATCH; i++) {
        b->bufs[i] = malloc(BIG);
        b->iov[i] = (struct iovec){.iov_base = b->bufs[i], .iov_len = BIG};
    }
}

static void batch_reset(struct batch *b)
{
    for (int i = 0; i < BATCH; i++) {
        b->iov[i].iov_len = BIG;
        b->msgs[i].msg_hdr = (struct msghdr){.msg_name = &b->from[i], .msg_namelen = sizeof b->from[i],
                                             .msg_iov = &b->iov[i], .msg_iovlen = 1};
    }
}

/* Echoes what is queued on `fd` until it would block; returns datagrams. */
static long echo_drain(int fd, struct batch *b)
{
    long total = 0;
    for (;;) {
        batch_reset(b);
        int n = spate_recvmmsg(fd, b->msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0) {
            CHECK(errno == EAGAIN, "recvmmsg on a readable socket");
            return total;
        }
        for (int i = 0; i < n; i++)
            b->iov[i].iov_len = b->msgs[i].msg_len;
        int sent = spate_sendmmsg(fd, b->msgs, n, 0);
        CHECK(sent == n, "sendmmsg sent %d of %d", sent, n);
        total += n;
    }
}

static int mode_echo(void)
{
    CHECK(pipe2(self_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe");
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    int v4 = bound_socket(AF_INET, 7), v6 = bound_socket(AF_INET6, 7);
    CHECK(spate_poll_fd(v4) == v4, "the socket is its own poll descriptor");
    /* Room for the peer's burst of 200 however late this thread runs. */
    int rcvbuf = 1 << 20, got = 0;
    socklen_t gl = sizeof got;
    for (int i = 0; i < 2; i++)
        CHECK(spate_setsockopt(i ? v6 : v4, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0, "SO_RCVBUF");
    CHECK(spate_getsockopt(v4, SOL_SOCKET, SO_RCVBUF, &got, &gl) == 0 && got == 2 << 20, "SO_RCVBUF doubled: %d", got);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = v4};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, v4, &ev) == 0, "epoll add v4");
    ev = (struct epoll_event){.events = EPOLLIN | EPOLLET | EPOLLONESHOT, .data.fd = v6};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, v6, &ev) == 0, "epoll add v6");
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = self_pipe[0]};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, self_pipe[0], &ev) == 0, "epoll add pipe");
    /* A second epoll set holds v4 too: readiness in any number of sets. */
    int ep2 = epoll_create1(EPOLL_CLOEXEC);
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = v4};
    CHECK(epoll_ctl(ep2, EPOLL_CTL_ADD, v4, &ev) == 0, "epoll2 add v4");
    struct batch b;
    batch_init(&b);
    long echoed[2] = {0, 0}, wakes = 0, second_set = 0;
    printf("READY\n");
    fflush(stdout);
    for (;;) {
        struct epoll_event got[4];
        int n = epoll_wait(ep, got, 4, 10000);
        if (n < 0 && errno == EINTR)
            continue;
        CHECK(n > 0, "epoll_wait timed out");
        if (n <= 0)
            break;
        wakes++;
        int done = 0;
        for (int i = 0; i < n; i++) {
            int fd = got[i].data.fd;
            if (fd == self_pipe[0]) {
                done = 1;
            } else if (fd == v4) {
                if (epoll_wait(ep2, got + 3, 1, 0) == 1)
                    second_set++;
                echoed[0] += echo_drain(v4, &b);
            } else {
                echoed[1] += echo_drain(v6, &b);
                ev = (struct epoll_event){.events = EPOLLIN | EPOLLET | EPOLLONESHOT, .data.fd = v6};
                CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, v6, &ev) == 0, "epoll rearm v6");
            }
        }
        if (done)
            break;
    }
    /* Drained: the socket's descriptor is not readable now. */
    struct epoll_event none;
    CHECK(epoll_wait(ep2, &none, 1, 0) == 0, "an empty socket is not readable");
    printf("echoed v4 %ld v6 %ld wakes %ld second-set %ld\n", echoed[0], echoed[1], wakes, second_set);
    CHECK(spate_close(v4) == 0 && spate_close(v6) == 0, "close");
    spate_fini();
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- cmsg: control messages in and out ---- */

static int mode_cmsg(void)
{
    int v4 = bound_socket(AF_INET, 5000), v6 = bound_socket(AF_INET6, 5000), plain = bound_socket(AF_INET, 5001);
    struct timeval five = {.tv_sec = 5};
    CHECK(spate_setsockopt(plain, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five) == 0, "SO_RCVTIMEO");
    int on = 1;
    CHECK(spate_setsockopt(v4, IPPROTO_IP, IP_PKTINFO, &on, sizeof on) == 0, "IP_PKTINFO");
    CHECK(spate_setsockopt(v4, IPPROTO_IP, IP_RECVTOS, &on, sizeof on) == 0, "IP_RECVTOS");
    CHECK(spate_setsockopt(v4, IPPROTO_IP, IP_RECVTTL, &on, sizeof on) == 0, "IP_RECVTTL");
    CHECK(spate_setsockopt(v4, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) == 0, "SO_TIMESTAMPNS");
    CHECK(spate_setsockopt(v6, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on) == 0, "IPV6_RECVPKTINFO");
    CHECK(spate_setsockopt(v6, IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof on) == 0, "IPV6_RECVTCLASS");
    CHECK(spate_setsockopt(v6, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &on, sizeof on) == 0, "IPV6_RECVHOPLIMIT");
    int got = 0;
    socklen_t gl = sizeof got;
    CHECK(spate_getsockopt(v4, IPPROTO_IP, IP_PKTINFO, &got, &gl) == 0 && got == 1 && gl == sizeof got, "get IP_PKTINFO");
    printf("READY\n");
    fflush(stdout);
    /* Three datagrams per family from the peer; the third of each with a
     * control buffer too short for what was asked (MSG_CTRUNC). */
    for (int round = 0; round < 6; round++) {
        int fd = round < 3 ? v4 : v6;
        char data[2048], control[256];
        struct sockaddr_storage from;
        struct iovec iov = {.iov_base = data, .iov_len = sizeof data};
        struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1,
                           .msg_control = control, .msg_controllen = round % 3 == 2 ? 20 : sizeof control};
        ssize_t n = spate_recvmsg(fd, &m, 0);
        CHECK(n >= 0, "recvmsg");
        if (n < 0)
            continue;
        char line[512];
        int at = snprintf(line, sizeof line, "%s len=%zd", fd == v4 ? "v4" : "v6", n);
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            char a[INET6_ADDRSTRLEN];
            if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                struct in_pktinfo *p = (void *)CMSG_DATA(c);
                at += snprintf(line + at, sizeof line - at, " pktinfo=%s,%d",
                               inet_ntop(AF_INET, &p->ipi_addr, a, sizeof a), p->ipi_ifindex);
            } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
                at += snprintf(line + at, sizeof line - at, " tos=%u", *(unsigned char *)CMSG_DATA(c));
            } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
                at += snprintf(line + at, sizeof line - at, " ttl=%d", *(int *)CMSG_DATA(c));
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
                struct timespec *t = (void *)CMSG_DATA(c), now;
                clock_gettime(CLOCK_REALTIME, &now);
                long long age = (now.tv_sec - t->tv_sec) * 1000000000LL + (now.tv_nsec - t->tv_nsec);
                at += snprintf(line + at, sizeof line - at, " stamp-age-ok=%d", age >= 0 && age < 5000000000LL);
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
                struct in6_pktinfo *p = (void *)CMSG_DATA(c);
                at += snprintf(line + at, sizeof line - at, " pktinfo6=%s,%d",
                               inet_ntop(AF_INET6, &p->ipi6_addr, a, sizeof a), p->ipi6_ifindex);
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
                at += snprintf(line + at, sizeof line - at, " tclass=%d", *(int *)CMSG_DATA(c));
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
                at += snprintf(line + at, sizeof line - at, " hoplimit=%d", *(int *)CMSG_DATA(c));
            }
        }
        if (m.msg_flags & MSG_CTRUNC)
            at += snprintf(line + at, sizeof line - at, " ctrunc");
        printf("%s\n", line);
        fflush(stdout);
        if (round % 3 == 0) {
            /* The reply: 3000 bytes as 1000-byte segments, ECN CE, TTL or
             * hop limit 21. */
            char reply[3000];
            memset(reply, 'r', sizeof reply);
            struct iovec out = {.iov_base = reply, .iov_len = sizeof reply};
            union {
                char buf[CMSG_SPACE(sizeof(uint16_t)) + 2 * CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } u;
            memset(&u, 0, sizeof u);
            struct msghdr r = {.msg_name = &from, .msg_namelen = m.msg_namelen, .msg_iov = &out, .msg_iovlen = 1,
                               .msg_control = u.buf, .msg_controllen = sizeof u.buf};
            struct cmsghdr *c = CMSG_FIRSTHDR(&r);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            *(uint16_t *)CMSG_DATA(c) = 1000;
            c = CMSG_NXTHDR(&r, c);
            c->cmsg_level = fd == v4 ? IPPROTO_IP : IPPROTO_IPV6;
            c->cmsg_type = fd == v4 ? IP_TOS : IPV6_TCLASS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            *(int *)CMSG_DATA(c) = 3;
            c = CMSG_NXTHDR(&r, c);
            c->cmsg_level = fd == v4 ? IPPROTO_IP : IPPROTO_IPV6;
            c->cmsg_type = fd == v4 ? IP_TTL : IPV6_HOPLIMIT;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            *(int *)CMSG_DATA(c) = 21;
            CHECK(spate_sendmsg(fd, &r, 0) == (ssize_t)sizeof reply, "sendmsg with UDP_SEGMENT, ECN and TTL");
        }
    }
    /* Then four datagrams of 10 to 13 bytes to a socket with nothing
     * asked, read by recvmmsg into 11-byte buffers with no address (the
     * bytes-alone path), MSG_TRUNC: each length whole, the longer flagged. */
    int got_plain = 0;
    for (int tries = 0; tries < 8 && got_plain < 4; tries++) {
        char small[4][11];
        struct iovec iov[4];
        struct mmsghdr mm[4];
        memset(mm, 0, sizeof mm);
        for (int i = 0; i < 4; i++) {
            iov[i] = (struct iovec){.iov_base = small[i], .iov_len = sizeof small[i]};
            mm[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1, .msg_flags = -1};
        }
        int n = spate_recvmmsg(plain, mm, 4 - got_plain, MSG_TRUNC, NULL);
        CHECK(n > 0, "plain recvmmsg");
        for (int i = 0; i < n; i++) {
            int same = mm[i].msg_len >= 10;
            for (unsigned j = 0; same && j < mm[i].msg_len && j < sizeof small[i]; j++)
                same = small[i][j] == 'y';
            printf("plain len=%u trunc=%d ctl=%zu bytes-ok=%d\n", mm[i].msg_len, !!(mm[i].msg_hdr.msg_flags & MSG_TRUNC),
                   (size_t)mm[i].msg_hdr.msg_controllen, same);
        }
        got_plain += n > 0 ? n : 0;
    }
    /* Three more: a bad second message (a NULL iovec) ends recvmmsg after
     * the first, and what was taken for it stays queued, in order. */
    char z[3][8];
    struct iovec zi[3];
    struct mmsghdr zm[3];
    memset(zm, 0, sizeof zm);
    for (int i = 0; i < 3; i++) {
        zi[i] = (struct iovec){.iov_base = z[i], .iov_len = sizeof z[i]};
        zm[i].msg_hdr = (struct msghdr){.msg_iov = &zi[i], .msg_iovlen = 1};
    }
    /* MSG_PEEK: each message gets the head datagram, which stays. */
    int peeked = spate_recvmmsg(plain, zm, 2, MSG_PEEK, NULL);
    printf("peek n=%d %.*s %.*s\n", peeked, peeked > 0 ? (int)zm[0].msg_len : 0, z[0],
           peeked > 1 ? (int)zm[1].msg_len : 0, z[1]);
    spate_datagram zd[1];
    memset(zd, 0, sizeof zd);
    CHECK(spate_recv_zc(plain, zd, 1, MSG_PEEK) == -1 && errno == EINVAL, "zero-copy peek");
    zm[1].msg_hdr.msg_iov = NULL;
    int first = spate_recvmmsg(plain, zm, 3, 0, NULL);
    zm[1].msg_hdr.msg_iov = &zi[1];
    int rest = spate_recvmmsg(plain, zm + 1, 2, 0, NULL);
    printf("bad-second first=%d %.*s rest=%d %.*s %.*s\n", first, first > 0 ? (int)zm[0].msg_len : 0, z[0], rest,
           rest > 0 ? (int)zm[1].msg_len : 0, z[1], rest > 1 ? (int)zm[2].msg_len : 0, z[2]);
    spate_fini();
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- signals ---- */

static volatile sig_atomic_t handled;

static void on_usr1(int sig)
{
    (void)sig;
    handled++;
}

struct blocked {
    int fd;
    ssize_t ret;
    int err;
    pthread_t thread;
};

static void *blocked_recv(void *arg)
{
    struct blocked *b = arg;
    char buf[64];
    b->ret = spate_recv(b->fd, buf, sizeof buf, 0);
    b->err = errno;
    return NULL;
}

static void sleep_ms(int ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) < 0 && errno == EINTR) {
    }
}

static int mode_signals(void)
{
    int fd = bound_socket(AF_INET, 5001);
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    /* Without SA_RESTART: EINTR. */
    sigaction(SIGUSR1, &sa, NULL);
    struct blocked b = {.fd = fd};
    pthread_create(&b.thread, NULL, blocked_recv, &b);
    sleep_ms(200);
    pthread_kill(b.thread, SIGUSR1);
    pthread_join(b.thread, NULL);
    CHECK(b.ret == -1 && b.err == EINTR && handled == 1, "no SA_RESTART: EINTR (ret %zd errno %d)", b.ret, b.err);
    printf("eintr ok\n");
    /* With SA_RESTART: the receive goes on and gets the peer's datagram. */
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    b = (struct blocked){.fd = fd};
    pthread_create(&b.thread, NULL, blocked_recv, &b);
    sleep_ms(200);
    pthread_kill(b.thread, SIGUSR1);
    sleep_ms(200);
    CHECK(handled == 2, "the handler ran");
    printf("READY\n");
    fflush(stdout);
    pthread_join(b.thread, NULL);
    CHECK(b.ret == 5, "SA_RESTART: the receive restarted and got the datagram (ret %zd errno %d)", b.ret, b.err);
    printf("restart ok\n");
    /* SO_RCVTIMEO: EAGAIN after it; a signal then is EINTR even with
     * SA_RESTART, as Linux's timed socket wait. */
    struct timeval tv = {.tv_sec = 0, .tv_usec = 300000};
    CHECK(spate_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[8];
    ssize_t n = spate_recv(fd, buf, sizeof buf, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    CHECK(n == -1 && errno == EAGAIN && ms >= 290 && ms < 2000, "SO_RCVTIMEO: EAGAIN after %ld ms", ms);
    tv.tv_sec = 5;
    spate_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    b = (struct blocked){.fd = fd};
    pthread_create(&b.thread, NULL, blocked_recv, &b);
    sleep_ms(200);
    pthread_kill(b.thread, SIGUSR1);
    pthread_join(b.thread, NULL);
    CHECK(b.ret == -1 && b.err == EINTR, "a timed wait is interrupted even with SA_RESTART (ret %zd errno %d)", b.ret,
          b.err);
    printf("timeout ok\n");
    spate_fini();
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- stop: blocked threads end with ENETDOWN ---- */

static void *blocked_recvmmsg(void *arg)
{
    struct blocked *b = arg;
    char buf[64];
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct mmsghdr m = {.msg_hdr = {.msg_iov = &iov, .msg_iovlen = 1}};
    b->ret = spate_recvmmsg(b->fd, &m, 1, 0, NULL);
    b->err = errno;
    return NULL;
}

static int mode_stop(void)
{
    int v4 = bound_socket(AF_INET, 5002), v6 = bound_socket(AF_INET6, 5002);
    int unbound = spate_socket(AF_INET, SOCK_DGRAM, 0);
    struct blocked b[4] = {{.fd = v4}, {.fd = v4}, {.fd = v6}, {.fd = unbound}};
    pthread_create(&b[0].thread, NULL, blocked_recv, &b[0]);
    pthread_create(&b[1].thread, NULL, blocked_recvmmsg, &b[1]);
    pthread_create(&b[2].thread, NULL, blocked_recv, &b[2]);
    pthread_create(&b[3].thread, NULL, blocked_recv, &b[3]);
    printf("READY\n");
    fflush(stdout);
    sleep_ms(300);
    /* SHUT_RD ends a blocked receive with 0 (a non-blocking one: EAGAIN). */
    int shut = bound_socket(AF_INET, 5003);
    struct blocked sb = {.fd = shut};
    pthread_create(&sb.thread, NULL, blocked_recv, &sb);
    sleep_ms(200);
    CHECK(spate_shutdown(shut, SHUT_RD) == -1 && errno == ENOTCONN, "shutdown of an unconnected socket");
    pthread_join(sb.thread, NULL);
    CHECK(sb.ret == 0, "SHUT_RD ended the blocked receive (ret %zd errno %d)", sb.ret, sb.err);
    char nb[8];
    CHECK(spate_recv(shut, nb, sizeof nb, MSG_DONTWAIT) == -1 && errno == EAGAIN, "non-blocking after SHUT_RD");
    CHECK(spate_fini() == 0, "spate_fini");
    for (int i = 0; i < 4; i++) {
        pthread_join(b[i].thread, NULL);
        CHECK(b[i].ret == -1 && b[i].err == ENETDOWN, "thread %d: ret %zd errno %d", i, b[i].ret, b[i].err);
    }
    char buf[8];
    CHECK(spate_recv(v4, buf, sizeof buf, 0) == -1 && errno == ENETDOWN, "a later receive");
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "198.18.0.1", &to.sin_addr);
    CHECK(spate_sendto(v4, "x", 1, 0, (struct sockaddr *)&to, sizeof to) == -1 && errno == ENETDOWN, "a later send");
    CHECK(spate_socket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == ENETDOWN, "a later socket");
    printf("stopped ok\nfailures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- runstop: spate_run's callback stops the stack ---- */

static long long mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static long long run_until;
static volatile int hold_lcore;
static void hold_begins(void);

/* The program's loop on the lcore: once, a long step (the lcore drains
 * nothing meanwhile, while a thread fills its queue); done (negative)
 * after run_until. */
static int stop_later(void *arg)
{
    (void)arg;
    if (hold_lcore) {
        hold_lcore = 0;
        hold_begins();
        sleep_ms(1500);
    }
    return mono_ms() >= run_until ? -1 : 0;
}

struct flood {
    int fd;
    long sent;
    ssize_t ret;
    int err;
    pthread_t thread;
};

/* Sends until a send fails (the lcore's queue fills, and the send that
 * waits for room is interrupted). */
static void *flood_sends(void *arg)
{
    struct flood *f = arg;
    /* Made on the lcore, whose thread blocks every signal. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "198.18.0.1", &to.sin_addr);
    for (long i = 0; i < 1000000; i++) {
        ssize_t r = spate_sendto(f->fd, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
        if (r < 0) {
            f->ret = r;
            f->err = errno;
            return NULL;
        }
        f->sent++;
    }
    return NULL;
}

static void *interrupt_later(void *arg)
{
    sleep_ms(700);
    pthread_kill(*(pthread_t *)arg, SIGUSR1);
    return NULL;
}

static struct flood flood;
static pthread_t kick;

/* On the held lcore, the stack running: the flood and, later, its signal. */
static void hold_begins(void)
{
    pthread_create(&flood.thread, NULL, flood_sends, &flood);
    pthread_create(&kick, NULL, interrupt_later, &flood.thread);
}

static int mode_runstop(void)
{
    struct sigaction sa = {.sa_handler = on_usr1}; /* no SA_RESTART */
    sigaction(SIGUSR1, &sa, NULL);
    int bound = bound_socket(AF_INET, 5004), unbound = spate_socket(AF_INET, SOCK_DGRAM, 0);
    struct blocked b[2] = {{.fd = bound}, {.fd = unbound}};
    for (int i = 0; i < 2; i++)
        pthread_create(&b[i].thread, NULL, blocked_recv, &b[i]);
    /* A blocking send waiting for room in the held lcore's queue ends
     * with EINTR when a handler without SA_RESTART runs. */
    flood.fd = bound_socket(AF_INET, 5005);
    printf("READY\n");
    fflush(stdout);
    run_until = mono_ms() + 2500;
    hold_lcore = 1;
    CHECK(spate_run(stop_later, NULL) == 0, "spate_run");
    pthread_join(kick, NULL);
    pthread_join(flood.thread, NULL);
    CHECK(flood.ret == -1 && flood.err == EINTR && flood.sent >= 1000, "blocked send: ret %zd errno %d after %ld sends",
          flood.ret, flood.err, flood.sent);
    printf("send interrupted after %ld sends\n", flood.sent);
    /* The stack stopped: blocked threads wake, bound socket or not. */
    for (int i = 0; i < 2; i++) {
        pthread_join(b[i].thread, NULL);
        CHECK(b[i].ret == -1 && b[i].err == ENETDOWN, "thread %d: ret %zd errno %d", i, b[i].ret, b[i].err);
    }
    printf("run stopped ok\nfailures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- zerocopy: datagrams in their mbufs, replies in the requests' ---- */

static int mode_zerocopy(void)
{
    int fd = bound_socket(AF_INET, 7);
    spate_datagram d[BATCH];
    memset(d, 0, sizeof d);
    long echoed = 0;
    printf("READY\n");
    fflush(stdout);
    for (;;) {
        int n = spate_recv_zc(fd, d, BATCH, 0);
        CHECK(n > 0, "spate_recv_zc");
        if (n <= 0)
            break;
        int quit = 0;
        for (int i = 0; i < n; i++) {
            if (d[i].seg_len >= 3 && !memcmp(d[i].data, "gen", 3)) {
                /* Three datagrams from buffers filled in place. */
                struct sockaddr_in from;
                socklen_t fl = sizeof from;
                CHECK(spate_datagram_addrs(fd, &d[i], (struct sockaddr *)&from, &fl, NULL, NULL) == 0 &&
                          fl == sizeof from && from.sin_family == AF_INET,
                      "spate_datagram_addrs");
                spate_sendbuf b[3];
                for (int k = 0; k < 3; k++) {
                    CHECK(spate_sendbuf_alloc(fd, &b[k], 100) == 0, "spate_sendbuf_alloc");
                    memset(b[k].data, 'a' + k, 100);
                    b[k].len = 10 * (k + 1);
                }
                CHECK(spate_send_zc(fd, b, 3, (struct sockaddr *)&from, fl) == 3, "spate_send_zc");
                spate_release(&d[i], 1);
            } else if (d[i].seg_len == 4 && !memcmp(d[i].data, "quit", 4)) {
                quit = 1;
                spate_release(&d[i], 1);
            } else if (d[i].seg_len < d[i].len) {
                /* Reassembled from fragments: the segments copied out
                 * agree with its length. */
                static char whole[BIG];
                CHECK(spate_datagram_copy(&d[i], (uint8_t *)whole, sizeof whole) == (ssize_t)d[i].len, "copy");
            } else if (d[i].len > 0) {
                /* Written in place: the first byte's complement. */
                d[i].data[0] = (uint8_t)~d[i].data[0];
            }
        }
        int sent = spate_reply_zc(fd, d, n);
        for (int i = 0; i < n; i++)
            CHECK(d[i].data == NULL, "the reply took every datagram");
        echoed += sent > 0 ? sent : 0;
        if (quit)
            break;
    }
    /* Released handles are passed over: a second release is harmless. */
    spate_release(d, BATCH);
    printf("zero-copy echoed %ld\n", echoed);
    spate_fini();
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- errno: bad arguments ---- */

#define EXPECT(call, want)                                                                    \
    do {                                                                                      \
        errno = 0;                                                                            \
        long r_ = (long)(call);                                                               \
        CHECK(r_ == -1 && errno == (want), "%s: want errno %d, got %ld", #call, (want), r_); \
        checks++;                                                                             \
    } while (0)

static int mode_errno(void)
{
    int checks = 0;
    int fd = spate_socket(AF_INET, SOCK_DGRAM, 0), fd6 = spate_socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(5003)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(5003)};
    char buf[16];
    socklen_t len = sizeof a4;
    EXPECT(spate_socket(AF_UNIX, SOCK_DGRAM, 0), EAFNOSUPPORT);
    EXPECT(spate_socket(AF_INET, SOCK_STREAM, 0), ESOCKTNOSUPPORT);
    EXPECT(spate_socket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), EPROTONOSUPPORT);
    EXPECT(spate_bind(12345, (struct sockaddr *)&a4, sizeof a4), EBADF);
    EXPECT(spate_bind(-1, (struct sockaddr *)&a4, sizeof a4), EBADF);
    EXPECT(spate_bind(fd, NULL, sizeof a4), EFAULT);
    EXPECT(spate_bind(fd, (struct sockaddr *)&a4, 3), EINVAL);
    EXPECT(spate_bind(fd, (struct sockaddr *)&a4, 1000), EINVAL);
    EXPECT(spate_bind(fd, (struct sockaddr *)&a6, sizeof a6), EAFNOSUPPORT);
    EXPECT(spate_bind(fd6, (struct sockaddr *)&a4, sizeof a4), EINVAL);
    struct sockaddr_in other = {.sin_family = AF_INET, .sin_port = htons(5003)};
    inet_pton(AF_INET, "192.0.2.7", &other.sin_addr);
    EXPECT(spate_bind(fd, (struct sockaddr *)&other, sizeof other), EADDRNOTAVAIL);
    CHECK(spate_bind(fd, (struct sockaddr *)&a4, sizeof a4) == 0, "bind");
    EXPECT(spate_bind(fd, (struct sockaddr *)&a4, sizeof a4), EINVAL);
    int again = spate_socket(AF_INET, SOCK_DGRAM, 0);
    EXPECT(spate_bind(again, (struct sockaddr *)&a4, sizeof a4), EADDRINUSE);
    EXPECT(spate_getsockname(fd, NULL, &len), EFAULT);
    EXPECT(spate_getpeername(fd, (struct sockaddr *)&a4, &len), ENOTCONN);
    EXPECT(spate_send(fd, buf, sizeof buf, 0), EDESTADDRREQ);
    EXPECT(spate_sendto(fd, NULL, 10, 0, (struct sockaddr *)&a4, sizeof a4), EFAULT);
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "198.18.0.1", &peer.sin_addr);
    static char huge[70000];
    EXPECT(spate_sendto(fd, huge, 65508, 0, (struct sockaddr *)&peer, sizeof peer), EMSGSIZE);
    struct sockaddr_in6 peer6 = {.sin6_family = AF_INET6, .sin6_port = htons(9)};
    inet_pton(AF_INET6, "fd00::1", &peer6.sin6_addr);
    EXPECT(spate_sendto(fd6, huge, 65528, 0, (struct sockaddr *)&peer6, sizeof peer6), EMSGSIZE);
    CHECK(spate_sendto(fd6, huge, 65527, 0, (struct sockaddr *)&peer6, sizeof peer6) == 65527, "the largest IPv6 datagram");
    EXPECT(spate_sendto(fd, buf, 4, 0, (struct sockaddr *)&peer6, sizeof peer6), EAFNOSUPPORT);
    EXPECT(spate_sendto(fd, buf, 4, MSG_OOB, (struct sockaddr *)&peer, sizeof peer), EOPNOTSUPP);
    EXPECT(spate_recv(fd, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
    EXPECT(spate_recv(fd, NULL, 10, MSG_DONTWAIT), EFAULT);
    EXPECT(spate_recvmsg(fd, NULL, MSG_DONTWAIT), EFAULT);
    struct msghdr m = {.msg_iov = NULL, .msg_iovlen = 2};
    EXPECT(spate_recvmsg(fd, &m, MSG_DONTWAIT), EFAULT);
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    m = (struct msghdr){.msg_iov = &iov, .msg_iovlen = 5000};
    EXPECT(spate_recvmsg(fd, &m, MSG_DONTWAIT), EMSGSIZE);
    EXPECT(spate_recvmmsg(fd, NULL, 4, MSG_DONTWAIT, NULL), EFAULT);
    struct mmsghdr mm = {.msg_hdr = {.msg_iov = &iov, .msg_iovlen = 1}};
    struct timespec bad = {.tv_sec = 0, .tv_nsec = 2000000000L};
    EXPECT(spate_recvmmsg(fd, &mm, 1, MSG_DONTWAIT, &bad), EINVAL);
    CHECK(spate_recvmmsg(fd, &mm, 0, 0, NULL) == 0, "vlen 0");
    int v = 1;
    EXPECT(spate_setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v), ENOPROTOOPT);
    EXPECT(spate_setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof v), ENOPROTOOPT);
    EXPECT(spate_setsockopt(fd, IPPROTO_IP, IP_TTL, &v, 0), EINVAL);
    EXPECT(spate_setsockopt(fd, IPPROTO_IP, IP_TTL, NULL, sizeof v), EFAULT);
    v = 0;
    EXPECT(spate_setsockopt(fd, IPPROTO_IP, IP_TTL, &v, sizeof v), EINVAL);
    EXPECT(spate_setsockopt(fd, SOL_SOCKET, SO_TYPE, &v, sizeof v), ENOPROTOOPT);
    struct timeval tv = {.tv_sec = 1, .tv_usec = 2000000};
    EXPECT(spate_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), EDOM);
    EXPECT(spate_setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "nosuchdev", 10), ENODEV);
    EXPECT(spate_getsockopt(fd, IPPROTO_IP, IP_TTL, &v, NULL), EFAULT);
    EXPECT(spate_getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &len), ENOPROTOOPT);
    v = 1;
    int fresh6 = spate_socket(AF_INET6, SOCK_DGRAM, 0);
    CHECK(spate_setsockopt(fresh6, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof v) == 0, "V6ONLY before bind");
    /* The sends above bound fd6 (autobind): too late for it now. */
    EXPECT(spate_setsockopt(fd6, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof v), EINVAL);
    int t = 0;
    socklen_t tl = sizeof t;
    CHECK(spate_getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &tl) == 0 && t == SOCK_DGRAM, "SO_TYPE");
    CHECK(spate_getsockopt(fd6, SOL_SOCKET, SO_DOMAIN, &t, &tl) == 0 && t == AF_INET6, "SO_DOMAIN");
    CHECK(spate_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &t, &tl) == 0 && t == IPPROTO_UDP, "SO_PROTOCOL");
    CHECK(spate_getsockopt(fd, IPPROTO_IP, IP_TTL, &t, &tl) == 0 && t == 64, "IP_TTL default");
    v = 7;
    CHECK(spate_setsockopt(fd, IPPROTO_IP, IP_TTL, &v, sizeof v) == 0, "IP_TTL 7");
    CHECK(spate_getsockopt(fd, IPPROTO_IP, IP_TTL, &t, &tl) == 0 && t == 7, "IP_TTL 7 read back");
    EXPECT(spate_ioctl(fd, 0x1234, &v), ENOTTY);
    EXPECT(spate_ioctl(fd, FIONREAD, NULL), EFAULT);
    CHECK(spate_ioctl(fd, FIONREAD, &v) == 0 && v == 0, "FIONREAD on an empty socket");
    v = 1;
    CHECK(spate_ioctl(fd, FIONBIO, &v) == 0, "FIONBIO");
    CHECK((spate_fcntl(fd, F_GETFL, 0) & O_NONBLOCK) != 0, "F_GETFL after FIONBIO");
    EXPECT(spate_recv(fd, buf, sizeof buf, 0), EAGAIN);
    CHECK(spate_fcntl(fd, F_SETFL, 0) == 0 && (spate_fcntl(fd, F_GETFL, 0) & O_NONBLOCK) == 0, "F_SETFL");
    EXPECT(spate_fcntl(fd, 999, 0), EINVAL);
    EXPECT(spate_shutdown(fd, 7), EINVAL);
    EXPECT(spate_connect(fd, NULL, 0), EINVAL);
    CHECK(spate_close(fd) == 0, "close");
    EXPECT(spate_close(fd), EBADF);
    EXPECT(spate_recv(fd, buf, sizeof buf, 0), EBADF);
    EXPECT(spate_init(0, NULL), EALREADY);
    spate_fini();
    printf("errno checks %d failures %d\n", checks, failures);
    return failures ? 1 : 0;
}

/* What spate must leave as it was: the program's SIGPIPE disposition and
 * the calling thread's CPUs; and its own threads must block the
 * program's signals. */
static void check_process(const cpu_set_t *cpus_before)
{
    struct sigaction pipe_now;
    sigaction(SIGPIPE, NULL, &pipe_now);
    CHECK(pipe_now.sa_handler == SIG_DFL, "SIGPIPE's disposition is the program's (default)");
    cpu_set_t now;
    CPU_ZERO(&now);
    sched_getaffinity(0, sizeof now, &now);
    CHECK(CPU_EQUAL(&now, cpus_before), "the calling thread's CPUs are as they were (%d CPUs now, %d before)",
          CPU_COUNT(&now), CPU_COUNT(cpus_before));
    /* Every thread but this one is spate's or DPDK's. */
    char path[64], line[256];
    pid_t me = gettid();
    int threads = 0, blocking = 0;
    DIR *dir = opendir("/proc/self/task");
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        int tid = atoi(e->d_name);
        if (tid <= 0 || tid == me)
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%d/status", getpid(), tid);
        FILE *f = fopen(path, "r");
        unsigned long long blk = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blk) == 1)
                break;
        if (f)
            fclose(f);
        threads++;
        if (blk & (1ULL << (SIGUSR1 - 1)) && blk & (1ULL << (SIGPIPE - 1)))
            blocking++;
    }
    if (dir)
        closedir(dir);
    CHECK(threads > 0 && blocking == threads, "spate's threads block the program's signals (%d of %d)", blocking,
          threads);
    printf("process ok: %d threads of spate's block signals\n", threads);
}

/* Returns from main without spate_fini, as many programs end: the stack's
 * control endpoint, there while it runs, must not outlive the process. */
static int mode_exit(void)
{
    char path[64];
    snprintf(path, sizeof path, "/run/spate/%d-1.sock", (int)getpid());
    CHECK(access(path, F_OK) == 0, "the control endpoint %s is there while spate runs", path);
    int s = spate_socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7)};
    CHECK(s >= 0 && spate_bind(s, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    printf("READY\nfailures %d\n", failures);
    return failures != 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s echo|cmsg|signals|stop|runstop|errno|zerocopy|exit [spate flags]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", (int)getpid());
    /* The errno mode runs on one CPU of the two, which spate must leave. */
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    sched_getaffinity(0, sizeof cpus, &cpus);
    if (!strcmp(argv[1], "errno") && CPU_COUNT(&cpus) > 1) {
        int last = -1;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &cpus))
                last = c;
        CPU_ZERO(&cpus);
        CPU_SET(last, &cpus);
        sched_setaffinity(0, sizeof cpus, &cpus);
    }
    /* spate_init takes argv[0] and the flags after the mode. */
    if (spate_init(argc - 1, (const char *const *)argv + 1) != 0) {
        perror("spate_init");
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "runstop"))
        return mode_runstop();
    if (spate_start() != 0) {
        perror("spate_start");
        return 2;
    }
    check_process(&cpus);
    if (!strcmp(mode, "echo"))
        return mode_echo();
    if (!strcmp(mode, "cmsg"))
        return mode_cmsg();
    if (!strcmp(mode, "signals"))
        return mode_signals();
    if (!strcmp(mode, "stop"))
        return mode_stop();
    if (!strcmp(mode, "errno"))
        return mode_errno();
    if (!strcmp(mode, "zerocopy"))
        return mode_zerocopy();
    if (!strcmp(mode, "exit"))
        return mode_exit();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
