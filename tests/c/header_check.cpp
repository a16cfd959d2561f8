// spate.h from C++: the header compiles, links and names spate's calls.
#include <spate.h>

#include <cstdio>
#include <cstring>

static_assert(SPATE_VERSION_NUMBER == SPATE_VERSION_MAJOR * 10000 + SPATE_VERSION_MINOR * 100 + SPATE_VERSION_PATCH,
              "version macros");

int main()
{
    int (*calls[])(int, const struct sockaddr *, socklen_t) = {spate_bind, spate_connect};
    std::printf("spate %s, %zu address calls\n", spate_version(), sizeof calls / sizeof calls[0]);
    // Before spate_init: no stack, ENETDOWN.
    return spate_socket(AF_INET, SOCK_DGRAM, 0) == -1 ? 0 : 1;
}
