/* A plain C program on the C library's socket calls, knowing nothing of
 * spate, run by tests/preload.rs under spate-run against the kernel in a
 * network namespace (built with _FORTIFY_SOURCE, so recv, recvfrom and
 * read arrive as glibc's checked forms). `preload_peer MODE`:
 *   epoll   one epoll set over a UDP socket bound to 0.0.0.0:7
 *           (level-triggered), one bound to [::]:7 with IPV6_V6ONLY
 *           (edge-triggered, one-shot), a pipe and a TCP connection over
 *           loopback; datagrams come back with recvmmsg/sendmmsg, the IPv4
 *           ones through a dup of the socket; "quit" ends it.
 *   fork    daemonizes (fork, setsid, fork) before any socket, echoes on
 *           port 7, then forks a child that finds its inherited spate
 *           socket down, gets kernel sockets of its own and execs this
 *           program again (mode execd) with the preload inherited.
 *   errno   the errno of bad calls, as Linux gives them.
 *   signals blocking receives interrupted by a signal, with and without
 *           SA_RESTART.
 *   hold    binds port 7, says READY and waits (to be killed).
 * Prints "READY" when it listens, and "failures N" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#define BATCH 16
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

#define EXPECT(call, err)                                                         \
    do {                                                                          \
        errno = 0;                                                                \
        long r_ = (long)(call);                                                   \
        CHECK(r_ == -1 && errno == (err), "%s: want errno %d, got %ld", #call, err, r_); \
        checks++;                                                                 \
    } while (0)

static void sleep_ms(long ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* What descriptor `fd` is to the kernel: "socket" for a kernel socket,
 * "eventfd" for a spate one (its readiness descriptor). */
static const char *what(int fd)
{
    static char link[128];
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return "none";
    link[n] = 0;
    if (!strncmp(link, "socket:", 7))
        return "socket";
    if (strstr(link, "eventfd"))
        return "eventfd";
    return link;
}

/* A UDP socket of `family`, options set while it is the kernel's (set
 * again on spate's as it moves). */
static int udp_open(int family)
{
    int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0, "socket");
    int rcvbuf = 1 << 20;
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0, "SO_RCVBUF");
    if (family == AF_INET6) {
        int on = 1;
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) == 0, "IPV6_V6ONLY");
    }
    return fd;
}

/* Binds `fd` to the wildcard's `port`; -1 with errno when it cannot. */
static int udp_bind(int fd, int family, int port)
{
    if (family == AF_INET) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        return bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any};
    return bind(fd, (struct sockaddr *)&a, sizeof a);
}

static int udp_bound(int family, int port)
{
    int fd = udp_open(family);
    if (udp_bind(fd, family, port) < 0) {
        perror("bind");
        exit(2);
    }
    return fd;
}

/* Echoes up to a batch from `fd` through `out` (a dup of it, or itself);
 * -1 when "quit" came, else the datagrams echoed. */
static int echo_batch(int fd, int out)
{
    static char bufs[BATCH][BIG];
    struct mmsghdr m[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_storage from[BATCH];
    for (int i = 0; i < BATCH; i++) {
        iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = BIG};
        m[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i], .msg_iov = &iov[i],
                                       .msg_iovlen = 1};
    }
    int n = recvmmsg(fd, m, BATCH, MSG_DONTWAIT, NULL);
    if (n < 0) {
        CHECK(errno == EAGAIN, "recvmmsg");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (m[i].msg_len == 4 && !memcmp(bufs[i], "quit", 4))
            return -1;
        iov[i].iov_len = m[i].msg_len;
    }
    CHECK(sendmmsg(out, m, n, 0) == n, "sendmmsg");
    return n;
}

/* Sends "two" to 127.0.0.1:7 from socket *arg after 200 ms. */
static void *send_later(void *arg)
{
    int fd = *(int *)arg;
    sleep_ms(200);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(7), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(sendto(fd, "two", 3, 0, (struct sockaddr *)&to, sizeof to) == 3, "second to 127.0.0.1:7");
    return NULL;
}

/* ---- epoll: spate, pipe and TCP descriptors in one set ---- */

static int mode_epoll(void)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev;
    /* The IPv6 socket goes into the epoll set before it is bound (while
     * it is the kernel's); it stays there as it moves onto spate. */
    int u4 = udp_bound(AF_INET, 7), u6 = udp_open(AF_INET6);
    ev = (struct epoll_event){.events = EPOLLIN | EPOLLET | EPOLLONESHOT, .data.fd = u6};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, u6, &ev) == 0, "epoll add v6");
    CHECK(udp_bind(u6, AF_INET6, 7) == 0, "bind v6");
    CHECK(!strcmp(what(u4), "eventfd") && !strcmp(what(u6), "eventfd"), "the sockets are spate's: %s %s", what(u4),
          what(u6));
    int out4 = dup(u4);
    CHECK(out4 >= 0 && out4 != u4, "dup");
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    int lst = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t ll = sizeof la;
    CHECK(bind(lst, (struct sockaddr *)&la, sizeof la) == 0 && listen(lst, 1) == 0, "tcp listen");
    CHECK(getsockname(lst, (struct sockaddr *)&la, &ll) == 0, "tcp getsockname");
    int cli = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(cli, (struct sockaddr *)&la, sizeof la) == 0, "tcp connect");
    int srv = accept(lst, NULL, NULL);
    CHECK(srv >= 0 && !strcmp(what(srv), "socket"), "tcp accept");
    /* A UDP socket on loopback stays the kernel's. */
    int lo = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in loa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(lo, (struct sockaddr *)&loa, sizeof loa) == 0 && !strcmp(what(lo), "socket"), "loopback UDP: %s",
          what(lo));

    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = u4};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, u4, &ev) == 0, "epoll add v4");
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = p[0]};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev) == 0, "epoll add pipe");
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = srv};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, srv, &ev) == 0, "epoll add tcp");
    CHECK(write(p[1], "p", 1) == 1 && write(cli, "tcp!", 4) == 4, "pipe and tcp writes");
    /* Through the kernel to the wildcard socket (loopback): it reaches
     * the program in the same epoll loop, and the echo comes back through
     * the kernel. */
    socklen_t lol = sizeof loa;
    CHECK(getsockname(lo, (struct sockaddr *)&loa, &lol) == 0, "loopback getsockname");
    struct sockaddr_in to7 = {.sin_family = AF_INET, .sin_port = htons(7), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(sendto(lo, "kernel", 6, 0, (struct sockaddr *)&to7, sizeof to7) == 6, "send to 127.0.0.1:7");
    printf("READY\n");
    fflush(stdout);
    long v4 = 0, v6 = 0, piped = 0, tcp = 0;
    int done = 0;
    for (int rounds = 0; !done && rounds < 1000000; rounds++) {
        struct epoll_event evs[8];
        int n = epoll_wait(ep, evs, 8, 30000);
        CHECK(n > 0, "epoll_wait: %d", n);
        if (n <= 0)
            break;
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == u4) {
                int k = echo_batch(u4, out4);
                done |= k < 0;
                v4 += k > 0 ? k : 0;
            } else if (fd == u6) {
                /* Edge-triggered: drain, then re-arm the one-shot. */
                int k;
                while ((k = echo_batch(u6, u6)) > 0)
                    v6 += k;
                done |= k < 0;
                ev = (struct epoll_event){.events = EPOLLIN | EPOLLET | EPOLLONESHOT, .data.fd = u6};
                CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, u6, &ev) == 0, "epoll rearm v6");
            } else if (fd == p[0]) {
                char c;
                CHECK(read(p[0], &c, 1) == 1, "pipe read");
                piped++;
            } else if (fd == srv) {
                char b[8];
                ssize_t k = read(srv, b, sizeof b);
                CHECK(k == 4 && write(srv, b, k) == 4, "tcp echo");
                tcp++;
            }
        }
    }
    char back[8];
    CHECK(read(cli, back, sizeof back) == 4 && !memcmp(back, "tcp!", 4), "tcp echoed");
    struct timeval tv = {.tv_sec = 10};
    CHECK(setsockopt(lo, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
    struct sockaddr_in from;
    socklen_t froml = sizeof from;
    CHECK(recvfrom(lo, back, sizeof back, 0, (struct sockaddr *)&from, &froml) == 6 && !memcmp(back, "kernel", 6) &&
              from.sin_port == htons(7) && from.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "the echo through the kernel");
    CHECK(piped == 1 && tcp == 1, "pipe %ld tcp %ld", piped, tcp);
    /* The dup outlives the original, and closing one name wakes
     * nobody waiting on the other: with nothing to read, it is not
     * readable. */
    CHECK(close(u4) == 0, "close");
    int checks = 0;
    EXPECT(close(u4), EBADF);
    CHECK(!strcmp(what(out4), "eventfd"), "the dup is open");
    int queued = -1;
    CHECK(ioctl(out4, FIONREAD, &queued) == 0 && queued == 0, "FIONREAD on the dup: %d", queued);
    struct pollfd pf = {.fd = out4, .events = POLLIN};
    CHECK(poll(&pf, 1, 0) == 0, "the dup is readable (revents %d) after its other name closed", pf.revents);
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "198.18.0.1", &peer.sin_addr);
    CHECK(sendto(out4, "dup", 3, 0, (struct sockaddr *)&peer, sizeof peer) == 3, "send through the dup");
    /* A blocking recvmmsg without MSG_WAITFORONE fills every message, as
     * Linux's: one datagram through the kernel now, the second 200 ms
     * later from another thread, both in one call. */
    struct timeval ten = {.tv_sec = 10};
    CHECK(setsockopt(out4, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten) == 0, "SO_RCVTIMEO on the dup");
    CHECK(sendto(lo, "one", 3, 0, (struct sockaddr *)&to7, sizeof to7) == 3, "first to 127.0.0.1:7");
    pthread_t later;
    CHECK(pthread_create(&later, NULL, send_later, &lo) == 0, "pthread_create");
    char two[2][8];
    struct iovec tiov[2] = {{.iov_base = two[0], .iov_len = 8}, {.iov_base = two[1], .iov_len = 8}};
    struct mmsghdr tm[2] = {{.msg_hdr = {.msg_iov = &tiov[0], .msg_iovlen = 1}},
                            {.msg_hdr = {.msg_iov = &tiov[1], .msg_iovlen = 1}}};
    int got = recvmmsg(out4, tm, 2, 0, NULL);
    CHECK(got == 2 && tm[0].msg_len == 3 && !memcmp(two[0], "one", 3) && tm[1].msg_len == 3 &&
              !memcmp(two[1], "two", 3),
          "blocking recvmmsg of 2: %d", got);
    pthread_join(later, NULL);
    /* close_range and closefrom close spate sockets as close does: the
     * port is free on the stack again. */
    int cr = udp_bound(AF_INET, 4242);
    CHECK(close_range(cr, cr, 0) == 0, "close_range");
    int cr2 = udp_open(AF_INET);
    CHECK(udp_bind(cr2, AF_INET, 4242) == 0 && !strcmp(what(cr2), "eventfd"), "bind after close_range");
    close(cr2);
    int cf = udp_bound(AF_INET, 4243);
    CHECK(dup2(cf, 900) == 900 && close(cf) == 0, "dup2 to 900");
    closefrom(900);
    EXPECT(close(900), EBADF);
    int cf2 = udp_open(AF_INET);
    CHECK(udp_bind(cf2, AF_INET, 4243) == 0 && !strcmp(what(cf2), "eventfd"), "bind after closefrom");
    close(cf2);
    printf("echoed v4 %ld v6 %ld\n", v4, v6);
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

/* ---- fork: daemonize first, then fork and exec with a stack running ---- */

static int mode_execd(void)
{
    /* The parent holds the device: this process's sockets are the
     * kernel's, and no second stack starts. */
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7007)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind in the exec'd program");
    printf("execd %s\n", what(fd));
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

static int mode_fork(const char *self)
{
    /* Daemonize before any socket: the stack starts in the grandchild.
     * This process waits for the daemon's verdict on a pipe (so that the
     * test sees one program from start to end). */
    int verdict[2];
    CHECK(pipe2(verdict, O_CLOEXEC) == 0, "pipe2");
    pid_t c = fork();
    if (c > 0) {
        close(verdict[1]);
        int st;
        waitpid(c, &st, 0);
        char v = 1;
        CHECK(read(verdict[0], &v, 1) == 1, "the daemon's verdict");
        printf("daemon %s\n", v == 0 ? "ok" : "failed");
        printf("failures %d\n", failures + v);
        return failures + v ? 1 : 0;
    }
    close(verdict[0]);
    setsid();
    if (fork() > 0)
        _exit(0);
    int fd = udp_bound(AF_INET, 7);
    printf("daemon %s READY\n", what(fd));
    fflush(stdout);
    for (int echoed = 0; echoed < 3;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        CHECK(poll(&pf, 1, 30000) == 1, "poll");
        int k = echo_batch(fd, fd);
        if (k < 0)
            break;
        echoed += k;
    }
    /* A child forked now: its spate socket is down, new sockets are the
     * kernel's, and a program it execs starts no stack. */
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        char b[4];
        errno = 0;
        CHECK(recv(fd, b, sizeof b, MSG_DONTWAIT) == -1 && errno == ENETDOWN, "the inherited socket is down");
        int k = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7008)};
        CHECK(bind(k, (struct sockaddr *)&a, sizeof a) == 0 && !strcmp(what(k), "socket"), "child socket: %s", what(k));
        CHECK(close(fd) == 0, "close the inherited socket");
        printf("child failures %d\n", failures);
        fflush(stdout);
        execl(self, self, "execd", (char *)NULL);
        _exit(3);
    }
    int st;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child and its exec'd program: status %d", st);
    /* The parent's socket still works after the child closed its copy. */
    printf("after fork READY\n");
    fflush(stdout);
    int k = 0;
    for (int rounds = 0; rounds < 100 && k == 0; rounds++) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        CHECK(poll(&pf, 1, 30000) == 1, "poll after the fork");
        k = echo_batch(fd, fd);
    }
    CHECK(k == 1, "an echo after the fork: %d", k);
    printf("daemon failures %d\n", failures);
    char v = failures ? 1 : 0;
    CHECK(write(verdict[1], &v, 1) == 1, "verdict");
    return failures ? 1 : 0;
}

/* ---- errno: bad calls ---- */

static int mode_errno(void)
{
    int checks = 0;
    int fd = udp_bound(AF_INET, 5003);
    CHECK(!strcmp(what(fd), "eventfd"), "spate's: %s", what(fd));
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    char buf[16];
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "198.18.0.1", &peer.sin_addr);
    socklen_t len = sizeof peer;
    EXPECT(sendto(-1, buf, 4, 0, (struct sockaddr *)&peer, sizeof peer), EBADF);
    EXPECT(sendto(p[1], buf, 4, 0, (struct sockaddr *)&peer, sizeof peer), ENOTSOCK);
    EXPECT(sendto(fd, NULL, 10, 0, (struct sockaddr *)&peer, sizeof peer), EFAULT);
    EXPECT(sendto(fd, buf, 4, 0, (struct sockaddr *)&peer, 3), EINVAL);
    EXPECT(recv(fd, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
    CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0, "F_SETFL O_NONBLOCK");
    EXPECT(read(fd, buf, sizeof buf), EAGAIN);
    EXPECT(bind(fd, (struct sockaddr *)&peer, sizeof peer), EINVAL);
    EXPECT(getpeername(fd, (struct sockaddr *)&peer, &len), ENOTCONN);
    EXPECT(send(fd, buf, 4, 0), EDESTADDRREQ);
    int v = 1;
    EXPECT(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v), ENOPROTOOPT);
    EXPECT(setsockopt(fd, IPPROTO_IP, IP_TTL, NULL, sizeof v), EFAULT);
    EXPECT(ioctl(fd, 0x1234, &v), ENOTTY);
    EXPECT(shutdown(fd, 7), EINVAL);
    int t = 0;
    socklen_t tl = sizeof t;
    CHECK(getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &t, &tl) == 0 && t == AF_INET, "SO_DOMAIN");
    CHECK(getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &tl) == 0 && t == SOCK_DGRAM, "SO_TYPE");
    CHECK(getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &t, &tl) == 0 && t == IPPROTO_UDP, "SO_PROTOCOL");
    CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0, "F_GETFL");
    CHECK(fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 && fcntl(fd, F_GETFD) == FD_CLOEXEC, "FD_CLOEXEC");
    CHECK(ioctl(fd, FIONREAD, &v) == 0 && v == 0, "FIONREAD");
    /* Duplicates: F_DUPFD above a floor, dup2 onto a number, dup3. */
    int d1 = fcntl(fd, F_DUPFD, 100);
    CHECK(d1 >= 100 && !strcmp(what(d1), "eventfd"), "F_DUPFD %d", d1);
    CHECK(dup2(fd, 200) == 200 && dup3(fd, 201, O_CLOEXEC) == 201, "dup2, dup3");
    CHECK(fcntl(201, F_GETFD) == FD_CLOEXEC && fcntl(200, F_GETFD) == 0, "dup3's O_CLOEXEC");
    CHECK(sendto(200, "x", 1, 0, (struct sockaddr *)&peer, sizeof peer) == 1, "send through dup2's number");
    /* dup2 over a spate number closes that one: a pipe now. */
    CHECK(dup2(p[0], 201) == 201 && !strncmp(what(201), "pipe:", 5), "dup2 over a spate number: %s", what(201));
    EXPECT(sendto(201, buf, 4, 0, (struct sockaddr *)&peer, sizeof peer), ENOTSOCK);
    CHECK(close(d1) == 0 && close(200) == 0 && close(201) == 0, "closes");
    CHECK(close(fd) == 0, "close");
    EXPECT(close(fd), EBADF);
    EXPECT(recv(fd, buf, sizeof buf, 0), EBADF);
    /* select, FD_SETSIZE and EMFILE as the kernel has them. */
    int s2 = udp_bound(AF_INET, 5004);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(s2, &rs);
    struct timeval tv = {0, 1000};
    CHECK(select(s2 + 1, &rs, NULL, NULL, &tv) == 0, "select on an empty spate socket");
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    struct rlimit low = {.rlim_cur = s2 + 1, .rlim_max = rl.rlim_max};
    setrlimit(RLIMIT_NOFILE, &low);
    EXPECT(socket(AF_INET, SOCK_DGRAM, 0), EMFILE);
    setrlimit(RLIMIT_NOFILE, &rl);
    printf("checks %d\n", checks);
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
    pthread_t thread;
    int fd;
    ssize_t ret;
    int err;
};

static void *blocked_recv(void *arg)
{
    struct blocked *b = arg;
    char buf[64];
    b->ret = recv(b->fd, buf, sizeof buf, 0);
    b->err = errno;
    return NULL;
}

static int mode_signals(void)
{
    int fd = udp_bound(AF_INET, 5001);
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    struct blocked b = {.fd = fd};
    pthread_create(&b.thread, NULL, blocked_recv, &b);
    sleep_ms(200);
    pthread_kill(b.thread, SIGUSR1);
    pthread_join(b.thread, NULL);
    CHECK(b.ret == -1 && b.err == EINTR && handled == 1, "no SA_RESTART: EINTR (ret %zd errno %d)", b.ret, b.err);
    printf("eintr ok\n");
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
    printf("failures %d\n", failures);
    return failures ? 1 : 0;
}

static int mode_hold(void)
{
    int fd = udp_bound(AF_INET, 7);
    printf("pid %d\n", (int)getpid());
    printf("hold %s READY\n", what(fd));
    fflush(stdout);
    for (int i = 0; i < 600; i++)
        sleep_ms(100);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s epoll|fork|errno|signals|hold\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "epoll"))
        return mode_epoll();
    if (!strcmp(mode, "fork"))
        return mode_fork(argv[0]);
    if (!strcmp(mode, "execd"))
        return mode_execd();
    if (!strcmp(mode, "errno"))
        return mode_errno();
    if (!strcmp(mode, "signals"))
        return mode_signals();
    if (!strcmp(mode, "hold"))
        return mode_hold();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
