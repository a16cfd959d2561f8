//! Reuseport groups: sockets bound with `reuseport` to the same address,
//! port and family share the datagrams, one flow per socket.
//!
//! Selection follows Linux's `reuseport_select_sock`: the flow hash
//! scaled to the group, `(hash * n) >> 32`. It differs in one respect:
//! connected members are left out before scaling rather than skipped after
//! it. Linux's skip (since efc6b6f6) hands a connected member's share to
//! the member after it, so that one gets twice the load; picking among the
//! unconnected ones keeps every share equal. When members name an incoming
//! lcore, a datagram looked up on that lcore goes to one of them, so a
//! group with one socket per lcore keeps each flow on the lcore that
//! received it.

/// Linux's `reciprocal_scale`: a 32-bit hash mapped onto `0..n`.
#[inline]
pub fn reciprocal_scale(hash: u32, n: u32) -> u32 {
    ((hash as u64 * n as u64) >> 32) as u32
}

/// A group as a snapshot holds it.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Binding index of the first member that is not connected (they are
    /// contiguous, at the start of the group's block).
    pub(super) first: u32,
    /// How many members are not connected.
    pub(super) unconnected: u32,
    /// Unconnected members by incoming lcore.
    pub(super) by_lcore: Vec<(u32, Vec<u32>)>,
    /// Indexed by lcore: the lcore's one member where it has exactly one
    /// ([`NO_SOLE`] otherwise), so that a group of one socket per lcore
    /// picks with one load and no hash. Built by [`Group::index_lcores`].
    pub(super) sole_by_lcore: Box<[u32]>,
    /// Whether some member is connected (then the pick is re-scored).
    pub(super) has_conns: bool,
}

/// [`Group::sole_by_lcore`]'s mark for an lcore with no member or several.
const NO_SOLE: u32 = u32::MAX;

impl Group {
    /// Fills [`sole_by_lcore`](Self::sole_by_lcore) from
    /// [`by_lcore`](Self::by_lcore), once the members are in.
    pub(super) fn index_lcores(&mut self) {
        let len = self.by_lcore.iter().map(|(l, _)| *l as usize + 1).max().unwrap_or(0);
        let mut sole = vec![NO_SOLE; len];
        for (l, m) in &self.by_lcore {
            if let [only] = m[..] {
                sole[*l as usize] = only;
            }
        }
        self.sole_by_lcore = sole.into_boxed_slice();
    }

    /// Whether some lcore has exactly one member.
    pub(super) fn has_sole(&self) -> bool {
        self.sole_by_lcore.iter().any(|&m| m != NO_SOLE)
    }

    /// The member a datagram looked up on `lcore` goes to whatever its
    /// flow, when the lcore has exactly one (one socket per lcore, the
    /// common deployment): [`select`](Self::select)'s answer without the
    /// hash.
    #[inline(always)]
    pub fn sole(&self, lcore: u32) -> Option<u32> {
        self.sole_by_lcore.get(lcore as usize).copied().filter(|&m| m != NO_SOLE)
    }

    /// The member for a flow with `hash`, looked up on `lcore`.
    #[inline(always)]
    pub fn select(&self, hash: u32, lcore: u32) -> Option<u32> {
        if !self.by_lcore.is_empty()
            && let Some((_, m)) = self.by_lcore.iter().find(|(l, _)| *l == lcore)
        {
            return Some(m[reciprocal_scale(hash, m.len() as u32) as usize]);
        }
        if self.unconnected == 0 {
            return None;
        }
        Some(self.first + reciprocal_scale(hash, self.unconnected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reciprocal_scale_spreads_evenly() {
        assert_eq!(reciprocal_scale(0, 4), 0);
        assert_eq!(reciprocal_scale(u32::MAX, 4), 3);
        assert_eq!(reciprocal_scale(0x8000_0000, 4), 2);
        let mut counts = [0u32; 5];
        for i in 0..100_000u32 {
            counts[reciprocal_scale(i.wrapping_mul(2_654_435_761), 5) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (19_000..21_000).contains(&c)), "{counts:?}");
    }

    fn indexed(mut g: Group) -> Group {
        g.index_lcores();
        g
    }

    #[test]
    fn incoming_lcore_members_win_on_their_lcore() {
        let g = indexed(Group {
            first: 10,
            unconnected: 2,
            by_lcore: vec![(0, vec![10]), (1, vec![11])],
            ..Group::default()
        });
        for h in [0u32, 1 << 31, u32::MAX] {
            assert_eq!(g.select(h, 0), Some(10));
            assert_eq!(g.select(h, 1), Some(11));
        }
        assert!(g.select(0, 2).is_some(), "other lcores still pick by hash");
        assert_eq!(Group::default().select(7, 0), None);
        assert_eq!((g.sole(0), g.sole(1), g.sole(2)), (Some(10), Some(11), None));
    }

    #[test]
    fn an_lcore_with_one_member_has_it_as_its_sole_one() {
        let g = indexed(Group {
            first: 10,
            unconnected: 4,
            by_lcore: vec![(0, vec![10]), (2, vec![11, 12])],
            ..Group::default()
        });
        assert_eq!(g.sole(0), Some(10));
        assert_eq!(g.sole(1), None, "no member: by hash over all");
        assert_eq!(g.sole(2), None, "two members: by hash between them");
        assert_eq!(g.sole(9), None, "past the index");
        // Where there is a sole member, select agrees with it for any hash.
        for h in [0u32, 1 << 31, u32::MAX] {
            assert_eq!(g.select(h, 0), g.sole(0));
        }
    }
}
