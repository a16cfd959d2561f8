// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//
// spate's XDP program for net_af_xdp ports that share their interface with
// the kernel. DPDK 22.11 loads it (the PMD's `xdp_prog=`) and puts each
// queue's AF_XDP socket into `xsks_map`; spate keeps `spate_v4` and
// `spate_v6` filled with its addresses and the groups its sockets joined.
//
// A frame goes to spate's socket on its queue when it is
// - IPv4 or IPv6 to one of those addresses (fragments included: they are
//   told apart by address alone, as they carry no ports);
// - an ARP packet whose target is one of spate's IPv4 addresses;
// - an IPv6 neighbour solicitation, to a multicast group, whose target is
//   one of spate's IPv6 addresses;
// untagged. Every other frame is the kernel's (XDP_PASS): its own
// addresses, tagged frames (its VLAN interfaces), broadcasts, router
// advertisements, multicast queries. A queue without a socket passes
// everything.

#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name
#define INLINE static __attribute__((always_inline)) inline

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

struct v6_addr {
	__u8 b[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} spate_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct v6_addr);
	__type(value, __u8);
} spate_v6 SEC(".maps");

/* EtherTypes as they lie in the frame, read on a little-endian target (bpfel) */
#define ETH_P_IPV4 0x0008
#define ETH_P_ARP 0x0608
#define ETH_P_IPV6 0xdd86
#define IPPROTO_ICMPV6 58
#define ND_SOLICIT 135

INLINE int spate_v4_has(const __u8 *at)
{
	__u32 key;
	__builtin_memcpy(&key, at, 4);
	return bpf_map_lookup_elem(&spate_v4, &key) != 0;
}

INLINE int spate_v6_has(const __u8 *at)
{
	struct v6_addr key;
	__builtin_memcpy(&key, at, 16);
	return bpf_map_lookup_elem(&spate_v6, &key) != 0;
}

// Whether the frame's network part, at constant offset `l3`, is spate's.
INLINE int is_spates(const __u8 *p, const __u8 *end, __u16 type, const int l3)
{
	if (type == ETH_P_IPV4) {
		if (p + l3 + 20 > end)
			return 0;
		return spate_v4_has(p + l3 + 16);
	}
	if (type == ETH_P_ARP) {
		// Ethernet/IPv4 ARP: the target's address at 24.
		if (p + l3 + 28 > end)
			return 0;
		return spate_v4_has(p + l3 + 24);
	}
	if (type == ETH_P_IPV6) {
		if (p + l3 + 40 > end)
			return 0;
		if (spate_v6_has(p + l3 + 24))
			return 1;
		// A solicitation asks at a solicited-node group the kernel's
		// addresses may share: its target says whose it is.
		if (p[l3 + 24] != 0xff || p[l3 + 6] != IPPROTO_ICMPV6)
			return 0;
		if (p + l3 + 40 + 24 > end || p[l3 + 40] != ND_SOLICIT)
			return 0;
		return spate_v6_has(p + l3 + 48);
	}
	return 0;
}

SEC("xdp")
int spate_xdp(struct xdp_md *ctx)
{
	const __u8 *p = (const __u8 *)(long)ctx->data;
	const __u8 *end = (const __u8 *)(long)ctx->data_end;
	__u16 type;
	int mine;

	if (p + 14 > end)
		return XDP_PASS;
	__builtin_memcpy(&type, p + 12, 2);
	// A tagged frame is for one of the kernel's VLAN interfaces: spate's
	// port is untagged (a NIC's VLAN offload would strip the tag before
	// XDP, and the XDP socket could not say which VLAN it was).
	mine = is_spates(p, end, type, 14);
	if (!mine)
		return XDP_PASS;
	return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual BSD/GPL";
