/* spate's window onto DPDK: the headers bindgen reads, and C wrappers for
 * the static-inline functions and thread-local variables that bindgen cannot
 * call directly. Each wrapper is one line of C so its cost is one call. */
#ifndef SPATE_DPDK_SHIM_H
#define SPATE_DPDK_SHIM_H

#include <rte_config.h>
#include <rte_bus_vdev.h>
#include <rte_cycles.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_eth_ring.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_ring.h>
#include <rte_version.h>

uint16_t spate_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t spate_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t spate_tx_prepare(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);

struct rte_mbuf *spate_pktmbuf_alloc(struct rte_mempool *mp);
int spate_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n);
void spate_pktmbuf_free(struct rte_mbuf *m);
char *spate_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *spate_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
char *spate_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int spate_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
int spate_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
void *spate_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t spate_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t spate_pktmbuf_tailroom(const struct rte_mbuf *m);
uint16_t spate_mbuf_refcnt_read(const struct rte_mbuf *m);
struct rte_mbuf *spate_pktmbuf_clone(struct rte_mbuf *m, struct rte_mempool *mp);

unsigned int spate_lcore_id(void);
int spate_errno(void);
void spate_set_errno(int value);
uint64_t spate_rdtsc(void);
unsigned int spate_mempool_cache_size(const struct rte_mempool *mp);
uint16_t spate_pktmbuf_data_room_size(struct rte_mempool *mp);
int spate_mempool_ops_registered(const char *name);
const char *spate_best_mempool_ops(void);
unsigned int spate_ring_dequeue_burst(struct rte_ring *r, struct rte_mbuf **mbufs, unsigned int n);
unsigned int spate_ring_enqueue_burst(struct rte_ring *r, struct rte_mbuf **mbufs, unsigned int n);
unsigned int spate_ring_count(const struct rte_ring *r);

#endif
