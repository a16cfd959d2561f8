//! The hand-off between an lcore going to sleep and the threads that give
//! it work (an application thread's send into its inbox, another lcore's
//! frames, the stack stopping), without a lost wake: the lcore says it is
//! going to sleep before its last look at its queues, a producer looks
//! for that after it queued; a fence on each side orders each one's write
//! before its read, so one of them sees the other's (the lcore finds the
//! work, or the producer finds the lcore going to sleep and rings its
//! bell). The bell rings once per sleep however many producers see it.
//! A producer late for one sleep may set `rung` after the lcore's
//! `awake` cleared it: its ring stays in the bell (an eventfd counts
//! rings), so the next sleep ends at once, spuriously, and the flag is
//! cleared again: no wake is lost, one may come early.
//! Model-checked with loom (`stack/tests/loom_doorbell.rs`).

use crate::sync::{AtomicBool, Ordering, fence};

/// One lcore's side of the hand-off (cache-padded where it lives: the
/// producers read it).
#[derive(Debug, Default)]
pub struct Doorbell {
    asleep: AtomicBool,
    rung: AtomicBool,
    /// Work for the lcore's callback ([`Stack::wake_lcore`]): a queue of
    /// one flag, published as any other before the producer's look.
    ///
    /// [`Stack::wake_lcore`]: crate::Stack::wake_lcore
    app: AtomicBool,
}

impl Doorbell {
    /// A doorbell of an awake lcore.
    pub fn new() -> Doorbell {
        Doorbell { asleep: AtomicBool::new(false), rung: AtomicBool::new(false), app: AtomicBool::new(false) }
    }

    /// The lcore, before its last look at its queues: it is going to sleep.
    #[inline]
    pub fn going_to_sleep(&self) {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The lcore, awake again (it looked and found work, or woke).
    #[inline]
    pub fn awake(&self) {
        self.asleep.store(false, Ordering::Relaxed);
        self.rung.store(false, Ordering::Release);
    }

    /// A producer: work waits for the lcore's callback (then
    /// [`should_ring`](Self::should_ring), as after any queueing).
    #[inline]
    pub fn note_app_work(&self) {
        self.app.store(true, Ordering::Release);
    }

    /// The lcore: whether work waits for its callback (a load; the flag
    /// stays set).
    #[inline]
    pub fn has_app_work(&self) -> bool {
        self.app.load(Ordering::Acquire)
    }

    /// The lcore, after its callback ran: whether work waits for it (set
    /// since the last take: the next turn runs it), the flag cleared (a
    /// load when none does).
    #[inline]
    pub fn take_app_work(&self) -> bool {
        self.app.load(Ordering::Relaxed) && self.app.swap(false, Ordering::Acquire)
    }

    /// A producer, after it queued work for the lcore: whether it is the
    /// one to ring the lcore's bell (the lcore is going to sleep or
    /// asleep, and nobody rang since).
    #[inline]
    pub fn should_ring(&self) -> bool {
        fence(Ordering::SeqCst);
        self.asleep.load(Ordering::Relaxed) && !self.rung.swap(true, Ordering::AcqRel)
    }
}
