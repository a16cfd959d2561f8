//! Application threads as the EAL sees them. A thread that receives or
//! sends through a socket frees and allocates mbufs; unknown to the EAL it
//! has no mempool cache, and every free and every allocation goes to the
//! pool's shared store (a stack or a ring, under the pool's lock or
//! atomics). The first socket call on such a thread registers it
//! with the EAL (`rte_thread_register`), which gives it an lcore id and so
//! a cache; the id is given back when the thread exits. When the EAL has
//! no id left the thread works on without a cache.

use spate_dpdk::lcore;

struct Registration(bool);

impl Registration {
    fn new() -> Registration {
        if lcore::current().is_some() {
            return Registration(false); // an lcore, or registered already
        }
        match lcore::register_thread() {
            Ok(_) => Registration(true),
            Err(e) => {
                log::debug!("application thread without a mempool cache: {e}");
                Registration(false)
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.0 {
            lcore::unregister_thread();
        }
    }
}

thread_local! {
    static REGISTRATION: Registration = Registration::new();
}

/// Registers the calling thread with the EAL once; afterwards a
/// thread-local read.
#[inline]
pub(crate) fn enter() {
    REGISTRATION.with(|_| ());
}
