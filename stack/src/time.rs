//! Time for the datapath: nanoseconds from the TSC, read once per loop
//! iteration and passed down (the protocol code reads no clock itself).

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since the stack's clock started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// `d` later.
    pub fn after(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.as_nanos() as u64))
    }

    /// Time since `earlier` (zero if it is later).
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.after(d)
    }
}

impl Sub for Instant {
    type Output = Duration;
    fn sub(self, o: Instant) -> Duration {
        self.since(o)
    }
}

/// `CLOCK_REALTIME` now, in nanoseconds since the epoch: the receive
/// timestamps' clock. Read through the vDSO, so tens of nanoseconds, once
/// per receive burst while some socket asks for stamps. The stack's own
/// clock is not used for them: its rate is DPDK's TSC estimate, rounded
/// to 10 MHz (0.2% off on a 2,445.4 MHz guest, 20 us every 10 ms), and an
/// offset taken between two reads can be off by a preemption.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// TSC to nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: u64,
    // Nanoseconds per tick in 32.32 fixed point.
    ns_per_tick_q32: u64,
    hz: u64,
}

impl Clock {
    /// A clock over the EAL's TSC rate.
    pub fn new() -> Clock {
        let hz = spate_dpdk::lcore::tsc_hz().max(1);
        Clock { start: spate_dpdk::lcore::tsc(), ns_per_tick_q32: ((1_000_000_000u128 << 32) / hz as u128) as u64, hz }
    }

    /// Now.
    #[inline]
    pub fn now(&self) -> Instant {
        self.at(spate_dpdk::lcore::tsc())
    }

    /// The instant of a TSC reading taken already (a second rdtsc costs
    /// tens of cycles in a VM).
    #[inline]
    pub fn at(&self, tsc: u64) -> Instant {
        let ticks = tsc.wrapping_sub(self.start);
        Instant(((ticks as u128 * self.ns_per_tick_q32 as u128) >> 32) as u64)
    }

    /// Ticks per second.
    pub fn hz(&self) -> u64 {
        self.hz
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
