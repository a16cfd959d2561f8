#include <string.h>

#include "shim.h"

uint16_t spate_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{ return rte_eth_rx_burst(port, queue, pkts, n); }

uint16_t spate_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{ return rte_eth_tx_burst(port, queue, pkts, n); }

uint16_t spate_tx_prepare(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{ return rte_eth_tx_prepare(port, queue, pkts, n); }

struct rte_mbuf *spate_pktmbuf_alloc(struct rte_mempool *mp)
{ return rte_pktmbuf_alloc(mp); }

int spate_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n)
{ return rte_pktmbuf_alloc_bulk(mp, mbufs, n); }

void spate_pktmbuf_free(struct rte_mbuf *m)
{ rte_pktmbuf_free(m); }

char *spate_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len)
{ return rte_pktmbuf_prepend(m, len); }

char *spate_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{ return rte_pktmbuf_append(m, len); }

char *spate_pktmbuf_adj(struct rte_mbuf *m, uint16_t len)
{ return rte_pktmbuf_adj(m, len); }

int spate_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{ return rte_pktmbuf_trim(m, len); }

int spate_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{ return rte_pktmbuf_chain(head, tail); }

void *spate_pktmbuf_mtod(struct rte_mbuf *m)
{ return rte_pktmbuf_mtod(m, void *); }

uint16_t spate_pktmbuf_headroom(const struct rte_mbuf *m)
{ return rte_pktmbuf_headroom(m); }

uint16_t spate_pktmbuf_tailroom(const struct rte_mbuf *m)
{ return rte_pktmbuf_tailroom(m); }

uint16_t spate_mbuf_refcnt_read(const struct rte_mbuf *m)
{ return rte_mbuf_refcnt_read(m); }

struct rte_mbuf *spate_pktmbuf_clone(struct rte_mbuf *m, struct rte_mempool *mp)
{ return rte_pktmbuf_clone(m, mp); }

unsigned int spate_lcore_id(void)
{ return rte_lcore_id(); }

int spate_errno(void)
{ return rte_errno; }

void spate_set_errno(int value)
{ rte_errno = value; }

uint64_t spate_rdtsc(void)
{ return rte_rdtsc(); }

unsigned int spate_mempool_cache_size(const struct rte_mempool *mp)
{ return mp->cache_size; }

uint16_t spate_pktmbuf_data_room_size(struct rte_mempool *mp)
{ return rte_pktmbuf_data_room_size(mp); }

/* Whether a mempool driver of this name registered itself (drivers are
 * plugins: the EAL loads those it finds). */
int spate_mempool_ops_registered(const char *name)
{
	for (unsigned int i = 0; i < rte_mempool_ops_table.num_ops; i++)
		if (strcmp(rte_mempool_ops_table.ops[i].name, name) == 0)
			return 1;
	return 0;
}

/* The driver DPDK gives packet pools: --mbuf-pool-ops-name, the platform's
 * hardware pool, or the default ring. */
const char *spate_best_mempool_ops(void)
{ return rte_mbuf_best_mempool_ops(); }

unsigned int spate_ring_dequeue_burst(struct rte_ring *r, struct rte_mbuf **mbufs, unsigned int n)
{ return rte_ring_dequeue_burst(r, (void **)mbufs, n, NULL); }
unsigned int spate_ring_enqueue_burst(struct rte_ring *r, struct rte_mbuf **mbufs, unsigned int n)
{ return rte_ring_enqueue_burst(r, (void **)mbufs, n, NULL); }
unsigned int spate_ring_count(const struct rte_ring *r)
{ return rte_ring_count(r); }
