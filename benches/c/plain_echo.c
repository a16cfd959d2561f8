/* The blocking echo of benches/preload.rs, on the C library's calls and
 * knowing nothing of spate: bound to 0.0.0.0:7, it sends each datagram
 * back with sendto after a blocking recvfrom, one at a time, until
 * killed. Prints its pid and READY once bound. */
#include <stdio.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

int main(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(7)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("bind");
        return 2;
    }
    printf("pid %d\nREADY\n", (int)getpid());
    fflush(stdout);
    static char buf[65536];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t len = sizeof from;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
        if (n < 0) {
            perror("recvfrom");
            return 1;
        }
        if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, len) != n) {
            perror("sendto");
            return 1;
        }
    }
}
